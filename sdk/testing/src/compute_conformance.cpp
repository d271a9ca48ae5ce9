#include "colibri/sdk/testing/compute_conformance.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iomanip>
#include <limits>
#include <random>
#include <span>
#include <sstream>

#include "colibri/quant/float16.hpp"
#include "colibri/quant/quant.hpp"
#include "colibri/sdk/testing/expect_values.hpp"
#include "colibri/sdk/testing/plugin_loader.hpp"
#include "colibri/sdk/testing/reference_ops.hpp"
#include "colibri/sdk/testing/test_data.hpp"

namespace colibri::sdk::testing {

int compute_conformance_anchor() {
  return 1;
}

std::string ComputeParamName(const ::testing::TestParamInfo<ComputeParam>& info) {
  std::string n = std::filesystem::path(info.param.library).stem().string() + "_" + info.param.label;
  for (char& c : n) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return n;
}

namespace {

using Ne = std::array<std::int64_t, 4>;

// The required weight types, then the optional mxfp4 (tested where a backend's supports() claims it).
constexpr DType kWeightTypes[] = {DType::f32,  DType::f16,  DType::bf16, DType::q8_0, DType::q4_0, DType::q2_k,
                                  DType::q3_k, DType::q4_k, DType::q5_k, DType::q6_k, DType::mxfp4};
constexpr DType kKvTypes[] = {DType::f32, DType::f16, DType::q8_0};

struct Made {
  std::shared_ptr<Compute> compute;
  std::string error;
  bool skip = false;
};

Made make_compute(const ComputeParam& p, const std::map<std::string, std::string>& extra = {}) {
  Made m;
  auto lib = LoadedPlugin::load(p.library);
  if (!lib) {
    m.error = lib.error().to_string();
    return m;
  }
  auto options = p.options;
  for (const auto& [k, v] : extra) options[k] = v;
  auto c = (*lib)->create_as<Compute>(options);
  if (!c) {
    m.skip = c.error().code() == StatusCode::unsupported;
    m.error = c.error().to_string();
    return m;
  }
  m.compute = *c;
  return m;
}

#define COMPUTE_FIXTURE_WITH(var, extra)                     \
  auto var##_made = make_compute(GetParam(), extra);         \
  if (var##_made.skip) GTEST_SKIP() << var##_made.error;     \
  ASSERT_TRUE(var##_made.error.empty()) << var##_made.error; \
  Compute& var = *var##_made.compute

#define COMPUTE_FIXTURE(var) COMPUTE_FIXTURE_WITH(var, (std::map<std::string, std::string>{}))

std::size_t tensor_bytes(DType type, const Ne& ne) {
  return row_bytes(type, ne[0]) * static_cast<std::size_t>(ne[1] * ne[2] * ne[3]);
}

// A host array the suite moves into a device buffer for the call and back afterwards.
struct Arg {
  DType type;
  Ne ne;
  void* host;
};

Arg arg(DType type, Ne ne, void* host) {
  return Arg{type, ne, host};
}
template <typename T>
Arg arg(DType type, Ne ne, std::vector<T>& v) {
  return Arg{type, ne, v.data()};
}

// Runs one op the way the engine does on any backend: tensors in buffers from allocate(),
// uploaded with copy_to_device_async and read back with copy_to_host_async. `share_inputs`: an input equal to an
// earlier one (host array, type and shape) is the same tensor, as one X the engine passes to several experts.
Status run_op(Compute& c, Op op, std::vector<Arg> in, std::vector<Arg> out, OpParams params = {},
              bool share_inputs = false) {
  std::vector<std::unique_ptr<Buffer>> keep;
  auto place = [&](const Arg& a, Tensor& t) -> Status {
    const std::size_t bytes = tensor_bytes(a.type, a.ne);
    auto b = c.allocate(std::max<std::size_t>(bytes, 1));
    if (!b) return b.error();
    if (bytes > 0) {
      auto ev = c.copy_to_device_async(a.host, **b, 0, bytes);
      if (!ev) return ev.error();
      if (auto s = (*ev)->wait(); !s) return s;
    }
    t = Tensor{a.type, a.ne, nullptr, b->get(), 0};
    keep.push_back(std::move(*b));
    return {};
  };
  std::vector<Tensor> ti(in.size()), to(out.size());
  for (std::size_t i = 0; i < in.size(); ++i) {
    const auto same = [&](const Arg& a) { return a.host == in[i].host && a.type == in[i].type && a.ne == in[i].ne; };
    const auto first = share_inputs ? std::find_if(in.begin(), in.begin() + static_cast<std::ptrdiff_t>(i), same)
                                    : in.begin() + static_cast<std::ptrdiff_t>(i);
    if (first != in.begin() + static_cast<std::ptrdiff_t>(i)) {
      ti[i] = ti[static_cast<std::size_t>(first - in.begin())];
    } else if (auto s = place(in[i], ti[i]); !s) {
      return s;
    }
  }
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (auto s = place(out[i], to[i]); !s) return s;
  }
  OpCall call{op, ti, to, params};
  if (auto s = c.run(call); !s) return s;
  for (std::size_t i = 0; i < out.size(); ++i) {
    const std::size_t bytes = tensor_bytes(out[i].type, out[i].ne);
    auto ev = c.copy_to_host_async(*to[i].buffer, 0, out[i].host, bytes);
    if (!ev) return ev.error();
    if (auto s = (*ev)->wait(); !s) return s;
  }
  return c.synchronize();
}

struct Weights {
  DType type;
  std::int64_t k, n;
  std::vector<std::byte> bytes;
  std::vector<float> dequant;  // what the reference multiplies with
};

Weights make_weights(DType type, std::int64_t k, std::int64_t n, unsigned seed, float sigma = 0.1f) {
  Weights w{type, k, n, {}, {}};
  const auto f = randn(static_cast<std::size_t>(k * n), seed, sigma);
  w.bytes.resize(row_bytes(type, k) * static_cast<std::size_t>(n));
  auto s = quant::quantize_row(type, f.data(), w.bytes.data(), k * n);
  if (!s) throw std::runtime_error(s.to_string());
  w.dequant = ref::dequantize(type, w.bytes.data(), k * n);
  return w;
}

// Collects mismatches and reports the first few with their index.
class Mismatches {
 public:
  explicit Mismatches(std::string what) : what_(std::move(what)) {}
  void check(std::size_t i, double got, double want, double tol) {
    if (std::fabs(got - want) <= tol) return;  // NaN fails here too
    if (count_++ < 4) text_ << "\n  [" << i << "] got " << got << ", want " << want << " (tolerance " << tol << ")";
  }
  ~Mismatches() {
    if (count_ > 0) ADD_FAILURE() << what_ << ": " << count_ << " mismatches" << text_.str();
  }

 private:
  std::string what_;
  std::ostringstream text_;
  int count_ = 0;
};

std::string label(DType t) {
  return std::string(to_string(t));
}

// Quantized weights may quantize each token's activations to 8 bits (any block size up to the row):
// each x moves by at most half a step of amax/127.
bool may_quantize_activations(DType t) {
  return dtype_traits(t)->quantized;
}
double activation_rounding(DType t) {
  if (t == DType::f16) return std::ldexp(1.0, -11);
  if (t == DType::bf16) return std::ldexp(1.0, -8);
  return 0.0;
}

// `given`: the reference's Y when the caller has it (matmul_heads' per head), else ref::matmul's.
void check_matmul(DType type, const Weights& w, const std::vector<float>& x, std::int64_t t, const float* bias,
                  const std::vector<float>& y, bool exact, const std::string& what,
                  const std::vector<double>* given = nullptr) {
  const std::int64_t k = w.k, n = w.n;
  const auto want = given != nullptr ? *given : ref::matmul(DType::f32, w.dequant.data(), k, n, x.data(), t, bias);
  Mismatches mm(what);
  double err2 = 0.0, budget2 = 0.0;
  for (std::int64_t i = 0; i < t; ++i) {
    float amax = 0.0f;
    for (std::int64_t j = 0; j < k; ++j) amax = std::max(amax, std::fabs(x[static_cast<std::size_t>(i * k + j)]));
    const double step = amax / 127.0;
    for (std::int64_t r = 0; r < n; ++r) {
      double abs_wx = 0.0, abs_w = 0.0, w2 = 0.0;
      for (std::int64_t j = 0; j < k; ++j) {
        const double wv = w.dequant[static_cast<std::size_t>(r * k + j)];
        abs_wx += std::fabs(wv * x[static_cast<std::size_t>(i * k + j)]);
        abs_w += std::fabs(wv);
        w2 += wv * wv;
      }
      double tol = 1e-5 * abs_wx + 1e-6;
      if (!exact) {
        if (may_quantize_activations(type)) tol += 0.5 * step * abs_w * 1.001;
        tol += activation_rounding(type) * abs_wx * 1.01;
      }
      const auto idx = static_cast<std::size_t>(i * n + r);
      mm.check(idx, y[idx], want[idx], tol);
      err2 += (y[idx] - want[idx]) * (y[idx] - want[idx]);
      budget2 += w2 * step * step / 12.0;
    }
  }
  if (!exact && may_quantize_activations(type)) {
    // Rounding errors are spread, not worst-case: the total must look like honest 8-bit rounding.
    EXPECT_LE(err2, 4.0 * budget2 + 1e-10) << what << ": error energy beyond 8-bit activation rounding";
  }
}

}  // namespace

// ------------------------------------------------------------------ plugin surface

TEST_P(ComputeConformance, DescriptorIsCompute) {
  auto lib = LoadedPlugin::load(GetParam().library);
  ASSERT_TRUE(lib) << lib.error().to_string();
  EXPECT_EQ((*lib)->descriptor().kind, PluginKind::compute);
}

TEST_P(ComputeConformance, DevicesDescribeThemselves) {
  COMPUTE_FIXTURE(c);
  auto devs = c.devices();
  ASSERT_FALSE(devs.empty());
  for (const auto& d : devs) {
    EXPECT_FALSE(d.name.empty());
    if (d.memory_total > 0) {
      EXPECT_LE(d.memory_available, d.memory_total) << d.name;
    }
    if (!d.host_memory) {
      EXPECT_GT(d.memory_total, 0u) << d.name << ": a device with its own memory must say how much";
    }
  }
}

TEST_P(ComputeConformance, BuffersRoundTripAndRejectOutOfRangeCopies) {
  COMPUTE_FIXTURE(c);
  auto b = c.allocate(1000);
  ASSERT_TRUE(b) << b.error().to_string();
  EXPECT_EQ((*b)->size(), 1000u);
  if (void* p = (*b)->host_pointer(); p != nullptr) {
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % 64, 0u) << "host buffers must be 64-byte aligned";
  }
  std::vector<unsigned char> src(600), back(600, 0);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 7 + 1);
  auto up = c.copy_to_device_async(src.data(), **b, 300, 600);
  ASSERT_TRUE(up) << up.error().to_string();
  ASSERT_TRUE((*up)->wait());
  auto down = c.copy_to_host_async(**b, 300, back.data(), 600);
  ASSERT_TRUE(down) << down.error().to_string();
  ASSERT_TRUE((*down)->wait());
  EXPECT_TRUE((*down)->ready());
  EXPECT_EQ(src, back);
  auto bad_copy = c.copy_to_device_async(src.data(), **b, 500, 600);
  EXPECT_FALSE(bad_copy && (*bad_copy)->wait()) << "a copy past the end of a buffer must fail";
}

// The engine starts a layer's expert uploads together and reuses their RAM slots before waiting (sdk/compute.hpp).
TEST_P(ComputeConformance, UploadSourceMayBeReusedOnceTheCallReturns) {
  COMPUTE_FIXTURE(c);
  constexpr std::size_t kBytes = 1 << 20;  // large enough that a backend copying lazily would still be at work
  auto b = c.allocate(2 * kBytes);
  ASSERT_TRUE(b) << b.error().to_string();
  std::vector<unsigned char> src(kBytes), back(2 * kBytes, 0);
  std::vector<std::unique_ptr<sdk::Event>> events;
  for (std::size_t part = 0; part < 2; ++part) {
    for (std::size_t i = 0; i < kBytes; ++i) src[i] = static_cast<unsigned char>(i * 13 + part * 101 + 5);
    auto up = c.copy_to_device_async(src.data(), **b, part * kBytes, kBytes);
    ASSERT_TRUE(up) << up.error().to_string();
    events.push_back(std::move(*up));
  }
  std::fill(src.begin(), src.end(), 0);
  for (auto& ev : events) ASSERT_TRUE(ev->wait());
  auto down = c.copy_to_host_async(**b, 0, back.data(), back.size());
  ASSERT_TRUE(down) << down.error().to_string();
  ASSERT_TRUE((*down)->wait());
  for (std::size_t part = 0; part < 2; ++part) {
    for (std::size_t i = 0; i < kBytes; i += 4093) {
      ASSERT_EQ(back[part * kBytes + i], static_cast<unsigned char>(i * 13 + part * 101 + 5))
          << "copy " << part << ", byte " << i << ": the upload read its source after copy_to_device_async returned";
    }
  }
}

// kDeviceCopyInterface (optional): a copy between buffers reads what an op queued before it wrote, a second copy
// reads what the first wrote, an op after the event reads the copy, and nothing outside the ranges changes.
TEST_P(ComputeConformance, CopiesBetweenBuffersFollowTheOpsBeforeThemAndRefuseBadRanges) {
  COMPUTE_FIXTURE(c);
  auto* copier = static_cast<ComputeDeviceCopy*>(c.query_interface(kDeviceCopyInterface));
  if (copier == nullptr) GTEST_SKIP() << "the backend does not copy between its buffers (kDeviceCopyInterface)";
  constexpr std::size_t kN = 4096;  // floats per range
  constexpr std::size_t kBytes = kN * sizeof(float);
  const auto x = randn(kN, 61), y = randn(kN, 62);
  std::vector<float> sentinel(3 * kN, -7.0f);
  auto upload = [&](const void* src, std::size_t bytes) -> std::unique_ptr<Buffer> {
    auto b = c.allocate(bytes);
    EXPECT_TRUE(b) << b.error().to_string();
    if (!b) return nullptr;
    auto ev = c.copy_to_device_async(src, **b, 0, bytes);
    EXPECT_TRUE(ev && (*ev)->wait());
    return std::move(*b);
  };
  auto bx = upload(x.data(), kBytes), by = upload(y.data(), kBytes), sum = upload(sentinel.data(), kBytes);
  auto dst = upload(sentinel.data(), 3 * kBytes), again = upload(sentinel.data(), kBytes);
  ASSERT_TRUE(bx && by && sum && dst && again);
  const Ne ne{static_cast<std::int64_t>(kN), 1, 1, 1};
  std::vector<Tensor> in{{DType::f32, ne, nullptr, bx.get(), 0}, {DType::f32, ne, nullptr, by.get(), 0}};
  std::vector<Tensor> out{{DType::f32, ne, nullptr, sum.get(), 0}};
  ASSERT_TRUE(c.run(OpCall{Op::add, in, out, {}}));  // not waited for: the copy must come after it
  auto first = copier->copy_between_async(*sum, 0, *dst, kBytes, kBytes);
  ASSERT_TRUE(first) << first.error().to_string();
  auto second = copier->copy_between_async(*dst, kBytes, *dst, 2 * kBytes, kBytes);  // one buffer, apart
  ASSERT_TRUE(second) << second.error().to_string();
  ASSERT_TRUE((*first)->wait());
  ASSERT_TRUE((*second)->wait());
  EXPECT_TRUE((*second)->ready());
  // An op reads the copy: x + (x + y).
  std::vector<Tensor> in2{{DType::f32, ne, nullptr, bx.get(), 0}, {DType::f32, ne, nullptr, dst.get(), 2 * kBytes}};
  std::vector<Tensor> out2{{DType::f32, ne, nullptr, again.get(), 0}};
  ASSERT_TRUE(c.run(OpCall{Op::add, in2, out2, {}}));
  std::vector<float> held(3 * kN), twice(kN);
  auto down = c.copy_to_host_async(*dst, 0, held.data(), 3 * kBytes);
  auto down2 = c.copy_to_host_async(*again, 0, twice.data(), kBytes);
  ASSERT_TRUE(down && (*down)->wait() && down2 && (*down2)->wait());
  for (std::size_t u = 0; u < kN; ++u) {
    const std::size_t i = u;
    ASSERT_EQ(bits_of(held[u]), bits_of(-7.0f)) << "byte range before the copy changed at " << i;
    ASSERT_EQ(bits_of(held[kN + u]), bits_of(x[u] + y[u])) << "the first copy did not read the add at " << i;
    ASSERT_EQ(bits_of(held[2 * kN + u]), bits_of(x[u] + y[u])) << "the second copy did not read the first at " << i;
    ASSERT_EQ(bits_of(twice[u]), bits_of(x[u] + (x[u] + y[u]))) << "the op after the copy read at " << i;
  }
  // Bad calls: answered, never run.
  const auto refused = [&](const Buffer& from, std::size_t at, Buffer& to, std::size_t to_at, std::size_t bytes) {
    auto e = copier->copy_between_async(from, at, to, to_at, bytes);
    if (e) (void)(*e)->wait();
    return !e && e.error().code() == StatusCode::invalid_argument;
  };
  EXPECT_TRUE(refused(*dst, 0, *dst, 8, 64)) << "overlapping ranges of one buffer";
  EXPECT_TRUE(refused(*dst, 8, *dst, 0, 64)) << "overlapping ranges of one buffer";
  EXPECT_TRUE(refused(*sum, 8, *dst, 0, kBytes)) << "a source range past its buffer's end";
  EXPECT_TRUE(refused(*sum, 0, *dst, 2 * kBytes + 4, kBytes)) << "a destination range past its buffer's end";
  auto other_made = make_compute(GetParam());
  ASSERT_TRUE(other_made.compute) << other_made.error;
  auto foreign = other_made.compute->allocate(kBytes);
  ASSERT_TRUE(foreign);
  EXPECT_TRUE(refused(**foreign, 0, *dst, 0, kBytes)) << "a buffer of another compute object";
  EXPECT_TRUE(refused(*sum, 0, **foreign, 0, kBytes)) << "a buffer of another compute object";
  auto zero = copier->copy_between_async(*sum, 0, *dst, 0, 0);
  ASSERT_TRUE(zero && (*zero)->wait()) << "an empty copy is done";
  ASSERT_TRUE(c.synchronize());
}

// ------------------------------------------------------------------ matmul

TEST_P(ComputeConformance, MatmulMatchesReferenceOnEveryWeightType) {
  COMPUTE_FIXTURE(c);
  const std::int64_t k = 512, n = 37;
  for (DType type : kWeightTypes) {
    if (!c.supports(Op::matmul, type)) continue;
    const auto w = make_weights(type, k, n, 11);
    const auto bias = randn(static_cast<std::size_t>(n), 5);
    for (std::int64_t t : {1, 3, 17}) {
      const auto x = randn(static_cast<std::size_t>(k * t), static_cast<unsigned>(100 + t));
      for (bool exact : {true, false}) {
        const bool with_bias = t == 3;
        std::vector<float> y(static_cast<std::size_t>(n * t), std::nanf(""));
        std::vector<Arg> in{arg(type, {k, n, 1, 1}, const_cast<std::byte*>(w.bytes.data())),
                            arg(DType::f32, {k, t, 1, 1}, const_cast<float*>(x.data()))};
        if (with_bias) in.push_back(arg(DType::f32, {n, 1, 1, 1}, const_cast<float*>(bias.data())));
        OpParams p;
        p.flags = exact ? kExactActivations : 0;
        const std::string what = "matmul " + label(type) + " T=" + std::to_string(t) + (exact ? " exact" : "");
        auto s = run_op(c, Op::matmul, in, {arg(DType::f32, {n, t, 1, 1}, y)}, p);
        ASSERT_TRUE(s) << what << ": " << s.to_string();
        check_matmul(type, w, x, t, with_bias ? bias.data() : nullptr, y, exact, what);
      }
    }
  }
}

TEST_P(ComputeConformance, MatmulTokenResultDoesNotDependOnTheBatch) {
  COMPUTE_FIXTURE(c);
  const std::int64_t k = 512, n = 64, t = 7;
  for (DType type : kWeightTypes) {
    if (!c.supports(Op::matmul, type)) continue;
    const auto w = make_weights(type, k, n, 21);
    auto x = randn(static_cast<std::size_t>(k * t), 22);
    for (bool exact : {false, true}) {
      OpParams p;
      p.flags = exact ? kExactActivations : 0;
      std::vector<float> batch(static_cast<std::size_t>(n * t));
      auto wb = const_cast<std::byte*>(w.bytes.data());
      ASSERT_TRUE(run_op(c, Op::matmul, {arg(type, {k, n, 1, 1}, wb), arg(DType::f32, {k, t, 1, 1}, x)},
                         {arg(DType::f32, {n, t, 1, 1}, batch)}, p));
      for (std::int64_t i = 0; i < t; ++i) {
        std::vector<float> one(static_cast<std::size_t>(n));
        ASSERT_TRUE(run_op(c, Op::matmul,
                           {arg(type, {k, n, 1, 1}, wb), arg(DType::f32, {k, 1, 1, 1}, x.data() + i * k)},
                           {arg(DType::f32, {n, 1, 1, 1}, one)}, p));
        EXPECT_EQ(0, std::memcmp(one.data(), batch.data() + i * n, one.size() * sizeof(float)))
            << "matmul " << label(type) << (exact ? " exact" : "") << ": token " << i
            << " differs alone and in a batch of 7";
      }
      std::vector<float> mid(static_cast<std::size_t>(n * 3));
      ASSERT_TRUE(run_op(c, Op::matmul, {arg(type, {k, n, 1, 1}, wb), arg(DType::f32, {k, 3, 1, 1}, x.data() + 2 * k)},
                         {arg(DType::f32, {n, 3, 1, 1}, mid)}, p));
      EXPECT_EQ(0, std::memcmp(mid.data(), batch.data() + 2 * n, mid.size() * sizeof(float)))
          << "matmul " << label(type) << ": tokens 2..4 differ in a batch of 3 and of 7";
    }
  }
}

