// A hardware profile (YAML) a user wrote, and one --set override: the first piece up to a 0 byte is the profile
// file, the rest the override ("key=value"). Mistakes are errors naming the file, line and key; nothing crashes.
#include <string>

#include "colibri/profile/profile.hpp"
#include "fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace colibri;
  fuzz::Input in(data, size);
  const auto path = fuzz::write_scratch("profile.yaml", in.until(std::string_view("\0", 1)));
  profile::LoadOptions options;
  options.profile = path.string();
  options.use_process_environment = false;
  options.search_dirs = {path.parent_path()};
  const std::string_view override_text = in.rest();
  if (!override_text.empty()) {
    const auto eq = override_text.find('=');
    options.overrides.push_back({std::string(override_text.substr(0, eq)),
                                 eq == std::string_view::npos ? "" : std::string(override_text.substr(eq + 1)),
                                 "--set"});
  }
  auto loaded = profile::Profile::load(options);
  if (!loaded) FUZZ_CHECK(!loaded.error().message().empty(), "an error without a message");
  return 0;
}
