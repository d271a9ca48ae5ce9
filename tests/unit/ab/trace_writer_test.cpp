// TraceWriter: appended batches read back as one trace; a path that cannot be written is named.
#include "colibri/ab/trace_writer.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>

namespace colibri::ab {
namespace {

TEST(TraceWriter, AppendsWholeLinesThatReadBack) {
  const auto path = std::filesystem::temp_directory_path() / ("colibri-trace-" + std::to_string(::getpid()) + ".jsonl");
  {
    auto w = TraceWriter::open(path);
    ASSERT_TRUE(w) << w.error().message();
    TraceRecord a{0, 0, 11, 1, {3, 1}, {0.75f, 0.25f}};
    TraceRecord b{1, 0, 12, 1, {2, 0}, {}};
    ASSERT_TRUE((*w)->append(std::vector<TraceRecord>{a}));
    ASSERT_TRUE((*w)->append(std::vector<TraceRecord>{}));
    // Readable between appends: what is there is whole lines.
    auto partial = read_trace(path);
    ASSERT_TRUE(partial) << partial.error().message();
    EXPECT_EQ(partial->size(), 1u);
    ASSERT_TRUE((*w)->append(std::vector<TraceRecord>{b, a}));
    EXPECT_EQ((*w)->records_written(), 3u);
  }
  auto got = read_trace(path);
  ASSERT_TRUE(got) << got.error().message();
  ASSERT_EQ(got->size(), 3u);
  EXPECT_EQ((*got)[1].request, 1);
  EXPECT_EQ((*got)[1].token, 12);
  EXPECT_EQ((*got)[0].experts, (std::vector<std::int32_t>{3, 1}));
  EXPECT_EQ((*got)[0].weights, (std::vector<float>{0.75f, 0.25f}));
  // Opening again starts a new trace.
  { ASSERT_TRUE(TraceWriter::open(path)); }
  EXPECT_EQ(std::filesystem::file_size(path), 0u);
  std::filesystem::remove(path);
}

TEST(TraceWriter, WeightsAreWrittenAsTheirShortestDecimalAndReadBackTheSame) {
  const std::vector<float> weights{0.6f, 0.61f, 1.0f / 3.0f, 1e-8f};
  const TraceRecord r{0, 5, 1234, 3, {7, 2, 1, 0}, weights, 9};
  const std::string line = to_jsonl(r);
  EXPECT_NE(line.find("\"weights\":[0.6,0.61,0.33333334,1e-08]"), std::string::npos) << line;  // not 0.6000000238...
  const auto path =
      std::filesystem::temp_directory_path() / ("colibri-weights-" + std::to_string(::getpid()) + ".jsonl");
  std::ofstream(path) << line << "\n";
  auto back = read_trace(path);
  std::filesystem::remove(path);
  ASSERT_TRUE(back) << back.error().message();
  ASSERT_EQ(back->size(), 1u);
  EXPECT_EQ((*back)[0].weights, weights);  // bit for bit
}

// A recording cut off mid-line (a crash, a full disk) keeps its whole records; a damaged line elsewhere, or a cut
// last line with nothing before it, is refused by line; a directory is named as one.
TEST(TraceReader, ACutLastLineIsDroppedOtherDamageIsRefused) {
  const auto path = std::filesystem::temp_directory_path() / ("colibri-cut-" + std::to_string(::getpid()) + ".jsonl");
  const std::string whole = to_jsonl(TraceRecord{0, 0, 11, 1, {3, 1}, {}}) + "\n";
  auto write = [&](const std::string& text) { std::ofstream(path, std::ios::binary | std::ios::trunc) << text; };
  write(whole + whole + whole.substr(0, 12));
  auto got = read_trace(path);
  ASSERT_TRUE(got) << got.error().message();
  EXPECT_EQ(got->size(), 2u);
  write(whole + whole.substr(0, 12) + "\n" + whole);  // not the last line: damage, not a cut
  got = read_trace(path);
  ASSERT_FALSE(got);
  EXPECT_NE(got.error().message().find(":2: not valid JSON"), std::string::npos) << got.error().message();
  write(whole.substr(0, 12));
  EXPECT_FALSE(read_trace(path));
  std::filesystem::remove(path);
  got = read_trace(path.parent_path());
  ASSERT_FALSE(got);
  EXPECT_NE(got.error().message().find("is a directory"), std::string::npos) << got.error().message();
}

TEST(TraceWriter, AnUnwritablePathIsNamed) {
  auto w = TraceWriter::open("/nonexistent-dir/trace.jsonl");
  ASSERT_FALSE(w);
  EXPECT_NE(w.error().message().find("/nonexistent-dir/trace.jsonl"), std::string::npos) << w.error().message();
}

}  // namespace
}  // namespace colibri::ab