TEST_P(ComputeConformance, ResultsDoNotDependOnThreadCount) {
  COMPUTE_FIXTURE_WITH(one, (std::map<std::string, std::string>{{"threads", "1"}}));
  COMPUTE_FIXTURE_WITH(two, (std::map<std::string, std::string>{{"threads", "2"}}));
  const std::int64_t k = 512, n = 96, t = 7;
  auto x = randn(static_cast<std::size_t>(k * t), 31);
  for (DType type : kWeightTypes) {
    if (!one.supports(Op::matmul, type)) continue;
    const auto w = make_weights(type, k, n, 32);
    auto wb = const_cast<std::byte*>(w.bytes.data());
    std::vector<float> y1(static_cast<std::size_t>(n * t)), y2(y1.size());
    ASSERT_TRUE(run_op(one, Op::matmul, {arg(type, {k, n, 1, 1}, wb), arg(DType::f32, {k, t, 1, 1}, x)},
                       {arg(DType::f32, {n, t, 1, 1}, y1)}));
    ASSERT_TRUE(run_op(two, Op::matmul, {arg(type, {k, n, 1, 1}, wb), arg(DType::f32, {k, t, 1, 1}, x)},
                       {arg(DType::f32, {n, t, 1, 1}, y2)}));
    EXPECT_EQ(0, std::memcmp(y1.data(), y2.data(), y1.size() * sizeof(float))) << "matmul " << label(type);
  }
  // Attention over a long cache.
  const std::int64_t hd = 64, h = 8, kvh = 2, s = 300;
  auto q = randn(static_cast<std::size_t>(hd * h * t), 33);
  auto kc = randn(static_cast<std::size_t>(hd * kvh * s), 34);
  auto vc = randn(static_cast<std::size_t>(hd * kvh * s), 35);
  OpParams p;
  p.position = 250;
  p.scale = 0.125f;
  std::vector<float> o1(q.size()), o2(q.size());
  std::vector<Arg> in{arg(DType::f32, {hd, h, t, 1}, q), arg(DType::f32, {hd, kvh, s, 1}, kc),
                      arg(DType::f32, {hd, kvh, s, 1}, vc)};
  ASSERT_TRUE(run_op(one, Op::attention, in, {arg(DType::f32, {hd, h, t, 1}, o1)}, p));
  ASSERT_TRUE(run_op(two, Op::attention, in, {arg(DType::f32, {hd, h, t, 1}, o2)}, p));
  EXPECT_EQ(0, std::memcmp(o1.data(), o2.data(), o1.size() * sizeof(float))) << "attention";
}

// ------------------------------------------------------------------ expert_ffn

TEST_P(ComputeConformance, ExpertFfnMatchesReferenceAndTheComposedOps) {
  COMPUTE_FIXTURE(c);
  const std::int64_t d = 256, f = 512;
  // The last two only where supports() claims mxfp4; the mixed one shares its X between q4_0 and mxfp4 weights.
  const DType combos[][3] = {{DType::f32, DType::f32, DType::f32},       {DType::q4_k, DType::q4_k, DType::q6_k},
                             {DType::q8_0, DType::q8_0, DType::q8_0},    {DType::q4_0, DType::q4_0, DType::q5_k},
                             {DType::bf16, DType::f16, DType::q2_k},     {DType::q3_k, DType::q3_k, DType::q4_k},
                             {DType::mxfp4, DType::mxfp4, DType::mxfp4}, {DType::q4_0, DType::mxfp4, DType::q8_0}};
  for (const auto& combo : combos) {
    if (!c.supports(Op::expert_ffn, combo[0]) || !c.supports(Op::expert_ffn, combo[1]) ||
        !c.supports(Op::expert_ffn, combo[2])) {
      continue;
    }
    const auto g = make_weights(combo[0], d, f, 41);
    const auto u = make_weights(combo[1], d, f, 42);
    const auto dn = make_weights(combo[2], f, d, 43);
    auto gb = const_cast<std::byte*>(g.bytes.data());
    auto ub = const_cast<std::byte*>(u.bytes.data());
    auto db = const_cast<std::byte*>(dn.bytes.data());
    for (std::int64_t t : {1, 5}) {
      auto x = randn(static_cast<std::size_t>(d * t), static_cast<unsigned>(44 + t));
      const auto want = ref::expert_ffn(DType::f32, g.dequant.data(), DType::f32, u.dequant.data(), DType::f32,
                                        dn.dequant.data(), d, f, x.data(), t);
      double rms = 0.0;
      for (double v : want) rms += v * v;
      rms = std::sqrt(rms / static_cast<double>(want.size()));
      for (bool exact : {true, false}) {
        const std::string what = "expert_ffn " + label(combo[0]) + "/" + label(combo[1]) + "/" + label(combo[2]) +
                                 " T=" + std::to_string(t) + (exact ? " exact" : "");
        OpParams p;
        p.flags = exact ? kExactActivations : 0;
        std::vector<float> y(static_cast<std::size_t>(d * t));
        auto s = run_op(c, Op::expert_ffn,
                        {arg(combo[0], {d, f, 1, 1}, gb), arg(combo[1], {d, f, 1, 1}, ub),
                         arg(combo[2], {f, d, 1, 1}, db), arg(DType::f32, {d, t, 1, 1}, x)},
                        {arg(DType::f32, {d, t, 1, 1}, y)}, p);
        ASSERT_TRUE(s) << what << ": " << s.to_string();
        double err2 = 0.0;
        for (std::size_t i = 0; i < y.size(); ++i) err2 += (y[i] - want[i]) * (y[i] - want[i]);
        const double rel = std::sqrt(err2 / static_cast<double>(y.size())) / rms;
        EXPECT_LT(rel, exact ? 1e-4 : 0.03) << what << ": relative RMS error";

        // The contract: the same numerics as matmul + swiglu + matmul.
        std::vector<float> gate(static_cast<std::size_t>(f * t)), up(gate.size()), h(gate.size()), y2(y.size());
        ASSERT_TRUE(run_op(c, Op::matmul, {arg(combo[0], {d, f, 1, 1}, gb), arg(DType::f32, {d, t, 1, 1}, x)},
                           {arg(DType::f32, {f, t, 1, 1}, gate)}, p));
        ASSERT_TRUE(run_op(c, Op::matmul, {arg(combo[1], {d, f, 1, 1}, ub), arg(DType::f32, {d, t, 1, 1}, x)},
                           {arg(DType::f32, {f, t, 1, 1}, up)}, p));
        ASSERT_TRUE(run_op(c, Op::swiglu, {arg(DType::f32, {f, t, 1, 1}, gate), arg(DType::f32, {f, t, 1, 1}, up)},
                           {arg(DType::f32, {f, t, 1, 1}, h)}));
        ASSERT_TRUE(run_op(c, Op::matmul, {arg(combo[2], {f, d, 1, 1}, db), arg(DType::f32, {f, t, 1, 1}, h)},
                           {arg(DType::f32, {d, t, 1, 1}, y2)}, p));
        EXPECT_EQ(0, std::memcmp(y.data(), y2.data(), y.size() * sizeof(float)))
            << what << ": differs from the composed ops";
      }
    }
  }
}

// ------------------------------------------------------------------ expert_ffn_group, expert_ffn_clamped_group

namespace {

struct GroupExpert {
  DType g, u, dn;
  std::int64_t f, t;
};

// One expert_ffn_group or expert_ffn_clamped_group call's data: per expert its three weights, X (its own, or one
// shared by every expert of the same T) and Y (NaN until run), and for the clamped op its three biases.
struct GroupCall {
  Op op = Op::expert_ffn_group, single = Op::expert_ffn;
  std::size_t stride = 4;  // inputs per expert
  std::vector<Weights> w;
  std::vector<std::vector<float>> x, y, biases;
  std::vector<Arg> in, out;
  bool shared_x = false;  // run with one tensor for each distinct X
  bool supported = true;  // supports(op, t) for every weight type t in the call
};

// `clamped`: expert_ffn_clamped_group, with biases that push gate and up past the clamps of group_params below.
// `shared_x`: the experts of the same T read one X.
GroupCall make_group(Compute& c, std::int64_t d, std::span<const GroupExpert> experts, unsigned seed0,
                     bool clamped = false, bool shared_x = false) {
  GroupCall g;
  if (clamped) {
    g.op = Op::expert_ffn_clamped_group;
    g.single = Op::expert_ffn_clamped;
    g.stride = 7;
  }
  g.shared_x = shared_x;
  for (const GroupExpert& e : experts) {
    for (DType t : {e.g, e.u, e.dn}) g.supported = g.supported && c.supports(g.op, t);
  }
  std::vector<std::size_t> x_of;  // expert i reads g.x[x_of[i]]
  for (std::size_t i = 0; i < experts.size(); ++i) {
    const GroupExpert& e = experts[i];
    const auto seed = static_cast<unsigned>(seed0 + g.stride * i);
    g.w.push_back(make_weights(e.g, d, e.f, seed));
    g.w.push_back(make_weights(e.u, d, e.f, seed + 1));
    g.w.push_back(make_weights(e.dn, e.f, d, seed + 2));
    std::size_t xi = g.x.size();
    for (std::size_t j = 0; shared_x && j < i; ++j) {
      if (experts[j].t == e.t) {
        xi = x_of[j];
        break;
      }
    }
    if (xi == g.x.size()) g.x.push_back(randn(static_cast<std::size_t>(d * e.t), seed + 3));
    x_of.push_back(xi);
    g.y.emplace_back(static_cast<std::size_t>(d * e.t), std::numeric_limits<float>::quiet_NaN());
    if (clamped) {
      g.biases.push_back(randn(static_cast<std::size_t>(e.f), seed + 4, 4.0f));
      g.biases.push_back(randn(static_cast<std::size_t>(e.f), seed + 5, 4.0f));
      g.biases.push_back(randn(static_cast<std::size_t>(d), seed + 6));
    }
  }
  for (std::size_t i = 0; i < experts.size(); ++i) {
    const GroupExpert& e = experts[i];
    g.in.push_back(arg(e.g, {d, e.f, 1, 1}, const_cast<std::byte*>(g.w[3 * i].bytes.data())));
    g.in.push_back(arg(e.u, {d, e.f, 1, 1}, const_cast<std::byte*>(g.w[3 * i + 1].bytes.data())));
    g.in.push_back(arg(e.dn, {e.f, d, 1, 1}, const_cast<std::byte*>(g.w[3 * i + 2].bytes.data())));
    g.in.push_back(arg(DType::f32, {d, e.t, 1, 1}, g.x[x_of[i]]));
    if (clamped) {
      g.in.push_back(arg(DType::f32, {e.f, 1, 1, 1}, g.biases[3 * i]));
      g.in.push_back(arg(DType::f32, {e.f, 1, 1, 1}, g.biases[3 * i + 1]));
      g.in.push_back(arg(DType::f32, {d, 1, 1, 1}, g.biases[3 * i + 2]));
    }
    g.out.push_back(arg(DType::f32, {d, e.t, 1, 1}, g.y[i]));
  }
  return g;
}

// The clamps the clamped groups run with: gpt-oss's alpha and limit, and a tighter limit.
OpParams group_params(const GroupCall& g, bool exact, bool tight = false) {
  OpParams p;
  if (g.stride == 7) {
    p.scale = tight ? 1.0f : 1.702f;
    p.eps = tight ? 1.5f : 7.0f;
  }
  p.flags = exact ? kExactActivations : 0;
  return p;
}

// Runs the group call (one tensor for each distinct X where g.shared_x).
Status run_group(Compute& c, GroupCall& g, const OpParams& p) {
  return run_op(c, g.op, g.in, g.out, p, g.shared_x);
}

// Empty when supports() offers g's op for every weight type in it; otherwise checks that the backend refuses the
// call (any error will do: the engine never calls it then; `unsupported` is the code to give) and says why the
// test skips. `what`: which form of the op ("" or " with mxfp4 weights").
std::string unoffered(Compute& c, GroupCall& g, const std::string& what = "") {
  if (g.supported) return {};
  // The engine falls back to the single-expert op on an `unsupported` answer only.
  const Status s = run_group(c, g, group_params(g, false));
  EXPECT_FALSE(s) << "a backend whose supports() says no ran " << op_name(g.op) << what;
  EXPECT_EQ(s.code(), StatusCode::unsupported)
      << op_name(g.op) << what << " not offered should answer unsupported: " << s.to_string();
  return std::string("this backend does not offer ") + (what.empty() ? "the optional " : "") + op_name(g.op) + what;
}

// Every expert's output of the group call has the bits of the single-expert op (expert_ffn or expert_ffn_clamped)
// on its own inputs, exact or not (and for the clamped op at both clamps).
void expect_group_has_single_op_bits(Compute& c, GroupCall& g) {
  for (const bool tight : {false, true}) {
    if (tight && g.stride == 4) continue;
    for (const bool exact : {false, true}) {
      const OpParams p = group_params(g, exact, tight);
      for (auto& y : g.y) std::fill(y.begin(), y.end(), std::numeric_limits<float>::quiet_NaN());
      const Status s = run_group(c, g, p);
      ASSERT_TRUE(s) << s.to_string();
      for (std::size_t i = 0; i < g.out.size(); ++i) {
        const auto first = g.in.begin() + static_cast<std::ptrdiff_t>(g.stride * i);
        std::vector<float> alone(g.y[i].size());
        ASSERT_TRUE(run_op(c, g.single, std::vector<Arg>(first, first + static_cast<std::ptrdiff_t>(g.stride)),
                           {arg(DType::f32, g.out[i].ne, alone)}, p));
        EXPECT_EQ(0, std::memcmp(g.y[i].data(), alone.data(), alone.size() * sizeof(float)))
            << op_name(g.op) << " expert " << i << " (" << label(first[0].type) << "/" << label(first[1].type) << "/"
            << label(first[2].type) << ")" << (exact ? " exact" : "") << (tight ? " tight clamp" : "")
            << ": the group's output differs from " << op_name(g.single) << "'s";
      }
    }
  }
}

}  // namespace

// The optional group op: every expert's output has the bits of expert_ffn on its own inputs, whatever the other
// experts in the call (types, F, T). A backend without it says `unsupported`, which sends the engine to expert_ffn.
TEST_P(ComputeConformance, ExpertFfnGroupHasTheBitsOfExpertFfnPerExpert) {
  COMPUTE_FIXTURE(c);
  const std::int64_t d = 256;
  const GroupExpert experts[] = {{DType::q4_k, DType::q4_k, DType::q6_k, 512, 1},
                                 {DType::q8_0, DType::q8_0, DType::q8_0, 256, 5},
                                 {DType::bf16, DType::f16, DType::q2_k, 512, 1},
                                 {DType::q3_k, DType::q3_k, DType::q4_k, 768, 9},
                                 {DType::f32, DType::q5_k, DType::q4_0, 256, 1}};
  GroupCall g = make_group(c, d, experts, 60);
  if (const std::string why = unoffered(c, g); !why.empty()) GTEST_SKIP() << why;
  expect_group_has_single_op_bits(c, g);
  if (HasFatalFailure()) return;
  const auto& in = g.in;
  const auto& out = g.out;
  // Counts that do not come in fours, and an expert whose shapes disagree, are refused naming the problem.
  const Status three = run_op(c, Op::expert_ffn_group, {in[0], in[1], in[2]}, {out[0]});
  EXPECT_FALSE(three);
  EXPECT_NE(three.message().find("expert_ffn_group"), std::string::npos) << three.to_string();
  const Status mismatch =
      run_op(c, Op::expert_ffn_group, {in[0], in[1], in[2], in[3], in[4], in[1], in[6], in[7]}, {out[0], out[1]});
  EXPECT_FALSE(mismatch);
  EXPECT_NE(mismatch.message().find("expert 1"), std::string::npos) << mismatch.to_string();
}

// A layer's experts in decode, as the engine calls them: the experts of one T read one X. A backend may quantize that
// X once for them all (the CUDA backend does); each expert still has expert_ffn's bits, also where the weight types
// around it quantize X in other blocks (q8_0's 32, the k-quants' 256) or keep it in f32 (bf16), and next to experts
// of another T with an X of their own.
TEST_P(ComputeConformance, ExpertFfnGroupWithOneXHasTheBitsOfExpertFfnPerExpert) {
  COMPUTE_FIXTURE(c);
  const std::int64_t d = 512;
  const GroupExpert experts[] = {
      {DType::q4_k, DType::q4_k, DType::q6_k, 512, 1}, {DType::q8_0, DType::q4_k, DType::q8_0, 256, 1},
      {DType::q4_k, DType::q4_k, DType::q4_k, 256, 3}, {DType::q4_k, DType::q4_k, DType::q4_k, 256, 1},
      {DType::bf16, DType::q5_k, DType::q4_0, 512, 1}, {DType::q4_0, DType::q8_0, DType::q6_k, 256, 1},
      {DType::q4_k, DType::q4_k, DType::q6_k, 512, 3}};
  GroupCall g = make_group(c, d, experts, 460, false, true);
  if (const std::string why = unoffered(c, g); !why.empty()) GTEST_SKIP() << why;
  expect_group_has_single_op_bits(c, g);
}

// gpt-oss's experts in mxfp4 (an optional weight type), alone and next to experts of other types (a shared X for
// q4_0 and mxfp4 weights), with F and T as above.
TEST_P(ComputeConformance, ExpertFfnGroupWithMxfp4ExpertsHasTheBitsOfExpertFfn) {
  COMPUTE_FIXTURE(c);
  const std::int64_t d = 256;
  const GroupExpert experts[] = {{DType::mxfp4, DType::mxfp4, DType::mxfp4, 512, 1},
                                 {DType::q4_0, DType::mxfp4, DType::q8_0, 256, 5},
                                 {DType::mxfp4, DType::mxfp4, DType::mxfp4, 768, 9},
                                 {DType::q4_k, DType::q4_k, DType::mxfp4, 256, 3}};
  GroupCall g = make_group(c, d, experts, 260);
  if (const std::string why = unoffered(c, g, " with mxfp4 weights"); !why.empty()) GTEST_SKIP() << why;
  expect_group_has_single_op_bits(c, g);
}

// The optional clamped group (gpt-oss's experts of a layer in one call): every expert's output has the bits of
// expert_ffn_clamped on its own seven inputs, whatever the other experts (types, F, T, biases), with the decode
// step's one X for the experts of one token (as the engine passes it) and at both clamps.
TEST_P(ComputeConformance, ExpertFfnClampedGroupHasTheBitsOfExpertFfnClampedPerExpert) {
  COMPUTE_FIXTURE(c);
  const std::int64_t d = 256;
  const GroupExpert experts[] = {{DType::q4_k, DType::q4_k, DType::q6_k, 512, 1},
                                 {DType::q8_0, DType::q8_0, DType::q8_0, 256, 5},
                                 {DType::bf16, DType::f16, DType::q2_k, 512, 1},
                                 {DType::q3_k, DType::q3_k, DType::q4_k, 768, 9},
                                 {DType::f32, DType::q5_k, DType::q4_0, 256, 1}};
  GroupCall g = make_group(c, d, experts, 360, true, true);
  if (const std::string why = unoffered(c, g); !why.empty()) GTEST_SKIP() << why;
  expect_group_has_single_op_bits(c, g);
  if (HasFatalFailure()) return;
  const auto& in = g.in;
  const auto& out = g.out;
  const OpParams p = group_params(g, false);
  // expert_ffn_group's layout, an expert whose bias does not fit it, and a bad clamp are refused naming the problem.
  const Status four = run_op(c, g.op, {in[0], in[1], in[2], in[3], in[7], in[8], in[9], in[10]}, {out[0], out[1]}, p);
  EXPECT_FALSE(four);
  EXPECT_NE(four.message().find("expert_ffn_clamped_group"), std::string::npos) << four.to_string();
  std::vector<Arg> wrong_bias(in.begin(), in.begin() + 14);
  wrong_bias[13] = in[4];  // expert 0's b_gate (F = 512) as expert 1's b_down (D = 256)
  const Status bias = run_op(c, g.op, wrong_bias, {out[0], out[1]}, p);
  EXPECT_FALSE(bias);
  EXPECT_NE(bias.message().find("expert 1"), std::string::npos) << bias.to_string();
  OpParams no_clamp = p;
  no_clamp.eps = 0.0f;
  const Status limit = run_op(c, g.op, std::vector<Arg>(in.begin(), in.begin() + 14), {out[0], out[1]}, no_clamp);
  EXPECT_FALSE(limit);
  EXPECT_NE(limit.message().find("expert_ffn_clamped_group"), std::string::npos) << limit.to_string();
}

// gpt-oss's experts as OpenAI ships them (mxfp4) in the clamped group, alone and next to other types, one X for the
// experts of one token.
TEST_P(ComputeConformance, ExpertFfnClampedGroupWithMxfp4ExpertsHasTheBitsOfExpertFfnClamped) {
  COMPUTE_FIXTURE(c);
  const std::int64_t d = 256;
  const GroupExpert experts[] = {{DType::mxfp4, DType::mxfp4, DType::mxfp4, 512, 1},
                                 {DType::q4_0, DType::mxfp4, DType::q8_0, 256, 5},
                                 {DType::mxfp4, DType::mxfp4, DType::mxfp4, 768, 1},
                                 {DType::q4_k, DType::q4_k, DType::mxfp4, 256, 3},
                                 {DType::mxfp4, DType::mxfp4, DType::mxfp4, 256, 1}};
  GroupCall g = make_group(c, d, experts, 460, true, true);
  if (const std::string why = unoffered(c, g, " with mxfp4 weights"); !why.empty()) GTEST_SKIP() << why;
  expect_group_has_single_op_bits(c, g);
}

// ------------------------------------------------------------------ norms, rope

// ------------------------------------------------------------------ expert_ffn_routed

