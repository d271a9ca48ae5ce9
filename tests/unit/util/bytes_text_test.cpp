#include "colibri/util/bytes_text.hpp"

#include <gtest/gtest.h>

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

}  // namespace
