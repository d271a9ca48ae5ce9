#include "colibri/engine/memory.hpp"

#include <sys/mman.h>

#include <new>

namespace colibri::engine {

namespace {
constexpr std::size_t kHugePageBytes = std::size_t{2} << 20;
}  // namespace

AlignedBuffer::AlignedBuffer(std::size_t bytes) {
  if (bytes == 0) return;
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  // Weights are streamed once per token: 2 MiB pages cut TLB misses where THP is madvise-only. A hint; may be refused.
  if (bytes >= kHugePageBytes) ::madvise(p, bytes, MADV_HUGEPAGE);
  data_ = p;
  size_ = bytes;
}

AlignedBuffer::~AlignedBuffer() {
  release();
}

void AlignedBuffer::release() noexcept {
  if (data_ != nullptr) ::munmap(data_, size_);
  data_ = nullptr;
  size_ = 0;
}

}  // namespace colibri::engine
