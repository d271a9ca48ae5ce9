#include "colibri/sdk/os_error.hpp"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>

namespace colibri::sdk {

std::string os_error_text(int err) {
  std::string text = std::strerror(err);
  if (err == EMFILE || err == ENFILE) text += " (raise the open-file limit: ulimit -n, or LimitNOFILE= in a service)";
  if (err == EACCES || err == EPERM) text += " (check the file's permissions)";
  return text;
}

std::string file_kind_text(unsigned mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a named pipe (FIFO)";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
  return "not a regular file";
}

std::string path_kind_text(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) return file_kind_text(st.st_mode);
  if (::lstat(path.c_str(), &st) == 0) return "a link to nothing or a link loop";
  return "missing";
}

}  // namespace colibri::sdk
