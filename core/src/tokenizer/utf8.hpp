// UTF-8 helpers shared by the tokenizer and the chat template renderer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace colibri::tokenizer::utf8 {

// The length of the character a lead byte starts (1 for ASCII), 0 for a byte that cannot start one.
std::size_t lead_length(unsigned char b) noexcept;
// Whether `b` may follow `lead` as its first continuation byte (RFC 3629 excludes overlong forms, surrogates and
// code points past U+10FFFF by this byte's range); later continuations are 0x80..0xBF.
bool second_ok(unsigned char lead, unsigned char b) noexcept;

// Length of the valid UTF-8 sequence starting at s[i], or 0 when the bytes there are not a valid sequence
// (overlong forms, surrogates and values past U+10FFFF are invalid, as in Rust's str).
std::size_t valid_sequence_length(std::string_view s, std::size_t i) noexcept;

// Number of bytes from s[i] that form the longest prefix of some valid sequence (1..3) — the unit that is replaced by
// one U+FFFD, as Rust's String::from_utf8_lossy and the WHATWG decoder do.
std::size_t invalid_sequence_length(std::string_view s, std::size_t i) noexcept;

bool is_valid(std::string_view s) noexcept;

// Replaces each maximal invalid subsequence by U+FFFD.
std::string to_valid_lossy(std::string_view s);

// Characters in `s` as next_code_point walks them (an invalid byte counts as one).
std::size_t code_point_count(std::string_view s) noexcept;

// Decodes the (valid) code point at s[i] and advances i. Invalid bytes yield U+FFFD and advance one byte.
char32_t next_code_point(std::string_view s, std::size_t& i) noexcept;

void append(std::string& out, char32_t cp);

// True when the string ends with a sequence that is the start of a valid character but incomplete.
bool ends_with_incomplete_sequence(std::string_view s) noexcept;

inline constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";

// UTF-16 for ICU calls (normalization, case mapping); invalid input gives an empty result.
std::u16string to_utf16(std::string_view s);
std::string from_utf16(const std::u16string& s);

}  // namespace colibri::tokenizer::utf8
