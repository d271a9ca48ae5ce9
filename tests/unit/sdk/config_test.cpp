#include "colibri/sdk/config.hpp"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>

#include "colibri/quant/blocks.hpp"
#include "colibri/sdk/dtype.hpp"
#include "colibri/sdk/os_error.hpp"
#include "colibri/sdk/status.hpp"

namespace {

using namespace colibri::sdk;
namespace quant = colibri::quant;

TEST(ParseSize, UnitsAreBinary) {
  EXPECT_EQ(*parse_size("4096"), 4096u);
  EXPECT_EQ(*parse_size("64K"), 64u * 1024);
  EXPECT_EQ(*parse_size("512M"), 512ull << 20);
  EXPECT_EQ(*parse_size("8G"), 8ull << 30);
  EXPECT_EQ(*parse_size("8g"), 8ull << 30);
  EXPECT_EQ(*parse_size("8GiB"), 8ull << 30);
  EXPECT_EQ(*parse_size("8GB"), 8ull << 30);
  EXPECT_EQ(*parse_size("1.5G"), 3ull << 29);
  EXPECT_EQ(*parse_size("2T"), 2ull << 40);
  EXPECT_EQ(*parse_size(" 16 M "), 16ull << 20);
  EXPECT_EQ(*parse_size("4Gi"), 4ull << 30);
}

TEST(ParseSize, RejectsNonsense) {
  for (const char* bad : {"", "G", "eight", "8X", "-1G", "1.5", "1.5B", "8 gigs", "nan", "4Gx", "4ii"}) {
    auto v = parse_size(bad);
    EXPECT_FALSE(v) << bad;
    if (!v) {
      EXPECT_NE(v.error().message().find("512M"), std::string::npos);
    }
  }
  // Well written, but past what a size can be: said so, not "not a size".
  for (const char* huge : {"1e30T", "17179869184G", "99999999T", "8388608T", "9223372036854775808"}) {
    auto v = parse_size(huge);
    ASSERT_FALSE(v) << huge;
    EXPECT_EQ(v.error().message(), "'" + std::string(huge) +
                                       "' is too large a size (it must be below 8388608T); check the number and its "
                                       "unit");
  }
  EXPECT_EQ(*parse_size("8388607T"), 8388607ULL << 40);
}

// "Gb" is gigabits by convention: refused with the byte spelling to use, not read as gigabytes; "-0" is not a size.
TEST(ParseSize, BitsAndNegativeZeroAreRefused) {
  for (const char* bits : {"4Gb", "512Mb", "64 Kb", "2Tb"}) {
    auto v = parse_size(bits);
    ASSERT_FALSE(v) << bits;
    EXPECT_NE(v.error().message().find("reads as bits"), std::string::npos) << v.error().message();
  }
  EXPECT_NE(parse_size("4Gb").error().message().find("write 4G or 4GB"), std::string::npos);
  EXPECT_FALSE(parse_size("-0"));
  EXPECT_FALSE(parse_size("-0M"));
  EXPECT_EQ(*parse_size("0"), 0u);
  EXPECT_EQ(*parse_size("8gb"), 8ull << 30);  // all lower case: the common spelling of bytes
}

TEST(FormatSize, RoundTrips) {
  for (std::uint64_t v : {0ull, 1ull, 1023ull, 1024ull, 1536ull, 8ull << 30, 512ull << 20, 3ull << 29}) {
    auto back = parse_size(format_size(v));
    ASSERT_TRUE(back) << format_size(v);
    EXPECT_EQ(*back, v) << format_size(v);
  }
  EXPECT_EQ(format_size(8ull << 30), "8G");
}

TEST(OptionValues, ParseByType) {
  OptionSpec b{"b", OptionType::boolean, "", ""};
  EXPECT_EQ(std::get<bool>(parse_option_value(b, "true")->value), true);
  EXPECT_EQ(std::get<bool>(parse_option_value(b, "off")->value), false);
  EXPECT_FALSE(parse_option_value(b, "1"));
  EXPECT_EQ(std::get<bool>(parse_option_value(b, "True")->value), true);  // YAML's spellings
  EXPECT_EQ(std::get<bool>(parse_option_value(b, "NO")->value), false);
  OptionSpec n{"n", OptionType::number, "", ""};
  EXPECT_EQ(std::get<double>(parse_option_value(n, "2.5")->value), 2.5);
  for (const char* bad : {"nan", "inf", "-inf", "1e999"}) EXPECT_FALSE(parse_option_value(n, bad)) << bad;
  OptionSpec i{"i", OptionType::integer, "", "", true};
  EXPECT_EQ(std::get<std::int64_t>(parse_option_value(i, "-12")->value), -12);
  EXPECT_TRUE(parse_option_value(i, "auto")->is_auto);
  EXPECT_FALSE(parse_option_value(i, "12abc"));
  OptionSpec i_no_auto{"i", OptionType::integer, "", ""};
  auto na = parse_option_value(i_no_auto, "auto");
  ASSERT_FALSE(na);
  EXPECT_NE(na.error().message().find("not an integer"), std::string::npos);
  OptionSpec l{"l", OptionType::string_list, "", ""};
  auto list = parse_option_value(l, "[a, 'b c', \"d\"]");
  ASSERT_TRUE(list);
  EXPECT_EQ(std::get<std::vector<std::string>>(list->value), (std::vector<std::string>{"a", "b c", "d"}));
  EXPECT_TRUE(std::get<std::vector<std::string>>(parse_option_value(l, "[]")->value).empty());
  EXPECT_FALSE(parse_option_value(l, "[a, b"));
  // Paths are strings to a plugin (the core resolves them against the profile that wrote them).
  OptionSpec path{"p", OptionType::path, "", ""}, paths{"ps", OptionType::path_list, "", ""};
  EXPECT_EQ(std::get<std::string>(parse_option_value(path, " ../h.json ")->value), "../h.json");
  EXPECT_EQ(std::get<std::vector<std::string>>(parse_option_value(paths, "[d1, '/d 2']")->value),
            (std::vector<std::string>{"d1", "/d 2"}));
  EXPECT_EQ(colibri::sdk::to_string(OptionType::path_list), "list of paths");
}

TEST(ConfigView, TypedGettersAndFallbacks) {
  std::map<std::string, ConfigValue, std::less<>> m;
  m["depth"] = ConfigValue{std::int64_t{32}};
  m["name"] = ConfigValue{std::string("x")};
  m["threads"] = ConfigValue{std::string("auto"), true};
  ConfigView v(m);
  EXPECT_EQ(*v.get_int("depth", 1), 32);
  EXPECT_EQ(*v.get_int("missing", 7), 7);
  EXPECT_EQ(*v.get_int("threads", 4), 4);  // auto -> the caller's fallback
  EXPECT_TRUE(v.is_auto("threads"));
  EXPECT_EQ(*v.get_number("depth", 0.0), 32.0);
  auto wrong = v.get_bool("name", false);
  ASSERT_FALSE(wrong);
  EXPECT_NE(wrong.error().message().find("'name' is not a boolean"), std::string::npos);
}

TEST(ClosestMatch, SuggestsOnlyNearWords) {
  const std::vector<std::string> keys{"expert_cache", "vram_budget", "kv_cache"};
  EXPECT_EQ(closest_match("vram_buget", keys), "vram_budget");
  EXPECT_EQ(closest_match("EXPERT_CACHE", keys), "expert_cache");
  EXPECT_EQ(closest_match("completely_different", keys), "");
}

TEST(Status, CarriesRetryAndDataLossFlags) {
  Status s(StatusCode::io_error, "read failed", true, false);
  EXPECT_FALSE(s);
  EXPECT_TRUE(s.retryable());
  EXPECT_EQ(s.with_context("L3/E5").to_string(), "io_error: L3/E5: read failed (retryable)");
  Expected<int> e(Status{});  // an ok Status is not an error value
  EXPECT_FALSE(e.has_value());
  EXPECT_EQ(e.error().code(), StatusCode::internal);
}

// The errors a user fixes outside colibri say where; the others are the OS's words alone.
TEST(OsErrorText, NamesTheFixForLimitsAndPermissionsOnly) {
  EXPECT_EQ(os_error_text(ENOENT), std::strerror(ENOENT));
  EXPECT_NE(os_error_text(EMFILE).find("ulimit -n"), std::string::npos);
  EXPECT_NE(os_error_text(ENFILE).find("LimitNOFILE="), std::string::npos);
  EXPECT_NE(os_error_text(EACCES).find("permissions"), std::string::npos);
  EXPECT_EQ(os_error_text(EACCES).rfind(std::strerror(EACCES), 0), 0u);
}

// One wording for what a path is, in the core and in every plugin (it said "not a regular file (a directory, FIFO or
// device)" in some places and named the kind in others).
TEST(FileKindText, NamesWhatAPathIs) {
  const auto dir = std::filesystem::temp_directory_path() / ("colibri-file-kind-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  ASSERT_EQ(::mkfifo((dir / "fifo").c_str(), 0600), 0);
  std::filesystem::create_symlink(dir / "nothing", dir / "dangling");
  std::filesystem::create_symlink(dir / "loop", dir / "loop");
  std::filesystem::create_symlink(dir / "fifo", dir / "to-fifo");
  EXPECT_EQ(colibri::sdk::path_kind_text(dir.string()), "a directory");
  EXPECT_EQ(colibri::sdk::path_kind_text((dir / "fifo").string()), "a named pipe (FIFO)");
  EXPECT_EQ(colibri::sdk::path_kind_text((dir / "to-fifo").string()), "a named pipe (FIFO)");  // through the link
  EXPECT_EQ(colibri::sdk::path_kind_text("/dev/null"), "a device");
  EXPECT_EQ(colibri::sdk::path_kind_text((dir / "dangling").string()), "a link to nothing or a link loop");
  EXPECT_EQ(colibri::sdk::path_kind_text((dir / "loop").string()), "a link to nothing or a link loop");
  EXPECT_EQ(colibri::sdk::path_kind_text((dir / "absent").string()), "missing");
  EXPECT_EQ(colibri::sdk::file_kind_text(S_IFSOCK), "a socket");
  EXPECT_EQ(colibri::sdk::file_kind_text(S_IFREG), "not a regular file");  // only asked about the others
  std::filesystem::remove_all(dir);
}

TEST(DType, GgmlIdsAndBlockSizes) {
  EXPECT_EQ(static_cast<int>(DType::q4_k), 12);
  EXPECT_EQ(static_cast<int>(DType::bf16), 30);
  EXPECT_EQ(row_bytes(DType::q4_k, 4096), 16u * 144);
  EXPECT_EQ(row_bytes(DType::q8_0, 64), 68u);
  EXPECT_EQ(row_bytes(DType::q4_k, 100), 0u);  // not whole blocks
  EXPECT_EQ(parse_dtype("Q6_K"), DType::q6_k);
  EXPECT_FALSE(parse_dtype("q7_k").has_value());
  EXPECT_EQ(dtype_traits_by_id(99), nullptr);
}

// What data_alignment promises is what the block structs the kernels cast to need.
TEST(DType, DataAlignmentIsWhatTheBlockStructsNeed) {
  EXPECT_EQ(data_alignment(DType::q4_0), alignof(quant::BlockQ4_0));
  EXPECT_EQ(data_alignment(DType::q8_0), alignof(quant::BlockQ8_0));
  EXPECT_EQ(data_alignment(DType::q2_k), alignof(quant::BlockQ2_K));
  EXPECT_EQ(data_alignment(DType::q3_k), alignof(quant::BlockQ3_K));
  EXPECT_EQ(data_alignment(DType::q4_k), alignof(quant::BlockQ4_K));
  EXPECT_EQ(data_alignment(DType::q5_k), alignof(quant::BlockQ5_K));
  EXPECT_EQ(data_alignment(DType::q6_k), alignof(quant::BlockQ6_K));
  EXPECT_EQ(data_alignment(DType::mxfp4), alignof(quant::BlockMXFP4));
  EXPECT_EQ(data_alignment(DType::f32), alignof(float));
  EXPECT_EQ(data_alignment(DType::f16), alignof(std::uint16_t));
  EXPECT_EQ(data_alignment(DType::bf16), alignof(std::uint16_t));
  EXPECT_EQ(data_alignment(DType::i64), alignof(std::int64_t));
  // Every row of whole blocks keeps the alignment, so a view of row r of an aligned tensor is aligned too.
  for (int id = 0; id < 64; ++id) {
    const auto* t = dtype_traits_by_id(static_cast<std::uint32_t>(id));
    if (t != nullptr) {
      EXPECT_EQ(t->block_bytes % data_alignment(t->type), 0u) << t->name;
    }
  }
  EXPECT_EQ(data_alignment(static_cast<DType>(99)), 1u);
}

}  // namespace
