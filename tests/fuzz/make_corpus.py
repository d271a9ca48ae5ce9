#!/usr/bin/env python3
"""Writes the seed inputs of the fuzz targets into corpus/<target>/ (committed; rerun after changing a seed).

Usage: tests/fuzz/make_corpus.py [--manifests DIR...]
  --manifests: colibri model directories whose manifest.json become model_json and model_dir seeds (the committed
               ones came from the model integration test's converted tiny models, build/<preset>/tests/integration/
               model/work/*/out/, in this order: mixtral from st, gpt_oss from st, gpt-oss gpt_oss-mxfp4,
               qwen3_moe from st, qwen2_moe from st, olmoe q8 st, llama q8 st, quant q4_k_m, quant q2_k).
Seeds are small, valid inputs of each reader, written by hand here, so that mutations start deep inside the format.
Needs python3-numpy (it imports tests/fixtures/make_tiny_model.py for GPT-2's byte alphabet).
"""
import argparse
import json
import pathlib
import struct
import sys

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "tests" / "fixtures"))
from make_tiny_model import bytes_to_unicode  # noqa: E402
CORPUS = HERE / "corpus"


def put(target, name, data):
    d = CORPUS / target
    d.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    (d / name).write_bytes(data)


# --- GGUF -------------------------------------------------------------------------------------------------------
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)


def gstr(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def gval(t, v):
    fmt = {U8: "B", I8: "b", U16: "H", I16: "h", U32: "I", I32: "i", F32: "f", BOOL: "?", U64: "Q", I64: "q",
           F64: "d"}
    if t == STR:
        return gstr(v)
    if t == ARR:
        et, items = v
        return struct.pack("<IQ", et, len(items)) + b"".join(gval(et, x) for x in items)
    return struct.pack("<" + fmt[t], v)


def gguf(kvs, tensors=(), alignment=32):
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs))
    for k, t, v in kvs:
        out += gstr(k) + struct.pack("<I", t) + gval(t, v)
    data = b""
    for name, dims, ggml_type, payload in tensors:
        while len(data) % alignment:
            data += b"\0"
        out += gstr(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", ggml_type, len(data))
        data += payload
    while len(out) % alignment:
        out += b"\0"
    return out + data


def moe_hparams(arch):
    return [("general.architecture", STR, arch), (arch + ".block_count", U32, 2),
            (arch + ".context_length", U32, 4096), (arch + ".embedding_length", U32, 64),
            (arch + ".attention.head_count", U32, 4), (arch + ".attention.head_count_kv", U32, 2),
            (arch + ".attention.key_length", U32, 16), (arch + ".expert_count", U32, 4),
            (arch + ".expert_used_count", U32, 2), (arch + ".expert_feed_forward_length", U32, 32),
            (arch + ".rope.freq_base", F32, 1000000.0), (arch + ".attention.layer_norm_rms_epsilon", F32, 1e-6)]


def byte_level_chars():
    """GPT-2's byte-level alphabet, in make_tiny_model's order."""
    return list(bytes_to_unicode().values())


def gguf_seeds():
    every = [("general.name", STR, "seed"), ("k.u8", U8, 7), ("k.i8", I8, -7), ("k.u16", U16, 700),
             ("k.i16", I16, -700), ("k.u32", U32, 70000), ("k.i32", I32, -70000), ("k.f32", F32, 0.5),
             ("k.bool", BOOL, True), ("k.u64", U64, 1 << 40), ("k.i64", I64, -(1 << 40)), ("k.f64", F64, 0.25),
             ("k.arr.i32", ARR, (I32, [1, -2, 3])), ("k.arr.str", ARR, (STR, ["a", "bc"])),
             ("k.arr.arr", ARR, (ARR, [(U8, [1, 2]), (U8, [3])])), ("general.alignment", U32, 32)]
    f32 = struct.pack("<8f", *range(8))
    q8_0 = struct.pack("<e", 0.5) + bytes(range(32))  # one Q8_0 block
    put("gguf", "every_value_type.gguf", gguf(every, [("a.weight", [4, 2], 0, f32), ("b.weight", [32], 8, q8_0)]))

    chars = byte_level_chars()
    tokens = chars + ["Ġt", "he", "Ġthe", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    types = [1] * (len(tokens) - 3) + [3, 3, 3]
    put("gguf", "qwen3moe_gpt2_tokenizer.gguf", gguf(moe_hparams("qwen3moe") + [
        ("tokenizer.ggml.model", STR, "gpt2"), ("tokenizer.ggml.pre", STR, "qwen2"),
        ("tokenizer.ggml.tokens", ARR, (STR, tokens)), ("tokenizer.ggml.token_type", ARR, (I32, types)),
        ("tokenizer.ggml.merges", ARR, (STR, ["Ġ t", "h e", "Ġt he"])),
        ("tokenizer.ggml.bos_token_id", U32, len(tokens) - 3), ("tokenizer.ggml.eos_token_id", U32, len(tokens) - 1),
        ("tokenizer.chat_template", STR, "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
                                         "<|im_end|>\n{% endfor %}")]))

    pieces = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)] + ["▁", "▁t", "he", "▁the", "e", "h"]
    scores = [0.0] * 259 + [-1.0, -2.0, -3.0, -4.0, -5.0, -6.0]
    ptypes = [2, 3, 3] + [6] * 256 + [1] * 6
    put("gguf", "mixtral_llama_tokenizer.gguf", gguf(moe_hparams("llama") + [
        ("tokenizer.ggml.model", STR, "llama"), ("tokenizer.ggml.tokens", ARR, (STR, pieces)),
        ("tokenizer.ggml.scores", ARR, (F32, scores)), ("tokenizer.ggml.token_type", ARR, (I32, ptypes)),
        ("tokenizer.ggml.bos_token_id", U32, 1), ("tokenizer.ggml.eos_token_id", U32, 2),
        ("tokenizer.ggml.add_bos_token", BOOL, True)]))


