#include <gtest/gtest.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>

#include "colibri/sdk/storage_view.hpp"
#include "colibri/sdk/testing/plugin_loader.hpp"
#include "colibri/sdk/testing/storage_conformance.hpp"

using colibri::sdk::testing::StorageConformance;
using colibri::sdk::testing::StorageParam;

namespace {

using namespace colibri::sdk;
namespace ct = colibri::sdk::testing;
namespace fs = std::filesystem;

// The plugin's own verdict on this machine; the tests skip where the kernel refuses io_uring.
Score plugin_score() {
  auto lib = ct::LoadedPlugin::load(URING_PLUGIN_PATH);
  if (!lib) return {0, lib.error().to_string()};
  return (*lib)->descriptor().score(HostInfo{});
}

std::vector<StorageParam> conformance_params() {
  const Score s = plugin_score();
  if (s.value == 0) {
    std::fprintf(stderr, "io_uring conformance skipped: %s\n", s.reason.c_str());
    return {};
  }
  return {StorageParam{URING_PLUGIN_PATH, {{"direct_io", "true"}}, "direct"},
          StorageParam{URING_PLUGIN_PATH, {{"direct_io", "false"}}, "buffered"},
          StorageParam{URING_PLUGIN_PATH, {{"queue_depth", "1"}}, "depth1"},
          StorageParam{URING_PLUGIN_PATH, {{"queue_depth", "128"}}, "depth128"},
          // every request above 4 KiB split into SQEs in flight at once
          StorageParam{URING_PLUGIN_PATH, {{"chunk_kib", "4"}}, "chunked"},
          // callbacks on the completion thread instead of the callback threads
          StorageParam{URING_PLUGIN_PATH, {{"callback_threads", "0"}}, "inline_callbacks"},
          StorageParam{URING_PLUGIN_PATH, {{"callback_threads", "1"}, {"queue_depth", "2"}}, "one_callback_thread"},
          StorageParam{URING_PLUGIN_PATH, {{"fixed_buffers", "false"}}, "no_fixed_buffers"}};
}

}  // namespace

GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(StorageConformance);
INSTANTIATE_TEST_SUITE_P(IoUring, StorageConformance, ::testing::ValuesIn(conformance_params()),
                         colibri::sdk::testing::StorageParamName);

namespace {

class UringTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const Score s = plugin_score();
    if (s.value == 0) GTEST_SKIP() << "the kernel refuses io_uring here: " << s.reason;
    // Next to the build tree: a disk filesystem, so O_DIRECT is usually accepted.
    dir_ = fs::current_path() / ("colibri-uring-" + std::to_string(::getpid()) + "-" +
                                 ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    if (!dir_.empty()) fs::remove_all(dir_, ec);
  }

  std::string make_file(const std::string& name, std::size_t size) {
    std::ofstream out(dir_ / name, std::ios::binary);
    for (std::size_t i = 0; i < size; ++i) out.put(static_cast<char>((i * 13) % 253));
    return (dir_ / name).string();
  }
  static std::byte expected(std::uint64_t at) { return static_cast<std::byte>((at * 13) % 253); }

  std::shared_ptr<Storage> make(const std::map<std::string, std::string>& options,
                                std::shared_ptr<ct::RecordingHost> host = nullptr) {
    auto lib = ct::LoadedPlugin::load(URING_PLUGIN_PATH);
    EXPECT_TRUE(lib);
    if (!lib) return nullptr;
    auto s = (*lib)->create_as<Storage>(options, std::move(host));
    EXPECT_TRUE(s) << s.error().to_string();
    return s ? *s : nullptr;
  }

  fs::path dir_;
};

struct Aligned {
  explicit Aligned(std::size_t n) : size(n), data(static_cast<std::byte*>(std::aligned_alloc(4096, n))) {}
  ~Aligned() { std::free(data); }
  Aligned(const Aligned&) = delete;
  Aligned& operator=(const Aligned&) = delete;
  std::size_t size;
  std::byte* data;
};

TEST_F(UringTest, QueueDepthComesFromTheProfile) {
  auto s = make({{"queue_depth", "16"}});
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->capabilities().queue_depth, 16u);
  EXPECT_TRUE(s->capabilities().async);
  EXPECT_TRUE(s->capabilities().registered_buffers);
  auto lib = ct::LoadedPlugin::load(URING_PLUGIN_PATH);
  ASSERT_TRUE(lib);
  auto bad = (*lib)->create({{"queue_depth", "0"}});
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message().find("queue_depth"), std::string::npos);
}

