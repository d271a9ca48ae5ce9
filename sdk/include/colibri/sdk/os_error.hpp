#pragma once
// The OS's words for an errno, with where to look for the errors a user fixes outside colibri. One text for the
// core and every plugin, so that an open-file limit reads the same whichever of them hit it.
#include <string>

namespace colibri::sdk {

// strerror(err), then for EMFILE/ENFILE how to raise the open-file limit and for EACCES/EPERM to check permissions.
std::string os_error_text(int err);

}  // namespace colibri::sdk