# --- safetensors ------------------------------------------------------------------------------------------------
def safetensors(tensors, metadata=None):
    header, data = {}, b""
    for name, dtype, shape, payload in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(payload)]}
        data += payload
    if metadata is not None:
        header["__metadata__"] = metadata
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


def safetensors_seeds():
    put("safetensors", "two_tensors.safetensors", safetensors(
        [("model.embed_tokens.weight", "BF16", [2, 2], b"\x80\x3f" * 4), ("lm_head.weight", "F32", [3], b"\0" * 12)],
        {"format": "pt"}))
    put("safetensors", "mxfp4_blocks.safetensors", safetensors(
        [("model.layers.0.mlp.experts.gate_up_proj_blocks", "U8", [1, 2, 1, 16], bytes(32)),
         ("model.layers.0.mlp.experts.gate_up_proj_scales", "U8", [1, 2, 1], b"\x7f\x7f"),
         ("empty", "F16", [0], b"")]))


# --- model JSON files -------------------------------------------------------------------------------------------
HF_CONFIGS = {
    "mixtral": {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "vocab_size": 384,
                "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 2, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
                "rope_theta": 1000000.0, "num_local_experts": 8, "num_experts_per_tok": 2, "sliding_window": None,
                "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "bfloat16"},
    "qwen3_moe": {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": 384,
                  "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
                  "num_key_value_heads": 2, "head_dim": 64, "max_position_embeddings": 40960, "rms_norm_eps": 1e-6,
                  "rope_theta": 1000000.0, "rope_scaling": None, "moe_intermediate_size": 256,
                  "num_experts_per_tok": 2, "num_experts": 8, "norm_topk_prob": True, "decoder_sparse_step": 1,
                  "mlp_only_layers": [], "tie_word_embeddings": False, "bos_token_id": 352, "eos_token_id": 353},
    "gpt_oss": {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "vocab_size": 384,
                "hidden_size": 256, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 2, "head_dim": 64, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
                "rope_theta": 150000, "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
                                                       "beta_slow": 1.0, "original_max_position_embeddings": 4096},
                "num_local_experts": 8, "num_experts_per_tok": 2, "sliding_window": 128,
                "layer_types": ["sliding_attention", "full_attention"], "swiglu_limit": 7.0,
                "tie_word_embeddings": False, "eos_token_id": 200002},
    "qwen2_moe": {"architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "vocab_size": 384,
                  "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
                  "num_key_value_heads": 4, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
                  "rope_theta": 1000000.0, "moe_intermediate_size": 128, "shared_expert_intermediate_size": 256,
                  "num_experts_per_tok": 2, "num_experts": 8, "norm_topk_prob": False, "decoder_sparse_step": 1,
                  "mlp_only_layers": [], "tie_word_embeddings": False},
    "glm4_moe": {"architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe", "vocab_size": 384,
                 "hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 128, "num_hidden_layers": 3,
                 "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 128, "partial_rotary_factor": 0.5,
                 "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 1000000.0,
                 "attention_bias": True, "use_qk_norm": False, "n_routed_experts": 8, "num_experts_per_tok": 2,
                 "n_shared_experts": 1, "routed_scaling_factor": 2.5, "n_group": 1, "topk_group": 1,
                 "first_k_dense_replace": 1, "norm_topk_prob": True, "num_nextn_predict_layers": 1,
                 "tie_word_embeddings": False, "eos_token_id": [353, 354]},
    "minimax_m2": {"architectures": ["MiniMaxM2ForCausalLM"], "model_type": "minimax_m2", "vocab_size": 384,
                   "hidden_size": 256, "intermediate_size": 128, "num_hidden_layers": 3, "num_attention_heads": 4,
                   "num_key_value_heads": 2, "head_dim": 128, "rotary_dim": 64, "max_position_embeddings": 196608,
                   "rms_norm_eps": 1e-6, "rope_theta": 5000000, "num_local_experts": 8, "num_experts_per_tok": 2,
                   "scoring_func": "sigmoid", "use_routing_bias": True, "use_qk_norm": True,
                   "qk_norm_type": "per_layer", "attn_window_size": None, "attn_type_list": [1, 1, 1],
                   "tie_word_embeddings": False},
    "dots1": {"architectures": ["Dots1ForCausalLM"], "model_type": "dots1", "vocab_size": 384, "hidden_size": 256,
              "intermediate_size": 384, "moe_intermediate_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4,
              "num_key_value_heads": 4, "max_position_embeddings": 32768, "rms_norm_eps": 1e-5,
              "rope_theta": 10000000.0, "attention_bias": False, "n_routed_experts": 8, "n_shared_experts": 2,
              "num_experts_per_tok": 3, "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1,
              "scoring_func": "noaux_tc", "norm_topk_prob": True, "routed_scaling_factor": 2.5, "sliding_window": 4,
              "max_window_layers": 1, "tie_word_embeddings": False},
    "bailing_moe_v2": {"architectures": ["BailingMoeV2ForCausalLM"], "model_type": "bailing_moe_v2",
                       "vocab_size": 384, "hidden_size": 256, "intermediate_size": 384, "moe_intermediate_size": 64,
                       "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
                       "partial_rotary_factor": 0.5, "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
                       "rope_theta": 600000, "use_qkv_bias": False, "use_bias": False, "use_qk_norm": True,
                       "num_experts": 16, "num_shared_experts": 1, "num_experts_per_tok": 4, "n_group": 4,
                       "topk_group": 2, "score_function": "sigmoid", "norm_topk_prob": True,
                       "routed_scaling_factor": 2.5, "first_k_dense_replace": 1, "num_nextn_predict_layers": 0,
                       "tie_word_embeddings": False},
    "hunyuan_moe": {"architectures": ["HunYuanMoEV1ForCausalLM"], "model_type": "hunyuan", "vocab_size": 384,
                    "hidden_size": 256, "intermediate_size": 64, "moe_intermediate_size": [64, 64, 64],
                    "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
                    "attention_head_dim": 64, "max_position_embeddings": 32768, "rms_norm_eps": 1e-5,
                    "rope_theta": 10000.0, "rope_scaling": {"alpha": 1000.0, "factor": 1.0, "type": "dynamic"},
                    "num_experts": 8, "moe_topk": [3, 3, 3], "num_shared_expert": [1, 1, 1],
                    "use_mixed_mlp_moe": True, "use_qk_norm": True, "use_cla": False, "use_mla": False,
                    "tie_word_embeddings": True},
    "qwen3_vl_moe": {"architectures": ["Qwen3VLMoeForConditionalGeneration"], "model_type": "qwen3_vl_moe",
                     "tie_word_embeddings": False, "vision_config": {"depth": 1, "deepstack_visual_indexes": [0]},
                     "text_config": {"model_type": "qwen3_vl_moe_text", "vocab_size": 384, "hidden_size": 256,
                                     "intermediate_size": 384, "moe_intermediate_size": 64, "num_hidden_layers": 3,
                                     "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
                                     "num_experts": 8, "num_experts_per_tok": 2, "decoder_sparse_step": 1,
                                     "mlp_only_layers": [], "max_position_embeddings": 262144, "rms_norm_eps": 1e-6,
                                     "rope_theta": 5000000, "rope_scaling": {"mrope_interleaved": True,
                                                                             "mrope_section": [12, 10, 10],
                                                                             "rope_type": "default"}}},
}


