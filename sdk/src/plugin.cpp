#include "colibri/sdk/plugin.hpp"

#include <cstring>

#include "colibri/sdk/compute.hpp"

namespace colibri::sdk {

std::string_view to_string(PluginKind kind) noexcept {
  switch (kind) {
    case PluginKind::compute: return "compute";
    case PluginKind::storage: return "storage";
    case PluginKind::cache: return "cache";
  }
  return "unknown";
}

bool parse_plugin_kind(std::string_view text, PluginKind& out) noexcept {
  for (auto k : {PluginKind::compute, PluginKind::storage, PluginKind::cache}) {
    if (text == to_string(k)) {
      out = k;
      return true;
    }
  }
  return false;
}

namespace {

Status check_range(std::size_t offset, std::size_t bytes, std::size_t size) {
  if (offset > size || bytes > size - offset) {
    return Status(StatusCode::invalid_argument, "copy of " + std::to_string(bytes) + " bytes at offset " +
                                                    std::to_string(offset) + " exceeds a buffer of " +
                                                    std::to_string(size) + " bytes");
  }
  return {};
}

}  // namespace

Expected<std::unique_ptr<Event>> ComputeBase::copy_to_device_async(const void* src, Buffer& dst, std::size_t offset,
                                                                   std::size_t bytes) noexcept {
  if (auto s = check_range(offset, bytes, dst.size()); !s) return s;
  void* p = dst.host_pointer();
  if (p == nullptr)
    return Status(StatusCode::unsupported, "buffer is not host-visible; the backend must override copies");
  std::memcpy(static_cast<std::byte*>(p) + offset, src, bytes);
  return std::unique_ptr<Event>(new (std::nothrow) CompletedEvent());
}

Expected<std::unique_ptr<Event>> ComputeBase::copy_to_host_async(const Buffer& src, std::size_t offset, void* dst,
                                                                 std::size_t bytes) noexcept {
  if (auto s = check_range(offset, bytes, src.size()); !s) return s;
  const void* p = const_cast<Buffer&>(src).host_pointer();
  if (p == nullptr)
    return Status(StatusCode::unsupported, "buffer is not host-visible; the backend must override copies");
  std::memcpy(dst, static_cast<const std::byte*>(p) + offset, bytes);
  return std::unique_ptr<Event>(new (std::nothrow) CompletedEvent());
}

}  // namespace colibri::sdk
