// The plugin contract: one extern "C" entry symbol per library returning a descriptor.
//
//   extern "C" const colibri::sdk::PluginDescriptor* colibri_plugin_entry();
//
// The descriptor starts with a fixed C header (size, ABI version, build fingerprint) that every
// colibri version can read, so a mismatched plugin is refused with both versions named instead of
// being called. Behind the descriptor, C++ interfaces are used freely: the loader accepts only
// libraries built with the same ABI version, compiler family and libstdc++ ABI.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "colibri/sdk/config.hpp"
#include "colibri/sdk/host.hpp"
#include "colibri/sdk/status.hpp"
#include "colibri/sdk/version.hpp"

#define COLIBRI_SDK_STRINGIFY_(x) #x
#define COLIBRI_SDK_STRINGIFY(x) COLIBRI_SDK_STRINGIFY_(x)

#if defined(__clang__)
#define COLIBRI_SDK_COMPILER "clang-" COLIBRI_SDK_STRINGIFY(__clang_major__)
#elif defined(__GNUC__)
#define COLIBRI_SDK_COMPILER "gcc-" COLIBRI_SDK_STRINGIFY(__GNUC__)
#else
#define COLIBRI_SDK_COMPILER "unknown"
#endif

#if defined(_GLIBCXX_USE_CXX11_ABI)
#define COLIBRI_SDK_STDLIB "libstdc++-cxx11abi" COLIBRI_SDK_STRINGIFY(_GLIBCXX_USE_CXX11_ABI)
#elif defined(_LIBCPP_VERSION)
#define COLIBRI_SDK_STDLIB "libc++"
#else
#define COLIBRI_SDK_STDLIB "unknown-stdlib"
#endif

// "gcc-12;libstdc++-cxx11abi1;sdk-0.1.0": what a plugin was built with, compared field by field.
#define COLIBRI_SDK_BUILD_FINGERPRINT COLIBRI_SDK_COMPILER ";" COLIBRI_SDK_STDLIB ";sdk-" COLIBRI_SDK_VERSION_STRING

#define COLIBRI_PLUGIN_ENTRY_SYMBOL "colibri_plugin_entry"

namespace colibri::sdk {

inline constexpr std::uint32_t kAbiVersion = COLIBRI_SDK_ABI_VERSION;

enum class PluginKind : std::uint32_t { compute = 1, storage = 2, cache = 3 };
std::string_view to_string(PluginKind kind) noexcept;
bool parse_plugin_kind(std::string_view text, PluginKind& out) noexcept;

// What the host knows about the machine, so score() never has to execute ISA-specific code or
// load a driver to decide.
struct HostInfo {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512_vnni = false;
  bool avx512_bf16 = false;
  bool avx_vnni = false;
  bool amx_usable = false;  // probed at run time (permission + a tile instruction), never CPUID alone
  unsigned physical_cores = 1;
  unsigned logical_cpus = 1;
  std::uint64_t ram_total_bytes = 0;
  std::uint64_t ram_available_bytes = 0;
  std::string kernel_release;  // uname -r
};

// Result of score(): 0 means "cannot run here" and the reason says why; higher wins per kind.
struct Score {
  int value = 0;
  std::string reason;
};

// Base of every object a plugin creates. New capabilities are added as new interfaces reached
// through query_interface("colibri.storage.async.v1"), never by growing frozen ones.
class PluginObject {
 public:
  virtual ~PluginObject() = default;
  [[nodiscard]] virtual void* query_interface(std::string_view /*interface_id*/) noexcept { return nullptr; }
};

struct CreateContext {
  const ConfigView* config = nullptr;  // its profile section, validated; valid during create() only
  HostServices* host = nullptr;        // outlives the created object
  const HostInfo* host_info = nullptr;
};

// Fixed C-layout header: never reordered, so any colibri can read it from any plugin.
extern "C" {
struct colibri_plugin_header {
  std::uint32_t struct_size;
  std::uint32_t abi_version;
  const char* build_fingerprint;
};
}

struct PluginDescriptor {
  colibri_plugin_header header;
  PluginKind kind;
  const char* name;         // [a-z0-9_-]+, unique per kind
  const char* version;      // the plugin's own version
  const char* description;  // one line
  std::span<const OptionSpec> options;
  std::span<const char* const> capabilities;  // static capability words, shown by `plugins list`
  Score (*score)(const HostInfo& host) noexcept;
  Expected<PluginObject*> (*create)(const CreateContext& ctx) noexcept;
};

constexpr colibri_plugin_header make_plugin_header() noexcept {
  return colibri_plugin_header{static_cast<std::uint32_t>(sizeof(PluginDescriptor)), kAbiVersion,
                               COLIBRI_SDK_BUILD_FINGERPRINT};
}

// Helper for create(): builds T from the context and converts exceptions thrown while doing so
// into a Status, so none escapes the boundary.
template <typename T>
Expected<PluginObject*> create_guarded(const CreateContext& ctx) noexcept {
  return guarded("create threw", [&]() -> Expected<PluginObject*> {
    auto made = T::create(ctx);
    if (!made) return made.error();
    return static_cast<PluginObject*>(made->release());
  });
}

}  // namespace colibri::sdk

#define COLIBRI_PLUGIN_EXPORT extern "C" __attribute__((visibility("default")))

// Declares the entry symbol of a plugin library:
//   COLIBRI_DEFINE_PLUGIN(kDescriptor)
// where kDescriptor is a `static const colibri::sdk::PluginDescriptor` in the same file.
#define COLIBRI_DEFINE_PLUGIN(descriptor)                                                \
  COLIBRI_PLUGIN_EXPORT const ::colibri::sdk::PluginDescriptor* colibri_plugin_entry() { \
    return &(descriptor);                                                                \
  }
