#include "tokenizer/utf8.hpp"

#include <unicode/ustring.h>

namespace colibri::tokenizer::utf8 {
std::size_t lead_length(unsigned char b) noexcept {
  if (b < 0x80) return 1;
  if (b >= 0xC2 && b <= 0xDF) return 2;
  if (b >= 0xE0 && b <= 0xEF) return 3;
  if (b >= 0xF0 && b <= 0xF4) return 4;
  return 0;
}

bool second_ok(unsigned char lead, unsigned char b) noexcept {
  switch (lead) {
    case 0xE0: return b >= 0xA0 && b <= 0xBF;
    case 0xED: return b >= 0x80 && b <= 0x9F;
    case 0xF0: return b >= 0x90 && b <= 0xBF;
    case 0xF4: return b >= 0x80 && b <= 0x8F;
    default: return b >= 0x80 && b <= 0xBF;
  }
}

namespace {

// How many bytes starting at i match a valid sequence prefix; sets `complete` when a full character is there.
std::size_t matched_prefix(std::string_view s, std::size_t i, bool& complete) noexcept {
  complete = false;
  const auto lead = static_cast<unsigned char>(s[i]);
  const std::size_t need = lead_length(lead);
  if (need == 0) return 0;
  if (need == 1) {
    complete = true;
    return 1;
  }
  std::size_t n = 1;
  while (n < need && i + n < s.size()) {
    const auto b = static_cast<unsigned char>(s[i + n]);
    const bool ok = n == 1 ? second_ok(lead, b) : (b >= 0x80 && b <= 0xBF);
    if (!ok) return n;
    ++n;
  }
  complete = n == need;
  return n;
}

}  // namespace

std::size_t valid_sequence_length(std::string_view s, std::size_t i) noexcept {
  bool complete = false;
  const std::size_t n = matched_prefix(s, i, complete);
  return complete ? n : 0;
}

std::size_t invalid_sequence_length(std::string_view s, std::size_t i) noexcept {
  bool complete = false;
  const std::size_t n = matched_prefix(s, i, complete);
  return n == 0 ? 1 : n;
}

std::size_t code_point_count(std::string_view s) noexcept {
  std::size_t n = 0;
  for (std::size_t i = 0; i < s.size(); ++n) next_code_point(s, i);
  return n;
}

bool is_valid(std::string_view s) noexcept {
  std::size_t i = 0;
  while (i < s.size()) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const std::size_t n = valid_sequence_length(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string to_valid_lossy(std::string_view s) {
  if (is_valid(s)) return std::string(s);
  std::string out;
  out.reserve(s.size() + 8);
  std::size_t i = 0;
  while (i < s.size()) {
    const std::size_t n = valid_sequence_length(s, i);
    if (n > 0) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      out.append(kReplacementChar);
      i += invalid_sequence_length(s, i);
    }
  }
  return out;
}

char32_t next_code_point(std::string_view s, std::size_t& i) noexcept {
  const std::size_t n = valid_sequence_length(s, i);
  if (n == 0) {
    ++i;
    return 0xFFFD;
  }
  const auto b0 = static_cast<unsigned char>(s[i]);
  char32_t cp = 0;
  switch (n) {
    case 1: cp = b0; break;
    case 2: cp = ((b0 & 0x1Fu) << 6) | (static_cast<unsigned char>(s[i + 1]) & 0x3Fu); break;
    case 3:
      cp = ((b0 & 0x0Fu) << 12) | ((static_cast<unsigned char>(s[i + 1]) & 0x3Fu) << 6) |
           (static_cast<unsigned char>(s[i + 2]) & 0x3Fu);
      break;
    default:
      cp = ((b0 & 0x07u) << 18) | ((static_cast<unsigned char>(s[i + 1]) & 0x3Fu) << 12) |
           ((static_cast<unsigned char>(s[i + 2]) & 0x3Fu) << 6) | (static_cast<unsigned char>(s[i + 3]) & 0x3Fu);
      break;
  }
  i += n;
  return cp;
}

void append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool ends_with_incomplete_sequence(std::string_view s) noexcept {
  // An incomplete character is at most 3 bytes long: look for its lead byte among the last 3 bytes.
  const std::size_t look = s.size() < 3 ? s.size() : 3;
  for (std::size_t back = 1; back <= look; ++back) {
    const std::size_t i = s.size() - back;
    const auto b = static_cast<unsigned char>(s[i]);
    if (b >= 0x80 && b <= 0xBF) continue;  // continuation byte: keep looking for the lead
    bool complete = false;
    const std::size_t n = matched_prefix(s, i, complete);
    return !complete && n == back && lead_length(b) > back;
  }
  return false;
}

std::u16string to_utf16(std::string_view s) {
  std::u16string out(s.size() + 1, u'\0');
  int32_t len = 0;
  UErrorCode err = U_ZERO_ERROR;
  u_strFromUTF8(reinterpret_cast<UChar*>(out.data()), static_cast<int32_t>(out.size()), &len, s.data(),
                static_cast<int32_t>(s.size()), &err);
  out.resize(U_SUCCESS(err) ? static_cast<std::size_t>(len) : 0);
  return out;
}

std::string from_utf16(const std::u16string& s) {
  std::string out(s.size() * 3 + 1, '\0');
  int32_t len = 0;
  UErrorCode err = U_ZERO_ERROR;
  u_strToUTF8(out.data(), static_cast<int32_t>(out.size()), &len, reinterpret_cast<const UChar*>(s.data()),
              static_cast<int32_t>(s.size()), &err);
  out.resize(U_SUCCESS(err) ? static_cast<std::size_t>(len) : 0);
  return out;
}

}  // namespace colibri::tokenizer::utf8
