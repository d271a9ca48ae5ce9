#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "colibri/sdk/testing/plugin_loader.hpp"
#include "colibri/sdk/testing/storage_conformance.hpp"

using colibri::sdk::testing::StorageConformance;
using colibri::sdk::testing::StorageParam;

INSTANTIATE_TEST_SUITE_P(Pread, StorageConformance,
                         ::testing::Values(StorageParam{PREAD_PLUGIN_PATH, {{"direct_io", "true"}}, "direct"},
                                           StorageParam{PREAD_PLUGIN_PATH, {{"direct_io", "false"}}, "buffered"},
                                           StorageParam{PREAD_PLUGIN_PATH, {{"threads", "1"}}, "one_thread"}),
                         colibri::sdk::testing::StorageParamName);

namespace {

using namespace colibri::sdk;
namespace ct = colibri::sdk::testing;

TEST(PreadStorage, RejectsBadThreadCount) {
  auto lib = ct::LoadedPlugin::load(PREAD_PLUGIN_PATH);
  ASSERT_TRUE(lib);
  auto s = (*lib)->create({{"threads", "-3"}});
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message().find("threads"), std::string::npos);
}

TEST(PreadStorage, DirectIoIsUsedWhereTheFilesystemAllowsIt) {
  // The build directory is on a real disk filesystem here; tmpfs would refuse O_DIRECT.
  const std::filesystem::path file = std::filesystem::current_path() / "pread-direct-probe.bin";
  {
    std::ofstream out(file, std::ios::binary);
    std::string block(8192, 'x');
    out << block;
  }
  auto lib = ct::LoadedPlugin::load(PREAD_PLUGIN_PATH);
  ASSERT_TRUE(lib);
  auto host = std::make_shared<ct::RecordingHost>();
  auto s = (*lib)->create_as<Storage>({{"direct_io", "true"}}, host);
  ASSERT_TRUE(s);
  auto f = (*s)->open(file.string());
  ASSERT_TRUE(f);
  if (!(*f)->direct_io()) {
    // Then the plugin must have said why, once, through the host logger.
    ASSERT_FALSE(host->lines().empty());
    EXPECT_NE(host->lines().front().find("O_DIRECT"), std::string::npos);
  }
  auto s2 = (*lib)->create_as<Storage>({{"direct_io", "false"}});
  ASSERT_TRUE(s2);
  auto f2 = (*s2)->open(file.string());
  ASSERT_TRUE(f2);
  EXPECT_FALSE((*f2)->direct_io());
  std::filesystem::remove(file);
}

TEST(PreadStorage, CountsBytesReadThroughHostMetrics) {
  const std::filesystem::path file = std::filesystem::current_path() / "pread-metrics.bin";
  {
    std::ofstream out(file, std::ios::binary);
    out << std::string(12288, 'y');
  }
  auto lib = ct::LoadedPlugin::load(PREAD_PLUGIN_PATH);
  ASSERT_TRUE(lib);
  auto host = std::make_shared<ct::RecordingHost>();
  auto s = (*lib)->create_as<Storage>({}, host);
  ASSERT_TRUE(s);
  auto f = (*s)->open(file.string());
  ASSERT_TRUE(f);
  std::vector<std::byte> buf(5000);
  ASSERT_TRUE((*s)->read(**f, 100, buf));
  EXPECT_EQ(host->metric("bytes_read_total"), 5000.0);
  EXPECT_EQ(static_cast<char>(buf[0]), 'y');
  std::filesystem::remove(file);
}

}  // namespace