// The optional routed op against the engine's own combine on the same backend: each token's column is +0 (add of
// zeros), then scale_add of w * expert_ffn(e, that token's X) for its picks in ascending expert id, bit for bit. Ids
// are listed by weight as topk_routing lists them, so ascending id is not their order. A backend may answer
// `unsupported` for batches (T > 1) or exact activations its kernels do not route, never for decode (T = 1) of types
// its supports() offers. A token marked by topk_routing (id -1, weight NaN) gets a column of NaN.
TEST_P(ComputeConformance, ExpertFfnRoutedHasTheBitsOfTheEnginesCombine) {
  COMPUTE_FIXTURE(c);
  // k = 3: with two picks from +0 the sum is the same in either order (addition commutes), so it would not show one.
  const std::int64_t d = 256, f = 512, n_experts = 5, k = 3;
  struct Types {
    DType g, u, dn;
  };
  // The last: gate and up quantize X in different blocks (256 and 32).
  const Types cases[] = {{DType::q4_k, DType::q4_k, DType::q6_k},
                         {DType::q8_0, DType::q8_0, DType::q8_0},
                         {DType::q4_0, DType::q4_0, DType::q5_k},
                         {DType::q4_k, DType::q8_0, DType::q6_k}};
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<std::int32_t> picks{3, 1, 4, 0, 4, 2, -1, -1, -1, 4, 0, 3};  // token 2 marked: a NaN logit
  const std::vector<float> weights{0.5f, 0.3f, 0.2f, 0.45f, 0.35f, 0.2f, nan, nan, nan, 0.6f, 0.3f, 0.1f};
  const std::int64_t tokens = static_cast<std::int64_t>(picks.size()) / k;
  int ran = 0;
  for (const Types& ty : cases) {
    const std::string what = "expert_ffn_routed " + label(ty.g) + "/" + label(ty.u) + "/" + label(ty.dn);
    std::vector<Weights> w;
    for (std::int64_t e = 0; e < n_experts; ++e) {
      const auto seed = static_cast<unsigned>(700 + 3 * e);
      w.push_back(make_weights(ty.g, d, f, seed));
      w.push_back(make_weights(ty.u, d, f, seed + 1));
      w.push_back(make_weights(ty.dn, f, d, seed + 2));
    }
    const auto x = randn(static_cast<std::size_t>(d * tokens), 790);
    auto weight_args = [&] {
      std::vector<Arg> a;
      for (std::int64_t e = 0; e < n_experts; ++e) {
        const auto i = static_cast<std::size_t>(3 * e);
        a.push_back(arg(ty.g, {d, f, 1, 1}, const_cast<std::byte*>(w[i].bytes.data())));
        a.push_back(arg(ty.u, {d, f, 1, 1}, const_cast<std::byte*>(w[i + 1].bytes.data())));
        a.push_back(arg(ty.dn, {f, d, 1, 1}, const_cast<std::byte*>(w[i + 2].bytes.data())));
      }
      return a;
    };
    // What the engine computes for token t on this backend.
    auto combine = [&](std::int64_t t, const OpParams& p) {
      std::vector<float> xt(x.begin() + t * d, x.begin() + (t + 1) * d), zeros(static_cast<std::size_t>(d), 0.0f);
      std::vector<float> col(static_cast<std::size_t>(d), std::numeric_limits<float>::quiet_NaN());
      EXPECT_TRUE(run_op(c, Op::add, {arg(DType::f32, {d, 1, 1, 1}, zeros), arg(DType::f32, {d, 1, 1, 1}, zeros)},
                         {arg(DType::f32, {d, 1, 1, 1}, col)}));
      std::vector<std::pair<std::int32_t, float>> chosen;
      for (std::int64_t j = 0; j < k; ++j) {
        chosen.emplace_back(picks[static_cast<std::size_t>(t * k + j)], weights[static_cast<std::size_t>(t * k + j)]);
      }
      std::sort(chosen.begin(), chosen.end());
      for (auto [e, wt] : chosen) {
        std::vector<float> y(static_cast<std::size_t>(d));
        const auto i = static_cast<std::size_t>(3 * e);
        EXPECT_TRUE(run_op(c, Op::expert_ffn,
                           {arg(ty.g, {d, f, 1, 1}, const_cast<std::byte*>(w[i].bytes.data())),
                            arg(ty.u, {d, f, 1, 1}, const_cast<std::byte*>(w[i + 1].bytes.data())),
                            arg(ty.dn, {f, d, 1, 1}, const_cast<std::byte*>(w[i + 2].bytes.data())),
                            arg(DType::f32, {d, 1, 1, 1}, xt)},
                           {arg(DType::f32, {d, 1, 1, 1}, y)}, p));
        std::vector<float> scale{wt};
        EXPECT_TRUE(run_op(c, Op::scale_add, {arg(DType::f32, {d, 1, 1, 1}, y), arg(DType::f32, {1, 1, 1, 1}, scale)},
                           {arg(DType::f32, {d, 1, 1, 1}, col)}));
      }
      return col;
    };
    const bool offered = c.supports(Op::expert_ffn_routed, ty.g) && c.supports(Op::expert_ffn_routed, ty.u) &&
                         c.supports(Op::expert_ffn_routed, ty.dn);
    for (const bool exact : {false, true}) {
      OpParams p;
      p.flags = exact ? kExactActivations : 0;
      for (const std::int64_t batch : {std::int64_t{1}, tokens}) {
        for (std::int64_t t0 = 0; t0 < tokens; t0 += batch) {
          const std::string at =
              what + (exact ? " exact" : "") + " T=" + std::to_string(batch) + " from token " + std::to_string(t0);
          std::vector<float> xs(x.begin() + t0 * d, x.begin() + (t0 + batch) * d);
          std::vector<std::int32_t> ids(picks.begin() + t0 * k, picks.begin() + (t0 + batch) * k);
          std::vector<float> wts(weights.begin() + t0 * k, weights.begin() + (t0 + batch) * k);
          std::vector<float> y(static_cast<std::size_t>(d * batch), -1.0f);
          std::vector<Arg> in{arg(DType::f32, {d, batch, 1, 1}, xs), arg(DType::i32, {k, batch, 1, 1}, ids),
                              arg(DType::f32, {k, batch, 1, 1}, wts)};
          for (const Arg& a : weight_args()) in.push_back(a);
          const Status s = run_op(c, Op::expert_ffn_routed, in, {arg(DType::f32, {d, batch, 1, 1}, y)}, p);
          if (!offered || (!s && s.code() == StatusCode::unsupported && (batch > 1 || exact))) {
            EXPECT_FALSE(s) << at << ": supports() says no, yet it ran";
            EXPECT_EQ(s.code(), StatusCode::unsupported) << at << ": " << s.to_string();
            continue;
          }
          ASSERT_TRUE(s) << at;
          ++ran;
          for (std::int64_t t = t0; t < t0 + batch; ++t) {
            const float* got = y.data() + (t - t0) * d;
            if (picks[static_cast<std::size_t>(t * k)] < 0) {
              for (std::int64_t i = 0; i < d; ++i) {
                ASSERT_TRUE(std::isnan(got[i]))
                    << at << ": token " << t << " (marked) element " << i << " is " << got[i];
              }
              continue;
            }
            const auto want = combine(t, p);
            std::int64_t first = 0;  // the first element whose bits differ, for the message
            while (first < d && std::memcmp(got + first, &want[static_cast<std::size_t>(first)], sizeof(float)) == 0)
              ++first;
            EXPECT_EQ(first, d) << at << ": token " << t
                                << " differs from expert_ffn + scale_add in ascending id, first at element " << first
                                << ": " << std::setprecision(9) << got[std::min(first, d - 1)] << " vs "
                                << want[static_cast<std::size_t>(std::min(first, d - 1))];
          }
        }
      }
    }
  }
  if (ran == 0) GTEST_SKIP() << "this backend does not offer the optional expert_ffn_routed";
  // The shapes are checked: more picks than experts, and an expert whose W_down does not fit.
  std::vector<float> x1(static_cast<std::size_t>(d), 0.5f), y1(static_cast<std::size_t>(d));
  std::vector<std::int32_t> six(6, 0);
  std::vector<float> six_w(6, 0.1f);
  const auto wq = make_weights(DType::q8_0, d, f, 1), wd = make_weights(DType::q8_0, f, d, 2);
  auto one_expert = [&](std::int64_t down_rows) {
    return std::vector<Arg>{arg(DType::q8_0, {d, f, 1, 1}, const_cast<std::byte*>(wq.bytes.data())),
                            arg(DType::q8_0, {d, f, 1, 1}, const_cast<std::byte*>(wq.bytes.data())),
                            arg(DType::q8_0, {f, down_rows, 1, 1}, const_cast<std::byte*>(wd.bytes.data()))};
  };
  std::vector<Arg> too_many{arg(DType::f32, {d, 1, 1, 1}, x1), arg(DType::i32, {6, 1, 1, 1}, six),
                            arg(DType::f32, {6, 1, 1, 1}, six_w)};
  for (int e = 0; e < 2; ++e) {
    for (const Arg& a : one_expert(d)) too_many.push_back(a);
  }
  const Status many = run_op(c, Op::expert_ffn_routed, too_many, {arg(DType::f32, {d, 1, 1, 1}, y1)});
  EXPECT_FALSE(many);
  EXPECT_NE(many.message().find("ids"), std::string::npos) << many.to_string();
  std::vector<Arg> bad_down{arg(DType::f32, {d, 1, 1, 1}, x1), arg(DType::i32, {1, 1, 1, 1}, six),
                            arg(DType::f32, {1, 1, 1, 1}, six_w)};
  for (const Arg& a : one_expert(d)) bad_down.push_back(a);
  for (const Arg& a : one_expert(d / 2)) bad_down.push_back(a);
  const Status down = run_op(c, Op::expert_ffn_routed, bad_down, {arg(DType::f32, {d, 1, 1, 1}, y1)});
  EXPECT_FALSE(down);
  EXPECT_NE(down.message().find("expert 1"), std::string::npos) << down.to_string();
}

TEST_P(ComputeConformance, RmsNormMatchesReference) {
  COMPUTE_FIXTURE(c);
  struct Case {
    std::int64_t d, rows;
  };
  for (const Case cs : {Case{4099, 3}, Case{64, 8 * 3}, Case{1, 1}}) {
    auto x = randn(static_cast<std::size_t>(cs.d * cs.rows), 51, 3.0f);
    auto w = randn(static_cast<std::size_t>(cs.d), 52);
    std::vector<float> y(x.size());
    OpParams p;
    p.eps = 1e-6f;
    ASSERT_TRUE(run_op(c, Op::rms_norm,
                       {arg(DType::f32, {cs.d, cs.rows, 1, 1}, x), arg(DType::f32, {cs.d, 1, 1, 1}, w)},
                       {arg(DType::f32, {cs.d, cs.rows, 1, 1}, y)}, p));
    const auto want = ref::rms_norm(x.data(), cs.d, cs.rows, w.data(), p.eps);
    Mismatches mm("rms_norm D=" + std::to_string(cs.d));
    for (std::size_t i = 0; i < y.size(); ++i) mm.check(i, y[i], want[i], 2e-6 * std::fabs(want[i]) + 1e-6);
  }
}

TEST_P(ComputeConformance, RopeMatchesReferenceInBothLayouts) {
  COMPUTE_FIXTURE(c);
  const std::int64_t hd = 64, heads = 3, t = 4;
  std::vector<std::int32_t> pos{0, 1, 77, 4095};
  auto x = randn(static_cast<std::size_t>(hd * heads * t), 61);
  for (int rope_dims : {64, 32}) {
    std::vector<float> inv(static_cast<std::size_t>(rope_dims / 2));
    for (int i = 0; i < rope_dims / 2; ++i) {
      inv[static_cast<std::size_t>(i)] = static_cast<float>(std::pow(10000.0, -2.0 * i / rope_dims));
    }
    for (bool interleaved : {false, true}) {
      for (float scale : {1.0f, 0.75f}) {
        OpParams p;
        p.rope_dims = rope_dims;
        p.flags = interleaved ? kRopeInterleaved : 0;
        p.scale = scale;
        std::vector<float> y(x.size());
        const std::string what = "rope dims=" + std::to_string(rope_dims) + (interleaved ? " interleaved" : " neox") +
                                 " scale=" + std::to_string(scale);
        ASSERT_TRUE(run_op(c, Op::rope,
                           {arg(DType::f32, {hd, heads, t, 1}, x), arg(DType::i32, {t, 1, 1, 1}, pos),
                            arg(DType::f32, {rope_dims / 2, 1, 1, 1}, inv)},
                           {arg(DType::f32, {hd, heads, t, 1}, y)}, p))
            << what;
        const auto want = ref::rope(x.data(), hd, heads, t, pos.data(), inv.data(), rope_dims, interleaved, scale);
        Mismatches mm(what);
        for (std::size_t i = 0; i < y.size(); ++i) mm.check(i, y[i], want[i], 1e-5 * (1.0 + std::fabs(want[i])));
      }
    }
  }
}

// ------------------------------------------------------------------ attention

TEST_P(ComputeConformance, AttentionMatchesReferenceWithGqaWindowsAndCacheTypes) {
  COMPUTE_FIXTURE(c);
  const std::int64_t hd = 64, heads = 8, kvh = 2, s = 300;
  struct Case {
    std::int64_t t;
    std::int32_t position, window;
  };
  const Case cases[] = {{1, 299, 0}, {3, 130, 0}, {17, 0, 0}, {17, 283, 0}, {3, 200, 50}, {1, 299, 1}};
  const auto kf = randn(static_cast<std::size_t>(hd * kvh * s), 71);
  const auto vf = randn(static_cast<std::size_t>(hd * kvh * s), 72);
  for (DType kv : kKvTypes) {
    if (!c.supports(Op::attention, kv)) continue;
    std::vector<std::byte> kb(tensor_bytes(kv, {hd, kvh, s, 1})), vb(kb.size());
    ASSERT_TRUE(quant::quantize_row(kv, kf.data(), kb.data(), hd * kvh * s));
    ASSERT_TRUE(quant::quantize_row(kv, vf.data(), vb.data(), hd * kvh * s));
    const auto kd = ref::dequantize(kv, kb.data(), hd * kvh * s);
    const auto vd = ref::dequantize(kv, vb.data(), hd * kvh * s);
    for (const Case& cs : cases) {
      auto q = randn(static_cast<std::size_t>(hd * heads * cs.t), static_cast<unsigned>(73 + cs.position));
      OpParams p;
      p.position = cs.position;
      p.window = cs.window;
      p.scale = 0.125f;
      std::vector<float> o(q.size());
      const std::string what = "attention kv=" + label(kv) + " T=" + std::to_string(cs.t) +
                               " position=" + std::to_string(cs.position) + " window=" + std::to_string(cs.window);
      auto st = run_op(c, Op::attention,
                       {arg(DType::f32, {hd, heads, cs.t, 1}, q), arg(kv, {hd, kvh, s, 1}, kb.data()),
                        arg(kv, {hd, kvh, s, 1}, vb.data())},
                       {arg(DType::f32, {hd, heads, cs.t, 1}, o)}, p);
      ASSERT_TRUE(st) << what << ": " << st.to_string();
      const auto want =
          ref::attention(q.data(), hd, heads, cs.t, kd.data(), vd.data(), kvh, s, cs.position, cs.window, p.scale);
      Mismatches mm(what);
      for (std::size_t i = 0; i < o.size(); ++i) mm.check(i, o[i], want[i], 2e-5 + 1e-5 * std::fabs(want[i]));
    }
  }
}

TEST_P(ComputeConformance, AttentionQueryResultDoesNotDependOnTheBatch) {
  COMPUTE_FIXTURE(c);
  const std::int64_t hd = 64, heads = 4, kvh = 1, s = 260, t = 7;
  const std::int32_t pos0 = 200;
  for (DType kv : kKvTypes) {
    if (!c.supports(Op::attention, kv)) continue;
    const auto kf = randn(static_cast<std::size_t>(hd * kvh * s), 81);
    const auto vf = randn(static_cast<std::size_t>(hd * kvh * s), 82);
    std::vector<std::byte> kb(tensor_bytes(kv, {hd, kvh, s, 1})), vb(kb.size());
    ASSERT_TRUE(quant::quantize_row(kv, kf.data(), kb.data(), hd * kvh * s));
    ASSERT_TRUE(quant::quantize_row(kv, vf.data(), vb.data(), hd * kvh * s));
    auto q = randn(static_cast<std::size_t>(hd * heads * t), 83);
    for (std::int32_t window : {0, 40}) {
      OpParams p;
      p.position = pos0;
      p.window = window;
      p.scale = 0.125f;
      std::vector<float> batch(q.size());
      ASSERT_TRUE(run_op(c, Op::attention,
                         {arg(DType::f32, {hd, heads, t, 1}, q), arg(kv, {hd, kvh, s, 1}, kb.data()),
                          arg(kv, {hd, kvh, s, 1}, vb.data())},
                         {arg(DType::f32, {hd, heads, t, 1}, batch)}, p));
      for (std::int64_t i = 0; i < t; ++i) {
        std::vector<float> one(static_cast<std::size_t>(hd * heads));
        OpParams pi = p;
        pi.position = pos0 + static_cast<std::int32_t>(i);
        ASSERT_TRUE(run_op(c, Op::attention,
                           {arg(DType::f32, {hd, heads, 1, 1}, q.data() + i * hd * heads),
                            arg(kv, {hd, kvh, s, 1}, kb.data()), arg(kv, {hd, kvh, s, 1}, vb.data())},
                           {arg(DType::f32, {hd, heads, 1, 1}, one)}, pi));
        EXPECT_EQ(0, std::memcmp(one.data(), batch.data() + i * hd * heads, one.size() * sizeof(float)))
            << "attention kv=" << label(kv) << " window=" << window << ": query " << i
            << " differs alone and in a batch of 7";
      }
    }
  }
}

// ------------------------------------------------------------------ elementwise

TEST_P(ComputeConformance, ElementwiseOpsMatchReference) {
  COMPUTE_FIXTURE(c);
  const std::int64_t d = 1001, t = 3;
  const std::size_t n = static_cast<std::size_t>(d * t);
  auto a = randn(n, 91, 4.0f);
  auto b = randn(n, 92, 2.0f);
  const Ne ne{d, t, 1, 1};
  {
    std::vector<float> y(n);
    ASSERT_TRUE(run_op(c, Op::swiglu, {arg(DType::f32, ne, a), arg(DType::f32, ne, b)}, {arg(DType::f32, ne, y)}));
    Mismatches mm("swiglu");
    for (std::size_t i = 0; i < n; ++i) {
      const double want = ref::silu(a[i]) * b[i];
      mm.check(i, y[i], want, 1e-6 * std::fabs(want) + 1e-7);
    }
  }
  {
    std::vector<float> y(n);
    ASSERT_TRUE(run_op(c, Op::add, {arg(DType::f32, ne, a), arg(DType::f32, ne, b)}, {arg(DType::f32, ne, y)}));
    for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(y[i], a[i] + b[i]) << "add at " << i;
  }
  {
    std::vector<float> y(n);
    ASSERT_TRUE(run_op(c, Op::sigmoid, {arg(DType::f32, ne, a)}, {arg(DType::f32, ne, y)}));
    Mismatches mm("sigmoid");
    for (std::size_t i = 0; i < n; ++i) mm.check(i, y[i], ref::sigmoid(a[i]), 1e-6 * ref::sigmoid(a[i]) + 1e-7);
  }
  {
    std::vector<float> w{0.5f, -1.25f, 2.0f};
    std::vector<float> y = b;  // accumulates in place
    ASSERT_TRUE(
        run_op(c, Op::scale_add, {arg(DType::f32, ne, a), arg(DType::f32, {t, 1, 1, 1}, w)}, {arg(DType::f32, ne, y)}));
    Mismatches mm("scale_add");
    for (std::size_t i = 0; i < n; ++i) {
      const double want = b[i] + static_cast<double>(w[i / static_cast<std::size_t>(d)]) * a[i];
      mm.check(i, y[i], want, 1e-6 * std::fabs(want) + 1e-6);
    }
  }
}

// ------------------------------------------------------------------ routing, embedding

TEST_P(ComputeConformance, TopkRoutingMatchesReferenceAndBreaksTiesByLowerId) {
  COMPUTE_FIXTURE(c);
  const std::int64_t e = 8, t = 6;
  auto logits = randn(static_cast<std::size_t>(e * t), 101, 2.0f);
  // Token 5: a four-way tie at the top.
  const float tie[] = {1.0f, 3.0f, 3.0f, 0.0f, 3.0f, -1.0f, 2.0f, 3.0f};
  std::copy(tie, tie + e, logits.begin() + 5 * e);
  const int flag_sets[] = {kRoutingSoftmax | kRoutingRenormalize, kRoutingSoftmax, kRoutingSigmoid,
                           kRoutingSigmoid | kRoutingRenormalize, 0};
  for (int flags : flag_sets) {
    for (int k : {1, 2, 3}) {
      std::vector<std::int32_t> ids(static_cast<std::size_t>(k * t), -1);
      std::vector<float> w(ids.size());
      OpParams p;
      p.top_k = k;
      p.flags = flags;
      const std::string what = "topk flags=" + std::to_string(flags) + " k=" + std::to_string(k);
      ASSERT_TRUE(run_op(c, Op::topk_routing, {arg(DType::f32, {e, t, 1, 1}, logits)},
                         {arg(DType::i32, {k, t, 1, 1}, ids), arg(DType::f32, {k, t, 1, 1}, w)}, p))
          << what;
      const auto want = ref::topk_routing(logits.data(), e, t, k, flags);
      EXPECT_EQ(ids, want.ids) << what;
      Mismatches mm(what);
      for (std::size_t i = 0; i < w.size(); ++i)
        mm.check(i, w[i], want.weights[i], 1e-6 * std::fabs(want.weights[i]) + 1e-7);
      for (int j = 0; j < std::min(k, 3); ++j) {
        EXPECT_EQ(ids[static_cast<std::size_t>(5 * k + j)], (std::array<int, 3>{1, 2, 4}[static_cast<std::size_t>(j)]))
            << what << ": ties go to the lower expert id";
      }
    }
  }
}

namespace {

// The picks of a routing call whose token 1 had a NaN logit, marked by a backend that returns without waiting: that
// token's are id -1 with weight NaN, the others the reference's (and, with `weights`, their weights too).
void expect_nan_token_marked(const std::vector<std::int32_t>& ids, const std::vector<float>& w,
                             const ref::Routing& want, std::int64_t t, int k, const std::string& what, bool weights) {
  for (std::int64_t tok = 0; tok < t; ++tok) {
    for (int j = 0; j < k; ++j) {
      const auto i = static_cast<std::size_t>(tok * k + j);
      if (tok == 1) {
        EXPECT_EQ(ids[i], -1) << what << ": pick " << j << " of the token with a NaN logit";
        EXPECT_TRUE(std::isnan(w[i])) << what << ": pick " << j << " of the token with a NaN logit has weight " << w[i];
        continue;
      }
      EXPECT_EQ(ids[i], want.ids[i]) << what << ": token " << tok << " pick " << j;
      if (weights) {
        EXPECT_NEAR(w[i], want.weights[i], 1e-6 * std::fabs(want.weights[i]) + 1e-7)
            << what << ": token " << tok << " pick " << j;
      }
    }
  }
}

}  // namespace

