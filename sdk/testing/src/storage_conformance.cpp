#include "colibri/sdk/testing/storage_conformance.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <random>
#include <thread>
#include <vector>

#include "colibri/sdk/storage_view.hpp"
#include "colibri/sdk/testing/plugin_loader.hpp"

namespace colibri::sdk::testing {

namespace fs = std::filesystem;

int storage_conformance_anchor() {
  return 1;
}

std::string StorageParamName(const ::testing::TestParamInfo<StorageParam>& info) {
  std::string n = fs::path(info.param.library).stem().string() + "_" + info.param.label;
  for (char& c : n) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return n;
}

namespace {

struct AlignedBuffer {
  explicit AlignedBuffer(std::size_t n)
      : size(n), data(static_cast<std::byte*>(std::aligned_alloc(4096, (n + 4095) / 4096 * 4096 + 4096))) {}
  ~AlignedBuffer() { std::free(data); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  std::size_t size;
  std::byte* data;
};

class StorageFixture {
 public:
  explicit StorageFixture(const StorageParam& p) {
    auto lib = LoadedPlugin::load(p.library);
    if (!lib) {
      error = lib.error().to_string();
      return;
    }
    plugin = *lib;
    host = std::make_shared<RecordingHost>();
    auto s = plugin->create_as<Storage>(p.options, host);
    if (!s) {
      error = s.error().to_string();
      return;
    }
    storage = *s;
    // A scratch directory on the filesystem the tests run on (may refuse O_DIRECT: that must work too).
    const char* tmp = std::getenv("TMPDIR");
    dir = fs::path(tmp && *tmp ? tmp : "/tmp") /
          ("colibri-storage-" + std::to_string(::getpid()) + "-" + std::to_string(counter_++));
    fs::create_directories(dir);
  }
  ~StorageFixture() {
    storage.reset();
    std::error_code ec;
    if (!dir.empty()) fs::remove_all(dir, ec);
  }

  // A file of `size` pseudo-random bytes; returns its content.
  std::vector<std::byte> make_file(const std::string& name, std::size_t size, unsigned seed = 7) {
    std::vector<std::byte> content(size);
    std::mt19937 rng(seed);
    for (auto& b : content) b = static_cast<std::byte>(rng() & 0xff);
    std::ofstream out(dir / name, std::ios::binary);
    out.write(reinterpret_cast<const char*>(content.data()), static_cast<std::streamsize>(content.size()));
    return content;
  }

  std::shared_ptr<LoadedPlugin> plugin;
  std::shared_ptr<RecordingHost> host;
  std::shared_ptr<Storage> storage;
  fs::path dir;
  std::string error;