def model_json_seeds(manifest_dirs):
    for name, config in HF_CONFIGS.items():
        put("model_json", "config_" + name + ".json", b"\x01" + json.dumps(config, indent=1).encode())
    for d in manifest_dirs:
        d = pathlib.Path(d)
        text = (d / "manifest.json").read_bytes()
        put("model_json", "manifest_" + d.name.replace(" ", "_") + ".json", b"\x00" + text)


# model_dir: a mode byte (bit 0 keeps the manifest's checksums; (bits 1-5) % 3 picks small values, random bytes or
# zeros for the files; bit 6 streams experts through a two-slot cache), a seed byte, a token count byte, then the
# manifest, compacted.
MODEL_DIR_MODES = {"": 0x00, "_streaming": 0x40, "_random": 0x02, "_zeros": 0x04, "_kept_sums": 0x01}


def model_dir_seeds(manifest_dirs):
    for i, d in enumerate(manifest_dirs):
        d = pathlib.Path(d)
        text = json.dumps(json.loads((d / "manifest.json").read_text()), separators=(",", ":")).encode()
        name = d.name.replace(" ", "_").replace("-", "_")
        # Every mode on the first model, the plain one on the rest.
        for suffix, mode in MODEL_DIR_MODES.items() if i == 0 else [("", 0x00)]:
            put("model_dir", name + suffix + ".json", bytes([mode, 7, 3]) + text)
    # Edit mode (bit 7): a fourth byte picks a base manifest (the corpus's plain-mode seeds, by name, not the found_
    # and regress_ inputs), then edits of four bytes follow (none here).
    bases = sorted(p for p in (CORPUS / "model_dir").iterdir()
                   if p.read_bytes()[:1] == b"\x00" and not p.name.startswith(("found_", "regress_")))
    for i, p in enumerate(bases):
        put("model_dir", "edit_" + p.name, bytes([0x80, 7, 3, i]))


