#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "colibri/sdk/testing/plugin_loader.hpp"
#include "colibri/sdk/testing/resource_limits.hpp"
#include "colibri/sdk/testing/storage_conformance.hpp"

using colibri::sdk::testing::StorageConformance;
using colibri::sdk::testing::StorageParam;

INSTANTIATE_TEST_SUITE_P(Pread, StorageConformance,
                         ::testing::Values(StorageParam{PREAD_PLUGIN_PATH, {{"direct_io", "true"}}, "direct"},
                                           StorageParam{PREAD_PLUGIN_PATH, {{"direct_io", "false"}}, "buffered"},
                                           StorageParam{PREAD_PLUGIN_PATH, {{"threads", "1"}}, "one_thread"},
                                           // every request above 4 KiB split over the workers
                                           StorageParam{PREAD_PLUGIN_PATH, {{"chunk_kib", "4"}}, "chunked"}),
                         colibri::sdk::testing::StorageParamName);

namespace {

using namespace colibri::sdk;
namespace ct = colibri::sdk::testing;

// An open the OS refuses for the open-file limit says how to raise it (not to restore the file).
TEST(PreadStorage, TheOpenFileLimitIsNamedWithItsFix) {
  const std::filesystem::path file = std::filesystem::temp_directory_path() / "pread-emfile-probe.bin";
  std::ofstream(file, std::ios::binary) << std::string(4096, 'x');
  auto lib = ct::LoadedPlugin::load(PREAD_PLUGIN_PATH);
  ASSERT_TRUE(lib);
  auto s = (*lib)->create_as<Storage>({{"direct_io", "false"}});
  ASSERT_TRUE(s) << s.error().message();
  ct::NoFreeDescriptors no_free;
  ASSERT_TRUE(no_free.active());
  auto f = (*s)->open(file.string());
  no_free.restore();
  std::filesystem::remove(file);
  ASSERT_FALSE(f);
  EXPECT_NE(f.error().message().find("ulimit -n"), std::string::npos) << f.error().message();
  EXPECT_TRUE(f.error().retryable()) << "descriptors come back: the server answers 503 to retry, not 500";
}

// Threads the OS cannot give (the address-space limit) make create() fail with a message; the threads already
// started are joined, not left to end the process (a joinable std::thread destroyed calls std::terminate).
TEST(PreadStorage, ThreadsThatCannotStartAreAnErrorNotACrash) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "ASan's shadow memory does not live within an address-space limit";
#endif
  auto lib = ct::LoadedPlugin::load(PREAD_PLUGIN_PATH);
  ASSERT_TRUE(lib);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    long pages = 0;
    std::ifstream("/proc/self/statm") >> pages;
    rlimit tight{};
    tight.rlim_cur = tight.rlim_max = static_cast<rlim_t>(pages) * static_cast<rlim_t>(::sysconf(_SC_PAGESIZE)) +
                                      (64u << 20);  // room for a few 8 MiB thread stacks, not 256
    ::setrlimit(RLIMIT_AS, &tight);
    auto s = (*lib)->create_as<Storage>({{"threads", "256"}});
    const bool named = !s && s.error().message().find("cannot start I/O thread") != std::string::npos;
    ::_exit(named ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "the child died of signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0) << "create() did not fail with the thread message";
}

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

TEST(PreadStorage, RejectsBadChunkSize) {
  auto lib = ct::LoadedPlugin::load(PREAD_PLUGIN_PATH);
  ASSERT_TRUE(lib);
  auto s = (*lib)->create({{"chunk_kib", "6"}});
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message().find("chunk_kib"), std::string::npos);
}

