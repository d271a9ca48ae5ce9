#!/usr/bin/python3
"""Float64 numpy reference of the forward pass of every architecture colibri runs, written from the HuggingFace
transformers modeling code (modeling_mixtral, modeling_qwen2_moe, modeling_qwen3_moe, modeling_olmoe,
modeling_llama, modeling_mistral, modeling_gpt_oss, modeling_glm4_moe, modeling_ernie4_5_moe, modeling_deepseek_v2,
modeling_deepseek_v3, modeling_dots1, modeling_qwen3_vl_moe, modeling_glm4_moe_lite, modeling_qwen3_next,
modeling_qwen3_5_moe, modeling_rope_utils), MiniMax's own modeling_minimax_m2, Ling 2.0's own modeling_bailing_moe_v2,
DeepSeek's own modeling_deepseek and Hunyuan's own modeling_hunyuan (the checkpoints' remote code, where it and
transformers' port differ). It reads
the HF checkpoint itself (config.json + safetensors), not colibri's converted model, so a converter bug shows up too.

  reference.py --checkpoint DIR --tokens 1,2,3 --out logits.npy [--trace trace.jsonl]

Semantics kept from HF, per architecture:
  * RMSNorm: x / sqrt(mean(x^2) + eps) * w over the last axis.
  * RoPE: rotate_half (pairs i, i + d/2), inv_freq from rope_scaling (default, linear, dynamic, llama3, yarn; yarn
    also scales cos/sin by its attention factor). With partial_rotary_factor (GLM-4.5: 0.5, its default) only the
    first d = int(head_dim * factor) dims of each head rotate (pairs i, i + d/2; inv_freq over d), the rest pass.
  * Attention: q/k/v projections (+bias for Qwen2-MoE and GLM), Qwen3-MoE (and GLM with use_qk_norm) q/k RMSNorm
    per head before rope, OLMoE q/k RMSNorm over the whole projection (then clip_qkv), GQA (head h uses kv head
    h // (n_heads / n_kv)), causal mask, sliding window (key j visible from query i when i - j < window),
    scores * head_dim^-0.5, softmax.
  * gpt-oss attention: q/k/v/o biases, the window per layer (layer_types "sliding_attention"; default even layers),
    a learned sink logit per head joins each row's softmax and is then dropped (the key probs sum to < 1).
  * MoE: router logits -> softmax over all experts -> top-k -> renormalise (Mixtral always; others when
    norm_topk_prob) -> sum of w * down(silu(gate x) * up x); Qwen2-MoE adds sigmoid(shared_gate x) * shared(x).
  * gpt-oss MoE: router logits = x W^T + b -> top-k -> softmax over the k; experts fused [E, in, out] (x @ W + b),
    gate/up interleaved in gate_up_proj (even/odd columns), gate = min(gate, limit), up = clip(up, +-limit),
    out = ((up + 1) * gate * sigmoid(alpha gate)) @ down + b. MXFP4 experts (*_blocks + *_scales, U8) are
    dequantized as transformers' convert_moe_packed_tensors: low nibble first, times 2^(scale - 127).
  * GLM-4.5 MoE (layers >= first_k_dense_replace): scores = sigmoid(x W^T); the top-k of scores +
    e_score_correction_bias (within the topk_group best of n_group groups, a group's worth the sum of its best two)
    are picked, weighted by their own scores (/ (sum + 1e-20) when norm_topk_prob) * routed_scaling_factor; plus the
    shared_experts SwiGLU MLP, ungated. The MTP layers (model.layers.{num_hidden_layers}.*) are not run.
  * MiniMax-M2 (every layer MoE, no shared expert): with use_qk_norm ("per_layer") one RMSNorm over the whole q
    projection (all heads, weight [heads * head_dim]) and one over the whole k, before the split into heads and before
    rope; rope on the first rotary_dim dims of each head (inv_freq over rotary_dim). Router: scores = sigmoid (or
    softmax over the experts, scoring_func) of x W^T; the top-k of scores + e_score_correction_bias (use_routing_bias;
    else of the scores) are picked, weighted by their own scores / max(sum, 1e-12), times routed_scaling_factor;
    experts w2(silu(w1 x) * w3 x).
  * ERNIE-4.5 MoE (no biases, use_bias false): RoPE interleaved (GPT-J style: pairs (2i, 2i + 1) rotate by
    pos * inv_freq[i]; HF's rotate_half takes x[0::2], x[1::2]). A layer is MoE when (l + 1) % moe_layer_interval == 0
    and moe_layer_start_index <= l <= moe_layer_end_index (-1: the last layer). Router: probs = softmax(x W^T) (f32
    in HF, float64 here); the top-k of probs + moe_statics.e_score_correction_bias ([1, E]) are picked, weighted by
    their probs / max(sum, moe_norm_min); plus the shared_experts SwiGLU MLP (moe_intermediate_size *
    moe_num_shared_experts), ungated.
  * DeepSeek V2 / V3 (Kimi K2, Moonlight) multi-head latent attention, computed naively (the keys and values of every
    head expanded, as transformers does): q = q_proj(x), or q_b_proj(RMSNorm(q_a_proj(x))) when q_lora_rank is set,
    per head [q_nope (qk_nope_head_dim), q_pe (qk_rope_head_dim)]; kv_a_proj_with_mqa(x) = [c (kv_lora_rank), k_pe
    (qk_rope_head_dim)]; kv_b_proj(RMSNorm(c)) per head [k_nope (qk_nope_head_dim), v (v_head_dim)]; k_pe is one
    head shared by all. q_a_layernorm and kv_a_layernorm use eps 1e-6 whatever rms_norm_eps is (DeepseekV2RMSNorm's
    default). RoPE on q_pe and k_pe only, interleaved (pairs (2i, 2i + 1); transformers' complex / interleave forms;
    V3's rope_interleave, default true), inv_freq over qk_rope_head_dim. Scores x (qk_nope + qk_rope)^-0.5, times
    mscale^2 = (0.1 * mscale_all_dim * ln(factor) + 1)^2 when rope_scaling has mscale_all_dim (DeepSeek's code and
    transformers' V3; transformers' V2 port leaves it out). YaRN's cos/sin factor: mscale(factor, mscale) /
    mscale(factor, mscale_all_dim), as transformers' yarn. A layer is MoE when n_routed_experts and
    l >= first_k_dense_replace and l % moe_layer_freq == 0 (DeepSeek's code; transformers ignores moe_layer_freq).
    V2 router: softmax over the experts, top-k (greedy; group_limited_greedy: within the topk_group groups of best
    max), weights / (sum + 1e-20) when norm_topk_prob (and top_k > 1), else x routed_scaling_factor (DeepSeek's code
    scales only the unnormalized weights; transformers' V2 port always scales and never renormalizes). V3 router (as
    GLM's): sigmoid scores, picked by score + e_score_correction_bias, weighted by the scores / (sum + 1e-20) when
    norm_topk_prob, x routed_scaling_factor. Plus the shared_experts SwiGLU MLP (moe_intermediate_size *
    n_shared_experts), ungated. The MTP layers (model.layers.{num_hidden_layers}.*) are not run.
  * Qwen3-Next (hybrid): layer_types (default: every full_attention_interval-th layer full attention, the rest
    linear). Its RMSNorms (input, post-attention, final, q/k) scale by 1 + w (zero-centred weights). Full attention:
    q_proj gives per head [query (head_dim), gate (head_dim)]; q/k norms per head, RoPE on the first
    head_dim * partial_rotary_factor (default 0.25) dims, softmax attention, then out *= sigmoid(gate) before o_proj.
    Linear attention (Gated DeltaNet): in_proj_qkvz per key head group [q (dk), k (dk), v (r dv), z (r dv)] and
    in_proj_ba per group [b (r), a (r)], r = value heads / key heads (group g's value heads g*r .. g*r + r - 1);
    [q; k; v] through a causal depthwise conv1d (zero history) and silu; beta = sigmoid(b), g = -exp(A_log) *
    softplus(a + dt_bias); q, k repeated per value head (repeat_interleave), l2-normalized (x / sqrt(sum x^2 + 1e-6)),
    q * dk^-0.5; per token S = S exp(g); S += k (beta (v - k^T S)); o = q^T S (HF's recurrent form; its chunked form
    is the same sum); o = RMSNorm(o) * w * silu(z) per value head (plain w, not 1 + w); out_proj. MoE as Qwen2-MoE's
    (softmax top-k, renormalised when norm_topk_prob, a sigmoid-gated shared expert). The mtp.* tensors are not run.
  * Qwen3.5-MoE (Qwen3_5MoeForConditionalGeneration; text_config, model.language_model.* names): Qwen3-Next's
    forward. Its linear attention projects with in_proj_qkv ([all q; all k; all v] rows), in_proj_z, in_proj_b and
    in_proj_a (a row block per value head, value head j of key head j // r) instead of the grouped in_proj_qkvz /
    in_proj_ba; every layer is MoE, the router always renormalizes, the experts are fused output-major (gate_up_proj
    [E, 2F, D], the gate the first F rows; down_proj [E, D, F]); RoPE's theta and partial_rotary_factor (default
    0.25) sit in rope_parameters, its interleaved multimodal sections reduce to plain RoPE for text. The vision tower
    (model.visual.*) and the mtp.* tensors are not run.
  * Dense layers (Llama, Mistral, Qwen mlp_only_layers / decoder_sparse_step, GLM's first_k_dense_replace, ERNIE's
    outside the MoE range, DeepSeek's) run one SwiGLU MLP.
  * lm_head, or the embedding matrix when tie_word_embeddings.
"""