# --- chat templates ---------------------------------------------------------------------------------------------
TEMPLATES = {
    "features.jinja": """{%- macro show(m, loud=false) -%}{{ m.role | upper if loud else m.role }}: {{ m.content | trim }}{%- endmacro -%}
{%- set ns = namespace(n=0, last='') -%}
{%- for m in messages if m.role != 'tool' -%}
{%- set ns.n = ns.n + 1 -%}{%- set ns.last = m.role -%}
{{ loop.index }}/{{ loop.length }} {{ show(m, loop.first) }}{% if not loop.last %}\n{% endif %}
{%- if m.content is string and m.content.startswith('What') %} [q]{% elif m.content is none %} [none]{% else %} [{{ m.content | length }}]{% endif %}
{%- endfor -%}
{%- if tools is defined and tools %}\nTools: {{ tools | map(attribute='function') | map(attribute='name') | join(', ') }} {{ tools[0] | tojson }}{% endif %}
{%- set pair = ('a', 'b') %}{% set x, y = pair %}{{ x ~ y }}{{ '%d-%s' % (ns.n, ns.last) }}{{ messages[-1:] | length }}
{{ "a,b,c".split(",")[1:] | join("|") }}{{ range(3) | list }}{{ {'k': 1}.items() | list }}{{ 7 // 2 }}{{ 7 % 3 }}{{ 2 ** 10 }}
{%- if add_generation_prompt %}{{ bos_token }}assistant:{% endif %}""",
    "raise.jinja": """{% for m in messages %}{% if m.role not in ['system', 'user', 'assistant', 'tool'] %}{{ raise_exception('bad role ' + m.role) }}{% endif %}{% endfor %}{{ messages | selectattr('role', 'equalto', 'user') | list | length }}""",
    "loops.jinja": """{% for i in range(5) %}{% if i == 3 %}{% break %}{% endif %}{% if i is even %}{% continue %}{% endif %}{{ i }}{% else %}empty{% endfor %}{% set s %}block {{ eos_token }}{% endset %}{{ s | replace('block', 'B') }}{{ enable_thinking | default(true) }}""",
}


