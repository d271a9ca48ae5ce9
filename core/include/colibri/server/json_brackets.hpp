// The bracket structure of JSON text, strings skipped: what the request body's depth check and the tool-call
// scanner both read.
#pragma once

namespace colibri::server {

class JsonBrackets {
 public:
  // +1 for a '{' or '[' outside strings, -1 for a '}' or ']', 0 for any other byte.
  int step(char c) {
    if (in_string_) {
      if (escaped_) {
        escaped_ = false;
      } else if (c == '\\') {
        escaped_ = true;
      } else if (c == '"') {
        in_string_ = false;
      }
      return 0;
    }
    if (c == '"') in_string_ = true;
    if (c == '{' || c == '[') return 1;
    if (c == '}' || c == ']') return -1;
    return 0;
  }
  // Inside a string (its opening quote read, its closing one not yet).
  [[nodiscard]] bool in_string() const { return in_string_; }

 private:
  bool in_string_ = false, escaped_ = false;
};

}  // namespace colibri::server