 private:
  static inline std::atomic<int> counter_{0};
};

#define STORAGE_FIXTURE(f)                 \
  StorageFixture f(GetParam());            \
  ASSERT_TRUE(f.error.empty()) << f.error; \
  ASSERT_NE(f.storage, nullptr)

bool same_bytes(const std::byte* a, const std::byte* b, std::size_t n) {
  return std::memcmp(a, b, n) == 0;
}

// One read_batch of 4 KiB pages, page `last - i` of the file into dst[i] (backwards, so no two reads are
// neighbours); every request must succeed with the file's bytes.
void expect_batch_reads_pages(Storage& storage, StorageFile& file, const std::vector<std::byte>& content,
                              std::span<std::byte* const> dst, std::size_t last) {
  std::vector<ReadRequest> batch(dst.size());
  for (std::size_t i = 0; i < batch.size(); ++i) {
    batch[i].file = &file;
    batch[i].offset = (last - i) * 4096;
    batch[i].length = 4096;
    batch[i].buffer = dst[i];
  }
  storage.read_batch(batch);
  for (std::size_t i = 0; i < batch.size(); ++i) {
    ASSERT_TRUE(batch[i].status) << batch[i].status.to_string();
    EXPECT_TRUE(same_bytes(dst[i], content.data() + (last - i) * 4096, 4096)) << i;
  }
}

}  // namespace

TEST_P(StorageConformance, DescriptorIsStorage) {
  auto lib = LoadedPlugin::load(GetParam().library);
  ASSERT_TRUE(lib) << lib.error().to_string();
  EXPECT_EQ((*lib)->descriptor().kind, PluginKind::storage);
}

TEST_P(StorageConformance, CapabilitiesAreConsistent) {
  STORAGE_FIXTURE(f);
  const auto caps = f.storage->capabilities();
  EXPECT_GE(caps.queue_depth, 1u);
  EXPECT_GE(caps.alignment, 1u);
  EXPECT_EQ(caps.alignment & (caps.alignment - 1), 0u) << "alignment must be a power of two";
}

TEST_P(StorageConformance, MissingFileIsNotFound) {
  STORAGE_FIXTURE(f);
  auto file = f.storage->open((f.dir / "does-not-exist.bin").string());
  ASSERT_FALSE(file);
  EXPECT_EQ(file.error().code(), StatusCode::not_found);
  EXPECT_NE(file.error().message().find("does-not-exist.bin"), std::string::npos) << file.error().message();
}

TEST_P(StorageConformance, DirectoryIsRefused) {
  STORAGE_FIXTURE(f);
  auto file = f.storage->open(f.dir.string());
  EXPECT_FALSE(file);
}

// A FIFO where a file should be (a user's mistake, or a hostile swap) must be refused, not block open() until a
// writer comes: that hung the engine and a server's shutdown.
TEST_P(StorageConformance, FifoIsRefusedWithoutBlocking) {
  STORAGE_FIXTURE(f);
  const auto fifo = f.dir / "fifo.bin";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0) << std::strerror(errno);
  auto opened = std::async(std::launch::async, [&] { return static_cast<bool>(f.storage->open(fifo.string())); });
  if (opened.wait_for(std::chrono::seconds(30)) != std::future_status::ready) {
    const int writer = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);  // lets the blocked open() return
    ADD_FAILURE() << "open() blocked on a FIFO";
    opened.wait();
    if (writer >= 0) ::close(writer);
    return;
  }
  EXPECT_FALSE(opened.get());
}

TEST_P(StorageConformance, ReadsWholeFileExactly) {
  STORAGE_FIXTURE(f);
  const std::size_t size = 3 * 4096 * 16 + 4096;  // several aligned blocks
  auto content = f.make_file("whole.bin", size);
  auto file = f.storage->open((f.dir / "whole.bin").string());
  ASSERT_TRUE(file) << file.error().to_string();
  EXPECT_EQ((*file)->size(), size);
  AlignedBuffer buf(size);
  auto st = f.storage->read(**file, 0, {buf.data, size});
  ASSERT_TRUE(st) << st.to_string();
  EXPECT_TRUE(same_bytes(buf.data, content.data(), size));
}

TEST_P(StorageConformance, ReadsArbitraryRanges) {
  STORAGE_FIXTURE(f);
  const std::size_t size = 256 * 1024 + 123;  // not a multiple of any block size
  auto content = f.make_file("ranges.bin", size, 11);
  auto file = f.storage->open((f.dir / "ranges.bin").string());
  ASSERT_TRUE(file) << file.error().to_string();
  std::mt19937 rng(3);
  for (int i = 0; i < 200; ++i) {
    std::uint64_t off = rng() % size;
    std::uint64_t len = rng() % (size - off + 1);
    if (i % 4 == 0) {  // aligned requests exercise the direct path
      off = off / 4096 * 4096;
      len = std::min<std::uint64_t>(len / 4096 * 4096, (size - off) / 4096 * 4096);
    }
    AlignedBuffer buf(len);
    auto st = f.storage->read(**file, off, {buf.data, len});
    ASSERT_TRUE(st) << "offset " << off << " length " << len << ": " << st.to_string();
    ASSERT_TRUE(same_bytes(buf.data, content.data() + off, len)) << "offset " << off << " length " << len;
  }
  // The last byte alone, and the tail that ends at EOF.
  AlignedBuffer one(1);
  ASSERT_TRUE(f.storage->read(**file, size - 1, {one.data, 1}));
  EXPECT_EQ(one.data[0], content[size - 1]);
}

