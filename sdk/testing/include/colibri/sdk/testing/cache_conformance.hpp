// The cache-policy conformance suite. Instantiate it for your plugin:
//
//   INSTANTIATE_TEST_SUITE_P(MyPolicy, CacheConformance,
//       ::testing::Values(colibri::sdk::testing::CacheParam{"/path/libcolibri-cache-mine.so", {}}),
//       colibri::sdk::testing::CacheParamName);
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <ostream>
#include <string>

namespace colibri::sdk::testing {

struct CacheParam {
  std::string library;
  std::map<std::string, std::string> options;
  std::string label = "default";
};

std::string CacheParamName(const ::testing::TestParamInfo<CacheParam>& info);
// Test logs show "<library file> [label]" instead of the struct's bytes.
inline void PrintTo(const CacheParam& p, std::ostream* os) {
  *os << p.library << " [" << p.label << "]";
}

class CacheConformance : public ::testing::TestWithParam<CacheParam> {};

int cache_conformance_anchor();

}  // namespace colibri::sdk::testing
