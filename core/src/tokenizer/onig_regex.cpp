#include "tokenizer/onig_regex.hpp"

#include <oniguruma.h>

#include <mutex>

namespace colibri::tokenizer {

struct OnigRegex::Handle {
  regex_t* regex = nullptr;
  ~Handle() {
    if (regex != nullptr) onig_free(regex);
  }
};

namespace {

void ensure_onig_initialized() {
  static std::once_flag once;
  std::call_once(once, [] {
    OnigEncoding encodings[] = {ONIG_ENCODING_UTF8};
    onig_initialize(encodings, 1);
  });
}

struct RegionDeleter {
  void operator()(OnigRegion* r) const { onig_region_free(r, 1); }
};

}  // namespace

sdk::Expected<OnigRegex> OnigRegex::compile(std::string_view pattern) {
  ensure_onig_initialized();
  auto handle = std::make_shared<Handle>();
  OnigErrorInfo info{};
  const auto* begin = reinterpret_cast<const OnigUChar*>(pattern.data());
  const int rc = onig_new(&handle->regex, begin, begin + pattern.size(), ONIG_OPTION_NONE, ONIG_ENCODING_UTF8,
                          ONIG_SYNTAX_ONIGURUMA, &info);
  if (rc != ONIG_NORMAL) {
    OnigUChar message[ONIG_MAX_ERROR_MESSAGE_LEN] = {};
    onig_error_code_to_str(message, rc, &info);
    handle->regex = nullptr;
    return sdk::make_error(sdk::StatusCode::invalid_argument,
                           "invalid regex '" + std::string(pattern) + "': " + reinterpret_cast<const char*>(message));
  }
  OnigRegex out;
  out.handle_ = std::move(handle);
  return out;
}

bool OnigRegex::search(std::string_view text, std::size_t from, std::size_t& start, std::size_t& end) const {
  std::unique_ptr<OnigRegion, RegionDeleter> region(onig_region_new());
  const auto* str = reinterpret_cast<const OnigUChar*>(text.data());
  const int rc = onig_search(handle_->regex, str, str + text.size(), str + from, str + text.size(), region.get(),
                             ONIG_OPTION_NONE);
  if (rc < 0) return false;
  start = static_cast<std::size_t>(region->beg[0]);
  end = static_cast<std::size_t>(region->end[0]);
  return true;
}

std::vector<std::pair<std::size_t, std::size_t>> OnigRegex::find_all(std::string_view text) const {
  std::vector<std::pair<std::size_t, std::size_t>> matches;
  std::unique_ptr<OnigRegion, RegionDeleter> region(onig_region_new());
  const auto* str = reinterpret_cast<const OnigUChar*>(text.data());
  const auto* str_end = str + text.size();
  std::size_t last_end = 0;
  bool have_last = false;
  std::size_t last_match_end = 0;
  while (last_end <= text.size()) {
    onig_region_clear(region.get());
    const int rc = onig_search(handle_->regex, str, str_end, str + last_end, str_end, region.get(), ONIG_OPTION_NONE);
    if (rc < 0) break;
    const auto s = static_cast<std::size_t>(region->beg[0]);
    const auto e = static_cast<std::size_t>(region->end[0]);
    if (s == e && have_last && last_match_end == e) {
      // Step over one character (not one byte) so an empty match cannot repeat forever.
      if (last_end >= text.size()) break;
      const auto b = static_cast<unsigned char>(text[last_end]);
      last_end += b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
      continue;
    }
    last_end = e;
    last_match_end = e;
    have_last = true;
    matches.emplace_back(s, e);
  }
  return matches;
}

}  // namespace colibri::tokenizer