import argparse
import json
import math
import os
import struct
import sys

import numpy as np


# ----------------------------------------------------------------------------------------------------------------
# Checkpoint


def _read_safetensors(path):
    out = {}
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        base = 8 + n
        data = f.read()
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        raw = data[a:b]
        dt = info["dtype"]
        if dt == "U8":  # MXFP4 blocks / scales: kept as bytes for dequantize_mxfp4
            out[name] = np.frombuffer(raw, dtype=np.uint8).reshape(info["shape"])
            continue
        if dt == "F32":
            arr = np.frombuffer(raw, dtype="<f4")
        elif dt == "F16":
            arr = np.frombuffer(raw, dtype="<f2")
        elif dt == "BF16":
            arr = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            raise SystemExit(f"{path}: tensor {name} has dtype {dt}, which the reference does not read")
        out[name] = arr.astype(np.float64).reshape(info["shape"])
    del base
    return out


def load_checkpoint(directory):
    with open(os.path.join(directory, "config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    weights = {}
    index = os.path.join(directory, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index, encoding="utf-8") as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    for name in files:
        weights.update(_read_safetensors(os.path.join(directory, name)))
    for name in [n for n in weights if n.endswith("_blocks")]:
        base = name[:-len("_blocks")]
        weights[base] = dequantize_mxfp4(weights.pop(name), weights.pop(base + "_scales"))
    return cfg, weights


FP4_VALUES = np.array([+0.0, +0.5, +1.0, +1.5, +2.0, +3.0, +4.0, +6.0,
                       -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def dequantize_mxfp4(blocks, scales):
    """blocks [E, out, G, 16] U8, scales [E, out, G] U8 -> the HF parameter [E, in = G*32, out]."""
    vals = np.stack([FP4_VALUES[blocks & 0x0F], FP4_VALUES[blocks >> 4]], axis=-1)  # element 2i = low nibble
    vals = vals * np.ldexp(1.0, scales.astype(np.int64) - 127)[..., None, None]
    return vals.reshape(*blocks.shape[:-2], -1).transpose(0, 2, 1)


# ----------------------------------------------------------------------------------------------------------------
# Pieces


def rms_norm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def silu(x):
    return x / (1.0 + np.exp(-x))


def softmax(x):
    m = np.max(x, axis=-1, keepdims=True)
    e = np.exp(x - m)
    return e / np.sum(e, axis=-1, keepdims=True)


def head_dim_of(cfg):
    return cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]


DEEPSEEK = ("deepseek_v2", "deepseek_v3")


def rotary_dim_of(cfg):
    """int(head_dim * partial_rotary_factor), as transformers' rope init; transformers >= 4.56 may keep the factor in
    rope_parameters. Glm4MoeConfig defaults it to 0.5, Qwen3NextConfig to 0.25, the others to 1."""
    rp = cfg.get("rope_parameters") if isinstance(cfg.get("rope_parameters"), dict) else {}
    if cfg["model_type"] == "minimax_m2" and cfg.get("rotary_dim"):  # MiniMax's remote code: rotary_dim itself
        return int(cfg["rotary_dim"])
    if cfg["model_type"] in DEEPSEEK:  # transformers sets head_dim = qk_rope_head_dim: RoPE's own width
        return int(cfg["qk_rope_head_dim"])
    default = {"glm4_moe": 0.5, "qwen3_next": 0.25}.get(cfg["model_type"], 1.0)  # the config classes' defaults
    factor = rp.get("partial_rotary_factor", cfg.get("partial_rotary_factor", default))
    return int(head_dim_of(cfg) * factor)


def rope_parameters(cfg, seq_len):
    """(inv_freq, attention_scaling) as transformers' ROPE_INIT_FUNCTIONS give them."""
    dim = rotary_dim_of(cfg)
    base = cfg.get("rope_theta", 10000.0)
    inv = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    rs = cfg.get("rope_scaling") or {}
    kind = rs.get("rope_type", rs.get("type", "default"))
    if kind == "default":
        return inv, 1.0
    if kind == "linear":
        return inv / rs["factor"], 1.0
    if kind == "dynamic":
        orig = rs.get("original_max_position_embeddings", cfg["max_position_embeddings"])
        if seq_len <= orig:
            return inv, 1.0
        factor = rs["factor"]
        b = base * ((factor * seq_len / orig) - (factor - 1)) ** (dim / (dim - 2))
        return 1.0 / (b ** (np.arange(0, dim, 2, dtype=np.float64) / dim)), 1.0
    if kind == "llama3":
        factor, low, high = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
        old = rs["original_max_position_embeddings"]
        low_wl, high_wl = old / low, old / high
        wl = 2 * math.pi / inv
        out = np.where(wl > low_wl, inv / factor, inv)
        with np.errstate(divide="ignore", invalid="ignore"):  # low == high (Llama 4): no medium band
            smooth = (old / wl - low) / (high - low)
            smoothed = (1 - smooth) * out / factor + smooth * out
        medium = ~(wl < high_wl) & ~(wl > low_wl)
        return np.where(medium, smoothed, out), 1.0
    if kind == "yarn":
        orig = rs.get("original_max_position_embeddings", cfg["max_position_embeddings"])
        factor = rs.get("factor") or cfg["max_position_embeddings"] / orig

        def mscale(s, m=1.0):
            return 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1.0

        att = rs.get("attention_factor")
        if att is None:
            if rs.get("mscale") and rs.get("mscale_all_dim"):
                att = mscale(factor, rs["mscale"]) / mscale(factor, rs["mscale_all_dim"])
            else:
                att = mscale(factor)
        beta_fast, beta_slow = rs.get("beta_fast") or 32, rs.get("beta_slow") or 1

        def corr(rot):
            return (dim * math.log(orig / (rot * 2 * math.pi))) / (2 * math.log(base))

        lo, hi = corr(beta_fast), corr(beta_slow)
        if rs.get("truncate", True):
            lo, hi = math.floor(lo), math.ceil(hi)
        lo, hi = max(lo, 0), min(hi, dim - 1)
        if lo == hi:
            hi += 0.001
        ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - lo) / (hi - lo), 0, 1)
        extra = 1 - ramp
        return (inv / factor) * (1 - extra) + inv * extra, att
    raise SystemExit(f"rope_type {kind} is not in the reference")


def apply_rope(x, positions, inv_freq, scaling, interleaved=False):
    """x: [T, heads, dim]; HF rotate_half layout (pairs i, i + dim/2), or with interleaved (ERNIE, GPT-J style) pairs
    (2i, 2i + 1), both rotated by positions * inv_freq[i]. Partial rotary (2 * len(inv_freq) < dim): the first dims
    rotate (rotate_half within them), the rest pass through."""
    rot_dim = 2 * len(inv_freq)
    if rot_dim < x.shape[-1]:
        return np.concatenate([apply_rope(x[..., :rot_dim], positions, inv_freq, scaling, interleaved),
                               x[..., rot_dim:]], axis=-1)
    ang = positions[:, None].astype(np.float64) * inv_freq[None, :]
    if interleaved:
        cos, sin = np.cos(ang)[:, None, :] * scaling, np.sin(ang)[:, None, :] * scaling
        even, odd = x[..., 0::2], x[..., 1::2]
        out = np.empty(x.shape, dtype=np.result_type(x, np.float64))
        out[..., 0::2] = even * cos - odd * sin
        out[..., 1::2] = odd * cos + even * sin
        return out
    emb = np.concatenate([ang, ang], axis=-1)
    cos, sin = np.cos(emb) * scaling, np.sin(emb) * scaling
    half = x.shape[-1] // 2
    rot = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos[:, None, :] + rot * sin[:, None, :]


def is_sparse(cfg, layer):
    t = cfg["model_type"]
    if t in ("qwen2_moe", "qwen3_moe", "qwen3_next"):
        return layer not in (cfg.get("mlp_only_layers") or []) and cfg.get("num_experts", 0) > 0 and \
            (layer + 1) % cfg.get("decoder_sparse_step", 1) == 0
    if t == "glm4_moe":
        return layer >= cfg.get("first_k_dense_replace", 1)
    if t == "dots1":  # DeepseekV3DecoderLayer's rule
        return layer >= cfg.get("first_k_dense_replace", 0)
    if t == "ernie4_5_moe":
        end = cfg.get("moe_layer_end_index", -1)
        end = cfg["num_hidden_layers"] - 1 if end == -1 else end
        return (layer + 1) % cfg.get("moe_layer_interval", 1) == 0 and \
            cfg.get("moe_layer_start_index", 1) <= layer <= end
    if t in DEEPSEEK:
        return bool(cfg.get("n_routed_experts")) and layer >= cfg.get("first_k_dense_replace", 0) and \
            layer % cfg.get("moe_layer_freq", 1) == 0
    return t in ("mixtral", "olmoe", "minimax_m2", "hunyuan")


def mlp(x, g, u, d):
    return (silu(x @ g.T) * (x @ u.T)) @ d.T


def picked_experts(W, pre, x, order, w, position, layer, trace):
    """One token's sum over its picked experts (gate/up/down_proj names), in ascending id as colibri adds them; the
    routing goes to `trace`."""
    if trace is not None:
        trace.append({"position": position, "layer": layer, "experts": [int(e) for e in order],
                      "weights": [float(z) for z in w]})
    y = np.zeros(x.shape[-1])
    for e, we in sorted(zip(order, w)):
        ep = pre + f"experts.{e}."
        y += we * mlp(x, W[ep + "gate_proj.weight"], W[ep + "up_proj.weight"], W[ep + "down_proj.weight"])[0]
    return y


def gpt_oss_glu(gate_up, alpha, limit):
    gate = np.minimum(gate_up[..., 0::2], limit)
    up = np.clip(gate_up[..., 1::2], -limit, limit)
    return (up + 1) * (gate / (1.0 + np.exp(-alpha * gate)))


def gpt_oss_moe(cfg, W, pre, h, layer, trace):
    k_top = cfg["num_experts_per_tok"]
    alpha, limit = cfg.get("swiglu_alpha", 1.702), cfg.get("swiglu_limit", 7.0)
    logits = h @ W[pre + "router.weight"].T + W[pre + "router.bias"]
    gu, gu_b = W[pre + "experts.gate_up_proj"], W[pre + "experts.gate_up_proj_bias"]
    dn, dn_b = W[pre + "experts.down_proj"], W[pre + "experts.down_proj_bias"]
    y = np.zeros_like(h)
    for ti in range(len(h)):
        order = np.argsort(-logits[ti], kind="stable")[:k_top]  # torch.topk: ties go to the lower index
        w = softmax(logits[ti][order])
        if trace is not None:
            trace.append({"position": ti, "layer": layer, "experts": [int(e) for e in order],
                          "weights": [float(z) for z in w]})
        for e, we in sorted(zip(order, w)):
            y[ti] += we * (gpt_oss_glu(h[ti] @ gu[e] + gu_b[e], alpha, limit) @ dn[e] + dn_b[e])
    return y


def shared_experts(W, pre, h):
    """The ungated shared_experts MLP of GLM and DeepSeek (none where n_shared_experts is 0 or null)."""
    sp = pre + "shared_experts."
    if sp + "gate_proj.weight" not in W:
        return 0.0
    return mlp(h, W[sp + "gate_proj.weight"], W[sp + "up_proj.weight"], W[sp + "down_proj.weight"])


def glm4_moe_moe(cfg, W, pre, h, layer, trace):
    """Glm4MoeMoE: Glm4MoeTopkRouter (sigmoid scores, selection bias, group-limited top-k, renormalise, scale), the
    routed experts, plus the shared experts."""
    ne, k_top = cfg["n_routed_experts"], cfg["num_experts_per_tok"]
    n_group, topk_group = cfg.get("n_group") or 1, cfg.get("topk_group") or 1
    # Dots1Config's default is False, Glm4MoeConfig's True (DeepseekV3Config's True, always written).
    renorm = bool(cfg.get("norm_topk_prob", cfg["model_type"] != "dots1"))
    scale = cfg.get("routed_scaling_factor", 1.0)
    scores = 1.0 / (1.0 + np.exp(-(h @ W[pre + "gate.weight"].T)))  # router in f32 in HF, float64 here
    bias = W.get(pre + "gate.e_score_correction_bias", np.zeros(ne))  # a zero buffer in HF when the file lacks it
    y = np.zeros_like(h)
    for ti in range(len(h)):
        choice = scores[ti] + bias
        if n_group > 1 and topk_group < n_group:  # groups ranked by the sum of their best two; the rest left out
            groups = choice.reshape(n_group, ne // n_group)
            group_score = np.sort(groups, axis=1)[:, -2:].sum(axis=1)
            keep = np.zeros(n_group, dtype=bool)
            keep[np.argsort(-group_score, kind="stable")[:topk_group]] = True
            # -inf as DeepSeek's inference code, vLLM and llama.cpp; transformers fills 0.0, the same picks wherever
            # the kept experts' score + bias stay above 0.
            choice = np.where(np.repeat(keep, ne // n_group), choice, -np.inf)
        order = np.argsort(-choice, kind="stable")[:k_top]  # listed by descending score + bias, ties to the lower id
        w = scores[ti][order]
        if renorm:
            w = w / (np.sum(w) + 1e-20)
        w = w * scale
        y[ti] = picked_experts(W, pre, h[ti:ti + 1], order, w, ti, layer, trace)
    return y + shared_experts(W, pre, h)


def minimax_m2_moe(cfg, W, pre, h, layer, trace):
    """MiniMaxM2SparseMoeBlock: sigmoid (or softmax) scores; the selection bias only picks; the picked scores
    renormalised (always) and scaled; Mixtral-style w1/w3/w2 experts."""
    k_top, func = cfg["num_experts_per_tok"], cfg.get("scoring_func", "sigmoid")
    if cfg.get("use_grouped_topk", False) and (cfg.get("num_expert_group") or 1) > 1:
        raise SystemExit("minimax_m2: grouped top-k is not in the reference")
    logits = h @ W[pre + "gate.weight"].T  # f32 in the remote code, float64 here
    if func == "sigmoid":
        scores = 1.0 / (1.0 + np.exp(-logits))
    elif func == "softmax":
        scores = softmax(logits)
    else:
        raise SystemExit(f"minimax_m2: scoring_func {func} is not in the reference")
    bias = np.zeros(scores.shape[-1])
    if cfg.get("use_routing_bias", True):  # a zero buffer in transformers' port when the file lacks it
        bias = W.get(pre + "e_score_correction_bias", bias)
    scale = cfg.get("routed_scaling_factor", 1.0)
    y = np.zeros_like(h)
    for ti in range(len(h)):
        order = np.argsort(-(scores[ti] + bias), kind="stable")[:k_top]  # descending score + bias, ties to lower id
        w = scores[ti][order]
        w = w / max(np.sum(w), 1e-12) * scale
        if trace is not None:
            trace.append({"position": ti, "layer": layer, "experts": [int(e) for e in order],
                          "weights": [float(z) for z in w]})
        for e, we in sorted(zip(order, w)):
            ep = pre + f"experts.{e}."
            y[ti] += we * mlp(h[ti:ti + 1], W[ep + "w1.weight"], W[ep + "w3.weight"], W[ep + "w2.weight"])[0]
    return y


def ernie4_5_moe_moe(cfg, W, pre, h, layer, trace):
    """Ernie4_5_MoeSparseMoeBlock: softmax probs; the selection bias (moe_statics) only picks; the picked probs
    renormalised by max(sum, moe_norm_min); plus the shared experts, ungated."""
    k_top, norm_min = cfg["moe_k"], cfg.get("moe_norm_min", 1e-12)
    probs = softmax(h @ W[pre + "gate.weight"].T)  # f32 in HF, float64 here
    bias = W.get(pre + "moe_statics.e_score_correction_bias")
    bias = np.zeros(probs.shape[-1]) if bias is None else np.reshape(bias, -1)  # [1, E] in the checkpoint
    y = np.zeros_like(h)
    for ti in range(len(h)):
        order = np.argsort(-(probs[ti] + bias), kind="stable")[:k_top]  # descending prob + bias, ties to lower id
        w = probs[ti][order]
        w = w / max(np.sum(w), norm_min)
        y[ti] = picked_experts(W, pre, h[ti:ti + 1], order, w, ti, layer, trace)
    sp = pre + "shared_experts."
    if sp + "gate_proj.weight" in W:  # moe_num_shared_experts > 0
        y = y + mlp(h, W[sp + "gate_proj.weight"], W[sp + "up_proj.weight"], W[sp + "down_proj.weight"])
    return y


def yarn_mscale(scale, m=1.0):
    """DeepSeek's yarn_get_mscale."""
    return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0


def mla_softmax_scale(cfg):
    """(qk_nope + qk_rope)^-0.5, times mscale(factor, mscale_all_dim)^2 when rope_scaling has mscale_all_dim."""
    scale = (cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]) ** -0.5
    rs = cfg.get("rope_scaling") or {}
    if rs.get("mscale_all_dim"):
        m = yarn_mscale(rs["factor"], rs["mscale_all_dim"])
        scale *= m * m
    return scale


def mla_project(cfg, W, p, h, pos, inv_freq, att_scale):
    """One layer's MLA pieces from the normed hidden states h [T, hidden]: q_nope [T, H, dn], q_pe [T, H, dr] (roped),
    the normed latent c [T, kv_lora_rank], k_pe [T, dr] (roped, shared by the heads), and kv_b_proj's weight."""
    T, nh = len(h), cfg["num_attention_heads"]
    dn, dr = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"]
    kvl = cfg["kv_lora_rank"]
    a = p + "self_attn."
    if cfg.get("q_lora_rank"):  # the latent norms use DeepseekV2RMSNorm's default eps, not rms_norm_eps
        q = rms_norm(h @ W[a + "q_a_proj.weight"].T, W[a + "q_a_layernorm.weight"], 1e-6) @ W[a + "q_b_proj.weight"].T
    else:
        q = h @ W[a + "q_proj.weight"].T
    q = q.reshape(T, nh, dn + dr)
    q_nope, q_pe = q[..., :dn], q[..., dn:]
    kv_a = h @ W[a + "kv_a_proj_with_mqa.weight"].T
    c, k_pe = rms_norm(kv_a[:, :kvl], W[a + "kv_a_layernorm.weight"], 1e-6), kv_a[:, kvl:]
    interleaved = cfg["model_type"] == "deepseek_v2" or cfg.get("rope_interleave", True)
    q_pe = apply_rope(q_pe, pos, inv_freq, att_scale, interleaved)
    k_pe = apply_rope(k_pe[:, None, :], pos, inv_freq, att_scale, interleaved)[:, 0, :]
    return q_nope, q_pe, c, k_pe, W[a + "kv_b_proj.weight"]


def mla_attention(cfg, W, p, h, pos, inv_freq, att_scale, visible):
    """DeepSeek's multi-head latent attention, naive: every head's keys [k_nope, k_pe] and values expanded from the
    latent by kv_b_proj, then ordinary attention; o_proj over the heads' values. [T, hidden]."""
    T, nh = len(h), cfg["num_attention_heads"]
    dn, dv = cfg["qk_nope_head_dim"], cfg["v_head_dim"]
    q_nope, q_pe, c, k_pe, kv_b = mla_project(cfg, W, p, h, pos, inv_freq, att_scale)
    kv = (c @ kv_b.T).reshape(T, nh, dn + dv)
    k_nope, v = kv[..., :dn], kv[..., dn:]
    scale = mla_softmax_scale(cfg)
    out = np.zeros((T, nh, dv))
    for head in range(nh):
        s = (q_nope[:, head, :] @ k_nope[:, head, :].T + q_pe[:, head, :] @ k_pe.T) * scale
        out[:, head, :] = softmax(np.where(visible, s, -np.inf)) @ v[:, head, :]
    return out.reshape(T, nh * dv) @ W[p + "self_attn.o_proj.weight"].T


def deepseek_v2_moe(cfg, W, pre, h, layer, trace):
    """DeepSeek-V2's MoEGate (its remote code): softmax scores, top-k (greedy, or group_limited_greedy: within the
    topk_group groups of best max score), the picked scores renormalised when norm_topk_prob (and top_k > 1), else
    times routed_scaling_factor; plus the shared experts, ungated."""
    ne, k_top = cfg["n_routed_experts"], cfg["num_experts_per_tok"]
    method = cfg.get("topk_method", "greedy")
    n_group, topk_group = cfg.get("n_group") or 1, cfg.get("topk_group") or 1
    if cfg.get("scoring_func", "softmax") != "softmax":
        raise SystemExit(f"deepseek_v2: scoring_func {cfg['scoring_func']} is not in the reference")
    if method not in ("greedy", "group_limited_greedy"):
        raise SystemExit(f"deepseek_v2: topk_method {method} is not in the reference")
    scores = softmax(h @ W[pre + "gate.weight"].T)  # f32 in DeepSeek's code, float64 here
    renorm = bool(cfg.get("norm_topk_prob", False)) and k_top > 1
    y = np.zeros_like(h)
    for ti in range(len(h)):
        choice = scores[ti]
        if method == "group_limited_greedy" and n_group > 1:  # groups ranked by their best score; the rest zeroed
            keep = np.zeros(n_group, dtype=bool)
            keep[np.argsort(-choice.reshape(n_group, -1).max(axis=1), kind="stable")[:topk_group]] = True
            choice = np.where(np.repeat(keep, ne // n_group), choice, 0.0)
        order = np.argsort(-choice, kind="stable")[:k_top]  # descending score, ties to the lower id
        w = scores[ti][order]
        w = w / (np.sum(w) + 1e-20) if renorm else w * cfg.get("routed_scaling_factor", 1.0)
        y[ti] = picked_experts(W, pre, h[ti:ti + 1], order, w, ti, layer, trace)
    return y + shared_experts(W, pre, h)


def deepseek_v3_moe(cfg, W, pre, h, layer, trace):
    """DeepseekV3MoE: DeepseekV3TopkRouter (noaux_tc) is GLM-4.5's router (sigmoid scores, selection bias, group-
    limited top-k, renormalise, scale), its experts and shared experts GLM's too."""
    if cfg.get("scoring_func", "sigmoid") != "sigmoid" or cfg.get("topk_method", "noaux_tc") != "noaux_tc":
        raise SystemExit("deepseek_v3: only scoring_func sigmoid with topk_method noaux_tc is in the reference")
    return glm4_moe_moe(cfg, W, pre, h, layer, trace)


# ----------------------------------------------------------------------------------------------------------------
# Forward


def llama4_forward(top, W, tokens, trace):
    """Llama 4's language model (transformers' modeling_llama4, Meta's llama-models): text_config's fields, the
    weights under language_model.; the vision tower is not run."""
    cfg = dict(top["text_config"])
    W = {k[len("language_model."):]: v for k, v in W.items() if k.startswith("language_model.")}
    eps = cfg["rms_norm_eps"]
    nh, nkv, hd, L = cfg["num_attention_heads"], cfg["num_key_value_heads"], head_dim_of(cfg), cfg["num_hidden_layers"]
    T = len(tokens)
    pos = np.arange(T)
    inv_freq, att_scale = rope_parameters(cfg, T)
    rope_on = cfg.get("no_rope_layers") or [int((i + 1) % cfg.get("no_rope_layer_interval", 4) != 0) for i in range(L)]
    types = cfg.get("layer_types") or ["chunked_attention" if r else "full_attention" for r in rope_on]
    chunk = cfg.get("attention_chunk_size")
    moe_layers = cfg.get("moe_layers")
    if moe_layers is None:
        step = cfg.get("interleave_moe_layer_step", 1)
        moe_layers = list(range(step - 1, L, step))
    ff = cfg["intermediate_size"]
    x = W["model.embed_tokens.weight"][np.asarray(tokens)]
    i_idx, j_idx = np.meshgrid(np.arange(T), np.arange(T), indexing="ij")
    causal = j_idx <= i_idx
    for l in range(L):
        p = f"model.layers.{l}."
        h = rms_norm(x, W[p + "input_layernorm.weight"], eps)
        q = (h @ W[p + "self_attn.q_proj.weight"].T).reshape(T, nh, hd)
        k = (h @ W[p + "self_attn.k_proj.weight"].T).reshape(T, nkv, hd)
        v = (h @ W[p + "self_attn.v_proj.weight"].T).reshape(T, nkv, hd)
        if rope_on[l]:  # the complex form: pairs (2i, 2i + 1); then the weightless "L2Norm" (an RMS norm)
            q = apply_rope(q, pos, inv_freq, att_scale, interleaved=True)
            k = apply_rope(k, pos, inv_freq, att_scale, interleaved=True)
            if cfg.get("use_qk_norm", True):
                q, k = rms_norm(q, np.ones(hd), eps), rms_norm(k, np.ones(hd), eps)
        elif cfg.get("attn_temperature_tuning", True):
            scale = np.log(np.floor((pos + 1.0) / cfg.get("floor_scale", 8192)) + 1.0) * cfg.get("attn_scale", 0.1) + 1
            q = q * scale[:, None, None]
        visible = causal
        if types[l] == "chunked_attention" and chunk:
            visible = causal & (i_idx // chunk == j_idx // chunk)
        out = np.zeros((T, nh, hd))
        for head in range(nh):
            kh = head // (nh // nkv)
            s = np.where(visible, (q[:, head, :] @ k[:, kh, :].T) / math.sqrt(hd), -np.inf)
            out[:, head, :] = softmax(s) @ v[:, kh, :]
        x = x + out.reshape(T, nh * hd) @ W[p + "self_attn.o_proj.weight"].T
        h = rms_norm(x, W[p + "post_attention_layernorm.weight"], eps)
        f = p + "feed_forward."
        if l in moe_layers:
            # top-k of the raw logits, sigmoid of those; the weight scales the expert's input, not its output.
            logits = h @ W[f + "router.weight"].T
            y = mlp(h, W[f + "shared_expert.gate_proj.weight"], W[f + "shared_expert.up_proj.weight"],
                    W[f + "shared_expert.down_proj.weight"])
            gate_up, down = W[f + "experts.gate_up_proj"], W[f + "experts.down_proj"]
            for ti in range(T):
                order = np.argsort(-logits[ti], kind="stable")[:cfg["num_experts_per_tok"]]
                w = 1.0 / (1.0 + np.exp(-logits[ti][order]))
                if trace is not None:
                    trace.append({"position": ti, "layer": l, "experts": [int(e) for e in order],
                                  "weights": [float(z) for z in w]})
                for e, we in zip(order, w):
                    xe = we * h[ti:ti + 1]
                    gu = xe @ gate_up[e]
                    y[ti] += ((silu(gu[:, :ff]) * gu[:, ff:]) @ down[e])[0]
        else:
            y = mlp(h, W[f + "gate_proj.weight"], W[f + "up_proj.weight"], W[f + "down_proj.weight"])
        x = x + y
    x = rms_norm(x, W["model.norm.weight"], eps)
    return x @ W["lm_head.weight"].T


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def softplus(x):
    """torch's F.softplus (beta 1, threshold 20: x itself above it)."""
    return np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0))))


def l2norm(x, eps=1e-6):
    """transformers' l2norm (FLA's): x / sqrt(sum(x^2) + eps) over the last axis."""
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + eps)


def gated_delta_rule(q, k, v, g, beta):
    """HF's torch_recurrent_gated_delta_rule from a zero state, q and k already l2-normalized and q scaled: per head a
    [dk, dv] state decays by exp(g_t), then the delta rule writes beta_t (v_t - what it holds under k_t) at k_t, then
    q_t reads it. q, k [T, H, dk], v [T, H, dv], g and beta [T, H] -> [T, H, dv]. (A module-level name, so that a check
    can swap in the chunked form.)"""
    S = np.zeros((k.shape[1], k.shape[2], v.shape[2]))
    out = np.zeros(v.shape)
    for t in range(len(k)):
        S = S * np.exp(g[t])[:, None, None]
        kv_mem = np.einsum("hkv,hk->hv", S, k[t])
        delta = (v[t] - kv_mem) * beta[t][:, None]
        S = S + k[t][:, :, None] * delta[:, None, :]
        out[t] = np.einsum("hkv,hk->hv", S, q[t])
    return out


def gated_delta_net_inputs(cfg, W, pre, h):
    """The Gated DeltaNet's projections of h [T, hidden]: the conv's input [all q; all k; all v] channels [T, 2 nk dk +
    nv dv], z [T, nv, dv], b and a [T, nv], value head j of key head j // r (r = nv / nk) in both layouts.
    Qwen3-Next: in_proj_qkvz's rows grouped by key head as [q (dk), k (dk), v (r dv), z (r dv)] and in_proj_ba's as
    [b (r), a (r)], group g holding value heads g*r .. g*r + r - 1. Qwen3.5: in_proj_qkv's rows [all q; all k; all v]
    (already the conv's channel order), in_proj_z, in_proj_b and in_proj_a one row block per value head."""
    T = len(h)
    nk, nv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    r = nv // nk
    if pre + "in_proj_qkv.weight" in W:  # Qwen3.5
        mixed = h @ W[pre + "in_proj_qkv.weight"].T
        z = (h @ W[pre + "in_proj_z.weight"].T).reshape(T, nv, dv)
        return mixed, z, h @ W[pre + "in_proj_b.weight"].T, h @ W[pre + "in_proj_a.weight"].T
    qkvz = (h @ W[pre + "in_proj_qkvz.weight"].T).reshape(T, nk, 2 * dk + 2 * r * dv)
    q, k, v, z = np.split(qkvz, [dk, 2 * dk, 2 * dk + r * dv], axis=-1)
    ba = (h @ W[pre + "in_proj_ba.weight"].T).reshape(T, nk, 2 * r)
    b, a = ba[..., :r].reshape(T, nv), ba[..., r:].reshape(T, nv)
    mixed = np.concatenate([q.reshape(T, -1), k.reshape(T, -1), v.reshape(T, -1)], axis=-1)
    return mixed, z.reshape(T, nv, dv), b, a


def gated_delta_net(cfg, W, pre, h):
    """Qwen3NextGatedDeltaNet / Qwen3_5MoeGatedDeltaNet (linear_attn) on one prompt's normed hidden states h
    [T, hidden], no cache: the same computation behind the two projection layouts (gated_delta_net_inputs)."""
    T = len(h)
    nk, nv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    r = nv // nk
    mixed, z, b, a = gated_delta_net_inputs(cfg, W, pre, h)
    # [all q; all k; all v] channels through the causal depthwise conv (no bias; zeros before the first token), silu.
    w = W[pre + "conv1d.weight"][:, 0, :]  # [channels, 1, kernel] -> [channels, kernel]
    K = w.shape[1]
    padded = np.concatenate([np.zeros((K - 1, mixed.shape[1])), mixed])
    mixed = silu(sum(padded[j:j + T] * w[:, j] for j in range(K)))
    q = mixed[:, :nk * dk].reshape(T, nk, dk)
    k = mixed[:, nk * dk:2 * nk * dk].reshape(T, nk, dk)
    v = mixed[:, 2 * nk * dk:].reshape(T, nv, dv)
    beta = sigmoid(b)
    g = -np.exp(W[pre + "A_log"]) * softplus(a + W[pre + "dt_bias"])
    q = l2norm(np.repeat(q, r, axis=1)) * dk ** -0.5  # repeat_interleave: value head j reads key head j // r
    k = l2norm(np.repeat(k, r, axis=1))
    o = gated_delta_rule(q, k, v, g, beta)
    # Qwen3NextRMSNormGated per value head: the plain weight (not 1 + w), then silu(z).
    o = rms_norm(o, W[pre + "norm.weight"], cfg["rms_norm_eps"]) * silu(z)
    return o.reshape(T, nv * dv) @ W[pre + "out_proj.weight"].T


def qwen3_next_attention(cfg, W, p, h, pos, inv_freq, att_scale, visible):
    """Qwen3NextAttention: q_proj's per-head [query, gate] halves, (1 + w) q/k norms per head, partial RoPE, softmax
    attention (GQA), the heads' output times sigmoid(gate), o_proj. [T, hidden]."""
    T, eps = len(h), cfg["rms_norm_eps"]
    nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], head_dim_of(cfg)
    a = p + "self_attn."
    qg = (h @ W[a + "q_proj.weight"].T).reshape(T, nh, 2 * hd)
    q, gate = qg[..., :hd], qg[..., hd:].reshape(T, nh * hd)
    q = rms_norm(q, 1.0 + W[a + "q_norm.weight"], eps)
    k = rms_norm((h @ W[a + "k_proj.weight"].T).reshape(T, nkv, hd), 1.0 + W[a + "k_norm.weight"], eps)
    v = (h @ W[a + "v_proj.weight"].T).reshape(T, nkv, hd)
    q = apply_rope(q, pos, inv_freq, att_scale)
    k = apply_rope(k, pos, inv_freq, att_scale)
    out = np.zeros((T, nh, hd))
    for head in range(nh):
        kh = head // (nh // nkv)
        s = np.where(visible, (q[:, head, :] @ k[:, kh, :].T) / math.sqrt(hd), -np.inf)
        out[:, head, :] = softmax(s) @ v[:, kh, :]
    return (out.reshape(T, nh * hd) * sigmoid(gate)) @ W[a + "o_proj.weight"].T