// One submitted read split into chunks completes once, as the request that was submitted, with every byte; when a
// chunk fails (the file shrank after open), the whole request fails once with that chunk's error.
TEST(PreadStorage, SplitReadCompletesOnceAsTheWholeRequest) {
  const std::filesystem::path file = std::filesystem::current_path() / "pread-chunked.bin";
  const std::size_t size = 1 << 20;
  std::string content(size, '\0');
  for (std::size_t i = 0; i < size; ++i) content[i] = static_cast<char>((i * 131 + 7) % 251);
  std::ofstream(file, std::ios::binary) << content;
  auto lib = ct::LoadedPlugin::load(PREAD_PLUGIN_PATH);
  ASSERT_TRUE(lib);
  auto s = (*lib)->create_as<Storage>({{"chunk_kib", "64"}, {"threads", "4"}});
  ASSERT_TRUE(s);
  auto f = (*s)->open(file.string());
  ASSERT_TRUE(f);
  for (const auto& [offset, length] : {std::pair<std::uint64_t, std::uint64_t>{4096, 700 * 1024},  // aligned
                                       {123, 555555},                                              // neither
                                       {0, size}}) {
    std::vector<std::byte> buf(length);
    int calls = 0;
    ReadRequest got;
    ReadRequest r;
    r.file = f->get();
    r.offset = offset;
    r.length = length;
    r.buffer = buf.data();
    r.user_tag = 42;
    ASSERT_TRUE((*s)->submit(r, [&](ReadRequest& done) {
      ++calls;
      got = done;
    }));
    (*s)->drain();
    EXPECT_EQ(calls, 1);
    EXPECT_TRUE(got.status) << got.status.to_string();
    EXPECT_EQ(got.offset, offset);
    EXPECT_EQ(got.length, length);
    EXPECT_EQ(got.buffer, buf.data());
    EXPECT_EQ(got.user_tag, 42u);
    EXPECT_EQ(std::memcmp(buf.data(), content.data() + offset, length), 0) << "offset " << offset;
  }
  std::filesystem::resize_file(file, size / 2);  // chunks beyond the new end fail
  std::vector<std::byte> buf(size);
  int calls = 0;
  Status result;
  ReadRequest r;
  r.file = f->get();
  r.length = size;
  r.buffer = buf.data();
  ASSERT_TRUE((*s)->submit(r, [&](ReadRequest& done) {
    ++calls;
    result = done.status;
  }));
  (*s)->drain();
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(result.code(), StatusCode::corrupt_data) << result.to_string();
  std::filesystem::remove(file);
}

// read() splits a long range like submit() does and the pool reads the parts at once (reads_total counts the
// positional reads); a failing part fails the whole read; a callback on a worker that reads synchronously reads
// inline rather than waiting for the pool it is part of.
TEST(PreadStorage, SynchronousReadsAreChunkedLikeSubmittedOnes) {
  const std::filesystem::path file = std::filesystem::current_path() / "pread-sync-chunked.bin";
  const std::size_t size = 1 << 20;
  std::string content(size, '\0');
  for (std::size_t i = 0; i < size; ++i) content[i] = static_cast<char>((i * 97 + 3) % 251);
  std::ofstream(file, std::ios::binary) << content;
  auto lib = ct::LoadedPlugin::load(PREAD_PLUGIN_PATH);
  ASSERT_TRUE(lib);
  auto host = std::make_shared<ct::RecordingHost>();
  auto s = (*lib)->create_as<Storage>({{"chunk_kib", "64"}, {"threads", "4"}}, host);
  ASSERT_TRUE(s);
  auto f = (*s)->open(file.string());
  ASSERT_TRUE(f);
  std::vector<std::byte> buf(700 * 1024);
  ASSERT_TRUE((*s)->read(**f, 4096, buf));
  EXPECT_EQ(std::memcmp(buf.data(), content.data() + 4096, buf.size()), 0);
  EXPECT_EQ(host->metric("reads_total"), 4.0) << "700 KiB in 64 KiB chunks over 4 threads: 4 parts";
  EXPECT_EQ(host->metric("bytes_read_total"), static_cast<double>(buf.size()));
  ASSERT_TRUE((*s)->read(**f, 123, {buf.data(), 60000}));  // below one chunk: one read
  EXPECT_EQ(std::memcmp(buf.data(), content.data() + 123, 60000), 0);
  EXPECT_EQ(host->metric("reads_total"), 5.0);

  auto unsplit = (*lib)->create_as<Storage>({{"chunk_kib", "0"}, {"threads", "4"}}, host);
  ASSERT_TRUE(unsplit);
  auto uf = (*unsplit)->open(file.string());
  ASSERT_TRUE(uf);
  ASSERT_TRUE((*unsplit)->read(**uf, 0, buf));
  EXPECT_EQ(host->metric("reads_total"), 6.0) << "chunk_kib 0 never splits";

  // From a callback (on a worker): inline, whole.
  std::vector<std::byte> small(4096);
  std::vector<std::byte> inner(size);
  Status inner_status(StatusCode::internal, "not called");
  ReadRequest r;
  r.file = f->get();
  r.length = small.size();
  r.buffer = small.data();
  ASSERT_TRUE((*s)->submit(r, [&](ReadRequest&) { inner_status = (*s)->read(**f, 0, inner); }));
  (*s)->drain();
  EXPECT_TRUE(inner_status) << inner_status.to_string();
  EXPECT_EQ(std::memcmp(inner.data(), content.data(), size), 0);
  EXPECT_EQ(host->metric("reads_total"), 8.0) << "the submitted read, then the callback's read unsplit";

  std::filesystem::resize_file(file, size / 2);  // parts beyond the new end fail
  const Status st = (*s)->read(**f, 0, inner);
  EXPECT_EQ(st.code(), StatusCode::corrupt_data) << st.to_string();
  std::filesystem::remove(file);
}

}  // namespace
