#!/usr/bin/python3
"""The CUDA backend under the whole engine (ctest compute.cuda.engine, labels integration and cuda):

  cuda_engine_test.py COLIBRI_CLI FIXTURE_GENERATOR WORK_DIR

* every tiny architecture at f32, and every quantization preset (q4_0 is covered by the conformance suite only): `colibri-cli logits` with
  compute.backend=cuda against the CPU backend, within 1e-4 of the max-abs logit per position (f32 KV cache,
  exact activations: both backends compute the same sums in different orders), and the same greedy token;
* the one promise on CUDA: logits bit-identical in one batch, token by token and in chunks of 3;
* gpt_oss (attention_sinks, expert_ffn_clamped(_group)), also with MXFP4 experts: backend_engine.Engine.gpt_oss,
  against the CPU backend, its one promise, and every mxfp4 expert in the VRAM tier;
* the VRAM expert tier (Engine.vram_promise): bit-identical logits for one slot and a quarter of the experts x RAM
  cache x batch (fewer budgets than on Vulkan: each run creates a CUDA context, and gpu-check has 10 minutes), and
  its bench counters, all-in-VRAM included;
* compute.cpu_fallback: auto and its cost model (Engine.cpu_fallback);
* the KV cache in device memory (the default; Engine.kv_on_device): logits bit-identical to it in host memory;
* activations in device memory between ops (the default; Engine.activations_on_device): logits bit-identical to
  staging them per op;
* compute.routed_experts (expert_ffn_routed with every expert in VRAM; Engine.routed_experts) on mixtral and
  qwen2_moe (its gated shared expert; two, for gpu-check's 10 minutes): logits and routing records bit-identical to
  the engine routing, the routed op in decode, the same VRAM hits;
* compute.graphs (the ops between two waits as one CUDA graph; Engine.graphs) on mixtral: logits bit-identical to
  launching op by op with every expert in VRAM (routed or not), a quarter, and none, and graphs launched and updated;
* Qwen3-Next's, Qwen3.5-MoE's and Qwen3.5's gated-delta-rule layers (Engine.linear_attention), graphs off and on:
  against the CPU backend, and Qwen3-Next's logits bit-identical in one batch, token by token and in chunks of 3.

Exits 77 (ctest: skipped) when no CUDA device can be used, unless COLIBRI_REQUIRE_CUDA=1. The checks themselves
live in tests/support/backend_engine.py, shared with the Vulkan backend's test.
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "..", "tests",
                                "support"))
import backend_engine  # noqa: E402


def main():
    engine = backend_engine.Engine(*sys.argv[1:4], "cuda")
    skip = engine.probe("CUDA", "COLIBRI_REQUIRE_CUDA")
    if skip is not None:
        return skip
    cases = [(a, "f32") for a in backend_engine.ARCHS] + backend_engine.PRESETS + [("olmoe", "q6_k")]
    return backend_engine.report(engine.against_cpu(cases) + engine.batch_invariance() + engine.gpt_oss([]) +
                                 engine.vram_promise({"device": []}, [], budgets=("one", "quarter")) +
                                 engine.cpu_fallback([]) + engine.kv_on_device([]) +
                                 engine.activations_on_device([]) +
                                 engine.routed_experts([], on=["--set", "compute.routed_experts=true"],
                                                       archs=("mixtral", "qwen2_moe")) +
                                 engine.graphs(["--set", "compute.graphs=true"]) +
                                 engine.linear_attention(((), ("--set", "compute.graphs=true"))))


if __name__ == "__main__":
    sys.exit(main())
