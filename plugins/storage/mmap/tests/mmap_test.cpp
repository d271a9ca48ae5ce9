#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "colibri/sdk/storage_view.hpp"
#include "colibri/sdk/testing/plugin_loader.hpp"
#include "colibri/sdk/testing/storage_conformance.hpp"

using colibri::sdk::testing::StorageConformance;
using colibri::sdk::testing::StorageParam;

INSTANTIATE_TEST_SUITE_P(Mmap, StorageConformance,
                         ::testing::Values(StorageParam{MMAP_PLUGIN_PATH, {}, "default"},
                                           StorageParam{MMAP_PLUGIN_PATH,
                                                        {{"advice", "random"}, {"willneed", "false"}},
                                                        "random_no_willneed"},
                                           StorageParam{MMAP_PLUGIN_PATH, {{"threads", "1"}}, "one_thread"}),
                         colibri::sdk::testing::StorageParamName);

namespace {

using namespace colibri::sdk;
namespace ct = colibri::sdk::testing;
namespace fs = std::filesystem;

class MmapTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("colibri-mmap-" + std::to_string(::getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
    auto lib = ct::LoadedPlugin::load(MMAP_PLUGIN_PATH);
    ASSERT_TRUE(lib) << lib.error().to_string();
    auto s = (*lib)->create_as<Storage>({});
    ASSERT_TRUE(s) << s.error().to_string();
    storage_ = *s;
    views_ = static_cast<StorageViews*>(storage_->query_interface(kStorageViewInterface));
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string make_file(const std::string& name, std::size_t size) {
    std::ofstream out(dir_ / name, std::ios::binary);
    for (std::size_t i = 0; i < size; ++i) out.put(static_cast<char>(i % 251));
    return (dir_ / name).string();
  }

  fs::path dir_;
  std::shared_ptr<Storage> storage_;
  StorageViews* views_ = nullptr;
};

TEST_F(MmapTest, AdvertisesZeroCopyViews) {
  EXPECT_TRUE(storage_->capabilities().zero_copy);
  ASSERT_NE(views_, nullptr);
  EXPECT_EQ(storage_->query_interface("colibri.storage.nonexistent.v1"), nullptr);
}

TEST_F(MmapTest, ViewShowsFileBytesAndOutlivesTheFile) {
  ASSERT_NE(views_, nullptr);
  auto f = storage_->open(make_file("v.bin", 3 * 4096 + 17));
  ASSERT_TRUE(f);
  auto v = views_->view(**f, 4000, 5000);
  ASSERT_TRUE(v) << v.error().to_string();
  f->reset();  // closes the file: the view must stay readable
  storage_.reset();
  const auto bytes = (*v)->bytes();
  ASSERT_EQ(bytes.size(), 5000u);
  for (std::size_t i = 0; i < bytes.size(); ++i) ASSERT_EQ(bytes[i], static_cast<std::byte>((4000 + i) % 251)) << i;
}

TEST_F(MmapTest, ViewOutOfRangeIsCorruptData) {
  ASSERT_NE(views_, nullptr);
  auto f = storage_->open(make_file("short.bin", 4096));
  ASSERT_TRUE(f);
  auto v = views_->view(**f, 4000, 200);
  ASSERT_FALSE(v);
  EXPECT_EQ(v.error().code(), StatusCode::corrupt_data);
  EXPECT_NE(v.error().message().find("short.bin"), std::string::npos);
}

// The mapping covers 64 KiB, the file now 4 KiB: touching the tail would raise SIGBUS.
TEST_F(MmapTest, TruncatedAfterMappingIsAnErrorNotACrash) {
  const auto path = make_file("trunc.bin", 16 * 4096);
  auto f = storage_->open(path);
  ASSERT_TRUE(f);
  fs::resize_file(path, 4096);
  std::vector<std::byte> buf(8192);
  Status st = storage_->read(**f, 8192, buf);
  ASSERT_FALSE(st);
  EXPECT_EQ(st.code(), StatusCode::corrupt_data);
  EXPECT_NE(st.message().find("trunc.bin"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("truncated"), std::string::npos) << st.message();
  ASSERT_NE(views_, nullptr);
  EXPECT_FALSE(views_->view(**f, 8192, 4096));
  // What is still there reads fine.
  std::vector<std::byte> head(4096);
  ASSERT_TRUE(storage_->read(**f, 0, head));
  EXPECT_EQ(head[300], static_cast<std::byte>(300 % 251));
}

// Truncated and grown again while reads copy out of the mapping (a model file replaced under a running server): each
// read succeeds or says the file is truncated; none raises SIGBUS, which would end this test's process.
TEST_F(MmapTest, TruncationRacingWithTheCopyIsAnErrorNotACrash) {
  constexpr std::size_t kSize = 64 * 4096;
  const auto path = make_file("race.bin", kSize);
  auto f = storage_->open(path);
  ASSERT_TRUE(f);
  std::atomic<bool> stop{false};
  std::thread truncator([&] {
    const int fd = ::open(path.c_str(), O_WRONLY);
    ASSERT_GE(fd, 0);
    while (!stop.load()) {
      ASSERT_EQ(::ftruncate(fd, 0), 0);
      ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(kSize)), 0);
    }
    ::close(fd);
  });
  std::vector<std::byte> buf(kSize);
  int ok = 0, truncated = 0;
  for (int i = 0; i < 3000; ++i) {
    // Dropped from the page cache now and then, so copies fault pages in (where a truncation bites).
    if (i % 16 == 0) {
      const int fd = ::open(path.c_str(), O_RDONLY);
      ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
      ::close(fd);
    }
    Status st = storage_->read(**f, 0, buf);
    if (st) {
      ++ok;
    } else {
      ASSERT_EQ(st.code(), StatusCode::corrupt_data) << st.message();
      EXPECT_NE(st.message().find("race.bin"), std::string::npos) << st.message();
      ++truncated;
    }
  }
  stop = true;
  truncator.join();
  EXPECT_EQ(ok + truncated, 3000);
  std::printf("reads: %d whole, %d refused as truncated\n", ok, truncated);
}

TEST_F(MmapTest, EmptyFileOpensAndReadsNothing) {
  auto f = storage_->open(make_file("empty.bin", 0));
  ASSERT_TRUE(f) << f.error().to_string();
  EXPECT_EQ((*f)->size(), 0u);
  EXPECT_TRUE(storage_->read(**f, 0, {}));
  std::vector<std::byte> one(1);
  EXPECT_FALSE(storage_->read(**f, 0, one));
}

TEST_F(MmapTest, UnknownAdviceIsRejected) {
  auto lib = ct::LoadedPlugin::load(MMAP_PLUGIN_PATH);
  ASSERT_TRUE(lib);
  auto s = (*lib)->create({{"advice", "sideways"}});
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message().find("storage.advice"), std::string::npos) << s.error().message();
}

}  // namespace
