// GEMV bandwidth of the CUDA matmul kernels per weight format, against the device memory bandwidth
// measured in the same run by a device-to-device cudaMemcpy (read + write bytes). Timed with CUDA
// events over repeated launches, so launch gaps, not host overhead, are what remains.
//
//   colibri_bench_cuda_gemv [--k 4096] [--n 65536] [--reps 20] [--heads 1]
//
// Weights are large enough (>= 150 MB for q4_k) that L2 cannot hold them between launches. Prints a
// markdown table: per format the bytes read per call, the median time for T = 1 and T = 8 (the whole op: X's 8-bit
// quantization and the matmul), GB/s of weights at T = 1 and its share of the measured bandwidth. A second table
// times the decode matmul kernel alone in each tile variant (launch_matmul_q8_variant), after checking that every
// variant gives the default's bits (exit status 1 if one does not). "q4_k pairs" and "q5_k pairs" are those formats in
// the candidate layout of 64 weights a lane (launch_matmul_q8_pairs): checked within rounding of the default and
// bit-identical across token tiles, timed as an op in the first table and in their own decode variants in the second.
// A third table times matmul_heads at DeepSeek-V3's decode shapes (128 heads; k_b: K = 128 of each 192-value query
// head into the 512 latent; v_b: the 512 latent into 128 values) as one launch (launch_matmul_heads) against a
// launch_matmul per head, after checking that the two give the same bits (exit status 1 if not); --heads 0 skips it.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "colibri/quant/quant.hpp"
#include "colibri/sdk/dtype.hpp"
#include "cuda_kernels.hpp"

