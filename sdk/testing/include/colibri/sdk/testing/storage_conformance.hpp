// The storage conformance suite. Instantiate it for your plugin:
//
//   INSTANTIATE_TEST_SUITE_P(MyStorage, StorageConformance,
//       ::testing::Values(colibri::sdk::testing::StorageParam{"/path/libcolibri-storage-mine.so", {}}),
//       colibri::sdk::testing::StorageParamName);
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <ostream>
#include <string>

namespace colibri::sdk::testing {

struct StorageParam {
  std::string library;                         // path of the plugin .so
  std::map<std::string, std::string> options;  // its section of the profile, as text
  std::string label = "default";               // test-name suffix
};

std::string StorageParamName(const ::testing::TestParamInfo<StorageParam>& info);
// Test logs show "<library file> [label]" instead of the struct's bytes.
inline void PrintTo(const StorageParam& p, std::ostream* os) {
  *os << p.library << " [" << p.label << "]";
}

class StorageConformance : public ::testing::TestWithParam<StorageParam> {};

// Referenced by the instantiation so the linker keeps the suite's object file.
int storage_conformance_anchor();

}  // namespace colibri::sdk::testing
