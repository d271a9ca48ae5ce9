// Public entry points of the block formats: argument checks, then the scalar reference
// (quantizers) or the fastest dequantizer this CPU runs, chosen once at start-up.
#include "colibri/quant/quant.hpp"

#include <cstring>
#include <string>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

#include "colibri/quant/float16.hpp"
#include "colibri/sdk/cpu_features.hpp"
#include "reference.hpp"

namespace colibri::quant {

namespace {

using detail::KernelTable;

// ggml's results assume IEEE defaults: round to nearest, subnormals kept. A caller (or a library
// such as a BLAS) may have set flush-to-zero / denormals-are-zero; switch them off for the call.
class IeeeFloatMode {
 public:
#if defined(__x86_64__) || defined(__i386__)
  IeeeFloatMode() noexcept : saved_(_mm_getcsr()) {
    constexpr unsigned kFtz = 1u << 15, kDaz = 1u << 6, kRounding = 3u << 13;
    const unsigned wanted = saved_ & ~(kFtz | kDaz | kRounding);
    if (wanted != saved_) _mm_setcsr(wanted);
  }
  ~IeeeFloatMode() {
    if (_mm_getcsr() != saved_) _mm_setcsr(saved_);
  }
  IeeeFloatMode(const IeeeFloatMode&) = delete;
  IeeeFloatMode& operator=(const IeeeFloatMode&) = delete;