namespace {

using colibri::sdk::DType;

#define CHECK(expr)                                                                                       \
  do {                                                                                                    \
    if (cudaError_t e_ = (expr); e_ != cudaSuccess) {                                                     \
      std::fprintf(stderr, "%s failed: %s (%s:%d)\n", #expr, cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(1);                                                                                       \
    }                                                                                                     \
  } while (0)

// Median milliseconds of `reps` runs of fn, each bracketed by events.
template <typename F>
float median_ms(int reps, F fn) {
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  fn();  // warm-up
  CHECK(cudaDeviceSynchronize());
  std::vector<float> ms;
  for (int i = 0; i < reps; ++i) {
    CHECK(cudaEventRecord(a));
    fn();
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    float m = 0;
    CHECK(cudaEventElapsedTime(&m, a, b));
    ms.push_back(m);
  }
  CHECK(cudaEventDestroy(a));
  CHECK(cudaEventDestroy(b));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// A candidate pairs layout (launch_matmul_q8_pairs, run by `pairs(x, t)` into dy): its T = 1 output (kept in `want`)
// within rounding of launch_matmul's, and each token of a T = 8 call the bits of that token alone (the batch promise).
// Says what differs on stderr.
template <typename Pairs>
bool pairs_layout_agrees(Pairs pairs, DType type, const void* dw, std::size_t rb, const float* dx, float* dy,
                         std::int64_t k, std::int64_t n, const colibri::cuda::Q8Scratch& q8, std::vector<float>& want) {
  const auto wt = static_cast<std::uint32_t>(type);
  const std::string name = std::string(colibri::sdk::to_string(type)) + " pairs";
  const auto un = static_cast<std::size_t>(n);
  std::vector<float> base(un), got(un * 8);
  CHECK(colibri::cuda::launch_matmul(nullptr, wt, dw, rb, dx, dy, nullptr, k, n, 1, &q8));
  CHECK(cudaMemcpy(base.data(), dy, un * sizeof(float), cudaMemcpyDeviceToHost));
  want.assign(un, 0.0f);
  CHECK(cudaMemset(dy, 0xFF, un * sizeof(float)));
  CHECK(pairs(dx, 1));
  CHECK(cudaMemcpy(want.data(), dy, un * sizeof(float), cudaMemcpyDeviceToHost));
  float scale = 0.0f;
  for (const float v : base) scale = std::max(scale, std::fabs(v));
  for (std::size_t r = 0; r < un; ++r) {
    // Another order of the same float terms: far below 1e-4 of the largest output; a layout slip is not.
    if (!(std::fabs(want[r] - base[r]) <= 1e-4f * scale)) {
      std::fprintf(stderr, "%s: row %zu is %g, the default layout gives %g\n", name.c_str(), r,
                   static_cast<double>(want[r]), static_cast<double>(base[r]));
      return false;
    }
  }
  // Token 0 of X is the T = 1 call's token; the other seven are other activations.
  CHECK(cudaMemset(dy, 0xFF, un * 8 * sizeof(float)));
  CHECK(pairs(dx, 8));
  CHECK(cudaMemcpy(got.data(), dy, un * 8 * sizeof(float), cudaMemcpyDeviceToHost));
  if (std::memcmp(got.data(), want.data(), un * sizeof(float)) != 0) {
    std::fprintf(stderr, "%s: token 0 of an 8-token call differs from the 1-token call\n", name.c_str());
    return false;
  }
  std::vector<float> one(un);
  for (int i = 1; i < 8; ++i) {  // each other token alone: as token 0 of X shifted by i tokens
    CHECK(cudaMemset(dy, 0xFF, un * sizeof(float)));
    CHECK(pairs(dx + static_cast<std::size_t>(i) * k, 1));
    CHECK(cudaMemcpy(one.data(), dy, un * sizeof(float), cudaMemcpyDeviceToHost));
    if (std::memcmp(got.data() + static_cast<std::size_t>(i) * un, one.data(), un * sizeof(float)) != 0) {
      std::fprintf(stderr, "%s: token %d of an 8-token call differs from that token alone\n", name.c_str(), i);
      return false;
    }
  }
  return true;
}

// The matmul_heads table (see the top). False when the one launch and the launches per head differ.
bool time_matmul_heads(int reps) {
  struct Shape {
    const char* name;
    std::int64_t k, n, kx;
  };
  const std::int64_t heads = 128;
  const Shape shapes[] = {{"k_b", 128, 512, 192}, {"v_b", 512, 128, 512}};
  std::printf("\nmatmul_heads at DeepSeek-V3's decode shapes (H = %lld, T = 1): one launch against one per head\n\n",
              static_cast<long long>(heads));
  std::printf(
      "| weights | format | one launch us | per head us | per head / one |\n| --- | --- | ---: | ---: | ---: |\n");
  bool same = true;
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 0.05f);
  for (const Shape& sh : shapes) {
    std::vector<float> x(static_cast<std::size_t>(sh.kx * heads));
    for (auto& v : x) v = dist(rng);
    std::vector<float> wf(static_cast<std::size_t>(sh.k * sh.n * heads));
    for (auto& v : wf) v = dist(rng);
    const auto ny = static_cast<std::size_t>(sh.n * heads);
    void *dx = nullptr, *dy = nullptr, *dq8 = nullptr;
    CHECK(cudaMalloc(&dx, x.size() * sizeof(float)));
    CHECK(cudaMalloc(&dy, ny * sizeof(float)));
    CHECK(cudaMalloc(&dq8, colibri::cuda::q8_scratch_bytes(sh.k, heads)));
    CHECK(cudaMemcpy(dx, x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice));
    const colibri::cuda::Q8Scratch q8 = colibri::cuda::q8_scratch_at(dq8, sh.k, heads);
    for (DType type : {DType::q8_0, DType::q4_0, DType::q4_k, DType::f16}) {
      if (sh.k % colibri::sdk::dtype_traits(type)->block_elems != 0) continue;
      const std::size_t rb = colibri::sdk::row_bytes(type, sh.k);
      std::vector<std::byte> q(rb * static_cast<std::size_t>(sh.n * heads));
      if (!colibri::quant::quantize_row(type, wf.data(), q.data(), sh.k * sh.n * heads)) return false;
      void* dw = nullptr;
      CHECK(cudaMalloc(&dw, q.size()));
      CHECK(cudaMemcpy(dw, q.data(), q.size(), cudaMemcpyHostToDevice));
      const auto wt = static_cast<std::uint32_t>(type);
      const auto* xs = static_cast<const float*>(dx);
      auto* ys = static_cast<float*>(dy);
      const auto one = [&] {
        CHECK(colibri::cuda::launch_matmul_heads(nullptr, wt, dw, rb, xs, ys, sh.k, sh.n, heads, sh.kx, 1, &q8));
      };
      const auto per_head = [&] {
        for (std::int64_t h = 0; h < heads; ++h) {
          CHECK(colibri::cuda::launch_matmul(nullptr, wt, static_cast<const std::byte*>(dw) + h * sh.n * rb, rb,
                                             xs + h * sh.kx, ys + h * sh.n, nullptr, sh.k, sh.n, 1, &q8));
        }
      };
      std::vector<float> a(ny), b(ny);
      CHECK(cudaMemset(dy, 0xFF, ny * sizeof(float)));
      one();
      CHECK(cudaMemcpy(a.data(), dy, ny * sizeof(float), cudaMemcpyDeviceToHost));
      CHECK(cudaMemset(dy, 0xFF, ny * sizeof(float)));
      per_head();
      CHECK(cudaMemcpy(b.data(), dy, ny * sizeof(float), cudaMemcpyDeviceToHost));
      const std::string fmt(colibri::sdk::to_string(type));
      if (std::memcmp(a.data(), b.data(), ny * sizeof(float)) != 0) {
        std::fprintf(stderr, "matmul_heads %s %s: one launch differs from a launch_matmul per head\n", sh.name,
                     fmt.c_str());
        same = false;
      }
      const float t_one = median_ms(reps, one), t_per = median_ms(reps, per_head);
      std::printf("| %s {%lld, %lld} x %lld | %s | %.1f | %.1f | %.1fx |\n", sh.name, static_cast<long long>(sh.k),
                  static_cast<long long>(sh.n), static_cast<long long>(heads), fmt.c_str(), t_one * 1e3, t_per * 1e3,
                  static_cast<double>(t_per / t_one));
      CHECK(cudaFree(dw));
    }
    CHECK(cudaFree(dx));
    CHECK(cudaFree(dy));
    CHECK(cudaFree(dq8));
  }
  return same;
}

}  // namespace

int main(int argc, char** argv) {
  std::int64_t k = 4096, n = 65536;
  int reps = 20;
  bool heads = true;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--k") {
      k = std::atoll(argv[i + 1]);
    } else if (a == "--n") {
      n = std::atoll(argv[i + 1]);
    } else if (a == "--reps") {
      reps = std::atoi(argv[i + 1]);
    } else if (a == "--heads") {
      heads = std::string(argv[i + 1]) != "0";
    } else {
      std::fprintf(stderr, "unknown option %s (use --k, --n, --reps, --heads)\n", a.c_str());
      return 2;
    }
  }
  if (k <= 0 || k % 32 != 0 || n < 64 || reps < 1) {
    std::fprintf(stderr, "--k must be a positive multiple of 32, --n at least 64, --reps at least 1\n");
    return 2;
  }
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 0));

  // Measured bandwidth: a 1 GiB device-to-device copy reads and writes every byte.
  const std::size_t probe = std::size_t{1} << 30;
  void *pa = nullptr, *pb = nullptr;
  CHECK(cudaMalloc(&pa, probe));
  CHECK(cudaMalloc(&pb, probe));
  CHECK(cudaMemset(pa, 1, probe));
  const float copy_ms = median_ms(reps, [&] { CHECK(cudaMemcpyAsync(pb, pa, probe, cudaMemcpyDeviceToDevice)); });
  const double device_gbs = 2.0 * static_cast<double>(probe) / (copy_ms * 1e-3) / 1e9;
  CHECK(cudaFree(pa));
  CHECK(cudaFree(pb));
  std::printf("device: %s (sm_%d%d), measured D2D bandwidth %.0f GB/s (read + write of 1 GiB)\n", prop.name, prop.major,
              prop.minor, device_gbs);
  std::printf("matrix: K = %lld, N = %lld, median of %d launches\n\n", static_cast<long long>(k),
              static_cast<long long>(n), reps);
  std::printf("| format | MB read | T=1 us | T=8 us | GB/s (T=1) | of measured |\n");
  std::printf("| --- | ---: | ---: | ---: | ---: | ---: |\n");

  // 64 quantized rows repeated: realistic block contents at any N without quantizing N rows.
  const std::int64_t tile_rows = 64;
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 0.05f);
  std::vector<float> tile(static_cast<std::size_t>(k * tile_rows));
  for (auto& v : tile) v = dist(rng);
  std::vector<float> x(static_cast<std::size_t>(k * 8));
  for (auto& v : x) v = dist(rng);
  void *xbuf = nullptr, *ybuf = nullptr;
  CHECK(cudaMalloc(&xbuf, x.size() * sizeof(float)));
  CHECK(cudaMalloc(&ybuf, static_cast<std::size_t>(n) * 8 * sizeof(float)));
  const auto* dx = static_cast<const float*>(xbuf);
  auto* dy = static_cast<float*>(ybuf);
  CHECK(cudaMemcpy(xbuf, x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice));
  // 8-bit activations, as the engine's matmuls may use them (the default; kExactActivations keeps X in f32).
  void* q8buf = nullptr;
  CHECK(cudaMalloc(&q8buf, colibri::cuda::q8_scratch_bytes(k, 8)));
  const colibri::cuda::Q8Scratch q8 = colibri::cuda::q8_scratch_at(q8buf, k, 8);

  std::vector<std::string> variant_rows;
  bool variant_mismatch = false, pairs_mismatch = false;
  for (DType type : {DType::q4_k, DType::q5_k, DType::q6_k, DType::q8_0, DType::q4_0, DType::mxfp4, DType::q2_k,
                     DType::q3_k, DType::f16, DType::bf16, DType::f32}) {
    // Rows that are not whole blocks of the format (the k-quants' 256 where K = 2880, gpt-oss's) do not exist.
    if (k % colibri::sdk::dtype_traits(type)->block_elems != 0) continue;
    const std::size_t rb = colibri::sdk::row_bytes(type, k);
    std::vector<std::byte> q(rb * static_cast<std::size_t>(tile_rows));
    if (!colibri::quant::quantize_row(type, tile.data(), q.data(), k * tile_rows)) {
      std::fprintf(stderr, "quantizing %s failed\n", std::string(colibri::sdk::to_string(type)).c_str());
      return 1;
    }
    const std::size_t bytes = rb * static_cast<std::size_t>(n);
    void* dw = nullptr;
    CHECK(cudaMalloc(&dw, bytes));
    for (std::int64_t r = 0; r < n; r += tile_rows) {
      const std::int64_t m = std::min(tile_rows, n - r);
      CHECK(cudaMemcpy(static_cast<std::byte*>(dw) + static_cast<std::size_t>(r) * rb, q.data(),
                       rb * static_cast<std::size_t>(m), cudaMemcpyHostToDevice));
    }
    const auto wt = static_cast<std::uint32_t>(type);
    // The default (X may be quantized, where the format's kernel does), then, where that differs, exact f32 X.
    for (const colibri::cuda::Q8Scratch* acts : {&q8, static_cast<const colibri::cuda::Q8Scratch*>(nullptr)}) {
      if (acts == nullptr && !colibri::sdk::dtype_traits(type)->quantized) continue;
      const float t1 = median_ms(
          reps, [&] { CHECK(colibri::cuda::launch_matmul(nullptr, wt, dw, rb, dx, dy, nullptr, k, n, 1, acts)); });
      const float t8 = median_ms(
          reps, [&] { CHECK(colibri::cuda::launch_matmul(nullptr, wt, dw, rb, dx, dy, nullptr, k, n, 8, acts)); });
      const double gbs = static_cast<double>(bytes) / (t1 * 1e-3) / 1e9;
      std::printf("| %s%s | %.1f | %.1f | %.1f | %.0f | %.0f%% |\n", std::string(colibri::sdk::to_string(type)).c_str(),
                  acts == nullptr ? " exact" : "", static_cast<double>(bytes) / 1e6, t1 * 1e3, t8 * 1e3, gbs,
                  100.0 * gbs / device_gbs);
    }
    std::vector<float> pairs_want;  // the candidate pairs layout at T = 1, checked against the default and itself
    if ((type == DType::q4_k || type == DType::q5_k) && k % 256 == 0) {
      const auto pairs = [&](const float* x, std::int64_t t) {
        return colibri::cuda::launch_matmul_q8_pairs(nullptr, wt, dw, rb, x, dy, k, n, t, q8);
      };
      const float t1 = median_ms(reps, [&] { CHECK(pairs(dx, 1)); });
      const float t8 = median_ms(reps, [&] { CHECK(pairs(dx, 8)); });
      const double gbs = static_cast<double>(bytes) / (t1 * 1e-3) / 1e9;
      std::printf("| %s pairs | %.1f | %.1f | %.1f | %.0f | %.0f%% |\n",
                  std::string(colibri::sdk::to_string(type)).c_str(), static_cast<double>(bytes) / 1e6, t1 * 1e3,
                  t8 * 1e3, gbs, 100.0 * gbs / device_gbs);
      if (!pairs_layout_agrees(pairs, type, dw, rb, dx, dy, k, n, q8, pairs_want)) pairs_mismatch = true;
    }
    // The decode variants (rows per warp, units per lane step) on the same weights: each must give the default's
    // bits; their kernel-only times say which tile is best on this device.
    if (colibri::cuda::launch_matmul_q8_variant(nullptr, wt, dw, rb, dx, dy, k, n, q8, 0) == cudaSuccess) {
      CHECK(cudaDeviceSynchronize());
      std::vector<float> want(static_cast<std::size_t>(n)), got(static_cast<std::size_t>(n));
      CHECK(colibri::cuda::launch_matmul(nullptr, wt, dw, rb, dx, dy, nullptr, k, n, 1, &q8));
      CHECK(cudaMemcpy(want.data(), dy, want.size() * sizeof(float), cudaMemcpyDeviceToHost));
      std::string line = "| " + std::string(colibri::sdk::to_string(type)) + " decode |";
      for (int v = 0; v < colibri::cuda::kDecodeVariantCount; ++v) {
        CHECK(cudaMemset(dy, 0xFF, want.size() * sizeof(float)));
        const cudaError_t e = colibri::cuda::launch_matmul_q8_variant(nullptr, wt, dw, rb, dx, dy, k, n, q8, v);
        if (e == cudaErrorNotSupported) {  // the pairs layouts are q4_k's and q5_k's alone
          line += " - |";
          continue;
        }
        CHECK(e);
        CHECK(cudaMemcpy(got.data(), dy, got.size() * sizeof(float), cudaMemcpyDeviceToHost));
        const std::vector<float>& expect = v >= colibri::cuda::kPairsVariant ? pairs_want : want;
        if (expect.size() != got.size() || std::memcmp(got.data(), expect.data(), got.size() * sizeof(float)) != 0) {
          std::fprintf(stderr, "%s: decode variant %s differs from launch_matmul (pairs: launch_matmul_q8_pairs)\n",
                       std::string(colibri::sdk::to_string(type)).c_str(), colibri::cuda::matmul_q8_variant_name(v));
          variant_mismatch = true;
        }
        const float ms = median_ms(reps, [&] {
          CHECK(colibri::cuda::launch_matmul_q8_variant(nullptr, wt, dw, rb, dx, dy, k, n, q8, v, false));
        });
        char cell[64];
        std::snprintf(cell, sizeof cell, " %.1f us %.0f%% |", ms * 1e3,
                      100.0 * static_cast<double>(bytes) / (ms * 1e-3) / 1e9 / device_gbs);
        line += cell;
      }
      variant_rows.push_back(line);
    }
    CHECK(cudaFree(dw));
  }
  if (!variant_rows.empty()) {
    std::printf(
        "\ndecode matmul kernel alone, X quantized beforehand (T = 1; the table above times the op, "
        "quantization included), per variant (rows per warp x units per lane step, min blocks per SM): "
        "time, share of measured:\n\n| format |");
    for (int v = 0; v < colibri::cuda::kDecodeVariantCount; ++v) {
      std::printf(" %s |", colibri::cuda::matmul_q8_variant_name(v));
    }
    std::printf("\n| --- |");
    for (int v = 0; v < colibri::cuda::kDecodeVariantCount; ++v) std::printf(" ---: |");
    std::printf("\n");
    for (const auto& line : variant_rows) std::printf("%s\n", line.c_str());
  }
  CHECK(cudaFree(xbuf));
  CHECK(cudaFree(ybuf));
  CHECK(cudaFree(q8buf));
  const bool heads_same = !heads || time_matmul_heads(reps);
  return variant_mismatch || pairs_mismatch || !heads_same ? 1 : 0;
}