TEST_P(StorageConformance, ZeroLengthReadSucceeds) {
  STORAGE_FIXTURE(f);
  f.make_file("zero.bin", 4096);
  auto file = f.storage->open((f.dir / "zero.bin").string());
  ASSERT_TRUE(file);
  AlignedBuffer buf(1);
  EXPECT_TRUE(f.storage->read(**file, 4096, {buf.data, 0}));
}

TEST_P(StorageConformance, ReadPastEndIsCorruptDataNotGarbage) {
  STORAGE_FIXTURE(f);
  f.make_file("short.bin", 10000);
  auto file = f.storage->open((f.dir / "short.bin").string());
  ASSERT_TRUE(file);
  AlignedBuffer buf(8192);
  auto st = f.storage->read(**file, 4096, {buf.data, 8192});
  ASSERT_FALSE(st);
  EXPECT_EQ(st.code(), StatusCode::corrupt_data) << st.to_string();
  EXPECT_FALSE(st.retryable());
  EXPECT_NE(st.message().find("short.bin"), std::string::npos) << st.message();
  auto far = f.storage->read(**file, 1u << 30, {buf.data, 16});
  EXPECT_FALSE(far);
}

TEST_P(StorageConformance, ReadBatchFillsEveryRequest) {
  STORAGE_FIXTURE(f);
  const std::size_t size = 64 * 4096;
  auto a = f.make_file("a.bin", size, 1);
  auto b = f.make_file("b.bin", size, 2);
  auto fa = f.storage->open((f.dir / "a.bin").string());
  auto fb = f.storage->open((f.dir / "b.bin").string());
  ASSERT_TRUE(fa && fb);
  std::vector<std::unique_ptr<AlignedBuffer>> bufs;
  std::vector<ReadRequest> reqs;
  for (int i = 0; i < 32; ++i) {
    bufs.push_back(std::make_unique<AlignedBuffer>(8192));
    ReadRequest r;
    r.file = (i % 2 ? fb->get() : fa->get());
    r.offset = static_cast<std::uint64_t>((i * 3) % 60) * 4096;
    r.length = 8192;
    r.buffer = bufs.back()->data;
    r.user_tag = static_cast<std::uint64_t>(i);
    r.status = Status(StatusCode::internal, "not completed");
    reqs.push_back(r);
  }
  ReadRequest bad;  // one failing request must not spoil the others
  bad.file = fa->get();
  bad.offset = size;
  bad.length = 4096;
  bufs.push_back(std::make_unique<AlignedBuffer>(4096));
  bad.buffer = bufs.back()->data;
  reqs.push_back(bad);
  f.storage->read_batch(reqs);
  for (int i = 0; i < 32; ++i) {
    ASSERT_TRUE(reqs[i].status) << i << ": " << reqs[i].status.to_string();
    const auto& src = (i % 2 ? b : a);
    EXPECT_TRUE(same_bytes(static_cast<std::byte*>(reqs[i].buffer), src.data() + reqs[i].offset, 8192)) << i;
  }
  EXPECT_FALSE(reqs.back().status);
}

TEST_P(StorageConformance, SubmitCallsBackExactlyOnceWithData) {
  STORAGE_FIXTURE(f);
  const std::size_t size = 128 * 4096;
  auto content = f.make_file("async.bin", size, 5);
  auto file = f.storage->open((f.dir / "async.bin").string());
  ASSERT_TRUE(file);
  constexpr int kRequests = 100;
  std::vector<std::unique_ptr<AlignedBuffer>> bufs;
  std::vector<std::atomic<int>> calls(kRequests);
  std::atomic<int> bad_data{0};
  for (int i = 0; i < kRequests; ++i) {
    bufs.push_back(std::make_unique<AlignedBuffer>(4096));
    ReadRequest r;
    r.file = file->get();
    r.offset = static_cast<std::uint64_t>(i % 128) * 4096;
    r.length = 4096;
    r.buffer = bufs.back()->data;
    r.priority = i % 3 == 0 ? ReadPriority::prefetch : ReadPriority::demand;
    r.user_tag = static_cast<std::uint64_t>(i);
    auto st = f.storage->submit(r, [&](ReadRequest& done) {
      calls[done.user_tag].fetch_add(1);
      if (!done.status ||
          !same_bytes(static_cast<std::byte*>(done.buffer), content.data() + done.offset, done.length)) {
        bad_data.fetch_add(1);
      }
    });
    ASSERT_TRUE(st) << st.to_string();
  }
  f.storage->drain();
  for (int i = 0; i < kRequests; ++i) EXPECT_EQ(calls[i].load(), 1) << "request " << i;
  EXPECT_EQ(bad_data.load(), 0);
}

