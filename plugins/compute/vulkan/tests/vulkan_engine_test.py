#!/usr/bin/python3
"""The Vulkan backend under the whole engine (ctest compute.vulkan.engine, label integration):

  vulkan_engine_test.py COLIBRI_CLI FIXTURE_GENERATOR WORK_DIR [--vram]

* every tiny architecture, converted at f32: `colibri-cli logits` on compute.backend=vulkan matches the CPU backend
  within 1e-4 of the max-abs logit per position (f32 KV cache, exact activations, so both backends compute the same
  sums in different orders), with the same greedy token everywhere;
* every other preset (q8_0 ... q2_k, f16, bf16): the same bound against the CPU backend;
* the one promise on Vulkan: logits bit-identical in one batch, token by token and in chunks of 3;
* gpt_oss (attention_sinks, expert_ffn_clamped), also with MXFP4 experts: backend_engine.Engine.gpt_oss, with the
  experts uploaded to unmapped device memory (a discrete GPU's path).

With --vram (ctest compute.vulkan.vram): backend_engine.Engine.vram_promise (the one promise with the VRAM expert
tier) on mapped device memory (lavapipe as an iGPU) and unmapped (compute.map_device_memory=false: a discrete GPU's
path, staging uploads, weights only in device buffers); shared weights uploaded once to unmapped memory only; and
backend_engine.Engine.cpu_fallback (compute.cpu_fallback: auto and its cost model) and
backend_engine.Engine.kv_on_device (the KV cache in device memory, logits bit-identical to it in host memory) and
backend_engine.Engine.activations_on_device (activations kept in device buffers between ops, logits bit-identical to
staging them per op) on unmapped memory; on mapped memory the KV cache stays in host memory; and
backend_engine.Engine.routed_experts (decode through expert_ffn_routed with every expert in VRAM, on unmapped and
mapped memory: logits bit-identical to vram_budget 0, where the engine routes).

Exits 77 (ctest: skipped) when no Vulkan device exists, unless COLIBRI_REQUIRE_VULKAN=1. The checks against the
CPU backend and of batch invariance live in tests/support/backend_engine.py, shared with the CUDA backend's test.
"""

import json
import os
import sys

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
            engine.activations_on_device(unmapped) + engine.routed_experts(unmapped, baseline=["--vram-budget", "0"] +
                                                                          unmapped) +
            engine.routed_experts(mapped, baseline=["--vram-budget", "0"] + mapped, archs=("mixtral", "qwen2_moe")))
    cases = [(a, "f32") for a in backend_engine.ARCHS] + backend_engine.PRESETS
    return backend_engine.report(engine.against_cpu(cases) + engine.batch_invariance() +
                                 engine.gpt_oss(["--set", "compute.map_device_memory=false"]) +
                                 engine.linear_attention(((), ("--set", "compute.map_device_memory=false"))))


if __name__ == "__main__":
    sys.exit(main())