// A NaN logit (activations that overflowed) never routes silently: the call fails naming it, or (a backend that
// returns without waiting, outputs in its memory) every pick of that token is id -1 with weight NaN, while the other
// tokens are routed as ever.
TEST_P(ComputeConformance, TopkRoutingNeverRoutesANaNLogitSilently) {
  COMPUTE_FIXTURE(c);
  const std::int64_t e = 8, t = 3;
  auto logits = randn(static_cast<std::size_t>(e * t), 102, 2.0f);
  auto clean = logits;
  logits[static_cast<std::size_t>(e + 5)] = std::numeric_limits<float>::quiet_NaN();  // token 1, expert 5
  for (int flags : {kRoutingSoftmax | kRoutingRenormalize, kRoutingSigmoid, 0}) {
    for (int k : {1, 2}) {
      std::vector<std::int32_t> ids(static_cast<std::size_t>(k * t), 7);
      std::vector<float> w(ids.size(), 0.5f);
      OpParams p;
      p.top_k = k;
      p.flags = flags;
      const std::string what = "topk flags=" + std::to_string(flags) + " k=" + std::to_string(k);
      const Status s = run_op(c, Op::topk_routing, {arg(DType::f32, {e, t, 1, 1}, logits)},
                              {arg(DType::i32, {k, t, 1, 1}, ids), arg(DType::f32, {k, t, 1, 1}, w)}, p);
      if (!s) {
        EXPECT_NE(s.message().find("NaN"), std::string::npos) << what << ": " << s.to_string();
        continue;
      }
      expect_nan_token_marked(ids, w, ref::topk_routing(clean.data(), e, t, k, flags), t, k, what, false);
    }
  }
}

// ------------------------------------------------------------------ topk_routing_biased

// topk_routing_biased (optional; GLM-4.5 / DeepSeek-V3 routers): the experts are picked by score + bias, but each
// weight is the expert's own score. One bias for every token, set by hand so that tokens 0..2 test one thing each:
// token 0: expert 12 scores low, yet its bias puts it first under sigmoid and softmax scores (unbiased, 3 leads);
// token 1: experts 2, 5 and 9 have the same logit and bias, so they tie in every mode (listed 2, 5, 9);
// token 2: raw scores 1.0, 0.5, 0.75 of experts 4, 6 and 10 plus their biases 0, 0.5, 0.25 tie at exactly 1.0, so
// they come in id order with weights that do not descend. Tokens 3.. are random.
struct BiasedRoutingData {
  static constexpr std::int64_t e = 16, t = 6;
  std::vector<float> logits, bias;
};

BiasedRoutingData biased_routing_data() {
  BiasedRoutingData d;
  d.bias = {0.1f, -0.2f, 0.25f, 0.0f, 0.0f, 0.25f, 0.5f, 0.0f, -0.1f, 0.25f, 0.25f, 0.3f, 1.25f, -0.4f, 0.15f, -0.05f};
  d.logits = randn(static_cast<std::size_t>(d.e * d.t), 141, 2.0f);
  auto token = [&](std::int64_t i, float rest) {
    float* x = d.logits.data() + i * d.e;
    std::fill(x, x + d.e, rest);
    return x;
  };
  float* t0 = token(0, -3.0f);
  t0[3] = 2.0f;
  t0[7] = 1.5f;
  t0[12] = -2.5f;
  float* t1 = token(1, -3.0f);
  t1[2] = t1[5] = t1[9] = 3.0f;
  float* t2 = token(2, -4.0f);
  t2[4] = 1.0f;
  t2[6] = 0.5f;
  t2[10] = 0.75f;
  return d;
}

// topk_routing_biased or topk_routing_grouped over T tokens of E logits; ids and w preset to marks a call that writes
// nothing leaves.
Status run_topk(Compute& c, Op op, const float* logits, std::int64_t e, std::int64_t t, const float* bias, int k,
                int flags, float scale, int groups, int groups_used, std::vector<std::int32_t>& ids,
                std::vector<float>& w) {
  ids.assign(static_cast<std::size_t>(k * t), -7);
  w.assign(ids.size(), -7.0f);
  OpParams p;
  p.top_k = k;
  p.flags = flags;
  p.scale = scale;
  p.groups = groups;
  p.groups_used = groups_used;
  return run_op(c, op,
                {arg(DType::f32, {e, t, 1, 1}, const_cast<float*>(logits)),
                 arg(DType::f32, {e, 1, 1, 1}, const_cast<float*>(bias))},
                {arg(DType::i32, {k, t, 1, 1}, ids), arg(DType::f32, {k, t, 1, 1}, w)}, p);
}

Status run_biased(Compute& c, const float* logits, std::int64_t e, std::int64_t t, const float* bias, int k, int flags,
                  float scale, std::vector<std::int32_t>& ids, std::vector<float>& w) {
  return run_topk(c, Op::topk_routing_biased, logits, e, t, bias, k, flags, scale, 0, 0, ids, w);
}

constexpr int kBiasedFlagSets[] = {kRoutingSigmoid | kRoutingRenormalize, kRoutingSigmoid,
                                   kRoutingSoftmax | kRoutingRenormalize, kRoutingSoftmax, 0};

TEST_P(ComputeConformance, TopkRoutingBiasedPicksByScorePlusBiasAndWeighsByScore) {
  COMPUTE_FIXTURE(c);
  const auto d = biased_routing_data();
  const std::int64_t e = d.e, t = d.t;
  std::vector<std::int32_t> ids;
  std::vector<float> w;
  if (!c.supports(Op::topk_routing_biased, DType::f32)) {
    EXPECT_FALSE(run_biased(c, d.logits.data(), e, t, d.bias.data(), 2, kRoutingSigmoid, 1.0f, ids, w))
        << "a backend whose supports() says no ran topk_routing_biased";
    GTEST_SKIP() << "this backend does not offer the optional topk_routing_biased";
  }
  int moved_by_bias = 0;
  for (int flags : kBiasedFlagSets) {
    // Every expert's unbiased score, from the plain reference routing with k = E.
    const auto all = ref::topk_routing(d.logits.data(), e, t, static_cast<int>(e), flags & ~kRoutingRenormalize);
    std::vector<double> score(static_cast<std::size_t>(e * t));
    for (std::size_t i = 0; i < all.ids.size(); ++i) {
      score[i / static_cast<std::size_t>(e) * static_cast<std::size_t>(e) + static_cast<std::size_t>(all.ids[i])] =
          all.weights[i];
    }
    for (int k : {1, 2, 4}) {
      // The test's own premise: no two experts near the cut are closer than the backends' rounding, except the ties
      // made on purpose (equal in double too).
      for (std::int64_t i = 0; i < t; ++i) {
        std::vector<double> choice(static_cast<std::size_t>(e));
        for (std::int64_t j = 0; j < e; ++j)
          choice[static_cast<std::size_t>(j)] =
              score[static_cast<std::size_t>(i * e + j)] + d.bias[static_cast<std::size_t>(j)];
        std::sort(choice.begin(), choice.end(), std::greater<>());
        for (int j = 0; j < k; ++j) {
          const double a = choice[static_cast<std::size_t>(j)], b = choice[static_cast<std::size_t>(j) + 1];
          ASSERT_TRUE(a == b || a - b > 1e-4) << "test data: token " << i << " has a near tie at pick " << j;
        }
      }
      const auto plain = ref::topk_routing(d.logits.data(), e, t, k, flags);
      for (float scale : {1.0f, 2.5f}) {
        const std::string what = "topk_routing_biased flags=" + std::to_string(flags) + " k=" + std::to_string(k) +
                                 " scale=" + std::to_string(scale);
        ASSERT_TRUE(run_biased(c, d.logits.data(), e, t, d.bias.data(), k, flags, scale, ids, w)) << what;
        const auto want = ref::topk_routing_biased(d.logits.data(), d.bias.data(), e, t, k, flags, scale);
        EXPECT_EQ(ids, want.ids) << what;
        if (ids != plain.ids) ++moved_by_bias;
        Mismatches mm(what);
        for (std::size_t i = 0; i < w.size(); ++i)
          mm.check(i, w[i], want.weights[i], 1e-6 * std::fabs(want.weights[i]) + 1e-7);
        // The weights are the picked experts' own scores (not score + bias), renormalized over the picks if asked.
        Mismatches own(what + ": weights from the unbiased scores");
        for (std::int64_t i = 0; i < t; ++i) {
          double sum = 0.0;
          for (int j = 0; j < k; ++j) {
            const std::int32_t id = ids[static_cast<std::size_t>(i * k + j)];
            ASSERT_TRUE(id >= 0 && id < e) << what << ": token " << i << " pick " << j << " is " << id;
            sum += score[static_cast<std::size_t>(i * e + id)];
          }
          for (int j = 0; j < k; ++j) {
            const auto at = static_cast<std::size_t>(i * k + j);
            double s = score[static_cast<std::size_t>(i * e + ids[at])];
            if (flags & kRoutingRenormalize) s /= sum;
            own.check(at, w[at], s * scale, 1e-6 * std::fabs(s * scale) + 1e-7);
          }
        }
        if (flags & (kRoutingSigmoid | kRoutingSoftmax)) {
          EXPECT_EQ(ids[0], 12) << what << ": token 0's bias picks expert 12 first";
          EXPECT_EQ(plain.ids[0], 3) << what << ": (unbiased, expert 3 leads)";
        }
        if (k == 4) {
          const auto first = ids.begin() + k, last = first + k;
          const auto p2 = std::find(first, last, 2), p5 = std::find(first, last, 5), p9 = std::find(first, last, 9);
          EXPECT_TRUE(p2 < p5 && p5 < p9 && p9 != last) << what << ": token 1's tie of experts 2, 5, 9";
        }
        if (flags == 0 && k >= 2) {
          // Raw scores tie on score + bias: id order, the weights are the logits times the scale (exact here).
          const std::int32_t tied[] = {4, 6, 10};
          const float raw[] = {1.0f, 0.5f, 0.75f};
          for (int j = 0; j < std::min(k, 3); ++j) {
            EXPECT_EQ(ids[static_cast<std::size_t>(2 * k + j)], tied[j]) << what << ": token 2 pick " << j;
            EXPECT_EQ(w[static_cast<std::size_t>(2 * k + j)], raw[j] * scale) << what << ": token 2 pick " << j;
          }
        }
      }
    }
  }
  EXPECT_GT(moved_by_bias, 0) << "the bias never changed a pick: the test tests nothing";
}

// THE ONE PROMISE: a token's picks and weights are the same bits alone and in a batch.
TEST_P(ComputeConformance, TopkRoutingBiasedDoesNotDependOnTheBatch) {
  COMPUTE_FIXTURE(c);
  if (!c.supports(Op::topk_routing_biased, DType::f32))
    GTEST_SKIP() << "this backend does not offer the optional topk_routing_biased";
  const auto d = biased_routing_data();
  const std::int64_t e = d.e, t = d.t;
  for (int flags : kBiasedFlagSets) {
    const int k = 4;
    const float scale = 2.5f;
    std::vector<std::int32_t> ids, one_ids;
    std::vector<float> w, one_w;
    ASSERT_TRUE(run_biased(c, d.logits.data(), e, t, d.bias.data(), k, flags, scale, ids, w));
    for (std::int64_t i = 0; i < t; ++i) {
      ASSERT_TRUE(run_biased(c, d.logits.data() + i * e, e, 1, d.bias.data(), k, flags, scale, one_ids, one_w));
      EXPECT_TRUE(std::equal(one_ids.begin(), one_ids.end(), ids.begin() + i * k))
          << "flags=" << flags << ": token " << i << "'s picks alone differ from the batch's";
      EXPECT_EQ(0, std::memcmp(one_w.data(), w.data() + i * k, one_w.size() * sizeof(float)))
          << "flags=" << flags << ": token " << i << "'s weights alone differ from the batch's";
    }
  }
}

// A NaN logit: what topk_routing does on this backend (the same call fails, or the token's picks are marked id -1
// with weight NaN while the other tokens are routed as ever).
TEST_P(ComputeConformance, TopkRoutingBiasedTreatsANaNLogitAsTopkRoutingDoes) {
  COMPUTE_FIXTURE(c);
  if (!c.supports(Op::topk_routing_biased, DType::f32))
    GTEST_SKIP() << "this backend does not offer the optional topk_routing_biased";
  const std::int64_t e = 8, t = 3;
  auto logits = randn(static_cast<std::size_t>(e * t), 143, 2.0f);
  const auto bias = randn(static_cast<std::size_t>(e), 144, 0.5f);
  const auto clean = logits;
  logits[static_cast<std::size_t>(e + 5)] = std::numeric_limits<float>::quiet_NaN();  // token 1, expert 5
  for (int flags : {kRoutingSigmoid | kRoutingRenormalize, kRoutingSoftmax, 0}) {
    for (int k : {1, 3}) {
      const std::string what = "topk_routing_biased flags=" + std::to_string(flags) + " k=" + std::to_string(k);
      std::vector<std::int32_t> ids, plain_ids(static_cast<std::size_t>(k * t));
      std::vector<float> w, plain_w(plain_ids.size());
      OpParams p;
      p.top_k = k;
      p.flags = flags;
      const Status plain =
          run_op(c, Op::topk_routing, {arg(DType::f32, {e, t, 1, 1}, logits)},
                 {arg(DType::i32, {k, t, 1, 1}, plain_ids), arg(DType::f32, {k, t, 1, 1}, plain_w)}, p);
      const Status s = run_biased(c, logits.data(), e, t, bias.data(), k, flags, 2.5f, ids, w);
      EXPECT_EQ(s.is_ok(), plain.is_ok()) << what << ": topk_routing " << (plain ? "marked" : "refused")
                                          << " the NaN, topk_routing_biased " << (s ? "ran" : "failed");
      if (!s) {
        EXPECT_NE(s.message().find("NaN"), std::string::npos) << what << ": " << s.to_string();
        continue;
      }
      expect_nan_token_marked(ids, w, ref::topk_routing_biased(clean.data(), bias.data(), e, t, k, flags, 2.5f), t, k,
                              what, true);
    }
  }
}

TEST_P(ComputeConformance, TopkRoutingBiasedRefusesBadCalls) {
  COMPUTE_FIXTURE(c);
  if (!c.supports(Op::topk_routing_biased, DType::f32))
    GTEST_SKIP() << "this backend does not offer the optional topk_routing_biased";
  std::vector<float> big(1 << 12, 0.5f);
  std::vector<std::int32_t> out_ids(64);
  const std::int64_t e = 8, t = 2;
  auto call = [&](std::vector<Arg> in, int k, int flags = kRoutingSigmoid) {
    OpParams p;
    p.top_k = k;
    p.flags = flags;
    return run_op(c, Op::topk_routing_biased, std::move(in),
                  {arg(DType::i32, {k, t, 1, 1}, out_ids), arg(DType::f32, {k, t, 1, 1}, big)}, p);
  };
  auto expect_error = [&](const std::string& what, const char* names, Status s) {
    EXPECT_FALSE(s.is_ok()) << what << " was accepted";
    if (s.is_ok()) return;
    for (const char* n : {"topk_routing_biased", names}) {
      EXPECT_NE(s.message().find(n), std::string::npos)
          << what << ": the error does not name " << n << ": " << s.to_string();
    }
  };
  const Arg logits = arg(DType::f32, {e, t, 1, 1}, big);
  ASSERT_TRUE(call({logits, arg(DType::f32, {e, 1, 1, 1}, big)}, 2)) << "the good call the others are made from";
  expect_error("a bias of E - 1 elements", "bias", call({logits, arg(DType::f32, {e - 1, 1, 1, 1}, big)}, 2));
  expect_error("a bias of E + 1 elements", "bias", call({logits, arg(DType::f32, {e + 1, 1, 1, 1}, big)}, 2));
  expect_error("a bias of E x 2 elements", "bias", call({logits, arg(DType::f32, {e, 2, 1, 1}, big)}, 2));
  expect_error("an f16 bias", "bias", call({logits, arg(DType::f16, {e, 1, 1, 1}, big)}, 2));
  expect_error("an i32 bias", "bias", call({logits, arg(DType::i32, {e, 1, 1, 1}, big)}, 2));
  expect_error("no bias", "topk_routing_biased", call({logits}, 2));
  expect_error("k > E", "topk_routing_biased", call({logits, arg(DType::f32, {e, 1, 1, 1}, big)}, 9));
  expect_error("softmax and sigmoid at once", "topk_routing_biased",
               call({logits, arg(DType::f32, {e, 1, 1, 1}, big)}, 2, kRoutingSoftmax | kRoutingSigmoid));
}

// ------------------------------------------------------------------ topk_routing_grouped

// topk_routing_grouped (optional; DeepSeek-V3's noaux_tc router, V2's group_limited_greedy with kRoutingGroupMax):
// topk_routing_biased among the experts of the groups_used best groups only.
Status run_grouped(Compute& c, const float* logits, std::int64_t e, std::int64_t t, const float* bias, int k, int flags,
                   float scale, int groups, int groups_used, std::vector<std::int32_t>& ids, std::vector<float>& w) {
  return run_topk(c, Op::topk_routing_grouped, logits, e, t, bias, k, flags, scale, groups, groups_used, ids, w);
}

// The tests' own premise, in double: near the cuts (the groups_used-th group, the k-th expert among the competing
// ones) no two are closer than the backends' f32 rounding, except ties made on purpose (equal in double too).
void expect_clear_grouped_cuts(const float* logits, const float* bias, std::int64_t e, std::int64_t t, int k, int flags,
                               int groups, int groups_used) {
  const auto all = ref::topk_routing(logits, e, t, static_cast<int>(e), flags & ~kRoutingRenormalize);
  const auto per = static_cast<std::size_t>(e / groups);
  auto clear = [](double a, double b) { return a == b || std::fabs(a - b) > 1e-5; };
  for (std::int64_t i = 0; i < t; ++i) {
    std::vector<double> choice(static_cast<std::size_t>(e));
    for (std::int64_t j = 0; j < e; ++j) {
      const auto at = static_cast<std::size_t>(i * e + j);
      choice[static_cast<std::size_t>(all.ids[at])] = all.weights[at] + bias[all.ids[at]];
    }
    std::vector<std::pair<double, std::size_t>> group_score;
    for (std::size_t g = 0; g < static_cast<std::size_t>(groups); ++g) {
      std::vector<double> mine(choice.begin() + static_cast<std::ptrdiff_t>(g * per),
                               choice.begin() + static_cast<std::ptrdiff_t>((g + 1) * per));
      std::sort(mine.begin(), mine.end(), std::greater<>());
      group_score.emplace_back((flags & kRoutingGroupMax) ? mine[0] : mine[0] + mine[1], g);
    }
    std::stable_sort(group_score.begin(), group_score.end(),
                     [](const auto& a, const auto& b) { return a.first > b.first; });
    if (groups_used < groups) {
      const auto u = static_cast<std::size_t>(groups_used);
      ASSERT_TRUE(clear(group_score[u - 1].first, group_score[u].first))
          << "test data: token " << i << " has a near tie of group scores at the cut (flags " << flags << ")";
    }
    std::vector<double> competing;
    for (std::size_t r = 0; r < static_cast<std::size_t>(groups_used); ++r) {
      const std::size_t g = group_score[r].second;
      competing.insert(competing.end(), choice.begin() + static_cast<std::ptrdiff_t>(g * per),
                       choice.begin() + static_cast<std::ptrdiff_t>((g + 1) * per));
    }
    std::sort(competing.begin(), competing.end(), std::greater<>());
    for (int j = 0; j < k && static_cast<std::size_t>(j) + 1 < competing.size(); ++j) {
      ASSERT_TRUE(clear(competing[static_cast<std::size_t>(j)], competing[static_cast<std::size_t>(j) + 1]))
          << "test data: token " << i << " has a near tie at pick " << j << " (flags " << flags << ")";
    }
  }
}

// Hand-made routers of 16 experts in 4 groups of 4, one bias for all (0.05 on experts 12 and 13, else 0), the same in
// every scoring mode:
// token 0: expert 0 (logit 2.2) is the best single expert, but its group's other three are poor, so its group loses
// on the sum of its best two to groups 1 (2.0, 2.0) and 2 (1.8, 1.8): with 2 groups used it is not picked (k = 2
// gives 4, 5). Scored by its best alone (kRoutingGroupMax), group 0 wins and k = 2 gives 0, 4.
// token 1: groups 1 and 2 hold the same scores (2.0 and 1.0 at other places) and tie on either rule; group 0 leads and
// group 3 trails, so with 2 groups used group 1 (the lower) competes: k = 4 gives 0, 1, 4, 5 (not 0, 1, 11, 10).
// Tokens 2.. are random.
struct GroupedRoutingData {
  static constexpr std::int64_t e = 16, t = 6;
  static constexpr int groups = 4;
  std::vector<float> logits, bias;
};

GroupedRoutingData grouped_routing_data() {
  GroupedRoutingData d;
  d.bias.assign(static_cast<std::size_t>(d.e), 0.0f);
  d.bias[12] = d.bias[13] = 0.05f;
  d.logits = randn(static_cast<std::size_t>(d.e * d.t), 151, 2.0f);
  const float t0[] = {2.2f, -4, -4, -4, 2.0f, 2.0f, -4, -4, 1.8f, 1.8f, -4, -4, -8, -8, -8, -8};
  const float t1[] = {3.0f, 2.5f, -4, -4, 2.0f, 1.0f, -4, -4, -4, -4, 1.0f, 2.0f, -3, -3, -3, -3};
  std::copy(std::begin(t0), std::end(t0), d.logits.begin());
  std::copy(std::begin(t1), std::end(t1), d.logits.begin() + d.e);
  return d;
}

// A DeepSeek-V3-like router (8 groups), smaller: 64 experts, random logits and bias.
struct RandomGroupedData {
  static constexpr std::int64_t e = 64, t = 7;
  static constexpr int groups = 8;
  std::vector<float> logits, bias;
};

