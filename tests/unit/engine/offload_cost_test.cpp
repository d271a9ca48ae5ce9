#include "colibri/engine/offload_cost.hpp"

#include <gtest/gtest.h>

namespace colibri::engine {
namespace {

// A PCIe 4 x16 link, an H100-class device and a 2-channel desktop CPU, in bytes per second.
OffloadCost desktop() {
  OffloadCost c;
  c.upload_bytes_per_second = 25e9;
  c.device_bytes_per_second = 2000e9;
  c.cpu_bytes_per_second = 50e9;
  c.cpu_extra_token = 0.5;
  return c;
}

TEST(OffloadCost, TheCpuWinsForFewTokensAndTheUploadForMany) {
  const OffloadCost c = desktop();
  const std::uint64_t expert = 100u << 20;
  // One token: the CPU reads 100 MiB at 50 GB/s (2.1 ms); uploading takes 4.2 ms at 25 GB/s, plus the device's run.
  EXPECT_TRUE(c.cpu_faster(expert, 1));
  EXPECT_TRUE(c.cpu_faster(expert, 3));   // 2.1 ms x (1 + 2 x 0.5) = 4.2 ms, still below 4.2 + 0.05 ms
  EXPECT_FALSE(c.cpu_faster(expert, 4));  // 5.2 ms
  EXPECT_EQ(c.cpu_token_limit(), 3);
  // The decision does not depend on the expert's size: both sides are linear in bytes.
  EXPECT_EQ(c.cpu_faster(4096, 3), c.cpu_faster(expert, 3));
  EXPECT_EQ(c.cpu_faster(4096, 4), c.cpu_faster(expert, 4));
}

TEST(OffloadCost, LimitsAtTheEdges) {
  OffloadCost c = desktop();
  c.upload_bytes_per_second = 100e9;  // the bus outruns the CPU even at one token
  EXPECT_EQ(c.cpu_token_limit(), 0);
  EXPECT_FALSE(c.cpu_faster(1 << 20, 1));
  c = desktop();
  c.cpu_extra_token = 0;  // further tokens cost the CPU nothing: it always wins
  EXPECT_EQ(c.cpu_token_limit(), -1);
  EXPECT_TRUE(c.cpu_faster(1 << 20, 100000));
  c = OffloadCost{};  // not measured: never the CPU
  EXPECT_FALSE(c.valid());
  EXPECT_FALSE(c.cpu_faster(1 << 20, 1));
  EXPECT_EQ(c.cpu_token_limit(), 0);
}

TEST(OffloadCost, DescribeGivesTheRatesAndTheVerdict) {
  const std::string text = desktop().describe();
  EXPECT_NE(text.find("upload 25.00 GB/s"), std::string::npos) << text;
  EXPECT_NE(text.find("CPU 50.00 GB/s at one token (+50% per token)"), std::string::npos) << text;
  EXPECT_NE(text.find("up to 3 tokens"), std::string::npos) << text;
}

}  // namespace
}  // namespace colibri::engine
