// The compute conformance suite: every op of compute.hpp against the float64 reference
// (reference_ops.hpp) on odd shapes, the batch- and thread-invariance promise, and clear errors
// for wrong shapes and unsupported types. Instantiate it for your plugin:
//
//   INSTANTIATE_TEST_SUITE_P(MyCompute, ComputeConformance,
//       ::testing::Values(colibri::sdk::testing::ComputeParam{"/path/libcolibri-compute-mine.so", {}}),
//       colibri::sdk::testing::ComputeParamName);
//
// Ops or types a plugin does not claim through supports() are skipped, not failed. A plugin whose
// create() answers `unsupported` (e.g. an instruction set this CPU lacks) skips the whole suite.
// The suite sets the canonical `threads` option itself (1 and 2) for the thread-invariance test.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <ostream>
#include <string>

namespace colibri::sdk::testing {

struct ComputeParam {
  std::string library;                         // path of the plugin .so
  std::map<std::string, std::string> options;  // its section of the profile, as text
  std::string label = "default";               // test-name suffix
};

std::string ComputeParamName(const ::testing::TestParamInfo<ComputeParam>& info);
// Test logs show "<library file> [label]" instead of the struct's bytes.
inline void PrintTo(const ComputeParam& p, std::ostream* os) {
  *os << p.library << " [" << p.label << "]";
}

class ComputeConformance : public ::testing::TestWithParam<ComputeParam> {};

// Referenced by the instantiation so the linker keeps the suite's object file.
int compute_conformance_anchor();

}  // namespace colibri::sdk::testing
