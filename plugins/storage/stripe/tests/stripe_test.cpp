#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <future>

#include "colibri/sdk/testing/plugin_loader.hpp"
#include "colibri/sdk/testing/storage_conformance.hpp"

using colibri::sdk::testing::StorageConformance;
using colibri::sdk::testing::StorageParam;

namespace {

namespace fs = std::filesystem;

// An empty second directory: the conformance files are found in the first (the model dir).
// Made while the parameters are built (also by --gtest_list_tests), so it is removed at exit, not by a test.
std::string empty_extra_dir() {
  static const struct EmptyDir {
    fs::path path = fs::temp_directory_path() / ("colibri-stripe-empty-" + std::to_string(::getpid()));
    EmptyDir() { fs::create_directories(path); }
    ~EmptyDir() {
      std::error_code ec;
      fs::remove_all(path, ec);
    }
  } dir;
  return dir.path.string();
}

}  // namespace

INSTANTIATE_TEST_SUITE_P(
    Stripe, StorageConformance,
    ::testing::Values(
        StorageParam{STRIPE_PLUGIN_PATH, {}, "model_dir_only"},
        StorageParam{STRIPE_PLUGIN_PATH, {{"paths", "[" + empty_extra_dir() + "]"}}, "two_dirs"},
        StorageParam{STRIPE_PLUGIN_PATH, {{"direct_io", "false"}, {"threads_per_path", "1"}}, "buffered_one_thread"},
        StorageParam{STRIPE_PLUGIN_PATH, {{"paths", "[" + empty_extra_dir() + "]"}, {"chunk_kib", "4"}}, "chunked"}),
    colibri::sdk::testing::StorageParamName);

namespace {

using namespace colibri::sdk;
namespace ct = colibri::sdk::testing;

class StripeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("colibri-stripe-" + std::to_string(::getpid()) + "-" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    for (const char* d : {"model", "disk2", "disk3"}) fs::create_directories(root_ / d);
  }
  void TearDown() override { fs::remove_all(root_); }

  // An expert file under <dir>/experts/L<layer>/E<expert>.bin whose bytes depend on `seed`.
  fs::path write_expert(const std::string& dir, int layer, int expert, std::size_t size, int seed) {
    char rel[64];
    std::snprintf(rel, sizeof(rel), "experts/L%03d/E%03d.bin", layer, expert);
    const fs::path p = root_ / dir / rel;
    fs::create_directories(p.parent_path());
    std::ofstream out(p, std::ios::binary);
    for (std::size_t i = 0; i < size; ++i) out.put(static_cast<char>((i + static_cast<std::size_t>(seed)) % 241));
    return p;
  }
  static std::byte expected(std::size_t i, int seed) {
    return static_cast<std::byte>((i + static_cast<std::size_t>(seed)) % 241);
  }

  std::shared_ptr<Storage> make(std::map<std::string, std::string> options,
                                std::shared_ptr<ct::RecordingHost> host = nullptr) {
    auto lib = ct::LoadedPlugin::load(STRIPE_PLUGIN_PATH);
    EXPECT_TRUE(lib);
    if (!lib) return nullptr;
    auto s = (*lib)->create_as<Storage>(options, std::move(host));
    EXPECT_TRUE(s) << s.error().to_string();
    return s ? *s : nullptr;
  }
  // Submits a read of `a` whose callback holds its directory's thread until a read of `b` (into `b_buf`) has
  // completed, for at most 20 s: true when `b`'s read did not wait for that thread.
  static bool read_b_while_a_blocks(Storage& s, StorageFile& a, StorageFile& b, std::span<std::byte> b_buf) {
    std::vector<std::byte> a_buf(4096);
    std::promise<void> release;
    std::shared_future<void> released = release.get_future().share();
    std::promise<void> b_done;
    ReadRequest ra;
    ra.file = &a;
    ra.length = a_buf.size();
    ra.buffer = a_buf.data();
    EXPECT_TRUE(s.submit(ra, [&](ReadRequest&) { released.wait(); }));
    ReadRequest rb;
    rb.file = &b;
    rb.length = b_buf.size();
    rb.buffer = b_buf.data();
    EXPECT_TRUE(s.submit(rb, [&](ReadRequest& c) {
      EXPECT_TRUE(c.status) << c.status.to_string();
      b_done.set_value();
    }));
    const auto status = b_done.get_future().wait_for(std::chrono::seconds(20));
    release.set_value();
    s.drain();
    return status == std::future_status::ready;
  }