RandomGroupedData random_grouped_data() {
  RandomGroupedData d;
  d.logits = randn(static_cast<std::size_t>(d.e * d.t), 152, 1.5f);
  d.bias = randn(static_cast<std::size_t>(d.e), 153, 0.1f);
  return d;
}

TEST_P(ComputeConformance, TopkRoutingGroupedWithEveryGroupUsedHasTheBitsOfTopkRoutingBiased) {
  COMPUTE_FIXTURE(c);
  const auto d = biased_routing_data();
  std::vector<std::int32_t> ids, want_ids;
  std::vector<float> w, want_w;
  if (!c.supports(Op::topk_routing_grouped, DType::f32)) {
    EXPECT_FALSE(run_grouped(c, d.logits.data(), d.e, d.t, d.bias.data(), 2, kRoutingSigmoid, 1.0f, 4, 2, ids, w))
        << "a backend whose supports() says no ran topk_routing_grouped";
    GTEST_SKIP() << "this backend does not offer the optional topk_routing_grouped";
  }
  ASSERT_TRUE(c.supports(Op::topk_routing_biased, DType::f32))
      << "topk_routing_grouped is offered without topk_routing_biased";
  const auto r = random_grouped_data();
  struct Case {
    const float *logits, *bias;
    std::int64_t e, t;
    int groups;
  };
  const Case cases[] = {{d.logits.data(), d.bias.data(), d.e, d.t, 2},
                        {d.logits.data(), d.bias.data(), d.e, d.t, 4},
                        {d.logits.data(), d.bias.data(), d.e, d.t, 8},
                        {r.logits.data(), r.bias.data(), r.e, r.t, r.groups}};
  for (const Case& cs : cases) {
    for (int flags : kBiasedFlagSets) {
      for (int group_flag : {0, kRoutingGroupMax}) {
        for (int k : {1, 2, 4}) {
          const std::string what = "topk_routing_grouped E=" + std::to_string(cs.e) +
                                   " groups=" + std::to_string(cs.groups) +
                                   " flags=" + std::to_string(flags | group_flag) + " k=" + std::to_string(k);
          ASSERT_TRUE(
              run_grouped(c, cs.logits, cs.e, cs.t, cs.bias, k, flags | group_flag, 2.5f, cs.groups, cs.groups, ids, w))
              << what;
          ASSERT_TRUE(run_biased(c, cs.logits, cs.e, cs.t, cs.bias, k, flags, 2.5f, want_ids, want_w)) << what;
          EXPECT_EQ(ids, want_ids) << what;
          EXPECT_EQ(0, std::memcmp(w.data(), want_w.data(), w.size() * sizeof(float)))
              << what << ": the weights are not topk_routing_biased's bits";
        }
      }
    }
  }
}

TEST_P(ComputeConformance, TopkRoutingGroupedPicksOnlyFromTheBestGroups) {
  COMPUTE_FIXTURE(c);
  if (!c.supports(Op::topk_routing_grouped, DType::f32))
    GTEST_SKIP() << "this backend does not offer the optional topk_routing_grouped";
  const auto d = grouped_routing_data();
  const std::int64_t e = d.e, t = d.t;
  std::vector<std::int32_t> ids;
  std::vector<float> w;
  for (int flags : kBiasedFlagSets) {
    for (int group_flag : {0, kRoutingGroupMax}) {
      const int f = flags | group_flag;
      for (int k : {2, 4}) {
        ASSERT_NO_FATAL_FAILURE(expect_clear_grouped_cuts(d.logits.data(), d.bias.data(), e, t, k, f, d.groups, 2));
        for (float scale : {1.0f, 2.5f}) {
          const std::string what = "topk_routing_grouped flags=" + std::to_string(f) + " k=" + std::to_string(k) +
                                   " scale=" + std::to_string(scale);
          ASSERT_TRUE(run_grouped(c, d.logits.data(), e, t, d.bias.data(), k, f, scale, d.groups, 2, ids, w)) << what;
          const auto want = ref::topk_routing_grouped(d.logits.data(), d.bias.data(), e, t, k, f, scale, d.groups, 2);
          EXPECT_EQ(ids, want.ids) << what;
          Mismatches mm(what);
          for (std::size_t i = 0; i < w.size(); ++i)
            mm.check(i, w[i], want.weights[i], 1e-6 * std::fabs(want.weights[i]) + 1e-7);
          // Token 0: the best single expert (0, which topk_routing_biased picks first) sits in a group that loses on
          // the sum of its two best and wins on its best alone.
          const auto biased = ref::topk_routing_biased(d.logits.data(), d.bias.data(), e, 1, k, flags, scale);
          EXPECT_EQ(biased.ids[0], 0) << what << ": (ungrouped, expert 0 leads token 0)";
          const std::vector<std::int32_t> t0(ids.begin(), ids.begin() + k);
          const std::vector<std::int32_t> want_t0 =
              group_flag ? (k == 2 ? std::vector<std::int32_t>{0, 4} : std::vector<std::int32_t>{0, 4, 5, 1})
                         : (k == 2 ? std::vector<std::int32_t>{4, 5} : std::vector<std::int32_t>{4, 5, 8, 9});
          EXPECT_EQ(t0, want_t0) << what << ": token 0 (group scores by "
                                 << (group_flag ? "the best expert" : "the best two experts") << ")";
          if (k == 4) {
            // Token 1: groups 1 and 2 tie; the lower one competes.
            const std::vector<std::int32_t> t1(ids.begin() + k, ids.begin() + 2 * k);
            EXPECT_EQ(t1, (std::vector<std::int32_t>{0, 1, 4, 5})) << what << ": token 1's tie of groups 1 and 2";
          }
          if (flags == 0) {
            // Raw scores: the weights are the logits times the scale (exact here).
            for (int j = 0; j < k; ++j) {
              const auto at = static_cast<std::size_t>(j);
              EXPECT_EQ(w[at], d.logits[static_cast<std::size_t>(ids[at])] * scale) << what << ": token 0 pick " << j;
            }
          }
        }
      }
    }
  }
}

TEST_P(ComputeConformance, TopkRoutingGroupedMatchesTheReferenceOnRandomRouters) {
  COMPUTE_FIXTURE(c);
  if (!c.supports(Op::topk_routing_grouped, DType::f32))
    GTEST_SKIP() << "this backend does not offer the optional topk_routing_grouped";
  const auto d = random_grouped_data();
  const std::int64_t e = d.e, t = d.t;
  std::vector<std::int32_t> ids;
  std::vector<float> w;
  int moved_by_groups = 0, rules_differ = 0;
  for (int flags : kBiasedFlagSets) {
    for (int used : {1, 3, 4}) {
      for (int k : {1, 4, 8}) {
        std::vector<std::int32_t> by_rule[2];
        for (int group_flag : {0, kRoutingGroupMax}) {
          const int f = flags | group_flag;
          ASSERT_NO_FATAL_FAILURE(
              expect_clear_grouped_cuts(d.logits.data(), d.bias.data(), e, t, k, f, d.groups, used));
          const std::string what = "topk_routing_grouped flags=" + std::to_string(f) +
                                   " groups_used=" + std::to_string(used) + " k=" + std::to_string(k);
          ASSERT_TRUE(run_grouped(c, d.logits.data(), e, t, d.bias.data(), k, f, 2.5f, d.groups, used, ids, w)) << what;
          const auto want = ref::topk_routing_grouped(d.logits.data(), d.bias.data(), e, t, k, f, 2.5f, d.groups, used);
          EXPECT_EQ(ids, want.ids) << what;
          Mismatches mm(what);
          for (std::size_t i = 0; i < w.size(); ++i)
            mm.check(i, w[i], want.weights[i], 1e-6 * std::fabs(want.weights[i]) + 1e-7);
          // Every pick lies in one of `used` groups.
          for (std::int64_t i = 0; i < t; ++i) {
            std::vector<std::int32_t> picked_groups;
            for (int j = 0; j < k; ++j) picked_groups.push_back(ids[static_cast<std::size_t>(i * k + j)] / 8);
            std::sort(picked_groups.begin(), picked_groups.end());
            const auto distinct = std::unique(picked_groups.begin(), picked_groups.end()) - picked_groups.begin();
            EXPECT_LE(distinct, used) << what << ": token " << i << "'s picks span more groups than are used";
          }
          if (ids != ref::topk_routing_biased(d.logits.data(), d.bias.data(), e, t, k, flags, 2.5f).ids)
            ++moved_by_groups;
          by_rule[group_flag ? 1 : 0] = ids;
        }
        if (by_rule[0] != by_rule[1]) ++rules_differ;
      }
    }
  }
  EXPECT_GT(moved_by_groups, 0) << "the group limit never changed a pick: the test tests nothing";
  EXPECT_GT(rules_differ, 0) << "kRoutingGroupMax never changed a pick: the test tests nothing";
}

// THE ONE PROMISE: a token's picks and weights are the same bits alone and in a batch.
TEST_P(ComputeConformance, TopkRoutingGroupedDoesNotDependOnTheBatch) {
  COMPUTE_FIXTURE(c);
  if (!c.supports(Op::topk_routing_grouped, DType::f32))
    GTEST_SKIP() << "this backend does not offer the optional topk_routing_grouped";
  const auto d = random_grouped_data();
  const auto h = grouped_routing_data();
  struct Case {
    const float *logits, *bias;
    std::int64_t e, t;
    int groups, used, k;
  };
  const Case cases[] = {{d.logits.data(), d.bias.data(), d.e, d.t, d.groups, 4, 8},
                        {h.logits.data(), h.bias.data(), h.e, h.t, h.groups, 2, 4}};
  for (const Case& cs : cases) {
    for (int flags : kBiasedFlagSets) {
      for (int group_flag : {0, kRoutingGroupMax}) {
        const int f = flags | group_flag;
        std::vector<std::int32_t> ids, one_ids;
        std::vector<float> w, one_w;
        ASSERT_TRUE(run_grouped(c, cs.logits, cs.e, cs.t, cs.bias, cs.k, f, 2.5f, cs.groups, cs.used, ids, w));
        for (std::int64_t i = 0; i < cs.t; ++i) {
          ASSERT_TRUE(run_grouped(c, cs.logits + i * cs.e, cs.e, 1, cs.bias, cs.k, f, 2.5f, cs.groups, cs.used, one_ids,
                                  one_w));
          EXPECT_TRUE(std::equal(one_ids.begin(), one_ids.end(), ids.begin() + i * cs.k))
              << "E=" << cs.e << " flags=" << f << ": token " << i << "'s picks alone differ from the batch's";
          EXPECT_EQ(0, std::memcmp(one_w.data(), w.data() + i * cs.k, one_w.size() * sizeof(float)))
              << "E=" << cs.e << " flags=" << f << ": token " << i << "'s weights alone differ from the batch's";
        }
      }
    }
  }
}

// A NaN logit: what topk_routing does on this backend (the same call fails, or the token's picks are marked id -1
// with weight NaN while the other tokens are routed as ever).
TEST_P(ComputeConformance, TopkRoutingGroupedTreatsANaNLogitAsTopkRoutingDoes) {
  COMPUTE_FIXTURE(c);
  if (!c.supports(Op::topk_routing_grouped, DType::f32))
    GTEST_SKIP() << "this backend does not offer the optional topk_routing_grouped";
  const std::int64_t e = 16, t = 3;
  auto logits = randn(static_cast<std::size_t>(e * t), 154, 2.0f);
  const auto bias = randn(static_cast<std::size_t>(e), 155, 0.5f);
  const auto clean = logits;
  logits[static_cast<std::size_t>(e + 5)] = std::numeric_limits<float>::quiet_NaN();  // token 1, expert 5
  for (int flags : {kRoutingSigmoid | kRoutingRenormalize, kRoutingSoftmax | kRoutingGroupMax, 0}) {
    for (int k : {1, 3}) {
      const std::string what = "topk_routing_grouped flags=" + std::to_string(flags) + " k=" + std::to_string(k);
      std::vector<std::int32_t> ids, plain_ids(static_cast<std::size_t>(k * t));
      std::vector<float> w, plain_w(plain_ids.size());
      OpParams p;
      p.top_k = k;
      p.flags = flags & ~kRoutingGroupMax;
      const Status plain =
          run_op(c, Op::topk_routing, {arg(DType::f32, {e, t, 1, 1}, logits)},
                 {arg(DType::i32, {k, t, 1, 1}, plain_ids), arg(DType::f32, {k, t, 1, 1}, plain_w)}, p);
      const Status s = run_grouped(c, logits.data(), e, t, bias.data(), k, flags, 2.5f, 4, 2, ids, w);
      EXPECT_EQ(s.is_ok(), plain.is_ok()) << what << ": topk_routing " << (plain ? "marked" : "refused")
                                          << " the NaN, topk_routing_grouped " << (s ? "ran" : "failed");
      if (!s) {
        EXPECT_NE(s.message().find("NaN"), std::string::npos) << what << ": " << s.to_string();
        continue;
      }
      ASSERT_NO_FATAL_FAILURE(expect_clear_grouped_cuts(clean.data(), bias.data(), e, t, k, flags, 4, 2));
      expect_nan_token_marked(ids, w, ref::topk_routing_grouped(clean.data(), bias.data(), e, t, k, flags, 2.5f, 4, 2),
                              t, k, what, true);
    }
  }
}

TEST_P(ComputeConformance, TopkRoutingGroupedRefusesBadCallsNamingTheField) {
  COMPUTE_FIXTURE(c);
  if (!c.supports(Op::topk_routing_grouped, DType::f32))
    GTEST_SKIP() << "this backend does not offer the optional topk_routing_grouped";
  std::vector<float> big(1 << 12, 0.5f);
  std::vector<std::int32_t> out_ids(256);
  const std::int64_t e = 8, t = 2;
  auto call = [&](int k, int groups, int used, int flags = kRoutingSigmoid, std::int64_t bias_n = 8) {
    OpParams p;
    p.top_k = k;
    p.flags = flags;
    p.groups = groups;
    p.groups_used = used;
    return run_op(c, Op::topk_routing_grouped,
                  {arg(DType::f32, {e, t, 1, 1}, big), arg(DType::f32, {bias_n, 1, 1, 1}, big)},
                  {arg(DType::i32, {k, t, 1, 1}, out_ids), arg(DType::f32, {k, t, 1, 1}, big)}, p);
  };
  auto expect_error = [&](const std::string& what, const char* names, Status s) {
    EXPECT_FALSE(s.is_ok()) << what << " was accepted";
    if (s.is_ok()) return;
    for (const char* n : {"topk_routing_grouped", names}) {
      EXPECT_NE(s.message().find(n), std::string::npos)
          << what << ": the error does not name " << n << ": " << s.to_string();
    }
  };
  ASSERT_TRUE(call(2, 4, 2)) << "the good call the others are made from";
  ASSERT_TRUE(call(4, 4, 2)) << "k = groups_used * E / groups";
  ASSERT_TRUE(call(2, 8, 3, kRoutingSigmoid | kRoutingGroupMax)) << "groups of one expert, scored by their best";
  expect_error("groups 1", "groups", call(2, 1, 1));
  expect_error("groups 0", "groups", call(2, 0, 0));
  expect_error("groups not dividing E", "groups", call(2, 3, 2));
  expect_error("groups of one expert, scored by their best two", "groups", call(2, 8, 3));
  expect_error("groups_used 0", "groups_used", call(2, 4, 0));
  expect_error("groups_used > groups", "groups_used", call(2, 4, 5));
  expect_error("k > groups_used * E / groups", "top_k", call(5, 4, 2));
  expect_error("a bias of E - 1 elements", "bias", call(2, 4, 2, kRoutingSigmoid, e - 1));
  expect_error("softmax and sigmoid at once", "topk_routing_grouped", call(2, 4, 2, kRoutingSoftmax | kRoutingSigmoid));
}

TEST_P(ComputeConformance, EmbeddingDequantizesTheRequestedRows) {
  COMPUTE_FIXTURE(c);
  const std::int64_t d = 256, v = 9;
  std::vector<std::int32_t> ids{8, 0, 3, 3};
  const auto t = static_cast<std::int64_t>(ids.size());
  for (DType type : kWeightTypes) {
    if (!c.supports(Op::embedding, type)) continue;
    const auto table = make_weights(type, d, v, 111, 1.0f);
    std::vector<float> y(static_cast<std::size_t>(d * t));
    ASSERT_TRUE(run_op(
        c, Op::embedding,
        {arg(type, {d, v, 1, 1}, const_cast<std::byte*>(table.bytes.data())), arg(DType::i32, {t, 1, 1, 1}, ids)},
        {arg(DType::f32, {d, t, 1, 1}, y)}))
        << label(type);
    Mismatches mm("embedding " + label(type));
    for (std::int64_t i = 0; i < t; ++i) {
      for (std::int64_t j = 0; j < d; ++j) {
        const float want = table.dequant[static_cast<std::size_t>(ids[static_cast<std::size_t>(i)] * d + j)];
        mm.check(static_cast<std::size_t>(i * d + j), y[static_cast<std::size_t>(i * d + j)], want,
                 1e-6 * std::fabs(want));
      }
    }
  }
}

// store_rows (optional): new rows encoded at an offset inside a larger buffer, as a KV cache write places them, must
// be the bytes of colibri::quant::quantize_row, and the bytes around them must stay as they were. Values include
// values at a q8_0 rounding tie (x / d = k + 0.5, up to an ulp) and halfway between two f16 values.
TEST_P(ComputeConformance, StoreRowsEncodesLikeColibriQuantAndTouchesNothingElse) {
  COMPUTE_FIXTURE(c);
  const std::int64_t d = 128, rows = 5, before = 3, after = 2;
  auto x = randn(static_cast<std::size_t>(d * rows), 131, 2.0f);
  x[7] = 40.0f;                          // block 0's amax: d = 40 / 127
  x[8] = 40.0f / 127.0f * 2.5f;          // at (or an ulp from) a tie of the q8_0 rounding
  x[40] = 1.0f + std::ldexp(1.0f, -11);  // halfway between two f16 values
  x[41] = -(1.0f + 3.0f * std::ldexp(1.0f, -11));
  x[4 * d + 9] = -std::numeric_limits<float>::quiet_NaN();  // f16 sign | 0x7E00; q8_0: d is NaN, the block's q 0
  int tested = 0;
  for (DType type : {DType::f32, DType::f16, DType::q8_0}) {
    if (!c.supports(Op::store_rows, type)) continue;
    ++tested;
    const std::size_t rb = row_bytes(type, d);
    std::vector<std::byte> want(rb * static_cast<std::size_t>(rows));
    if (type == DType::f32) {
      std::memcpy(want.data(), x.data(), want.size());
    } else {
      ASSERT_TRUE(quant::quantize_row(type, x.data(), want.data(), d * rows));
    }
    const std::size_t total = rb * static_cast<std::size_t>(before + rows + after);
    std::vector<std::byte> sentinel(total);
    for (std::size_t i = 0; i < total; ++i) sentinel[i] = static_cast<std::byte>(0xA5 ^ (i * 7));
    auto xb = c.allocate(x.size() * sizeof(float));
    auto yb = c.allocate(total);
    ASSERT_TRUE(xb && yb);
    auto up = c.copy_to_device_async(x.data(), **xb, 0, x.size() * sizeof(float));
    ASSERT_TRUE(up && (*up)->wait());
    auto fill = c.copy_to_device_async(sentinel.data(), **yb, 0, total);
    ASSERT_TRUE(fill && (*fill)->wait());
    const Tensor in{DType::f32, {d, rows, 1, 1}, (*xb)->host_pointer(), xb->get(), 0};
    Tensor out{type, {d, rows, 1, 1}, nullptr, yb->get(), rb * static_cast<std::size_t>(before)};
    if (void* p = (*yb)->host_pointer()) out.data = static_cast<std::byte*>(p) + out.offset;
    ASSERT_TRUE(c.run(OpCall{Op::store_rows, std::span<const Tensor>(&in, 1), std::span<Tensor>(&out, 1), {}}))
        << label(type);
    std::vector<std::byte> got(total);
    auto down = c.copy_to_host_async(**yb, 0, got.data(), total);
    ASSERT_TRUE(down && (*down)->wait());
    const std::size_t at = rb * static_cast<std::size_t>(before);
    EXPECT_EQ(0, std::memcmp(got.data(), sentinel.data(), at)) << label(type) << ": bytes before the rows changed";
    EXPECT_EQ(0,
              std::memcmp(got.data() + at + want.size(), sentinel.data() + at + want.size(), total - at - want.size()))
        << label(type) << ": bytes after the rows changed";
    for (std::size_t i = 0; i < want.size(); ++i) {
      ASSERT_EQ(got[at + i], want[i]) << label(type) << ": byte " << i << " of the rows (row " << i / rb << ")";
    }
  }
  if (tested == 0) GTEST_SKIP() << "store_rows is optional and this backend does not offer it";
}

// ------------------------------------------------------------------ gpt-oss: attention_sinks, expert_ffn_clamped

// Both are optional: a backend whose supports() says no must refuse them (any error will do; the engine never calls
// them then) and the tests skip.

