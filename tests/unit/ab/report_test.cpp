#include "colibri/ab/report.hpp"

#include <gtest/gtest.h>

#include <random>

namespace colibri::ab {
namespace {

TEST(Paired, ClearWinWhenBAlwaysFasterByALot) {
  const std::vector<double> a = {10, 11, 9.5, 10.2, 10.8, 9.9, 10.1, 10.4};
  std::vector<double> b;
  for (double x : a) b.push_back(x * 1.5);
  const auto v = compare_paired(a, b);
  EXPECT_EQ(v.b_faster, 8);
  EXPECT_NEAR(v.sign_p, 2.0 / 256, 1e-12);  // two-sided, 8 of 8
  EXPECT_FALSE(v.within_noise);
  EXPECT_GT(v.ci_low, 0);
  EXPECT_NE(v.text.find("B is faster"), std::string::npos) << v.text;
}

TEST(Paired, WithinNoiseWhenDifferencesFlipSign) {
  std::mt19937 rng(5);
  std::normal_distribution<double> noise(0, 1);
  std::vector<double> a, b;
  for (int i = 0; i < 10; ++i) {
    a.push_back(20 + noise(rng));
    b.push_back(20 + noise(rng));
  }
  const auto v = compare_paired(a, b);
  EXPECT_TRUE(v.within_noise) << v.text;
  EXPECT_NE(v.text.find("within noise"), std::string::npos);
  EXPECT_LE(v.ci_low, 0);
  EXPECT_GE(v.ci_high, 0);
}

TEST(Paired, TooFewPairsCannotBeSignificant) {
  const auto v = compare_paired({10, 10, 10}, {20, 20, 20});
  EXPECT_NEAR(v.sign_p, 0.25, 1e-12);
  EXPECT_TRUE(v.within_noise);
  EXPECT_NE(v.text.find("more --runs"), std::string::npos) << v.text;
}

TEST(Report, PlotHasOnePolylinePerPolicyAndTheOptimum) {
  ReplayReport r;
  r.trace = "t<1>.jsonl";
  for (std::uint64_t n : {2u, 4u}) {
    SizeResults s;
    s.cache_experts = n;
    ReplayResult p;
    p.policy = "lru";
    p.accesses = 10;
    p.stats.hits = n;
    s.policies = {p};
    s.optimal = p;
    s.optimal.stats.hits = n + 1;
    r.sizes.push_back(s);
  }
  const auto html = render_html(&r, nullptr);
  std::size_t lines = 0;
  for (auto at = html.find("<polyline"); at != std::string::npos; at = html.find("<polyline", at + 1)) ++lines;
  EXPECT_EQ(lines, 2u);
  EXPECT_NE(html.find("t&lt;1&gt;.jsonl"), std::string::npos);  // escaped
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_NE(html.find("40.00%"), std::string::npos);  // 4 of 10 hits in the table
}

}  // namespace
}  // namespace colibri::ab
