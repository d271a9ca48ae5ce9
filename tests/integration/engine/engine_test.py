#!/usr/bin/python3
"""End-to-end engine checks (run by ctest, label integration):

  engine_test.py COLIBRI_CLI FIXTURE_GENERATOR WORK_DIR [-k PATTERN]

* reference: for every architecture (plus variants: sliding window, yarn, linear and dynamic rope, OLMoE clip_qkv,
  DeepSeek's query latent, YaRN and routing) a tiny random checkpoint is converted at f32 and `colibri-cli logits`
  must match tests/reference/reference.py (float64, HF semantics) within 1e-4 of the max-abs logit, per position, and
  route to the same experts.
* quantized presets: f16, bf16, q8_0, q4_k_m against f32: mean KL divergence per preset is printed and bounded.
* the one promise: logits are bit-identical in one batch or token by token, streaming with a tiny expert cache,
  through another storage plugin or cache policy.
* bad input: out-of-vocabulary tokens, a missing or corrupt expert file, weights whose activations overflow, an
  unwritable output.
"""

import base64
import json
import os
import re
import shutil
import subprocess
import sys
import unicodedata
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "reference"))
import reference  # noqa: E402

CLI, GEN, WORK = None, None, None
TOKENS = [5, 17, 99, 3, 250, 42, 7, 300, 11, 64, 128, 2, 77, 199]


def run(args, check=True):
    p = subprocess.run([CLI] + args, capture_output=True, text=True, timeout=300)
    if check and p.returncode != 0:
        raise AssertionError(f"colibri-cli {' '.join(args)} failed ({p.returncode}):\n{p.stderr}")
    return p


def make_model(name, arch, patch=None, preset="f32", gen_args=(), edit_checkpoint=None):
    """HF checkpoint WORK/name (config patched by `patch`, then edit_checkpoint(dir)) and its conversion
    WORK/name-preset."""
    ckpt = os.path.join(WORK, name)
    if not os.path.exists(os.path.join(ckpt, "config.json")):
        subprocess.run([sys.executable, GEN, "--arch", arch, "--out", ckpt, "--dtype", "f32", *gen_args], check=True,
                       capture_output=True)
        if edit_checkpoint:
            edit_checkpoint(ckpt)
        if patch:
            with open(os.path.join(ckpt, "config.json")) as f:
                cfg = json.load(f)
            patch(cfg)
            with open(os.path.join(ckpt, "config.json"), "w") as f:
                json.dump(cfg, f)
    out = os.path.join(WORK, f"{name}-{preset}")
    if not os.path.exists(os.path.join(out, "manifest.json")):
        run(["convert", "--input", ckpt, "--output", out, "--quantize", preset])
    return ckpt, out


def logits(model, *extra, tokens=TOKENS, name="out"):
    path = os.path.join(WORK, f"{os.path.basename(model)}-{name}.npy")
    run(["logits", "--model", model, "--tokens", ",".join(map(str, tokens)), "--out", path] + list(extra))
    return path


