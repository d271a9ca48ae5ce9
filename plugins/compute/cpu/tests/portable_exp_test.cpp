// portable_exp: the CPU backend's own e^x for attention (kernels.hpp says why it does not call std::exp).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "../kernels.hpp"

namespace {

using colibri::cpu::portable_exp;
using colibri::cpu::softmax_block_scalar;

// Distance in units in the last place between a float and the exact value.
double ulps(float got, double want) {
  const float w = static_cast<float>(want);
  const double ulp = std::nextafter(w, std::numeric_limits<float>::infinity()) - w;
  return std::fabs(static_cast<double>(got) - want) / ulp;
}

TEST(PortableExp, IsWithinTwoUlpOverTheWholeRangeItComputes) {
  double worst = 0.0;
  float at = 0.0f;
  // Every 64th float from the bottom of the range to 0, and a stretch above it.
  for (std::uint32_t b = std::bit_cast<std::uint32_t>(colibri::cpu::kPortableExpMin); b > 0x80000000u; b -= 64) {
    const float x = std::bit_cast<float>(b);
    const double e = ulps(portable_exp(x), std::exp(static_cast<double>(x)));
    if (e > worst) worst = e, at = x;
  }
  for (float x = 0.0f; x <= colibri::cpu::kPortableExpMax; x += 0.001f) {
    const double e = ulps(portable_exp(x), std::exp(static_cast<double>(x)));
    if (e > worst) worst = e, at = x;
  }
  EXPECT_LE(worst, 2.0) << "worst at x = " << at;
}

TEST(PortableExp, EdgesAreExact) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(portable_exp(0.0f), 1.0f);
  EXPECT_EQ(portable_exp(-0.0f), 1.0f);
  EXPECT_EQ(portable_exp(-kInf), 0.0f);  // the first key block's correction (running max -inf)
  EXPECT_EQ(portable_exp(-87.5f), 0.0f);
  EXPECT_GT(portable_exp(-86.9f), 0.0f);
  EXPECT_EQ(portable_exp(kInf), kInf);
  EXPECT_EQ(portable_exp(88.5f), kInf);
  EXPECT_TRUE(std::isnan(portable_exp(std::numeric_limits<float>::quiet_NaN())));
}

TEST(SoftmaxBlock, ScalesTakesTheMaxAndExponentiates) {
  for (int n : {1, 7, 16, 17, 64}) {
    std::vector<float> s(static_cast<std::size_t>(n)), raw(s.size());
    for (int j = 0; j < n; ++j) raw[static_cast<std::size_t>(j)] = static_cast<float>((j * 37) % 23) - 11.0f;
    s = raw;
    float sum = -1.0f;
    const float m = -3.0f;
    const float mn = softmax_block_scalar(s.data(), n, 0.5f, m, &sum);
    float want_max = m;
    double want_sum = 0.0;
    for (float r : raw) want_max = std::max(want_max, r * 0.5f);
    EXPECT_EQ(mn, want_max) << "n = " << n;
    for (int j = 0; j < n; ++j) {
      const float want = portable_exp(raw[static_cast<std::size_t>(j)] * 0.5f - mn);
      EXPECT_EQ(s[static_cast<std::size_t>(j)], want) << "n = " << n << ", j = " << j;
      want_sum += want;
    }
    EXPECT_NEAR(sum, want_sum, 1e-6 * want_sum) << "n = " << n;
  }
}

TEST(SoftmaxBlock, ANaNScoreDoesNotBecomeTheMaximum) {
  std::vector<float> s{1.0f, std::numeric_limits<float>::quiet_NaN(), 2.0f};
  float sum = 0.0f;
  EXPECT_EQ(softmax_block_scalar(s.data(), 3, 1.0f, -std::numeric_limits<float>::infinity(), &sum), 2.0f);
  EXPECT_TRUE(std::isnan(s[1]));
  EXPECT_EQ(s[2], 1.0f);
  EXPECT_TRUE(std::isnan(sum));  // the NaN reaches the output instead of vanishing
}

}  // namespace
