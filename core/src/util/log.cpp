#include "colibri/util/log.hpp"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <mutex>

namespace colibri::util {

namespace {

void ensure_stderr_logger() {
  static std::once_flag once;
  std::call_once(once, [] {
    auto logger = spdlog::stderr_color_mt("colibri");
    logger->set_pattern("%^[%l]%$ %v");
    spdlog::set_default_logger(logger);
  });
}

}  // namespace

sdk::Status set_log_level(std::string_view level) {
  ensure_stderr_logger();
  static constexpr std::pair<std::string_view, spdlog::level::level_enum> kLevels[] = {
      {"trace", spdlog::level::trace}, {"debug", spdlog::level::debug}, {"info", spdlog::level::info},
      {"warn", spdlog::level::warn},   {"error", spdlog::level::err},   {"off", spdlog::level::off}};
  for (const auto& [name, value] : kLevels) {
    if (name == level) {
      spdlog::set_level(value);
      return {};
    }
  }
  return sdk::Status(sdk::StatusCode::invalid_argument,
                     "unknown log level '" + std::string(level) + "'; use trace, debug, info, warn, error or off");
}

spdlog::level::level_enum to_spdlog(sdk::LogLevel level) noexcept {
  switch (level) {
    case sdk::LogLevel::trace: return spdlog::level::trace;
    case sdk::LogLevel::debug: return spdlog::level::debug;
    case sdk::LogLevel::info: return spdlog::level::info;
    case sdk::LogLevel::warn: return spdlog::level::warn;
    case sdk::LogLevel::error: return spdlog::level::err;
  }
  return spdlog::level::info;
}

}  // namespace colibri::util