TEST_F(UringTest, RegisteredBuffersServeReadsInsideThemAndOnlyThose) {
  auto host = std::make_shared<ct::RecordingHost>();
  auto s = make({}, host);
  ASSERT_NE(s, nullptr);
  auto* reg = static_cast<RegisteredBuffers*>(s->query_interface(kRegisteredBuffersInterface));
  ASSERT_NE(reg, nullptr);
  auto f = s->open(make_file("fixed.bin", 64 * 4096));
  ASSERT_TRUE(f);
  Aligned arena(16 * 4096);
  Aligned outside(4 * 4096);
  const std::span<std::byte> region(arena.data, arena.size);
  Status st = reg->register_buffers(std::span<const std::span<std::byte>>(&region, 1));
  if (!st) GTEST_SKIP() << "registration refused here: " << st.to_string();
  // Synchronous, batched and async reads into slots of the arena.
  ASSERT_TRUE(s->read(**f, 8 * 4096, {arena.data, 4 * 4096}));
  std::vector<ReadRequest> batch(4);
  for (int i = 0; i < 4; ++i) {
    batch[i].file = f->get();
    batch[i].offset = static_cast<std::uint64_t>(20 + i) * 4096;
    batch[i].length = 4096;
    batch[i].buffer = arena.data + (4 + i) * 4096;
  }
  s->read_batch(batch);
  for (auto& r : batch) ASSERT_TRUE(r.status) << r.status.to_string();
  const double fixed_after_arena = host->metric("fixed_reads_total");
  EXPECT_EQ(fixed_after_arena, 5.0);
  for (std::size_t i = 0; i < 4 * 4096; ++i) ASSERT_EQ(arena.data[i], expected(8 * 4096 + i)) << i;
  for (std::size_t i = 0; i < 4 * 4096; ++i) ASSERT_EQ(arena.data[4 * 4096 + i], expected(20 * 4096 + i)) << i;
  // A buffer straddling the end of the region, and one outside it: ordinary reads.
  ASSERT_TRUE(s->read(**f, 0, {arena.data + 15 * 4096, 4096}));
  ASSERT_TRUE(s->read(**f, 4096, {outside.data, 4 * 4096}));
  EXPECT_EQ(host->metric("fixed_reads_total"), fixed_after_arena + 1.0);  // the last slot is inside
  for (std::size_t i = 0; i < 4 * 4096; ++i) ASSERT_EQ(outside.data[i], expected(4096 + i)) << i;
  reg->unregister_buffers();
  ASSERT_TRUE(s->read(**f, 0, {arena.data, 4096}));
  EXPECT_EQ(host->metric("fixed_reads_total"), fixed_after_arena + 1.0);
}