namespace {

// One sink per query head: far below every score (no effect), near the scores (a share of the softmax), and far above
// them (the head attends almost only to the sink, so its output is near zero). All differ, so a sink read for the
// wrong head shows.
std::vector<float> head_sinks(std::int64_t heads) {
  const float pattern[] = {-100.0f, 2.5f, -2.0f, 20.0f, 0.0f, 6.0f, -0.5f, 4.0f};
  std::vector<float> s(static_cast<std::size_t>(heads));
  for (std::size_t i = 0; i < s.size(); ++i) s[i] = pattern[i % 8] + 0.25f * static_cast<float>(i / 8);
  return s;
}

// A KV cache of `type` and what the reference reads from it.
struct KvCache {
  std::vector<std::byte> k, v;
  std::vector<float> kd, vd;
};

KvCache make_kv(DType type, std::int64_t hd, std::int64_t kvh, std::int64_t s, unsigned seed) {
  const std::int64_t n = hd * kvh * s;
  const auto kf = randn(static_cast<std::size_t>(n), seed);
  const auto vf = randn(static_cast<std::size_t>(n), seed + 1);
  KvCache c;
  c.k.resize(tensor_bytes(type, {hd, kvh, s, 1}));
  c.v.resize(c.k.size());
  if (auto st = quant::quantize_row(type, kf.data(), c.k.data(), n); !st) throw std::runtime_error(st.to_string());
  if (auto st = quant::quantize_row(type, vf.data(), c.v.data(), n); !st) throw std::runtime_error(st.to_string());
  c.kd = ref::dequantize(type, c.k.data(), n);
  c.vd = ref::dequantize(type, c.v.data(), n);
  return c;
}

// attention_sinks of t queries (at q) against the whole cache of s positions.
Status run_attention_sinks(Compute& c, DType type, KvCache& kv, std::int64_t hd, std::int64_t heads, std::int64_t kvh,
                           std::int64_t s, const float* q, std::int64_t t, std::vector<float>& sinks, float* o,
                           const OpParams& p) {
  return run_op(c, Op::attention_sinks,
                {arg(DType::f32, {hd, heads, t, 1}, const_cast<float*>(q)), arg(type, {hd, kvh, s, 1}, kv.k.data()),
                 arg(type, {hd, kvh, s, 1}, kv.v.data()), arg(DType::f32, {heads, 1, 1, 1}, sinks)},
                {arg(DType::f32, {hd, heads, t, 1}, o)}, p);
}

// One gpt-oss expert: weights of three types and the three biases.
struct ClampedExpert {
  DType types[3];
  Weights g, u, dn;
  std::vector<float> bg, bu, bd;
};

ClampedExpert make_clamped_expert(const DType (&types)[3], std::int64_t d, std::int64_t f, unsigned seed,
                                  float bias_sigma) {
  return ClampedExpert{{types[0], types[1], types[2]},
                       make_weights(types[0], d, f, seed),
                       make_weights(types[1], d, f, seed + 1),
                       make_weights(types[2], f, d, seed + 2),
                       randn(static_cast<std::size_t>(f), seed + 3, bias_sigma),
                       randn(static_cast<std::size_t>(f), seed + 4, bias_sigma),
                       randn(static_cast<std::size_t>(d), seed + 5)};
}

// expert_ffn_clamped's seven inputs for t tokens of x.
std::vector<Arg> clamped_inputs(ClampedExpert& e, std::int64_t d, std::int64_t f, const float* x, std::int64_t t) {
  return {arg(e.types[0], {d, f, 1, 1}, const_cast<std::byte*>(e.g.bytes.data())),
          arg(e.types[1], {d, f, 1, 1}, const_cast<std::byte*>(e.u.bytes.data())),
          arg(e.types[2], {f, d, 1, 1}, const_cast<std::byte*>(e.dn.bytes.data())),
          arg(DType::f32, {d, t, 1, 1}, const_cast<float*>(x)),
          arg(DType::f32, {f, 1, 1, 1}, e.bg),
          arg(DType::f32, {f, 1, 1, 1}, e.bu),
          arg(DType::f32, {d, 1, 1, 1}, e.bd)};
}

OpParams clamped_params(float alpha, float limit, bool exact) {
  OpParams p;
  p.scale = alpha;
  p.eps = limit;
  p.flags = exact ? kExactActivations : 0;
  return p;
}

std::vector<double> ref_clamped(const ClampedExpert& e, std::int64_t d, std::int64_t f, const float* x, std::int64_t t,
                                float alpha, float limit) {
  return ref::expert_ffn_clamped(DType::f32, e.g.dequant.data(), DType::f32, e.u.dequant.data(), DType::f32,
                                 e.dn.dequant.data(), d, f, x, t, e.bg.data(), e.bu.data(), e.bd.data(), alpha, limit);
}

double rms_of(const std::vector<double>& v) {
  double s = 0.0;
  for (double x : v) s += x * x;
  return std::sqrt(s / static_cast<double>(v.size()));
}

}  // namespace

TEST_P(ComputeConformance, AttentionSinksMatchReferenceWithGqaWindowsAndCacheTypes) {
  COMPUTE_FIXTURE(c);
  const std::int64_t hd = 64, heads = 8, kvh = 2, s = 300;
  struct Case {
    std::int64_t t;
    std::int32_t position, window;
  };
  const Case cases[] = {{1, 299, 0}, {3, 130, 0}, {17, 0, 0}, {17, 283, 0}, {3, 200, 50}, {1, 299, 1}, {9, 60, 7}};
  auto sinks = head_sinks(heads);
  int tested = 0;
  for (DType kv : kKvTypes) {
    if (!c.supports(Op::attention_sinks, kv)) continue;
    ++tested;
    auto cache = make_kv(kv, hd, kvh, s, 171);
    for (const Case& cs : cases) {
      const auto q = randn(static_cast<std::size_t>(hd * heads * cs.t), static_cast<unsigned>(173 + cs.position));
      OpParams p;
      p.position = cs.position;
      p.window = cs.window;
      p.scale = 0.125f;
      std::vector<float> o(q.size(), std::nanf(""));
      const std::string what = "attention_sinks kv=" + label(kv) + " T=" + std::to_string(cs.t) +
                               " position=" + std::to_string(cs.position) + " window=" + std::to_string(cs.window);
      const Status st = run_attention_sinks(c, kv, cache, hd, heads, kvh, s, q.data(), cs.t, sinks, o.data(), p);
      ASSERT_TRUE(st) << what << ": " << st.to_string();
      const auto want = ref::attention(q.data(), hd, heads, cs.t, cache.kd.data(), cache.vd.data(), kvh, s, cs.position,
                                       cs.window, p.scale, sinks.data());
      Mismatches mm(what);
      for (std::size_t i = 0; i < o.size(); ++i) mm.check(i, o[i], want[i], 2e-5 + 1e-5 * std::fabs(want[i]));
      // The case can fail: without the sinks (or with them scaled, or read for another head) the answer is far off.
      const auto plain = ref::attention(q.data(), hd, heads, cs.t, cache.kd.data(), cache.vd.data(), kvh, s,
                                        cs.position, cs.window, p.scale);
      double apart = 0.0;
      for (std::size_t i = 0; i < want.size(); ++i) apart = std::max(apart, std::fabs(want[i] - plain[i]));
      EXPECT_GT(apart, 0.05) << what << ": the test's sinks do not change the reference enough to be seen";
    }
  }
  if (tested == 0) {
    auto cache = make_kv(DType::f32, hd, kvh, s, 171);
    const auto q = randn(static_cast<std::size_t>(hd * heads), 172);
    std::vector<float> o(q.size());
    EXPECT_FALSE(run_attention_sinks(c, DType::f32, cache, hd, heads, kvh, s, q.data(), 1, sinks, o.data(), {}))
        << "a backend whose supports() says no ran attention_sinks";
    GTEST_SKIP() << "this backend does not offer the optional attention_sinks";
  }
}

TEST_P(ComputeConformance, AttentionSinksQueryResultDoesNotDependOnTheBatch) {
  COMPUTE_FIXTURE(c);
  const std::int64_t hd = 64, heads = 4, kvh = 1, s = 260, t = 7;
  const std::int32_t pos0 = 200;
  auto sinks = head_sinks(heads);
  int tested = 0;
  for (DType kv : kKvTypes) {
    if (!c.supports(Op::attention_sinks, kv)) continue;
    ++tested;
    auto cache = make_kv(kv, hd, kvh, s, 181);
    const auto q = randn(static_cast<std::size_t>(hd * heads * t), 183);
    for (std::int32_t window : {0, 40}) {
      OpParams p;
      p.position = pos0;
      p.window = window;
      p.scale = 0.125f;
      std::vector<float> batch(q.size());
      ASSERT_TRUE(run_attention_sinks(c, kv, cache, hd, heads, kvh, s, q.data(), t, sinks, batch.data(), p));
      for (std::int64_t i = 0; i < t; ++i) {
        std::vector<float> one(static_cast<std::size_t>(hd * heads));
        OpParams pi = p;
        pi.position = pos0 + static_cast<std::int32_t>(i);
        ASSERT_TRUE(
            run_attention_sinks(c, kv, cache, hd, heads, kvh, s, q.data() + i * hd * heads, 1, sinks, one.data(), pi));
        EXPECT_EQ(0, std::memcmp(one.data(), batch.data() + i * hd * heads, one.size() * sizeof(float)))
            << "attention_sinks kv=" << label(kv) << " window=" << window << ": query " << i
            << " differs alone and in a batch of 7";
      }
    }
  }
  if (tested == 0) GTEST_SKIP() << "this backend does not offer the optional attention_sinks";
}

// A sliding-window layer's KV cache keeps only the rows its window still reads, starting at a multiple of 64
// (engine::KvCache): row j holds position first + j, and the queries' position is given less `first`. Attention must
// give the bits it gives over the whole cache, i.e. its key blocks follow the key index modulo 64 (or the window).
TEST_P(ComputeConformance, AttentionOverAWindowDoesNotDependOnWhichMultipleOf64TheRowsStartFrom) {
  COMPUTE_FIXTURE(c);
  const std::int64_t hd = 64, heads = 4, kvh = 2, s = 300, t = 5;
  const std::int32_t pos0 = 290, window = 40;  // the first query reads from position 251: rows may start at 0..192
  auto sinks = head_sinks(heads);
  int tested = 0;
  for (DType kv : kKvTypes) {
    for (Op op : {Op::attention, Op::attention_sinks}) {
      if (!c.supports(op, kv)) continue;
      ++tested;
      auto cache = make_kv(kv, hd, kvh, s, 191);
      auto q = randn(static_cast<std::size_t>(hd * heads * t), 193);
      const std::size_t row = row_bytes(kv, hd) * static_cast<std::size_t>(kvh);
      std::vector<float> whole;
      for (std::int32_t first : {0, 64, 128, 192}) {
        OpParams p;
        p.position = pos0 - first;
        p.window = window;
        p.scale = 0.125f;
        const std::int64_t rows = s - first;
        std::vector<Arg> in{arg(DType::f32, {hd, heads, t, 1}, q),
                            arg(kv, {hd, kvh, rows, 1}, cache.k.data() + static_cast<std::size_t>(first) * row),
                            arg(kv, {hd, kvh, rows, 1}, cache.v.data() + static_cast<std::size_t>(first) * row)};
        if (op == Op::attention_sinks) in.push_back(arg(DType::f32, {heads, 1, 1, 1}, sinks));
        std::vector<float> o(q.size());
        ASSERT_TRUE(run_op(c, op, in, {arg(DType::f32, {hd, heads, t, 1}, o)}, p));
        if (first == 0) {
          whole = o;
          continue;
        }
        EXPECT_EQ(0, std::memcmp(o.data(), whole.data(), o.size() * sizeof(float)))
            << op_name(op) << " kv=" << label(kv) << ": rows from position " << first << " differ from the whole cache";
      }
    }
  }
  if (tested == 0) GTEST_SKIP() << "this backend offers no attention";
}

TEST_P(ComputeConformance, ExpertFfnClampedMatchesReferenceAndItsClampsAct) {
  COMPUTE_FIXTURE(c);
  const std::int64_t d = 256, f = 512;
  const DType combos[][3] = {{DType::f32, DType::f32, DType::f32},      {DType::q4_k, DType::q4_k, DType::q6_k},
                             {DType::q8_0, DType::q8_0, DType::q8_0},   {DType::q4_0, DType::q4_0, DType::q5_k},
                             {DType::bf16, DType::f16, DType::q2_k},    {DType::q3_k, DType::q3_k, DType::q4_k},
                             {DType::mxfp4, DType::mxfp4, DType::mxfp4}};  // gpt-oss's own experts, where claimed
  // gpt-oss's alpha and limit, and a tighter limit; the biases push gate and up well past +-limit.
  struct Clamp {
    float alpha, limit, bias_sigma;
  };
  const Clamp clamps[] = {{1.702f, 7.0f, 8.0f}, {1.0f, 1.5f, 2.0f}};
  int tested = 0;
  for (const auto& combo : combos) {
    if (!c.supports(Op::expert_ffn_clamped, combo[0]) || !c.supports(Op::expert_ffn_clamped, combo[1]) ||
        !c.supports(Op::expert_ffn_clamped, combo[2])) {
      continue;
    }
    ++tested;
    for (const Clamp& cl : clamps) {
      auto e = make_clamped_expert(combo, d, f, 141, cl.bias_sigma);
      for (std::int64_t t : {1, 5}) {
        const auto x = randn(static_cast<std::size_t>(d * t), static_cast<unsigned>(144 + t));
        const std::string base = "expert_ffn_clamped " + label(combo[0]) + "/" + label(combo[1]) + "/" +
                                 label(combo[2]) + " alpha=" + std::to_string(cl.alpha) +
                                 " limit=" + std::to_string(cl.limit) + " T=" + std::to_string(t);
        const auto want = ref_clamped(e, d, f, x.data(), t, cl.alpha, cl.limit);
        const double rms = rms_of(want);
        // The case can fail: a good share of gate values lie above limit and of up values outside +-limit, and
        // without the clamps (or with gate clamped from below too) the answer is far off.
        {
          const auto gate = ref::matmul(DType::f32, e.g.dequant.data(), d, f, x.data(), t, e.bg.data());
          const auto up = ref::matmul(DType::f32, e.u.dequant.data(), d, f, x.data(), t, e.bu.data());
          std::size_t high = 0, low = 0, outside = 0;
          for (std::size_t i = 0; i < gate.size(); ++i) {
            high += gate[i] > cl.limit;
            low += gate[i] < -cl.limit;
            outside += std::fabs(up[i]) > cl.limit;
          }
          EXPECT_GT(high, gate.size() / 10) << base << ": test data: too few gate values above the limit";
          EXPECT_GT(low, gate.size() / 10) << base << ": test data: too few gate values below -limit";
          EXPECT_GT(outside, gate.size() / 5) << base << ": test data: too few up values outside +-limit";
          const auto loose = ref_clamped(e, d, f, x.data(), t, cl.alpha, 1e30f);
          double err2 = 0.0;
          for (std::size_t i = 0; i < want.size(); ++i) err2 += (loose[i] - want[i]) * (loose[i] - want[i]);
          EXPECT_GT(std::sqrt(err2 / static_cast<double>(want.size())) / rms, 0.3)
              << base << ": test data: the clamps do not change the reference enough to be seen";
        }
        for (bool exact : {true, false}) {
          const std::string what = base + (exact ? " exact" : "");
          const OpParams p = clamped_params(cl.alpha, cl.limit, exact);
          std::vector<float> y(static_cast<std::size_t>(d * t), std::nanf(""));
          const Status s = run_op(c, Op::expert_ffn_clamped, clamped_inputs(e, d, f, x.data(), t),
                                  {arg(DType::f32, {d, t, 1, 1}, y)}, p);
          ASSERT_TRUE(s) << what << ": " << s.to_string();
          if (exact) {
            Mismatches mm(what);
            for (std::size_t i = 0; i < y.size(); ++i) mm.check(i, y[i], want[i], 1e-4 * rms);
          } else {
            double err2 = 0.0;
            for (std::size_t i = 0; i < y.size(); ++i) err2 += (y[i] - want[i]) * (y[i] - want[i]);
            EXPECT_LT(std::sqrt(err2 / static_cast<double>(y.size())) / rms, 0.03) << what << ": relative RMS error";
            continue;
          }
          // Each product has matmul's numerics, its bias included: gate and up from matmul, the activation here in
          // float, then down with matmul, lands within float rounding of the op.
          std::vector<float> gate(static_cast<std::size_t>(f * t)), up(gate.size()), h(gate.size()), y2(y.size());
          auto in = clamped_inputs(e, d, f, x.data(), t);
          ASSERT_TRUE(run_op(c, Op::matmul, {in[0], in[3], in[4]}, {arg(DType::f32, {f, t, 1, 1}, gate)}, p));
          ASSERT_TRUE(run_op(c, Op::matmul, {in[1], in[3], in[5]}, {arg(DType::f32, {f, t, 1, 1}, up)}, p));
          for (std::size_t i = 0; i < h.size(); ++i) {
            const float g = std::min(gate[i], cl.limit), u = std::clamp(up[i], -cl.limit, cl.limit);
            h[i] = static_cast<float>((u + 1.0) * g * ref::sigmoid(static_cast<double>(cl.alpha) * g));
          }
          ASSERT_TRUE(run_op(c, Op::matmul, {in[2], arg(DType::f32, {f, t, 1, 1}, h), in[6]},
                             {arg(DType::f32, {d, t, 1, 1}, y2)}, p));
          Mismatches composed(what + " against matmul, the activation and matmul");
          for (std::size_t i = 0; i < y.size(); ++i) composed.check(i, y[i], y2[i], 1e-5 * rms);
        }
      }
    }
  }
  if (tested == 0) {
    const DType f32s[3] = {DType::f32, DType::f32, DType::f32};
    auto e = make_clamped_expert(f32s, d, f, 141, 1.0f);
    const auto x = randn(static_cast<std::size_t>(d), 145);
    std::vector<float> y(static_cast<std::size_t>(d));
    EXPECT_FALSE(run_op(c, Op::expert_ffn_clamped, clamped_inputs(e, d, f, x.data(), 1),
                        {arg(DType::f32, {d, 1, 1, 1}, y)}, clamped_params(1.702f, 7.0f, false)))
        << "a backend whose supports() says no ran expert_ffn_clamped";
    GTEST_SKIP() << "this backend does not offer the optional expert_ffn_clamped";
  }
}

TEST_P(ComputeConformance, ExpertFfnClampedTokenResultDoesNotDependOnTheBatch) {
  COMPUTE_FIXTURE(c);
  const std::int64_t d = 256, f = 512, t = 7;
  const DType combos[][3] = {{DType::q4_k, DType::q4_k, DType::q6_k},
                             {DType::q8_0, DType::q8_0, DType::q8_0},
                             {DType::f16, DType::bf16, DType::q4_0},
                             {DType::q5_k, DType::q3_k, DType::q2_k},
                             {DType::mxfp4, DType::mxfp4, DType::mxfp4}};
  int tested = 0;
  for (const auto& combo : combos) {
    if (!c.supports(Op::expert_ffn_clamped, combo[0]) || !c.supports(Op::expert_ffn_clamped, combo[1]) ||
        !c.supports(Op::expert_ffn_clamped, combo[2])) {
      continue;
    }
    ++tested;
    auto e = make_clamped_expert(combo, d, f, 151, 4.0f);
    const auto x = randn(static_cast<std::size_t>(d * t), 155);
    for (bool exact : {false, true}) {
      const OpParams p = clamped_params(1.702f, 3.0f, exact);
      const std::string what = "expert_ffn_clamped " + label(combo[0]) + "/" + label(combo[1]) + "/" + label(combo[2]) +
                               (exact ? " exact" : "");
      std::vector<float> batch(static_cast<std::size_t>(d * t));
      ASSERT_TRUE(run_op(c, Op::expert_ffn_clamped, clamped_inputs(e, d, f, x.data(), t),
                         {arg(DType::f32, {d, t, 1, 1}, batch)}, p))
          << what;
      for (std::int64_t i = 0; i < t; ++i) {
        std::vector<float> one(static_cast<std::size_t>(d));
        ASSERT_TRUE(run_op(c, Op::expert_ffn_clamped, clamped_inputs(e, d, f, x.data() + i * d, 1),
                           {arg(DType::f32, {d, 1, 1, 1}, one)}, p))
            << what;
        EXPECT_EQ(0, std::memcmp(one.data(), batch.data() + i * d, one.size() * sizeof(float)))
            << what << ": token " << i << " differs alone and in a batch of 7";
      }
      std::vector<float> mid(static_cast<std::size_t>(d * 3));
      ASSERT_TRUE(run_op(c, Op::expert_ffn_clamped, clamped_inputs(e, d, f, x.data() + 2 * d, 3),
                         {arg(DType::f32, {d, 3, 1, 1}, mid)}, p))
          << what;
      EXPECT_EQ(0, std::memcmp(mid.data(), batch.data() + 2 * d, mid.size() * sizeof(float)))
          << what << ": tokens 2..4 differ in a batch of 3 and of 7";
    }
  }
  if (tested == 0) GTEST_SKIP() << "this backend does not offer the optional expert_ffn_clamped";
}

TEST_P(ComputeConformance, AttentionSinksAndExpertFfnClampedDoNotDependOnThreadCount) {
  COMPUTE_FIXTURE_WITH(one, (std::map<std::string, std::string>{{"threads", "1"}}));
  COMPUTE_FIXTURE_WITH(two, (std::map<std::string, std::string>{{"threads", "2"}}));
  int tested = 0;
  if (one.supports(Op::attention_sinks, DType::f16)) {
    ++tested;
    const std::int64_t hd = 64, h = 8, kvh = 2, s = 300, t = 7;
    auto cache = make_kv(DType::f16, hd, kvh, s, 191);
    auto sinks = head_sinks(h);
    const auto q = randn(static_cast<std::size_t>(hd * h * t), 193);
    OpParams p;
    p.position = 250;
    p.scale = 0.125f;
    std::vector<float> o1(q.size()), o2(q.size());
    ASSERT_TRUE(run_attention_sinks(one, DType::f16, cache, hd, h, kvh, s, q.data(), t, sinks, o1.data(), p));
    ASSERT_TRUE(run_attention_sinks(two, DType::f16, cache, hd, h, kvh, s, q.data(), t, sinks, o2.data(), p));
    EXPECT_EQ(0, std::memcmp(o1.data(), o2.data(), o1.size() * sizeof(float))) << "attention_sinks";
  }
  const DType triples[][3] = {{DType::q4_k, DType::q4_k, DType::q6_k}, {DType::mxfp4, DType::mxfp4, DType::mxfp4}};
  for (const auto& types : triples) {
    if (!one.supports(Op::expert_ffn_clamped, types[0]) || !one.supports(Op::expert_ffn_clamped, types[2])) continue;
    ++tested;
    const std::int64_t d = 256, f = 768, t = 7;
    auto e = make_clamped_expert(types, d, f, 195, 4.0f);
    const auto x = randn(static_cast<std::size_t>(d * t), 199);
    std::vector<float> y1(static_cast<std::size_t>(d * t)), y2(y1.size());
    const OpParams p = clamped_params(1.702f, 3.0f, false);
    ASSERT_TRUE(run_op(one, Op::expert_ffn_clamped, clamped_inputs(e, d, f, x.data(), t),
                       {arg(DType::f32, {d, t, 1, 1}, y1)}, p));
    ASSERT_TRUE(run_op(two, Op::expert_ffn_clamped, clamped_inputs(e, d, f, x.data(), t),
                       {arg(DType::f32, {d, t, 1, 1}, y2)}, p));
    EXPECT_EQ(0, std::memcmp(y1.data(), y2.data(), y1.size() * sizeof(float)))
        << "expert_ffn_clamped " << label(types[0]);
  }
  if (tested == 0) GTEST_SKIP() << "this backend offers neither attention_sinks nor expert_ffn_clamped";
}