def qwen3_next_moe(cfg, W, pre, h, layer, trace):
    """Qwen3NextSparseMoeBlock: softmax over the experts, top-k, renormalised when norm_topk_prob (Qwen3NextConfig's
    default true), plus sigmoid(shared_expert_gate x) * shared_expert(x)."""
    k_top, renorm = cfg["num_experts_per_tok"], bool(cfg.get("norm_topk_prob", True))
    probs = softmax(h @ W[pre + "gate.weight"].T)
    y = np.zeros_like(h)
    for ti in range(len(h)):
        order = np.argsort(-probs[ti], kind="stable")[:k_top]
        w = probs[ti][order]
        if renorm:
            w = w / np.sum(w)
        y[ti] = picked_experts(W, pre, h[ti:ti + 1], order, w, ti, layer, trace)
    sp = pre + "shared_expert."
    shared = mlp(h, W[sp + "gate_proj.weight"], W[sp + "up_proj.weight"], W[sp + "down_proj.weight"])
    return y + sigmoid(h @ W[pre + "shared_expert_gate.weight"].T) * shared


def qwen3_next_forward(cfg, W, tokens, trace):
    """Qwen3NextForCausalLM: linear_attention (Gated DeltaNet) and full_attention layers by layer_types, each followed
    by the MoE (or, off decoder_sparse_step / in mlp_only_layers, a dense MLP); every RMSNorm but the gated one scales
    by 1 + w. The mtp.* tensors are not run."""
    if cfg.get("attention_bias", False):
        raise SystemExit("qwen3_next: attention_bias=true is not in the reference")
    eps, L = cfg["rms_norm_eps"], cfg["num_hidden_layers"]
    T = len(tokens)
    pos = np.arange(T)
    inv_freq, att_scale = rope_parameters(cfg, T)
    interval = cfg.get("full_attention_interval", 4)
    types = cfg.get("layer_types") or \
        ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(L)]
    i_idx, j_idx = np.meshgrid(np.arange(T), np.arange(T), indexing="ij")
    causal = j_idx <= i_idx
    x = W["model.embed_tokens.weight"][np.asarray(tokens)]
    for l in range(L):
        p = f"model.layers.{l}."
        h = rms_norm(x, 1.0 + W[p + "input_layernorm.weight"], eps)
        if types[l] == "linear_attention":
            x = x + gated_delta_net(cfg, W, p + "linear_attn.", h)
        else:
            x = x + qwen3_next_attention(cfg, W, p, h, pos, inv_freq, att_scale, causal)
        h = rms_norm(x, 1.0 + W[p + "post_attention_layernorm.weight"], eps)
        if is_sparse(cfg, l):
            y = qwen3_next_moe(cfg, W, p + "mlp.", h, l, trace)
        else:
            y = mlp(h, W[p + "mlp.gate_proj.weight"], W[p + "mlp.up_proj.weight"], W[p + "mlp.down_proj.weight"])
        x = x + y
    x = rms_norm(x, 1.0 + W["model.norm.weight"], eps)
    head = W["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings", False) else W["lm_head.weight"]
    return x @ head.T