TEST_P(StorageConformance, SubmitWithoutCallbackIsRejected) {
  STORAGE_FIXTURE(f);
  f.make_file("cb.bin", 4096);
  auto file = f.storage->open((f.dir / "cb.bin").string());
  ASSERT_TRUE(file);
  AlignedBuffer buf(4096);
  ReadRequest r;
  r.file = file->get();
  r.length = 4096;
  r.buffer = buf.data;
  EXPECT_FALSE(f.storage->submit(r, nullptr));
}

TEST_P(StorageConformance, ConcurrentReadersGetTheirOwnData) {
  STORAGE_FIXTURE(f);
  const std::size_t size = 256 * 4096;
  auto content = f.make_file("conc.bin", size, 9);
  auto file = f.storage->open((f.dir / "conc.bin").string());
  ASSERT_TRUE(file);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(static_cast<unsigned>(t));
      AlignedBuffer buf(16 * 4096);
      for (int i = 0; i < 50; ++i) {
        const std::uint64_t off = (rng() % 240) * 4096;
        if (!f.storage->read(**file, off, {buf.data, 16 * 4096}) ||
            !same_bytes(buf.data, content.data() + off, 16 * 4096)) {
          failures.fetch_add(1);
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
}

TEST_P(StorageConformance, FileChangedAfterOpenIsDetectedOrRead) {
  // A file truncated after open must give an error for the missing range, never stale garbage.
  STORAGE_FIXTURE(f);
  f.make_file("trunc.bin", 8 * 4096);
  auto file = f.storage->open((f.dir / "trunc.bin").string());
  ASSERT_TRUE(file);
  fs::resize_file(f.dir / "trunc.bin", 4096);
  AlignedBuffer buf(4096);
  auto st = f.storage->read(**file, 4 * 4096, {buf.data, 4096});
  EXPECT_FALSE(st) << "read 4096 bytes at 16384 of a 4096-byte file";
}

// ---- Added with the io_uring / mmap / stripe plugins ----

TEST_P(StorageConformance, DrainWaitsForCallbacksToReturn) {
  STORAGE_FIXTURE(f);
  auto content = f.make_file("drain.bin", 16 * 4096, 13);
  auto file = f.storage->open((f.dir / "drain.bin").string());
  ASSERT_TRUE(file);
  std::vector<std::unique_ptr<AlignedBuffer>> bufs;
  std::atomic<int> returned{0};
  for (int i = 0; i < 8; ++i) {
    bufs.push_back(std::make_unique<AlignedBuffer>(4096));
    ReadRequest r;
    r.file = file->get();
    r.offset = static_cast<std::uint64_t>(i) * 4096;
    r.length = 4096;
    r.buffer = bufs.back()->data;
    ASSERT_TRUE(f.storage->submit(r, [&](ReadRequest&) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));  // a slow consumer
      returned.fetch_add(1);
    }));
  }
  f.storage->drain();
  EXPECT_EQ(returned.load(), 8) << "drain() returned before every callback had";
}

TEST_P(StorageConformance, CallbacksMaySubmitFollowUpReads) {
  // The expert manager chains reads from completions; drain() must cover the chained ones.
  STORAGE_FIXTURE(f);
  auto content = f.make_file("chain.bin", 32 * 4096, 17);
  auto file = f.storage->open((f.dir / "chain.bin").string());
  ASSERT_TRUE(file);
  AlignedBuffer buf(32 * 4096);
  std::atomic<int> completed{0};
  std::atomic<int> bad{0};
  std::function<void(ReadRequest&)> chain = [&](ReadRequest& done) {
    if (!done.status || !same_bytes(static_cast<std::byte*>(done.buffer), content.data() + done.offset, 4096)) {
      bad.fetch_add(1);
    }
    completed.fetch_add(1);
    if (done.user_tag + 1 < 32) {
      ReadRequest next = done;
      next.user_tag = done.user_tag + 1;
      next.offset = next.user_tag * 4096;
      next.buffer = buf.data + next.user_tag * 4096;
      if (!f.storage->submit(next, chain)) bad.fetch_add(1);
    }
  };
  ReadRequest first;
  first.file = file->get();
  first.length = 4096;
  first.buffer = buf.data;
  ASSERT_TRUE(f.storage->submit(first, chain));
  f.storage->drain();
  EXPECT_EQ(completed.load(), 32);
  EXPECT_EQ(bad.load(), 0);
}

