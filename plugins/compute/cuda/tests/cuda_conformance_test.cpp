// The compute conformance suite on the CUDA plugin. Without a usable device create() answers
// `unsupported` and the suite skips with the reason; cuda_plugin_test.cpp's RequiredDevice test
// fails instead when COLIBRI_REQUIRE_CUDA=1.
#include "colibri/sdk/testing/compute_conformance.hpp"
#include "cuda_plugin_path.hpp"

using colibri::sdk::testing::ComputeConformance;
using colibri::sdk::testing::ComputeParam;

// routed_experts on: the suite checks expert_ffn_routed too (it is off by default until measured on a GPU). And
// again with graphs on: every op captured, then launched by the copy that reads its outputs (or a buffer's end).
INSTANTIATE_TEST_SUITE_P(
    Cuda, ComputeConformance,
    ::testing::Values(ComputeParam{cuda_plugin_path(), {{"routed_experts", "true"}}, "device"},
                      ComputeParam{cuda_plugin_path(), {{"routed_experts", "true"}, {"graphs", "true"}}, "graphs"}),
    colibri::sdk::testing::ComputeParamName);
