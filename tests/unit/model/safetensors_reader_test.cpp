#include <gtest/gtest.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "colibri/model/safetensors.hpp"
#include "test_files.hpp"

namespace colibri::model {
namespace {

using testing::Bytes;

std::string safetensors(const nlohmann::json& header, const std::string& data) {
  std::string h = header.dump();
  Bytes b;
  b.pod<std::uint64_t>(h.size()).raw(h).raw(data);
  return b.data;
}

nlohmann::json good_header() {
  return {{"__metadata__", {{"format", "pt"}}},
          {"w", {{"dtype", "F32"}, {"shape", {2, 2}}, {"data_offsets", {0, 16}}}},
          {"b", {{"dtype", "BF16"}, {"shape", {4}}, {"data_offsets", {16, 24}}}}};
}

std::string data24() {
  std::string d;
  for (int i = 0; i < 4; ++i) {
    float f = static_cast<float>(i) + 0.5f;
    d.append(reinterpret_cast<const char*>(&f), 4);
  }
  d.append(8, '\x3f');
  return d;
}

TEST(SafetensorsReader, ReadsASingleFileByRange) {
  auto dir = testing::temp_dir("st ok 模型");
  testing::write_file(dir / "model.safetensors", safetensors(good_header(), data24()));
  auto ck = SafetensorsCheckpoint::open(dir);
  ASSERT_TRUE(ck.has_value()) << ck.error().to_string();
  ASSERT_EQ(ck->tensors().size(), 2u);
  const auto* w = ck->find("w");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->shape, (std::vector<std::int64_t>{2, 2}));
  float f[2];
  ASSERT_TRUE(ck->read(*w, 8, f, 8));
  EXPECT_EQ(f[0], 2.5f);
  EXPECT_EQ(f[1], 3.5f);
  EXPECT_FALSE(ck->read(*w, 12, f, 8));  // past the tensor
  EXPECT_EQ(ck->find("b")->dtype, "BF16");
}

TEST(SafetensorsReader, ReadsShardsThroughTheIndex) {
  auto dir = testing::temp_dir("st shards");
  nlohmann::json h1 = {{"w", {{"dtype", "F32"}, {"shape", {2, 2}}, {"data_offsets", {0, 16}}}}};
  nlohmann::json h2 = {{"b", {{"dtype", "BF16"}, {"shape", {4}}, {"data_offsets", {0, 8}}}}};
  testing::write_file(dir / "a-1.safetensors", safetensors(h1, data24().substr(0, 16)));
  testing::write_file(dir / "a-2.safetensors", safetensors(h2, data24().substr(16)));
  nlohmann::json index = {{"metadata", {{"total_size", 24}}},
                          {"weight_map", {{"w", "a-1.safetensors"}, {"b", "a-2.safetensors"}}}};
  testing::write_file(dir / "model.safetensors.index.json", index.dump());
  auto ck = SafetensorsCheckpoint::open(dir);
  ASSERT_TRUE(ck.has_value()) << ck.error().to_string();
  EXPECT_EQ(ck->files().size(), 2u);
  EXPECT_EQ(ck->files()[ck->find("b")->file_index].filename(), "a-2.safetensors");
  EXPECT_EQ(ck->files()[ck->find("w")->file_index].filename(), "a-1.safetensors");
  // The index names a tensor its shard lacks.
  index["weight_map"]["ghost"] = "a-2.safetensors";
  testing::write_file(dir / "model.safetensors.index.json", index.dump());
  auto bad = SafetensorsCheckpoint::open(dir);
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.error().message().find("'ghost'"), std::string::npos);
  // ... or a file outside the checkpoint.
  index["weight_map"].erase("ghost");
  index["weight_map"]["w"] = "../a-1.safetensors";
  testing::write_file(dir / "model.safetensors.index.json", index.dump());
  bad = SafetensorsCheckpoint::open(dir);
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.error().message().find("not a file name in the checkpoint directory"), std::string::npos);
}

TEST(SafetensorsReader, EveryTruncationIsAClearError) {
  const std::string full = safetensors(good_header(), data24());
  auto dir = testing::temp_dir("st trunc");
  for (std::size_t n = 0; n < full.size(); ++n) {
    testing::write_file(dir / "model.safetensors", full.substr(0, n));
    auto ck = SafetensorsCheckpoint::open(dir);
    ASSERT_FALSE(ck.has_value()) << "a prefix of " << n << " bytes was accepted";
    EXPECT_NE(ck.error().message().find("model.safetensors"), std::string::npos);
  }
}

TEST(SafetensorsReader, RejectsBadHeaders) {
  auto dir = testing::temp_dir("st bad");
  auto expect_error = [&](const std::string& bytes, const std::string& what) {
    testing::write_file(dir / "model.safetensors", bytes);
    auto ck = SafetensorsCheckpoint::open(dir);
    ASSERT_FALSE(ck.has_value()) << what;
    EXPECT_NE(ck.error().message().find(what), std::string::npos) << ck.error().message();
  };
  Bytes huge;
  huge.pod<std::uint64_t>(1ull << 62).raw("{}");
  expect_error(huge.data, "runs past the end of the file");
  expect_error(safetensors(nullptr, "") + "", "not a JSON object");
  Bytes notjson;
  notjson.pod<std::uint64_t>(5).raw("{oops");
  expect_error(notjson.data, "not valid JSON");
  auto h = good_header();
  h["w"]["dtype"] = "F17";
  expect_error(safetensors(h, data24()), "unknown dtype 'F17'");
  h = good_header();
  h["w"]["dtype"] = "F16";  // 2x2 F16 is 8 bytes, the range holds 16
  expect_error(safetensors(h, data24()), "need 8");
  h = good_header();
  h["b"]["data_offsets"] = {16, 40};
  expect_error(safetensors(h, data24()), "outside the data section");
  h = good_header();
  h["w"]["shape"] = {2, -2};
  expect_error(safetensors(h, data24()), "not a non-negative integer");
  h = good_header();
  h["w"].erase("data_offsets");
  expect_error(safetensors(h, data24()), "needs dtype");
  // The tensors must tile the data section: a damaged file whose offsets overlap, leave a hole or stop short would
  // convert into a model that runs on the wrong bytes.
  h = good_header();
  h["b"] = {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {8, 16}}};
  expect_error(safetensors(h, data24().substr(0, 16)), "overlaps");
  h = good_header();
  h["w"] = {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {0, 8}}};
  expect_error(safetensors(h, data24()), "belong to no tensor");
  expect_error(safetensors(good_header(), data24() + "junk"), "4 bytes follow the last tensor's data");
  // A tensor named twice (JSON would keep the last silently).
  std::string twice = good_header().dump();
  twice.insert(twice.size() - 1, R"(,"w":{"dtype":"BF16","shape":[4],"data_offsets":[16,24]})");
  Bytes dup;
  dup.pod<std::uint64_t>(twice.size()).raw(twice).raw(data24());
  expect_error(dup.data, "names tensor 'w' twice");
  testing::write_file(dir / "model.safetensors", "");
  std::filesystem::remove(dir / "model.safetensors");
  auto none = SafetensorsCheckpoint::open(dir);
  ASSERT_FALSE(none.has_value());
  EXPECT_NE(none.error().message().find("no model.safetensors"), std::string::npos);
}

}  // namespace
}  // namespace colibri::model
