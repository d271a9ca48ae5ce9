#include "colibri/sdk/testing/cache_conformance.hpp"

using colibri::sdk::testing::CacheConformance;
using colibri::sdk::testing::CacheParam;

INSTANTIATE_TEST_SUITE_P(Fifo, CacheConformance,
                         ::testing::Values(CacheParam{FIFO_PLUGIN_PATH, {}, "default"},
                                           CacheParam{FIFO_PLUGIN_PATH, {{"log_evictions", "true"}}, "logging"}),
                         colibri::sdk::testing::CacheParamName);