def bailing_moe_v2_as_glm(cfg, W):
    """Ling 2.0's remote code (modeling_bailing_moe_v2) is GLM-4.5's forward under other names: q, k and v cut from
    query_key_value's [q; k; v] head rows, optional per-head q/k RMS norms before RoPE, RoPE (rotate_half) on the first
    rotary_dim or partial_rotary_factor of each head, attention.dense with use_bias, and BailingMoeV2Gate, which is
    Glm4MoeTopkRouter (sigmoid, expert_bias picks within the best topk_group of n_group groups ranked by their best
    two, x routed_scaling_factor) except that it renormalizes whenever it picks several experts, whatever
    norm_topk_prob says. Returns GLM's config and weight names."""
    if cfg.get("use_qkv_bias") or cfg.get("score_function", "sigmoid") != "sigmoid":
        raise SystemExit("bailing_moe_v2: q/k/v biases and other scoring than sigmoid are not in the reference")
    nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], head_dim_of(cfg)
    g = dict(cfg, model_type="glm4_moe", n_routed_experts=cfg["num_experts"],
             n_shared_experts=cfg.get("num_shared_experts") or 0, norm_topk_prob=cfg["num_experts_per_tok"] > 1,
             attention_bias=False, num_nextn_predict_layers=0,
             partial_rotary_factor=(cfg["rotary_dim"] / hd if cfg.get("rotary_dim")
                                    else cfg.get("partial_rotary_factor", 0.5)))
    w = {}
    for name, v in W.items():
        name = name.replace("model.word_embeddings.", "model.embed_tokens.").replace(".attention.dense.",
                                                                                     ".self_attn.o_proj.")
        name = name.replace(".attention.query_layernorm.", ".self_attn.q_norm.").replace(
            ".attention.key_layernorm.", ".self_attn.k_norm.").replace(".mlp.gate.expert_bias",
                                                                       ".mlp.gate.e_score_correction_bias")
        if name.endswith(".attention.query_key_value.weight"):
            p = name[:-len("attention.query_key_value.weight")] + "self_attn."
            w[p + "q_proj.weight"], w[p + "k_proj.weight"], w[p + "v_proj.weight"] = np.split(
                v, [nh * hd, (nh + nkv) * hd])
            continue
        w[name] = v
    return g, w