 private:
  unsigned saved_;
#endif
};

bool cpu_has_avx2() noexcept {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && sdk::cpu_has_f16c();
}

bool cpu_has_avx512() noexcept {
  __builtin_cpu_init();
  return cpu_has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl");
}

const KernelTable* kernels_for(Isa isa) noexcept {
  switch (isa) {
    case Isa::scalar: return &detail::scalar_kernels();
    case Isa::avx2: return cpu_has_avx2() ? &detail::avx2_kernels() : nullptr;
    case Isa::avx512: return cpu_has_avx512() ? &detail::avx512_kernels() : nullptr;
  }
  return nullptr;
}

const KernelTable& best_kernels() noexcept {
  static const KernelTable* const table = kernels_for(best_isa());
  return *table;
}

std::string supported_list() {
  return "f32, f16, bf16, q8_0, q4_0, q2_k, q3_k, q4_k, q5_k, q6_k, mxfp4";
}

sdk::Status unsupported_type(std::string_view what, DType type) {
  return sdk::make_error(sdk::StatusCode::unsupported,
                         std::string(what) + ": type " + std::string(sdk::to_string(type)) + " (id " +
                             std::to_string(static_cast<unsigned>(type)) +
                             ") is not a supported block format; supported: " + supported_list());
}

sdk::Status check_args(std::string_view what, DType type, const void* src, const void* dst, std::int64_t n,
                       bool reading = false) {
  if (!is_supported(type) && !(reading && detail::is_input_only(type))) return unsupported_type(what, type);
  const auto* traits = sdk::dtype_traits(type);
  const std::string name(sdk::to_string(type));
  if (n < 0) {
    return sdk::make_error(sdk::StatusCode::invalid_argument,
                           std::string(what) + "(" + name + "): negative element count " + std::to_string(n));
  }
  if (n % traits->block_elems != 0) {
    return sdk::make_error(sdk::StatusCode::invalid_argument,
                           std::string(what) + "(" + name + "): n = " + std::to_string(n) +
                               " is not a multiple of the block size " + std::to_string(traits->block_elems) +
                               "; use a type whose block size divides the row length (see quant::choose_type)");
  }
  if (n > 0 && (src == nullptr || dst == nullptr)) {
    return sdk::make_error(sdk::StatusCode::invalid_argument,
                           std::string(what) + "(" + name + "): null source or destination buffer");
  }
  return sdk::Status::ok();
}

sdk::Status dequantize_with(const KernelTable& k, DType type, const void* src, float* dst, std::int64_t n) noexcept {
  try {
    if (auto st = check_args("dequantize_row", type, src, dst, n, /*reading=*/true); !st) return st;
  } catch (...) {  // building a message can only fail on allocation
    return sdk::make_error(sdk::StatusCode::out_of_memory, "dequantize_row: out of memory");
  }
  if (n == 0) return sdk::Status::ok();
  const IeeeFloatMode ieee;
  const auto* x = static_cast<const std::uint8_t*>(src);
  switch (type) {
    case DType::f32: std::memmove(dst, src, static_cast<std::size_t>(n) * sizeof(float)); break;
    case DType::f16: k.fp16_to_fp32(static_cast<const std::uint16_t*>(src), dst, n); break;
    case DType::bf16: k.bf16_to_fp32(static_cast<const std::uint16_t*>(src), dst, n); break;
    case DType::q8_0: k.q8_0(x, dst, n); break;
    case DType::q4_0: k.q4_0(x, dst, n); break;
    case DType::q2_k: k.q2_k(x, dst, n); break;
    case DType::q3_k: k.q3_k(x, dst, n); break;
    case DType::q4_k: k.q4_k(x, dst, n); break;
    case DType::q5_k: k.q5_k(x, dst, n); break;
    case DType::q6_k: k.q6_k(x, dst, n); break;
    case DType::mxfp4: k.mxfp4(x, dst, n); break;
    default: detail::dequantize_input_only(type, x, dst, n); break;  // others were rejected by check_args
  }
  return sdk::Status::ok();
}

}  // namespace

bool can_dequantize(DType type) noexcept {
  return is_supported(type) || detail::is_input_only(type);
}

bool is_supported(DType type) noexcept {
  switch (type) {
    case DType::f32:
    case DType::f16:
    case DType::bf16:
    case DType::q8_0:
    case DType::q4_0:
    case DType::q2_k:
    case DType::q3_k:
    case DType::q4_k:
    case DType::q5_k:
    case DType::q6_k:
    case DType::mxfp4: return true;
    default: return false;
  }
}

sdk::Status quantize_row(DType type, const float* src, void* dst, std::int64_t n,
                         std::span<const float> /*importance*/) noexcept {
  try {
    if (auto st = check_args("quantize_row", type, src, dst, n); !st) return st;
  } catch (...) {
    return sdk::make_error(sdk::StatusCode::out_of_memory, "quantize_row: out of memory");
  }
  if (n == 0) return sdk::Status::ok();
  const IeeeFloatMode ieee;
  auto* y = static_cast<std::uint8_t*>(dst);
  switch (type) {
    case DType::f32: std::memmove(dst, src, static_cast<std::size_t>(n) * sizeof(float)); break;
    case DType::f16: best_kernels().fp32_to_fp16(src, static_cast<std::uint16_t*>(dst), n); break;
    case DType::bf16: best_kernels().fp32_to_bf16(src, static_cast<std::uint16_t*>(dst), n); break;
    case DType::q8_0: detail::quantize_q8_0_ref(src, y, n); break;
    case DType::q4_0: detail::quantize_q4_0_ref(src, y, n); break;
    case DType::q2_k: detail::quantize_q2_k_ref(src, y, n); break;
    case DType::q3_k: detail::quantize_q3_k_ref(src, y, n); break;
    case DType::q4_k: detail::quantize_q4_k_ref(src, y, n); break;
    case DType::q5_k: detail::quantize_q5_k_ref(src, y, n); break;
    case DType::q6_k: detail::quantize_q6_k_ref(src, y, n); break;
    case DType::mxfp4: detail::quantize_mxfp4_ref(src, y, n); break;
    default: break;
  }
  return sdk::Status::ok();
}

sdk::Status dequantize_row(DType type, const void* src, float* dst, std::int64_t n) noexcept {
  return dequantize_with(best_kernels(), type, src, dst, n);
}

sdk::Status dequantize_row(DType type, const void* src, float* dst, std::int64_t n, Isa isa) noexcept {
  const KernelTable* k = kernels_for(isa);
  if (k == nullptr) {
    try {
      return sdk::make_error(sdk::StatusCode::unsupported,
                             "dequantize_row: this CPU cannot run the " + std::string(to_string(isa)) + " path");
    } catch (...) {
      return sdk::make_error(sdk::StatusCode::out_of_memory, "dequantize_row: out of memory");
    }
  }
  return dequantize_with(*k, type, src, dst, n);
}

Isa best_isa() noexcept {
  if (cpu_has_avx512()) return Isa::avx512;
  if (cpu_has_avx2()) return Isa::avx2;
  return Isa::scalar;
}

bool isa_available(Isa isa) noexcept {
  return kernels_for(isa) != nullptr;
}

std::string_view to_string(Isa isa) noexcept {
  switch (isa) {
    case Isa::scalar: return "scalar";
    case Isa::avx2: return "avx2";
    case Isa::avx512: return "avx512";
  }
  return "unknown";
}

double bits_per_weight(DType type) noexcept {
  const auto* t = sdk::dtype_traits(type);
  if (t == nullptr) return 0.0;
  return 8.0 * t->block_bytes / t->block_elems;
}

// ---------------------------------------------------------------- fp16 / bf16 rows

void fp16_to_fp32_row(const std::uint16_t* src, float* dst, std::int64_t n) noexcept {
  best_kernels().fp16_to_fp32(src, dst, n);
}
void fp32_to_fp16_row(const float* src, std::uint16_t* dst, std::int64_t n) noexcept {
  best_kernels().fp32_to_fp16(src, dst, n);
}
void bf16_to_fp32_row(const std::uint16_t* src, float* dst, std::int64_t n) noexcept {
  best_kernels().bf16_to_fp32(src, dst, n);
}
void fp32_to_bf16_row(const float* src, std::uint16_t* dst, std::int64_t n) noexcept {
  best_kernels().fp32_to_bf16(src, dst, n);
}

bool fp16_to_fp32_row(const std::uint16_t* src, float* dst, std::int64_t n, Isa isa) noexcept {
  const KernelTable* k = kernels_for(isa);
  if (k != nullptr) k->fp16_to_fp32(src, dst, n);
  return k != nullptr;
}
bool fp32_to_fp16_row(const float* src, std::uint16_t* dst, std::int64_t n, Isa isa) noexcept {
  const KernelTable* k = kernels_for(isa);
  if (k != nullptr) k->fp32_to_fp16(src, dst, n);
  return k != nullptr;
}
bool bf16_to_fp32_row(const std::uint16_t* src, float* dst, std::int64_t n, Isa isa) noexcept {
  const KernelTable* k = kernels_for(isa);
  if (k != nullptr) k->bf16_to_fp32(src, dst, n);
  return k != nullptr;
}
bool fp32_to_bf16_row(const float* src, std::uint16_t* dst, std::int64_t n, Isa isa) noexcept {
  const KernelTable* k = kernels_for(isa);
  if (k != nullptr) k->fp32_to_bf16(src, dst, n);
  return k != nullptr;
}

}  // namespace colibri::quant
