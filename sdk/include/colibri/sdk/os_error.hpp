#pragma once
// The OS's words for an errno, with where to look for the errors a user fixes outside colibri. One text for the
// core and every plugin, so that an open-file limit reads the same whichever of them hit it.
#include <string>

namespace colibri::sdk {

// strerror(err), then for EMFILE/ENFILE how to raise the open-file limit and for EACCES/EPERM to check permissions.
std::string os_error_text(int err);

// What a file of stat's st_mode is, for a message about one that is not a regular file: "a directory", "a named pipe
// (FIFO)", "a socket", "a device", else "not a regular file" (a regular file too: the callers ask about others).
std::string file_kind_text(unsigned mode);
// The same for a path, following links: "a link to nothing or a link loop" where it cannot be followed, "missing"
// where nothing is there.
std::string path_kind_text(const std::string& path);

}  // namespace colibri::sdk