def qwen3_vl_moe_as_qwen3_moe(cfg, W):
    """Qwen3-VL-MoE's language model (transformers' modeling_qwen3_vl_moe) on text alone is Qwen3-MoE's forward: its
    interleaved multimodal RoPE gives a text token the same position in all three sections (plain RoPE), its router
    always renormalizes (Qwen3VLMoeTextTopKRouter), and its experts are fused input-major, gate_up_proj [E, D, 2F] with
    the gate in the first half, down_proj [E, F, D]. Returns Qwen3-MoE's config and weight names."""
    tc = dict(cfg["text_config"])
    rs = tc.get("rope_scaling") or {}
    if rs.get("rope_type", rs.get("type", "default")) not in ("default", "mrope"):
        raise SystemExit("qwen3_vl_moe: only default (multimodal) RoPE is in the reference")
    tie = tc.get("tie_word_embeddings", cfg.get("tie_word_embeddings", True))
    g = dict(tc, model_type="qwen3_moe", norm_topk_prob=True, rope_scaling=None, tie_word_embeddings=tie)
    w = {}
    for name, v in W.items():
        if name.startswith("model.visual."):
            continue
        name = name.replace("model.language_model.", "model.", 1)
        if name.endswith("mlp.experts.gate_up_proj"):
            p, f = name[:-len("gate_up_proj")], v.shape[2] // 2
            for e in range(v.shape[0]):
                w[p + f"{e}.gate_proj.weight"] = v[e][:, :f].T
                w[p + f"{e}.up_proj.weight"] = v[e][:, f:].T
            continue
        if name.endswith("mlp.experts.down_proj"):
            p = name[:-len("down_proj")]
            for e in range(v.shape[0]):
                w[p + f"{e}.down_proj.weight"] = v[e].T
            continue
        w[name] = v
    return g, w