  std::string dirs(std::initializer_list<const char*> names) {
    std::string out = "[";
    for (const char* n : names) out += (out.size() > 1 ? ", " : "") + (root_ / n).string();
    return out + "]";
  }

  fs::path root_;
};

TEST_F(StripeTest, FilesAreFoundInWhicheverDirectoryHoldsThem) {
  write_expert("model", 7, 1, 8192, 1);
  write_expert("disk2", 7, 3, 8192, 3);
  write_expert("disk3", 7, 5, 8192, 5);
  auto s = make({{"paths", dirs({"disk2", "disk3"})}});
  ASSERT_NE(s, nullptr);
  std::vector<std::byte> buf(8192);
  for (int e : {1, 3, 5}) {
    char rel[64];
    std::snprintf(rel, sizeof(rel), "experts/L007/E%03d.bin", e);
    auto f = s->open((root_ / "model" / rel).string());  // the engine always names the model's path
    ASSERT_TRUE(f) << e << ": " << f.error().to_string();
    ASSERT_TRUE(s->read(**f, 0, buf));
    for (std::size_t i = 0; i < buf.size(); ++i) ASSERT_EQ(buf[i], expected(i, e)) << "expert " << e << " byte " << i;
  }
  auto missing = s->open((root_ / "model/experts/L007/E009.bin").string());
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code(), StatusCode::not_found);
  EXPECT_NE(missing.error().message().find("experts/L007/E009.bin"), std::string::npos) << missing.error().message();
  EXPECT_NE(missing.error().message().find("disk3"), std::string::npos) << missing.error().message();
}

TEST_F(StripeTest, ModelDirOptionGivesTheRelativePath) {
  fs::create_directories(root_ / "disk2" / "blobs");
  std::ofstream(root_ / "disk2" / "blobs" / "shared.bin", std::ios::binary) << std::string(4096, 'z');
  auto s = make({{"paths", dirs({"disk2"})}, {"model_dir", (root_ / "model").string()}});
  ASSERT_NE(s, nullptr);
  auto f = s->open((root_ / "model" / "blobs" / "shared.bin").string());
  ASSERT_TRUE(f) << f.error().to_string();
  std::vector<std::byte> buf(10);
  ASSERT_TRUE(s->read(**f, 100, buf));
  EXPECT_EQ(buf[0], std::byte{'z'});
}

TEST_F(StripeTest, FailedCopyIsServedFromTheMirrorWithAWarning) {
  const auto primary = write_expert("model", 2, 4, 4 * 4096, 9);
  write_expert("disk2", 2, 4, 4 * 4096, 9);  // the mirror
  auto host = std::make_shared<ct::RecordingHost>();
  auto s = make({{"paths", dirs({"disk2"})}}, host);
  ASSERT_NE(s, nullptr);
  auto f = s->open(primary.string());
  ASSERT_TRUE(f);
  fs::resize_file(primary, 4096);  // the primary copy goes bad after open
  std::vector<std::byte> buf(2 * 4096);
  Status st = s->read(**f, 2 * 4096, buf);
  ASSERT_TRUE(st) << st.to_string();
  for (std::size_t i = 0; i < buf.size(); ++i) ASSERT_EQ(buf[i], expected(2 * 4096 + i, 9)) << i;
  EXPECT_EQ(host->metric("mirror_fallbacks_total"), 1.0);
  const auto lines = host->lines();
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0].rfind("warn: ", 0), 0u) << lines[0];
  EXPECT_NE(lines[0].find(primary.string()), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find("disk2"), std::string::npos) << lines[0];
  // Async reads take the same path; the warning is not repeated.
  std::promise<Status> done;
  ReadRequest r;
  r.file = f->get();
  r.offset = 3 * 4096;
  r.length = 4096;
  r.buffer = buf.data();
  ASSERT_TRUE(s->submit(r, [&](ReadRequest& c) { done.set_value(c.status); }));
  EXPECT_TRUE(done.get_future().get());
  s->drain();
  EXPECT_EQ(host->metric("mirror_fallbacks_total"), 2.0);
  EXPECT_EQ(host->lines().size(), 1u);
  EXPECT_EQ(host->metric("reads_dir1_total"), 2.0) << "the mirror's directory served both";
  EXPECT_EQ(host->metric("reads_dir0_total"), 0.0);
}

