"""What the device backends' engine tests share (plugins/compute/{cuda,vulkan}/tests/*_engine_test.py):

* colibri-cli helpers: tiny models converted once per architecture and preset, logits of a fixed prompt;
* probe(): may the backend run here at all (exit 77 for ctest's skip, or 1 when the REQUIRE variable is set);
* against_cpu(): `colibri-cli logits` on the backend against the CPU backend within 1e-4 of the max-abs logit per
  position (f32 KV cache, exact activations: both backends compute the same sums in different orders), with the
  same greedy token;
* batch_invariance(): the one promise on the backend, logits bit-identical in one batch, token by token and in
  chunks of 3.
"""

import os
import subprocess
import sys

import numpy as np

TOKENS = "5,17,99,3,250,42,7,300,11"
EXACT = ["--exact-activations", "--kv-type", "f32"]
ARCHS = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "llama", "mistral")
# Every preset at least once (q4_0 is covered by the conformance suites only).
PRESETS = [("mixtral", "q8_0"), ("qwen2_moe", "q4_k_m"), ("olmoe", "f16"), ("llama", "q5_k_m"),
           ("qwen3_moe", "q3_k_m"), ("mixtral", "q2_k"), ("mistral", "bf16")]


class Engine:
    """colibri-cli at CLI with tiny models made by GEN under WORK, on compute backend `backend`."""

    def __init__(self, cli, gen, work, backend):
        self.cli, self.gen, self.work, self.backend = cli, gen, work, backend
        self.on_backend = ["--set", f"compute.backend={backend}"]
        os.makedirs(work, exist_ok=True)

    def run(self, args):
        p = subprocess.run([self.cli] + args, capture_output=True, text=True, timeout=300)
        if p.returncode != 0:
            raise RuntimeError(f"colibri-cli {' '.join(args)} failed ({p.returncode}):\n{p.stderr}")
        return p

    def model(self, arch, preset):
        ckpt = os.path.join(self.work, f"ckpt-{arch}")
        if not os.path.exists(os.path.join(ckpt, "config.json")):
            subprocess.run([sys.executable, self.gen, "--arch", arch, "--out", ckpt, "--dtype", "f32"], check=True,
                           capture_output=True)
        out = os.path.join(self.work, f"{arch}-{preset}")
        if not os.path.exists(os.path.join(out, "manifest.json")):
            self.run(["convert", "--input", ckpt, "--output", out, "--quantize", preset, "--force"])
        return out

    def logits(self, path, name, *extra):
        out = os.path.join(self.work, f"{os.path.basename(path)}-{name}.npy")
        self.run(["logits", "--model", path, "--tokens", TOKENS, "--out", out] + list(extra))
        return np.load(out)

    def probe(self, title, require_env, skips=None):
        """None when the backend runs one token here; else the exit code: 77 (skipped), or 1 when require_env=1.
        `skips` maps a text of the error to the reason printed when it means skipping is right even then."""
        try:
            self.run(["logits", "--model", self.model("mixtral", "f32"), "--tokens", "1", "--out",
                      os.path.join(self.work, "probe.npy")] + self.on_backend)
            return None
        except RuntimeError as e:
            for text, reason in (skips or {}).items():
                if text in str(e):
                    print(f"SKIP: {reason}:\n{e}")
                    return 77
            if os.environ.get(require_env) == "1":
                plugins = subprocess.run([self.cli, "plugins", "list"], capture_output=True, text=True).stdout
                print(f"FAIL: {require_env}=1 but the {title} backend cannot run:\n{e}\n{plugins}")
                return 1
            print(f"SKIP: no usable {title} device:\n{e}")
            return 77

    def against_cpu(self, cases):
        failures = []
        for arch, preset in cases:
            m = self.model(arch, preset)
            cpu = self.logits(m, "cpu", *EXACT)
            dev = self.logits(m, self.backend, *(EXACT + self.on_backend))
            rel = np.abs(cpu - dev).max(axis=1) / np.abs(cpu).max(axis=1)
            same_argmax = bool((cpu.argmax(axis=1) == dev.argmax(axis=1)).all())
            print(f"  {arch}/{preset}: {self.backend} vs cpu max relative error {rel.max():.2e}, same argmax: "
                  f"{same_argmax}", flush=True)
            if not rel.max() <= 1e-4:
                failures.append(f"{arch}/{preset}: {self.backend} differs from cpu by {rel.max():.3e} of the max logit")
            if not same_argmax:
                failures.append(f"{arch}/{preset}: {self.backend} picks another greedy token than cpu")
        return failures

    def batch_invariance(self):
        failures = []
        for arch, preset in (("mixtral", "f32"), ("qwen2_moe", "q4_k_m")):
            m = self.model(arch, preset)
            base = self.logits(m, f"{self.backend}-base", *self.on_backend)
            for batch in ("1", "3"):
                other = self.logits(m, f"{self.backend}-b{batch}", "--batch", batch, *self.on_backend)
                if not same(base, other):
                    failures.append(f"{arch}/{preset}: {self.backend} logits with --batch {batch} differ from one "
                                    f"batch (max abs {np.abs(base - other).max()})")
            print(f"  {arch}/{preset}: {self.backend} batch invariance checked", flush=True)
        return failures


def same(a, b):
    """Bit-identical float32 arrays."""
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def report(failures):
    """Prints the failures; the exit code."""
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0