def qwen3_5_moe_as_qwen3_next(cfg, W):
    """Qwen3.5-MoE (transformers' modeling_qwen3_5_moe; Qwen3_5MoeForConditionalGeneration, its language model's
    fields in text_config, model_type qwen3_5_moe_text) on text alone is Qwen3-Next's forward: the same (1 + w) norms,
    gated attention with partial RoPE, Gated DeltaNet (l2norm eps 1e-6, value head j reads key head j // r, the plain-w
    gated norm) and sigmoid-gated shared expert. Its interleaved multimodal RoPE (rope_parameters' mrope_section)
    gives a text token one position in all three sections, so plain RoPE on the first head_dim *
    partial_rotary_factor (default 0.25) dims; every layer is MoE (no decoder_sparse_step / mlp_only_layers) and the
    router always renormalizes the top-k (Qwen3VLMoeTextTopKRouter: no norm_topk_prob). The linear attention's
    separate in_proj_qkv / in_proj_z / in_proj_b / in_proj_a are read by gated_delta_net_inputs; the experts, fused
    output-major (gate_up_proj [E, 2F, D], the gate the first F rows; down_proj [E, D, F]), are cut per expert here.
    The model.visual.* and mtp.* tensors are not run. Also takes a text-only Qwen3_5MoeForCausalLM checkpoint (the
    fields at the top, model.* names), and Qwen3.5's dense models (modeling_qwen3_5; Qwen3_5ForConditionalGeneration,
    model_type qwen3_5_text): the same but a Qwen3_5MLP in every layer (no num_experts: Qwen3-Next's dense layers).
    Returns Qwen3-Next's config and weight names."""
    tc = dict(cfg.get("text_config") or cfg)
    rp = tc.get("rope_parameters") or tc.get("rope_scaling") or {}
    if rp.get("rope_type", rp.get("type", "default")) not in ("default", "mrope"):
        raise SystemExit("qwen3_5_moe: only default (multimodal) RoPE is in the reference")
    tie = tc.get("tie_word_embeddings", cfg.get("tie_word_embeddings", False))
    g = dict(tc, model_type="qwen3_next", norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
             rope_theta=rp.get("rope_theta", tc.get("rope_theta", 10000.0)),
             partial_rotary_factor=rp.get("partial_rotary_factor", tc.get("partial_rotary_factor", 0.25)),
             rope_parameters=None, rope_scaling=None, tie_word_embeddings=tie)
    w = {}
    for name, v in W.items():
        if name.startswith(("model.visual.", "mtp.")):
            continue
        name = name.replace("model.language_model.", "model.", 1)
        if name.endswith("mlp.experts.gate_up_proj"):
            p, f = name[:-len("gate_up_proj")], v.shape[1] // 2
            for e in range(v.shape[0]):
                w[p + f"{e}.gate_proj.weight"] = v[e][:f]
                w[p + f"{e}.up_proj.weight"] = v[e][f:]
            continue
        if name.endswith("mlp.experts.down_proj"):
            p = name[:-len("down_proj")]
            for e in range(v.shape[0]):
                w[p + f"{e}.down_proj.weight"] = v[e]
            continue
        w[name] = v
    return g, w


