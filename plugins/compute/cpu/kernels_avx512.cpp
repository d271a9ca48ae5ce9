// AVX-512 row kernels (placeholder: the scalar bodies until the vectorised ones land).
#include "kernels.hpp"

namespace colibri::cpu {

const KernelSet& avx512_kernels() noexcept {
  static const KernelSet set = [] {
    KernelSet s = scalar_kernels();
    s.name = "avx512";
    return s;
  }();
  return set;
}

}  // namespace colibri::cpu
