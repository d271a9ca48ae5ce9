// compute/vulkan: the plugin entry, score() and the Compute object's buffers and copies.
//
// score() creates no Vulkan instance and loads no driver: it opens only the loader library and
// looks for installed driver manifests (ICD .json files). Whether a usable device exists is known
// only in create(), which makes the instance and reports "no device" / "lacks feature X" there.
#include "vulkan_compute.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

namespace colibri::vulkan {

using sdk::Expected;
using sdk::Status;
using sdk::StatusCode;

namespace {

std::vector<std::string> split_paths(const char* text) {
  std::vector<std::string> out;
  if (text == nullptr) return out;
  std::string s(text);
  std::size_t start = 0;
  while (start <= s.size()) {
    const std::size_t end = std::min(s.find(':', start), s.size());
    if (end > start) out.push_back(s.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

// Driver manifests the Vulkan loader would read (the loader's own search order, simplified).
std::vector<std::string> icd_manifests() {
  namespace fs = std::filesystem;
  std::vector<std::string> candidates;
  const char* explicit_files = std::getenv("VK_DRIVER_FILES");
  if (explicit_files == nullptr) explicit_files = std::getenv("VK_ICD_FILENAMES");
  std::vector<std::string> dirs;
  if (explicit_files != nullptr) {
    candidates = split_paths(explicit_files);
  } else {
    candidates = split_paths(std::getenv("VK_ADD_DRIVER_FILES"));
    const char* xdg_config = std::getenv("XDG_CONFIG_DIRS");
    for (const auto& d : split_paths(xdg_config ? xdg_config : "/etc/xdg")) dirs.push_back(d + "/vulkan/icd.d");
    dirs.push_back("/etc/vulkan/icd.d");
    if (const char* home = std::getenv("XDG_DATA_HOME")) {
      dirs.push_back(std::string(home) + "/vulkan/icd.d");
    } else if (const char* h = std::getenv("HOME")) {
      dirs.push_back(std::string(h) + "/.local/share/vulkan/icd.d");
    }
    const char* xdg_data = std::getenv("XDG_DATA_DIRS");
    for (const auto& d : split_paths(xdg_data ? xdg_data : "/usr/local/share:/usr/share")) {
      dirs.push_back(d + "/vulkan/icd.d");
    }
  }
  std::vector<std::string> found;
  std::error_code ec;
  for (const auto& c : candidates) {
    if (fs::is_directory(c, ec)) {
      dirs.push_back(c);
    } else if (fs::is_regular_file(c, ec)) {
      found.push_back(fs::path(c).filename().string());
    }
  }
  for (const auto& d : dirs) {
    for (fs::directory_iterator it(d, ec), end; !ec && it != end; it.increment(ec)) {
      if (it->path().extension() == ".json") found.push_back(it->path().filename().string());
    }
    ec.clear();
  }
  std::sort(found.begin(), found.end());
  found.erase(std::unique(found.begin(), found.end()), found.end());
  return found;
}

// PCI vendor ids of the GPUs that have a kernel render node or the NVIDIA device node.
std::vector<std::string> gpu_vendors() {
  namespace fs = std::filesystem;
  std::vector<std::string> vendors;
  std::error_code ec;
  if (fs::exists("/dev/nvidia0", ec)) vendors.emplace_back("0x10de");
  for (fs::directory_iterator it("/sys/class/drm", ec), end; !ec && it != end; it.increment(ec)) {
    if (it->path().filename().string().rfind("renderD", 0) != 0) continue;
    std::ifstream in(it->path() / "device" / "vendor");
    std::string v;
    if (in >> v) vendors.push_back(v);
  }
  return vendors;
}

// The GPU a driver manifest serves, when its name says so ("intel_icd.x86_64.json" -> Intel).
bool driver_matches(const std::string& icd, const std::vector<std::string>& vendors) {
  auto has = [&](const char* v) { return std::find(vendors.begin(), vendors.end(), v) != vendors.end(); };
  if (icd.find("lvp") != std::string::npos) return false;  // lavapipe: the CPU
  if (icd.find("intel") != std::string::npos) return has("0x8086");
  if (icd.find("radeon") != std::string::npos || icd.find("amd") != std::string::npos) return has("0x1002");
  if (icd.find("nvidia") != std::string::npos || icd.find("nouveau") != std::string::npos) return has("0x10de");
  return !vendors.empty();  // another vendor's driver: trust it when any GPU is present
}

sdk::Score score(const sdk::HostInfo& /*host*/) noexcept {
  try {
    Api api;
    if (std::string e = load_loader(api); !e.empty()) {
      return {0, e + "; install libvulkan1 and a Vulkan driver (mesa-vulkan-drivers)"};
    }
    const auto icds = icd_manifests();
    if (icds.empty()) {
      for (const char* var : {"VK_DRIVER_FILES", "VK_ICD_FILENAMES"}) {
        if (const char* v = std::getenv(var); v != nullptr && *v != '\0') {
          return {0, std::string(var) + "=" + v +
                         " names no readable Vulkan driver manifest; unset it or name one in "
                         "/usr/share/vulkan/icd.d"};
        }
      }
      return {0,
              "no Vulkan driver is installed (no ICD manifest in /usr/share/vulkan/icd.d or /etc/vulkan/icd.d); "
              "apt-get install mesa-vulkan-drivers or the GPU vendor's driver"};
    }
    const auto vendors = gpu_vendors();
    std::string names, matched;
    for (const auto& n : icds) {
      names += (names.empty() ? "" : ", ") + n;
      if (driver_matches(n, vendors)) matched += (matched.empty() ? "" : ", ") + n;
    }
    if (!matched.empty()) return {400, "Vulkan driver " + matched + " matches a GPU of this machine"};
    // lavapipe runs shaders on the CPU: correct but slower than the CPU backend, so it must be
    // asked for by name (compute.backend: vulkan) rather than win the automatic choice.
    return {1, "only a software Vulkan device is likely here (drivers: " + names +
                   "; none matches a GPU of this machine); it works when selected with compute.backend: vulkan but "
                   "is slower than the CPU backend"};
  } catch (...) {
    return {0, "probing for Vulkan failed"};
  }
}

const sdk::OptionSpec kOptions[] = {
    {"map_device_memory", sdk::OptionType::boolean, "true",
     "map device-local memory into the host when it is the device's main heap (iGPU, lavapipe); false forces "
     "staging copies"},
    {"import_host_memory", sdk::OptionType::boolean, "true",
     "let shaders use host-memory tensors in place (VK_EXT_external_memory_host); false copies them through staging "
     "buffers"},
};

const char* const kCapabilities[] = {"matmul",    "expert_ffn", "expert_ffn_group",
                                     "attention", "f32",        "f16",
                                     "bf16",      "q8_0",       "q4_0",
                                     "q2_k",      "q3_k",       "q4_k",
                                     "q5_k",      "q6_k",       "mxfp4"};

}  // namespace

// ---------------------------------------------------------------------------------------- copies

void VulkanBuffer::copy_started(std::shared_ptr<Submission> copy) const noexcept {
  std::lock_guard lock(copies_mu_);
  std::erase_if(copies_, [](const std::shared_ptr<Submission>& s) { return s->ready(); });
  try {
    copies_.push_back(copy);
  } catch (...) {
    (void)copy->wait();  // untracked: waited for here instead
  }
}

Status PendingCopy::finish(bool block) noexcept {
  std::lock_guard lock(mu);
  if (finished) return status;
  if (!block && !submission->ready()) return {};
  status = submission->wait();
  if (status && host_dst != nullptr) std::memcpy(host_dst, staging.mapped, bytes);
  if (staging.buffer != VK_NULL_HANDLE) ctx->give_staging(staging);
  staging = Allocation{};
  submission.reset();
  finished = true;
  return status;
}

bool PendingCopy::is_finished() noexcept {
  std::lock_guard lock(mu);
  return finished;
}

// ---------------------------------------------------------------------------------------- compute

Expected<std::unique_ptr<VulkanCompute>> VulkanCompute::create(const sdk::CreateContext& cc) {
  auto device = cc.config->get_int("device", 0);
  if (!device) return device.error();
  auto map = cc.config->get_bool("map_device_memory", true);
  if (!map) return map.error();
  auto import = cc.config->get_bool("import_host_memory", true);
  if (!import) return import.error();
  ContextOptions options;
  options.device_index = *device;
  options.map_device_memory = *map;
  options.import_host_memory = *import;
  // A test hook (plugin tests): how the plugin reports a failure of commands it queued.
  if (const char* n = std::getenv("COLIBRI_VULKAN_FAIL_QUEUED_SUBMISSION"); n != nullptr) {
    options.fail_queued_submission = std::strtoll(n, nullptr, 10);
  }
  auto ctx = Context::create(options, cc.host);
  if (!ctx) return ctx.error();
  return std::make_unique<VulkanCompute>(std::move(*ctx));
}

VulkanCompute::VulkanCompute(std::shared_ptr<Context> ctx) : ctx_(std::move(ctx)) {
  devices_.push_back(ctx_->info());
}

VulkanCompute::~VulkanCompute() {
  (void)synchronize();
  ctx_->release(scratch_);
  ctx_->release(status_);
  ctx_->release(routed_consts_);
  ctx_->release(routed_tables_);
}

std::span<const sdk::DeviceInfo> VulkanCompute::devices() const noexcept {
  std::lock_guard lock(info_mu_);
  devices_.front() = ctx_->info();  // memory_available changes as buffers come and go
  return devices_;
}

Expected<std::unique_ptr<sdk::Buffer>> VulkanCompute::allocate(std::size_t bytes) noexcept {
  try {
    auto a = ctx_->allocate(bytes, false);
    if (!a) return a.error();
    return std::unique_ptr<sdk::Buffer>(new VulkanBuffer(ctx_, *a, bytes));
  } catch (...) {
    return Status(StatusCode::out_of_memory, "allocating a buffer object");
  }
}

Expected<const VulkanBuffer*> VulkanCompute::own_buffer(const sdk::Buffer& b, std::size_t offset, std::size_t bytes,
                                                        const char* what) const {
  return sdk::own_buffer<VulkanBuffer>(b, offset, bytes, what, "Vulkan",
                                       [&](const VulkanBuffer& vb) { return vb.context() == ctx_.get(); });
}

Expected<std::unique_ptr<sdk::Event>> VulkanCompute::copy_to_device_async(const void* src, sdk::Buffer& dst,
                                                                          std::size_t offset,
                                                                          std::size_t bytes) noexcept {
  try {
    auto vb = own_buffer(dst, offset, bytes, "copy_to_device_async");
    if (!vb) return vb.error();
    if (bytes == 0) return std::unique_ptr<sdk::Event>(new sdk::CompletedEvent());
    if (src == nullptr) return Status(StatusCode::invalid_argument, "copy_to_device_async: null source");
    if (dst.host_pointer() != nullptr) {
      // Mapped, coherent device memory: ops run synchronously, so nothing on the GPU is using it.
      std::memcpy(static_cast<std::byte*>(dst.host_pointer()) + offset, src, bytes);
      return std::unique_ptr<sdk::Event>(new sdk::CompletedEvent());
    }
    // Deferred ops may read the buffer: submitted first, so the copy comes after them on the queue. Their failure is
    // left for the next run(), download or synchronize() (whoever uploads may not look: a prefetch).
    ctx_->submit_deferred();
    auto staging = ctx_->take_staging(bytes);
    if (!staging) return staging.error().with_context("copy_to_device_async");
    std::memcpy(staging->mapped, src, bytes);
    const VkBuffer from = staging->buffer;
    const VkBuffer to = (*vb)->buffer();
    auto sub = ctx_->submit([&](VkCommandBuffer cmd) {
      VkBufferCopy region{0, offset, bytes};
      ctx_->api().vkCmdCopyBuffer(cmd, from, to, 1, &region);
    });
    if (!sub) {
      ctx_->give_staging(*staging);
      return sub.error().with_context("copy_to_device_async");
    }
    (*vb)->copy_started(*sub);
    auto copy = std::make_shared<PendingCopy>();
    copy->ctx = ctx_;
    copy->submission = std::move(*sub);
    copy->staging = *staging;
    copy->bytes = bytes;
    return copies_.track(std::move(copy));
  } catch (...) {
    return Status(StatusCode::out_of_memory, "copy_to_device_async");
  }
}

Expected<std::unique_ptr<sdk::Event>> VulkanCompute::copy_to_host_async(const sdk::Buffer& src, std::size_t offset,
                                                                        void* dst, std::size_t bytes) noexcept {
  try {
    auto vb = own_buffer(src, offset, bytes, "copy_to_host_async");
    if (!vb) return vb.error();
    if (bytes == 0) return std::unique_ptr<sdk::Event>(new sdk::CompletedEvent());
    if (dst == nullptr) return Status(StatusCode::invalid_argument, "copy_to_host_async: null destination");
    if ((*vb)->mapped() != nullptr) {
      std::memcpy(dst, static_cast<const std::byte*>((*vb)->mapped()) + offset, bytes);
      return std::unique_ptr<sdk::Event>(new sdk::CompletedEvent());
    }
    // Deferred ops may write the buffer: submitted first, so the copy sees what they wrote.
    if (Status s = ctx_->flush_deferred(); !s) return s;
    auto staging = ctx_->take_staging(bytes);
    if (!staging) return staging.error().with_context("copy_to_host_async");
    const VkBuffer from = (*vb)->buffer();
    const VkBuffer to = staging->buffer;
    auto sub = ctx_->submit([&](VkCommandBuffer cmd) {
      VkBufferCopy region{offset, 0, bytes};
      ctx_->api().vkCmdCopyBuffer(cmd, from, to, 1, &region);
    });
    if (!sub) {
      ctx_->give_staging(*staging);
      return sub.error().with_context("copy_to_host_async");
    }
    (*vb)->copy_started(*sub);
    auto copy = std::make_shared<PendingCopy>();
    copy->ctx = ctx_;
    copy->submission = std::move(*sub);
    copy->staging = *staging;
    copy->host_dst = dst;
    copy->bytes = bytes;
    return copies_.track(std::move(copy));
  } catch (...) {
    return Status(StatusCode::out_of_memory, "copy_to_host_async");
  }
}

Expected<std::unique_ptr<sdk::Event>> VulkanCompute::copy_between_async(const sdk::Buffer& src, std::size_t src_offset,
                                                                        sdk::Buffer& dst, std::size_t dst_offset,
                                                                        std::size_t bytes) noexcept {
  try {
    auto both = sdk::own_copy_buffers<VulkanBuffer>(src, src_offset, dst, dst_offset, bytes, "Vulkan",
                                                    [&](const VulkanBuffer& vb) { return vb.context() == ctx_.get(); });
    if (!both) return both.error();
    const auto [from, to] = *both;
    if (bytes == 0) return std::unique_ptr<sdk::Event>(new sdk::CompletedEvent());
    if (from->mapped() != nullptr && dst.host_pointer() != nullptr) {
      // Mapped, coherent device memory: ops run synchronously, so nothing on the GPU is using either.
      std::memcpy(static_cast<std::byte*>(dst.host_pointer()) + dst_offset,
                  static_cast<const std::byte*>(from->mapped()) + src_offset, bytes);
      return std::unique_ptr<sdk::Event>(new sdk::CompletedEvent());
    }
    // Deferred ops may write the source or read the destination: submitted first, so the copy comes after them.
    if (Status s = ctx_->flush_deferred(); !s) return s;
    const VkBuffer from_buffer = from->buffer();
    const VkBuffer to_buffer = to->buffer();
    auto sub = ctx_->submit([&](VkCommandBuffer cmd) {
      VkBufferCopy region{src_offset, dst_offset, bytes};
      ctx_->api().vkCmdCopyBuffer(cmd, from_buffer, to_buffer, 1, &region);
    });
    if (!sub) return sub.error().with_context("copy_between_async");
    from->copy_started(*sub);
    if (to != from) to->copy_started(*sub);
    auto copy = std::make_shared<PendingCopy>();
    copy->ctx = ctx_;
    copy->submission = std::move(*sub);
    copy->bytes = bytes;
    return copies_.track(std::move(copy));
  } catch (...) {
    return Status(StatusCode::out_of_memory, "copy_between_async");
  }
}

Status VulkanCompute::synchronize() noexcept {
  Status first = ctx_->settle_deferred();
  if (Status copies = copies_.finish_all(); !copies && first) first = copies;
  Status idle = ctx_->wait_idle();
  return first ? idle : first;
}

}  // namespace colibri::vulkan

namespace {

colibri::sdk::Expected<colibri::sdk::PluginObject*> create_vulkan(const colibri::sdk::CreateContext& ctx) noexcept {
  return colibri::sdk::create_guarded<colibri::vulkan::VulkanCompute>(ctx);
}

const colibri::sdk::PluginDescriptor kDescriptor{
    colibri::sdk::make_plugin_header(),
    colibri::sdk::PluginKind::compute,
    "vulkan",
    "0.1.0",
    "Vulkan compute shaders (SPIR-V embedded): quantized matmul, expert FFN, attention, norms",
    colibri::vulkan::kOptions,
    colibri::vulkan::kCapabilities,
    &colibri::vulkan::score,
    &create_vulkan,
};

}  // namespace

COLIBRI_DEFINE_PLUGIN(kDescriptor)