def glm4_moe_lite_as_deepseek_v3(cfg):
    """GLM-4.7-Flash (transformers' modeling_glm4_moe_lite) is DeepSeek-V3's forward: DeepseekV3Attention (MLA,
    rope_interleave), GLM-4.5's router (DeepSeek-V3's), its MoE layers by mlp_layer_types (default: all but the first)
    and Glm4MoeLiteConfig's defaults (routed_scaling_factor 1.8). Returns DeepSeek-V3's config."""
    rp = cfg.get("rope_parameters") or {}
    if rp.get("partial_rotary_factor", 1.0) != 1.0:
        raise SystemExit("glm4_moe_lite: partial_rotary_factor != 1 is not in the reference")
    n = cfg["num_hidden_layers"]
    types = cfg.get("mlp_layer_types") or ["dense"] + ["sparse"] * (n - 1)
    dense = [i for i, t in enumerate(types) if t == "dense"]
    if dense != list(range(len(dense))):
        raise SystemExit("glm4_moe_lite: only leading dense layers are in the reference")
    return dict(cfg, model_type="deepseek_v3", first_k_dense_replace=len(dense), moe_layer_freq=1,
                routed_scaling_factor=cfg.get("routed_scaling_factor", 1.8),
                norm_topk_prob=cfg.get("norm_topk_prob", True), rms_norm_eps=cfg.get("rms_norm_eps", 1e-5),
                rope_theta=rp.get("rope_theta", cfg.get("rope_theta", 10000.0)))


def hunyuan_config(cfg):
    """Hunyuan-A13B's own modeling_hunyuan.py (HunYuanMoEV1ForCausalLM): head_dim = hidden_size / heads, NTK-alpha
    RoPE (HunYuanDynamicNTKAlphaRotaryEmbedding: the base x alpha^(d/(d-2)) at every length), q/k RMS norms per head
    after RoPE, topkgating (softmax over the float32 router's logits, the top moe_topk renormalized; top-1 keeps its
    probability), the shared MLP always added. Its gating also drops the tokens past an expert's capacity in a pass
    of many tokens (a training artifact vLLM and llama.cpp leave out, as colibri and this reference do)."""
    for key in ("use_cla", "use_mla", "attention_bias", "mlp_bias"):
        if cfg.get(key):
            raise SystemExit(f"hunyuan: {key}=true is not in the reference")
    topk = cfg["moe_topk"]
    topk = topk[0] if isinstance(topk, list) else topk
    g = dict(cfg, head_dim=cfg["hidden_size"] // cfg["num_attention_heads"], num_experts_per_tok=topk,
             norm_topk_prob=topk > 1)
    rs = cfg.get("rope_scaling") or {}
    if rs.get("type") == "dynamic" and rs.get("alpha"):
        d = g["head_dim"]
        g.update(rope_theta=cfg.get("rope_theta", 10000.0) * rs["alpha"] ** (d / (d - 2)), rope_scaling=None)
    return g