TEST_P(StorageConformance, FailedAsyncReadsReachTheirCallbackOnce) {
  STORAGE_FIXTURE(f);
  f.make_file("eof.bin", 4096);
  auto file = f.storage->open((f.dir / "eof.bin").string());
  ASSERT_TRUE(file);
  AlignedBuffer buf(8192);
  std::atomic<int> calls{0};
  StatusCode code = StatusCode::ok;
  ReadRequest r;
  r.file = file->get();
  r.offset = 4096;
  r.length = 8192;
  r.buffer = buf.data;
  ASSERT_TRUE(f.storage->submit(r, [&](ReadRequest& done) {
    code = done.status.code();
    calls.fetch_add(1);
  }));
  f.storage->drain();
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(code, StatusCode::corrupt_data);
}

TEST_P(StorageConformance, MisalignedBuffersAreReadCorrectly) {
  // Direct I/O needs aligned buffers; a plugin must fall back, not fail or corrupt.
  STORAGE_FIXTURE(f);
  auto content = f.make_file("misaligned.bin", 8 * 4096, 19);
  auto file = f.storage->open((f.dir / "misaligned.bin").string());
  ASSERT_TRUE(file);
  AlignedBuffer buf(4 * 4096 + 64);
  for (std::size_t shift : {1u, 8u, 512u}) {
    auto st = f.storage->read(**file, 4096, {buf.data + shift, 2 * 4096});
    ASSERT_TRUE(st) << "buffer offset " << shift << ": " << st.to_string();
    EXPECT_TRUE(same_bytes(buf.data + shift, content.data() + 4096, 2 * 4096)) << "buffer offset " << shift;
  }
}

TEST_P(StorageConformance, ClosingFilesReleasesDescriptors) {
  STORAGE_FIXTURE(f);
  f.make_file("fd.bin", 4096);
  auto count_fds = [] {
    std::error_code ec;
    return std::distance(fs::directory_iterator("/proc/self/fd", ec), fs::directory_iterator());
  };
  AlignedBuffer buf(4096);
  {  // warm-up: lazily created resources of the plugin are not leaks
    auto file = f.storage->open((f.dir / "fd.bin").string());
    ASSERT_TRUE(file);
    ASSERT_TRUE(f.storage->read(**file, 0, {buf.data, 4096}));
  }
  const auto before = count_fds();
  for (int i = 0; i < 50; ++i) {
    auto file = f.storage->open((f.dir / "fd.bin").string());
    ASSERT_TRUE(file);
    ASSERT_TRUE(f.storage->read(**file, 0, {buf.data, 4096}));
  }
  EXPECT_EQ(count_fds(), before) << "file descriptors leaked by open/close";
}

TEST_P(StorageConformance, ZeroCopyViewsWhenAdvertised) {
  STORAGE_FIXTURE(f);
  auto* views = static_cast<StorageViews*>(f.storage->query_interface(kStorageViewInterface));
  if (!f.storage->capabilities().zero_copy) {
    EXPECT_EQ(views, nullptr) << "offers " << kStorageViewInterface << " without capabilities().zero_copy";
    return;
  }
  ASSERT_NE(views, nullptr) << "capabilities().zero_copy without the " << kStorageViewInterface << " interface";
  auto content = f.make_file("view.bin", 5 * 4096 + 7, 23);
  auto file = f.storage->open((f.dir / "view.bin").string());
  ASSERT_TRUE(file);
  auto v = views->view(**file, 4095, 4096 + 9);
  ASSERT_TRUE(v) << v.error().to_string();
  file->reset();  // the view keeps its bytes valid
  ASSERT_EQ((*v)->bytes().size(), 4096u + 9u);
  EXPECT_TRUE(same_bytes((*v)->bytes().data(), content.data() + 4095, 4096 + 9));
}