// colibri.storage.buffers.v1: buffers registered one by one; reads inside one are fixed reads (also when a long read
// is split into chunks), reads elsewhere plain ones, and both deliver the file's bytes.
TEST_F(UringTest, BuffersRegisteredOneByOneServeFixedReadsAndOthersStayPlain) {
  auto host = std::make_shared<ct::RecordingHost>();
  auto s = make({{"chunk_kib", "16"}}, host);
  ASSERT_NE(s, nullptr);
  auto* reg = static_cast<StorageBuffers*>(s->query_interface(kStorageBuffersInterface));
  ASSERT_NE(reg, nullptr);
  auto f = s->open(make_file("slots.bin", 64 * 4096));
  ASSERT_TRUE(f);
  Aligned a(16 * 4096);
  Aligned b(16 * 4096);
  Status st = reg->register_buffer({a.data, a.size});
  if (!st) GTEST_SKIP() << "registration refused here: " << st.to_string();
  auto check = [&](const std::byte* buf, std::uint64_t offset, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(buf[i], expected(offset + i)) << "byte " << i;
  };
  // One whole-buffer read: 64 KiB in four 16 KiB chunks, every one fixed.
  ASSERT_TRUE(s->read(**f, 8 * 4096, {a.data, a.size}));
  check(a.data, 8 * 4096, a.size);
  EXPECT_EQ(host->metric("fixed_reads_total"), 4.0);
  EXPECT_EQ(host->metric("plain_reads_total"), 0.0);
  // Unregistered memory: a plain read, same bytes.
  ASSERT_TRUE(s->read(**f, 3 * 4096, {b.data, 4096}));
  check(b.data, 3 * 4096, 4096);
  EXPECT_EQ(host->metric("plain_reads_total"), 1.0);
  // Idempotent: the same range, or a part of it, is already registered; an overlap that sticks out is refused.
  EXPECT_TRUE(reg->register_buffer({a.data, a.size}));
  EXPECT_TRUE(reg->register_buffer({a.data + 4096, 4096}));
  const Status overlap = reg->register_buffer({a.data + 8 * 4096, 16 * 4096});
  EXPECT_EQ(overlap.code(), StatusCode::invalid_argument) << overlap.to_string();
  ASSERT_TRUE(reg->register_buffer({b.data, b.size}));
  // An async read into each.
  ReadRequest ra;
  ra.file = f->get();
  ra.offset = 40 * 4096;
  ra.length = 4096;
  ra.buffer = a.data + 4096;
  ReadRequest rb = ra;
  rb.offset = 50 * 4096;
  rb.buffer = b.data + 15 * 4096;
  std::vector<ReadRequest> batch{ra, rb};
  s->read_batch(batch);
  for (auto& r : batch) ASSERT_TRUE(r.status) << r.status.to_string();
  check(a.data + 4096, 40 * 4096, 4096);
  check(b.data + 15 * 4096, 50 * 4096, 4096);
  EXPECT_EQ(host->metric("fixed_reads_total"), 6.0);
  // Unregistered again (twice: the second is a no-op): plain reads into it, correct bytes.
  reg->unregister_buffer({a.data, a.size});
  reg->unregister_buffer({a.data, a.size});
  ASSERT_TRUE(s->read(**f, 0, {a.data, 4096}));
  check(a.data, 0, 4096);
  EXPECT_EQ(host->metric("plain_reads_total"), 2.0);
  EXPECT_EQ(host->metric("fixed_reads_total"), 6.0);
  // Its table entry is free again, and the whole-set interface replaces these registrations.
  ASSERT_TRUE(reg->register_buffer({a.data, a.size}));
  auto* whole = static_cast<RegisteredBuffers*>(s->query_interface(kRegisteredBuffersInterface));
  ASSERT_NE(whole, nullptr);
  const std::span<std::byte> only_b(b.data, b.size);
  ASSERT_TRUE(whole->register_buffers(std::span<const std::span<std::byte>>(&only_b, 1)));
  ASSERT_TRUE(s->read(**f, 0, {a.data, 4096}));
  EXPECT_EQ(host->metric("plain_reads_total"), 3.0);
  ASSERT_TRUE(s->read(**f, 0, {b.data, 4096}));
  EXPECT_EQ(host->metric("fixed_reads_total"), 7.0);
  whole->unregister_buffers();
  EXPECT_EQ(reg->register_buffer(std::span<std::byte>()).code(), StatusCode::invalid_argument);
}

TEST_F(UringTest, FixedBuffersCanBeTurnedOff) {
  auto s = make({{"fixed_buffers", "false"}});
  ASSERT_NE(s, nullptr);
  EXPECT_FALSE(s->capabilities().registered_buffers);
  EXPECT_EQ(s->query_interface(kStorageBuffersInterface), nullptr);
  EXPECT_EQ(s->query_interface(kRegisteredBuffersInterface), nullptr);
  EXPECT_NE(s->query_interface(kStorageCancelInterface), nullptr);
}

// Callbacks run on several threads: two requests' callbacks (the expert cache verifies checksums there) overlap.
TEST_F(UringTest, CallbacksOfDifferentRequestsRunAtOnce) {
  auto s = make({{"callback_threads", "2"}});
  ASSERT_NE(s, nullptr);
  auto f = s->open(make_file("overlap.bin", 2 * 4096));
  ASSERT_TRUE(f);
  Aligned buf(2 * 4096);
  std::mutex mu;
  std::condition_variable cv;
  int inside = 0;
  int saw_both = 0;
  auto meet = [&](ReadRequest& done) {
    ASSERT_TRUE(done.status) << done.status.to_string();
    std::unique_lock lock(mu);
    ++inside;
    cv.notify_all();
    if (cv.wait_for(lock, std::chrono::seconds(10), [&] { return inside == 2; })) ++saw_both;
  };
  for (int i = 0; i < 2; ++i) {
    ReadRequest r;
    r.file = f->get();
    r.offset = static_cast<std::uint64_t>(i) * 4096;
    r.length = 4096;
    r.buffer = buf.data + i * 4096;
    ASSERT_TRUE(s->submit(r, meet));
  }
  s->drain();
  EXPECT_EQ(saw_both, 2) << "each callback waited for the other: they ran at the same time";
}