def forward(cfg, W, tokens, trace=None):
    if cfg["model_type"] == "hunyuan":
        cfg = hunyuan_config(cfg)
    if cfg["model_type"] == "glm4_moe_lite":
        cfg = glm4_moe_lite_as_deepseek_v3(cfg)
    if cfg["model_type"] == "llama4":
        return llama4_forward(cfg, W, tokens, trace)
    if cfg["model_type"] in ("qwen3_5_moe", "qwen3_5_moe_text", "qwen3_5", "qwen3_5_text"):
        cfg, W = qwen3_5_moe_as_qwen3_next(cfg, W)
    if cfg["model_type"] == "qwen3_next":
        return qwen3_next_forward(cfg, W, tokens, trace)
    if cfg["model_type"] == "qwen3_vl_moe":
        cfg, W = qwen3_vl_moe_as_qwen3_moe(cfg, W)
    if cfg["model_type"] == "bailing_moe_v2":
        cfg, W = bailing_moe_v2_as_glm(cfg, W)
    t = cfg["model_type"]
    eps = cfg["rms_norm_eps"]
    nh, nkv, hd = cfg["num_attention_heads"], cfg.get("num_key_value_heads") or cfg["num_attention_heads"], head_dim_of(cfg)
    T = len(tokens)
    if t == "minimax_m2":
        if cfg.get("use_qk_norm", True) and cfg.get("qk_norm_type", "per_layer") != "per_layer":
            raise SystemExit(f"minimax_m2: qk_norm_type {cfg['qk_norm_type']} is not in the reference")
        aw = cfg.get("attn_window_size")
        if any(w is not None and w > 0 for w in (aw if isinstance(aw, list) else [aw])):
            raise SystemExit("minimax_m2: attn_window_size (sliding window) is not in the reference")
    if t == "ernie4_5_moe" and cfg.get("use_bias", False):
        raise SystemExit("ernie4_5_moe: use_bias=true (linear biases) is not in the reference")
    pos = np.arange(T)
    inv_freq, att_scale = rope_parameters(cfg, T)
    interleaved = t == "ernie4_5_moe"
    window = 0
    if t in ("mistral", "mixtral") and cfg.get("sliding_window"):
        window = cfg["sliding_window"]
    layer_types = cfg.get("layer_types") or \
        ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(cfg["num_hidden_layers"])]
    if t == "dots1":
        if cfg.get("scoring_func", "noaux_tc") not in ("noaux_tc", "sigmoid"):
            raise SystemExit("dots1: only sigmoid scoring (noaux_tc) is in the reference")
        # Dots1Config: a window of sliding_window (4096 when absent, none when null) on the layers layer_types names,
        # by default those from max_window_layers on.
        dots_window = cfg.get("sliding_window", 4096)
        layer_types = cfg.get("layer_types") or \
            ["sliding_attention" if dots_window is not None and i >= cfg.get("max_window_layers", 62)
             else "full_attention" for i in range(cfg["num_hidden_layers"])]
    x = W["model.embed_tokens.weight"][np.asarray(tokens)]
    i_idx, j_idx = np.meshgrid(np.arange(T), np.arange(T), indexing="ij")
    causal = j_idx <= i_idx
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        if t == "gpt_oss":
            window = cfg["sliding_window"] if layer_types[l] == "sliding_attention" else 0
        if t == "dots1":
            window = (dots_window or 0) if layer_types[l] == "sliding_attention" else 0
        visible = causal & ((i_idx - j_idx) < window) if window else causal
        sinks = W.get(p + "self_attn.sinks")
        h = rms_norm(x, W[p + "input_layernorm.weight"], eps)
        if t in DEEPSEEK:
            x = x + mla_attention(cfg, W, p, h, pos, inv_freq, att_scale, visible)
            h = rms_norm(x, W[p + "post_attention_layernorm.weight"], eps)
            if is_sparse(cfg, l):
                y = (deepseek_v2_moe if t == "deepseek_v2" else deepseek_v3_moe)(cfg, W, p + "mlp.", h, l, trace)
            else:
                y = mlp(h, W[p + "mlp.gate_proj.weight"], W[p + "mlp.up_proj.weight"], W[p + "mlp.down_proj.weight"])
            x = x + y
            continue

        def proj(name):
            y = h @ W[p + f"self_attn.{name}_proj.weight"].T
            if p + f"self_attn.{name}_proj.bias" in W:
                y = y + W[p + f"self_attn.{name}_proj.bias"]
            return y

        q, k, v = proj("q"), proj("k"), proj("v")
        if t == "olmoe" or (t == "minimax_m2" and cfg.get("use_qk_norm", True)):  # over the whole projection
            q = rms_norm(q, W[p + "self_attn.q_norm.weight"], eps)
            k = rms_norm(k, W[p + "self_attn.k_norm.weight"], eps)
            if t == "olmoe" and cfg.get("clip_qkv"):
                c = cfg["clip_qkv"]
                q, k, v = np.clip(q, -c, c), np.clip(k, -c, c), np.clip(v, -c, c)
        q = q.reshape(T, nh, hd)
        k = k.reshape(T, nkv, hd)
        v = v.reshape(T, nkv, hd)
        if t in ("qwen3_moe", "dots1") or (t == "glm4_moe" and cfg.get("use_qk_norm", False)):
            q = rms_norm(q, W[p + "self_attn.q_norm.weight"], eps)
            k = rms_norm(k, W[p + "self_attn.k_norm.weight"], eps)
        q = apply_rope(q, pos, inv_freq, att_scale, interleaved)
        k = apply_rope(k, pos, inv_freq, att_scale, interleaved)
        if t == "hunyuan" and cfg.get("use_qk_norm"):  # after RoPE
            q = rms_norm(q, W[p + "self_attn.query_layernorm.weight"], eps)
            k = rms_norm(k, W[p + "self_attn.key_layernorm.weight"], eps)
        group = nh // nkv
        out = np.zeros((T, nh, hd))
        for head in range(nh):
            kh = head // group
            s = (q[:, head, :] @ k[:, kh, :].T) / math.sqrt(hd)
            s = np.where(visible, s, -np.inf)
            if sinks is not None:  # the sink takes part in the softmax, then its column is dropped
                probs = softmax(np.concatenate([s, np.full((T, 1), sinks[head])], axis=-1))[:, :-1]
            else:
                probs = softmax(s)
            out[:, head, :] = probs @ v[:, kh, :]
        a = out.reshape(T, nh * hd) @ W[p + "self_attn.o_proj.weight"].T
        if p + "self_attn.o_proj.bias" in W:
            a = a + W[p + "self_attn.o_proj.bias"]
        x = x + a
        h = rms_norm(x, W[p + "post_attention_layernorm.weight"], eps)
        if t == "gpt_oss":
            y = gpt_oss_moe(cfg, W, p + "mlp.", h, l, trace)
        elif t in ("glm4_moe", "dots1") and is_sparse(cfg, l):  # Dots1MoE is DeepseekV3MoE, GLM's router
            y = glm4_moe_moe(cfg, W, p + "mlp.", h, l, trace)
        elif t == "minimax_m2":
            y = minimax_m2_moe(cfg, W, p + "block_sparse_moe.", h, l, trace)
        elif t == "ernie4_5_moe" and is_sparse(cfg, l):
            y = ernie4_5_moe_moe(cfg, W, p + "mlp.", h, l, trace)
        elif is_sparse(cfg, l):
            if t == "mixtral":
                pre, ne, names = p + "block_sparse_moe.", cfg["num_local_experts"], ("w1", "w3", "w2")
                renorm = True
            else:
                pre, ne, names = p + "mlp.", cfg["num_experts"], ("gate_proj", "up_proj", "down_proj")
                renorm = bool(cfg.get("norm_topk_prob", False))
            k_top = cfg["num_experts_per_tok"]
            probs = softmax(h @ W[pre + ("gate.wg.weight" if t == "hunyuan" else "gate.weight")].T)
            y = np.zeros_like(h)
            for ti in range(T):
                order = np.argsort(-probs[ti], kind="stable")[:k_top]
                w = probs[ti][order]
                if renorm:
                    w = w / np.sum(w)
                if trace is not None:
                    trace.append({"position": ti, "layer": l, "experts": [int(e) for e in order],
                                  "weights": [float(z) for z in w]})
                for e, we in sorted(zip(order, w)):
                    ep = pre + f"experts.{e}."
                    y[ti] += we * mlp(h[ti:ti + 1], W[ep + names[0] + ".weight"], W[ep + names[1] + ".weight"],
                                      W[ep + names[2] + ".weight"])[0]
            if t == "qwen2_moe" and p + "mlp.shared_expert.gate_proj.weight" in W:
                sh = mlp(h, W[p + "mlp.shared_expert.gate_proj.weight"], W[p + "mlp.shared_expert.up_proj.weight"],
                         W[p + "mlp.shared_expert.down_proj.weight"])
                gate = 1.0 / (1.0 + np.exp(-(h @ W[p + "mlp.shared_expert_gate.weight"].T)))
                y = y + gate * sh
            if t == "hunyuan" and cfg.get("use_mixed_mlp_moe"):
                y = y + mlp(h, W[p + "mlp.shared_mlp.gate_proj.weight"], W[p + "mlp.shared_mlp.up_proj.weight"],
                            W[p + "mlp.shared_mlp.down_proj.weight"])
        else:
            y = mlp(h, W[p + "mlp.gate_proj.weight"], W[p + "mlp.up_proj.weight"], W[p + "mlp.down_proj.weight"])
        x = x + y
    x = rms_norm(x, W["model.norm.weight"], eps)
    head = W["lm_head.weight"] if "lm_head.weight" in W and not cfg.get("tie_word_embeddings", False) \
        else W["model.embed_tokens.weight"]
    return x @ head.T


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True, help="HF checkpoint directory (config.json + safetensors)")
    ap.add_argument("--tokens", required=True, help="comma-separated token ids")
    ap.add_argument("--out", required=True, help=".npy file for float64 logits [tokens x vocab]")
    ap.add_argument("--trace", help="JSONL routing trace")
    args = ap.parse_args()
    cfg, W = load_checkpoint(args.checkpoint)
    tokens = [int(x) for x in args.tokens.split(",") if x.strip()]
    trace = [] if args.trace else None
    logits = forward(cfg, W, tokens, trace)
    np.save(args.out, logits)
    if args.trace:
        with open(args.trace, "w", encoding="utf-8") as f:
            for r in trace:
                f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
