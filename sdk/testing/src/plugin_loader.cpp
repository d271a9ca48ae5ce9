#include "colibri/sdk/testing/plugin_loader.hpp"

#include <dlfcn.h>

#include <cstdlib>

namespace colibri::sdk::testing {

void RecordingHost::log(LogLevel level, std::string_view message) noexcept {
  static constexpr const char* kNames[] = {"trace", "debug", "info", "warn", "error"};
  try {
    std::lock_guard lock(mu_);
    lines_.push_back(std::string(kNames[static_cast<int>(level)]) + ": " + std::string(message));
  } catch (...) {
  }
}

void RecordingHost::counter_add(std::string_view metric, double delta) noexcept {
  try {
    std::lock_guard lock(mu_);
    metrics_[std::string(metric)] += delta;
  } catch (...) {
  }
}

void RecordingHost::gauge_set(std::string_view metric, double value) noexcept {
  try {
    std::lock_guard lock(mu_);
    metrics_[std::string(metric)] = value;
  } catch (...) {
  }
}

void* RecordingHost::allocate_aligned(std::size_t bytes, std::size_t alignment) noexcept {
  if (alignment < sizeof(void*) || (alignment & (alignment - 1)) != 0) return nullptr;
  const std::size_t rounded = (bytes + alignment - 1) / alignment * alignment;
  return std::aligned_alloc(alignment, rounded == 0 ? alignment : rounded);
}

void RecordingHost::free_aligned(void* ptr) noexcept {
  std::free(ptr);
}

std::vector<std::string> RecordingHost::lines() const {
  std::lock_guard lock(mu_);
  return lines_;
}

double RecordingHost::metric(const std::string& name) const {
  std::lock_guard lock(mu_);
  auto it = metrics_.find(name);
  return it == metrics_.end() ? 0.0 : it->second;
}

Expected<std::shared_ptr<LoadedPlugin>> LoadedPlugin::load(const std::string& path) {
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) {
    const char* e = dlerror();
    return Status(StatusCode::not_found, "cannot load " + path + ": " + (e ? e : "unknown error"));
  }
  auto* entry = reinterpret_cast<const PluginDescriptor* (*)()>(dlsym(h, COLIBRI_PLUGIN_ENTRY_SYMBOL));
  if (entry == nullptr) {
    dlclose(h);
    return Status(StatusCode::not_found, path + " has no " COLIBRI_PLUGIN_ENTRY_SYMBOL " symbol");
  }
  const PluginDescriptor* d = entry();
  if (d == nullptr || d->header.abi_version != kAbiVersion || d->header.struct_size != sizeof(PluginDescriptor)) {
    dlclose(h);
    return Status(StatusCode::unsupported, path + " was built for another SDK ABI");
  }
  std::shared_ptr<LoadedPlugin> p(new LoadedPlugin());
  p->handle_ = h;
  p->descriptor_ = d;
  p->self_ = p;
  return p;
}

LoadedPlugin::~LoadedPlugin() {
  // Libraries stay loaded for the life of the process (objects may outlive their creators).
}

Expected<std::shared_ptr<PluginObject>> LoadedPlugin::create(const std::map<std::string, std::string>& options,
                                                             std::shared_ptr<RecordingHost> host) {
  // Canonical keys the conformance suites may pass; the rest must be in the plugin's schema.
  static const OptionSpec kCommon[] = {
      {"direct_io", OptionType::boolean, "true", ""}, {"queue_depth", OptionType::integer, "32", ""},
      {"paths", OptionType::path_list, "[]", ""},     {"pinned_experts", OptionType::string_list, "[]", ""},
      {"device", OptionType::integer, "0", ""},       {"threads", OptionType::integer, "auto", "", true},
  };
  std::map<std::string, ConfigValue, std::less<>> values;
  auto find_spec = [&](const std::string& name) -> const OptionSpec* {
    for (const auto& o : descriptor_->options) {
      if (name == o.name) return &o;
    }
    for (const auto& o : kCommon) {
      if (name == o.name) return &o;
    }
    return nullptr;
  };
  for (const auto& o : descriptor_->options) {
    if (o.default_value && *o.default_value) {
      auto v = parse_option_value(o, o.default_value);
      if (!v) return v.error();
      values[o.name] = *v;
    }
  }
  for (const auto& [k, text] : options) {
    const OptionSpec* spec = find_spec(k);
    if (spec == nullptr) return Status(StatusCode::invalid_argument, "unknown option '" + k + "'");
    auto v = parse_option_value(*spec, text);
    if (!v) return v.error();
    values[k] = *v;
  }
  if (!host) host = std::make_shared<RecordingHost>();
  auto config = std::make_shared<ConfigView>(std::move(values));
  CreateContext ctx;
  ctx.config = config.get();
  ctx.host = host.get();
  ctx.host_info = &host_info_;
  auto made = descriptor_->create(ctx);
  if (!made) return made.error();
  auto keep = self_.lock();
  return std::shared_ptr<PluginObject>(*made, [keep, host](PluginObject* o) { delete o; });
}

}  // namespace colibri::sdk::testing
