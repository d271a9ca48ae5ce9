// util::OutputFile: a failed write never leaves half a file or changes the old one; links are followed, devices and
// FIFOs are written directly instead of being replaced by a regular file.
#include "colibri/util/output_file.hpp"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

namespace fs = std::filesystem;
using colibri::util::OutputFile;
using colibri::util::write_file_atomically;

namespace {

struct TempDir {
  fs::path path;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "colibri-output-file-XXXXXX").string();
    path = ::mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

std::string read(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void write(const fs::path& p, const std::string& text) {
  std::ofstream(p, std::ios::binary) << text;
}

// A write the disk refuses is named by its own reason (ENOSPC), not by what errno holds by the time of commit().
TEST(OutputFile, AFullDiskIsNamedAsSuch) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  auto f = OutputFile::open("/dev/full");
  ASSERT_TRUE(f) << f.error().message();
  f->stream() << std::string(1 << 20, 'x');
  auto s = f->commit();
  ASSERT_FALSE(s);
  EXPECT_NE(s.message().find("No space left on device"), std::string::npos) << s.message();
  auto w = write_file_atomically("/dev/full",
                                 [](std::ostream& o) { return static_cast<bool>(o << std::string(1 << 20, 'y')); });
  ASSERT_FALSE(w);
  EXPECT_NE(w.message().find("No space left on device"), std::string::npos) << w.message();
}

// A link planted at the .partial name (by another user, in a shared directory) is removed, never written through:
// the file it names keeps its bytes and the output is a regular file of its own.
TEST(OutputFile, APlantedPartialLinkIsNotWrittenThrough) {
  TempDir dir;
  const fs::path victim = dir.path / "victim.txt", out = dir.path / "out.npy";
  write(victim, "precious");
  fs::create_symlink(victim, out.string() + ".partial");
  ASSERT_TRUE(write_file_atomically(out, [](std::ostream& f) { return static_cast<bool>(f << "new"); }));
  EXPECT_EQ(read(victim), "precious");
  EXPECT_FALSE(fs::is_symlink(out));
  EXPECT_EQ(read(out), "new");
  EXPECT_FALSE(fs::exists(fs::symlink_status(fs::path(out.string() + ".partial"))));
}

TEST(OutputFile, CommitReplacesAndAFailureKeepsTheOldFile) {
  TempDir dir;
  const fs::path out = dir.path / "logits.npy";
  write(out, "old");
  ASSERT_TRUE(write_file_atomically(out, [](std::ostream& f) { return static_cast<bool>(f << "new"); }));
  EXPECT_EQ(read(out), "new");
  EXPECT_FALSE(fs::exists(out.string() + ".partial"));

  const auto failed = write_file_atomically(out, [](std::ostream& f) {
    f << "half";
    return false;  // the body's own failure
  });
  EXPECT_FALSE(failed);
  EXPECT_NE(failed.message().find(out.string()), std::string::npos) << failed.message();
  EXPECT_EQ(read(out), "new");
  EXPECT_FALSE(fs::exists(out.string() + ".partial")) << "the half-written file was left behind";
  {
    auto f = OutputFile::open(out);
    ASSERT_TRUE(f);
    f->stream() << "abandoned";
    EXPECT_TRUE(fs::exists(f->writing_to()));
  }  // never committed
  EXPECT_EQ(read(out), "new");
  EXPECT_FALSE(fs::exists(out.string() + ".partial"));
}

TEST(OutputFile, SymlinkIsFollowedNotReplaced) {
  TempDir dir;
  fs::create_directory(dir.path / "real");
  const fs::path target = dir.path / "real" / "trace.jsonl", link = dir.path / "trace.jsonl";
  write(target, "old");
  fs::create_symlink(target, link);
  ASSERT_TRUE(write_file_atomically(link, [](std::ostream& f) { return static_cast<bool>(f << "new"); }));
  EXPECT_TRUE(fs::is_symlink(fs::symlink_status(link))) << "the link was replaced by a file";
  EXPECT_EQ(read(target), "new");
}

TEST(OutputFile, FifoIsWrittenDirectly) {
  TempDir dir;
  const fs::path fifo = dir.path / "pipe";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::string got;
  std::thread reader([&] { got = read(fifo); });
  const auto s = write_file_atomically(fifo, [](std::ostream& f) { return static_cast<bool>(f << "through"); });
  reader.join();
  EXPECT_TRUE(s) << s.message();
  EXPECT_EQ(got, "through");
  EXPECT_TRUE(fs::is_fifo(fs::status(fifo))) << "the FIFO was replaced by a regular file";
  EXPECT_FALSE(fs::exists(fifo.string() + ".partial"));

  // Through a link, as /dev/stdout -> /proc/self/fd/1 -> pipe:[...] (a target no path resolution reaches).
  const fs::path link = dir.path / "stdout";
  fs::create_symlink(fifo, link);
  std::thread again([&] { got = read(fifo); });
  const auto via = write_file_atomically(link, [](std::ostream& f) { return static_cast<bool>(f << "linked"); });
  again.join();
  EXPECT_TRUE(via) << via.message();
  EXPECT_EQ(got, "linked");
  EXPECT_TRUE(fs::is_symlink(fs::symlink_status(link)));
}

TEST(OutputFile, ProcessStdoutIsWrittenDirectly) {
  // /dev/stdout of this test is whatever ctest gave it (a pipe or a file): never replaced, never an error.
  const auto before = fs::symlink_status("/dev/stdout");
  auto f = OutputFile::open("/dev/stdout");
  ASSERT_TRUE(f) << f.error().message();
  EXPECT_EQ(f->writing_to(), fs::path("/dev/stdout"));
  f->stream() << "";
  EXPECT_TRUE(f->commit());
  EXPECT_EQ(fs::symlink_status("/dev/stdout").type(), before.type());
}

TEST(OutputFile, DirectoryAndUnwritablePlacesAreNamedErrors) {
  TempDir dir;
  const auto d = OutputFile::open(dir.path);
  ASSERT_FALSE(d);
  EXPECT_NE(d.error().message().find("is a directory"), std::string::npos) << d.error().message();
  const auto missing = OutputFile::open(dir.path / "no" / "such" / "dir" / "x.npy");
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.error().message().find("no/such/dir/x.npy"), std::string::npos) << missing.error().message();
}

}  // namespace
