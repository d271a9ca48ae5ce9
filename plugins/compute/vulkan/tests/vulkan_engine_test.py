#!/usr/bin/python3
"""The Vulkan backend under the whole engine (ctest compute.vulkan.engine, label integration):

  vulkan_engine_test.py COLIBRI_CLI FIXTURE_GENERATOR WORK_DIR

* every tiny architecture, converted at f32: `colibri-cli logits` on compute.backend=vulkan matches the CPU backend
  within 1e-4 of the max-abs logit per position (f32 KV cache, exact activations, so both backends compute the same
  sums in different orders), with the same greedy token everywhere;
* every other preset (q8_0 ... q2_k, f16, bf16): the same bound against the CPU backend;
* the one promise on Vulkan: logits bit-identical in one batch, token by token and in chunks of 3.

Exits 77 (ctest: skipped) when no Vulkan device exists, unless COLIBRI_REQUIRE_VULKAN=1.
"""

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


def main():
    os.makedirs(WORK, exist_ok=True)
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