def fill_safetensors(path, name, value):
    """Sets every element of f32 tensor `name` in a safetensors file to `value`, in place."""
    with open(path, "r+b") as f:
        n = int.from_bytes(f.read(8), "little")
        info = json.loads(f.read(n))[name]
        assert info["dtype"] == "F32", info
        begin, end = info["data_offsets"]
        f.seek(8 + n + begin)
        f.write(np.full((end - begin) // 4, value, dtype="<f4").tobytes())


VARIANTS = {
    "mixtral": ("mixtral", None),
    "qwen2_moe": ("qwen2_moe", None),
    "qwen3_moe": ("qwen3_moe", None),
    "olmoe": ("olmoe", None),
    "llama": ("llama", None),  # tied embeddings, llama3 rope scaling
    "mistral": ("mistral", None),
    "mistral-window": ("mistral", lambda c: c.update(sliding_window=5)),
    "mixtral-window": ("mixtral", lambda c: c.update(sliding_window=4)),
    "llama-yarn": ("llama", lambda c: c.update(rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                                             "original_max_position_embeddings": 64})),
    "llama-linear": ("llama", lambda c: c.update(rope_scaling={"rope_type": "linear", "factor": 2.0})),
    # Dynamic NTK past its original context (8 of the 14 tokens): the pass's length sets the rotation.
    "llama-dynamic": ("llama", lambda c: c.update(rope_scaling={"rope_type": "dynamic", "factor": 2.0,
                                                                "original_max_position_embeddings": 8})),
    "olmoe-clip": ("olmoe", lambda c: c.update(clip_qkv=0.8)),
    "qwen2_moe-norm": ("qwen2_moe", lambda c: c.update(norm_topk_prob=True)),
    # gpt-oss: attention sinks, sliding window on even layers, yarn, biased router and clamped biased experts.
    "gpt_oss": ("gpt_oss", None),
    "gpt_oss-mxfp4": ("gpt_oss", None, ("--mxfp4",)),  # experts as openai ships them
    "gpt_oss-full": ("gpt_oss", lambda c: c.update(layer_types=["full_attention"] * 3)),
    # GLM-4.5: sigmoid router whose selection bias picks the experts, weights x routed_scaling_factor 2.5, a shared
    # expert, a dense first layer, rope on half of each head, q/k/v biases; an MTP layer the converter skips.
    "glm4_moe": ("glm4_moe", None),
    "glm4_moe-qknorm": ("glm4_moe", None, ("--set", "use_qk_norm=true")),  # GLM-4.5 (355B)
    "glm4_moe-unnormalized": ("glm4_moe", lambda c: c.update(norm_topk_prob=False, partial_rotary_factor=0.25)),
    # MiniMax-M2: Mixtral's names, q/k norms over the whole projection, rope on rotary_dim of head_dim, a sigmoid
    # router whose bias picks the experts.
    "minimax_m2": ("minimax_m2", None),
    "minimax_m2-scaled": ("minimax_m2", lambda c: c.update(routed_scaling_factor=2.5)),
    "minimax_m2-softmax": ("minimax_m2", lambda c: c.update(scoring_func="softmax")),
    # ERNIE 4.5: GPT-J's interleaved rope, a softmax router whose moe_statics bias picks, two shared experts, tied
    # embeddings, a dense first layer.
    "ernie4_5_moe": ("ernie4_5_moe", None),
    "ernie4_5_moe-interval": ("ernie4_5_moe", None, ("--set", "moe_layer_interval=2", "--set", "tie_word_embeddings=false")),
    # DeepSeek-V2-Lite: multi-head latent attention (queries straight from the hidden state, v_head_dim apart from
    # qk_nope_head_dim), RoPE on the interleaved qk_rope part only, YaRN (factor 40, mscale = mscale_all_dim: the
    # softmax scale x mscale^2, cos/sin unscaled), a softmax router, two shared experts, a dense first layer.
    "deepseek_v2": ("deepseek_v2", None),
    # YaRN past a short original context with mscale != mscale_all_dim: cos/sin x their ratio as well.
    "deepseek_v2-yarn": ("deepseek_v2", lambda c: c.update(
        max_position_embeddings=256, rope_scaling={"type": "yarn", "factor": 4.0, "beta_fast": 32, "beta_slow": 1,
                                                   "original_max_position_embeddings": 64, "mscale": 1.0,
                                                   "mscale_all_dim": 0.5})),
    # DeepSeek-V2 (236B): queries through a latent (q_a_proj, q_a_layernorm, q_b_proj).
    "deepseek_v2-q_lora": ("deepseek_v2", None, ("--set", "q_lora_rank=96")),
    # DeepSeek-V2 / V2.5 (236B): the unnormalized softmax weights x routed_scaling_factor 16.
    "deepseek_v2-scaled": ("deepseek_v2", lambda c: c.update(routed_scaling_factor=16.0)),
    # DeepSeek's own code renormalizes V2's weights instead of scaling them (transformers' port would scale only).
    "deepseek_v2-normalized": ("deepseek_v2", lambda c: c.update(norm_topk_prob=True, routed_scaling_factor=2.0)),
    # Kimi K2 / DeepSeek-V3 / Moonlight: MLA with a query latent, a sigmoid router whose selection bias picks the
    # experts, weights renormalized x routed_scaling_factor 2.446, two shared experts, a dense first layer.
    "deepseek_v3": ("deepseek_v3", None),
    "deepseek_v3-unnormalized": ("deepseek_v3", lambda c: c.update(norm_topk_prob=False)),
    # Kimi K2's YaRN (beta_fast = beta_slow = 1, mscale = mscale_all_dim = 1: the softmax scale x mscale^2).
    "deepseek_v3-yarn": ("deepseek_v3", lambda c: c.update(
        max_position_embeddings=131072, rope_scaling={"type": "yarn", "factor": 32.0,
                                                      "original_max_position_embeddings": 4096, "beta_fast": 1.0,
                                                      "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0})),
    # Moonlight-16B-A3B: V3 without the query latent.
    "deepseek_v3-moonlight": ("deepseek_v3", None, ("--set", "q_lora_rank=null")),
    # Kimi K2's tokenizer layout: tiktoken.model and its code, no tokenizer.json (Tiktoken below checks the tokens).
    "deepseek_v3-kimi": ("deepseek_v3", None, ("--tiktoken",)),
    # DeepSeek-V3 / R1: the experts picked within the 2 best of 4 groups, a group scored by its best two.
    "deepseek_v3-groups": ("deepseek_v3", None, ("--set", "n_group=4", "--set", "topk_group=2")),
    # DeepSeek-V2 (236B): group_limited_greedy (the best of 4 groups here), a group scored by its best softmax score,
    # x16.
    "deepseek_v2-groups": ("deepseek_v2", None, ("--set", "n_group=4", "--set", "topk_group=1", "--set",
                                                 "topk_method=\"group_limited_greedy\"", "--set",
                                                 "routed_scaling_factor=16.0")),
    # A V3-architecture model without shared experts (n_shared_experts null).
    "deepseek_v3-unshared": ("deepseek_v3", None, ("--set", "n_shared_experts=null")),
    # GLM's router with groups (its released models have one; its code routes within groups as DeepSeek-V3).
    "glm4_moe-groups": ("glm4_moe", None, ("--set", "n_group=4", "--set", "topk_group=1")),
    # Llama 4 Scout: an image-text checkpoint (text_config, language_model., a vision tower to skip), chunked attention
    # on the RoPE layers (chunks of 4 here), a NoPE layer whose queries scale with the position (floor 4 here), RoPE's
    # interleaved pairs and llama3 scaling with low = high frequency factors, weightless q/k RMS norms after RoPE,
    # top-1 sigmoid routing whose weight scales the expert's input, a shared expert, experts fused as gate_up_proj.
    "llama4": ("llama4", None),
    # Llama 4 Maverick: MoE on every other layer (interleave_moe_layer_step, no moe_layers list), dense layers of
    # intermediate_size_mlp between, no q/k norm, no rope scaling.
    "llama4-maverick": ("llama4", None, ("--set", "interleave_moe_layer_step=2", "--set", "moe_layers=null", "--set",
                                         "use_qk_norm=false", "--set", "rope_scaling=null")),
    # dots.llm1: Qwen 3's attention (q/k norms per head) and DeepSeek-V3's routing (sigmoid scores, a selection bias,
    # renormalized x2.5, two shared experts, a dense first layer).
    "dots1": ("dots1", None),
    # Dots1Config's window: 4 positions on the layers from max_window_layers (1) on; groups; its class's defaults
    # when config.json leaves the keys out (no renormalizing, a window of 4096 from layer 62 on: none here), with
    # attention biases (o_proj's too).
    "dots1-window": ("dots1", None, ("--set", "sliding_window=4", "--set", "max_window_layers=1")),
    "dots1-groups": ("dots1", None, ("--set", "n_group=4", "--set", "topk_group=2")),
    "dots1-defaults": ("dots1", lambda c: [c.pop(k) for k in ("norm_topk_prob", "sliding_window", "max_window_layers")],
                       ("--set", "attention_bias=true")),
    # Ling 2.0: q, k and v in one query_key_value projection, per-head q/k norms, RoPE on half of each head, a
    # sigmoid router whose expert_bias picks within the best 2 of 4 groups, renormalized (whatever norm_topk_prob
    # says) x2.5, a shared expert, a dense first layer.
    "bailing_moe_v2": ("bailing_moe_v2", None),
    # Ling-1T's rotary_dim instead of partial_rotary_factor; no groups; an attention.dense bias; no q/k norms.
    # Qwen3-VL-MoE's language model: Qwen3-MoE under text_config and model.language_model., experts fused as
    # gate_up_proj [E, D, 2F] (gate the first half) and down_proj, a router that always renormalizes, multimodal RoPE
    # (plain for text), a vision tower to skip.
    "qwen3_vl_moe": ("qwen3_vl_moe", None),
    # A dense layer between (mlp_only_layers), norm_topk_prob false in the file (the router renormalizes anyway), and
    # the word embeddings tied when neither config says otherwise (Qwen3VLMoeTextConfig's default).
    "qwen3_vl_moe-variants": ("qwen3_vl_moe", lambda c: (c.pop("tie_word_embeddings"),
                                                         c["text_config"].pop("tie_word_embeddings")),
                              ("--set", "mlp_only_layers=[1]", "--set", "norm_topk_prob=false")),
    # GLM-4.7-Flash: DeepSeek-V3's multi-head latent attention (v_head_dim wider than qk_nope_head_dim), GLM-4.5's
    # router x1.8, dense layers by mlp_layer_types, an MTP layer the converter skips.
    "glm4_moe_lite": ("glm4_moe_lite", None),
    # Glm4MoeLiteConfig's defaults where config.json leaves them out (the first layer dense, x1.8), groups.
    "glm4_moe_lite-defaults": ("glm4_moe_lite", lambda c: [c.pop(k) for k in ("mlp_layer_types",
                                                                             "routed_scaling_factor")],
                               ("--set", "n_group=4", "--set", "topk_group=2")),
    # Qwen3-Next: three gated-delta-rule layers (a causal convolution over q, k and v, the delta rule's state per value
    # head, two value heads per key head, a per-head norm times silu(z)) and a full-attention layer whose output is
    # gated (q_proj holds the gate), norms of 1 + w, RoPE on a quarter of each head, a shared expert with its gate.
    "qwen3_next": ("qwen3_next", None),
    # layer_types instead of the interval (attention at layers 1 and 3), one value head per key head, a dense layer.
    "qwen3_next-variants": ("qwen3_next", None, ("--set", "layer_types=[\"linear_attention\", \"full_attention\", "
                                                 "\"linear_attention\", \"full_attention\"]", "--set",
                                                 "linear_num_value_heads=2", "--set", "mlp_only_layers=[2]")),
    # Qwen3.5-MoE: Qwen3-Next's layers under text_config and model.language_model., the linear attention's
    # projections apart (in_proj_qkv, _z, _b, _a), the value heads kept tiled as llama.cpp's GGUFs hold them,
    # experts fused output-major (gate_up_proj [E, 2F, D]), multimodal RoPE (plain for text), a vision tower and an MTP
    # module to skip, every layer MoE and always renormalized.
    "qwen3_5_moe": ("qwen3_5_moe", None),
    # Qwen3.5's dense models: the same layers with a Qwen3_5MLP in each (one always-selected expert), the embedding
    # tied to the output.
    "qwen3_5": ("qwen3_5", None),
    "bailing_moe_v2-variants": ("bailing_moe_v2", lambda c: (c.pop("partial_rotary_factor"), c.update(rotary_dim=16)),
                                ("--set", "n_group=1", "--set", "topk_group=1", "--set", "use_bias=true", "--set",
                                 "use_qk_norm=false", "--set", "norm_topk_prob=false")),
    # Hunyuan-A13B: per-head q/k norms after RoPE, NTK-alpha RoPE (the base x 1000^(64/62)), a softmax router in
    # float32 (mlp.gate.wg) whose top 3 of 8 are renormalized, a shared MLP always added, the embedding tied; per-layer
    # lists for moe_topk, moe_intermediate_size and num_shared_expert.
    "hunyuan_moe": ("hunyuan_moe", None),
    # One number instead of each list, two shared experts' width, no q/k norms, plain RoPE.
    "hunyuan_moe-variants": ("hunyuan_moe", lambda c: c.update(rope_scaling=None),
                             ("--set", "moe_topk=2", "--set", "num_shared_expert=2", "--set", "num_experts=6",
                              "--set", "use_qk_norm=false")),
    # Its tokenizer as released: hy.tiktoken and tokenization_hy.py, no tokenizer.json.
    "hunyuan_moe-tiktoken": ("hunyuan_moe", None, ("--tiktoken",)),
    # Top-1: the picked expert keeps its probability (no renormalization to 1).
    "hunyuan_moe-top1": ("hunyuan_moe", None, ("--set", "moe_topk=[1, 1, 1]")),
}


class Reference(unittest.TestCase):
    def check(self, name, variant=None):
        arch, patch, *gen_args = variant or VARIANTS[name]
        ckpt, model = make_model(name, arch, patch, gen_args=gen_args[0] if gen_args else ())
        # Exact activations: MXFP4 experts are kept as they are, and their products must not quantize activations.
        got = np.load(logits(model, "--kv-type", "f32", "--exact-activations", "--trace",
                             os.path.join(WORK, name + ".jsonl")))
        cfg, W = reference.load_checkpoint(ckpt)
        trace = []
        want = reference.forward(cfg, W, TOKENS, trace)
        self.assertEqual(got.shape, want.shape)
        rel = np.abs(got - want).max(axis=1) / np.abs(want).max(axis=1)
        print(f"  {name}: max relative logit error {rel.max():.2e}", flush=True)
        self.assertLessEqual(rel.max(), 1e-4, f"{name}: per-position relative errors {rel}")
        with open(os.path.join(WORK, name + ".jsonl")) as f:
            ours = [json.loads(line) for line in f]
        self.assertEqual(len(ours), len(trace))
        for a, b in zip(sorted(ours, key=lambda r: (r["layer"], r["position"])),
                        sorted(trace, key=lambda r: (r["layer"], r["position"]))):
            self.assertEqual(a["experts"], b["experts"], f"{name}: routing differs at {a}")
            np.testing.assert_allclose(a["weights"], b["weights"], atol=1e-5)

    def test_deepseek_v3_mtp_layer_skipped(self):
        """DeepSeek-V3's checkpoints carry a multi-token-prediction layer after the last one (model.layers.3 here: a
        whole MoE layer with its own embed_tokens, enorm, hnorm, eh_proj and shared_head): convert skips it with a
        word, and the logits are the reference's, which never runs it."""
        name, variant = "deepseek_v3-mtp", ("deepseek_v3", None, ("--set", "num_nextn_predict_layers=1"))
        ckpt = os.path.join(WORK, name)
        if not os.path.exists(os.path.join(ckpt, "config.json")):
            subprocess.run([sys.executable, GEN, "--arch", "deepseek_v3", "--out", ckpt, "--dtype", "f32",
                            *variant[2]], check=True, capture_output=True)
        model = os.path.join(WORK, f"{name}-f32")
        shutil.rmtree(model, ignore_errors=True)
        p = run(["convert", "--input", ckpt, "--output", model, "--quantize", "f32"])
        self.assertIn("of the multi-token-prediction layer after layer 2 were skipped", p.stdout + p.stderr)
        with open(os.path.join(model, "manifest.json")) as f:
            manifest = json.load(f)
        self.assertEqual(manifest["hparams"]["num_layers"], 3)
        self.assertFalse([t["name"] for t in manifest["tensors"] if t["name"].startswith("blk.3.")])
        self.check(name, variant)


for _name in VARIANTS:
    setattr(Reference, "test_" + _name.replace("-", "_"), lambda self, n=_name: self.check(n))


def convert_and_inspect(arch, name):
    """The fixture's f32 checkpoint of `arch` converted afresh to WORK/name: (convert's output, inspect's)."""
    ckpt = os.path.join(WORK, arch)
    if not os.path.exists(os.path.join(ckpt, "config.json")):
        subprocess.run([sys.executable, GEN, "--arch", arch, "--out", ckpt, "--dtype", "f32"], check=True,
                       capture_output=True)
    model = os.path.join(WORK, name)
    shutil.rmtree(model, ignore_errors=True)
    p = run(["convert", "--input", ckpt, "--output", model, "--quantize", "f32"])
    return p.stdout + p.stderr, run(["inspect", model]).stdout


class Qwen3Next(unittest.TestCase):
    def test_mtp_skipped_and_layers_described(self):
        """Qwen3-Next's checkpoints carry a multi-token-prediction module under mtp.: convert says it skipped it (not
        that the input holds unknown tensors), and inspect names the linear-attention layers and their state."""
        converted, out = convert_and_inspect("qwen3_next", "qwen3_next-mtp-f32")
        self.assertIn("5 tensor(s) of the multi-token-prediction module (mtp.) were skipped", converted)
        self.assertNotIn("are not used by", converted)
        self.assertIn("rope on 8 of 32 dims, output gated; linear attention (gated delta rule) on 3 of 4 layers: "
                      "2 key / 4 value heads of 16 / 16, a state of 5.50 KiB per layer and sequence, no KV rows", out)


class Llama4(unittest.TestCase):
    def test_vision_tower_skipped_and_layers_described(self):
        """An image-text Llama 4 checkpoint converts its language model: convert says the vision tower's tensors
        were skipped (not that the input holds unknown tensors), and inspect names the chunked, NoPE and routing
        rules the manifest records."""
        converted, out = convert_and_inspect("llama4", "llama4-vision-f32")
        self.assertIn("2 tensor(s) of the vision tower (vision_model., multi_modal_projector.) were skipped", converted)
        self.assertNotIn("are not used by", converted)
        self.assertIn("within chunks of 4 on 3 of 4 layers, no rope on 1 layer (their queries scaled from position 3 "
                      "on), q/k RMS-normalized after rope", out)
        self.assertIn("router:        sigmoid scores, the weight scales the expert's input", out)


class Qwen3VlMoe(unittest.TestCase):
    def test_vision_tower_skipped(self):
        """Qwen3-VL-MoE's checkpoint converts its language model: convert says the vision tower's tensors were
        skipped (not that the input holds unknown tensors), and the manifest has the text model's shape."""
        ckpt = os.path.join(WORK, "qwen3_vl_moe")
        if not os.path.exists(os.path.join(ckpt, "config.json")):
            subprocess.run([sys.executable, GEN, "--arch", "qwen3_vl_moe", "--out", ckpt, "--dtype", "f32"],
                           check=True, capture_output=True)
        model = os.path.join(WORK, "qwen3_vl_moe-vision-f32")
        shutil.rmtree(model, ignore_errors=True)
        p = run(["convert", "--input", ckpt, "--output", model, "--quantize", "f32"])
        self.assertIn("2 tensor(s) of the vision tower (model.visual.) were skipped", p.stdout + p.stderr)
        self.assertNotIn("are not used by", p.stdout + p.stderr)
        with open(os.path.join(model, "manifest.json")) as f:
            hp = json.load(f)["hparams"]
        self.assertEqual((hp["architecture"], hp["hf_architecture"], hp["num_layers"], hp["n_experts"]),
                         ("qwen3_vl_moe", "Qwen3VLMoeForConditionalGeneration", 3, 8))


class Tiktoken(unittest.TestCase):
    def test_kimi_tokenizer_converts_and_encodes_as_tiktoken(self):
        """A checkpoint that ships tiktoken.model and no tokenizer.json (Kimi K2, Moonlight) converts: the model gets
        the tokenizer.json that encodes as tiktoken does, and runs from a text prompt. The ids are checked against
        tiktoken's algorithm written out here (the lowest-ranked adjacent pair merged first, a whole-token piece taken
        whole) on text whose split a plain regex gives: lowercase words, spaces, Han, special tokens."""
        arch, patch, gen_args = VARIANTS["deepseek_v3-kimi"]
        ckpt, model = make_model("deepseek_v3-kimi", arch, patch, gen_args=gen_args)
        self.assertFalse(os.path.exists(os.path.join(ckpt, "tokenizer.json")))
        with open(os.path.join(model, "manifest.json")) as f:
            tokenizer = json.load(f)["tokenizer"]
        self.assertEqual((tokenizer["source"], tokenizer["family"]), ("tiktoken", "kimi"))
        self.assertIn("tokenizer.json", tokenizer["files"])
        self.assertIn("tokenizer:     rebuilt from tiktoken.model (kimi's split, tokenization_kimi)",
                      run(["inspect", model]).stdout)

        ranks = tiktoken_ranks(os.path.join(ckpt, "tiktoken.model"))
        with open(os.path.join(ckpt, "tokenizer_config.json")) as f:
            specials = {v["content"]: int(k) for k, v in json.load(f)["added_tokens_decoder"].items()}
        text = "the experts are streamed from the disk 你好世界 when the router picks them<|im_end|>hello world"
        want = tiktoken_encode(ranks, specials, r"[\u4e00-\u9fff]+| ?[a-z]+|\s+", text)
        got = json.loads(run(["tokenize", "--model", model, "--text", text]).stdout)["ids"]
        self.assertEqual(got, want)
        self.assertLess(len(got), len(text.encode()) - 20, "the merges were not used")
        # The model answers a text prompt through it.
        out = run(["run", "--model", model, "--prompt", "the experts", "--max-tokens", "3", "--temperature", "0"])
        self.assertTrue(out.stdout.strip(), out.stderr)


    def test_hunyuan_tokenizer_converts_and_encodes_as_its_code(self):
        """Hunyuan-A13B ships hy.tiktoken (numbered by line) and tokenization_hy.py, no tokenizer.json: the model gets
        the tokenizer.json that encodes as its code does (NFC first, Qwen 2's split, one digit at a time, its 210
        special tokens after the ranks), checked against tiktoken's algorithm written out here, and answers through
        it; its logits are the reference's (the same weights as the hunyuan_moe variant)."""
        arch, patch, gen_args = VARIANTS["hunyuan_moe-tiktoken"]
        ckpt, model = make_model("hunyuan_moe-tiktoken", arch, patch, gen_args=gen_args)
        self.assertFalse(os.path.exists(os.path.join(ckpt, "tokenizer.json")))
        with open(os.path.join(model, "manifest.json")) as f:
            tokenizer = json.load(f)["tokenizer"]
        self.assertEqual((tokenizer["source"], tokenizer["family"], tokenizer["file"]),
                         ("tiktoken", "hunyuan", "hy.tiktoken"))
        self.assertIn("tokenizer:     rebuilt from hy.tiktoken (hunyuan's split, tokenization_hy)",
                      run(["inspect", model]).stdout)
        ranks = tiktoken_ranks(os.path.join(ckpt, "hy.tiktoken"))
        n = len(ranks)
        specials = {"<|startoftext|>": n + 1, "<|eos|>": n + 3, "<|extra_0|>": n + 5, "<|extra_204|>": n + 209}
        text = "<|startoftext|>the experts are streamed 2026 times from the cafe\u0301<|extra_0|>"
        want = tiktoken_encode(ranks, specials, r" ?[a-zé]+|\d|\s+", unicodedata.normalize("NFC", text))
        got = json.loads(run(["tokenize", "--model", model, "--text", text]).stdout)["ids"]
        self.assertEqual(got, want)
        self.assertIn(n + 5, got)
        self.assertEqual(json.loads(run(["tokenize", "--model", model, "--text", "<|extra_204|><|eos|>"]).stdout)["ids"],
                         [n + 209, n + 3])
        out = run(["run", "--model", model, "--prompt", "the experts", "--max-tokens", "3", "--temperature", "0"])
        self.assertTrue(out.stdout.strip(), out.stderr)


def tiktoken_ranks(path):
    """A tiktoken vocabulary's tokens by rank (both layouts: the written ranks are the line numbers here)."""
    ranks = {}
    with open(path) as f:
        for line in f:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def tiktoken_encode(ranks, specials, split, text):
    """tiktoken's encode with allowed_special="all", for text that `split` (a plain regex) splits as the tokenizer's
    pattern would: special tokens anywhere; a piece that is a whole token whole, else its lowest-ranked adjacent pair
    merged first."""
    def bpe(piece):
        if piece in ranks:
            return [ranks[piece]]
        parts = [piece[i:i + 1] for i in range(len(piece))]
        while True:
            pairs = [(ranks[a + b], i) for i, (a, b) in enumerate(zip(parts, parts[1:])) if a + b in ranks]
            if not pairs:
                return [ranks[p] for p in parts]
            _, i = min(pairs)
            parts[i:i + 2] = [parts[i] + parts[i + 1]]

    want = []
    for chunk in re.split("(" + "|".join(map(re.escape, specials)) + ")", text):
        if chunk in specials:
            want.append(specials[chunk])
            continue
        for piece in re.findall(split, chunk):
            want += bpe(piece.encode())
    return want


class Gguf(unittest.TestCase):
    def test_llama3_rope_from_rope_freqs_matches_the_reference(self):
        """llama.cpp writes Llama 3.1's rope scaling as a rope_freqs tensor (no scaling type): the GGUF must give the
        logits of the HF checkpoint, whose config names llama3 scaling."""
        ckpt = os.path.join(WORK, "llama-gguf")
        if not os.path.exists(ckpt + ".gguf"):
            subprocess.run([sys.executable, GEN, "--arch", "llama", "--out", ckpt, "--dtype", "f32", "--gguf",
                            ckpt + ".gguf"], check=True, capture_output=True)
        model = ckpt + "-f32"
        if not os.path.exists(os.path.join(model, "manifest.json")):
            p = run(["convert", "--input", ckpt + ".gguf", "--output", model, "--quantize", "f32"])
            self.assertNotIn("rope_freqs", p.stdout + p.stderr, "the tensor is used, not skipped")
        with open(os.path.join(model, "manifest.json")) as f:
            self.assertEqual(json.load(f)["hparams"]["rope_scaling"]["rope_type"], "freq_factors")
        tokens = TOKENS * 5  # positions far enough out for the scaling to show
        got = np.load(logits(model, "--kv-type", "f32", tokens=tokens))
        cfg, W = reference.load_checkpoint(ckpt)
        self.assertEqual(cfg["rope_scaling"]["rope_type"], "llama3")

        def rel_error(config):
            want = reference.forward(config, W, tokens, [])
            return (np.abs(got - want).max(axis=1) / np.abs(want).max(axis=1)).max()
        self.assertLessEqual(rel_error(cfg), 1e-4)
        self.assertGreater(rel_error(dict(cfg, rope_scaling=None)), 1e-3, "unscaled rope would have been noticed")


    def test_gpt_oss_from_llama_cpp_layout_matches_the_reference(self):
        """A gpt-oss GGUF as llama.cpp writes it (split gate/up, post_attention_norm, experts in MXFP4 or f32, no
        sliding pattern or SwiGLU constants in the metadata) gives the HF checkpoint's logits."""
        for name, extra in (("gpt_oss-gguf", []), ("gpt_oss-gguf-mxfp4", ["--mxfp4"])):
            ckpt = os.path.join(WORK, name)
            if not os.path.exists(ckpt + ".gguf"):
                subprocess.run([sys.executable, GEN, "--arch", "gpt_oss", "--out", ckpt, "--dtype", "f32", "--gguf",
                                ckpt + ".gguf", "--gguf-dtype", "f32", *extra], check=True, capture_output=True)
            model = ckpt + "-f32"
            if not os.path.exists(os.path.join(model, "manifest.json")):
                p = run(["convert", "--input", ckpt + ".gguf", "--output", model, "--quantize", "f32"])
                self.assertNotIn("skipped", p.stdout + p.stderr, f"{name}: every GGUF tensor is used")
            with open(os.path.join(model, "manifest.json")) as f:
                hp = json.load(f)["hparams"]
            self.assertEqual(hp["sliding_layers"], [0, 2])
            self.assertIs(hp["rope_scaling"]["truncate"], False)
            self.assert_reference_logits(ckpt, model, name)

    def converted_f32_gguf(self, arch, name=None, gen_args=()):
        """(HF checkpoint, the f32 conversion of its GGUF as llama.cpp lays it out, convert's output)."""
        ckpt = os.path.join(WORK, (name or arch) + "-gguf")
        if not os.path.exists(ckpt + ".gguf"):
            subprocess.run([sys.executable, GEN, "--arch", arch, "--out", ckpt, "--dtype", "f32", "--gguf",
                            ckpt + ".gguf", "--gguf-dtype", "f32", *gen_args], check=True, capture_output=True)
        model = ckpt + "-f32"
        shutil.rmtree(model, ignore_errors=True)
        p = run(["convert", "--input", ckpt + ".gguf", "--output", model, "--quantize", "f32"])
        return ckpt, model, p.stdout + p.stderr

    def assert_reference_logits(self, ckpt, model, name):
        got = np.load(logits(model, "--kv-type", "f32", "--exact-activations"))
        cfg, W = reference.load_checkpoint(ckpt)
        want = reference.forward(cfg, W, TOKENS, [])
        rel = (np.abs(got - want).max(axis=1) / np.abs(want).max(axis=1)).max()
        print(f"  {name}: max relative logit error {rel:.2e}", flush=True)
        self.assertLessEqual(rel, 1e-4, name)

    def test_llama4_from_llama_cpp_layout_matches_the_reference(self):
        """Llama 4 GGUFs as llama.cpp's converter writes them (the experts transposed and gate_up_proj cut in halves,
        Llama 3's rope_freqs, the dense width as feed_forward_length, no chunk / NoPE / temperature / q-k norm keys):
        colibri applies llama.cpp's fixed rules (chunks of 8192 on three layers of four, every 4th without RoPE and
        with queries scaled from 8192, q/k norms unless 128 experts) and gives the HF checkpoint's logits, with those
        constants set in its config.json: Scout's layout, and Maverick's dense layers between MoE ones."""
        chunked = ("--set", "attention_chunk_size=8192", "--set", "floor_scale=8192")
        # A sliding_window of 0 (MobileLLM's files): no chunks, no temperature, the last layer alone without RoPE.
        unchunked = ("--set", "attention_chunk_size=null", "--set", "attn_temperature_tuning=false",
                     "--gguf-set-u32", "{arch}.attention.sliding_window=0")
        for name, args, dense, chunk, floor in (
                ("llama4", chunked, [], 8192, 8192.0),
                ("llama4-interleaved", chunked + ("--set", "interleave_moe_layer_step=2", "--set", "moe_layers=null"),
                 [0, 2], 8192, 8192.0),
                ("llama4-unchunked", unchunked, [], 0, 0.0)):
            ckpt, model, out = self.converted_f32_gguf("llama4", name, args)
            self.assertNotIn("are not used by", out, "every GGUF tensor is used")
            with open(os.path.join(model, "manifest.json")) as f:
                hp = json.load(f)["hparams"]
            self.assertEqual((hp["architecture"], hp["attention_chunk"], hp["chunked_layers"], hp["nope_layers"],
                              hp["attn_temperature_floor"], hp["qk_norm"], hp["router_weight_on_input"],
                              hp["rope_scaling"]["rope_type"]),
                             ("llama4", chunk, [0, 1, 2] if chunk else [], [3], floor, "l2", True, "freq_factors"))
            self.assertEqual(hp["mlp_only_layers"], dense)
            self.assert_reference_logits(ckpt, model, name)

    def test_glm4_moe_from_llama_cpp_layout_matches_the_reference(self):
        """A GLM-4.5 GGUF as llama.cpp writes it (block_count counting the MTP layer, rope.dimension_count, the
        selection bias as exp_probs_b, post_attention_norm, sigmoid gating and the weights' scale in the metadata)
        gives the HF checkpoint's logits; the MTP layer is skipped with a word, nothing else."""
        ckpt, model, out = self.converted_f32_gguf("glm4_moe")
        self.assertIn("of the multi-token-prediction layer after layer 2 were skipped", out)
        self.assertNotIn("are not used by", out, "every other GGUF tensor is used")
        with open(os.path.join(model, "manifest.json")) as f:
            manifest = json.load(f)
        hp = manifest["hparams"]
        self.assertEqual((hp["num_layers"], hp["rotary_dims"], hp["router_scoring"], hp["routed_scaling_factor"]),
                         (3, 64, "sigmoid", 2.5))
        self.assertEqual(manifest["format_version"], 3)
        shown = run(["inspect", model]).stdout
        self.assertIn(", rope on 64 of 128 dims", shown)
        self.assertIn("(8 per layer, top-2, in 2 MoE layers; 1 dense layer of one; a shared expert per MoE layer)",
                      shown)
        self.assertIn("router:        sigmoid scores, experts picked with a learned bias, weights renormalized, x2.5",
                      shown)
        self.assert_reference_logits(ckpt, model, "glm4_moe-gguf")

    def test_dots1_from_llama_cpp_layout_matches_the_reference(self):
        """A dots.llm1 GGUF as llama.cpp writes it (Qwen 2 MoE's keys plus the dense lead, shared count, weights'
        scale and norm, sigmoid gating; the selection bias as exp_probs_b) gives the HF checkpoint's logits, every
        tensor used; also with expert groups."""
        for name, args in (("dots1", ()), ("dots1-groups", ("--set", "n_group=4", "--set", "topk_group=2"))):
            ckpt, model, out = self.converted_f32_gguf("dots1", name, args)
            self.assertNotIn("skipped", out, "every GGUF tensor is used")
            self.assertNotIn("are not used by", out, "every GGUF tensor is used")
            with open(os.path.join(model, "manifest.json")) as f:
                hp = json.load(f)["hparams"]
            self.assertEqual((hp["architecture"], hp["qk_norm"], hp["router_scoring"], hp["routed_scaling_factor"],
                              hp["shared_expert_intermediate_size"], hp["mlp_only_layers"]),
                             ("dots1", "per_head", "sigmoid", 2.5, 128, [0]))
            self.assert_reference_logits(ckpt, model, name + "-gguf")

    def test_qwen3_next_from_llama_cpp_layout_matches_the_reference(self):
        """A Qwen3-Next GGUF as llama.cpp writes it (qwen3next: q, k and v of every head in attn_qkv, z in
        attn_gate, b and a by key group in ssm_ba, the convolution squeezed, ssm_a = -exp(A_log), norms with their
        1 added, q_proj's query and gate rows as they were, the interval and ssm.* keys) gives the HF checkpoint's
        logits, every tensor used; also with one value head per key head and attention every second layer."""
        for name, args in (("qwen3_next", ()),
                           ("qwen3_next-interval", ("--set", "linear_num_value_heads=2", "--set",
                                                    "full_attention_interval=2"))):
            ckpt, model, out = self.converted_f32_gguf("qwen3_next", name, args)
            self.assertNotIn("skipped", out, "every GGUF tensor is used")
            self.assertNotIn("are not used by", out, "every GGUF tensor is used")
            with open(os.path.join(model, "manifest.json")) as f:
                hp = json.load(f)["hparams"]
            with open(os.path.join(ckpt, "config.json")) as f:
                cfg = json.load(f)
            interval = cfg["full_attention_interval"]
            self.assertEqual((hp["architecture"], hp["linear_layers"], hp["linear_v_heads"], hp["attn_output_gate"]),
                             ("qwen3_next", [l for l in range(4) if (l + 1) % interval], cfg["linear_num_value_heads"],
                              True))
            self.assert_reference_logits(ckpt, model, name + "-gguf")

    def test_qwen3_5_moe_from_llama_cpp_layout_matches_the_reference(self):
        """A Qwen3.5-MoE GGUF as llama.cpp writes it (qwen35moe: the value heads tiled in attn_qkv, attn_gate,
        ssm_beta, ssm_alpha, ssm_conv1d, ssm_a, ssm_dt and ssm_out's columns; the MTP layer as block 4 with
        nextn_predict_layers 1; rope.dimension_sections) gives the HF checkpoint's logits, and the same model bytes as
        the HF checkpoint's conversion, which tiles the heads the same way. So does a dense Qwen3.5's (qwen35:
        ffn_gate / ffn_up / ffn_down, feed_forward_length, no expert keys, the output tied to the embedding)."""
        for arch in ("qwen3_5_moe", "qwen3_5"):
            ckpt, model, out = self.converted_f32_gguf(arch)
            self.assertIn("of the multi-token-prediction layer after layer 3 were skipped", out)
            self.assertNotIn("are not used by", out, "every other GGUF tensor is used")
            with open(os.path.join(model, "manifest.json")) as f:
                hp = json.load(f)["hparams"]
            self.assertEqual((hp["architecture"], hp["linear_layers"], hp["linear_tiled_heads"], hp["num_layers"],
                              hp["dense"], hp["tie_word_embeddings"]),
                             (arch, [0, 1, 2], True, 4, arch == "qwen3_5", arch == "qwen3_5"))
            self.assert_reference_logits(ckpt, model, arch + "-gguf")
            from_hf = ckpt + "-hf-f32"
            shutil.rmtree(from_hf, ignore_errors=True)
            p = run(["convert", "--input", ckpt, "--output", from_hf, "--quantize", "f32"])
            self.assertIn("2 tensor(s) of the vision tower (model.visual.) were skipped", p.stdout + p.stderr)
            self.assertIn("of the multi-token-prediction module (mtp.) were skipped", p.stdout + p.stderr)
            experts = os.path.join(model, "experts")
            for name in ["shared.bin"] + [os.path.join("experts", d, e) for d in sorted(os.listdir(experts))
                                          for e in sorted(os.listdir(os.path.join(experts, d)))]:
                with open(os.path.join(model, name), "rb") as a, open(os.path.join(from_hf, name), "rb") as b:
                    self.assertEqual(a.read(), b.read(), (arch, name))

    def test_qwen3_vl_moe_from_llama_cpp_layout_matches_the_reference(self):
        """A Qwen3-VL-MoE GGUF as llama.cpp writes it (qwen3vlmoe: Qwen3-MoE's keys and names, the fused experts
        split and transposed, rope.dimension_sections and n_deepstack_layers, no vision tower) gives the HF
        checkpoint's logits, every tensor used."""
        ckpt, model, out = self.converted_f32_gguf("qwen3_vl_moe")
        self.assertNotIn("skipped", out, "every GGUF tensor is used")
        with open(os.path.join(model, "manifest.json")) as f:
            hp = json.load(f)["hparams"]
        self.assertEqual((hp["architecture"], hp["qk_norm"], hp["norm_topk_prob"], hp.get("rope_scaling")),
                         ("qwen3_vl_moe", "per_head", True, None))
        self.assert_reference_logits(ckpt, model, "qwen3_vl_moe-gguf")

    def test_glm4_moe_lite_from_llama_cpp_layout_matches_the_reference(self):
        """A GLM-4.7-Flash GGUF as llama.cpp writes it (deepseek2: the MLA layout, sigmoid gating, the weights' scale
        and the dense lead in the metadata, the MTP layer left out) gives the HF checkpoint's logits."""
        ckpt, model, out = self.converted_f32_gguf("glm4_moe_lite")
        self.assertNotIn("are not used by", out, "every GGUF tensor is used")
        with open(os.path.join(model, "manifest.json")) as f:
            hp = json.load(f)["hparams"]
        self.assertEqual((hp["architecture"], hp["router_scoring"], hp["mlp_only_layers"]),
                         ("deepseek_v3", "sigmoid", [0]))
        self.assertAlmostEqual(hp["routed_scaling_factor"], 1.8, places=6)  # a GGUF f32
        self.assert_reference_logits(ckpt, model, "glm4_moe_lite-gguf")

    def test_bailing_moe_v2_from_llama_cpp_layout_matches_the_reference(self):
        """A Ling 2.0 GGUF as llama.cpp writes it (the fused attn_qkv, rope.dimension_count, expert groups, sigmoid
        gating, the shared width its loader multiplies by the shared count) gives the HF checkpoint's logits, every
        tensor used."""
        ckpt, model, out = self.converted_f32_gguf("bailing_moe_v2")
        self.assertNotIn("skipped", out, "every GGUF tensor is used")
        self.assertNotIn("are not used by", out, "every GGUF tensor is used")
        with open(os.path.join(model, "manifest.json")) as f:
            hp = json.load(f)["hparams"]
        self.assertEqual((hp["architecture"], hp["qk_norm"], hp["rotary_dims"], hp["router_groups"],
                          hp["router_groups_used"], hp["routed_scaling_factor"], hp["shared_expert_intermediate_size"],
                          hp["mlp_only_layers"]), ("bailing_moe_v2", "per_head", 32, 4, 2, 2.5, 64, [0]))
        self.assert_reference_logits(ckpt, model, "bailing_moe_v2-gguf")

    def test_hunyuan_moe_from_llama_cpp_layout_matches_the_reference(self):
        """A Hunyuan-A13B GGUF as llama.cpp writes it (the alpha folded into rope.freq_base, a context of 256K, no
        key_length, q/k norms, the shared width as intermediate_size) gives the HF checkpoint's logits, every tensor
        used."""
        ckpt, model, out = self.converted_f32_gguf("hunyuan_moe")
        self.assertNotIn("skipped", out, "every GGUF tensor is used")
        self.assertNotIn("are not used by", out, "every GGUF tensor is used")
        with open(os.path.join(model, "manifest.json")) as f:
            manifest = json.load(f)
        hp = manifest["hparams"]
        self.assertEqual((manifest["format_version"], hp["architecture"], hp["qk_norm"], hp["norm_topk_prob"],
                          hp["shared_expert_intermediate_size"], hp["max_position_embeddings"], hp["tie_word_embeddings"]),
                         (7, "hunyuan_moe", "per_head_after_rope", True, 64, 262144, True))
        self.assertAlmostEqual(hp["rope_theta"] / (10000 * 1000 ** (64 / 62)), 1.0, places=6)
        self.assert_reference_logits(ckpt, model, "hunyuan_moe-gguf")

    def test_minimax_m2_from_llama_cpp_layout_matches_the_reference(self):
        """A MiniMax-M2 GGUF as llama.cpp writes it (rope.dimension_count, q/k norms over the projection, the
        selection bias as exp_probs_b, sigmoid gating) gives the HF checkpoint's logits, every tensor used."""
        ckpt, model, out = self.converted_f32_gguf("minimax_m2")
        self.assertNotIn("skipped", out, "every GGUF tensor is used")
        with open(os.path.join(model, "manifest.json")) as f:
            hp = json.load(f)["hparams"]
        self.assertEqual((hp["rotary_dims"], hp["qk_norm"], hp["router_scoring"], hp["router_selection_bias"],
                          hp["norm_topk_prob"]), (64, "full", "sigmoid", True, True))
        self.assert_reference_logits(ckpt, model, "minimax_m2-gguf")

    def test_ernie4_5_moe_from_llama_cpp_layout_matches_the_reference(self):
        """An ERNIE 4.5 GGUF as llama.cpp writes it (rope type NORM on the HF layout, exp_probs_b as [1, E], the
        shared expert's width from its tensors, no gating keys) gives the HF checkpoint's logits, every tensor used."""
        ckpt, model, out = self.converted_f32_gguf("ernie4_5_moe")
        self.assertNotIn("skipped", out, "every GGUF tensor is used")
        with open(os.path.join(model, "manifest.json")) as f:
            hp = json.load(f)["hparams"]
        self.assertEqual((hp["rope_interleaved"], hp["router_scoring"], hp["router_selection_bias"],
                          hp["shared_expert_intermediate_size"], hp["mlp_only_layers"]), (True, "softmax", True, 256, [0]))
        self.assert_reference_logits(ckpt, model, "ernie4_5_moe-gguf")

    def test_deepseek_v2_from_llama_cpp_layout_matches_the_reference(self):
        """A DeepSeek-V2-Lite GGUF as llama.cpp writes it (MLA as MQA: head_count_kv 1, key_length kv_lora_rank +
        qk_rope, value_length kv_lora_rank, the heads' widths as key_length_mla / value_length_mla; kv_b_proj split
        into attn_k_b, transposed per head, and attn_v_b; rope.dimension_count the RoPE part; YaRN with
        yarn_log_multiplier = 0.1 x mscale_all_dim; softmax gating, no expert_weights_norm) gives the HF checkpoint's
        logits, every tensor used."""
        ckpt, model, out = self.converted_f32_gguf("deepseek_v2")
        self.assertNotIn("skipped", out, "every GGUF tensor is used")
        self.assertNotIn("are not used by", out, "every GGUF tensor is used")
        with open(os.path.join(model, "manifest.json")) as f:
            manifest = json.load(f)
        hp = manifest["hparams"]
        self.assertEqual(manifest["format_version"], 4)
        self.assertEqual((hp["num_layers"], hp["head_dim"], hp["rotary_dims"], hp["v_head_dim"], hp["kv_lora_rank"],
                          hp["q_lora_rank"], hp["rope_interleaved"], hp["router_scoring"], hp["router_selection_bias"],
                          hp["norm_topk_prob"], hp["shared_expert_intermediate_size"], hp["mlp_only_layers"]),
                         (3, 48, 16, 24, 64, 0, True, "softmax", False, False, 256, [0]))
        self.assertEqual((hp["rope_scaling"]["rope_type"], hp["rope_scaling"]["factor"]), ("yarn", 40))
        self.assert_reference_logits(ckpt, model, "deepseek_v2-gguf")

    def test_deepseek_v3_from_llama_cpp_layout_matches_the_reference(self):
        """A Kimi K2 / DeepSeek-V3 GGUF as llama.cpp writes it (the query latent as attn_q_a, attn_q_a_norm and
        attn_q_b with attention.q_lora_rank; the selection bias as exp_probs_b; sigmoid gating, expert_weights_norm and
        expert_weights_scale; the rest as V2's) gives the HF checkpoint's logits, every tensor used."""
        ckpt, model, out = self.converted_f32_gguf("deepseek_v3")
        self.assertNotIn("skipped", out, "every GGUF tensor is used")
        self.assertNotIn("are not used by", out, "every GGUF tensor is used")
        with open(os.path.join(model, "manifest.json")) as f:
            manifest = json.load(f)
        hp = manifest["hparams"]
        self.assertEqual(manifest["format_version"], 4)
        self.assertEqual((hp["num_layers"], hp["head_dim"], hp["rotary_dims"], hp["v_head_dim"], hp["kv_lora_rank"],
                          hp["q_lora_rank"], hp["rope_interleaved"], hp["router_scoring"], hp["router_selection_bias"],
                          hp["norm_topk_prob"], hp["mlp_only_layers"]),
                         (3, 48, 16, 24, 64, 96, True, "sigmoid", True, True, [0]))
        self.assertAlmostEqual(hp["routed_scaling_factor"], 2.446, places=6)
        self.assert_reference_logits(ckpt, model, "deepseek_v3-gguf")

    def test_deepseek_v3_with_expert_groups_from_gguf_matches_the_reference(self):
        """DeepSeek-V3 / R1 route within the best topk_group of n_group groups (llama.cpp: expert_group_count and
        expert_group_used_count, a group scored by its best two): the GGUF gives the HF checkpoint's logits, and
        inspect says how the model routes and what its KV cache holds."""
        ckpt, model, out = self.converted_f32_gguf("deepseek_v3", "deepseek_v3-groups",
                                                   ("--set", "n_group=4", "--set", "topk_group=2"))
        with open(os.path.join(model, "manifest.json")) as f:
            hp = json.load(f)["hparams"]
        self.assertEqual((hp["router_groups"], hp["router_groups_used"], hp["router_group_score"]), (4, 2, "top2_sum"))
        shown = run(["inspect", model]).stdout
        self.assertIn("router:        sigmoid scores, experts picked with a learned bias within the best 2 of 4 groups "
                      "(a group's best two scores), weights renormalized, x2.446", shown)
        self.assertIn("; multi-head latent: keys and values from a latent of 64, queries from one of 96, values of 24 "
                      "per head; the KV cache holds 80 values per token and layer", shown)
        self.assert_reference_logits(ckpt, model, "deepseek_v3-groups-gguf")

    def test_deepseek_v2_with_expert_groups_from_gguf_scores_a_group_by_its_best(self):
        """A deepseek2 GGUF with softmax gating is DeepSeek-V2 / V2.5, whose group_limited_greedy ranks a group by its
        best score (llama.cpp approximates it with the top-2 sum): the GGUF gives the HF checkpoint's logits."""
        ckpt, model, out = self.converted_f32_gguf("deepseek_v2", "deepseek_v2-groups", VARIANTS["deepseek_v2-groups"][2])
        with open(os.path.join(model, "manifest.json")) as f:
            hp = json.load(f)["hparams"]
        self.assertEqual((hp["router_groups"], hp["router_groups_used"], hp["router_group_score"]), (4, 1, "max"))
        self.assert_reference_logits(ckpt, model, "deepseek_v2-groups-gguf")

    def test_llama_cpp_fallback_block_types_are_read_and_requantized(self):
        """llama.cpp's quantizer writes q5_0, q5_1 or iq4_nl (and older files q4_1) where k-quants do not fit a row.
        convert dequantizes them: a GGUF with one such tensor gives the logits of one holding, as f32, the values those
        blocks decode to (make_tiny_model computes them apart), and the summary says the tensor was re-quantized."""
        for block in ("q4_1", "q5_0", "q5_1", "iq4_nl"):
            models = []
            for kind in (block, block + ":held"):
                path = os.path.join(WORK, f"fallback-{kind.replace(':', '-')}")
                subprocess.run([sys.executable, GEN, "--arch", "mixtral", "--out", path, "--dtype", "f32", "--gguf",
                                path + ".gguf", "--gguf-tensor-type", f"blk.0.attn_q.weight={kind}"], check=True,
                               capture_output=True)
                shutil.rmtree(path + "-f32", ignore_errors=True)
                p = run(["convert", "--input", path + ".gguf", "--output", path + "-f32", "--quantize", "f32"])
                models.append(path + "-f32")
                if kind == block:
                    self.assertIn(f"stored as {block} in the input, which colibri does not run: dequantized and "
                                  "re-quantized", p.stdout + p.stderr)
            a, b = (np.load(logits(m, name=block)) for m in models)
            self.assertTrue(np.array_equal(a.view(np.uint32), b.view(np.uint32)), f"{block}: max abs {np.abs(a - b).max()}")
        # Into a block format too (the preset's choice for the row), where k-quants fit it.
        p = run(["convert", "--input", os.path.join(WORK, "fallback-q5_0.gguf"), "--output",
                 os.path.join(WORK, "fallback-q5_0-q4_k_m"), "--quantize", "q4_k_m", "--force"])
        self.assertIn("stored as q5_0 in the input", p.stdout + p.stderr)
        self.assertTrue(np.isfinite(np.load(logits(os.path.join(WORK, "fallback-q5_0-q4_k_m"), name="q4km"))).all())


def kl(p_logits, q_logits):
    def logsoftmax(x):
        x = x.astype(np.float64)
        m = x.max(axis=1, keepdims=True)
        return x - m - np.log(np.exp(x - m).sum(axis=1, keepdims=True))
    lp, lq = logsoftmax(p_logits), logsoftmax(q_logits)
    return (np.exp(lp) * (lp - lq)).sum(axis=1)


def e4m3_table():
    """float8_e4m3fn's 256 values as float32 (S.EEEE.MMM, bias 7, S.1111.111 NaN)."""
    b = np.arange(256)
    exp, man = (b >> 3) & 15, (b & 7).astype(np.float64)
    v = np.where(exp == 0, man / 8 * 2.0 ** -6, (1 + man / 8) * 2.0 ** (exp - 7.0))
    v = np.where((exp == 15) & (man == 7), np.nan, v)
    return np.where(b & 128, -v, v).astype(np.float32)


def write_fp8_checkpoints(src, fp8_dir, held_dir, block, scale_dtype="F32", layout="block"):
    """From the f32 checkpoint `src`: fp8_dir with its projection weights as F8_E4M3 and their multipliers in
    scale_dtype (F32, BF16 or F16), and held_dir with the f32 values those FP8 weights decode to. layout "block":
    weight_scale_inv per `block` (config.json's quantization_config.weight_block_size); "channel": compressed-tensors'
    weight_scale [rows, 1]; "tensor": weight_scale [1]."""
    table = e4m3_table()
    finite = np.sort(np.unique(np.abs(table[np.isfinite(table)])))
    code_of = np.array([np.flatnonzero(table[:127] == m)[0] for m in finite], dtype=np.uint8)  # magnitude -> byte
    with open(os.path.join(src, "model.safetensors"), "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        data = f.read()
    fp8, held = {}, {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        a = np.frombuffer(data[begin:end], dtype="<f4").reshape(info["shape"])
        projection = a.ndim == 2 and name.endswith(("proj.weight", "proj_with_mqa.weight")) or ".experts." in name
        if not projection:
            fp8[name] = ("F32", a)
            held[name] = ("F32", a)
            continue
        rows, cols = a.shape
        if layout != "block":
            block = (1, cols) if layout == "channel" else (rows, cols)
        br, bc = -(-rows // block[0]), -(-cols // block[1])
        scale = np.zeros((br, bc), dtype=np.float32)
        codes = np.zeros(a.shape, dtype=np.uint8)
        for i in range(br):
            for j in range(bc):
                blk = a[i * block[0]:(i + 1) * block[0], j * block[1]:(j + 1) * block[1]]
                s = np.float32(np.abs(blk).max() / 448.0) or np.float32(1)
                if scale_dtype == "BF16":  # what the file can hold: the scale is rounded first
                    s = np.array([s], dtype=np.float32).view(np.uint32)[0] & np.uint32(0xFFFF0000)
                    s = np.array([s], dtype=np.uint32).view(np.float32)[0]
                elif scale_dtype == "F16":
                    s = np.float32(np.float16(s))
                scale[i, j] = s
                q = blk / s
                idx = np.clip(np.searchsorted(finite, np.abs(q)), 1, len(finite) - 1)
                near = np.where(np.abs(q) - finite[idx - 1] <= finite[idx] - np.abs(q), idx - 1, idx)
                mag, code = finite[near], code_of[near]
                codes[i * block[0]:(i + 1) * block[0], j * block[1]:(j + 1) * block[1]] = \
                    np.where((q < 0) & (mag > 0), code | 128, code)
        fp8[name] = ("F8_E4M3", codes)
        scale_name = name + ("_scale_inv" if layout == "block" else "_scale")
        stored = scale if layout != "tensor" else scale.reshape(1)
        if scale_dtype == "BF16":
            fp8[scale_name] = ("BF16", (stored.view(np.uint32) >> 16).astype(np.uint16))
        elif scale_dtype == "F16":
            fp8[scale_name] = ("F16", stored.astype(np.float16))
        else:
            fp8[scale_name] = ("F32", stored)
        decoded = table[codes] * np.repeat(np.repeat(scale, block[0], 0), block[1], 1)[:rows, :cols]
        held[name] = ("F32", decoded.astype(np.float32))
    for out, tensors, quantized in ((fp8_dir, fp8, True), (held_dir, held, False)):
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(src, out, ignore=shutil.ignore_patterns("*.safetensors*"))
        meta, blob = {}, b""
        for name, (dtype, a) in tensors.items():
            raw = np.ascontiguousarray(a).tobytes()
            meta[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [len(blob), len(blob) + len(raw)]}
            blob += raw
        h = json.dumps(meta).encode()
        h += b" " * (-len(h) % 8)
        with open(os.path.join(out, "model.safetensors"), "wb") as f:
            f.write(len(h).to_bytes(8, "little") + h + blob)
        if quantized:
            with open(os.path.join(out, "config.json")) as f:
                cfg = json.load(f)
            cfg["quantization_config"] = (
                {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": list(block)}
                if layout == "block" else {"quant_method": "compressed-tensors", "format": "float-quantized"})
            with open(os.path.join(out, "config.json"), "w") as f:
                json.dump(cfg, f)


class Fp8(unittest.TestCase):
    def test_block_scaled_fp8_checkpoints_convert_to_the_values_they_decode_to(self):
        """MiniMax-M2, DeepSeek V3 and the -FP8 releases ship F8_E4M3 weights with a weight_scale_inv per block:
        converted, they give the bits of a checkpoint holding the decoded values (blocks of 64 x 96 here, so
        rows and columns end in partial blocks), and a missing or misshapen scale is refused by name."""
        ckpt, _ = make_model("minimax_m2", "minimax_m2")
        cfg, W = reference.load_checkpoint(ckpt)
        want = reference.forward(cfg, W, TOKENS, [])
        # The scales as the releases store them: F32 (DeepSeek V3, MiniMax-M2), BF16 (Qwen3-FP8), F16; per row or per
        # tensor (compressed-tensors' FP8).
        for scale_dtype, block, layout in (("BF16", (128, 128), "block"), ("F16", (64, 64), "block"),
                                           ("F32", None, "channel"), ("BF16", None, "tensor"),
                                           ("F32", (64, 96), "block")):
            fp8, held = os.path.join(WORK, "mm2-fp8"), os.path.join(WORK, "mm2-fp8-held")
            write_fp8_checkpoints(ckpt, fp8, held, block, scale_dtype, layout)
            outs = []
            for src in (fp8, held):
                shutil.rmtree(src + "-f32", ignore_errors=True)
                p = run(["convert", "--input", src, "--output", src + "-f32", "--quantize", "f32"])
                outs.append(src + "-f32")
                if src == fp8:
                    self.assertIn("were FP8 (F8_E4M3 with block scales) in the input: dequantized",
                                  p.stdout + p.stderr)
                    self.assertNotIn("are not used by", p.stdout + p.stderr, "the scales are read, not skipped")
            a, b = (np.load(logits(m, "--kv-type", "f32", name="fp8")) for m in outs)
            self.assertTrue(np.array_equal(a.view(np.uint32), b.view(np.uint32)),
                            f"{scale_dtype} {layout} scales: max abs {np.abs(a - b).max()}")
            self.assertGreater(np.abs(a - want).max(), 0, "FP8 rounding must show: the weights really were FP8")

        def refused(edit, expect):
            bad = fp8 + "-bad"
            shutil.rmtree(bad, ignore_errors=True)
            shutil.copytree(fp8, bad)
            edit(bad)
            p = run(["convert", "--input", bad, "--output", bad + "-out", "--quantize", "f32"], check=False)
            self.assertNotEqual(p.returncode, 0)
            self.assertIn(expect, p.stderr)
            self.assertFalse(os.path.exists(bad + "-out"), "no half-written output")

        def drop_scale(d):
            path = os.path.join(d, "model.safetensors")
            with open(path, "r+b") as f:
                n = int.from_bytes(f.read(8), "little")
                h = f.read(n)
                f.seek(8)
                f.write(h.replace(b"q_proj.weight_scale_inv", b"q_proj.weight_scale_inx"))

        def block_of(d, size):
            with open(os.path.join(d, "config.json")) as f:
                cfg = json.load(f)
            cfg["quantization_config"]["weight_block_size"] = size
            with open(os.path.join(d, "config.json"), "w") as f:
                json.dump(cfg, f)

        refused(drop_scale, "is F8_E4M3 without 'model.layers.0.self_attn.q_proj.weight_scale_inv' (block scales) or")
        refused(lambda d: block_of(d, [128, 128]), "FP8 blocks of 128 x 128 over")
        refused(lambda d: block_of(d, [0, 128]), "quantization_config.weight_block_size is [0,128]")
        refused(lambda d: block_of(d, [1 << 40, 128]), "it must be two block sizes of 1 to 1048576")


    def test_deepseek_v3_fp8_cuts_its_latent_attention_from_the_decoded_blocks(self):
        """DeepSeek-V3 and Kimi K2 ship FP8: the latent attention's tensors that convert cuts (q_b_proj's parts,
        kv_a_proj_with_mqa's latent and RoPE key) or cuts and transposes (kv_b_proj's key part) are cut from the
        decoded blocks, so the model gives the bits of a checkpoint holding the decoded values (blocks of 64 x 96:
        partial blocks at every cut's edge)."""
        ckpt, _ = make_model("deepseek_v3", "deepseek_v3")
        fp8, held = os.path.join(WORK, "dsv3-fp8"), os.path.join(WORK, "dsv3-fp8-held")
        write_fp8_checkpoints(ckpt, fp8, held, (64, 96), "F32", "block")
        outs = []
        for src in (fp8, held):
            shutil.rmtree(src + "-f32", ignore_errors=True)
            p = run(["convert", "--input", src, "--output", src + "-f32", "--quantize", "f32"])
            outs.append(src + "-f32")
            if src == fp8:
                self.assertIn("were FP8 (F8_E4M3 with block scales) in the input: dequantized", p.stdout + p.stderr)
        a, b = (np.load(logits(m, "--kv-type", "f32", name="fp8")) for m in outs)
        self.assertTrue(np.array_equal(a.view(np.uint32), b.view(np.uint32)), f"max abs {np.abs(a - b).max()}")


class Quantized(unittest.TestCase):
    # Tiny random-weight models amplify weight noise (and flip near-tied routing), so these bounds are loose; the
    # exactness of the quantized kernels is checked by test_q8_0_matches_rounded_reference.
    BOUNDS = {"f16": 1e-5, "bf16": 2e-3, "q8_0": 3e-3, "q4_k_m": 0.2}

    def test_presets_kl_against_f32(self):
        failures = []
        # Not glm4_moe: its selection bias leaves near-ties in the tiny model, and q8_0's rounding flips 2 of its 28
        # picks (KL 4e-3 at q8_0, 1e-2 at q4_k_m); its f32 logits are checked exactly by Reference.
        for arch in ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "llama", "gpt_oss"):
            _, base = make_model(arch, arch)
            ref = np.load(logits(base, "--kv-type", "f32"))
            line = []
            for preset, bound in self.BOUNDS.items():
                _, model = make_model(arch, arch, preset=preset)
                got = np.load(logits(model, "--kv-type", "f32"))
                d = kl(ref, got)
                line.append(f"{preset} {d.mean():.2e} (max {d.max():.2e})")
                if not d.mean() < bound:
                    failures.append(f"{arch} {preset}: mean KL {d.mean():.3e} >= {bound}")
            print(f"  KL vs f32, {arch}: " + ", ".join(line), flush=True)
        self.assertEqual(failures, [])

    def test_q8_0_matches_rounded_reference(self):
        """The q8_0 model with exact activations equals the float64 reference run on q8_0-rounded weights."""
        ckpt, model = make_model("mixtral", "mixtral", preset="q8_0")
        got = np.load(logits(model, "--kv-type", "f32", "--exact-activations", name="exact"))
        cfg, W = reference.load_checkpoint(ckpt)

        def q8_0(w):
            # ggml's quantize_row_q8_0_ref, in float32 as it computes.
            x = w.astype(np.float32).reshape(-1, 32)
            d = np.abs(x).max(axis=1, keepdims=True) / np.float32(127)
            inv = np.where(d > 0, np.float32(1) / np.where(d > 0, d, np.float32(1)), np.float32(0)).astype(np.float32)
            x0 = (x * inv).astype(np.float32)
            q = np.trunc(x0.astype(np.float64) + np.copysign(0.5, x0))  # roundf: half away from zero
            return (q * d.astype(np.float16).astype(np.float64)).reshape(w.shape)

        rounded = {k: (q8_0(v) if v.ndim == 2 and not k.endswith("gate.weight") else v) for k, v in W.items()}
        want = reference.forward(cfg, rounded, TOKENS)
        rel = np.abs(got - want).max(axis=1) / np.abs(want).max(axis=1)
        print(f"  mixtral q8_0 vs rounded reference: max relative error {rel.max():.2e}", flush=True)
        self.assertLessEqual(rel.max(), 1e-4)


class OnePromise(unittest.TestCase):
    def same(self, a, b, what):
        x, y = np.load(a), np.load(b)
        self.assertTrue(np.array_equal(x.view(np.uint32), y.view(np.uint32)),
                        f"{what}: logits differ, max abs {np.abs(x - y).max()}")

    def test_batch_and_placement_invariance(self):
        for arch, preset in (("mixtral", "f32"), ("qwen2_moe", "q4_k_m"), ("olmoe", "q8_0"), ("qwen3_moe", "f16"),
                             ("gpt_oss", "q4_k_m"), ("glm4_moe", "q4_k_m"), ("deepseek_v3", "q4_k_m"),
                             ("llama4", "q4_k_m"), ("dots1", "q4_k_m"),
                             ("bailing_moe_v2", "q4_k_m"), ("qwen3_vl_moe", "q4_k_m"), ("qwen3_next", "q4_k_m"),
                             ("qwen3_5_moe", "q4_k_m"), ("qwen3_5", "q4_k_m"), ("hunyuan_moe", "q4_k_m")):
            _, model = make_model(arch, arch, preset=preset)
            base = logits(model, name="base")
            self.same(base, logits(model, "--batch", "1", name="b1"), f"{arch}/{preset} token by token")
            self.same(base, logits(model, "--batch", "3", name="b3"), f"{arch}/{preset} chunks of 3")
            # Streaming: a cache far smaller than the experts (each layer still fits its top-k).
            with open(os.path.join(model, "manifest.json")) as f:
                blob = max(e["size"] for e in json.load(f)["experts"])
            small = str(3 * ((blob + 4095) // 4096 * 4096))
            self.same(base, logits(model, "--expert-cache-size", small, name="small"),
                      f"{arch}/{preset} tiny expert cache")
            self.same(base, logits(model, "--set", "storage.plugin=mmap", name="mmap"), f"{arch}/{preset} mmap")
            self.same(base, logits(model, "--set", "cache.policy=frequency", "--expert-cache-size", small,
                                   name="freq"), f"{arch}/{preset} frequency policy")
        # Dynamic rope: every chunk of a prompt rotates by the whole prompt's length, as one pass would.
        _, model = make_model("llama-dynamic", *VARIANTS["llama-dynamic"][:2])
        base = logits(model, name="base")
        for batch in ("1", "3", "8"):
            self.same(base, logits(model, "--batch", batch, name="b" + batch), f"dynamic rope, chunks of {batch}")

    def test_sliding_window_kv_keeps_the_bits(self):
        """Sliding-window layers keep only their window's KV rows (memory.kv_sliding_window), moving them to the
        front as positions outgrow them: over 400 positions (rows moved many times at every chunk size), logits are
        those of a cache that keeps every position."""
        tokens = [(i * 37 + 11) % 250 + 1 for i in range(400)]
        for arch, variant, preset in (("gpt_oss", "gpt_oss", "q4_k_m"), ("mistral", "mistral-window", "f32"),
                                      ("llama4", "llama4", "f32"),  # chunks of 4: the chunk as the window
                                      ("dots1", "dots1-window", "f32")):
            _, patch, *gen_args = VARIANTS[variant]
            _, model = make_model(variant, arch, patch, preset=preset, gen_args=gen_args[0] if gen_args else ())
            full = logits(model, "--set", "memory.kv_sliding_window=false", tokens=tokens, name="kvfull")
            for batch in ("1", "7", "64"):
                out = os.path.join(WORK, f"{variant}-kvwindow-b{batch}.npy")
                p = run(["logits", "--model", model, "--tokens", ",".join(map(str, tokens)), "--out", out,
                         "--batch", batch])
                self.assertRegex(p.stderr, "(sliding-window|chunked-attention) layers keep")
                self.same(full, out, f"{variant}/{preset} sliding-window KV, chunks of {batch}")


    def test_speculation_keeps_every_token(self):
        """--draft runs prompt-lookup drafts in the same pass as each token and keeps those the sampled tokens equal:
        greedy or sampled with a seed, the answer is the one without drafts, token for token (each position's logits
        have the bits of a pass of its own). Sliding windows step back over rejected drafts; a recurrent model and
        dynamic rope past its original context draft nothing."""
        prompt = "the quiet river runs under the old bridge and the quiet river runs"
        drafted = re.compile(r", (\d+) of (\d+) drafted tokens kept")
        # drafts: "kept" (greedy text that repeats), "run" (some run, maybe none kept), None (none may run). The
        # window's rows move every few passes with --batch 8 (192 rows kept of 451 positions).
        for variant, preset, drafts, extra in (("mixtral", "f32", "kept", []), ("gpt_oss", "q4_k_m", "kept", []),
                                               ("mistral-window", "f32", "run", ["--batch", "8"]),
                                               ("qwen3_next", "q4_k_m", None, []),
                                               ("llama-dynamic", "f32", None, [])):
            expect_drafts = drafts is not None
            arch, patch, *gen_args = VARIANTS.get(variant, (variant, None))
            _, model = make_model(variant, arch, patch, preset=preset, gen_args=gen_args[0] if gen_args else ())
            for sampling in (["--temp", "0"], ["--temp", "0.9", "--seed", "7"]):
                args = ["run", "--model", model, "-p", prompt, "-n", "400", "--no-echo", "--ignore-eos", *sampling,
                        *extra]
                plain = run(args)
                self.assertIsNone(drafted.search(plain.stderr))
                kept_in_all = 0
                for draft in ("1", "5", "16"):
                    spec = run(args + ["--draft", draft, "--draft-ngram", "2"])
                    what = f"{variant}/{preset} {' '.join(sampling)} --draft {draft}"
                    self.assertEqual(spec.stdout, plain.stdout, what)
                    counts = drafted.search(spec.stderr)
                    if not expect_drafts:
                        self.assertIsNone(counts, what)
                    elif sampling[1] == "0":
                        self.assertIsNotNone(counts, what + ": " + spec.stderr)
                        kept, ran = map(int, counts.groups())
                        self.assertLessEqual(kept, ran, what)
                        self.assertGreater(ran, 0, what)
                        kept_in_all += kept
                        print(f"  {what}: {kept} of {ran} drafts kept", flush=True)
                if drafts == "kept" and sampling[1] == "0":
                    self.assertGreater(kept_in_all, 0, f"{variant}: greedy text repeats, some drafts are kept")
                if variant == "mistral-window":
                    self.assertIn("sliding-window layers keep 192 of", plain.stderr)

    def test_draft_model_keeps_every_token(self):
        """--draft-model drafts with a model of the same vocabulary, and the answer is the target's token for token,
        greedy or sampled: a draft is kept only where the target's own token equals it. The target as its own draft
        model has every greedy draft kept (its KV cache follows the answer, stepping back over rejected drafts, its own
        sliding window's rows too); a random dense model's drafts are run and rejected. A draft model of another
        vocabulary is refused before it loads, naming the first token that differs."""
        prompt = "the quiet river runs under the old bridge and the quiet river runs"
        drafted = re.compile(r", (\d+) of (\d+) drafted tokens kept")
        _, mixtral = make_model("mixtral", "mixtral")
        _, llama = make_model("llama", "llama")
        _, window = make_model("mistral-window", "mistral", VARIANTS["mistral-window"][1])
        for target, draft, extra, every in ((mixtral, mixtral, [], True), (mixtral, llama, [], False),
                                            (window, window, ["--batch", "8"], True)):
            for sampling in (["--temp", "0"], ["--temp", "0.9", "--seed", "7"]):
                args = ["run", "--model", target, "-p", prompt, "-n", "300", "--no-echo", "--ignore-eos", *sampling,
                        *extra]
                plain = run(args)
                spec = run(args + ["--draft-model", draft, "--draft-p-min", "0"])
                what = f"{os.path.basename(target)} drafted by {os.path.basename(draft)} {' '.join(sampling)}"
                self.assertEqual(spec.stdout, plain.stdout, what)
                counts = drafted.search(spec.stderr)
                self.assertIsNotNone(counts, what + ": " + spec.stderr)
                kept, ran = map(int, counts.groups())
                print(f"  {what}: {kept} of {ran} drafts kept", flush=True)
                self.assertGreater(ran, 0, what)
                if every and sampling[1] == "0":
                    self.assertEqual(kept, ran, what)
                # The draft model's expert reads (a dense model's FFNs are its one expert) beside the model's.
                self.assertRegex(spec.stderr, r", the draft model read [\d.]+ [KMG]?i?B \(expert hit rate", what)
        # The default floor (0.75) stops a random model's flat distributions at once: no drafts.
        quiet = run(["run", "--model", mixtral, "-p", prompt, "-n", "40", "--temp", "0", "--draft-model", llama])
        self.assertIsNone(drafted.search(quiet.stderr), quiet.stderr)
        off = run(["run", "--model", mixtral, "-p", prompt, "-n", "4", "--draft", "0", "--draft-model", llama])
        self.assertIn("--draft 0: --draft-model is not opened", off.stderr)

        def rename_token(ckpt):
            path = os.path.join(ckpt, "tokenizer.json")
            with open(path) as f:
                tok = json.load(f)
            vocab = tok["model"]["vocab"]  # ids 300 and 301 swap their pieces (the merges stay valid)
            a, b = (next(k for k, v in vocab.items() if v == i) for i in (300, 301))
            vocab[a], vocab[b] = 301, 300
            with open(path, "w") as f:
                json.dump(tok, f)
        _, other = make_model("llama-other-vocab", "llama", edit_checkpoint=rename_token)
        bad = run(["run", "--model", mixtral, "-p", prompt, "-n", "4", "--draft-model", other], check=False)
        self.assertEqual(bad.returncode, 1, bad.stderr)
        self.assertRegex(bad.stderr, r"token 300 is '.+' there and '.+' in the model")
        self.assertIn("must share the model's vocabulary", bad.stderr)
        self.assertEqual(bad.stdout, "")
        for flags, says in ((["--draft-model", os.path.join(WORK, "no-such-model")], "--draft-model: model"),
                            (["--draft-model", llama, "--draft-p-min", "1.5"], "--draft-p-min")):
            bad = run(["run", "--model", mixtral, "-p", prompt, "-n", "4", *flags], check=False)
            self.assertNotEqual(bad.returncode, 0, flags)
            self.assertIn(says, bad.stderr, flags)


_M64 = (1 << 64) - 1
_P1, _P2, _P3, _P4, _P5 = (0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0x85EBCA77C2B2AE63,
                           0x27D4EB2F165667C5)


def xxh64(b):
    """XXH64 (seed 0) of bytes, as manifest.json's checksums: a test that edits a model's bytes on purpose must make
    them pass the checksum, to reach the check behind it (python3-xxhash is not needed for these few bytes)."""
    def rotl(x, r):
        return ((x << r) | (x >> (64 - r))) & _M64

    def rnd(acc, v):
        return (rotl((acc + v * _P2) & _M64, 31) * _P1) & _M64

    def word(i, w):
        return int.from_bytes(b[i:i + w], "little")
    n, i = len(b), 0
    if n >= 32:
        v = [(_P1 + _P2) & _M64, _P2, 0, (-_P1) & _M64]
        while i + 32 <= n:
            v = [rnd(v[j], word(i + 8 * j, 8)) for j in range(4)]
            i += 32
        h = (rotl(v[0], 1) + rotl(v[1], 7) + rotl(v[2], 12) + rotl(v[3], 18)) & _M64
        for x in v:
            h = ((h ^ rnd(0, x)) * _P1 + _P4) & _M64
    else:
        h = _P5
    h = (h + n) & _M64
    while i + 8 <= n:
        h = (rotl(h ^ rnd(0, word(i, 8)), 27) * _P1 + _P4) & _M64
        i += 8
    if i + 4 <= n:
        h = (rotl(h ^ ((word(i, 4) * _P1) & _M64), 23) * _P2 + _P3) & _M64
        i += 4
    while i < n:
        h = (rotl(h ^ ((b[i] * _P5) & _M64), 11) * _P1) & _M64
        i += 1
    h = ((h ^ (h >> 33)) * _P2) & _M64
    h = ((h ^ (h >> 29)) * _P3) & _M64
    return h ^ (h >> 32)


class BadInput(unittest.TestCase):
    def test_a_nan_selection_bias_is_refused_at_load(self):
        """A NaN in GLM's selection bias would pick differently on each backend: a model whose file holds one (its
        checksum made to match) is refused at load, naming the tensor and the expert."""
        _, model = make_model("glm4_moe", "glm4_moe")
        bad = os.path.join(WORK, "glm4_moe-nan-bias")
        shutil.rmtree(bad, ignore_errors=True)
        shutil.copytree(model, bad)
        with open(os.path.join(bad, "manifest.json")) as f:
            manifest = json.load(f)
        t = next(t for t in manifest["tensors"] if t["name"] == "blk.2.exp_probs_b.bias")
        with open(os.path.join(bad, t["file"]), "r+b") as f:
            f.seek(t["offset"] + 4 * 3)
            f.write(np.array([np.nan], dtype="<f4").tobytes())
            f.seek(t["offset"])
            t["xxh64"] = "%016x" % xxh64(f.read(t["size"]))
        with open(os.path.join(bad, "manifest.json"), "w") as f:
            json.dump(manifest, f)
        p = run(["logits", "--model", bad, "--tokens", "1,2", "--out", os.path.join(WORK, "nan.npy")], check=False)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("tensor blk.2.exp_probs_b.bias holds nan for expert 3: the model's files are damaged", p.stderr)

    def test_token_out_of_vocab(self):
        _, model = make_model("mixtral", "mixtral")
        out = os.path.join(WORK, "oov.npy")
        p = run(["logits", "--model", model, "--tokens", "1,99999", "--out", out], check=False)
        self.assertEqual(p.returncode, 2)  # the command line's value, said before the load
        self.assertIn("--tokens: 99999 is past the model's vocabulary (ids 0..", p.stderr)
        self.assertFalse(os.path.exists(out))
        p = run(["logits", "--model", model, "--tokens", "1,x", "--out", out], check=False)
        self.assertIn("'x' is not a token id", p.stderr)

    def test_missing_and_corrupt_expert(self):
        _, model = make_model("mixtral", "mixtral")
        for what in ("missing", "corrupt"):
            broken = os.path.join(WORK, "broken-" + what)
            shutil.rmtree(broken, ignore_errors=True)
            shutil.copytree(model, broken)
            blob = os.path.join(broken, "experts", "L001", "E002.bin")
            if what == "missing":
                os.remove(blob)
            else:
                with open(blob, "r+b") as f:
                    f.seek(100)
                    b = f.read(1)
                    f.seek(100)
                    f.write(bytes([b[0] ^ 0xFF]))
            p = run(["logits", "--model", broken, "--tokens", ",".join(map(str, TOKENS)), "--out",
                     os.path.join(WORK, "x.npy"), "--expert-cache-size", "64M"], check=False)
            self.assertNotEqual(p.returncode, 0, what)
            self.assertIn("L1/E2" if what == "corrupt" else "E002.bin", p.stderr)
            if what == "corrupt":
                self.assertIn("checksum mismatch", p.stderr)

    def test_overflowing_activations(self):
        # Finite weights so large that the activations overflow: an error naming where, never a sampled NaN.
        for name, arch, tensor, want in (
                ("huge-head", "mistral", "lm_head.weight", r"activations overflowed.*inspect MODEL --verify"),
                # +inf and -inf products: NaN router logits, which the backend's routing refuses
                ("huge-router", "mixtral", "model.layers.1.block_sparse_moe.gate.weight",
                 r"layer 1's routing: .*logit of expert \d+ for token \d+ is NaN")):
            _, model = make_model(name, arch, edit_checkpoint=lambda ckpt, t=tensor: fill_safetensors(
                os.path.join(ckpt, "model.safetensors"), t, 3e38))
            out = os.path.join(WORK, name + ".npy")
            p = run(["logits", "--model", model, "--tokens", ",".join(map(str, TOKENS)), "--out", out], check=False)
            self.assertNotEqual(p.returncode, 0, name)
            self.assertRegex(p.stderr, want)
            self.assertFalse(os.path.exists(out), name)
        # Resident decode on the CPU routes through expert_ffn_routed: its topk_routing refuses the NaN as before.
        p = run(["logits", "--model", model, "--tokens", ",".join(map(str, TOKENS)), "--out", out, "--batch", "1"],
                check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertRegex(p.stderr, r"layer 1's routing: .*logit of expert \d+ for token 0 is NaN")
        self.assertFalse(os.path.exists(out))
        # Decode on a device (Vulkan, unmapped memory: routing into device buffers, no wait in topk_routing): the
        # backend marks the token's picks, and the engine still refuses them, naming the layer and the row.
        plugins = json.loads(run(["plugins", "list", "--json"]).stdout)["plugins"]
        if not any(p["kind"] == "compute" and p["name"] == "vulkan" and p["score"] > 0 for p in plugins):
            self.skipTest("no Vulkan device for the decode case")
        p = run(["logits", "--model", model, "--tokens", ",".join(map(str, TOKENS)), "--out", out, "--batch", "1",
                 "--set", "compute.backend=vulkan", "--set", "compute.map_device_memory=false"], check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertRegex(p.stderr, r"layer 1's router logits for token row 0 include a NaN: the activations overflowed")
        self.assertFalse(os.path.exists(out))
        # The same with every expert in VRAM: the backend routes (expert_ffn_routed), and the mark is found when the
        # pass's choices are settled, after the logits were computed from it; still an error naming layer and row.
        p = run(["logits", "--model", model, "--tokens", ",".join(map(str, TOKENS)), "--out", out, "--batch", "1",
                 "--set", "compute.backend=vulkan", "--set", "compute.map_device_memory=false", "--vram-budget",
                 "64M"], check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertRegex(p.stderr, r"layer 1's router logits for token row 0 include a NaN: the activations overflowed")
        self.assertFalse(os.path.exists(out))

    def test_context_too_small(self):
        _, model = make_model("mixtral", "mixtral")
        p = run(["logits", "--model", model, "--tokens", ",".join(map(str, TOKENS)), "--ctx", "4", "--out",
                 os.path.join(WORK, "ctx.npy")], check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("context", p.stderr)

    def test_unwritable_output(self):
        _, model = make_model("mixtral", "mixtral")
        p = run(["logits", "--model", model, "--tokens", "1,2", "--out", "/nonexistent/dir/x.npy"], check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("/nonexistent/dir/x.npy", p.stderr)


if __name__ == "__main__":
    CLI, GEN, WORK = sys.argv[1], sys.argv[2], sys.argv[3]
    os.makedirs(WORK, exist_ok=True)
    unittest.main(argv=[sys.argv[0]] + sys.argv[4:], verbosity=2)