TEST_P(StorageConformance, RegisteredBuffersWhenAdvertised) {
  STORAGE_FIXTURE(f);
  auto* reg = static_cast<RegisteredBuffers*>(f.storage->query_interface(kRegisteredBuffersInterface));
  if (!f.storage->capabilities().registered_buffers) {
    EXPECT_EQ(reg, nullptr) << "offers " << kRegisteredBuffersInterface << " without capabilities().registered_buffers";
    return;
  }
  ASSERT_NE(reg, nullptr) << "capabilities().registered_buffers without the " << kRegisteredBuffersInterface
                          << " interface";
  auto content = f.make_file("reg.bin", 16 * 4096, 29);
  auto file = f.storage->open((f.dir / "reg.bin").string());
  ASSERT_TRUE(file);
  AlignedBuffer arena(8 * 4096);
  const std::span<std::byte> region(arena.data, 8 * 4096);
  const Status st = reg->register_buffers(std::span<const std::span<std::byte>>(&region, 1));
  if (!st) GTEST_SKIP() << "registration refused on this machine: " << st.to_string();
  std::vector<std::byte*> pages(8);
  for (std::size_t i = 0; i < pages.size(); ++i) pages[i] = arena.data + i * 4096;
  expect_batch_reads_pages(*f.storage, **file, content, pages, 15);
  reg->unregister_buffers();
  ASSERT_TRUE(f.storage->read(**file, 0, {arena.data, 4096}));
  EXPECT_TRUE(same_bytes(arena.data, content.data(), 4096));
}

// Optional: "colibri.storage.buffers.v1" (needs capabilities().registered_buffers). Reads into a buffer registered on
// its own, into part of it, next to it and after it is unregistered all deliver the file's bytes; registering twice
// and unregistering twice are harmless.
TEST_P(StorageConformance, BufferRegistrationWhenOffered) {
  STORAGE_FIXTURE(f);
  auto* reg = static_cast<StorageBuffers*>(f.storage->query_interface(kStorageBuffersInterface));
  if (reg == nullptr) GTEST_SKIP() << "the plugin does not offer " << kStorageBuffersInterface;
  EXPECT_TRUE(f.storage->capabilities().registered_buffers)
      << "offers " << kStorageBuffersInterface << " without capabilities().registered_buffers";
  auto content = f.make_file("slots.bin", 32 * 4096, 37);
  auto file = f.storage->open((f.dir / "slots.bin").string());
  ASSERT_TRUE(file);
  AlignedBuffer slot(8 * 4096);
  AlignedBuffer other(8 * 4096);
  const Status st = reg->register_buffer({slot.data, 8 * 4096});
  if (!st) GTEST_SKIP() << "registration refused on this machine: " << st.to_string();
  EXPECT_TRUE(reg->register_buffer({slot.data, 8 * 4096})) << "registering again is harmless";
  ASSERT_TRUE(f.storage->read(**file, 4 * 4096, {slot.data, 8 * 4096}));
  EXPECT_TRUE(same_bytes(slot.data, content.data() + 4 * 4096, 8 * 4096));
  std::vector<std::byte*> pages(4);  // alternately inside and outside the registered buffer
  for (std::size_t i = 0; i < pages.size(); ++i) pages[i] = (i % 2 == 0 ? slot.data : other.data) + i * 4096;
  expect_batch_reads_pages(*f.storage, **file, content, pages, 31);
  reg->unregister_buffer({slot.data, 8 * 4096});
  reg->unregister_buffer({slot.data, 8 * 4096});
  reg->unregister_buffer({other.data, 8 * 4096});  // never registered
  ASSERT_TRUE(f.storage->read(**file, 0, {slot.data, 4096}));
  EXPECT_TRUE(same_bytes(slot.data, content.data(), 4096));
}

