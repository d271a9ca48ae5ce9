#include "colibri/util/bytes_text.hpp"

#include <gtest/gtest.h>

#include <string>

namespace {

using colibri::util::bytes_text;

// MiB up to a thousand and more, then the unit that keeps a whole number in front: ab replay with --expert-bytes 1T
// printed "4194304.0 MiB".
TEST(BytesText, ScalesToTheUnitThatKeepsAWholeNumberInFront) {
  EXPECT_EQ(bytes_text(0), "0.0 MiB");
  EXPECT_EQ(bytes_text(6u << 20), "6.0 MiB");
  EXPECT_EQ(bytes_text(1023ull << 20), "1023.0 MiB");
  EXPECT_EQ(bytes_text(1ull << 30), "1.0 GiB");
  EXPECT_EQ(bytes_text((1ull << 30) - 1), "1.0 GiB");  // not "1024.0 MiB"
  EXPECT_EQ(bytes_text(3ull << 29), "1.5 GiB");
  EXPECT_EQ(bytes_text(4ull << 40), "4.0 TiB");
  EXPECT_EQ(bytes_text(2048ull << 40), "2048.0 TiB");  // no unit past TiB
}

// A size shown for the user to pass back as a budget (ab replay's "cache 8 experts (19.0 MiB)") is rounded up: 8 slots
// of 19.02 MiB in all, shown rounded to 19.0 MiB, gave 7 slots when passed as --expert-cache-size 19.0M.
TEST(BytesText, RoundedUpItIsNeverLessThanTheBytes) {
  using colibri::util::Rounding;
  const std::uint64_t eight_slots = (19ull << 20) + (20ull << 10);  // 19.02 MiB
  EXPECT_EQ(bytes_text(eight_slots), "19.0 MiB");
  EXPECT_EQ(bytes_text(eight_slots, Rounding::up), "19.1 MiB");
  EXPECT_EQ(bytes_text(6u << 20, Rounding::up), "6.0 MiB");  // exact stays exact
  EXPECT_EQ(bytes_text((6u << 20) + 1, Rounding::up), "6.1 MiB");
  EXPECT_EQ(bytes_text((1023ull << 20) + (95ull << 20) / 100, Rounding::up), "1.0 GiB");  // 1023.95 MiB: 1024.0 up
  EXPECT_EQ(bytes_text((1ull << 30) + 1, Rounding::up), "1.1 GiB");
  for (std::uint64_t b = 1; b < (64ull << 20); b = b * 3 + 7) {
    const std::string text = bytes_text(b, Rounding::up);
    const double mib = std::stod(text) * (text.ends_with("GiB") ? 1024.0 : 1.0);
    EXPECT_GE(mib * 1048576.0, static_cast<double>(b)) << text;
  }
}

}  // namespace
