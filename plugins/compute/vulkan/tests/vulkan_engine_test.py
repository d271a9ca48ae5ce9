#!/usr/bin/python3
"""The Vulkan backend under the whole engine (ctest compute.vulkan.engine, label integration):

  vulkan_engine_test.py COLIBRI_CLI FIXTURE_GENERATOR WORK_DIR [--vram]

* every tiny architecture, converted at f32: `colibri-cli logits` on compute.backend=vulkan matches the CPU backend
  within 1e-4 of the max-abs logit per position (f32 KV cache, exact activations, so both backends compute the same
  sums in different orders), with the same greedy token everywhere;
* every other preset (q8_0 ... q2_k, f16, bf16): the same bound against the CPU backend;
* the one promise on Vulkan: logits bit-identical in one batch, token by token and in chunks of 3;
* gpt_oss (attention_sinks, expert_ffn_clamped; not in the shared ARCHS, which other backends without those ops run)
  at f32 and q4_k_m against the CPU backend with the same bound, and its one promise;
* gpt_oss with MXFP4 experts as openai ships them (make_tiny_model.py --mxfp4; convert keeps them mxfp4 at any
  preset) at f32 and q4_k_m: the same bound against the CPU backend, its one promise, and bit-identical logits with
  every expert uploaded to unmapped device memory (a discrete GPU's path: 17-byte blocks at any offset of a slot).

With --vram (ctest compute.vulkan.vram): backend_engine.Engine.vram_promise (the one promise with the VRAM expert
tier) on mapped device memory (lavapipe as an iGPU) and unmapped (compute.map_device_memory=false: a discrete GPU's
path, staging uploads, weights only in device buffers); shared weights uploaded once to unmapped memory only; and
backend_engine.Engine.cpu_fallback (compute.cpu_fallback: auto and its cost model) and
backend_engine.Engine.kv_on_device (the KV cache in device memory, logits bit-identical to it in host memory) and
backend_engine.Engine.activations_on_device (activations kept in device buffers between ops, logits bit-identical to
staging them per op) on unmapped memory; on mapped memory the KV cache stays in host memory.

Exits 77 (ctest: skipped) when no Vulkan device exists, unless COLIBRI_REQUIRE_VULKAN=1. The checks against the
CPU backend and of batch invariance live in tests/support/backend_engine.py, shared with the CUDA backend's test.
"""

import json
import os
import subprocess
import sys

import numpy as np


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "..", "tests",
                                "support"))
import backend_engine  # noqa: E402


def shared_weights(engine):
    """Unmapped device memory is a discrete GPU: the shared weights are uploaded once; mapped memory, or the key off,
    keeps them in host memory, and both give the same logits."""
    failures = []
    for arch, preset in backend_engine.VRAM_CASES:
        m = engine.model(arch, preset)
        base = engine.logits(m, "vram-base", *engine.on_backend)

        def bench(*extra):
            return json.loads(engine.run(["bench", "--model", m, "--prompt-tokens", "4", "--gen-tokens", "2", "--json"] +
                                         engine.on_backend + list(extra)).stdout)

        off = bench("--set", "compute.map_device_memory=false")
        host_shared = bench("--set", "compute.map_device_memory=false", "--set", "memory.shared_on_device=false")
        mapped = bench()
        if not 0 < off["shared_device_bytes"]:
            failures.append(f"{arch}: unmapped device memory should hold the shared weights: {off}")
        if host_shared["shared_device_bytes"] != 0 or mapped["shared_device_bytes"] != 0:
            failures.append(f"{arch}: shared weights on the device with memory.shared_on_device=false "
                            f"({host_shared['shared_device_bytes']}) or mapped memory ({mapped['shared_device_bytes']})")
        unmapped_host = engine.logits(m, "vram-shared-host", *engine.on_backend, "--set", "compute.map_device_memory=false",
                                      "--set", "memory.shared_on_device=false")
        if not backend_engine.same(base, unmapped_host):
            failures.append(f"{arch}/{preset}: shared weights staged per call give other logits than uploaded once")
    return failures


def kv_mapped(engine):
    """Mapped device memory is the host's: the KV cache stays a host allocation there."""
    st = json.loads(engine.run(["bench", "--model", engine.model("mixtral", "q8_0"), "--prompt-tokens", "4",
                                "--gen-tokens", "2", "--json", "--ctx", "64"] + engine.on_backend).stdout)
    return [] if st["kv_device_bytes"] == 0 else [f"mapped memory holds a device KV cache: {st['kv_device_bytes']}"]


