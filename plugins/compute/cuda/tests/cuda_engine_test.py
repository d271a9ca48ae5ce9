#!/usr/bin/python3
"""The CUDA backend under the whole engine (ctest compute.cuda.engine, labels integration and cuda):

  cuda_engine_test.py COLIBRI_CLI FIXTURE_GENERATOR WORK_DIR

* every tiny architecture at f32, and every quantization preset (q4_0 is covered by the conformance suite only): `colibri-cli logits` with
  compute.backend=cuda against the CPU backend, within 1e-4 of the max-abs logit per position (f32 KV cache,
  exact activations: both backends compute the same sums in different orders), and the same greedy token;
* the one promise on CUDA: logits bit-identical in one batch, token by token and in chunks of 3.

Exits 77 (ctest: skipped) when no CUDA device can be used, unless COLIBRI_REQUIRE_CUDA=1, and when the engine
does not run device-memory backends (engine.cpp refused host_memory = false until the VRAM-tier work lands).
"""

import os
import subprocess
import sys

import numpy as np

CLI, GEN, WORK = sys.argv[1:4]
TOKENS = "5,17,99,3,250,42,7,300,11"
CUDA = ["--set", "compute.backend=cuda"]
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
    try:
        run(["logits", "--model", model("mixtral", "f32"), "--tokens", "1", "--out",
             os.path.join(WORK, "probe.npy")] + CUDA)
    except RuntimeError as e:
        if "keeps buffers in device memory" in str(e):
            # The engine itself cannot drive a device-memory backend yet: not this plugin's failure.
            print(f"SKIP: the engine does not run device-memory backends yet:\n{e}")
            return 77
        if os.environ.get("COLIBRI_REQUIRE_CUDA") == "1":
            print(f"FAIL: COLIBRI_REQUIRE_CUDA=1 but the CUDA backend cannot run:\n{e}")
            return 1
        print(f"SKIP: no usable CUDA device:\n{e}")
        return 77

    failures = []
    cases = [(a, "f32") for a in ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "llama", "mistral")]
    cases += [("mixtral", "q8_0"), ("qwen2_moe", "q4_k_m"), ("olmoe", "f16"), ("llama", "q5_k_m"),
              ("qwen3_moe", "q3_k_m"), ("mixtral", "q2_k"), ("mistral", "bf16"), ("olmoe", "q6_k")]
    for arch, preset in cases:
        m = model(arch, preset)
        cpu = logits(m, "cpu", *EXACT)
        gpu = logits(m, "cuda", *(EXACT + CUDA))
        rel = np.abs(cpu - gpu).max(axis=1) / np.abs(cpu).max(axis=1)
        same_argmax = bool((cpu.argmax(axis=1) == gpu.argmax(axis=1)).all())
        print(f"  {arch}/{preset}: cuda vs cpu max relative error {rel.max():.2e}, same argmax: {same_argmax}",
              flush=True)
        if not rel.max() <= 1e-4:
            failures.append(f"{arch}/{preset}: cuda differs from cpu by {rel.max():.3e} of the max logit")
        if not same_argmax:
            failures.append(f"{arch}/{preset}: cuda picks another greedy token than cpu")

    for arch, preset in (("mixtral", "f32"), ("qwen2_moe", "q4_k_m")):
        m = model(arch, preset)
        base = logits(m, "cuda-base", *CUDA)
        for batch in ("1", "3"):
            other = logits(m, f"cuda-b{batch}", "--batch", batch, *CUDA)
            if not np.array_equal(base.view(np.uint32), other.view(np.uint32)):
                failures.append(f"{arch}/{preset}: cuda logits with --batch {batch} differ from one batch "
                                f"(max abs {np.abs(base - other).max()})")
        print(f"  {arch}/{preset}: cuda batch invariance checked", flush=True)

    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
