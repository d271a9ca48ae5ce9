// Feeding text to a JsonConstraint byte by byte, for the JSON mode tests.
#pragma once

#include <string>

#include "colibri/engine/json_constraint.hpp"

namespace colibri::testing {

// How many bytes of `text` the constraint accepts, one at a time.
inline std::size_t accepted_prefix(const std::string& text, engine::JsonConstraint& c) {
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (!c.advance(text.substr(i, 1))) return i;
  }
  return text.size();
}

}  // namespace colibri::testing
