#include "colibri/sdk/testing/compute_conformance.hpp"

using colibri::sdk::testing::ComputeConformance;
using colibri::sdk::testing::ComputeParam;

INSTANTIATE_TEST_SUITE_P(Scalar, ComputeConformance, ::testing::Values(ComputeParam{SCALAR_PLUGIN_PATH, {}}),
                         colibri::sdk::testing::ComputeParamName);
