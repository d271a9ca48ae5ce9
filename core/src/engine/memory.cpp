#include "colibri/engine/memory.hpp"

#include <sys/mman.h>

#include <new>

namespace colibri::engine {

AlignedBuffer::AlignedBuffer(std::size_t bytes) {
  if (bytes == 0) return;
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
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
