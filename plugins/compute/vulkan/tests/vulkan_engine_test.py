#!/usr/bin/python3
"""The Vulkan backend under the whole engine (ctest compute.vulkan.engine, label integration):

  vulkan_engine_test.py COLIBRI_CLI FIXTURE_GENERATOR WORK_DIR [--vram]

* every tiny architecture, converted at f32: `colibri-cli logits` on compute.backend=vulkan matches the CPU backend
  within 1e-4 of the max-abs logit per position (f32 KV cache, exact activations, so both backends compute the same
  sums in different orders), with the same greedy token everywhere;
* every other preset (q8_0 ... q2_k, f16, bf16): the same bound against the CPU backend;
* the one promise on Vulkan: logits bit-identical in one batch, token by token and in chunks of 3.

With --vram (ctest compute.vulkan.vram): the one promise with the VRAM expert tier. memory.vram_budget 0, one
expert slot, a quarter of the experts and all of them, each with the RAM tier holding everything or one expert, on
mapped device memory (lavapipe as an iGPU) and unmapped (compute.map_device_memory=false: a discrete GPU's path,
staging uploads, weights only in device buffers), token by token and in one batch: logits bit-identical. The bench
reports the tier: uploads happen, the slots stay within the budget, all-in-VRAM decodes without an upload; the CPU
backend (no device memory) ignores vram_budget with a warning.

Exits 77 (ctest: skipped) when no Vulkan device exists, unless COLIBRI_REQUIRE_VULKAN=1. The checks against the
CPU backend and of batch invariance live in tests/support/backend_engine.py, shared with the CUDA backend's test.
"""

import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "..", "tests",
                                "support"))
import backend_engine  # noqa: E402


def vram_promise(engine):
    failures = []
    for arch, preset in (("mixtral", "q8_0"), ("qwen2_moe", "q4_k_m")):
        m = engine.model(arch, preset)
        with open(os.path.join(m, "manifest.json")) as f:
            experts = json.load(f)["experts"]
        slot = max((e["size"] + 4095) // 4096 * 4096 for e in experts)
        sizes = {"none": 0, "one": slot, "quarter": slot * max(1, len(experts) // 4), "all": slot * len(experts)}
        base = engine.logits(m, "vram-base", *engine.on_backend)
        runs = 0
        for name, budget in sizes.items():
            for ram in ("all", "one"):
                for mapped in ("true", "false"):
                    for batch in ("512", "1"):
                        extra = engine.on_backend + ["--vram-budget", str(budget), "--set",
                                                     f"compute.map_device_memory={mapped}", "--batch", batch]
                        if ram == "one":
                            extra += ["--expert-cache-size", str(slot)]
                        got = engine.logits(m, f"vram-{name}-{ram}-{mapped}-{batch}", *extra)
                        runs += 1
                        if not backend_engine.same(base, got):
                            failures.append(f"{arch}/{preset}: vram {name} ({budget} bytes), RAM {ram}, mapped "
                                            f"{mapped}, batch {batch}: logits differ (max abs "
                                            f"{np.abs(base - got).max()})")
        print(f"  {arch}/{preset}: {runs} VRAM tier placements checked against vram_budget 0", flush=True)

        def bench(budget, *extra):
            p = engine.run(["bench", "--model", m, "--prompt-tokens", "8", "--gen-tokens", "8", "--json",
                            "--vram-budget", str(budget), "--set", "compute.map_device_memory=false"] +
                           engine.on_backend + list(extra))
            return json.loads(p.stdout)

        small = bench(sizes["quarter"], "--expert-cache-size", str(slot))
        if not (small["vram_uploads"] > 0 and small["bytes_uploaded"] >= small["vram_uploads"] * min(
                e["size"] for e in experts)):
            failures.append(f"{arch}: a quarter in VRAM uploaded nothing: {small}")
        if not (0 < small["vram_allocated_bytes"] <= small["vram_budget_bytes"] == sizes["quarter"]):
            failures.append(f"{arch}: VRAM slots over budget: {small['vram_allocated_bytes']} > {sizes['quarter']}")
        if small["vram_hits"] + small["vram_misses"] == 0 or small["vram_misses"] != small["vram_uploads"]:
            failures.append(f"{arch}: VRAM lookups do not add up: {small}")
        if small["expert_hits"] + small["expert_misses"] != small["vram_misses"]:
            failures.append(f"{arch}: the RAM tier should see exactly the VRAM misses: {small}")
        full = bench(sizes["all"])
        if full["vram_misses"] != 0 or full["vram_uploads"] != len(experts) or full["vram_hit_rate"] != 1.0:
            failures.append(f"{arch}: everything in VRAM should upload each expert once at load and then only hit: "
                            f"{full}")
        off = bench(0)
        if off["vram_slots"] != 0 or off["vram_uploads"] != 0:
            failures.append(f"{arch}: vram_budget 0 made a VRAM tier: {off}")
        # Unmapped device memory is a discrete GPU: the shared weights are uploaded once (the logits above, all
        # unmapped runs included, matched the mapped base run); mapped memory, or the key off, keeps them in host memory.
        if not 0 < off["shared_device_bytes"] or full["shared_device_bytes"] != off["shared_device_bytes"]:
            failures.append(f"{arch}: unmapped device memory should hold the shared weights: {off}")
        host_shared = bench(0, "--set", "memory.shared_on_device=false")
        mapped = json.loads(engine.run(["bench", "--model", m, "--prompt-tokens", "4", "--gen-tokens", "2", "--json"] +
                                       engine.on_backend).stdout)
        if host_shared["shared_device_bytes"] != 0 or mapped["shared_device_bytes"] != 0:
            failures.append(f"{arch}: shared weights on the device with memory.shared_on_device=false "
                            f"({host_shared['shared_device_bytes']}) or mapped memory ({mapped['shared_device_bytes']})")
        unmapped_host = engine.logits(m, "vram-shared-host", *engine.on_backend, "--set", "compute.map_device_memory=false",
                                      "--set", "memory.shared_on_device=false")
        if not backend_engine.same(base, unmapped_host):
            failures.append(f"{arch}/{preset}: shared weights staged per call give other logits than uploaded once")
        cpu = engine.run(["bench", "--model", m, "--prompt-tokens", "4", "--gen-tokens", "2", "--json",
                          "--vram-budget", str(sizes["all"])])
        if json.loads(cpu.stdout)["vram_slots"] != 0 or "vram_budget" not in cpu.stderr:
            failures.append(f"{arch}: the CPU backend has no device memory: vram_budget must be ignored with a warning "
                            f"({cpu.stderr.strip()})")
        print(f"  {arch}/{preset}: bench VRAM stats: quarter {small['vram_hits']} hits / {small['vram_misses']} "
              f"misses, {small['bytes_uploaded']} bytes uploaded; all {full['vram_hits']} hits", flush=True)
    return failures


def main():
    engine = backend_engine.Engine(*sys.argv[1:4], "vulkan")
    os.environ["XDG_CACHE_HOME"] = os.path.join(engine.work, "xdg-cache")  # bench writes usage history there
    skip = engine.probe("Vulkan", "COLIBRI_REQUIRE_VULKAN")
    if skip is not None:
        return skip
    if "--vram" in sys.argv[4:]:
        return backend_engine.report(vram_promise(engine))
    cases = [(a, "f32") for a in backend_engine.ARCHS] + backend_engine.PRESETS
    return backend_engine.report(engine.against_cpu(cases) + engine.batch_invariance())


if __name__ == "__main__":
    sys.exit(main())