def chat_template_seeds():
    conversations = json.loads((ROOT / "tests/data/chat/conversations.json").read_text())["cases"]
    first = json.dumps(conversations[0]["messages"]).encode()
    tool_case = next((c for c in conversations if "tool" in c["name"]), conversations[-1])
    for path in sorted((ROOT / "tests/data/chat/builtin").glob("*.jinja")):
        put("chat_template", "builtin_" + path.stem, path.read_bytes() + b"\0" + first)
    for name, text in TEMPLATES.items():
        put("chat_template", name, text.encode() + b"\0" + json.dumps(tool_case["messages"]).encode())


# --- model output: tool calls, reasoning, harmony ---------------------------------------------------------------
def chat_output_seeds():
    seeds = {
        0: 'Sure.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}\n</tool_call>\n'
           '<tool_call>\n{"name": "add", "arguments": {"a": 1.5e3, "b": "x\\"y"}}\n</tool_call>',
        1: '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "f", "arguments": "{}"}]',
        2: 'Let me look.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n'
           '{"city": "Paris"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
        3: '{"name": "get_weather", "arguments": {"city": "Paris"}}',
        4: '{"city": "Paris", "units": {"temp": "C"}, "list": [true, false, null]}',
        5: '<think>\nThe user wants 2+2.\n</think>\n\nIt is 4.',
        6: 'still thinking</think>Answer <think>not a tag here</think>',
        # The fuzzer picks by mode % 9, and harmony's tools by bit 0x10: 25 is harmony with tools (7 | 0x10 was 5).
        25: '<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary '
            'to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>',
        # 72 (0 with bit 0x40): Llama 3.x / 4's bare JSON calls.
        72: '<|python_start|>{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "f", '
            '"parameters": {}}<|python_end|> then text',
        # 36 (0 with bit 0x20): vLLM's pythonic calls, the whole answer one Python list of them.
        36: '<|python_start|>[get_weather(city=\'Paris\', days=[1, 2], extra={"a": None}), get_time(zone="CET", '
            'h24=True)]<|python_end|>',
        8: 'Hello there.<|end|><|start|>assistant<|channel|>analysis<|message|>hm<|end|>'
           '<|start|>assistant<|channel|>final<|message|>Bye<|return|>',
    }
    for mode, text in seeds.items():
        for seed in (0, 7):
            put("chat_output", "mode%d_cut%d.txt" % (mode, seed), bytes([mode, seed]) + text.encode())


