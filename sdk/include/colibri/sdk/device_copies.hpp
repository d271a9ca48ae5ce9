// For compute backends with memory of their own (a GPU's): the checks and bookkeeping around
// copy_to_device_async / copy_to_host_async / synchronize that do not depend on the device API.
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "colibri/sdk/compute.hpp"

namespace colibri::sdk {

// `buffer` as the backend's buffer type B, when owns(const B&) says this compute object allocated it and `bytes`
// at `offset` lie inside it; else invalid_argument naming the call (`what`) and the backend ("CUDA").
template <typename B, typename Owns>
Expected<const B*> own_buffer(const Buffer& buffer, std::size_t offset, std::size_t bytes, std::string_view what,
                              std::string_view backend, Owns owns) {
  const auto* ours = dynamic_cast<const B*>(&buffer);
  if (ours == nullptr || !owns(*ours)) {
    return Status(StatusCode::invalid_argument, std::string(what) + ": the buffer was not allocated by this " +
                                                    std::string(backend) + " compute object");
  }
  if (offset > ours->size() || bytes > ours->size() - offset) {
    return Status(StatusCode::invalid_argument, std::string(what) + ": " + std::to_string(bytes) + " bytes at offset " +
                                                    std::to_string(offset) + " overrun the buffer of " +
                                                    std::to_string(ours->size()) + " bytes");
  }
  return ours;
}

// ComputeDeviceCopy::copy_between_async's checks: both buffers this compute object's and the ranges inside them (as
// own_buffer), and apart where they are one buffer; the two as B, else invalid_argument.
template <typename B, typename Owns>
Expected<std::pair<const B*, const B*>> own_copy_buffers(const Buffer& src, std::size_t src_offset, const Buffer& dst,
                                                         std::size_t dst_offset, std::size_t bytes,
                                                         std::string_view backend, Owns owns) {
  auto from = own_buffer<B>(src, src_offset, bytes, "copy_between_async (source)", backend, owns);
  if (!from) return from.error();
  auto to = own_buffer<B>(dst, dst_offset, bytes, "copy_between_async (destination)", backend, owns);
  if (!to) return to.error();
  if (&src == &dst && bytes > 0 && src_offset < dst_offset + bytes && dst_offset < src_offset + bytes) {
    return Status(StatusCode::invalid_argument,
                  "copy_between_async: the " + std::to_string(bytes) + " bytes at offsets " +
                      std::to_string(src_offset) + " and " + std::to_string(dst_offset) +
                      " of one buffer overlap; copy in pieces no longer than the distance between them");
  }
  return std::pair<const B*, const B*>(*from, *to);
}

// The Event of a copy in flight. Copy has `Status finish(bool block) noexcept` (completes the copy once: block
// waits for it, otherwise only a copy that has landed completes) and `bool is_finished() noexcept`.
template <typename Copy>
class CopyEvent final : public Event {
 public:
  explicit CopyEvent(std::shared_ptr<Copy> copy) : copy_(std::move(copy)) {}
  Status wait() noexcept override { return copy_->finish(true); }
  [[nodiscard]] bool ready() const noexcept override {
    (void)copy_->finish(false);
    return copy_->is_finished();
  }

 private:
  std::shared_ptr<Copy> copy_;
};

// The copies a compute object started and has not seen finish, so that synchronize() can finish them all.
template <typename Copy>
class CopiesInFlight {
 public:
  // Remembers `copy` (and forgets those that finished); its event.
  std::unique_ptr<Event> track(std::shared_ptr<Copy> copy) {
    {
      std::lock_guard lock(mu_);
      std::erase_if(copies_, [](const std::shared_ptr<Copy>& c) { return c->is_finished(); });
      copies_.push_back(copy);
    }
    return std::make_unique<CopyEvent<Copy>>(std::move(copy));
  }

  // Waits for every copy; the first error.
  Status finish_all() noexcept {
    std::vector<std::shared_ptr<Copy>> pending;
    {
      std::lock_guard lock(mu_);
      pending.swap(copies_);
    }
    Status first;
    for (auto& c : pending) {
      Status s = c->finish(true);
      if (!s && first) first = s;
    }
    return first;
  }

 private:
  std::mutex mu_;
  std::vector<std::shared_ptr<Copy>> copies_;
};

}  // namespace colibri::sdk