# gpt-oss's ops (attention sinks, biased experts with the clamped SwiGLU) under the engine.
GPT_OSS = [("gpt_oss", "f32"), ("gpt_oss", "q4_k_m")]


def gpt_oss_batch_invariance(engine):
    failures = []
    m = engine.model("gpt_oss", "f32")
    base = engine.logits(m, "vulkan-base", *engine.on_backend)
    for batch in ("1", "3"):
        other = engine.logits(m, f"vulkan-b{batch}", "--batch", batch, *engine.on_backend)
        if not backend_engine.same(base, other):
            failures.append(f"gpt_oss/f32: vulkan logits with --batch {batch} differ from one batch")
    print("  gpt_oss/f32: vulkan batch invariance checked", flush=True)
    return failures


def mxfp4_model(engine, preset):
    """gpt_oss with MXFP4 experts, converted at `preset`; fails unless its experts really are mxfp4."""
    ckpt = os.path.join(engine.work, "ckpt-gpt_oss-mxfp4")
    if not os.path.exists(os.path.join(ckpt, "config.json")):
        subprocess.run([sys.executable, engine.gen, "--arch", "gpt_oss", "--out", ckpt, "--dtype", "f32", "--mxfp4"],
                       check=True, capture_output=True)
    out = os.path.join(engine.work, f"gpt_oss-mxfp4-{preset}")
    if not os.path.exists(os.path.join(out, "manifest.json")):
        engine.run(["convert", "--input", ckpt, "--output", out, "--quantize", preset, "--force"])
    with open(os.path.join(out, "manifest.json")) as f:
        experts = json.load(f)["experts"]
    types = {e[part]["type"] for e in experts for part in ("gate", "up", "down")}
    if types != {"mxfp4"}:
        raise RuntimeError(f"{out}: the experts should all be mxfp4, not {sorted(types)}")
    return out


def mxfp4_gpt_oss(engine):
    failures = []
    for preset in ("f32", "q4_k_m"):
        failures += engine.compare_to_cpu(mxfp4_model(engine, preset), f"gpt_oss-mxfp4/{preset}")
    m = mxfp4_model(engine, "f32")
    base = engine.logits(m, "vulkan-base", *engine.on_backend)
    for batch in ("1", "3"):
        other = engine.logits(m, f"vulkan-b{batch}", "--batch", batch, *engine.on_backend)
        if not backend_engine.same(base, other):
            failures.append(f"gpt_oss-mxfp4/f32: vulkan logits with --batch {batch} differ from one batch")
    experts, _, sizes = engine._vram_sizes(m)
    discrete = ["--set", "compute.map_device_memory=false", "--vram-budget", str(sizes["all"])]
    uploaded = engine.logits(m, "vulkan-vram", *engine.on_backend, *discrete)
    if not backend_engine.same(base, uploaded):
        failures.append("gpt_oss-mxfp4/f32: vulkan logits with every expert in unmapped device memory differ "
                        f"(max abs {np.abs(base - uploaded).max()})")
    st, _ = engine._bench(m, *discrete)
    if st["vram_uploads"] != len(experts) or st["vram_misses"] != 0:
        failures.append(f"gpt_oss-mxfp4/f32: every expert should be uploaded once and then hit: {st}")
    print("  gpt_oss-mxfp4/f32: vulkan batch invariance and VRAM tier checked", flush=True)
    return failures


def main():
    engine = backend_engine.Engine(*sys.argv[1:4], "vulkan")
    os.environ["XDG_CACHE_HOME"] = os.path.join(engine.work, "xdg-cache")  # bench writes usage history there
    skip = engine.probe("Vulkan", "COLIBRI_REQUIRE_VULKAN")
    if skip is not None:
        return skip
    if "--vram" in sys.argv[4:]:
        mapped, unmapped = (["--set", f"compute.map_device_memory={m}"] for m in ("true", "false"))
        return backend_engine.report(
            engine.vram_promise({"mapped": mapped, "unmapped": unmapped}, unmapped) + shared_weights(engine) +
            engine.cpu_fallback(unmapped) + engine.kv_on_device(unmapped) + kv_mapped(engine) +
            engine.activations_on_device(unmapped))
    cases = [(a, "f32") for a in backend_engine.ARCHS] + backend_engine.PRESETS
    cases += [c for c in GPT_OSS if c not in cases]
    return backend_engine.report(engine.against_cpu(cases) + engine.batch_invariance() +
                                 gpt_oss_batch_invariance(engine) + mxfp4_gpt_oss(engine))


if __name__ == "__main__":
    sys.exit(main())
