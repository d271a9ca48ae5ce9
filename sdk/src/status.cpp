#include "colibri/sdk/status.hpp"

namespace colibri::sdk {

std::string_view to_string(StatusCode code) noexcept {
  switch (code) {
    case StatusCode::ok: return "ok";
    case StatusCode::invalid_argument: return "invalid_argument";
    case StatusCode::not_found: return "not_found";
    case StatusCode::io_error: return "io_error";
    case StatusCode::corrupt_data: return "corrupt_data";
    case StatusCode::unsupported: return "unsupported";
    case StatusCode::out_of_memory: return "out_of_memory";
    case StatusCode::cancelled: return "cancelled";
    case StatusCode::internal: return "internal";
  }
  return "unknown";
}

std::string Status::to_string() const {
  if (is_ok()) return "ok";
  std::string s(sdk::to_string(code_));
  s += ": ";
  s += message_;
  if (retryable_) s += " (retryable)";
  if (data_lost_) s += " (data lost)";
  return s;
}

Status Status::with_context(std::string_view context) const {
  if (is_ok()) return *this;
  Status s = *this;
  s.message_ = std::string(context) + ": " + message_;
  return s;
}

}  // namespace colibri::sdk
