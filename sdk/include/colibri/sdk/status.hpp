// Error values that cross the plugin boundary. No exception ever does: fallible SDK calls are
// noexcept and return Status or Expected<T>.
#pragma once

#include <cstdint>
#include <exception>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>

namespace colibri::sdk {

enum class StatusCode : std::uint8_t {
  ok = 0,
  invalid_argument,  // the caller passed something wrong
  not_found,         // a file, plugin, key or symbol does not exist
  io_error,          // the OS refused or failed a read / write
  corrupt_data,      // data was read but is wrong (checksum, truncated)
  unsupported,       // this plugin / device cannot do it
  out_of_memory,
  cancelled,
  internal,
};

std::string_view to_string(StatusCode code) noexcept;

class Status {
 public:
  Status() noexcept = default;
  Status(StatusCode code, std::string message, bool retryable = false, bool data_lost = false)
      : code_(code), retryable_(retryable), data_lost_(data_lost), message_(std::move(message)) {}

  static Status ok() noexcept { return {}; }

  [[nodiscard]] bool is_ok() const noexcept { return code_ == StatusCode::ok; }
  explicit operator bool() const noexcept { return is_ok(); }
  [[nodiscard]] StatusCode code() const noexcept { return code_; }
  [[nodiscard]] const std::string& message() const noexcept { return message_; }
  // Storage errors: may the same request succeed if tried again (EINTR, EAGAIN, a timeout)?
  [[nodiscard]] bool retryable() const noexcept { return retryable_; }
  // Storage errors: did the failure destroy data (a partial write, a bad sector)?
  [[nodiscard]] bool data_lost() const noexcept { return data_lost_; }

  // "io_error: reading L3/E5: Input/output error (retryable)"
  [[nodiscard]] std::string to_string() const;

  // Prefixes context to the message: status.with_context("loading L3/E5").
  [[nodiscard]] Status with_context(std::string_view context) const;

 private:
  StatusCode code_ = StatusCode::ok;
  bool retryable_ = false;
  bool data_lost_ = false;
  std::string message_;
};

inline Status make_error(StatusCode code, std::string message) {
  return Status(code, std::move(message));
}

// A value or the Status explaining why there is none (std::expected is C++23).
template <typename T>
class [[nodiscard]] Expected {
  static_assert(!std::is_same_v<std::remove_cv_t<T>, Status>, "Expected<Status> is meaningless");

 public:
  Expected(T value) : v_(std::in_place_index<0>, std::move(value)) {}      // NOLINT(google-explicit-constructor)
  Expected(Status error) : v_(std::in_place_index<1>, std::move(error)) {  // NOLINT(google-explicit-constructor)
    if (std::get<1>(v_).is_ok()) {
      v_.template emplace<1>(StatusCode::internal, "Expected constructed from an ok Status");
    }
  }

  [[nodiscard]] bool has_value() const noexcept { return v_.index() == 0; }
  explicit operator bool() const noexcept { return has_value(); }

  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  [[nodiscard]] const Status& error() const& { return std::get<1>(v_); }
  [[nodiscard]] Status status() const { return has_value() ? Status{} : std::get<1>(v_); }

 private:
  std::variant<T, Status> v_;
};

// Runs fn() (returning Status or Expected<T>) and turns an exception it throws into an internal-error Status,
// "<context>: <what()>", so that a noexcept call at the plugin boundary never lets one escape.
template <typename Fn>
std::invoke_result_t<Fn&> guarded(std::string_view context, Fn&& fn) noexcept {
  try {
    return fn();
  } catch (const std::exception& e) {
    return Status(StatusCode::internal, std::string(context) + ": " + e.what());
  } catch (...) {
    return Status(StatusCode::internal, std::string(context) + ": unknown exception");
  }
}

}  // namespace colibri::sdk
