// AVX2 row kernels (placeholder: the scalar bodies until the vectorised ones land).
#include "kernels.hpp"

namespace colibri::cpu {

const KernelSet& avx2_kernels() noexcept {
  static const KernelSet set = [] {
    KernelSet s = scalar_kernels();
    s.name = "avx2";
    return s;
  }();
  return set;
}

}  // namespace colibri::cpu