#if defined(__x86_64__)
// Without CAP_IPC_LOCK and with a small RLIMIT_MEMLOCK the kernel refuses to pin a large buffer: register_buffer says
// so (naming the limit) and reads into the buffer still deliver the file's bytes, as plain reads. Runs in a child,
// which gives up the capability; returns "" on success, else what went wrong.
std::string registration_refused_in_child(const std::string& path) {
  int pipefd[2];
  if (::pipe(pipefd) != 0) return "pipe failed";
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(pipefd[0]);
    auto report = [&](const std::string& what) {
      if (::write(pipefd[1], what.data(), what.size()) < 0) ::_exit(4);
      ::_exit(0);
    };
    // Without the capability first (a ring made with it is never charged for what it pins), then the ring under the
    // usual limit, then the small limit for the registration: ring memory is charged per user on some kernels, so
    // under 64 KiB the ring itself could fail (it did once in a parallel ctest run).
    __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
    __user_cap_data_struct caps[2]{};
    if (::syscall(SYS_capget, &header, caps) != 0) report("setup");
    caps[CAP_IPC_LOCK / 32].effective &= ~(1u << (CAP_IPC_LOCK % 32));
    if (::syscall(SYS_capset, &header, caps) != 0) report("capset");
    auto lib = ct::LoadedPlugin::load(URING_PLUGIN_PATH);
    if (!lib) report("load");
    auto host = std::make_shared<ct::RecordingHost>();
    auto s = (*lib)->create_as<Storage>({}, host);
    if (!s) report("create: " + s.error().to_string());
    auto* reg = static_cast<StorageBuffers*>((*s)->query_interface(kStorageBuffersInterface));
    auto f = (*s)->open(path);
    if (reg == nullptr || !f) report("interface or open");
    rlimit small{64 * 1024, 64 * 1024};
    if (::setrlimit(RLIMIT_MEMLOCK, &small) != 0) report("setup");
    const std::size_t n = 4 << 20;
    Aligned buf(n);
    const Status st = reg->register_buffer({buf.data, n});
    if (st) report("a 4 MiB buffer was registered under a 64 KiB locked-memory limit");
    if (st.message().find("ulimit -l") == std::string::npos)
      report("the refusal does not name the limit: " + st.to_string());
    const Status read = (*s)->read(**f, 0, {buf.data, n});
    if (!read) report("read after the refusal: " + read.to_string());
    for (std::size_t i = 0; i < n; ++i) {
      if (buf.data[i] != static_cast<std::byte>((i * 13) % 253)) report("wrong byte " + std::to_string(i));
    }
    if (host->metric("fixed_reads_total") != 0.0) report("fixed reads without a registration");
    report("");
  }
  ::close(pipefd[1]);
  std::string out;
  char chunk[256];
  ssize_t n;
  while ((n = ::read(pipefd[0], chunk, sizeof(chunk))) > 0) out.append(chunk, static_cast<std::size_t>(n));
  ::close(pipefd[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return "child failed with status " + std::to_string(status);
  return out;
}

TEST_F(UringTest, RefusedRegistrationLeavesReadsWorking) {
  const std::string path = make_file("memlock.bin", 4 << 20);
  const std::string problem = registration_refused_in_child(path);
  if (problem == "capset" || problem == "setup") GTEST_SKIP() << "cannot drop CAP_IPC_LOCK here";
  EXPECT_EQ(problem, "");
}
#endif

TEST_F(UringTest, DemandReadsOvertakeQueuedPrefetches) {
  auto s = make({{"queue_depth", "1"}});
  ASSERT_NE(s, nullptr);
  auto f = s->open(make_file("prio.bin", 16 * 4096));
  ASSERT_TRUE(f);
  Aligned buf(16 * 4096);
  std::mutex order_mu;
  std::vector<std::uint64_t> order;
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  auto request = [&](int i, ReadPriority p) {
    ReadRequest r;
    r.file = f->get();
    r.offset = static_cast<std::uint64_t>(i) * 4096;
    r.length = 4096;
    r.buffer = buf.data + i * 4096;
    r.priority = p;
    r.user_tag = static_cast<std::uint64_t>(i);
    return r;
  };
  auto record = [&](ReadRequest& done) {
    if (done.user_tag == 0) released.wait();  // hold the completion thread
    std::lock_guard lock(order_mu);
    order.push_back(done.user_tag);
  };
  ASSERT_TRUE(s->submit(request(0, ReadPriority::demand), record));
  // While request 0's callback holds the completion thread, 1 takes the only ring slot and the
  // rest wait: 2..4 prefetch, then 5 demand.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  for (int i = 1; i <= 4; ++i) ASSERT_TRUE(s->submit(request(i, ReadPriority::prefetch), record));
  ASSERT_TRUE(s->submit(request(5, ReadPriority::demand), record));
  release.set_value();
  s->drain();
  ASSERT_EQ(order.size(), 6u);
  const auto pos = [&](std::uint64_t tag) { return std::find(order.begin(), order.end(), tag) - order.begin(); };
  EXPECT_LT(pos(5), pos(2)) << "the demand read waited behind prefetches";
  EXPECT_LT(pos(5), pos(3));
  EXPECT_LT(pos(5), pos(4));
}

TEST_F(UringTest, UnalignedRequestsFallBackToBufferedReads) {
  auto s = make({{"direct_io", "true"}});
  ASSERT_NE(s, nullptr);
  auto f = s->open(make_file("unaligned.bin", 10 * 4096 + 5));
  ASSERT_TRUE(f);
  Aligned buf(8 * 4096);
  ASSERT_TRUE(s->read(**f, 4096 + 3, {buf.data + 1, 5000}));
  for (std::size_t i = 0; i < 5000; ++i) ASSERT_EQ(buf.data[1 + i], expected(4096 + 3 + i)) << i;
  ASSERT_TRUE(s->read(**f, 9 * 4096, {buf.data, 4096 + 5}));  // tail past the last full block
  EXPECT_EQ(buf.data[4096 + 4], expected(10 * 4096 + 4));
}

TEST_F(UringTest, CallbacksMaySubmitAndReadSynchronously) {
  auto s = make({{"queue_depth", "2"}});
  ASSERT_NE(s, nullptr);
  auto f = s->open(make_file("chain.bin", 8 * 4096));
  ASSERT_TRUE(f);
  Aligned buf(8 * 4096);
  std::atomic<int> completed{0};
  std::function<void(ReadRequest&)> chain = [&](ReadRequest& done) {
    ASSERT_TRUE(done.status) << done.status.to_string();
    completed.fetch_add(1);
    // A synchronous read from the completion thread must not deadlock.
    std::byte one[1];
    EXPECT_TRUE(s->read(**f, done.offset, {one, 1}));
    if (done.user_tag + 1 < 8) {
      ReadRequest next = done;
      next.user_tag = done.user_tag + 1;
      next.offset = next.user_tag * 4096;
      next.buffer = buf.data + next.user_tag * 4096;
      EXPECT_TRUE(s->submit(next, chain));
    }
  };
  ReadRequest first;
  first.file = f->get();
  first.length = 4096;
  first.buffer = buf.data;
  ASSERT_TRUE(s->submit(first, chain));
  s->drain();
  EXPECT_EQ(completed.load(), 8);
  for (std::size_t i = 0; i < 8 * 4096; ++i) ASSERT_EQ(buf.data[i], expected(i)) << i;
}

#if defined(__x86_64__)
// Runs the plugin's score() in a child whose seccomp filter answers io_uring_setup with `err`,
// the way a container runtime or kernel.io_uring_disabled does; returns the reason if the score
// is 0, or "" if the plugin did not notice.
std::string score_under_refusal(int err) {
  int pipefd[2];
  if (::pipe(pipefd) != 0) return "pipe failed";
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(pipefd[0]);
    sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (static_cast<unsigned>(err) & SECCOMP_RET_DATA)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    sock_fprog prog{static_cast<unsigned short>(sizeof(filter) / sizeof(filter[0])), filter};
    if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 || ::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0) {
      ::_exit(3);
    }
    const Score s = plugin_score();
    const std::string out = s.value == 0 ? s.reason : std::string();
    if (::write(pipefd[1], out.data(), out.size()) < 0) ::_exit(4);
    ::_exit(0);
  }
  ::close(pipefd[1]);
  std::string reason;
  char chunk[256];
  ssize_t n;
  while ((n = ::read(pipefd[0], chunk, sizeof(chunk))) > 0) reason.append(chunk, static_cast<std::size_t>(n));
  ::close(pipefd[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return "child failed with status " + std::to_string(status);
  return reason;
}

TEST(UringScore, RefusedIoUringScoresZeroWithAReason) {
  const std::string eperm = score_under_refusal(EPERM);
  EXPECT_NE(eperm.find("disabled"), std::string::npos) << "'" << eperm << "'";
  const std::string enosys = score_under_refusal(ENOSYS);
  EXPECT_NE(enosys.find("no io_uring"), std::string::npos) << "'" << enosys << "'";
}
#endif

TEST(UringScore, AvailableKernelScoresAbovePread) {
  const Score s = plugin_score();
  if (s.value == 0) GTEST_SKIP() << s.reason;
  EXPECT_GT(s.value, 100) << "io_uring should win `auto` over pread where it works";
}

}  // namespace