TEST_F(StripeTest, WithoutAMirrorTheErrorNamesTheFile) {
  const auto primary = write_expert("model", 2, 4, 4 * 4096, 9);
  auto s = make({{"paths", dirs({"disk2"})}});
  ASSERT_NE(s, nullptr);
  auto f = s->open(primary.string());
  ASSERT_TRUE(f);
  fs::resize_file(primary, 4096);
  std::vector<std::byte> buf(4096);
  Status st = s->read(**f, 2 * 4096, buf);
  ASSERT_FALSE(st);
  EXPECT_EQ(st.code(), StatusCode::corrupt_data);
  EXPECT_NE(st.message().find("E004.bin"), std::string::npos) << st.message();
}

TEST_F(StripeTest, AllCopiesFailingIsAnErrorNotACrash) {
  const auto a = write_expert("model", 0, 0, 4 * 4096, 1);
  const auto b = write_expert("disk2", 0, 0, 4 * 4096, 1);
  auto s = make({{"paths", dirs({"disk2"})}});
  ASSERT_NE(s, nullptr);
  auto f = s->open(a.string());
  ASSERT_TRUE(f);
  fs::resize_file(a, 0);
  fs::resize_file(b, 0);
  std::vector<std::byte> buf(4096);
  Status st = s->read(**f, 0, buf);
  ASSERT_FALSE(st);
  EXPECT_NE(st.message().find("every copy failed"), std::string::npos) << st.message();
}

// A primary already truncated when opened: the mirror's bytes past its end are still served (which copy is whole
// is the manifest's to say; the warning names both sizes).
TEST_F(StripeTest, CopiesOfDifferentSizesServeReadsFromTheLongerOne) {
  const auto a = write_expert("model", 1, 1, 4 * 4096, 1);
  fs::resize_file(a, 2 * 4096);
  write_expert("disk2", 1, 1, 4 * 4096, 1);
  auto host = std::make_shared<ct::RecordingHost>();
  auto s = make({{"paths", dirs({"disk2"})}}, host);
  ASSERT_NE(s, nullptr);
  auto f = s->open(a.string());
  ASSERT_TRUE(f) << f.error().to_string();
  EXPECT_EQ((*f)->size(), 4u * 4096);
  ASSERT_FALSE(host->lines().empty());
  EXPECT_NE(host->lines()[0].find("differ in size"), std::string::npos) << host->lines()[0];
  std::vector<std::byte> buf(4096);
  Status st = s->read(**f, 3 * 4096, buf);
  ASSERT_TRUE(st) << st.to_string();
  for (std::size_t i = 0; i < buf.size(); ++i) ASSERT_EQ(buf[i], expected(3 * 4096 + i, 1)) << i;
  EXPECT_EQ(host->metric("mirror_fallbacks_total"), 1.0);
}

// The model directory's own file gone: its copy serves it, and the log says so (it used to be silent).
TEST_F(StripeTest, AMissingPrimaryIsReadFromItsCopyWithAWarning) {
  const auto a = write_expert("model", 1, 2, 2 * 4096, 3);
  write_expert("disk2", 1, 2, 2 * 4096, 3);
  fs::remove(a);
  auto host = std::make_shared<ct::RecordingHost>();
  auto s = make({{"paths", dirs({"disk2"})}}, host);
  ASSERT_NE(s, nullptr);
  auto f = s->open(a.string());
  ASSERT_TRUE(f) << f.error().to_string();
  ASSERT_EQ(host->lines().size(), 1u);
  EXPECT_NE(host->lines()[0].find("reading its copy"), std::string::npos) << host->lines()[0];
  EXPECT_NE(host->lines()[0].find(a.string()), std::string::npos) << host->lines()[0];
}

