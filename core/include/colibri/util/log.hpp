// Logging: one spdlog logger for the process; plugins log through HostServices, tagged by name.
#pragma once

#include <spdlog/spdlog.h>

#include <string_view>

#include "colibri/sdk/host.hpp"
#include "colibri/sdk/status.hpp"

namespace colibri::util {

// Accepts trace, debug, info, warn, error, off. Logs go to stderr so stdout stays machine-readable.
sdk::Status set_log_level(std::string_view level);

spdlog::level::level_enum to_spdlog(sdk::LogLevel level) noexcept;

}  // namespace colibri::util
