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

Exits 77 (ctest: skipped) when no Vulkan device exists, unless COLIBRI_REQUIRE_VULKAN=1.
"""

import json
import os
import subprocess
import sys

import numpy as np

CLI, GEN, WORK = sys.argv[1:4]
TOKENS = "5,17,99,3,250,42,7,300,11"
VULKAN = ["--set", "compute.backend=vulkan"]
EXACT = ["--exact-activations", "--kv-type", "f32"]


def run(args):
    p = subprocess.run([CLI] + args, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        raise RuntimeError(f"colibri-cli {' '.join(args)} failed ({p.returncode}):\n{p.stderr}")
    return p


def model(arch, preset):
    ckpt = os.path.join(WORK, f"ckpt-{arch}")
    if not os.path.exists(os.path.join(ckpt, "config.json")):
        subprocess.run([sys.executable, GEN, "--arch", arch, "--out", ckpt, "--dtype", "f32"], check=True,
                       capture_output=True)
    out = os.path.join(WORK, f"{arch}-{preset}")
    if not os.path.exists(os.path.join(out, "manifest.json")):
        run(["convert", "--input", ckpt, "--output", out, "--quantize", preset, "--force"])
    return out


def logits(path, name, *extra):
    out = os.path.join(WORK, f"{os.path.basename(path)}-{name}.npy")
    run(["logits", "--model", path, "--tokens", TOKENS, "--out", out] + list(extra))
    return np.load(out)


def same(a, b):
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def vram_promise():
    failures = []
    for arch, preset in (("mixtral", "q8_0"), ("qwen2_moe", "q4_k_m")):
        m = model(arch, preset)
        with open(os.path.join(m, "manifest.json")) as f:
            experts = json.load(f)["experts"]
        slot = max((e["size"] + 4095) // 4096 * 4096 for e in experts)
        sizes = {"none": 0, "one": slot, "quarter": slot * max(1, len(experts) // 4), "all": slot * len(experts)}
        base = logits(m, "vram-base", *VULKAN)
        runs = 0
        for name, budget in sizes.items():
            for ram in ("all", "one"):
                for mapped in ("true", "false"):
                    for batch in ("512", "1"):
                        extra = VULKAN + ["--vram-budget", str(budget), "--set", f"compute.map_device_memory={mapped}",
                                          "--batch", batch]
                        if ram == "one":
                            extra += ["--expert-cache-size", str(slot)]
                        got = logits(m, f"vram-{name}-{ram}-{mapped}-{batch}", *extra)
                        runs += 1
                        if not same(base, got):
                            failures.append(f"{arch}/{preset}: vram {name} ({budget} bytes), RAM {ram}, mapped "
                                            f"{mapped}, batch {batch}: logits differ (max abs "
                                            f"{np.abs(base - got).max()})")
        print(f"  {arch}/{preset}: {runs} VRAM tier placements checked against vram_budget 0", flush=True)

        def bench(budget, *extra):
            p = run(["bench", "--model", m, "--prompt-tokens", "8", "--gen-tokens", "8", "--json", "--vram-budget",
                     str(budget), "--set", "compute.map_device_memory=false"] + VULKAN + list(extra))
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
        cpu = run(["bench", "--model", m, "--prompt-tokens", "4", "--gen-tokens", "2", "--json", "--vram-budget",
                   str(sizes["all"])])
        if json.loads(cpu.stdout)["vram_slots"] != 0 or "vram_budget" not in cpu.stderr:
            failures.append(f"{arch}: the CPU backend has no device memory: vram_budget must be ignored with a warning "
                            f"({cpu.stderr.strip()})")
        print(f"  {arch}/{preset}: bench VRAM stats: quarter {small['vram_hits']} hits / {small['vram_misses']} "
              f"misses, {small['bytes_uploaded']} bytes uploaded; all {full['vram_hits']} hits", flush=True)
    return failures


def main():
    os.makedirs(WORK, exist_ok=True)
    os.environ["XDG_CACHE_HOME"] = os.path.join(WORK, "xdg-cache")  # bench writes usage history there
    probe = subprocess.run([CLI, "plugins", "list"], capture_output=True, text=True)
    try:
        run(["logits", "--model", model("mixtral", "f32"), "--tokens", "1", "--out",
             os.path.join(WORK, "probe.npy")] + VULKAN)
    except RuntimeError as e:
        if os.environ.get("COLIBRI_REQUIRE_VULKAN") == "1":
            print(f"FAIL: COLIBRI_REQUIRE_VULKAN=1 but the Vulkan backend cannot run:\n{e}\n{probe.stdout}")
            return 1
        print(f"SKIP: no usable Vulkan device:\n{e}")
        return 77

    if "--vram" in sys.argv[4:]:
        failures = vram_promise()
        for f in failures:
            print("FAIL:", f)
        return 1 if failures else 0

    failures = []
    cases = [(a, "f32") for a in ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "llama", "mistral")]
    cases += [("mixtral", "q8_0"), ("qwen2_moe", "q4_k_m"), ("olmoe", "f16"), ("llama", "q5_k_m"),
              ("qwen3_moe", "q3_k_m"), ("mixtral", "q2_k"), ("mistral", "bf16")]
    for arch, preset in cases:
        m = model(arch, preset)
        cpu = logits(m, "cpu", *EXACT)
        vk = logits(m, "vk", *(EXACT + VULKAN))
        rel = np.abs(cpu - vk).max(axis=1) / np.abs(cpu).max(axis=1)
        same_argmax = bool((cpu.argmax(axis=1) == vk.argmax(axis=1)).all())
        print(f"  {arch}/{preset}: vulkan vs cpu max relative error {rel.max():.2e}, same argmax: {same_argmax}",
              flush=True)
        if not rel.max() <= 1e-4:
            failures.append(f"{arch}/{preset}: vulkan differs from cpu by {rel.max():.3e} of the max logit")
        if not same_argmax:
            failures.append(f"{arch}/{preset}: vulkan picks another greedy token than cpu")

    for arch, preset in (("mixtral", "f32"), ("qwen2_moe", "q4_k_m")):
        m = model(arch, preset)
        base = logits(m, "vk-base", *VULKAN)
        for batch in ("1", "3"):
            other = logits(m, f"vk-b{batch}", "--batch", batch, *VULKAN)
            if not np.array_equal(base.view(np.uint32), other.view(np.uint32)):
                failures.append(f"{arch}/{preset}: vulkan logits with --batch {batch} differ from one batch "
                                f"(max abs {np.abs(base - other).max()})")
        print(f"  {arch}/{preset}: vulkan batch invariance checked", flush=True)

    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