// One directory's threads being busy does not hold up reads of another directory.
TEST_F(StripeTest, EachDirectoryHasItsOwnQueue) {
  const auto a = write_expert("model", 0, 0, 4096, 1);
  write_expert("disk2", 0, 1, 4096, 2);
  auto s = make({{"paths", dirs({"disk2"})}, {"threads_per_path", "1"}});
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->capabilities().queue_depth, 2u);
  auto fa = s->open(a.string());
  auto fb = s->open((root_ / "model/experts/L000/E001.bin").string());
  ASSERT_TRUE(fa && fb);
  std::vector<std::byte> buf(4096);
  EXPECT_TRUE(read_b_while_a_blocks(*s, **fa, **fb, buf)) << "disk2's read waited for the model dir's thread";
  EXPECT_EQ(buf[0], expected(0, 2));
}

// `colibri-cli model stripe` leaves a symlink in the model dir to the moved file: its reads go to the queue of the
// directory that holds it, and the symlink and its target are one copy, not a file and its mirror.
TEST_F(StripeTest, MovedFileBehindASymlinkIsReadByItsOwnDirectorysQueue) {
  const auto stays = write_expert("model", 0, 0, 4096, 1);
  const auto moved = write_expert("disk2", 0, 1, 2 * 4096, 2);
  const auto link = root_ / "model/experts/L000/E001.bin";
  fs::create_symlink(moved, link);
  auto host = std::make_shared<ct::RecordingHost>();
  auto s = make({{"paths", dirs({"disk2"})}, {"threads_per_path", "1"}}, host);
  ASSERT_NE(s, nullptr);
  auto fa = s->open(stays.string());
  auto fb = s->open(link.string());  // the engine names the model's path
  ASSERT_TRUE(fa && fb);
  std::vector<std::byte> buf(2 * 4096);
  EXPECT_TRUE(read_b_while_a_blocks(*s, **fa, **fb, buf)) << "the moved file's read waited for the model dir's thread";
  for (std::size_t i = 0; i < 2 * 4096; ++i) ASSERT_EQ(buf[i], expected(i, 2)) << i;
  EXPECT_EQ(host->metric("reads_dir0_total"), 1.0);   // E000, which stayed
  EXPECT_EQ(host->metric("reads_dir1_total"), 1.0);   // E001, through the symlink
  ASSERT_TRUE(s->read(**fa, 0, {buf.data(), 4096}));  // synchronous reads count too
  EXPECT_EQ(host->metric("reads_dir0_total"), 2.0);
  // Not its own mirror: a failing copy has no other copy to fall back to.
  fs::resize_file(moved, 4096);
  Status st = s->read(**fb, 4096, {buf.data(), 4096});
  ASSERT_FALSE(st);
  EXPECT_EQ(host->metric("mirror_fallbacks_total"), 0.0);
  EXPECT_EQ(st.message().find("every copy failed"), std::string::npos) << st.message();
  EXPECT_EQ(host->metric("reads_dir1_total"), 2.0) << "a read every copy failed counts at the primary";
}

// A model directory that lies inside a member of `paths` (storage.paths: [/data], the model /data/m) is its own
// directory: its files are served and counted there, not by the member that holds it.
TEST_F(StripeTest, AModelInsideAMemberIsServedByItsOwnDirectory) {
  const auto own = write_expert("model", 0, 0, 4096, 1);
  auto host = std::make_shared<ct::RecordingHost>();
  auto s = make({{"paths", "[" + root_.string() + "]"}}, host);
  ASSERT_NE(s, nullptr);
  auto f = s->open(own.string());
  ASSERT_TRUE(f);
  std::vector<std::byte> buf(4096);
  ASSERT_TRUE(s->read(**f, 0, buf));
  EXPECT_EQ(host->metric("reads_dir0_total"), 1.0);
  EXPECT_EQ(host->metric("reads_dir1_total"), 0.0);
}

TEST_F(StripeTest, PathsThatAreNotDirectoriesAreRejected) {
  auto lib = ct::LoadedPlugin::load(STRIPE_PLUGIN_PATH);
  ASSERT_TRUE(lib);
  auto s = (*lib)->create({{"paths", "[" + (root_ / "disk2").string() + ", " + (root_ / "nope").string() + "]"}});
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message().find("storage.paths[1]"), std::string::npos) << s.error().message();
  EXPECT_NE(s.error().message().find("nope"), std::string::npos) << s.error().message();
}

}  // namespace
