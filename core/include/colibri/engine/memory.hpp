// Page-aligned host memory for weights, expert slots and the KV cache (direct I/O needs aligned buffers).
#pragma once

#include <cstddef>
#include <utility>

namespace colibri::engine {

class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  // Anonymous mapping: pages cost RAM only once written, so a KV cache sized for the whole context is cheap until
  // the context fills. Throws std::bad_alloc when the address space is refused.
  explicit AlignedBuffer(std::size_t bytes);
  ~AlignedBuffer();
  AlignedBuffer(AlignedBuffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept {
    if (this != &o) {
      release();
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  [[nodiscard]] std::byte* data() const { return static_cast<std::byte*>(data_); }
  [[nodiscard]] std::size_t size() const { return size_; }

 private:
  void release() noexcept;
  void* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace colibri::engine