TEST_P(ComputeConformance, AttentionSinksAndExpertFfnClampedRefuseBadCalls) {
  COMPUTE_FIXTURE(c);
  std::vector<float> big(1 << 16, 0.5f);
  int tested = 0;
  auto expect_error = [&](const std::string& what, const char* op, Status s) {
    EXPECT_FALSE(s.is_ok()) << what << " was accepted";
    if (!s.is_ok()) {
      EXPECT_NE(s.message().find(op), std::string::npos)
          << what << ": the error does not name " << op << ": " << s.to_string();
    }
  };
  if (c.supports(Op::attention_sinks, DType::f32)) {
    ++tested;
    OpParams p;
    p.scale = 0.125f;
    const Arg q = arg(DType::f32, {64, 4, 1, 1}, big), k = arg(DType::f32, {64, 2, 12, 1}, big),
              o = arg(DType::f32, {64, 4, 1, 1}, big);
    expect_error("attention_sinks without sinks", "attention_sinks", run_op(c, Op::attention_sinks, {q, k, k}, {o}, p));
    expect_error("attention_sinks with 3 sinks for 4 heads", "attention_sinks",
                 run_op(c, Op::attention_sinks, {q, k, k, arg(DType::f32, {3, 1, 1, 1}, big)}, {o}, p));
    expect_error("attention_sinks with f16 sinks", "attention_sinks",
                 run_op(c, Op::attention_sinks, {q, k, k, arg(DType::f16, {4, 1, 1, 1}, big)}, {o}, p));
    OpParams past = p;
    past.position = 10;
    expect_error(
        "attention_sinks past the end of the KV cache", "attention_sinks",
        run_op(c, Op::attention_sinks, {arg(DType::f32, {64, 4, 3, 1}, big), k, k, arg(DType::f32, {4, 1, 1, 1}, big)},
               {arg(DType::f32, {64, 4, 3, 1}, big)}, past));
  }
  if (c.supports(Op::expert_ffn_clamped, DType::f32)) {
    ++tested;
    const std::int64_t d = 64, f = 96;
    const Arg wg = arg(DType::f32, {d, f, 1, 1}, big), wd = arg(DType::f32, {f, d, 1, 1}, big),
              x = arg(DType::f32, {d, 2, 1, 1}, big), bf = arg(DType::f32, {f, 1, 1, 1}, big),
              bd = arg(DType::f32, {d, 1, 1, 1}, big), y = arg(DType::f32, {d, 2, 1, 1}, big);
    const OpParams good = clamped_params(1.702f, 7.0f, false);
    ASSERT_TRUE(run_op(c, Op::expert_ffn_clamped, {wg, wg, wd, x, bf, bf, bd}, {y}, good));
    expect_error("expert_ffn_clamped without biases", "expert_ffn_clamped",
                 run_op(c, Op::expert_ffn_clamped, {wg, wg, wd, x}, {y}, good));
    expect_error("expert_ffn_clamped with b_gate of D elements", "expert_ffn_clamped",
                 run_op(c, Op::expert_ffn_clamped, {wg, wg, wd, x, bd, bf, bd}, {y}, good));
    expect_error("expert_ffn_clamped with b_down of F elements", "expert_ffn_clamped",
                 run_op(c, Op::expert_ffn_clamped, {wg, wg, wd, x, bf, bf, bf}, {y}, good));
    expect_error(
        "expert_ffn_clamped with an f16 b_up", "expert_ffn_clamped",
        run_op(c, Op::expert_ffn_clamped, {wg, wg, wd, x, bf, arg(DType::f16, {f, 1, 1, 1}, big), bd}, {y}, good));
    for (float limit : {0.0f, -1.0f, std::numeric_limits<float>::infinity(), std::nanf("")}) {
      expect_error(
          "expert_ffn_clamped with limit " + std::to_string(limit), "expert_ffn_clamped",
          run_op(c, Op::expert_ffn_clamped, {wg, wg, wd, x, bf, bf, bd}, {y}, clamped_params(1.0f, limit, false)));
    }
    expect_error("expert_ffn_clamped with alpha NaN", "expert_ffn_clamped",
                 run_op(c, Op::expert_ffn_clamped, {wg, wg, wd, x, bf, bf, bd}, {y},
                        clamped_params(std::nanf(""), 7.0f, false)));
  }
  if (tested == 0) GTEST_SKIP() << "this backend offers neither attention_sinks nor expert_ffn_clamped";
}

// ------------------------------------------------------------------ Qwen3-Next's linear attention

// mul, causal_conv and gated_delta_rule are optional: a backend whose supports() says no must refuse them (the engine
// never calls them then) and the tests skip. Each is checked against a double-precision reference, and split into
// calls of fewer tokens with the state carried between them it must give the same bits.

namespace {

using DeltaShape = ref::DeltaShape;

// Columns [from, from + n) of a {width, T} array.
std::vector<float> columns(const std::vector<float>& v, std::int64_t width, std::int64_t from, std::int64_t n) {
  return std::vector<float>(v.begin() + from * width, v.begin() + (from + n) * width);
}

}  // namespace

TEST_P(ComputeConformance, MulMultipliesElementwise) {
  COMPUTE_FIXTURE(c);
  std::vector<float> a = randn(1000, 71), b = randn(1000, 72), y(1000, 7.0f);
  const Ne ne{10, 25, 4, 1};
  const Status st = run_op(c, Op::mul, {arg(DType::f32, ne, a), arg(DType::f32, ne, b)}, {arg(DType::f32, ne, y)});
  if (!c.supports(Op::mul, DType::f32)) {
    EXPECT_FALSE(st) << "a backend whose supports() says no ran mul";
    GTEST_SKIP() << "this backend does not offer the optional mul";
  }
  ASSERT_TRUE(st) << st.to_string();
  for (std::size_t i = 0; i < y.size(); ++i) ASSERT_EQ(bits_of(y[i]), bits_of(a[i] * b[i])) << "element " << i;
}

TEST_P(ComputeConformance, CausalConvMatchesTheReferenceAndCarriesItsState) {
  COMPUTE_FIXTURE(c);
  const std::int64_t ch = 70, k = 4, t = 9;
  auto x = randn(static_cast<std::size_t>(ch * t), 81), w = randn(static_cast<std::size_t>(ch * k), 82, 0.5f);
  const auto state0 = randn(static_cast<std::size_t>(ch * (k - 1)), 83);
  std::vector<float> y(x.size(), 9.0f), state = state0;
  auto call = [&](std::vector<float>& in, std::vector<float>& out, std::int64_t n) {
    return run_op(c, Op::causal_conv, {arg(DType::f32, {ch, n, 1, 1}, in), arg(DType::f32, {k, ch, 1, 1}, w)},
                  {arg(DType::f32, {ch, n, 1, 1}, out), arg(DType::f32, {ch, k - 1, 1, 1}, state)});
  };
  const Status st = call(x, y, t);
  if (!c.supports(Op::causal_conv, DType::f32)) {
    EXPECT_FALSE(st) << "a backend whose supports() says no ran causal_conv";
    GTEST_SKIP() << "this backend does not offer the optional causal_conv";
  }
  ASSERT_TRUE(st) << st.to_string();
  std::vector<double> ref_state(state0.begin(), state0.end());
  const auto want = ref::causal_conv(x, w, ref_state, ch, k, t);
  expect_close(y, want, 1e-5, "causal_conv");
  expect_close(state, ref_state, 0, "causal_conv's state after the call");
  // Token by token from the same state: the same bits.
  const auto whole = y, whole_state = state;
  state = state0;
  for (std::int64_t i = 0; i < t; ++i) {
    auto xi = columns(x, ch, i, 1);
    std::vector<float> yi(static_cast<std::size_t>(ch));
    ASSERT_TRUE(call(xi, yi, 1));
    expect_bits(yi, columns(whole, ch, i, 1), "causal_conv token " + std::to_string(i) + " alone");
  }
  expect_bits(state, whole_state, "causal_conv's state token by token");
  // A bad state shape is refused by name.
  std::vector<float> big(4096);
  const Status bad = run_op(c, Op::causal_conv, {arg(DType::f32, {ch, t, 1, 1}, x), arg(DType::f32, {k, ch, 1, 1}, w)},
                            {arg(DType::f32, {ch, t, 1, 1}, big), arg(DType::f32, {ch, k, 1, 1}, big)});
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.message().find("state"), std::string::npos) << bad.to_string();
}

TEST_P(ComputeConformance, GatedDeltaRuleMatchesTheReferenceAndCarriesItsState) {
  COMPUTE_FIXTURE(c);
  const DeltaShape d{16, 2, 8, 4, 7};
  const auto n = [](std::int64_t v) { return static_cast<std::size_t>(v); };
  auto q = randn(n(d.dk * d.hk * d.t), 91), k = randn(n(d.dk * d.hk * d.t), 92), v = randn(n(d.dv * d.hv * d.t), 93);
  auto a = randn(n(d.hv * d.t), 94), b = randn(n(d.hv * d.t), 95), dt = randn(n(d.hv), 96);
  std::vector<float> A(n(d.hv));
  for (std::size_t h = 0; h < A.size(); ++h) A[h] = -std::exp(0.5f * static_cast<float>(h) - 1.0f);
  const auto state0 = randn(n(d.dv * d.dk * d.hv), 97, 0.3f);
  std::vector<float> state = state0, o(v.size(), 5.0f);
  auto call = [&](std::int64_t from, std::int64_t count, std::vector<float>& out) {
    auto qi = columns(q, d.dk * d.hk, from, count), ki = columns(k, d.dk * d.hk, from, count);
    auto vi = columns(v, d.dv * d.hv, from, count), ai = columns(a, d.hv, from, count);
    auto bi = columns(b, d.hv, from, count);
    out.assign(n(d.dv * d.hv * count), 5.0f);
    return run_op(c, Op::gated_delta_rule,
                  {arg(DType::f32, {d.dk, d.hk, count, 1}, qi), arg(DType::f32, {d.dk, d.hk, count, 1}, ki),
                   arg(DType::f32, {d.dv, d.hv, count, 1}, vi), arg(DType::f32, {d.hv, count, 1, 1}, ai),
                   arg(DType::f32, {d.hv, count, 1, 1}, bi), arg(DType::f32, {d.hv, 1, 1, 1}, A),
                   arg(DType::f32, {d.hv, 1, 1, 1}, dt)},
                  {arg(DType::f32, {d.dv, d.hv, count, 1}, out), arg(DType::f32, {d.dv, d.dk, d.hv, 1}, state)});
  };
  const Status st = call(0, d.t, o);
  if (!c.supports(Op::gated_delta_rule, DType::f32)) {
    EXPECT_FALSE(st) << "a backend whose supports() says no ran gated_delta_rule";
    GTEST_SKIP() << "this backend does not offer the optional gated_delta_rule";
  }
  ASSERT_TRUE(st) << st.to_string();
  std::vector<double> ref_state(state0.begin(), state0.end());
  const auto want = ref::gated_delta_rule(d, q, k, v, a, b, A, dt, ref_state, false);
  expect_close(o, want, 1e-5, "gated_delta_rule");
  expect_close(state, ref_state, 1e-5, "gated_delta_rule's state after the call");
  // In calls of 3, 1 and 3 tokens from the same state: the same bits.
  const auto whole = o, whole_state = state;
  state = state0;
  std::int64_t from = 0;
  for (const std::int64_t count : {3, 1, 3}) {
    std::vector<float> part;
    ASSERT_TRUE(call(from, count, part));
    expect_bits(part, columns(whole, d.dv * d.hv, from, count), "gated_delta_rule tokens from " + std::to_string(from));
    from += count;
  }
  expect_bits(state, whole_state, "gated_delta_rule's state in three calls");
  // Value heads in the tiled order (head j * Hk + g reads key head g) with kDeltaTiledHeads: each head's bits are
  // those of the same head in the grouped order (g * Hv / Hk + j).
  const std::int64_t r = d.hv / d.hk;
  const auto grouped = [&](std::int64_t t) { return (t % d.hk) * r + t / d.hk; };
  const auto tile = [&](const std::vector<float>& src, std::int64_t width, std::int64_t rows) {
    std::vector<float> out(src.size());
    for (std::int64_t row = 0; row < rows; ++row) {
      for (std::int64_t t = 0; t < d.hv; ++t) {
        std::copy_n(src.begin() + (row * d.hv + grouped(t)) * width, width, out.begin() + (row * d.hv + t) * width);
      }
    }
    return out;
  };
  auto v_t = tile(v, d.dv, d.t), a_t = tile(a, 1, d.t), b_t = tile(b, 1, d.t), A_t = tile(A, 1, 1),
       dt_t = tile(dt, 1, 1), st_t = tile(state0, d.dv * d.dk, 1);
  std::vector<float> o_t(v.size());
  OpParams tiled;
  tiled.flags = kDeltaTiledHeads;
  ASSERT_TRUE(run_op(c, Op::gated_delta_rule,
                     {arg(DType::f32, {d.dk, d.hk, d.t, 1}, q), arg(DType::f32, {d.dk, d.hk, d.t, 1}, k),
                      arg(DType::f32, {d.dv, d.hv, d.t, 1}, v_t), arg(DType::f32, {d.hv, d.t, 1, 1}, a_t),
                      arg(DType::f32, {d.hv, d.t, 1, 1}, b_t), arg(DType::f32, {d.hv, 1, 1, 1}, A_t),
                      arg(DType::f32, {d.hv, 1, 1, 1}, dt_t)},
                     {arg(DType::f32, {d.dv, d.hv, d.t, 1}, o_t), arg(DType::f32, {d.dv, d.dk, d.hv, 1}, st_t)},
                     tiled));
  expect_bits(o_t, tile(whole, d.dv, d.t), "gated_delta_rule with tiled value heads");
  expect_bits(st_t, tile(whole_state, d.dv * d.dk, 1), "gated_delta_rule's tiled state");
  // Value heads that are no multiple of the key heads are refused by name.
  std::vector<float> big(8192);
  const Status bad = run_op(c, Op::gated_delta_rule,
                            {arg(DType::f32, {d.dk, 3, 1, 1}, big), arg(DType::f32, {d.dk, 3, 1, 1}, big),
                             arg(DType::f32, {d.dv, d.hv, 1, 1}, big), arg(DType::f32, {d.hv, 1, 1, 1}, big),
                             arg(DType::f32, {d.hv, 1, 1, 1}, big), arg(DType::f32, {d.hv, 1, 1, 1}, big),
                             arg(DType::f32, {d.hv, 1, 1, 1}, big)},
                            {arg(DType::f32, {d.dv, d.hv, 1, 1}, big), arg(DType::f32, {d.dv, d.dk, d.hv, 1}, big)});
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.message().find("V "), std::string::npos) << bad.to_string();
}

// ------------------------------------------------------------------ DeepSeek's latent attention

// concat_rows and matmul_heads are optional: a backend whose supports() says no must refuse them (the engine never
// calls them then) and the tests skip. Attention at head_dim 576 (512 + 64, one KV head, the one latent cache passed
// as keys and values) is part of the required attention op.

namespace {

// Floats whose bits a copy must keep: NaNs with payloads and signs, infinities, -0, subnormals.
std::vector<float> awkward_floats(std::size_t n, unsigned seed) {
  auto v = randn(n, seed);
  const std::uint32_t bits[] = {0x7FC00001u, 0xFFC12345u, 0x7F800001u, 0x7F800000u,
                                0xFF800000u, 0x80000000u, 0x00000001u, 0x807FFFFFu};
  for (std::size_t i = 0; i < n; i += 3) std::memcpy(&v[i], &bits[(i / 3) % 8], sizeof(float));
  return v;
}

Status run_concat(Compute& c, std::vector<float>& a, const Ne& an, std::vector<float>& b, const Ne& bn,
                  std::vector<float>& y, const Ne& yn) {
  return run_op(c, Op::concat_rows, {arg(DType::f32, an, a), arg(DType::f32, bn, b)}, {arg(DType::f32, yn, y)});
}

// matmul_heads' weights: H matrices of n rows of k, each made (and dequantized for the reference) alone, then laid
// one after another as W {k, n, H}.
struct HeadWeights {
  std::vector<Weights> head;
  std::vector<std::byte> bytes;
};

HeadWeights make_head_weights(DType type, std::int64_t k, std::int64_t n, std::int64_t heads, unsigned seed) {
  HeadWeights w;
  for (std::int64_t h = 0; h < heads; ++h) {
    w.head.push_back(make_weights(type, k, n, seed + static_cast<unsigned>(h)));
    w.bytes.insert(w.bytes.end(), w.head.back().bytes.begin(), w.head.back().bytes.end());
  }
  return w;
}

// X {kx, heads, t} with NaN in every row past k, which matmul_heads must not read.
std::vector<float> heads_input(std::int64_t k, std::int64_t kx, std::int64_t heads, std::int64_t t, unsigned seed) {
  auto x = randn(static_cast<std::size_t>(kx * heads * t), seed);
  for (std::int64_t r = 0; r < heads * t; ++r)
    std::fill(x.begin() + r * kx + k, x.begin() + (r + 1) * kx, std::numeric_limits<float>::quiet_NaN());
  return x;
}

Status run_heads(Compute& c, DType type, HeadWeights& w, std::int64_t k, std::int64_t n, std::int64_t heads,
                 const float* x, std::int64_t kx, std::int64_t t, std::vector<float>& y, bool exact) {
  OpParams p;
  p.flags = exact ? kExactActivations : 0;
  y.assign(static_cast<std::size_t>(n * heads * t), std::nanf(""));
  return run_op(
      c, Op::matmul_heads,
      {arg(type, {k, n, heads, 1}, w.bytes.data()), arg(DType::f32, {kx, heads, t, 1}, const_cast<float*>(x))},
      {arg(DType::f32, {n, heads, t, 1}, y)}, p);
}

// Rows (i, h) of a {width, heads, t} array, i < t, as {width, t}.
template <typename T>
std::vector<T> head_rows(const std::vector<T>& v, std::int64_t width, std::int64_t heads, std::int64_t t,
                         std::int64_t h, std::int64_t take) {
  std::vector<T> out;
  for (std::int64_t i = 0; i < t; ++i) {
    const auto at = v.begin() + (i * heads + h) * width;
    out.insert(out.end(), at, at + take);
  }
  return out;
}

constexpr DType kHeadsTypes[] = {DType::f32, DType::f16, DType::q8_0, DType::q4_k};

}  // namespace

TEST_P(ComputeConformance, ConcatRowsCopiesEachRowOfAThenOfBBitForBit) {
  COMPUTE_FIXTURE(c);
  if (!c.supports(Op::concat_rows, DType::f32)) {
    std::vector<float> a(6), b(10), y(16);
    EXPECT_FALSE(run_concat(c, a, {3, 2, 1, 1}, b, {5, 2, 1, 1}, y, {8, 2, 1, 1}))
        << "a backend whose supports() says no ran concat_rows";
    GTEST_SKIP() << "this backend does not offer the optional concat_rows";
  }
  struct Case {
    Ne a, b, y;
  };
  // Odd widths, the rows counted over ne[1..3] and laid out differently in A, B and Y; DeepSeek's q and k rows
  // (512 + 64 per head); a single element each.
  const Case cases[] = {{{3, 2, 3, 2}, {5, 12, 1, 1}, {8, 4, 3, 1}},
                        {{5, 1, 1, 7}, {3, 7, 1, 1}, {8, 7, 1, 1}},
                        {{512, 16, 3, 1}, {64, 16, 3, 1}, {576, 16, 3, 1}},
                        {{1, 1, 1, 1}, {1, 1, 1, 1}, {2, 1, 1, 1}}};
  unsigned seed = 301;
  for (const Case& cs : cases) {
    auto a = awkward_floats(static_cast<std::size_t>(cs.a[0] * cs.a[1] * cs.a[2] * cs.a[3]), seed++);
    auto b = awkward_floats(static_cast<std::size_t>(cs.b[0] * cs.b[1] * cs.b[2] * cs.b[3]), seed++);
    const std::int64_t rows = cs.a[1] * cs.a[2] * cs.a[3];
    std::vector<float> y(static_cast<std::size_t>((cs.a[0] + cs.b[0]) * rows), 12345.0f);
    const std::string what =
        "concat_rows a=" + std::to_string(cs.a[0]) + " b=" + std::to_string(cs.b[0]) + " rows=" + std::to_string(rows);
    const Status st = run_concat(c, a, cs.a, b, cs.b, y, cs.y);
    ASSERT_TRUE(st) << what << ": " << st.to_string();
    const auto want = ref::concat_rows(a.data(), cs.a[0], b.data(), cs.b[0], rows);
    ASSERT_EQ(want.size(), y.size());
    for (std::size_t i = 0; i < y.size(); ++i) {
      std::uint32_t got_bits, want_bits;
      std::memcpy(&got_bits, &y[i], sizeof(float));
      std::memcpy(&want_bits, &want[i], sizeof(float));
      ASSERT_EQ(got_bits, want_bits) << what << ": element " << i << " (row " << i / (cs.a[0] + cs.b[0]) << ", column "
                                     << i % (cs.a[0] + cs.b[0]) << ")";
    }
  }
}

