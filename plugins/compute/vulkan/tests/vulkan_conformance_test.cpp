// The compute conformance suite on the Vulkan plugin, with device memory mapped into the host (how
// lavapipe and iGPUs run) and with every transfer forced through staging buffers (how a discrete
// GPU runs). Without a Vulkan device the suite skips; vulkan_plugin_test.cpp's RequiredDevice
// test fails instead when COLIBRI_REQUIRE_VULKAN=1.
#include "colibri/sdk/testing/compute_conformance.hpp"

using colibri::sdk::testing::ComputeConformance;
using colibri::sdk::testing::ComputeParam;

INSTANTIATE_TEST_SUITE_P(Vulkan, ComputeConformance,
                         ::testing::Values(ComputeParam{VULKAN_PLUGIN_PATH, {{"map_device_memory", "true"}}, "mapped"},
                                           ComputeParam{
                                               VULKAN_PLUGIN_PATH, {{"map_device_memory", "false"}}, "staging"}),
                         colibri::sdk::testing::ComputeParamName);
