// The compute conformance suite on every kernel path of the cpu plugin; a path this CPU cannot
// run is skipped (create() answers `unsupported`).
#include "colibri/sdk/testing/compute_conformance.hpp"

using colibri::sdk::testing::ComputeConformance;
using colibri::sdk::testing::ComputeParam;

INSTANTIATE_TEST_SUITE_P(
    Cpu, ComputeConformance,
    ::testing::Values(ComputeParam{CPU_PLUGIN_PATH, {{"isa", "scalar"}}, "scalar"},
                      ComputeParam{CPU_PLUGIN_PATH, {{"isa", "avx2"}}, "avx2"},
                      ComputeParam{CPU_PLUGIN_PATH, {{"isa", "avxvnni"}}, "avxvnni"},
                      ComputeParam{CPU_PLUGIN_PATH, {{"isa", "avx512"}}, "avx512"},
                      // Both q6_K decode paths on any CPU (auto picks one by vendor).
                      ComputeParam{CPU_PLUGIN_PATH, {{"isa", "avx512"}, {"q6k_decode", "rows"}}, "avx512_q6k_rows"},
                      ComputeParam{CPU_PLUGIN_PATH, {{"isa", "avx2"}, {"q6k_decode", "dot"}}, "avx2_q6k_dot"},
                      ComputeParam{CPU_PLUGIN_PATH, {{"isa", "auto"}, {"threads", "2"}}, "auto"}),
    colibri::sdk::testing::ComputeParamName);