TEST_P(ComputeConformance, ConcatRowsRefusesBadCallsNamingTheTensor) {
  COMPUTE_FIXTURE(c);
  if (!c.supports(Op::concat_rows, DType::f32)) GTEST_SKIP() << "this backend does not offer the optional concat_rows";
  std::vector<float> big(1 << 12, 0.5f);
  auto expect_error = [&](const std::string& what, const char* tensor, Status s) {
    EXPECT_FALSE(s.is_ok()) << what << " was accepted";
    if (s.is_ok()) return;
    for (const char* n : {"concat_rows", tensor}) {
      EXPECT_NE(s.message().find(n), std::string::npos)
          << what << ": the error does not name " << n << ": " << s.to_string();
    }
  };
  auto call = [&](std::vector<Arg> in, Ne y) {
    return run_op(c, Op::concat_rows, std::move(in), {arg(DType::f32, y, big)});
  };
  const Arg a = arg(DType::f32, {3, 4, 3, 1}, big), b = arg(DType::f32, {5, 12, 1, 1}, big);
  ASSERT_TRUE(call({a, b}, {8, 12, 1, 1})) << "the good call the others are made from";
  expect_error("B with 11 rows for A's 12", "B", call({a, arg(DType::f32, {5, 11, 1, 1}, big)}, {8, 12, 1, 1}));
  expect_error("B with 13 rows for A's 12", "B", call({a, arg(DType::f32, {5, 13, 1, 1}, big)}, {8, 11, 1, 1}));
  expect_error("Y of width a + b + 1", "Y", call({a, b}, {9, 12, 1, 1}));
  expect_error("Y of width a", "Y", call({a, b}, {3, 12, 1, 1}));
  expect_error("Y with 6 rows", "Y", call({a, b}, {8, 6, 1, 1}));
  expect_error("an f16 A", "A", call({arg(DType::f16, {4, 12, 1, 1}, big), b}, {9, 12, 1, 1}));
  expect_error("an i32 B", "B", call({a, arg(DType::i32, {5, 12, 1, 1}, big)}, {8, 12, 1, 1}));
  expect_error("one input", "concat_rows", call({a}, {3, 12, 1, 1}));
}

// matmul_heads against the same backend's matmul: head h's matrix times each token's gathered row gives the same
// bits, for one token and a batch, one head and DeepSeek's 16 of a test model, exact activations or not. The values
// of X past K are NaN: read, they would spread. And within matmul's tolerance of the reference. K = 256 (q4_k's
// block) and 96 (not a whole 256: DeepSeek's 128 is one such); rows Kx apart where Kx is odd, so a head's rows lie at
// every alignment.
TEST_P(ComputeConformance, MatmulHeadsHasTheBitsOfMatmulPerHead) {
  COMPUTE_FIXTURE(c);
  const std::int64_t n = 40;
  int tested = 0;
  for (DType type : kHeadsTypes) {
    if (!c.supports(Op::matmul_heads, type)) continue;
    ++tested;
    struct Case {
      std::int64_t k, heads, t, kx;
    };
    const Case cases[] = {{256, 1, 1, 256}, {256, 1, 5, 288}, {256, 16, 1, 288}, {256, 16, 5, 320},
                          {256, 4, 3, 257}, {96, 16, 1, 96},  {96, 16, 5, 99},   {96, 3, 2, 97}};
    for (const Case& cs : cases) {
      const std::int64_t k = cs.k;
      if (k % dtype_traits(type)->block_elems != 0) continue;  // q4_k takes K = 256 only
      auto w = make_head_weights(type, k, n, cs.heads, 311);
      const auto x = heads_input(k, cs.kx, cs.heads, cs.t, static_cast<unsigned>(313 + cs.t + cs.heads));
      const auto want = ref::matmul_heads(type, w.bytes.data(), k, n, cs.heads, x.data(), cs.kx, cs.t);
      for (bool exact : {false, true}) {
        const std::string what = "matmul_heads " + label(type) + " H=" + std::to_string(cs.heads) +
                                 " T=" + std::to_string(cs.t) + " Kx=" + std::to_string(cs.kx) +
                                 (exact ? " exact" : "");
        std::vector<float> y;
        const Status st = run_heads(c, type, w, k, n, cs.heads, x.data(), cs.kx, cs.t, y, exact);
        ASSERT_TRUE(st) << what << ": " << st.to_string();
        const auto bad = std::find_if(y.begin(), y.end(), [](float v) { return !std::isfinite(v); });
        ASSERT_EQ(bad, y.end()) << what << ": Y[" << (bad - y.begin()) << "] = " << *bad
                                << " (the NaN past K was read, or an output was not written)";
        for (std::int64_t h = 0; h < cs.heads; ++h) {
          const std::string who = what + " head " + std::to_string(h);
          auto xh = head_rows(x, cs.kx, cs.heads, cs.t, h, k);
          const auto yh = head_rows(y, n, cs.heads, cs.t, h, n);
          const auto want_h = head_rows(want, n, cs.heads, cs.t, h, n);
          check_matmul(type, w.head[static_cast<std::size_t>(h)], xh, cs.t, nullptr, yh, exact, who, &want_h);
          OpParams p;
          p.flags = exact ? kExactActivations : 0;
          std::vector<float> mm(yh.size(), std::nanf(""));
          ASSERT_TRUE(run_op(c, Op::matmul,
                             {arg(type, {k, n, 1, 1}, w.head[static_cast<std::size_t>(h)].bytes.data()),
                              arg(DType::f32, {k, cs.t, 1, 1}, xh)},
                             {arg(DType::f32, {n, cs.t, 1, 1}, mm)}, p))
              << who;
          EXPECT_EQ(0, std::memcmp(mm.data(), yh.data(), mm.size() * sizeof(float)))
              << who << ": differs from matmul on the head's matrix and gathered rows";
        }
      }
    }
  }
  if (tested == 0) {
    const std::int64_t k = 256;
    auto w = make_head_weights(DType::f32, k, n, 2, 311);
    const auto x = heads_input(k, k, 2, 1, 312);
    std::vector<float> y;
    EXPECT_FALSE(run_heads(c, DType::f32, w, k, n, 2, x.data(), k, 1, y, false))
        << "a backend whose supports() says no ran matmul_heads";
    GTEST_SKIP() << "this backend does not offer the optional matmul_heads";
  }
}

// THE ONE PROMISE: a token's heads have the same bits alone, in a batch of 5 and in a batch of 3.
TEST_P(ComputeConformance, MatmulHeadsTokenResultDoesNotDependOnTheBatch) {
  COMPUTE_FIXTURE(c);
  const std::int64_t k = 256, n = 48, heads = 16, t = 5, kx = k + 32;
  int tested = 0;
  for (DType type : kHeadsTypes) {
    if (!c.supports(Op::matmul_heads, type)) continue;
    ++tested;
    auto w = make_head_weights(type, k, n, heads, 321);
    const auto x = heads_input(k, kx, heads, t, 322);
    for (bool exact : {false, true}) {
      const std::string what = "matmul_heads " + label(type) + (exact ? " exact" : "");
      std::vector<float> batch, one, mid;
      ASSERT_TRUE(run_heads(c, type, w, k, n, heads, x.data(), kx, t, batch, exact)) << what;
      const auto row = static_cast<std::size_t>(n * heads);
      for (std::int64_t i = 0; i < t; ++i) {
        ASSERT_TRUE(run_heads(c, type, w, k, n, heads, x.data() + i * kx * heads, kx, 1, one, exact)) << what;
        EXPECT_EQ(0, std::memcmp(one.data(), batch.data() + static_cast<std::size_t>(i) * row, row * sizeof(float)))
            << what << ": token " << i << " differs alone and in a batch of 5";
      }
      ASSERT_TRUE(run_heads(c, type, w, k, n, heads, x.data() + kx * heads, kx, 3, mid, exact)) << what;
      EXPECT_EQ(0, std::memcmp(mid.data(), batch.data() + row, 3 * row * sizeof(float)))
          << what << ": tokens 1..3 differ in a batch of 3 and of 5";
    }
  }
  if (tested == 0) GTEST_SKIP() << "this backend does not offer the optional matmul_heads";
}

TEST_P(ComputeConformance, MatmulHeadsRefusesBadCallsNamingTheTensor) {
  COMPUTE_FIXTURE(c);
  if (!c.supports(Op::matmul_heads, DType::f32))
    GTEST_SKIP() << "this backend does not offer the optional matmul_heads";
  std::vector<float> big(1 << 16, 0.5f);
  auto expect_error = [&](const std::string& what, const char* tensor, Status s) {
    EXPECT_FALSE(s.is_ok()) << what << " was accepted";
    if (s.is_ok()) return;
    for (const char* nm : {"matmul_heads", tensor}) {
      EXPECT_NE(s.message().find(nm), std::string::npos)
          << what << ": the error does not name " << nm << ": " << s.to_string();
    }
  };
  const std::int64_t k = 64, n = 8, h = 4, t = 3;
  auto call = [&](Arg w, Arg x, Ne y) { return run_op(c, Op::matmul_heads, {w, x}, {arg(DType::f32, y, big)}); };
  const Arg w = arg(DType::f32, {k, n, h, 1}, big), x = arg(DType::f32, {k + 8, h, t, 1}, big);
  ASSERT_TRUE(call(w, x, {n, h, t, 1})) << "the good call the others are made from";
  expect_error("X with Kx < K", "X", call(w, arg(DType::f32, {k - 32, h, t, 1}, big), {n, h, t, 1}));
  expect_error("X with 3 heads for W's 4", "X", call(w, arg(DType::f32, {k, h - 1, t, 1}, big), {n, h, t, 1}));
  expect_error("X of f16", "X", call(w, arg(DType::f16, {k, h, t, 1}, big), {n, h, t, 1}));
  expect_error("X with ne[3] = 2", "X", call(w, arg(DType::f32, {k, h, t, 2}, big), {n, h, t, 1}));
  expect_error("Y with N + 1 rows", "Y", call(w, x, {n + 1, h, t, 1}));
  expect_error("Y with 5 heads", "Y", call(w, x, {n, h + 1, t, 1}));
  expect_error("Y with T - 1 tokens", "Y", call(w, x, {n, h, t - 1, 1}));
  expect_error("Y flattened to {N * H, T}", "Y", call(w, x, {n * h, t, 1, 1}));
  expect_error("W with ne[3] = 2", "W", call(arg(DType::f32, {k, n, h, 2}, big), x, {n, h, t, 1}));
  expect_error("one input", "matmul_heads", run_op(c, Op::matmul_heads, {w}, {arg(DType::f32, {n, h, t, 1}, big)}));
  // Weight types this backend's supports() does not claim (q4_1 is no weight type at all) must be refused too.
  for (DType type : {DType::q4_1, DType::i32, DType::f16, DType::q8_0, DType::q4_k, DType::mxfp4}) {
    if (c.supports(Op::matmul_heads, type)) continue;
    const std::int64_t kq = 256;
    EXPECT_FALSE(run_op(c, Op::matmul_heads, {arg(type, {kq, n, h, 1}, big), arg(DType::f32, {kq, h, 1, 1}, big)},
                        {arg(DType::f32, {n, h, 1, 1}, big)}))
        << "matmul_heads ran " << label(type) << " weights, which supports() does not claim";
  }
}

namespace {

// DeepSeek's latent attention: head_dim 576 (kv_lora_rank 512 + rope 64), 16 query heads on one KV head, and one
// cache tensor passed as both keys and values (run_op's share_inputs: the same buffer twice).
constexpr std::int64_t kMlaDim = 576, kMlaHeads = 16, kMlaCache = 160;
constexpr float kMlaScale = 0.0721688f;  // 1 / sqrt(192), DeepSeek's q/k head width

Status run_mla(Compute& c, Op op, DType kv, std::vector<std::byte>& cache, const float* q, std::int64_t t,
               std::int32_t position, std::vector<float>& sinks, std::vector<float>& o) {
  OpParams p;
  p.position = position;
  p.scale = kMlaScale;
  const Arg kc = arg(kv, {kMlaDim, 1, kMlaCache, 1}, cache.data());
  std::vector<Arg> in{arg(DType::f32, {kMlaDim, kMlaHeads, t, 1}, const_cast<float*>(q)), kc, kc};
  if (op == Op::attention_sinks) in.push_back(arg(DType::f32, {kMlaHeads, 1, 1, 1}, sinks));
  o.assign(static_cast<std::size_t>(kMlaDim * kMlaHeads * t), std::nanf(""));
  return run_op(c, op, in, {arg(DType::f32, {kMlaDim, kMlaHeads, t, 1}, o)}, p, true);
}

}  // namespace

TEST_P(ComputeConformance, AttentionAtHeadDim576WithOneCacheAsKeysAndValuesMatchesReference) {
  COMPUTE_FIXTURE(c);
  auto sinks = head_sinks(kMlaHeads);
  int tested = 0;
  for (DType kv : kKvTypes) {
    for (Op op : {Op::attention, Op::attention_sinks}) {
      if (!c.supports(op, kv)) continue;
      ++tested;
      auto cache = make_kv(kv, kMlaDim, 1, kMlaCache, 331);  // its k alone is the cache
      for (const auto& [t, position] : {std::pair<std::int64_t, std::int32_t>{1, 159}, {1, 70}, {7, 100}, {7, 1}}) {
        const auto q = randn(static_cast<std::size_t>(kMlaDim * kMlaHeads * t), static_cast<unsigned>(333 + position));
        std::vector<float> o;
        const std::string what = std::string(op_name(op)) + " head_dim 576 kv=" + label(kv) +
                                 " T=" + std::to_string(t) + " position=" + std::to_string(position);
        const Status st = run_mla(c, op, kv, cache.k, q.data(), t, position, sinks, o);
        ASSERT_TRUE(st) << what << ": " << st.to_string();
        const auto want =
            ref::attention(q.data(), kMlaDim, kMlaHeads, t, cache.kd.data(), cache.kd.data(), 1, kMlaCache, position, 0,
                           kMlaScale, op == Op::attention_sinks ? sinks.data() : nullptr);
        Mismatches mm(what);
        for (std::size_t i = 0; i < o.size(); ++i) mm.check(i, o[i], want[i], 2e-5 + 1e-5 * std::fabs(want[i]));
      }
    }
  }
  if (tested == 0) GTEST_SKIP() << "this backend offers no attention";
}

TEST_P(ComputeConformance, AttentionAtHeadDim576QueryResultDoesNotDependOnTheBatch) {
  COMPUTE_FIXTURE(c);
  const std::int64_t t = 7;
  const std::int32_t pos0 = 120;
  auto sinks = head_sinks(kMlaHeads);
  int tested = 0;
  for (DType kv : kKvTypes) {
    for (Op op : {Op::attention, Op::attention_sinks}) {
      if (!c.supports(op, kv)) continue;
      ++tested;
      auto cache = make_kv(kv, kMlaDim, 1, kMlaCache, 341);
      const auto q = randn(static_cast<std::size_t>(kMlaDim * kMlaHeads * t), 343);
      std::vector<float> batch, one;
      ASSERT_TRUE(run_mla(c, op, kv, cache.k, q.data(), t, pos0, sinks, batch));
      const auto row = static_cast<std::size_t>(kMlaDim * kMlaHeads);
      for (std::int64_t i = 0; i < t; ++i) {
        ASSERT_TRUE(run_mla(c, op, kv, cache.k, q.data() + static_cast<std::size_t>(i) * row, 1,
                            pos0 + static_cast<std::int32_t>(i), sinks, one));
        EXPECT_EQ(0, std::memcmp(one.data(), batch.data() + static_cast<std::size_t>(i) * row, row * sizeof(float)))
            << op_name(op) << " head_dim 576 kv=" << label(kv) << ": query " << i
            << " differs alone and in a batch of 7";
      }
    }
  }
  if (tested == 0) GTEST_SKIP() << "this backend offers no attention";
}

// ------------------------------------------------------------------ errors

TEST_P(ComputeConformance, BadCallsAreErrorsNotCrashes) {
  COMPUTE_FIXTURE(c);
  std::vector<float> big(1 << 16, 0.5f);
  std::vector<std::int32_t> ids{0, 1, 99};
  auto expect_error = [&](const std::string& what, Status s) {
    EXPECT_FALSE(s.is_ok()) << what << " was accepted";
    if (!s.is_ok()) {
      EXPECT_FALSE(s.message().empty()) << what;
    }
  };
  const auto w = make_weights(DType::f32, 512, 8, 121);
  auto wb = const_cast<std::byte*>(w.bytes.data());
  expect_error("matmul with K mismatch",
               run_op(c, Op::matmul, {arg(DType::f32, {512, 8, 1, 1}, wb), arg(DType::f32, {256, 1, 1, 1}, big)},
                      {arg(DType::f32, {8, 1, 1, 1}, big)}));
  expect_error("matmul with a wrong output shape",
               run_op(c, Op::matmul, {arg(DType::f32, {512, 8, 1, 1}, wb), arg(DType::f32, {512, 2, 1, 1}, big)},
                      {arg(DType::f32, {8, 1, 1, 1}, big)}));
  expect_error("matmul with a bias of the wrong length",
               run_op(c, Op::matmul,
                      {arg(DType::f32, {512, 8, 1, 1}, wb), arg(DType::f32, {512, 1, 1, 1}, big),
                       arg(DType::f32, {7, 1, 1, 1}, big)},
                      {arg(DType::f32, {8, 1, 1, 1}, big)}));
  expect_error("matmul with one input",
               run_op(c, Op::matmul, {arg(DType::f32, {512, 8, 1, 1}, wb)}, {arg(DType::f32, {8, 1, 1, 1}, big)}));
  expect_error("matmul with f32 activations declared as f16",
               run_op(c, Op::matmul, {arg(DType::f32, {512, 8, 1, 1}, wb), arg(DType::f16, {512, 1, 1, 1}, big)},
                      {arg(DType::f32, {8, 1, 1, 1}, big)}));
  // mxfp4 passes sdk::check_op_call (an optional type): a backend whose supports() says no must still refuse it.
  for (DType unsupported : {DType::q4_1, DType::i32, DType::q8_k, DType::mxfp4}) {
    if (c.supports(Op::matmul, unsupported)) continue;
    expect_error("matmul with unsupported weights " + label(unsupported),
                 run_op(c, Op::matmul, {arg(unsupported, {256, 2, 1, 1}, big), arg(DType::f32, {256, 1, 1, 1}, big)},
                        {arg(DType::f32, {2, 1, 1, 1}, big)}));
  }
  {
    Tensor wt{DType::q4_k, {100, 4, 1, 1}, big.data()};  // 100 is not a whole number of 256-blocks
    Tensor xt{DType::f32, {100, 1, 1, 1}, big.data()};
    Tensor yt{DType::f32, {4, 1, 1, 1}, big.data()};
    Tensor in[] = {wt, xt};
    expect_error("matmul q4_k with K = 100", c.run(OpCall{Op::matmul, in, std::span<Tensor>(&yt, 1), {}}));
    Tensor nul{DType::f32, {4, 1, 1, 1}, nullptr};
    Tensor in2[] = {Tensor{DType::f32, {4, 4, 1, 1}, big.data()}, Tensor{DType::f32, {4, 1, 1, 1}, big.data()}};
    expect_error("matmul into a tensor without data", c.run(OpCall{Op::matmul, in2, std::span<Tensor>(&nul, 1), {}}));
    expect_error("an unknown op", c.run(OpCall{Op::count_, in2, std::span<Tensor>(&yt, 1), {}}));
    Tensor q4{DType::q4_k, {256, 1, 1, 1}, big.data()};
    Tensor x256{DType::f32, {256, 1, 1, 1}, big.data()};
    expect_error("store_rows into q4_k rows",
                 c.run(OpCall{Op::store_rows, std::span<const Tensor>(&x256, 1), std::span<Tensor>(&q4, 1), {}}));
    Tensor q8{DType::q8_0, {48, 1, 1, 1}, big.data()};
    Tensor x48{DType::f32, {48, 1, 1, 1}, big.data()};
    expect_error("store_rows of 48 elements into q8_0 rows",
                 c.run(OpCall{Op::store_rows, std::span<const Tensor>(&x48, 1), std::span<Tensor>(&q8, 1), {}}));
  }
  {
    OpParams p;
    p.position = 10;
    p.scale = 0.1f;
    expect_error("attention past the end of the KV cache",
                 run_op(c, Op::attention,
                        {arg(DType::f32, {64, 2, 3, 1}, big), arg(DType::f32, {64, 1, 12, 1}, big),
                         arg(DType::f32, {64, 1, 12, 1}, big)},
                        {arg(DType::f32, {64, 2, 3, 1}, big)}, p));
    OpParams negative;
    negative.eps = -1e-3f;
    expect_error("rms_norm with a negative eps",
                 run_op(c, Op::rms_norm, {arg(DType::f32, {64, 2, 1, 1}, big), arg(DType::f32, {64, 1, 1, 1}, big)},
                        {arg(DType::f32, {64, 2, 1, 1}, big)}, negative));
    expect_error("attention with heads not a multiple of kv heads",
                 run_op(c, Op::attention,
                        {arg(DType::f32, {64, 3, 1, 1}, big), arg(DType::f32, {64, 2, 12, 1}, big),
                         arg(DType::f32, {64, 2, 12, 1}, big)},
                        {arg(DType::f32, {64, 3, 1, 1}, big)}, OpParams{}));
  }
  {
    const auto table = make_weights(DType::f32, 16, 10, 122);
    expect_error("embedding with an id outside the vocabulary",
                 run_op(c, Op::embedding,
                        {arg(DType::f32, {16, 10, 1, 1}, const_cast<std::byte*>(table.bytes.data())),
                         arg(DType::i32, {3, 1, 1, 1}, ids)},
                        {arg(DType::f32, {16, 3, 1, 1}, big)}));
  }
  {
    OpParams p;
    p.top_k = 9;
    std::vector<std::int32_t> out_ids(9);
    expect_error("topk with k > experts",
                 run_op(c, Op::topk_routing, {arg(DType::f32, {8, 1, 1, 1}, big)},
                        {arg(DType::i32, {9, 1, 1, 1}, out_ids), arg(DType::f32, {9, 1, 1, 1}, big)}, p));
  }
  expect_error("add of different shapes",
               run_op(c, Op::add, {arg(DType::f32, {10, 2, 1, 1}, big), arg(DType::f32, {10, 3, 1, 1}, big)},
                      {arg(DType::f32, {10, 2, 1, 1}, big)}));
  {
    OpParams p;
    p.rope_dims = 65;
    std::vector<std::int32_t> pos{0};
    expect_error("rope with odd rope_dims",
                 run_op(c, Op::rope,
                        {arg(DType::f32, {64, 1, 1, 1}, big), arg(DType::i32, {1, 1, 1, 1}, pos),
                         arg(DType::f32, {32, 1, 1, 1}, big)},
                        {arg(DType::f32, {64, 1, 1, 1}, big)}, p));
  }
}

}  // namespace colibri::sdk::testing