# --- request bodies ---------------------------------------------------------------------------------------------
def api_request_seeds():
    bodies = {
        0: {"model": "m", "messages": [{"role": "system", "content": "Be brief."},
                                       {"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
            "max_tokens": 16, "temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "seed": 1, "n": 2,
            "stop": ["\n\n", "END"], "stream": True, "stream_options": {"include_usage": True}, "logprobs": True,
            "top_logprobs": 3, "presence_penalty": 0.5, "frequency_penalty": 0.5, "repetition_penalty": 1.1,
            "logit_bias": {"42": -100}, "user": "u",
            "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {
                "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}}, "parallel_tool_calls": False,
            "chat_template_kwargs": {"enable_thinking": False}},
        1: {"model": "m", "prompt": "Once upon a time", "max_tokens": 8, "echo": True, "suffix": "end",
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
                "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}},
            "min_tokens": 2, "ignore_eos": True},
        2: {"model": "m", "messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": True},
        3: {"tokens": [1, 2, 3], "model": "m"},
        4: {"experts": ["0:1", "1:3"]},
        5: {},
        6: "3:1",
    }
    for which, body in bodies.items():
        text = body if isinstance(body, str) else json.dumps(body)
        put("api_request", "which%d.json" % which, bytes([which]) + text.encode())
    put("api_request", "which0_deep.json", b"\x00" + b'{"messages": ' + b"[" * 70 + b"]" * 70 + b"}")
    put("api_request", "which2_prompt.json", b"\x02" + b'{"prompt": "Hello", "add_special_tokens": false}')
    put("api_request", "which4_top.json", b"\x04" + b'{"top": 5}')


# --- JSON mode --------------------------------------------------------------------------------------------------
def json_constraint_seeds():
    put("json_constraint", "plain.txt", b"\x00" + b'{"a": [1, -2.5e+10, true, null, "x\\u00e9\\n", {"b": {}}], "c": []}')
    schema = {"type": "object", "properties": {
        "name": {"type": "string"}, "age": {"type": "integer"}, "tags": {"type": "array", "items": {"enum": ["a", "b"]},
                                                                         "minItems": 1, "maxItems": 2},
        "kind": {"anyOf": [{"type": "string"}, {"type": "null"}]}, "next": {"$ref": "#/$defs/node"},
        "score": {"type": "number"}, "ok": {"const": True}},
        "required": ["name", "age"], "$defs": {"node": {"type": "object", "properties": {
            "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}}}}}
    text = '{"name": "Ann", "age": 42, "tags": ["a"], "kind": null, "next": {"next": null}, "score": 0.5, "ok": true}'
    put("json_constraint", "schema.txt", b"\x01" + json.dumps(schema).encode() + b"\0" + text.encode())
    mapping = {"type": "object", "additionalProperties": {"type": ["integer", "string"]}}
    put("json_constraint", "map.txt", b"\x01" + json.dumps(mapping).encode() + b"\0" + b'{"x": 1, "y": "z"}')
    # Mode 3: compiled leniently, as a forced tool call's parameters (pattern and minimum left unenforced).
    tool = {"type": "object", "properties": {"city": {"type": "string", "pattern": "^[A-Z]"},
                                             "days": {"type": "integer", "minimum": 1}},
            "required": ["city", "days"], "additionalProperties": True}
    put("json_constraint", "lenient.txt", b"\x03" + json.dumps(tool).encode() + b"\0" + b'{"city": "oslo", "days": 0}')


# --- tokenizers -------------------------------------------------------------------------------------------------
def tokenizer_json_seeds():
    chars = byte_level_chars()
    vocab = {c: i for i, c in enumerate(chars)}
    for m in ["Ġt", "he", "Ġthe", "ll", "llo"]:
        vocab[m] = len(vocab)
    byte_level = {
        "version": "1.0",
        "added_tokens": [{"id": len(vocab), "content": "<|endoftext|>", "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": "(?i:'s|'t)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+|\\s+"},
             "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
        "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}},
                                                                     {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [len(vocab)],
                                                                "tokens": ["<|endoftext|>"]}}},
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": ["Ġ t", "h e", "Ġt he", "l l", "ll o"]},
    }
    put("tokenizer_json", "byte_level_bpe.json", json.dumps(byte_level))
    sp_vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        sp_vocab["<0x%02X>" % b] = len(sp_vocab)
    for p in ["▁", "▁t", "he", "▁the", "e", "h", "t", "l", "o", "▁w", "or", "ld"]:
        sp_vocab[p] = len(sp_vocab)
    sentencepiece = {
        "version": "1.0",
        "added_tokens": [{"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for c, i in [("<unk>", 0), ("<s>", 1), ("</s>", 2)]],
        "normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"},
                                                           {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
        "pre_tokenizer": None,
        "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                                                     {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [{"Sequence": {"id": "A", "type_id": 0}}],
                           "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
        "decoder": {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
                                                     {"type": "ByteFallback"}, {"type": "Fuse"},
                                                     {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": sp_vocab, "merges": ["▁ t", "h e", "▁t he", "▁ w", "o r", "l d"]},
    }
    put("tokenizer_json", "sentencepiece_bpe.json", json.dumps(sentencepiece))


def tokenizer_encode_seeds():
    texts = ["Hello world! It's 2024: café, naïve, 日本語のテキスト, 한국어, emoji 😀👍🏽, tabs\tand\nnewlines  ",
             "<|im_start|>user\nHi<|im_end|>\n<s>[INST] x [/INST]</s><|begin_of_text|><|endoftext|>",
             "def f(x):\n    return x**2  # comment\n\n\n    \r\n1234567890 3.14159 -0.5e10",
             "\u0301\u200b\u00a0\ufeff\U0001F600 mixed ＡＢＣ ﬁ Å Å"]
    for i, text in enumerate(texts):
        for choice in range(7):
            put("tokenizer_encode", "text%d_tok%d.txt" % (i, choice), bytes([choice | (0x80 if i == 1 else 0)])
                + text.encode())
    put("tokenizer_encode", "invalid_utf8.txt", b"\x01abc\xff\xfe\xc3(\xe2\x82 \xf0\x9f\x98 end")


def profile_seeds():
    for path in sorted((ROOT / "configs/profiles").glob("*.yaml")):
        put("profile", path.name, path.read_bytes())
    put("profile", "override.yaml", (ROOT / "configs/profiles/cpu.yaml").read_bytes() + b"\0compute.threads=4")
    put("profile", "anchors.yaml", b"base: &b\n  ram_budget: 8G\ncache: *b\nstorage: {plugin: pread, queue_depth: [1, 2]}\n"
                                  b"\0storage.plugin=io_uring")


# --- routing traces and the usage history ----------------------------------------------------------------------
def trace_files_seeds():
    put("trace_files", "trace.jsonl", b"\x00" + b'{"request": 0, "position": 5, "token": 1234, "layer": 3, "step": 17, '
        b'"experts": [7, 2], "weights": [0.61, 0.39]}\n{"position": 6, "layer": 0, "experts": [1]}\n')
    put("trace_files", "trace.csv", b"\x01" + b"request,position,layer,expert,weight,token,step\n0,0,0,3,0.5,11,0\n"
        b"0,0,0,1,0.5,11,0\n0,1,1,2,1.0,12,1\n")
    put("trace_files", "trace_layers_only.csv", b"\x01" + b"layer,expert\n0,1\n1,7\n")
    put("trace_files", "trace.json", b"\x02" + b'[{"layer": 0, "experts": [1, 2], "weights": [0.75, 0.25]}, '
        b'{"request": 1, "position": 3, "layer": 1, "experts": [0], "token": 5, "step": 2}]')
    put("trace_files", "usage.json", b"\x03" + b'{"version": 1, "model": "00112233aabbccdd", "counts": {"0:1": 12, '
        b'"3:7": 1}}')


# --- inputs that once found a bug (each also has a unit test naming it) -------------------------------------------
def regression_seeds():
    put("json_constraint", "regress_number_dead_end.txt", b"\x00" + b'{"a": ' + b"1" * 63 + b'.5, "b": 1' + b"2" * 63
        + b'e+1}')
    put("json_constraint", "regress_lone_surrogate.txt", b"\x00" + b'{"a": "\\udc00\\ud83d\\ude00\\ud800x"}')
    put("chat_output", "regress_harmony_header_start.txt",
        bytes([8, 7]) + b"Hi.<|end|>assistant<|channel|>final<|message|>Bye")
    put("chat_output", "regress_harmony_long_header.txt",
        bytes([7, 3]) + b"<|channel|>final" + b"x" * 500 + b"<|message|>hi<|end|>")
    # Mixtral (the sixth shipped tokenizer): U+FFFD tokens, then a character in byte tokens.
    put("tokenizer_encode", "regress_replacement_tokens.txt", bytes([5]) + b"a\xff\xff\xff\xff\xef\xbc\xa3 b")
    chars = byte_level_chars()
    vocab = {c: i for i, c in enumerate(chars)}
    vocab["\u0120t"] = 300  # ids 256-299 unused
    gap = {"version": "1.0", "added_tokens": [{"id": 301, "content": "<|endoftext|>", "single_word": False,
                                               "lstrip": False, "rstrip": False, "normalized": False,
                                               "special": True}],
           "normalizer": None, "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                                                  "use_regex": True},
           "post_processor": None, "decoder": {"type": "ByteLevel"},
           "model": {"type": "BPE", "vocab": vocab, "merges": ["\u0120 t"]}}
    put("tokenizer_json", "regress_vocab_gap.json", json.dumps(gap))
    put("profile", "regress_lone_comma.yaml", b",")


# --- HTTP: raw requests to colibri-server (model "tiny") --------------------------------------------------------
def http_request(method, target, body=None, headers=(), chunked=False):
    lines = [method + " " + target + " HTTP/1.1", "Host: localhost"] + list(headers)
    data = b""
    if body is not None:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        lines.append("Content-Type: application/json")
        if chunked:
            lines.append("Transfer-Encoding: chunked")
            half = len(raw) // 2
            data = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in (raw[:half], raw[half:]) if p) + b"0\r\n\r\n"
        else:
            lines.append("Content-Length: " + str(len(raw)))
            data = raw
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + data


def http_seeds():
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "seed": 1}
    put("http", "health.txt", http_request("GET", "/health"))
    put("http", "models.txt", http_request("GET", "/v1/models/tiny?x=1"))
    put("http", "metrics.txt", http_request("GET", "/metrics"))
    put("http", "http_1_0.txt", b"GET /v1/models HTTP/1.0\r\nHost: localhost\r\n\r\n")  # answered in HTTP/1.0
    put("http", "chat.txt", http_request("POST", "/v1/chat/completions", chat))
    put("http", "chat_stream_chunked.txt",
        http_request("POST", "/v1/chat/completions", dict(chat, stream=True, n=2, logprobs=True, top_logprobs=2),
                     chunked=True))
    put("http", "chat_json_mode.txt",
        http_request("POST", "/v1/chat/completions", dict(chat, response_format={"type": "json_object"})))
    put("http", "completions.txt",
        http_request("POST", "/v1/completions",
                     {"model": "tiny", "prompt": "ab", "max_tokens": 3, "echo": True, "logprobs": 1, "stop": ["x"]}))
    put("http", "tokenize.txt", http_request("POST", "/tokenize", {"model": "tiny", "prompt": "hello"}))
    put("http", "detokenize.txt", http_request("POST", "/detokenize", {"model": "tiny", "tokens": [104, 105]}))
    put("http", "cache_stats.txt", http_request("GET", "/admin/cache/stats"))
    put("http", "cache_warm.txt", http_request("POST", "/admin/cache/warm", {"experts": ["0:1", "1:0"]}))
    put("http", "cache_clear.txt", http_request("POST", "/admin/cache/clear", {}))
    put("http", "preflight.txt",
        http_request("OPTIONS", "/v1/chat/completions",
                     headers=["Origin: http://app.example", "Access-Control-Request-Method: POST"]))
    put("http", "pipelined.txt",
        http_request("GET", "/health") + http_request("POST", "/tokenize", {"model": "tiny", "prompt": "a"}) +
        http_request("DELETE", "/v1/models"))
    # A transfer coding the body's end cannot be known by: refused and closed, the bytes after never run.
    put("http", "transfer_gzip.txt",
        b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: gzip\r\n\r\n" +
        http_request("GET", "/v1/models"))
    put("http", "expect_continue.txt",
        http_request("POST", "/v1/completions", {"model": "tiny", "prompt": "a", "max_tokens": 1},
                     headers=["Expect: 100-continue", "Connection: keep-alive"]))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--manifests", nargs="*", default=[])
    args = parser.parse_args()
    gguf_seeds()
    safetensors_seeds()
    model_json_seeds(args.manifests)
    model_dir_seeds(args.manifests)
    chat_template_seeds()
    chat_output_seeds()
    api_request_seeds()
    json_constraint_seeds()
    tokenizer_json_seeds()
    tokenizer_encode_seeds()
    profile_seeds()
    trace_files_seeds()
    http_seeds()
    regression_seeds()


if __name__ == "__main__":
    main()
