"""What the device backends' engine tests share (plugins/compute/{cuda,vulkan}/tests/*_engine_test.py):

* colibri-cli helpers: tiny models converted once per architecture and preset, logits of a fixed prompt;
* probe(): may the backend run here at all (exit 77 for ctest's skip, or 1 when the REQUIRE variable is set);
* against_cpu(): `colibri-cli logits` on the backend against the CPU backend within 1e-4 of the max-abs logit per
  position (f32 KV cache, exact activations: both backends compute the same sums in different orders), with the
  same greedy token;
* batch_invariance(): the one promise on the backend, logits bit-identical in one batch, token by token and in
  chunks of 3;
* gpt_oss(): gpt-oss's ops (attention_sinks, expert_ffn_clamped, mxfp4 experts) against the CPU backend, their one
  promise, and mxfp4 experts uploaded to device memory;
* linear_attention(): Qwen3-Next's and Qwen3.5's gated-delta-rule layers against the CPU backend, their one promise,
  and a chat's next turn returning to a KV checkpoint.
"""

import json
import os
import re
import subprocess
import sys

import numpy as np

TOKENS = "5,17,99,3,250,42,7,300,11"
EXACT = ["--exact-activations", "--kv-type", "f32"]
ARCHS = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "llama", "mistral", "glm4_moe", "minimax_m2", "ernie4_5_moe",
         "deepseek_v2", "deepseek_v3", "dots1", "bailing_moe_v2", "qwen3_vl_moe", "hunyuan_moe")
# Every preset at least once (q4_0 is covered by the conformance suites only).
PRESETS = [("mixtral", "q8_0"), ("qwen2_moe", "q4_k_m"), ("olmoe", "f16"), ("llama", "q5_k_m"),
           ("qwen3_moe", "q3_k_m"), ("mixtral", "q2_k"), ("mistral", "bf16")]
# gpt-oss's ops (attention sinks, biased experts with the clamped SwiGLU) under the engine: not in ARCHS, which a
# backend without those optional ops runs too.
GPT_OSS = [("gpt_oss", "f32"), ("gpt_oss", "q4_k_m")]


