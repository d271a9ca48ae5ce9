#include "colibri/sdk/os_error.hpp"

#include <cerrno>
#include <cstring>

namespace colibri::sdk {

std::string os_error_text(int err) {
  std::string text = std::strerror(err);
  if (err == EMFILE || err == ENFILE) text += " (raise the open-file limit: ulimit -n, or LimitNOFILE= in a service)";
  if (err == EACCES || err == EPERM) text += " (check the file's permissions)";
  return text;
}

}  // namespace colibri::sdk
