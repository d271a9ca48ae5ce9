#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>
#include <string>

#include "colibri/engine/kv_cache.hpp"
#include "colibri/engine/rope.hpp"
#include "support/device_compute.hpp"

namespace colibri::engine {
namespace {

model::HyperParams params(nlohmann::json scaling = nullptr) {
  model::HyperParams hp;
  hp.head_dim = 64;
  hp.rope_theta = 500000.0;
  hp.max_position_embeddings = 131072;
  hp.rope_scaling = std::move(scaling);
  return hp;
}

TEST(Rope, DefaultFrequencies) {
  auto r = RopeFrequencies::create(params());
  ASSERT_TRUE(r) << r.error().message();
  const auto& f = r->inv_freq(10);
  ASSERT_EQ(f.size(), 32u);
  EXPECT_FLOAT_EQ(f[0], 1.0f);
  EXPECT_FLOAT_EQ(f[5], static_cast<float>(1.0 / std::pow(500000.0, 10.0 / 64)));
  EXPECT_EQ(r->attention_scaling(), 1.0f);
}

TEST(Rope, LinearDividesEveryFrequency) {
  auto base = RopeFrequencies::create(params());
  auto r = RopeFrequencies::create(params({{"rope_type", "linear"}, {"factor", 4.0}}));
  ASSERT_TRUE(r);
  for (std::size_t i = 0; i < 32; ++i) EXPECT_FLOAT_EQ(r->inv_freq(1)[i], base->inv_freq(1)[i] / 4);
}

TEST(Rope, Llama3KeepsHighFrequenciesAndScalesLowOnes) {
  auto base = RopeFrequencies::create(params());
  auto r = RopeFrequencies::create(params({{"rope_type", "llama3"},
                                           {"factor", 8.0},
                                           {"low_freq_factor", 1.0},
                                           {"high_freq_factor", 4.0},
                                           {"original_max_position_embeddings", 8192}}));
  ASSERT_TRUE(r) << r.error().message();
  const auto& f = r->inv_freq(1);
  const auto& b = base->inv_freq(1);
  int kept = 0, scaled = 0, smoothed = 0;
  for (std::size_t i = 0; i < f.size(); ++i) {
    const double wavelen = 2 * std::numbers::pi / b[i];
    if (wavelen < 8192.0 / 4) {
      EXPECT_FLOAT_EQ(f[i], b[i]);
      ++kept;
    } else if (wavelen > 8192.0) {
      EXPECT_FLOAT_EQ(f[i], b[i] / 8);
      ++scaled;
    } else {
      EXPECT_LT(f[i], b[i]);
      EXPECT_GT(f[i], b[i] / 8);
      ++smoothed;
    }
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(scaled, 0);
  EXPECT_GT(smoothed, 0);
}

TEST(Rope, YarnScalesCosSinAndInterpolatesLowFrequencies) {
  auto base = RopeFrequencies::create(params());
  auto r = RopeFrequencies::create(
      params({{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768}}));
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_NEAR(r->attention_scaling(), 0.1 * std::log(4.0) + 1.0, 1e-6);
  EXPECT_FLOAT_EQ(r->inv_freq(1)[0], base->inv_freq(1)[0]);        // extrapolated
  EXPECT_FLOAT_EQ(r->inv_freq(1)[31], base->inv_freq(1)[31] / 4);  // interpolated
}

TEST(Rope, DynamicGrowsTheBaseOnlyPastTheOriginalContext) {
  auto hp = params({{"rope_type", "dynamic"}, {"factor", 2.0}});
  hp.max_position_embeddings = 100;
  auto r = RopeFrequencies::create(hp);
  ASSERT_TRUE(r);
  const auto short_f = r->inv_freq(50);
  const auto base = short_f;
  const auto long_f = r->inv_freq(400);
  EXPECT_FLOAT_EQ(long_f[0], 1.0f);
  EXPECT_LT(long_f[10], base[10]);
  EXPECT_EQ(r->inv_freq(60), base);
}

TEST(Rope, UnknownTypeAndMissingFieldsAreErrors) {
  auto r = RopeFrequencies::create(params({{"rope_type", "longrope"}}));
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message().find("longrope"), std::string::npos);
  auto m = RopeFrequencies::create(params({{"rope_type", "llama3"}, {"factor", 8.0}}));
  ASSERT_FALSE(m);
  EXPECT_NE(m.error().message().find("low_freq_factor"), std::string::npos);
}

// Values the frequencies divide by, or cast to integers, are refused by name (a factor of 0 gave NaN logits; an
// original context of 1e300 was an undefined cast).
TEST(Rope, ZeroNegativeAndNonFiniteScalingValuesAreErrors) {
  const nlohmann::json llama3 = {{"rope_type", "llama3"},
                                 {"factor", 8.0},
                                 {"low_freq_factor", 1.0},
                                 {"high_freq_factor", 4.0},
                                 {"original_max_position_embeddings", 8192}};
  for (const char* key : {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}) {
    auto rs = llama3;
    rs[key] = 0.0;
    auto r = RopeFrequencies::create(params(rs));
    ASSERT_FALSE(r) << key;
    EXPECT_NE(r.error().message().find("> 0"), std::string::npos) << r.error().message();
  }
  auto yarn = RopeFrequencies::create(params({{"rope_type", "yarn"}, {"factor", -2.0}}));
  ASSERT_FALSE(yarn);
  EXPECT_NE(yarn.error().message().find("\"factor\" must be positive"), std::string::npos) << yarn.error().message();
  auto dynamic = RopeFrequencies::create(
      params({{"rope_type", "dynamic"}, {"factor", 2.0}, {"original_max_position_embeddings", 1e300}}));
  ASSERT_FALSE(dynamic);
  EXPECT_NE(dynamic.error().message().find("original_max_position_embeddings"), std::string::npos)
      << dynamic.error().message();
  EXPECT_TRUE(RopeFrequencies::create(params(llama3)));
}

TEST(KvCache, StoresRowsInItsType) {
  for (auto type : {sdk::DType::f32, sdk::DType::f16, sdk::DType::q8_0}) {
    auto c = KvCache::create(type, 2, 2, 32, 8);
    ASSERT_TRUE(c) << c.error().message();
    std::vector<float> k(2 * 32 * 3), v(k.size());
    for (std::size_t i = 0; i < k.size(); ++i) {
      k[i] = static_cast<float>(i) / 64.0f;
      v[i] = -static_cast<float>(i) / 32.0f;
    }
    ASSERT_TRUE(c->write(1, 2, 3, k.data(), v.data()));
    const auto keys = c->keys(1, 5);
    EXPECT_EQ(keys.type, type);
    EXPECT_EQ(keys.ne[0], 32);
    EXPECT_EQ(keys.ne[1], 2);
    EXPECT_EQ(keys.ne[2], 5);
    if (type == sdk::DType::f32) {
      const float* rows = static_cast<const float*>(keys.data) + 2 * 2 * 32;
      EXPECT_EQ(rows[0], k[0]);
      EXPECT_EQ(rows[k.size() - 1], k.back());
    }
    EXPECT_FALSE(c->write(1, 6, 3, k.data(), v.data()));  // past the context
  }
}

// Multi-head latent attention stores one row per token that is both its keys and its values: half the bytes, the
// values the keys' own rows, on the host and on a device, through write(), store() and a prefix copy.
TEST(KvCache, ValuesThatAreTheKeysAreStoredOnce) {
  EXPECT_EQ(KvCache::bytes_per_position(sdk::DType::f16, 3, 1, 576, true),
            KvCache::bytes_per_position(sdk::DType::f16, 3, 1, 576) / 2);
  EXPECT_EQ(KvCache::bytes_for(sdk::DType::q8_0, 3, 1, 576, 100, {}, true),
            KvCache::bytes_for(sdk::DType::q8_0, 3, 1, 576, 100) / 2);
  std::vector<float> k(64 * 3), junk(k.size(), std::nanf(""));
  for (std::size_t i = 0; i < k.size(); ++i) k[i] = std::sin(static_cast<float>(i));
  for (auto type : {sdk::DType::f32, sdk::DType::f16, sdk::DType::q8_0}) {
    auto c = KvCache::create(type, 2, 1, 64, 8, nullptr, {}, true);
    ASSERT_TRUE(c) << c.error().message();
    EXPECT_EQ(c->bytes(), 2u * 8u * sdk::row_bytes(type, 64)) << "keys of both layers only";
    ASSERT_TRUE(c->write(1, 2, 3, k.data(), junk.data()));  // v is not read
    const auto keys = c->keys(1, 5), values = c->values(1, 5);
    EXPECT_EQ(values.data, keys.data);
    EXPECT_EQ(values.ne, keys.ne);
    auto full = KvCache::create(type, 2, 1, 64, 8);
    ASSERT_TRUE(full->write(1, 2, 3, k.data(), k.data()));
    const std::size_t row = sdk::row_bytes(type, 64);
    const auto* a = static_cast<const std::byte*>(keys.data) + 2 * row;
    const auto* b = static_cast<const std::byte*>(full->keys(1, 5).data) + 2 * row;
    EXPECT_TRUE(std::equal(a, a + 3 * row, b)) << sdk::to_string(type);
    auto copy = KvCache::create(type, 2, 1, 64, 8, nullptr, {}, true);
    ASSERT_TRUE(copy->copy_prefix_from(*c, 5));
    const auto* d = static_cast<const std::byte*>(copy->values(1, 5).data) + 2 * row;
    EXPECT_TRUE(std::equal(a, a + 3 * row, d));
    EXPECT_FALSE(full->copy_prefix_from(*c, 5)) << "a cache with values apart is another shape";
  }
  auto gpu = std::make_shared<testing::DeviceCompute>();
  auto c = KvCache::create(sdk::DType::f16, 2, 1, 64, 8, gpu, {}, true);
  ASSERT_TRUE(c) << c.error().message();
  EXPECT_EQ(gpu->allocated, 2u * 8u * sdk::row_bytes(sdk::DType::f16, 64)) << "no value buffers";
  ASSERT_TRUE(c->write(0, 0, 3, k.data(), junk.data()));
  EXPECT_EQ(gpu->copies, 1) << "one upload: the keys";
  EXPECT_EQ(c->values(0, 3).buffer, c->keys(0, 3).buffer);
}

// The rows a host cache holds for one write, per type: what a device cache must hold too.
std::vector<std::byte> host_rows(sdk::DType type, const std::vector<float>& k, const std::vector<float>& v,
                                 bool values) {
  auto host = KvCache::create(type, 2, 2, 32, 8);
  EXPECT_TRUE(host);
  EXPECT_TRUE(host->write(1, 2, 3, k.data(), v.data()));
  const auto t = values ? host->values(1, 5) : host->keys(1, 5);
  const auto* p = static_cast<const std::byte*>(t.data);
  const std::size_t row = sdk::row_bytes(type, 32);
  return {p + 2 * 2 * row, p + 5 * 2 * row};
}

TEST(KvCache, OnADeviceHoldsTheSameRowsAndSendsOnlyTheNewOnes) {
  std::vector<float> k(2 * 32 * 3), v(k.size());
  for (std::size_t i = 0; i < k.size(); ++i) {
    k[i] = std::sin(static_cast<float>(i));
    v[i] = std::cos(static_cast<float>(i)) * 3.0f;
  }
  for (auto type : {sdk::DType::f32, sdk::DType::f16, sdk::DType::q8_0}) {
    auto gpu = std::make_shared<testing::DeviceCompute>();
    auto c = KvCache::create(type, 2, 2, 32, 8, gpu);
    ASSERT_TRUE(c) << c.error().message();
    EXPECT_TRUE(c->on_device());
    const std::size_t row = sdk::row_bytes(type, 32);
    EXPECT_EQ(gpu->allocated, 2u * 2u * 2u * 8u * row) << "K and V of both layers, every position";
    EXPECT_EQ(gpu->allocated, c->bytes());
    ASSERT_TRUE(c->write(1, 2, 3, k.data(), v.data()));
    EXPECT_EQ(gpu->copies, 2) << "one upload for K, one for V";
    for (bool values : {false, true}) {
      const auto t = values ? c->values(1, 5) : c->keys(1, 5);
      ASSERT_NE(t.buffer, nullptr);
      EXPECT_EQ(t.data, nullptr) << "unmapped device memory has no host pointer";
      EXPECT_EQ(t.offset, 0u);
      EXPECT_EQ(t.ne[2], 5);
      // The write waited for its uploads (DeviceCompute lands a copy at its wait): the rows are there now.
      const auto& bytes = static_cast<testing::DeviceCompute::DeviceBuffer*>(t.buffer)->bytes;
      const std::vector<std::byte> held(bytes.begin() + static_cast<std::ptrdiff_t>(2 * 2 * row),
                                        bytes.begin() + static_cast<std::ptrdiff_t>(5 * 2 * row));
      EXPECT_EQ(held, host_rows(type, k, v, values)) << sdk::to_string(type) << (values ? " V" : " K");
    }
    EXPECT_NE(c->keys(0, 1).buffer, c->keys(1, 1).buffer);
    EXPECT_FALSE(c->write(1, 6, 3, k.data(), v.data()));  // past the context
    EXPECT_EQ(gpu->copies, 2);
  }
}

// Rows already in device memory (the engine's activations there) are encoded there by store_rows: the same bytes
// as write() uploads, at the same place, and no copy crosses the bus.
TEST(KvCache, StoreEncodesOnTheDeviceTheBytesWriteWouldUpload) {
  std::vector<float> k(2 * 32 * 3), v(k.size());
  for (std::size_t i = 0; i < k.size(); ++i) {
    k[i] = std::sin(static_cast<float>(i) * 0.7f) * 5.0f;
    v[i] = std::cos(static_cast<float>(i)) * 3.0f;
  }
  for (auto type : {sdk::DType::f32, sdk::DType::f16, sdk::DType::q8_0}) {
    auto gpu = std::make_shared<testing::DeviceCompute>();
    auto written = KvCache::create(type, 2, 2, 32, 8, gpu);
    auto stored = KvCache::create(type, 2, 2, 32, 8, gpu);
    ASSERT_TRUE(written && stored);
    ASSERT_TRUE(stored->stores_on_device());
    ASSERT_TRUE(written->write(1, 2, 3, k.data(), v.data()));
    const int copies = gpu->copies;
    // K and V as the engine holds them: f32 {kv_heads * head_dim, T} in device buffers, at an offset.
    auto act = gpu->allocate((16 + k.size() + v.size()) * sizeof(float));
    ASSERT_TRUE(act);
    auto& act_bytes = static_cast<testing::DeviceCompute::DeviceBuffer&>(**act).bytes;
    std::memcpy(act_bytes.data() + 16 * sizeof(float), k.data(), k.size() * sizeof(float));
    std::memcpy(act_bytes.data() + (16 + k.size()) * sizeof(float), v.data(), v.size() * sizeof(float));
    sdk::Tensor kt{sdk::DType::f32, {64, 3, 1, 1}, nullptr, act->get(), 16 * sizeof(float)};
    sdk::Tensor vt{sdk::DType::f32, {64, 3, 1, 1}, nullptr, act->get(), (16 + k.size()) * sizeof(float)};
    ASSERT_TRUE(stored->store(1, 2, 3, kt, vt));
    EXPECT_EQ(gpu->copies, copies) << "nothing uploaded";
    EXPECT_EQ(gpu->store_rows_calls, 2) << "K and V";
    for (bool values : {false, true}) {
      const auto a = values ? written->values(1, 8) : written->keys(1, 8);
      const auto b = values ? stored->values(1, 8) : stored->keys(1, 8);
      EXPECT_EQ(static_cast<testing::DeviceCompute::DeviceBuffer*>(a.buffer)->bytes,
                static_cast<testing::DeviceCompute::DeviceBuffer*>(b.buffer)->bytes)
          << sdk::to_string(type) << (values ? " V" : " K");
    }
    EXPECT_FALSE(stored->store(1, 6, 3, kt, vt));  // past the context
  }
}

TEST(KvCache, OnMappedDeviceMemoryWritesInPlace) {
  auto gpu = std::make_shared<testing::DeviceCompute>();
  gpu->mapped = true;
  auto c = KvCache::create(sdk::DType::f16, 1, 1, 32, 4, gpu);
  ASSERT_TRUE(c);
  std::vector<float> k(32, 0.5f), v(32, -2.0f);
  ASSERT_TRUE(c->write(0, 3, 1, k.data(), v.data()));
  EXPECT_EQ(gpu->copies, 0);
  const auto t = c->values(0, 4);
  ASSERT_NE(t.data, nullptr);
  EXPECT_EQ(t.data, t.buffer->host_pointer());
  EXPECT_EQ(static_cast<const std::uint16_t*>(t.data)[3 * 32], 0xC000) << "-2.0 in f16 at position 3";
}

TEST(KvCache, ADeviceWithoutRoomIsAnErrorNamingTheCache) {
  auto gpu = std::make_shared<testing::DeviceCompute>();
  gpu->allocate_limit = 3 * 2 * 32 * 8;  // three of the four per-layer buffers
  auto c = KvCache::create(sdk::DType::f16, 2, 1, 32, 8, gpu);
  ASSERT_FALSE(c);
  EXPECT_EQ(c.error().code(), sdk::StatusCode::out_of_memory);
  EXPECT_NE(c.error().message().find("KV cache of 8 positions"), std::string::npos) << c.error().message();
  EXPECT_NE(c.error().message().find("device memory"), std::string::npos);
  EXPECT_EQ(gpu->allocated, 0u) << "what was allocated is given back";
}

TEST(KvCache, RejectsTypesThatDoNotFitTheHeadDim) {
  auto c = KvCache::create(sdk::DType::q8_0, 2, 2, 48, 8);
  ASSERT_FALSE(c);
  EXPECT_NE(c.error().message().find("head_dim"), std::string::npos);
  EXPECT_FALSE(KvCache::create(sdk::DType::q4_k, 2, 2, 256, 8));
}

// ---- sliding-window layers

// Position p's K row of a one-head, 32-dim layer holds p + e / 64 (exact in f32), V the negation.
void rows_of(std::int64_t position, std::int64_t count, std::vector<float>& k, std::vector<float>& v) {
  k.resize(static_cast<std::size_t>(count * 32));
  v.resize(k.size());
  for (std::int64_t t = 0; t < count; ++t) {
    for (std::int64_t e = 0; e < 32; ++e) {
      const auto i = static_cast<std::size_t>(t * 32 + e);
      k[i] = static_cast<float>(position + t) + static_cast<float>(e) / 64.0f;
      v[i] = -k[i];
    }
  }
}

// Every row a query at [position, position + count) reads is there and holds its position.
void expect_window_held(const KvCache& c, std::int64_t layer, std::int64_t window, std::int64_t position,
                        std::int64_t count, const std::string& what) {
  const std::int64_t first = c.first_position(layer);
  EXPECT_EQ(first % 64, 0) << what;
  const std::int64_t needed = window > 0 ? std::max<std::int64_t>(0, position - window + 1) : 0;
  ASSERT_LE(first, needed) << what;
  const auto keys = c.keys(layer, position + count), values = c.values(layer, position + count);
  ASSERT_EQ(keys.ne[2], position + count - first) << what;
  const auto* kr = static_cast<const float*>(keys.data);
  const auto* vr = static_cast<const float*>(values.data);
  for (std::int64_t p = needed; p < position + count; ++p) {
    const auto row = static_cast<std::size_t>((p - first) * 32);
    ASSERT_EQ(kr[row + 5], static_cast<float>(p) + 5.0f / 64.0f) << what << ": K of position " << p;
    ASSERT_EQ(vr[row + 31], -(static_cast<float>(p) + 31.0f / 64.0f)) << what << ": V of position " << p;
  }
}

TEST(KvCache, SlidingLayersKeepOnlyTheRowsTheirWindowReads) {
  const std::int64_t window = 100, max_write = 16, context = 4096;
  EXPECT_EQ(KvCache::layer_positions(window, max_write, context), 384) << "100 + 63 + 16 + 100 + 64, to 64s";
  EXPECT_EQ(KvCache::layer_positions(window, max_write, 300), 300) << "never more than the context";
  EXPECT_EQ(KvCache::layer_positions(0, max_write, context), context);
  auto c = KvCache::create(sdk::DType::f32, 2, 1, 32, context, nullptr, {{0, window}, max_write, {}});
  ASSERT_TRUE(c) << c.error().message();
  EXPECT_EQ(c->bytes(), 2u * (4096u + 384u + 227u) * 32u * 4u)
      << "the full layer keeps the context, the sliding one 384, and its checkpoint's copy up to 100 + 127";
  EXPECT_EQ(c->bytes(), KvCache::bytes_for(sdk::DType::f32, 2, 1, 32, context, {{0, window}, max_write, {}}));
  EXPECT_EQ(c->max_write(), max_write);
  std::vector<float> k, v;
  std::int64_t position = 0, moves = 0, last_first = 0;
  for (std::int64_t step = 0; position < 2000; ++step) {
    const std::int64_t count = 1 + step % max_write;  // chunks of every size, decode steps among them
    rows_of(position, count, k, v);
    for (std::int64_t l = 0; l < 2; ++l) ASSERT_TRUE(c->write(l, position, count, k.data(), v.data()));
    expect_window_held(*c, 1, window, position, count, "sliding layer at " + std::to_string(position));
    expect_window_held(*c, 0, 0, position, count, "full layer at " + std::to_string(position));
    EXPECT_EQ(c->first_position(0), 0);
    if (c->first_position(1) != last_first) ++moves;
    last_first = c->first_position(1);
    position += count;
  }
  EXPECT_GE(moves, 2000 / 384) << "the rows moved as the positions outgrew them";
  EXPECT_LE(moves, 2000 / window) << "at most once per window of positions";
  // Running on from position n needs rows from n - 99: held near the end, long gone at the start.
  EXPECT_EQ(c->reusable(position), position);
  EXPECT_EQ(c->reusable(position - 20), position - 20);
  EXPECT_EQ(c->reusable(500), 0);
  EXPECT_EQ(c->reusable(0), 0);
  rows_of(500, 1, k, v);
  auto lost = c->write(1, 500, 1, k.data(), v.data());
  ASSERT_FALSE(lost);
  EXPECT_NE(lost.message().find("no longer holds position 401"), std::string::npos) << lost.message();
  rows_of(position, max_write + 1, k, v);
  auto big = c->write(1, position, max_write + 1, k.data(), v.data());
  ASSERT_FALSE(big);
  EXPECT_NE(big.message().find("at most 16"), std::string::npos) << big.message();
  // Starting over at position 0 takes the rows from the front again.
  rows_of(0, 10, k, v);
  ASSERT_TRUE(c->write(1, 0, 10, k.data(), v.data()));
  EXPECT_EQ(c->first_position(1), 0);
  expect_window_held(*c, 1, window, 0, 10, "after starting over");
}

TEST(KvCache, CopyPrefixTakesASlidingLayersRowsWhereTheSourceStillHoldsThem) {
  const KvWindows windows{{100, 0}, 16, {}};
  auto src = KvCache::create(sdk::DType::f32, 2, 1, 32, 4096, nullptr, windows);
  auto dst = KvCache::create(sdk::DType::f32, 2, 1, 32, 4096, nullptr, windows);
  auto full = KvCache::create(sdk::DType::f32, 2, 1, 32, 4096);
  ASSERT_TRUE(src && dst && full);
  std::vector<float> k, v;
  for (std::int64_t p = 0; p < 1000; p += 10) {
    rows_of(p, 10, k, v);
    for (std::int64_t l = 0; l < 2; ++l) ASSERT_TRUE(src->write(l, p, 10, k.data(), v.data()));
  }
  ASSERT_GT(src->first_position(0), 0);
  ASSERT_TRUE(dst->copy_prefix_from(*src, 990));
  EXPECT_EQ(dst->first_position(0), src->first_position(0));
  expect_window_held(*dst, 0, 100, 980, 10, "copied sliding layer");
  expect_window_held(*dst, 1, 0, 980, 10, "copied full layer");
  auto gone = dst->copy_prefix_from(*src, 300);
  ASSERT_FALSE(gone);
  EXPECT_NE(gone.message().find("no longer holds"), std::string::npos) << gone.message();
  EXPECT_FALSE(full->copy_prefix_from(*src, 990)) << "a cache of other windows";
}

// Where a cache's rows and states live: host memory, or a device's (mapped, or not: copied there and back), whose
// backend may copy between its buffers itself (sdk::kDeviceCopyInterface).
struct CachePlace {
  const char* name;
  bool device, mapped, copies_on_device;
};
constexpr CachePlace kCachePlaces[] = {{"host", false, false, false},
                                       {"mapped", true, true, false},
                                       {"device", true, false, false},
                                       {"device copying between its buffers", true, false, true}};

// The fake device a place needs (null for host memory).
std::shared_ptr<testing::DeviceCompute> device_for(const CachePlace& place) {
  if (!place.device) return nullptr;
  auto gpu = std::make_shared<testing::DeviceCompute>();
  gpu->mapped = place.mapped;
  gpu->offer_device_copy = place.copies_on_device;
  return gpu;
}

// The first `length` positions' rows of a layer (keys or values) as bytes, wherever the cache keeps them.
std::vector<std::byte> held_rows(const KvCache& c, std::int64_t layer, bool values, std::int64_t length) {
  const auto t = values ? c.values(layer, length) : c.keys(layer, length);
  const std::size_t bytes = static_cast<std::size_t>(t.ne[1] * t.ne[2]) * sdk::row_bytes(t.type, t.ne[0]);
  const auto* p = t.data != nullptr ? static_cast<const std::byte*>(t.data)
                                    : static_cast<testing::DeviceCompute::DeviceBuffer*>(t.buffer)->bytes.data();
  return {p, p + bytes};
}

// A prefix copy between caches in any memory (the server's new sequence from a kept one, a choice of n from its
// sibling): the rows a copy between host caches gives. A device's rows travel through host memory, or between two
// caches on one device that copies between its buffers, on the device alone.
TEST(KvCache, CopyPrefixBetweenCachesInDeviceMemoryGivesTheHostCopysRows) {
  const KvWindows windows{{100, 0}, 16, {}};
  std::vector<float> k, v;
  const auto filled = [&](std::shared_ptr<testing::DeviceCompute> gpu) {
    auto c = KvCache::create(sdk::DType::f16, 2, 1, 32, 4096, gpu, windows);
    EXPECT_TRUE(c) << c.error().message();
    for (std::int64_t p = 0; p < 1000; p += 10) {
      rows_of(p, 10, k, v);
      for (std::int64_t l = 0; l < 2; ++l) EXPECT_TRUE(c->write(l, p, 10, k.data(), v.data()));
    }
    return c;
  };
  auto host_src = filled(nullptr);
  auto host_dst = KvCache::create(sdk::DType::f16, 2, 1, 32, 4096, nullptr, windows);
  ASSERT_TRUE(host_src && host_dst && host_dst->copy_prefix_from(*host_src, 990));
  for (const auto& from : kCachePlaces) {
    for (const auto& to : kCachePlaces) {
      SCOPED_TRACE(std::string(from.name) + " to " + to.name);
      const auto from_gpu = device_for(from);
      const bool one_device = from.copies_on_device && to.copies_on_device;
      const auto to_gpu = one_device ? from_gpu : device_for(to);
      auto src = filled(from_gpu);
      auto dst = KvCache::create(sdk::DType::f16, 2, 1, 32, 4096, to_gpu, windows);
      ASSERT_TRUE(src && dst);
      const int crossings = from_gpu ? from_gpu->copies + from_gpu->downloads : 0;
      const int on_device = from_gpu ? from_gpu->device_copies : 0;  // the sliding layer's moves while filled
      ASSERT_TRUE(dst->copy_prefix_from(*src, 990));
      EXPECT_EQ(dst->reusable(990), 990);
      if (one_device) {
        EXPECT_EQ(from_gpu->copies + from_gpu->downloads, crossings) << "nothing crosses the bus";
        EXPECT_EQ(from_gpu->device_copies - on_device, 4) << "K and V of two layers";
      } else if (from_gpu && !from.mapped) {
        EXPECT_GT(from_gpu->downloads, 0) << "through host memory";
      }
      for (std::int64_t l = 0; l < 2; ++l) {
        EXPECT_EQ(dst->first_position(l), host_dst->first_position(l));
        for (bool values : {false, true}) {
          EXPECT_EQ(held_rows(*dst, l, values, 990), held_rows(*host_dst, l, values, 990))
              << "layer " << l << (values ? " V" : " K");
        }
      }
    }
  }
}

// On a device (mapped or not) the rows move where they lie, to the bytes a host cache holds.
TEST(KvCache, SlidingLayersOnADeviceMoveTheirRowsLikeTheHost) {
  for (const auto& place : kCachePlaces) {
    if (!place.device) continue;
    const bool mapped = place.mapped;
    for (auto type : {sdk::DType::f16, sdk::DType::q8_0}) {
      auto gpu = device_for(place);
      const KvWindows windows{{0, 70}, 8, {}};
      auto dev = KvCache::create(type, 2, 1, 32, 2048, gpu, windows);
      auto host = KvCache::create(type, 2, 1, 32, 2048, nullptr, windows);
      ASSERT_TRUE(dev && host) << dev.error().message();
      EXPECT_EQ(gpu->allocated, dev->bytes() - dev->checkpoint_bytes()) << "checkpoints are copies in host memory";
      EXPECT_EQ(dev->checkpoint_bytes(), 2u * (70u + 127u) * sdk::row_bytes(type, 32))
          << "one checkpoint: K and V of the window, the 64 positions before it and 63 of alignment";
      std::vector<float> k, v;
      for (std::int64_t p = 0; p < 700; p += 7) {
        rows_of(p, 7, k, v);
        for (std::int64_t l = 0; l < 2; ++l) {
          auto written = dev->write(l, p, 7, k.data(), v.data());
          ASSERT_TRUE(written) << written.message();
          ASSERT_TRUE(host->write(l, p, 7, k.data(), v.data()));
        }
        ASSERT_EQ(dev->first_position(1), host->first_position(1));
        for (bool values : {false, true}) {
          const auto d = values ? dev->values(1, p + 7) : dev->keys(1, p + 7);
          const auto h = values ? host->values(1, p + 7) : host->keys(1, p + 7);
          ASSERT_EQ(d.ne[2], h.ne[2]);
          const std::size_t bytes = static_cast<std::size_t>(h.ne[2]) * sdk::row_bytes(type, 32);
          const auto& held = static_cast<testing::DeviceCompute::DeviceBuffer*>(d.buffer)->bytes;
          ASSERT_EQ(0, std::memcmp(held.data(), h.data, bytes))
              << (mapped ? "mapped " : "") << sdk::to_string(type) << (values ? " V" : " K") << " at " << p;
        }
      }
      EXPECT_GT(dev->first_position(1), 0);
      if (mapped) {
        EXPECT_EQ(gpu->downloads, 0) << "mapped rows move in place";
      } else if (place.copies_on_device) {
        EXPECT_EQ(gpu->downloads, 0) << "rows move on the device";
        EXPECT_GT(gpu->device_copies, 0);
      } else {
        EXPECT_GT(gpu->downloads, 0) << "unmapped rows move through the host";
      }
      // A saved window goes down and comes back up to the host cache's bytes.
      ASSERT_TRUE(dev->checkpoint(700));
      ASSERT_TRUE(host->checkpoint(700));
      for (std::int64_t p = 700; p < 1200; p += 7) {
        rows_of(p, 7, k, v);
        for (std::int64_t l = 0; l < 2; ++l) {
          ASSERT_TRUE(dev->write(l, p, 7, k.data(), v.data()));
          ASSERT_TRUE(host->write(l, p, 7, k.data(), v.data()));
        }
      }
      ASSERT_EQ(dev->rewind(900), 700);
      ASSERT_EQ(host->rewind(900), 700);
      ASSERT_EQ(dev->first_position(1), host->first_position(1));
      for (bool values : {false, true}) {
        const auto d = values ? dev->values(1, 700) : dev->keys(1, 700);
        const auto h = values ? host->values(1, 700) : host->keys(1, 700);
        const std::size_t bytes = static_cast<std::size_t>(h.ne[2]) * sdk::row_bytes(type, 32);
        const auto& held = static_cast<testing::DeviceCompute::DeviceBuffer*>(d.buffer)->bytes;
        EXPECT_EQ(0, std::memcmp(held.data(), h.data, bytes)) << "restored " << (values ? "V" : "K");
      }
    }
  }
}

// Positions [from, to) of a two-layer cache's rows, ten at a time (rows_of's values).
void write_both_layers(KvCache& c, std::int64_t from, std::int64_t to) {
  std::vector<float> k, v;
  for (std::int64_t p = from; p < to; p += 10) {
    rows_of(p, 10, k, v);
    for (std::int64_t l = 0; l < 2; ++l) ASSERT_TRUE(c.write(l, p, 10, k.data(), v.data()));
  }
}

// A checkpoint at a prompt's end is where a next turn that does not share the reply returns to, after the rows moved
// on.
TEST(KvCache, RewindPutsBackTheWindowSavedAtAPromptsEnd) {
  const std::int64_t window = 100;
  auto c = KvCache::create(sdk::DType::f32, 2, 1, 32, 4096, nullptr, {{window, 0}, 16, {}});
  ASSERT_TRUE(c);
  auto run_to = [&](std::int64_t from, std::int64_t to) { write_both_layers(*c, from, to); };
  run_to(0, 1000);
  ASSERT_TRUE(c->checkpoint(1000));
  run_to(1000, 2000);  // the reply
  ASSERT_GT(c->first_position(0), 1000 - window);
  // Saved: what 1000 and the 64 positions before it read, i.e. from 832 (1000 - 99 - 64, to 64s).
  EXPECT_EQ(c->reusable(1000), 1000);
  EXPECT_EQ(c->reusable(1500), 1000) << "past the saved window, back to it";
  EXPECT_EQ(c->reusable(950), 950);
  EXPECT_EQ(c->reusable(931), 931);
  EXPECT_EQ(c->reusable(930), 0) << "reads from 831, before the saved rows";
  EXPECT_EQ(c->reusable(1995), 1995) << "the rows held now serve the end";
  EXPECT_EQ(c->rewind(1995), 1995);
  EXPECT_EQ(c->rewind(1500), 1000);
  EXPECT_EQ(c->first_position(0), 832);
  expect_window_held(*c, 0, window, 999, 1, "after rewinding to the saved window");
  expect_window_held(*c, 1, 0, 999, 1, "full layer after rewinding");
  // Running on from there writes over the saved positions' successors: the saved window now ends at 1000 at most.
  run_to(1000, 1500);
  expect_window_held(*c, 0, window, 1490, 10, "running on after the rewind");
  EXPECT_EQ(c->reusable(1000), 1000);
  EXPECT_EQ(c->rewind(950), 950);
  expect_window_held(*c, 0, window, 949, 1, "rewound inside the saved window");
  run_to(950, 1600);
  EXPECT_EQ(c->reusable(1000), 950) << "positions from 950 on are no longer those saved";
  // Nothing saved, or a window the rows no longer hold: nothing to return to.
  auto d = KvCache::create(sdk::DType::f32, 2, 1, 32, 4096, nullptr, {{window, 0}, 16, {}});
  ASSERT_TRUE(d);
  write_both_layers(*d, 0, 1000);
  EXPECT_EQ(d->rewind(500), 0);
  ASSERT_TRUE(d->checkpoint(500));  // not held any more: nothing saved
  EXPECT_EQ(d->reusable(500), 0);
}

// A recurrent layer's state as floats the test may read and write: host data, or a fake device buffer's bytes.
float* state_floats(const sdk::Tensor& t) {
  if (t.data != nullptr) return static_cast<float*>(t.data);
  auto& bytes = static_cast<testing::DeviceCompute::DeviceBuffer*>(t.buffer)->bytes;
  return reinterpret_cast<float*>(bytes.data() + t.offset);
}

// Recurrent layers (Qwen3-Next's gated delta rule) keep a state instead of rows: the cache serves only where a
// state is kept, where it is now and where checkpoint() copied it, and a copy needs one of those at its count. On a
// device the state lives there (the passes read and write it in place) and checkpoints are host copies.
TEST(KvCache, RecurrentStatesServeOnlyWhereTheyAreKept) {
  const KvWindows windows{{}, 0, {0, 6}};  // layer 0 attends, layer 1 carries 6 floats
  for (const auto& place : kCachePlaces) {
    SCOPED_TRACE(place.name);
    const auto gpu = device_for(place);
    auto c = KvCache::create(sdk::DType::f32, 2, 1, 32, 64, gpu, windows);
    ASSERT_TRUE(c);
    EXPECT_TRUE(c->has_recurrent());
    EXPECT_FALSE(c->recurrent(0));
    EXPECT_TRUE(c->recurrent(1));
    EXPECT_EQ(c->bytes(), KvCache::bytes_for(sdk::DType::f32, 1, 1, 32, 64) + 2 * 6 * sizeof(float))
        << "one attention layer's rows, a state and its saved copy";
    if (gpu) {
      EXPECT_EQ(gpu->allocated, c->bytes() - c->checkpoint_bytes()) << "the rows and the state in device memory";
    }
    EXPECT_EQ(c->max_write(), 64) << "a recurrent layer limits no write";
    EXPECT_FALSE(c->state_for(0, 0)) << "an attention layer has no state";
    // A pass of 5 positions from zeros.
    auto run = [&](std::int64_t from, std::int64_t to, float value) {
      std::vector<float> k, v;
      rows_of(from, to - from, k, v);
      ASSERT_TRUE(c->write(0, from, to - from, k.data(), v.data()));
      auto st = c->state_for(1, from);
      ASSERT_TRUE(st) << st.error().message();
      EXPECT_EQ(st->buffer != nullptr, place.device);
      float* f = state_floats(*st);
      if (from == 0) {
        EXPECT_TRUE(std::all_of(f, f + 6, [](float x) { return x == 0.0f; })) << "zeros at 0";
      }
      std::fill(f, f + 6, value);
      c->state_written(1, to);
    };
    run(0, 5, 1.0f);
    EXPECT_EQ(c->reusable(5), 5);
    EXPECT_EQ(c->reusable(9), 5) << "where the state is, at most n";
    EXPECT_EQ(c->reusable(4), 0) << "no state at 4";
    auto wrong = c->state_for(1, 3);
    ASSERT_FALSE(wrong);
    EXPECT_NE(wrong.error().message().find("at position 5, not 3"), std::string::npos) << wrong.error().message();
    ASSERT_TRUE(c->checkpoint(5));
    run(5, 9, 2.0f);  // the reply
    EXPECT_EQ(c->reusable(9), 9);
    EXPECT_EQ(c->reusable(7), 5) << "back to the saved state";
    {
      // A copy needs a state at its count: where it is, or saved.
      auto d = KvCache::create(sdk::DType::f32, 2, 1, 32, 64, gpu, windows);
      ASSERT_TRUE(d);
      EXPECT_FALSE(d->copy_prefix_from(*c, 7));
      ASSERT_TRUE(d->copy_prefix_from(*c, 5));
      EXPECT_EQ(d->reusable(5), 5);
      auto copied = d->state_for(1, 5);
      ASSERT_TRUE(copied);
      EXPECT_EQ(state_floats(*copied)[0], 1.0f) << "the saved state, not the current one";
      const int before = gpu ? gpu->device_copies : 0;
      ASSERT_TRUE(d->copy_prefix_from(*c, 9));
      EXPECT_EQ(d->reusable(9), 9);
      auto current = d->state_for(1, 9);
      ASSERT_TRUE(current);
      EXPECT_EQ(state_floats(*current)[5], 2.0f) << "the state where it is";
      if (place.copies_on_device) {
        EXPECT_EQ(gpu->device_copies - before, 3) << "layer 0's K and V rows and layer 1's state, on the device";
      }
    }
    // Rewinding to the saved state puts it back; running on from it keeps it saved.
    EXPECT_EQ(c->rewind(7), 5);
    auto back = c->state_for(1, 5);
    ASSERT_TRUE(back);
    EXPECT_EQ(state_floats(*back)[5], 1.0f);
    c->state_written(1, 5);
    run(5, 8, 3.0f);
    EXPECT_EQ(c->reusable(6), 5);
    // A pass that fails part way leaves the state lost: only the saved one serves.
    ASSERT_TRUE(c->state_for(1, 8));
    EXPECT_EQ(c->reusable(8), 5);
    // Running from before the saved position drops it; nothing is kept before the new state.
    EXPECT_EQ(c->rewind(3), 0);
    run(0, 4, 4.0f);
    EXPECT_EQ(c->reusable(5), 4);
    EXPECT_EQ(c->reusable(3), 0);
  }
}

// Several checkpoints (memory.kv_checkpoints): a later prompt returns to the furthest one it shares; positions run
// again forget those past them; one more than the cache keeps pushes out the least recently made or returned to.
TEST(KvCache, CheckpointsKeepSeveralStatesAndForgetTheLeastRecentlyUsed) {
  KvWindows windows{{}, 0, {0, 6}};
  windows.checkpoints = 3;
  auto c = KvCache::create(sdk::DType::f32, 2, 1, 32, 64, nullptr, windows);
  ASSERT_TRUE(c);
  EXPECT_TRUE(c->keeps_checkpoints());
  EXPECT_EQ(c->bytes(), KvCache::bytes_for(sdk::DType::f32, 1, 1, 32, 64) + 4 * 6 * sizeof(float))
      << "the state and three checkpoints' copies";
  EXPECT_EQ(c->checkpoint_bytes(), 3 * 6 * sizeof(float));
  // Each pass leaves the state filled with its end position.
  auto run = [&](std::int64_t from, std::int64_t to) {
    std::vector<float> k, v;
    rows_of(from, to - from, k, v);
    ASSERT_TRUE(c->write(0, from, to - from, k.data(), v.data()));
    auto st = c->state_for(1, from);
    ASSERT_TRUE(st) << st.error().message();
    if (from > 0) {
      ASSERT_EQ(state_floats(*st)[0], static_cast<float>(from)) << "the state a pass from " << from << " starts with";
    }
    std::fill_n(state_floats(*st), 6, static_cast<float>(to));
    c->state_written(1, to);
  };
  auto state_at = [&](std::int64_t at) {
    auto st = c->state_for(1, at);
    if (!st) return -1.0f;
    c->state_written(1, at);
    return state_floats(*st)[3];
  };
  run(0, 5);
  ASSERT_TRUE(c->checkpoint(5));
  run(5, 10);
  ASSERT_TRUE(c->checkpoint(10));
  ASSERT_TRUE(c->checkpoint(7)) << "no state at 7: nothing kept, no error";
  run(10, 15);
  ASSERT_TRUE(c->checkpoint(15));
  run(15, 20);
  EXPECT_EQ(c->checkpoint_positions(), (std::vector<std::int64_t>{5, 10, 15}));
  EXPECT_EQ(c->reusable(20), 20);
  EXPECT_EQ(c->reusable(17), 15);
  EXPECT_EQ(c->reusable(12), 10);
  EXPECT_EQ(c->reusable(9), 5);
  EXPECT_EQ(c->reusable(4), 0);
  // Back to 10: its state, and 15 is forgotten (positions from 10 on will be run again).
  EXPECT_EQ(c->rewind(12), 10);
  EXPECT_EQ(state_at(10), 10.0f);
  EXPECT_EQ(c->checkpoint_positions(), (std::vector<std::int64_t>{5, 10}));
  run(10, 14);
  ASSERT_TRUE(c->checkpoint(14));
  run(14, 18);
  // A fourth: 5, made first and never returned to, goes (10 was returned to).
  ASSERT_TRUE(c->checkpoint(18));
  EXPECT_EQ(c->checkpoint_positions(), (std::vector<std::int64_t>{10, 14, 18}));
  // Asking again for one it keeps makes it the most recent: the next one pushes out 14, not 10.
  ASSERT_TRUE(c->checkpoint(10));
  run(18, 21);
  ASSERT_TRUE(c->checkpoint(21));
  EXPECT_EQ(c->checkpoint_positions(), (std::vector<std::int64_t>{10, 18, 21}));
  EXPECT_EQ(c->rewind(20), 18);
  EXPECT_EQ(state_at(18), 18.0f);
  // A copy takes a state from a checkpoint too.
  auto d = KvCache::create(sdk::DType::f32, 2, 1, 32, 64, nullptr, windows);
  ASSERT_TRUE(d);
  ASSERT_TRUE(d->copy_prefix_from(*c, 10));
  EXPECT_EQ(d->reusable(64), 10);
  EXPECT_TRUE(d->checkpoint_positions().empty()) << "a copy starts with none of its own";
  EXPECT_FALSE(d->copy_prefix_from(*c, 14)) << "14 was pushed out";
  // None kept (memory.kv_checkpoints: 0), or nothing that needs one (full attention alone): nothing is kept.
  windows.checkpoints = 0;
  auto e = KvCache::create(sdk::DType::f32, 2, 1, 32, 64, nullptr, windows);
  ASSERT_TRUE(e);
  EXPECT_FALSE(e->keeps_checkpoints());
  EXPECT_EQ(e->checkpoint_bytes(), 0u);
  auto full = KvCache::create(sdk::DType::f32, 2, 1, 32, 64);
  ASSERT_TRUE(full);
  EXPECT_FALSE(full->keeps_checkpoints());
  ASSERT_TRUE(full->checkpoint(0));
  EXPECT_TRUE(full->checkpoint_positions().empty());
}

// Sliding layers' checkpoints: each serves its position and the 64 before it, after the rows moved on; the furthest
// one that serves is put back.
TEST(KvCache, SlidingLayersReturnToTheFurthestCheckpointThatServes) {
  const std::int64_t window = 100;
  KvWindows windows{{window, 0}, 16, {}};
  windows.checkpoints = 2;
  auto c = KvCache::create(sdk::DType::f32, 2, 1, 32, 4096, nullptr, windows);
  ASSERT_TRUE(c);
  auto run_to = [&](std::int64_t from, std::int64_t to) { write_both_layers(*c, from, to); };
  run_to(0, 500);
  ASSERT_TRUE(c->checkpoint(500));  // a system prompt's end
  run_to(500, 1000);
  ASSERT_TRUE(c->checkpoint(1000));  // the prompt's end
  run_to(1000, 2000);
  EXPECT_EQ(c->reusable(1500), 1000);
  EXPECT_EQ(c->reusable(990), 990);
  EXPECT_EQ(c->reusable(900), 500) << "reads from 801, before the second checkpoint's rows: back to the first";
  EXPECT_EQ(c->reusable(499), 499);
  EXPECT_EQ(c->rewind(800), 500);
  expect_window_held(*c, 0, window, 499, 1, "back to the first checkpoint");
  EXPECT_EQ(c->checkpoint_positions(), (std::vector<std::int64_t>{500})) << "1000 is past the positions run again";
  run_to(500, 700);
  expect_window_held(*c, 0, window, 690, 10, "running on from the checkpoint");
}

}  // namespace
}  // namespace colibri::engine