class Engine:
    """colibri-cli at CLI with tiny models made by GEN under WORK, on compute backend `backend`."""

    def __init__(self, cli, gen, work, backend):
        self.cli, self.gen, self.work, self.backend = cli, gen, work, backend
        self.on_backend = ["--set", f"compute.backend={backend}"]
        os.makedirs(work, exist_ok=True)

    def run(self, args, stdin=None):
        p = subprocess.run([self.cli] + args, capture_output=True, text=True, timeout=300, input=stdin)
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
            failures += self.compare_to_cpu(self.model(arch, preset), f"{arch}/{preset}")
        return failures

    def compare_to_cpu(self, m, label):
        """The model's logits on this backend against the CPU's: within 1e-4 of the max logit, same greedy token."""
        return self.compare_to_cpu_with(m, label, [])

    def compare_to_cpu_with(self, m, label, extra):
        """compare_to_cpu, the backend run with `extra` flags too."""
        failures = []
        cpu = self.logits(m, "cpu", *EXACT)
        dev = self.logits(m, self.backend, *(EXACT + self.on_backend + extra))
        rel = np.abs(cpu - dev).max(axis=1) / np.abs(cpu).max(axis=1)
        same_argmax = bool((cpu.argmax(axis=1) == dev.argmax(axis=1)).all())
        print(f"  {label}: {self.backend} vs cpu max relative error {rel.max():.2e}, same argmax: {same_argmax}",
              flush=True)
        if not rel.max() <= 1e-4:
            failures.append(f"{label}: {self.backend} differs from cpu by {rel.max():.3e} of the max logit")
        if not same_argmax:
            failures.append(f"{label}: {self.backend} picks another greedy token than cpu")
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

    def linear_attention(self, variants=((),)):
        """Qwen3-Next's and Qwen3.5's gated-delta-rule layers (the optional mul, causal_conv and gated_delta_rule ops,
        the recurrent states where the KV cache is): Qwen3-Next, Qwen3.5-MoE and Qwen3.5 against the CPU backend under each
        of `variants` (extra flags), and the one promise (Qwen3-Next's logits bit-identical token by token and in
        chunks of 3), and a chat's next turn returning to a KV checkpoint. A backend without the ops is refused at load
        (tests/integration/sdk_third_party_backend.sh)."""
        failures = []
        for extra in variants:
            for arch in ("qwen3_next", "qwen3_5_moe", "qwen3_5"):
                m = self.model(arch, "f32")
                label = f"{arch}/f32" + (" " + " ".join(extra) if extra else "")
                failures += self.compare_to_cpu_with(m, label, list(extra))
            m = self.model("qwen3_next", "f32")
            base = self.logits(m, f"{self.backend}-lin", *self.on_backend, *extra)
            for batch in ("1", "3"):
                other = self.logits(m, f"{self.backend}-lin-b{batch}", "--batch", batch, *self.on_backend, *extra)
                if not same(base, other):
                    failures.append(f"qwen3_next: {self.backend} logits with --batch {batch} differ from one batch "
                                    f"(max abs {np.abs(base - other).max()})")
            print(f"  qwen3_next: {self.backend} batch invariance checked", flush=True)
            failures += self.chat_returns_to_a_checkpoint(m, list(extra))
        return failures

    def chat_returns_to_a_checkpoint(self, m, extra):
        """A recurrent model's next chat turn returns to a KV checkpoint (memory.kv_checkpoints): the states go back
        from their host copies to where the cache keeps them (the device's memory when the KV cache is there), and the
        transcript is the one of a chat without checkpoints, which reuses nothing. The template drops the "<think>"
        its generation prompt opens, so turn 2 shares turn 1's prompt up to that generation prompt only."""
        template = os.path.join(self.work, "think_dropped.jinja")
        with open(template, "w") as f:
            f.write("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                    "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}")
        # Sampled from the whole distribution with a fixed seed: a tiny model's greedy tokens hardly depend on the
        # recurrent states, its probabilities do (a state left where turn 1 ended changes this transcript).
        args = ["chat", "-m", m, "-n", "40", "--temp", "1", "--top-k", "0", "--top-p", "1", "--min-p", "0", "--seed", "5",
                "--template", template, "--system", "Be brief."]
        args += self.on_backend + extra
        turns = "what does the river say\nand then what\n"
        kept = self.run(args, stdin=turns)
        none = self.run(args + ["--set", "memory.kv_checkpoints=0"], stdin=turns)
        reused = lambda p: [int(x) for x in re.findall(r"(\d+) reused from the cache", p.stderr)]
        label = f"qwen3_next chat on {self.backend}" + (" " + " ".join(extra) if extra else "")
        if kept.stdout != none.stdout:
            return [f"{label}: the transcript with checkpoints differs from the one without:\n{kept.stdout}\n"
                    f"{none.stdout}"]
        if len(reused(kept)) != 2 or reused(kept)[1] == 0 or reused(none) != [0, 0]:
            return [f"{label}: turn 2 reused {reused(kept)} with checkpoints and {reused(none)} without"]
        print(f"  {label}: turn 2 returns to a checkpoint ({reused(kept)[1]} tokens reused)", flush=True)
        return []

    def mxfp4_model(self, preset):
        """gpt_oss with MXFP4 experts, converted at `preset`; fails unless its experts really are mxfp4."""
        ckpt = os.path.join(self.work, "ckpt-gpt_oss-mxfp4")
        if not os.path.exists(os.path.join(ckpt, "config.json")):
            subprocess.run([sys.executable, self.gen, "--arch", "gpt_oss", "--out", ckpt, "--dtype", "f32", "--mxfp4"],
                           check=True, capture_output=True)
        out = os.path.join(self.work, f"gpt_oss-mxfp4-{preset}")
        if not os.path.exists(os.path.join(out, "manifest.json")):
            self.run(["convert", "--input", ckpt, "--output", out, "--quantize", preset, "--force"])
        with open(os.path.join(out, "manifest.json")) as f:
            experts = json.load(f)["experts"]
        types = {e[part]["type"] for e in experts for part in ("gate", "up", "down")}
        if types != {"mxfp4"}:
            raise RuntimeError(f"{out}: the experts should all be mxfp4, not {sorted(types)}")
        return out

    def gpt_oss(self, discrete):
        """gpt_oss (converted at f32 and q4_k_m, and with MXFP4 experts as openai ships them, which convert keeps at
        any preset) against the CPU backend; the one promise on both f32 models; and bit-identical logits with every
        mxfp4 expert uploaded to device memory (`discrete`: the options that make that memory a discrete GPU's, so
        17-byte blocks sit at any offset of a slot), each uploaded once and then hit."""
        failures = self.against_cpu(GPT_OSS)
        for preset in ("f32", "q4_k_m"):
            failures += self.compare_to_cpu(self.mxfp4_model(preset), f"gpt_oss-mxfp4/{preset}")
        for label, m in (("gpt_oss/f32", self.model("gpt_oss", "f32")), ("gpt_oss-mxfp4/f32", self.mxfp4_model("f32"))):
            base = self.logits(m, f"{self.backend}-base", *self.on_backend)  # the mxfp4 one is used below
            for batch in ("1", "3"):
                other = self.logits(m, f"{self.backend}-b{batch}", "--batch", batch, *self.on_backend)
                if not same(base, other):
                    failures.append(f"{label}: {self.backend} logits with --batch {batch} differ from one batch")
            print(f"  {label}: {self.backend} batch invariance checked", flush=True)
        experts, _, sizes = self._vram_sizes(m)
        tier = list(discrete) + ["--vram-budget", str(sizes["all"])]
        uploaded = self.logits(m, f"{self.backend}-vram", *self.on_backend, *tier)
        if not same(base, uploaded):
            failures.append(f"gpt_oss-mxfp4/f32: {self.backend} logits with every expert in device memory differ "
                            f"(max abs {np.abs(base - uploaded).max()})")
        st, _ = self._bench(m, *tier)
        if st["vram_uploads"] != len(experts) or st["vram_misses"] != 0:
            failures.append(f"gpt_oss-mxfp4/f32: every expert should be uploaded once and then hit: {st}")
        print(f"  gpt_oss-mxfp4/f32: {self.backend} VRAM tier checked", flush=True)
        return failures


    def _bench(self, m, *extra, prompt=8, gen=8):
        p = self.run(["bench", "--model", m, "--prompt-tokens", str(prompt), "--gen-tokens", str(gen), "--json"] +
                     self.on_backend + list(extra))
        return json.loads(p.stdout), p.stderr

    def _vram_sizes(self, m):
        with open(os.path.join(m, "manifest.json")) as f:
            experts = json.load(f)["experts"]
        slot = max((e["size"] + 4095) // 4096 * 4096 for e in experts)
        sizes = {"none": 0, "one": slot, "quarter": slot * max(1, len(experts) // 4), "all": slot * len(experts)}
        return experts, slot, sizes

    def vram_promise(self, placements, discrete, budgets=("none", "one", "quarter", "all")):
        """The one promise with the VRAM expert tier: memory.vram_budget 0, one expert slot, a quarter of the experts
        and all of them (memory.vram_admission frequency, the default, and always), each with the RAM tier holding
        everything or one expert, under every placement (name ->
        extra arguments, e.g. mapped and unmapped device memory), token by token and in one batch: logits
        bit-identical. The bench (with `discrete`, the arguments of a discrete GPU's path) reports the tier: uploads
        happen, the slots stay within the budget, all-in-VRAM decodes without an upload; the CPU backend (no device
        memory) ignores vram_budget with a warning. `budgets` narrows the VRAM budgets the logits are checked at
        (each costs a process start per RAM size and batch: a GPU's context creation is slow)."""
        failures = []
        for arch, preset in VRAM_CASES:
            m = self.model(arch, preset)
            experts, slot, sizes = self._vram_sizes(m)
            base = self.logits(m, "vram-base", *self.on_backend)
            runs = 0
            for name, budget in ((n, sizes[n]) for n in budgets):
                for ram in ("all", "one"):
                    for placement, args in placements.items():
                        for batch in ("512", "1"):
                            admission = "always" if batch == "1" else "frequency"  # both, without doubling the runs
                            extra = self.on_backend + ["--vram-budget", str(budget), "--batch", batch, "--set",
                                                       f"memory.vram_admission={admission}"] + args
                            if ram == "one":
                                extra += ["--expert-cache-size", str(slot)]
                            got = self.logits(m, f"vram-{name}-{ram}-{placement}-{batch}", *extra)
                            runs += 1
                            if not same(base, got):
                                failures.append(f"{arch}/{preset}: vram {name} ({budget} bytes), RAM {ram}, "
                                                f"{placement}, batch {batch}: logits differ (max abs "
                                                f"{np.abs(base - got).max()})")
            print(f"  {arch}/{preset}: {runs} VRAM tier placements checked against vram_budget 0", flush=True)
            small, _ = self._bench(m, "--vram-budget", str(sizes["quarter"]), "--expert-cache-size", str(slot),
                                   *discrete)
            if not (small["vram_uploads"] > 0 and small["bytes_uploaded"] >= small["vram_uploads"] * min(
                    e["size"] for e in experts)):
                failures.append(f"{arch}: a quarter in VRAM uploaded nothing: {small}")
            if not (0 < small["vram_allocated_bytes"] <= small["vram_budget_bytes"] == sizes["quarter"]):
                failures.append(f"{arch}: VRAM slots over budget: {small['vram_allocated_bytes']} > {sizes['quarter']}")
            if (small["vram_hits"] + small["vram_misses"] == 0 or
                    small["vram_misses"] != small["vram_uploads"] + small["vram_bypassed"]):
                failures.append(f"{arch}: VRAM lookups do not add up (misses = uploads + run from RAM): {small}")
            always, _ = self._bench(m, "--vram-budget", str(sizes["quarter"]), "--expert-cache-size", str(slot),
                                    "--set", "memory.vram_admission=always", *discrete)
            if always["vram_bypassed"] != 0 or always["vram_misses"] != always["vram_uploads"]:
                failures.append(f"{arch}: memory.vram_admission=always should upload every miss: {always}")
            if small["expert_hits"] + small["expert_misses"] != small["vram_misses"]:
                failures.append(f"{arch}: the RAM tier should see exactly the VRAM misses: {small}")
            full, _ = self._bench(m, "--vram-budget", str(sizes["all"]), *discrete)
            if full["vram_misses"] != 0 or full["vram_uploads"] != len(experts) or full["vram_hit_rate"] != 1.0:
                failures.append(f"{arch}: everything in VRAM should upload each expert once at load and then only "
                                f"hit: {full}")
            off, _ = self._bench(m, "--vram-budget", "0", *discrete)
            if off["vram_slots"] != 0 or off["vram_uploads"] != 0:
                failures.append(f"{arch}: vram_budget 0 made a VRAM tier: {off}")
            cpu = self.run(["bench", "--model", m, "--prompt-tokens", "4", "--gen-tokens", "2", "--json",
                            "--vram-budget", str(sizes["all"])])
            if json.loads(cpu.stdout)["vram_slots"] != 0 or "vram_budget" not in cpu.stderr:
                failures.append(f"{arch}: the CPU backend has no device memory: vram_budget must be ignored with a "
                                f"warning ({cpu.stderr.strip()})")
            print(f"  {arch}/{preset}: bench VRAM stats: quarter {small['vram_hits']} hits / {small['vram_misses']} "
                  f"misses, {small['bytes_uploaded']} bytes uploaded; all {full['vram_hits']} hits", flush=True)
        return failures

    def cpu_fallback(self, discrete):
        """compute.cpu_fallback: auto on a discrete GPU's path (`discrete`), its cost model forced each way:
        * uploads never pay (compute.upload_gbps tiny): every VRAM miss runs on the CPU, VRAM only fills its free
          slots (no eviction), and the logits stay within 1e-4 of the max-abs logit of the backend alone (exact
          activations, f32 KV cache), with the same greedy tokens;
        * the CPU never pays (compute.cpu_gbps tiny): nothing runs on the CPU and the logits are bit-identical to
          compute.cpu_fallback: off;
        * every expert in VRAM: the fallback switches itself off (no cost model), logits bit-identical;
        * a wrong value is an error naming the key; the CPU backend itself ignores the key."""
        failures = []
        for arch, preset in VRAM_CASES:
            m = self.model(arch, preset)
            experts, slot, sizes = self._vram_sizes(m)
            quarter = ["--vram-budget", str(sizes["quarter"])] + discrete
            auto = ["--set", "compute.cpu_fallback=auto"]
            base = self.logits(m, "fallback-base", *(EXACT + self.on_backend + quarter))
            cpu_wins = auto + ["--set", "compute.upload_gbps=0.000001"]
            got = self.logits(m, "fallback-cpu", *(EXACT + self.on_backend + quarter + cpu_wins))
            rel = np.abs(base - got).max(axis=1) / np.abs(base).max(axis=1)
            if not rel.max() <= 1e-4 or not (base.argmax(axis=1) == got.argmax(axis=1)).all():
                failures.append(f"{arch}/{preset}: experts on the CPU moved the logits by {rel.max():.3e} of the max "
                                f"logit, or the greedy token")
            st, err = self._bench(m, *(quarter + cpu_wins))
            cost = st["cost_model"]
            if cost is None or cost["cpu_token_limit"] == 0 or "compute.cpu_fallback: auto" not in err:
                failures.append(f"{arch}: no cost model (or one where the CPU never wins) with uploads at 1 kB/s: "
                                f"{cost}\n{err}")
            elif not (st["cpu_fallback_runs"] > 0 and st["cpu_fallback_runs"] == st["vram_misses"] and
                      st["cpu_fallback_bytes"] >= st["cpu_fallback_runs"] * min(e["size"] for e in experts)):
                failures.append(f"{arch}: with uploads at 1 kB/s every VRAM miss should run on the CPU: {st}")
            elif not (st["vram_evictions"] == 0 and 0 < st["vram_uploads"] <= st["vram_slots"] and
                      st["vram_hits"] > 0):
                failures.append(f"{arch}: the CPU's experts should fill free VRAM slots only, and hit there later: "
                                f"{st}")
            upload_wins = auto + ["--set", "compute.cpu_gbps=0.000001"]
            same_as_off = self.logits(m, "fallback-upload", *(EXACT + self.on_backend + quarter + upload_wins))
            st, _ = self._bench(m, *(quarter + upload_wins))
            if not same(base, same_as_off) or st["cpu_fallback_runs"] != 0 or st["vram_uploads"] == 0:
                failures.append(f"{arch}/{preset}: with the CPU at 1 kB/s nothing may run there and the logits must "
                                f"be those of cpu_fallback off: {st}")
            everything = ["--vram-budget", str(sizes["all"])] + discrete
            st, _ = self._bench(m, *(everything + auto))
            full = self.logits(m, "fallback-all", *(EXACT + self.on_backend + everything + auto))
            if st["cost_model"] is not None or st["cpu_fallback_runs"] != 0 or not same(base, full):
                failures.append(f"{arch}/{preset}: every expert in VRAM leaves nothing for the CPU: {st}")
            try:
                self.run(["bench", "--model", m, "--prompt-tokens", "2", "--gen-tokens", "1"] + self.on_backend +
                         ["--set", "compute.cpu_fallback=maybe"])
                failures.append(f"{arch}: compute.cpu_fallback=maybe was accepted")
            except RuntimeError as e:
                if "compute.cpu_fallback: 'maybe' is not one of off, auto" not in str(e):
                    failures.append(f"{arch}: a wrong compute.cpu_fallback should name the key: {e}")
            on_cpu = json.loads(self.run(["bench", "--model", m, "--prompt-tokens", "2", "--gen-tokens", "1", "--json",
                                          "--set", "compute.cpu_fallback=auto"]).stdout)
            if on_cpu["cost_model"] is not None:
                failures.append(f"{arch}: the CPU backend has nothing to fall back from: {on_cpu['cost_model']}")
            print(f"  {arch}/{preset}: cpu_fallback checked (cost model {cost})", flush=True)
        return failures


    def kv_on_device(self, discrete):
        """memory.kv_on_device (default true) on a discrete GPU's path (`discrete`): the KV cache lives in device
        memory, its bytes as bench's kv_device_bytes, and attention reads it there; the logits are bit-identical to
        the KV cache in host memory (memory.kv_on_device=false) for every KV type, token by token and in one batch,
        on three architectures (qwen3_moe with per-head q/k norms)."""
        failures = []
        for arch, preset in (("mixtral", "q8_0"), ("qwen3_moe", "q4_k_m"), ("mistral", "f32")):
            m = self.model(arch, preset)
            for kv in ("f16", "q8_0", "f32"):
                for batch in ("512", "1"):
                    args = self.on_backend + discrete + ["--kv-type", kv, "--batch", batch]
                    host = self.logits(m, f"kv-host-{kv}-{batch}", *args, "--set", "memory.kv_on_device=false")
                    dev = self.logits(m, f"kv-device-{kv}-{batch}", *args)
                    if not same(host, dev):
                        failures.append(f"{arch}/{preset}: KV cache {kv} in device memory, batch {batch}: logits "
                                        f"differ from it in host memory (max abs {np.abs(host - dev).max()})")
            with open(os.path.join(m, "manifest.json")) as f:
                hp = json.load(f)["hparams"]
            want = 2 * hp["num_layers"] * hp["num_kv_heads"] * hp["head_dim"] * 2 * 64  # K and V, f16, 64 positions
            on, _ = self._bench(m, *discrete, "--ctx", "64")
            off, _ = self._bench(m, *discrete, "--ctx", "64", "--set", "memory.kv_on_device=false")
            if on["kv_device_bytes"] != want or off["kv_device_bytes"] != 0:
                failures.append(f"{arch}: kv_device_bytes should be {want} (the f16 cache of 64 positions) with "
                                f"memory.kv_on_device and 0 without: {on['kv_device_bytes']}, {off['kv_device_bytes']}")
            print(f"  {arch}/{preset}: KV cache in device memory checked ({on['kv_device_bytes']} bytes)", flush=True)
        return failures


    def activations_on_device(self, discrete, archs=ARCHS):
        """memory.activations_on_device (default true) on a discrete GPU's path (`discrete`): activations stay in
        device buffers from op to op (bench's activations_on_device), and the logits are bit-identical to activations
        in host memory, staged per op, on every tiny architecture (shared experts with and without a gate, dense
        layers, per-head q/k norms), token by token (decode: each routed expert takes every token, in place), in
        chunks of 3 (rows gathered per expert) and in one batch."""
        failures = []
        for arch in archs:
            m = self.model(arch, "q8_0")
            for batch in ("512", "3", "1"):
                args = self.on_backend + discrete + ["--batch", batch]
                host = self.logits(m, f"act-host-{batch}", *args, "--set", "memory.activations_on_device=false")
                dev = self.logits(m, f"act-device-{batch}", *args)
                if not same(host, dev):
                    failures.append(f"{arch}/q8_0: activations in device memory, batch {batch}: logits differ from "
                                    f"activations in host memory (max abs {np.abs(host - dev).max()})")
            on, _ = self._bench(m, *discrete, "--ops", prompt=4, gen=2)
            off, _ = self._bench(m, *discrete, "--set", "memory.activations_on_device=false", prompt=4, gen=2)
            # Decode keeps the routing weights where topk_routing wrote them and zeroes the MoE sum on the device:
            # a token's only upload is its pass's rope positions, however many layers route (plus, once, the zeros,
            # where no warm-up run paid for them).
            uploads = {o["name"]: o["calls"] for o in on["op_times"]["decode"]}.get("copy to device", 0)
            if not on["gen_tokens"] <= uploads <= on["gen_tokens"] + 1:
                failures.append(f"{arch}: decode with activations on the device should upload once a token (the rope "
                                f"positions); it uploaded {uploads} times in {on['gen_tokens']} tokens")
            if on["activations_on_device"] is not True or off["activations_on_device"] is not False:
                failures.append(f"{arch}: bench should report activations_on_device true by default on this path and "
                                f"false with the key off: {on['activations_on_device']}, {off['activations_on_device']}")
            print(f"  {arch}/q8_0: activations in device memory checked", flush=True)
        return failures

    def routed_experts(self, discrete, on=(), baseline=None,
                       archs=("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "glm4_moe")):
        """expert_ffn_routed with every expert in the VRAM tier, on the placement `discrete` (e.g. a discrete GPU's
        path): decode routes on the backend, and the logits are bit-identical to the engine routing itself, token by
        token and in one batch (which routes as before), on every tiny MoE architecture (qwen2_moe's gated shared
        expert follows the routed op; glm4_moe routes with topk_routing_biased). `on`: the arguments that turn the op on (none where the backend always offers
        it); `baseline`: those of the run compared with (default: the same without `on`, whose VRAM hits and misses
        must then be the same: the bookkeeping is settled at the end of each pass), as must the routing records (bench
        --record-trace). bench --ops shows the routed op in decode."""
        failures = []
        for arch in archs:
            m = self.model(arch, "q8_0")
            _, _, sizes = self._vram_sizes(m)
            routed = ["--vram-budget", str(sizes["all"])] + list(discrete) + list(on)
            base = list(baseline) if baseline is not None else ["--vram-budget", str(sizes["all"])] + list(discrete)
            for batch in ("1", "512"):
                want = self.logits(m, f"routed-off-{batch}", *self.on_backend, *base, "--batch", batch)
                got = self.logits(m, f"routed-on-{batch}", *self.on_backend, *routed, "--batch", batch)
                if not same(want, got):
                    failures.append(f"{arch}/q8_0: expert_ffn_routed, batch {batch}: logits differ from the engine "
                                    f"routing (max abs {np.abs(want - got).max()})")
            # The routing records, settled from the routed op's choices at the end of each pass, are the engine's.
            traces = [os.path.join(self.work, f"{arch}-routed-{n}.jsonl") for n in ("off", "on")]
            st, _ = self._bench(m, *routed, "--ops", "--record-trace", traces[1], prompt=4, gen=4)
            self._bench(m, *base, "--record-trace", traces[0], prompt=4, gen=4)
            with open(traces[0]) as f_off, open(traces[1]) as f_on:
                records_off, records_on = f_off.read(), f_on.read()
            if records_off != records_on or not records_on:
                failures.append(f"{arch}: the routing records of routed decode differ from the engine routing's "
                                f"({traces[1]} against {traces[0]})")
            calls = {o["name"]: o["calls"] for o in st["op_times"]["decode"]}
            # The choices left in device memory come back in one download a token, after the layers: none between
            # them (a backend queues the whole pass without a break).
            if calls.get("copy to host", 0) > st["gen_tokens"]:
                failures.append(f"{arch}: routed decode should download the pass's routing once a token: "
                                f"{calls.get('copy to host', 0)} downloads in {st['gen_tokens']} tokens")
            if calls.get("expert_ffn_routed", 0) < st["gen_tokens"]:
                failures.append(f"{arch}: decode with every expert in VRAM should route on the backend: "
                                f"{calls.get('expert_ffn_routed', 0)} routed calls in {st['gen_tokens']} tokens")
            if baseline is None:
                off, _ = self._bench(m, *base, "--ops", prompt=4, gen=4)
                if st["vram_hits"] != off["vram_hits"] or st["vram_misses"] != off["vram_misses"]:
                    failures.append(f"{arch}: routed decode counts other VRAM hits/misses than the engine routing: "
                                    f"{st['vram_hits']}/{st['vram_misses']} vs {off['vram_hits']}/{off['vram_misses']}")
            print(f"  {arch}/q8_0: expert_ffn_routed checked ({calls.get('expert_ffn_routed', 0)} routed calls, "
                  f"{calls.get('event wait', 0)} event waits in {st['gen_tokens']} decode tokens)", flush=True)
        return failures

    def graphs(self, on, archs=("mixtral",)):
        """A backend option that queues the ops differently (CUDA graphs: `on` turns it on) must not change a bit:
        logits with it on and off, with every expert in VRAM (the engine routing, and the backend routing with
        compute.routed_experts, token by token and in one batch), with a quarter of the experts in VRAM (uploads
        between the captured ops), and with vram_budget 0 (host tensors between them). bench's compute_metrics show the graphs launched, and that a
        decode layer's repeated segment updates its instantiation instead of instantiating it again."""
        failures = []
        for arch in archs:
            m = self.model(arch, "q8_0")
            _, _, sizes = self._vram_sizes(m)
            placements = {"all": ["--vram-budget", str(sizes["all"])],
                          "all-routed": ["--vram-budget", str(sizes["all"]), "--set", "compute.routed_experts=true"],
                          "quarter": ["--vram-budget", str(sizes["quarter"])],
                          "none": ["--vram-budget", "0"]}
            for name, args in placements.items():
                for batch in ("1", "512") if name == "all-routed" else ("1",):  # fewer process starts: gpu-check's time
                    want = self.logits(m, f"graphs-off-{name}-{batch}", *self.on_backend, *args, "--batch", batch)
                    got = self.logits(m, f"graphs-on-{name}-{batch}", *self.on_backend, *args, *on, "--batch", batch)
                    if not same(want, got):
                        failures.append(f"{arch}/q8_0: {' '.join(on)}, {name} in VRAM, batch {batch}: logits differ "
                                        f"from launching op by op (max abs {np.abs(want - got).max()})")
            st, _ = self._bench(m, *placements["all-routed"], *on, prompt=4, gen=16)
            c = st.get("compute_metrics", {})
            launches, updates = c.get("graph_launches_total", 0), c.get("graph_updates_total", 0)
            instantiations = c.get("graph_instantiations_total", 0)
            if launches < st["gen_tokens"] or launches != updates + instantiations:
                failures.append(f"{arch}: with {' '.join(on)} decode should launch graphs (at least one a token), each "
                                f"updated or instantiated: {c}")
            if updates < instantiations:
                failures.append(f"{arch}: decode's repeated segments should update their graphs, not instantiate them "
                                f"again: {c}")
            print(f"  {arch}/q8_0: {' '.join(on)} checked in {len(placements)} placements ({c})", flush=True)
        return failures

# The models the VRAM tier checks run on.
VRAM_CASES = (("mixtral", "q8_0"), ("qwen2_moe", "q4_k_m"))


def same(a, b):
    """Bit-identical float32 arrays."""
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def report(failures):
    """Prints the failures; the exit code."""
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0