// Optional: "colibri.storage.cancel.v1". Reads whose callbacks do not return yet hold every worker (or
// the completion thread), so the prefetches queued behind them have not started and can be withdrawn.
TEST_P(StorageConformance, CancelWithdrawsQueuedRequestsWhenOffered) {
  STORAGE_FIXTURE(f);
  auto* canceller = static_cast<StorageCancel*>(f.storage->query_interface(kStorageCancelInterface));
  if (canceller == nullptr) GTEST_SKIP() << "the plugin does not offer " << kStorageCancelInterface;
  auto content = f.make_file("cancel.bin", 64 * 4096, 31);
  auto file = f.storage->open((f.dir / "cancel.bin").string());
  ASSERT_TRUE(file);
  const int blockers = 2 * static_cast<int>(std::max<std::uint32_t>(1, f.storage->capabilities().queue_depth));
  constexpr int kQueued = 32;
  constexpr std::uint64_t kBlockerTag = 1u << 20;
  std::atomic<bool> go{false};
  auto wait_for_go = [&go] {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!go.load() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  };
  std::vector<std::unique_ptr<AlignedBuffer>> bufs;
  std::atomic<int> blocker_calls{0};
  for (int i = 0; i < blockers; ++i) {
    bufs.push_back(std::make_unique<AlignedBuffer>(4096));
    ReadRequest r;
    r.file = file->get();
    r.offset = static_cast<std::uint64_t>(i % 64) * 4096;
    r.length = 4096;
    r.buffer = bufs.back()->data;
    r.user_tag = kBlockerTag + static_cast<std::uint64_t>(i);
    ASSERT_TRUE(f.storage->submit(r, [&](ReadRequest&) {
      blocker_calls.fetch_add(1);
      wait_for_go();
    }));
  }
  std::vector<std::atomic<int>> calls(kQueued);
  std::vector<std::atomic<int>> codes(kQueued);
  std::atomic<int> bad_data{0};
  for (int i = 0; i < kQueued; ++i) {
    bufs.push_back(std::make_unique<AlignedBuffer>(4096));
    ReadRequest r;
    r.file = file->get();
    r.offset = static_cast<std::uint64_t>(i) * 4096;
    r.length = 4096;
    r.buffer = bufs.back()->data;
    r.priority = ReadPriority::prefetch;
    r.user_tag = static_cast<std::uint64_t>(i);
    ASSERT_TRUE(f.storage->submit(r, [&](ReadRequest& done) {
      codes[done.user_tag].store(static_cast<int>(done.status.code()));
      calls[done.user_tag].fetch_add(1);
      if (done.status && !same_bytes(static_cast<std::byte*>(done.buffer), content.data() + done.offset, done.length)) {
        bad_data.fetch_add(1);
      }
    }));
  }
  std::vector<bool> withdrawn(kQueued);
  int cancelled = 0;
  for (int i = kQueued; i-- > 0;) {  // the last queued first: the least likely to have started
    withdrawn[i] = canceller->cancel(static_cast<std::uint64_t>(i));
    if (!withdrawn[i]) continue;
    ++cancelled;
    EXPECT_EQ(calls[i].load(), 1) << "request " << i
                                  << ": a withdrawn whole request is called back before cancel returns";
    EXPECT_EQ(codes[i].load(), static_cast<int>(StatusCode::cancelled)) << "request " << i;
  }
  EXPECT_FALSE(canceller->cancel(kBlockerTag * 2)) << "a tag never submitted";
  go.store(true);
  f.storage->drain();
  EXPECT_GE(cancelled, kQueued / 2) << "prefetches queued behind blocked callbacks should not have started";
  EXPECT_EQ(blocker_calls.load(), blockers);
  for (int i = 0; i < kQueued; ++i) {
    EXPECT_EQ(calls[i].load(), 1) << "request " << i << " called back " << calls[i].load() << " times";
    if (!withdrawn[i]) {
      EXPECT_EQ(codes[i].load(), static_cast<int>(StatusCode::ok)) << "request " << i;
    }
    EXPECT_FALSE(canceller->cancel(static_cast<std::uint64_t>(i))) << "request " << i << " has completed";
  }
  EXPECT_EQ(bad_data.load(), 0);
}

}  // namespace colibri::sdk::testing
