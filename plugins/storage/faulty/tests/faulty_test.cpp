#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>

#include "colibri/sdk/testing/plugin_loader.hpp"
#include "colibri/sdk/testing/storage_conformance.hpp"

using colibri::sdk::testing::StorageConformance;
using colibri::sdk::testing::StorageParam;

// Without faults configured it is an ordinary storage plugin.
INSTANTIATE_TEST_SUITE_P(Faulty, StorageConformance,
                         ::testing::Values(StorageParam{FAULTY_PLUGIN_PATH, {}, "no_faults"},
                                           StorageParam{FAULTY_PLUGIN_PATH, {{"direct_io", "false"}}, "buffered"},
                                           StorageParam{FAULTY_PLUGIN_PATH, {{"delay_ms", "1"}}, "slow"}),
                         colibri::sdk::testing::StorageParamName);

namespace {

using namespace colibri::sdk;
namespace ct = colibri::sdk::testing;
namespace fs = std::filesystem;

class FaultyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("colibri-faulty-" + std::to_string(::getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string make_file(const std::string& name, std::size_t size) {
    std::ofstream out(dir_ / name, std::ios::binary);
    for (std::size_t i = 0; i < size; ++i) out.put(static_cast<char>(i * 7 + 3));
    return (dir_ / name).string();
  }

  std::shared_ptr<Storage> make(const std::map<std::string, std::string>& options,
                                std::shared_ptr<ct::RecordingHost> host = nullptr) {
    auto lib = ct::LoadedPlugin::load(FAULTY_PLUGIN_PATH);
    EXPECT_TRUE(lib);
    if (!lib) return nullptr;
    auto s = (*lib)->create_as<Storage>(options, std::move(host));
    EXPECT_TRUE(s) << s.error().to_string();
    return s ? *s : nullptr;
  }

  fs::path dir_;
};

TEST_F(FaultyTest, EveryNthReadFails) {
  auto s = make({{"fail_every", "3"}});
  ASSERT_NE(s, nullptr);
  const auto path = make_file("a.bin", 8192);
  auto f = s->open(path);
  ASSERT_TRUE(f);
  std::vector<std::byte> buf(100);
  for (int i = 1; i <= 9; ++i) {
    Status st = s->read(**f, 0, buf);
    if (i % 3 == 0) {
      ASSERT_FALSE(st) << "read " << i;
      EXPECT_EQ(st.code(), StatusCode::io_error);
      EXPECT_FALSE(st.retryable());
      EXPECT_NE(st.message().find(path), std::string::npos) << st.message();
      EXPECT_NE(st.message().find("injected"), std::string::npos) << st.message();
    } else {
      ASSERT_TRUE(st) << "read " << i << ": " << st.to_string();
      EXPECT_EQ(buf[5], static_cast<std::byte>(5 * 7 + 3));
    }
  }
}

TEST_F(FaultyTest, RetryableFlagIsHonoured) {
  auto s = make({{"fail_every", "1"}, {"fail_retryable", "true"}});
  ASSERT_NE(s, nullptr);
  auto f = s->open(make_file("r.bin", 4096));
  ASSERT_TRUE(f);
  std::vector<std::byte> buf(10);
  Status st = s->read(**f, 0, buf);
  ASSERT_FALSE(st);
  EXPECT_TRUE(st.retryable());
}

TEST_F(FaultyTest, PathSubstringsSelectWhichFilesMisbehave) {
  auto host = std::make_shared<ct::RecordingHost>();
  auto s =
      make({{"fail_path_substring", "E003"}, {"short_read_path_substring", "E004"}, {"missing_path_substring", "E005"}},
           host);
  ASSERT_NE(s, nullptr);
  auto good = s->open(make_file("E002.bin", 8192));
  auto failing = s->open(make_file("E003.bin", 8192));
  auto short_one = s->open(make_file("E004.bin", 8192));
  ASSERT_TRUE(good && failing && short_one);
  EXPECT_EQ(s->open(make_file("E005.bin", 8192)).error().code(), StatusCode::not_found);
  std::vector<std::byte> buf(4096);
  EXPECT_TRUE(s->read(**good, 0, buf));
  EXPECT_EQ(s->read(**failing, 0, buf).code(), StatusCode::io_error);
  Status st = s->read(**short_one, 0, buf);
  EXPECT_EQ(st.code(), StatusCode::corrupt_data);
  EXPECT_NE(st.message().find("E004.bin"), std::string::npos) << st.message();
  EXPECT_EQ(host->metric("injected_faults_total"), 2.0);
}

TEST_F(FaultyTest, CorruptBytesFlipsExactlyThatManyBytes) {
  auto s = make({{"corrupt_bytes", "5"}, {"corrupt_path_substring", "bad"}});
  ASSERT_NE(s, nullptr);
  auto bad = s->open(make_file("bad.bin", 8192));
  auto ok = s->open(make_file("ok.bin", 8192));
  ASSERT_TRUE(bad && ok);
  std::vector<std::byte> buf(1000);
  ASSERT_TRUE(s->read(**bad, 100, buf));
  int differing = 0;
  for (std::size_t i = 0; i < buf.size(); ++i) differing += buf[i] != static_cast<std::byte>((100 + i) * 7 + 3);
  EXPECT_EQ(differing, 5);
  ASSERT_TRUE(s->read(**ok, 100, buf));
  for (std::size_t i = 0; i < buf.size(); ++i) ASSERT_EQ(buf[i], static_cast<std::byte>((100 + i) * 7 + 3)) << i;
}

TEST_F(FaultyTest, FaultsReachAsyncCallbacks) {
  auto s = make({{"fail_every", "2"}, {"queue_depth", "1"}});
  ASSERT_NE(s, nullptr);
  auto f = s->open(make_file("async.bin", 4096 * 8));
  ASSERT_TRUE(f);
  std::vector<std::byte> buf(4096 * 8);
  std::atomic<int> failed{0}, succeeded{0};
  for (int i = 0; i < 8; ++i) {
    ReadRequest r;
    r.file = f->get();
    r.offset = static_cast<std::uint64_t>(i) * 4096;
    r.length = 4096;
    r.buffer = buf.data() + i * 4096;
    ASSERT_TRUE(s->submit(r, [&](ReadRequest& done) { (done.status ? succeeded : failed).fetch_add(1); }));
  }
  s->drain();
  EXPECT_EQ(failed.load(), 4);
  EXPECT_EQ(succeeded.load(), 4);
}

TEST_F(FaultyTest, DelayMakesReadsTakeAtLeastThatLong) {
  auto s = make({{"delay_ms", "30"}});
  ASSERT_NE(s, nullptr);
  auto f = s->open(make_file("slow.bin", 4096));
  ASSERT_TRUE(f);
  std::vector<std::byte> buf(16);
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(s->read(**f, 0, buf));
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(30));
}

TEST_F(FaultyTest, NegativeCountsAreRejectedNamingTheKey) {
  auto lib = ct::LoadedPlugin::load(FAULTY_PLUGIN_PATH);
  ASSERT_TRUE(lib);
  auto s = (*lib)->create({{"fail_every", "-1"}});
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message().find("storage.fail_every"), std::string::npos) << s.error().message();
}

}  // namespace
