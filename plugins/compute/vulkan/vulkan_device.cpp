#include "vulkan_device.hpp"

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "vulkan_shaders.hpp"

namespace colibri::vulkan {

using sdk::Expected;
using sdk::Status;
using sdk::StatusCode;

namespace {

constexpr std::size_t kMinStaging = std::size_t{1} << 20;
constexpr std::size_t kMaxIdleStagingBytes = std::size_t{256} << 20;
constexpr std::uint32_t kPushConstantBytes = 128;

const char* device_type_name(VkPhysicalDeviceType t) {
  switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return "integrated GPU";
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return "discrete GPU";
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return "virtual GPU";
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return "CPU";
    default: return "other";
  }
}

std::string version_text(std::uint32_t v) {
  return std::to_string(VK_API_VERSION_MAJOR(v)) + "." + std::to_string(VK_API_VERSION_MINOR(v));
}

}  // namespace

Status vk_error(std::string_view what, VkResult result) {
  const bool oom = result == VK_ERROR_OUT_OF_DEVICE_MEMORY || result == VK_ERROR_OUT_OF_HOST_MEMORY;
  return Status(oom ? StatusCode::out_of_memory : StatusCode::internal, std::string(what) + ": " + result_name(result));
}

// ---------------------------------------------------------------------------------------- Submission

// The command buffer and fence are freed outside mu_: freeing takes the Context's queue lock, which is held while
// ready() is asked (Context::submit_deferred), so holding mu_ then would order the two locks both ways.
Submission::~Submission() {
  if (!done_) {
    // Never free a command buffer the GPU may still read.
    ctx_->api().vkWaitForFences(ctx_->device(), 1, &fence_, VK_TRUE, UINT64_MAX);
    ctx_->free_command(cmd_, fence_);
  }
}

void Submission::finish_locked(VkCommandBuffer& cmd, VkFence& fence) noexcept {
  cmd = std::exchange(cmd_, VK_NULL_HANDLE);
  fence = std::exchange(fence_, VK_NULL_HANDLE);
  done_ = true;
}

Status Submission::wait() noexcept {
  VkCommandBuffer cmd = VK_NULL_HANDLE;
  VkFence fence = VK_NULL_HANDLE;
  Status status;
  {
    std::lock_guard lock(mu_);
    if (done_) return status_;
    const VkResult r = ctx_->api().vkWaitForFences(ctx_->device(), 1, &fence_, VK_TRUE, UINT64_MAX);
    if (r != VK_SUCCESS) status_ = vk_error("waiting for the GPU", r);
    finish_locked(cmd, fence);
    status = status_;
  }
  ctx_->free_command(cmd, fence);
  return status;
}

bool Submission::ready() noexcept {
  VkCommandBuffer cmd = VK_NULL_HANDLE;
  VkFence fence = VK_NULL_HANDLE;
  {
    std::unique_lock lock(mu_, std::try_to_lock);
    if (!lock) return false;  // another thread is waiting for it: not known to be done
    if (done_) return true;
    const VkResult r = ctx_->api().vkGetFenceStatus(ctx_->device(), fence_);
    if (r == VK_NOT_READY) return false;
    if (r != VK_SUCCESS) status_ = vk_error("polling the GPU", r);
    finish_locked(cmd, fence);
  }
  ctx_->free_command(cmd, fence);
  return true;
}

// ---------------------------------------------------------------------------------------- Context

Expected<std::shared_ptr<Context>> Context::create(const ContextOptions& options, sdk::HostServices* host) {
  std::shared_ptr<Context> ctx(new Context());
  ctx->host_ = host;
  Status s = ctx->init(options);
  if (!s) return s;
  return ctx;
}

Status Context::init(const ContextOptions& options) {
  fail_queued_submission_ = options.fail_queued_submission;
  if (std::string e = load_loader(api_); !e.empty()) return Status(StatusCode::unsupported, e);
  std::uint32_t loader_version = VK_API_VERSION_1_0;
  api_.vkEnumerateInstanceVersion(&loader_version);
  if (loader_version < VK_API_VERSION_1_2) {
    return Status(StatusCode::unsupported, "the Vulkan loader supports Vulkan " + version_text(loader_version) +
                                               "; this backend needs 1.2 (update libvulkan1)");
  }
  auto app = make_info<VkApplicationInfo>(VK_STRUCTURE_TYPE_APPLICATION_INFO);
  app.pApplicationName = "colibri";
  app.pEngineName = "colibri";
  app.apiVersion = VK_API_VERSION_1_2;
  auto ici = make_info<VkInstanceCreateInfo>(VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO);
  ici.pApplicationInfo = &app;
  // The loader reads only the drivers these name when they are set: a wrong path here looks like no driver at all.
  std::string chosen;
  for (const char* var : {"VK_DRIVER_FILES", "VK_ICD_FILENAMES"}) {
    if (const char* v = std::getenv(var); v != nullptr && *v != '\0') chosen = std::string(var) + "=" + v;
  }
  const std::string why =
      chosen.empty() ? "apt-get install mesa-vulkan-drivers, or the GPU vendor's driver"
                     : chosen + " limits the loader to those drivers; unset it or name an installed ICD manifest";
  if (VkResult r = api_.vkCreateInstance(&ici, nullptr, &instance_); r != VK_SUCCESS) {
    return Status(StatusCode::unsupported, std::string("creating a Vulkan instance failed (") + result_name(r) +
                                               "): no usable Vulkan driver was found (" + why + ")");
  }
  if (std::string missing = load_instance(api_, instance_); !missing.empty()) {
    return Status(StatusCode::unsupported, "the Vulkan loader lacks " + missing);
  }

  std::uint32_t count = 0;
  api_.vkEnumeratePhysicalDevices(instance_, &count, nullptr);
  std::vector<VkPhysicalDevice> physicals(count);
  if (count > 0) api_.vkEnumeratePhysicalDevices(instance_, &count, physicals.data());
  physicals.resize(count);
  if (physicals.empty()) {
    return Status(StatusCode::unsupported,
                  "the Vulkan loader found no device (" +
                      (chosen.empty() ? std::string("no driver for this machine's GPU; apt-get install "
                                                    "mesa-vulkan-drivers provides the lavapipe CPU device")
                                      : why) +
                      ")");
  }
  std::string listing;
  for (std::size_t i = 0; i < physicals.size(); ++i) {
    VkPhysicalDeviceProperties p{};
    api_.vkGetPhysicalDeviceProperties(physicals[i], &p);
    listing += (i ? ", " : "") + std::to_string(i) + ": " + p.deviceName + " (" + device_type_name(p.deviceType) +
               ", Vulkan " + version_text(p.apiVersion) + ")";
  }
  if (options.device_index < 0 || static_cast<std::size_t>(options.device_index) >= physicals.size()) {
    return Status(StatusCode::invalid_argument, "compute.device " + std::to_string(options.device_index) +
                                                    " does not exist; Vulkan devices: " + listing);
  }
  physical_ = physicals[static_cast<std::size_t>(options.device_index)];
  api_.vkGetPhysicalDeviceProperties(physical_, &props_);
  api_.vkGetPhysicalDeviceMemoryProperties(physical_, &mem_props_);
  name_ = props_.deviceName;
  const std::string which = "Vulkan device " + std::to_string(options.device_index) + " (" + name_ + ")";
  if (props_.apiVersion < VK_API_VERSION_1_2) {
    return Status(StatusCode::unsupported, which + " supports Vulkan " + version_text(props_.apiVersion) +
                                               "; this backend needs 1.2 (buffer device addresses)");
  }

  auto f12 = make_info<VkPhysicalDeviceVulkan12Features>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES);
  auto f2 = make_info<VkPhysicalDeviceFeatures2>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2);
  f2.pNext = &f12;
  api_.vkGetPhysicalDeviceFeatures2(physical_, &f2);
  if (!f12.bufferDeviceAddress || !f2.features.shaderInt64) {
    return Status(StatusCode::unsupported, which + " lacks " +
                                               (!f12.bufferDeviceAddress ? "bufferDeviceAddress" : "shaderInt64") +
                                               ", which this backend's shaders need");
  }

  std::uint32_t n_ext = 0;
  api_.vkEnumerateDeviceExtensionProperties(physical_, nullptr, &n_ext, nullptr);
  std::vector<VkExtensionProperties> exts(n_ext);
  api_.vkEnumerateDeviceExtensionProperties(physical_, nullptr, &n_ext, exts.data());
  for (const auto& e : exts) {
    if (std::strcmp(e.extensionName, VK_EXT_MEMORY_BUDGET_EXTENSION_NAME) == 0) has_budget_ = true;
    if (std::strcmp(e.extensionName, VK_EXT_EXTERNAL_MEMORY_HOST_EXTENSION_NAME) == 0) {
      has_host_import_ = options.import_host_memory;
    }
  }

  std::uint32_t n_fam = 0;
  api_.vkGetPhysicalDeviceQueueFamilyProperties(physical_, &n_fam, nullptr);
  std::vector<VkQueueFamilyProperties> fams(n_fam);
  api_.vkGetPhysicalDeviceQueueFamilyProperties(physical_, &n_fam, fams.data());
  int family = -1;
  for (std::uint32_t i = 0; i < n_fam; ++i) {
    if (fams[i].queueFlags & VK_QUEUE_COMPUTE_BIT) {
      family = static_cast<int>(i);
      break;
    }
  }
  if (family < 0) return Status(StatusCode::unsupported, which + " has no compute queue");
  queue_family_ = static_cast<std::uint32_t>(family);

  const float priority = 1.0f;
  auto qci = make_info<VkDeviceQueueCreateInfo>(VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO);
  qci.queueFamilyIndex = queue_family_;
  qci.queueCount = 1;
  qci.pQueuePriorities = &priority;
  auto want12 = make_info<VkPhysicalDeviceVulkan12Features>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES);
  want12.bufferDeviceAddress = VK_TRUE;
  auto want = make_info<VkPhysicalDeviceFeatures2>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2);
  want.pNext = &want12;
  want.features.shaderInt64 = VK_TRUE;
  std::vector<const char*> extensions;
  if (has_budget_) extensions.push_back(VK_EXT_MEMORY_BUDGET_EXTENSION_NAME);
  if (has_host_import_) {
    auto host_props = make_info<VkPhysicalDeviceExternalMemoryHostPropertiesEXT>(
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_EXTERNAL_MEMORY_HOST_PROPERTIES_EXT);
    auto props2 = make_info<VkPhysicalDeviceProperties2>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2);
    props2.pNext = &host_props;
    api_.vkGetPhysicalDeviceProperties2(physical_, &props2);
    import_alignment_ = host_props.minImportedHostPointerAlignment;
    has_host_import_ = import_alignment_ > 0 && (import_alignment_ & (import_alignment_ - 1)) == 0;
    if (has_host_import_) extensions.push_back(VK_EXT_EXTERNAL_MEMORY_HOST_EXTENSION_NAME);
  }
  auto dci = make_info<VkDeviceCreateInfo>(VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO);
  dci.pNext = &want;
  dci.queueCreateInfoCount = 1;
  dci.pQueueCreateInfos = &qci;
  dci.enabledExtensionCount = static_cast<std::uint32_t>(extensions.size());
  dci.ppEnabledExtensionNames = extensions.empty() ? nullptr : extensions.data();
  if (VkResult r = api_.vkCreateDevice(physical_, &dci, nullptr, &device_); r != VK_SUCCESS) {
    device_ = VK_NULL_HANDLE;
    return vk_error("creating " + which, r);
  }
  if (std::string missing = load_device(api_, device_); !missing.empty()) {
    return Status(StatusCode::unsupported, which + ": the driver lacks " + missing);
  }
  api_.vkGetDeviceQueue(device_, queue_family_, 0, &queue_);
  if (has_host_import_) {
    api_.vkGetMemoryHostPointerPropertiesEXT = reinterpret_cast<PFN_vkGetMemoryHostPointerPropertiesEXT>(
        api_.vkGetDeviceProcAddr(device_, "vkGetMemoryHostPointerPropertiesEXT"));
    has_host_import_ = api_.vkGetMemoryHostPointerPropertiesEXT != nullptr;
  }

  auto pci = make_info<VkCommandPoolCreateInfo>(VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO);
  pci.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
  pci.queueFamilyIndex = queue_family_;
  if (VkResult r = api_.vkCreateCommandPool(device_, &pci, nullptr, &pool_); r != VK_SUCCESS) {
    return vk_error("creating a command pool", r);
  }
  VkPushConstantRange range{VK_SHADER_STAGE_COMPUTE_BIT, 0, kPushConstantBytes};
  auto lci = make_info<VkPipelineLayoutCreateInfo>(VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO);
  lci.pushConstantRangeCount = 1;
  lci.pPushConstantRanges = &range;
  if (VkResult r = api_.vkCreatePipelineLayout(device_, &lci, nullptr, &layout_); r != VK_SUCCESS) {
    return vk_error("creating the pipeline layout", r);
  }

  // Buffers go to the largest device-local heap. It is mapped only on unified-memory devices (iGPU,
  // CPU): there mapped memory is ordinary cached RAM. A discrete GPU's BAR / ReBAR mapping is
  // uncached for reads and often small, so discrete GPUs always copy through staging buffers.
  const bool unified =
      props_.deviceType == VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU || props_.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU;
  std::uint64_t largest_local = 0;
  int largest_heap = -1;
  for (std::uint32_t h = 0; h < mem_props_.memoryHeapCount; ++h) {
    if ((mem_props_.memoryHeaps[h].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) &&
        mem_props_.memoryHeaps[h].size > largest_local) {
      largest_local = mem_props_.memoryHeaps[h].size;
      largest_heap = static_cast<int>(h);
    }
  }
  const VkMemoryPropertyFlags mappable = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
  for (std::uint32_t i = 0; i < mem_props_.memoryTypeCount; ++i) {
    const auto& t = mem_props_.memoryTypes[i];
    if (static_cast<int>(t.heapIndex) != largest_heap || !(t.propertyFlags & VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT)) {
      continue;
    }
    const bool is_mappable = unified && (t.propertyFlags & mappable) == mappable;
    if (device_type_index_ < 0 || (options.map_device_memory && is_mappable && !device_mapped_)) {
      device_type_index_ = static_cast<int>(i);
      device_mapped_ = options.map_device_memory && is_mappable;
    }
  }
  if (device_type_index_ < 0) return Status(StatusCode::unsupported, which + " has no device-local memory type");

  std::string caps = "vulkan-" + version_text(props_.apiVersion) + " " + device_type_name(props_.deviceType);
  std::replace(caps.begin(), caps.end(), ' ', '-');
  caps += has_budget_ ? " memory-budget" : "";
  caps += has_host_import_ ? " host-import" : "";
  caps += device_mapped_ ? " mapped-device-memory" : " staging-copies";
  capabilities_ = caps;
  if (host_ != nullptr) {
    host_->info("using " + which + "; devices: " + listing + "; capabilities: " + capabilities_);
  }
  return {};
}

Context::~Context() {
  if (device_ != VK_NULL_HANDLE) {
    api_.vkDeviceWaitIdle(device_);
    for (auto& a : idle_staging_) release(a);
    for (auto& [name, p] : pipelines_) api_.vkDestroyPipeline(device_, p, nullptr);
    if (layout_ != VK_NULL_HANDLE) api_.vkDestroyPipelineLayout(device_, layout_, nullptr);
    if (pool_ != VK_NULL_HANDLE) api_.vkDestroyCommandPool(device_, pool_, nullptr);
    api_.vkDestroyDevice(device_, nullptr);
  }
  if (instance_ != VK_NULL_HANDLE && api_.vkDestroyInstance != nullptr) api_.vkDestroyInstance(instance_, nullptr);
}

sdk::DeviceInfo Context::info() noexcept {
  sdk::DeviceInfo d;
  try {
    d.name = name_;
    d.capabilities = capabilities_;
    d.host_memory = device_mapped_;
    const int heap = static_cast<int>(mem_props_.memoryTypes[device_type_index_].heapIndex);
    d.memory_total = mem_props_.memoryHeaps[heap].size;
    std::uint64_t used;
    {
      std::lock_guard lock(mem_mu_);
      used = device_bytes_in_use_;
    }
    d.memory_available = d.memory_total > used ? d.memory_total - used : 0;
    if (has_budget_) {
      auto budget = make_info<VkPhysicalDeviceMemoryBudgetPropertiesEXT>(
          VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_BUDGET_PROPERTIES_EXT);
      auto p2 = make_info<VkPhysicalDeviceMemoryProperties2>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_PROPERTIES_2);
      p2.pNext = &budget;
      api_.vkGetPhysicalDeviceMemoryProperties2(physical_, &p2);
      // The budget counts every process's usage, ours included.
      const std::uint64_t b = budget.heapBudget[heap];
      const std::uint64_t u = budget.heapUsage[heap];
      d.memory_available = b > u ? b - u : 0;
    }
  } catch (...) {
  }
  return d;
}

int Context::find_memory_type(std::uint32_t type_bits, VkMemoryPropertyFlags required,
                              VkMemoryPropertyFlags preferred) const {
  int fallback = -1;
  for (std::uint32_t i = 0; i < mem_props_.memoryTypeCount; ++i) {
    if (!(type_bits & (1u << i))) continue;
    const VkMemoryPropertyFlags f = mem_props_.memoryTypes[i].propertyFlags;
    if ((f & required) != required) continue;
    if ((f & preferred) == preferred) return static_cast<int>(i);
    if (fallback < 0) fallback = static_cast<int>(i);
  }
  return fallback;
}

Expected<Allocation> Context::allocate(std::size_t bytes, bool host_visible) noexcept {
  Allocation a;
  a.size = bytes;
  if (!host_visible) {
    const auto heap = mem_props_.memoryTypes[device_type_index_].heapIndex;
    if (bytes > mem_props_.memoryHeaps[heap].size) {
      return Status(StatusCode::out_of_memory, "allocating " + sdk::format_size(bytes) + " on " + name_ +
                                                   ": the device heap holds only " +
                                                   sdk::format_size(mem_props_.memoryHeaps[heap].size));
    }
  }
  auto bci = make_info<VkBufferCreateInfo>(VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO);
  bci.size = std::max<std::size_t>(bytes, 16);
  bci.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT |
              VK_BUFFER_USAGE_SHADER_DEVICE_ADDRESS_BIT;
  bci.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
  if (VkResult r = api_.vkCreateBuffer(device_, &bci, nullptr, &a.buffer); r != VK_SUCCESS) {
    return vk_error("allocating " + sdk::format_size(bytes) + " on " + name_ + " (creating the buffer)", r);
  }
  VkMemoryRequirements req{};
  api_.vkGetBufferMemoryRequirements(device_, a.buffer, &req);
  int type;
  if (host_visible) {
    type =
        find_memory_type(req.memoryTypeBits, VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT,
                         VK_MEMORY_PROPERTY_HOST_CACHED_BIT);
  } else {
    type = (req.memoryTypeBits & (1u << device_type_index_)) ? device_type_index_
                                                             : find_memory_type(req.memoryTypeBits, 0, 0);
  }
  if (type < 0) {
    api_.vkDestroyBuffer(device_, a.buffer, nullptr);
    return Status(StatusCode::unsupported, "no memory type can hold a storage buffer on " + name_);
  }
  auto flags = make_info<VkMemoryAllocateFlagsInfo>(VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_FLAGS_INFO);
  flags.flags = VK_MEMORY_ALLOCATE_DEVICE_ADDRESS_BIT;
  auto mai = make_info<VkMemoryAllocateInfo>(VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO);
  mai.pNext = &flags;
  mai.allocationSize = req.size;
  mai.memoryTypeIndex = static_cast<std::uint32_t>(type);
  if (VkResult r = api_.vkAllocateMemory(device_, &mai, nullptr, &a.memory); r != VK_SUCCESS) {
    api_.vkDestroyBuffer(device_, a.buffer, nullptr);
    std::string what = "allocating " + sdk::format_size(bytes) + " of " + (host_visible ? "host-visible" : "device") +
                       " memory on " + name_;
    if (!host_visible) what += " (" + sdk::format_size(info().memory_available) + " available)";
    return vk_error(what, r);
  }
  api_.vkBindBufferMemory(device_, a.buffer, a.memory, 0);
  const VkMemoryPropertyFlags f = mem_props_.memoryTypes[type].propertyFlags;
  if ((f & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT) && (host_visible || device_mapped_)) {
    if (VkResult r = api_.vkMapMemory(device_, a.memory, 0, VK_WHOLE_SIZE, 0, &a.mapped); r != VK_SUCCESS) {
      a.mapped = nullptr;
      if (host_visible) {
        release(a);
        return vk_error("mapping a staging buffer", r);
      }
    }
  }
  auto bai = make_info<VkBufferDeviceAddressInfo>(VK_STRUCTURE_TYPE_BUFFER_DEVICE_ADDRESS_INFO);
  bai.buffer = a.buffer;
  a.address = api_.vkGetBufferDeviceAddress(device_, &bai);
  a.device_local_heap = static_cast<int>(mem_props_.memoryTypes[type].heapIndex) ==
                        static_cast<int>(mem_props_.memoryTypes[device_type_index_].heapIndex);
  if (a.device_local_heap) {
    a.charged = req.size;
    std::lock_guard lock(mem_mu_);
    device_bytes_in_use_ += req.size;
  }
  return a;
}

void Context::release(Allocation& a) noexcept {
  if (a.buffer != VK_NULL_HANDLE) api_.vkDestroyBuffer(device_, a.buffer, nullptr);
  if (a.memory != VK_NULL_HANDLE) {
    if (a.device_local_heap) {
      std::lock_guard lock(mem_mu_);
      device_bytes_in_use_ -= std::min<std::uint64_t>(device_bytes_in_use_, a.charged);
    }
    api_.vkFreeMemory(device_, a.memory, nullptr);
  }
  a = Allocation{};
}

Expected<Allocation> Context::import_host(void* ptr, std::size_t bytes) noexcept {
  if (!has_host_import_) return Status(StatusCode::unsupported, "host memory import is not available");
  const auto start = reinterpret_cast<std::uintptr_t>(ptr);
  const std::uintptr_t base = start & ~static_cast<std::uintptr_t>(import_alignment_ - 1);
  const std::uintptr_t end =
      (start + bytes + import_alignment_ - 1) & ~static_cast<std::uintptr_t>(import_alignment_ - 1);
  constexpr auto kHandle = VK_EXTERNAL_MEMORY_HANDLE_TYPE_HOST_ALLOCATION_BIT_EXT;
  auto host_props = make_info<VkMemoryHostPointerPropertiesEXT>(VK_STRUCTURE_TYPE_MEMORY_HOST_POINTER_PROPERTIES_EXT);
  if (VkResult r =
          api_.vkGetMemoryHostPointerPropertiesEXT(device_, kHandle, reinterpret_cast<void*>(base), &host_props);
      r != VK_SUCCESS) {
    return vk_error("querying host memory for import", r);
  }
  Allocation a;
  a.size = end - base;
  auto ext = make_info<VkExternalMemoryBufferCreateInfo>(VK_STRUCTURE_TYPE_EXTERNAL_MEMORY_BUFFER_CREATE_INFO);
  ext.handleTypes = kHandle;
  auto bci = make_info<VkBufferCreateInfo>(VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO);
  bci.pNext = &ext;
  bci.size = a.size;
  bci.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT |
              VK_BUFFER_USAGE_SHADER_DEVICE_ADDRESS_BIT;
  if (VkResult r = api_.vkCreateBuffer(device_, &bci, nullptr, &a.buffer); r != VK_SUCCESS) {
    return vk_error("creating a buffer over host memory", r);
  }
  VkMemoryRequirements req{};
  api_.vkGetBufferMemoryRequirements(device_, a.buffer, &req);
  const int type =
      find_memory_type(req.memoryTypeBits & host_props.memoryTypeBits, 0, VK_MEMORY_PROPERTY_HOST_COHERENT_BIT);
  if (type < 0 || !(mem_props_.memoryTypes[type].propertyFlags & VK_MEMORY_PROPERTY_HOST_COHERENT_BIT)) {
    release(a);
    return Status(StatusCode::unsupported, "no coherent memory type can import host memory");
  }
  auto import_info = make_info<VkImportMemoryHostPointerInfoEXT>(VK_STRUCTURE_TYPE_IMPORT_MEMORY_HOST_POINTER_INFO_EXT);
  import_info.handleType = kHandle;
  import_info.pHostPointer = reinterpret_cast<void*>(base);
  auto flags = make_info<VkMemoryAllocateFlagsInfo>(VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_FLAGS_INFO);
  flags.flags = VK_MEMORY_ALLOCATE_DEVICE_ADDRESS_BIT;
  flags.pNext = &import_info;
  auto mai = make_info<VkMemoryAllocateInfo>(VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO);
  mai.pNext = &flags;
  mai.allocationSize = a.size;
  mai.memoryTypeIndex = static_cast<std::uint32_t>(type);
  if (VkResult r = api_.vkAllocateMemory(device_, &mai, nullptr, &a.memory); r != VK_SUCCESS) {
    a.memory = VK_NULL_HANDLE;
    release(a);
    return vk_error("importing host memory", r);
  }
  api_.vkBindBufferMemory(device_, a.buffer, a.memory, 0);
  auto bai = make_info<VkBufferDeviceAddressInfo>(VK_STRUCTURE_TYPE_BUFFER_DEVICE_ADDRESS_INFO);
  bai.buffer = a.buffer;
  a.address = api_.vkGetBufferDeviceAddress(device_, &bai) + (start - base);
  return a;
}

Expected<Allocation> Context::take_staging(std::size_t bytes) noexcept {
  {
    std::lock_guard lock(mem_mu_);
    auto best = idle_staging_.end();
    for (auto it = idle_staging_.begin(); it != idle_staging_.end(); ++it) {
      if (it->size >= bytes && (best == idle_staging_.end() || it->size < best->size)) best = it;
    }
    if (best != idle_staging_.end()) {
      Allocation a = *best;
      idle_staging_.erase(best);
      idle_staging_bytes_ -= a.size;
      return a;
    }
  }
  return allocate(std::max(std::bit_ceil(bytes), kMinStaging), true);
}

void Context::give_staging(Allocation a) noexcept {
  {
    std::lock_guard lock(mem_mu_);
    if (idle_staging_bytes_ + a.size <= kMaxIdleStagingBytes) {
      try {
        idle_staging_.push_back(a);
        idle_staging_bytes_ += a.size;
        return;
      } catch (...) {
      }
    }
  }
  release(a);
}

Expected<VkPipeline> Context::pipeline(std::string_view shader) noexcept {
  std::lock_guard lock(pipe_mu_);
  if (auto it = pipelines_.find(shader); it != pipelines_.end()) return it->second;
  const auto words = shader_spirv(shader);
  if (words.empty()) return Status(StatusCode::internal, "no embedded shader named " + std::string(shader));
  auto smi = make_info<VkShaderModuleCreateInfo>(VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO);
  smi.codeSize = words.size_bytes();
  smi.pCode = words.data();
  VkShaderModule module = VK_NULL_HANDLE;
  if (VkResult r = api_.vkCreateShaderModule(device_, &smi, nullptr, &module); r != VK_SUCCESS) {
    return vk_error("loading shader " + std::string(shader), r);
  }
  auto cpi = make_info<VkComputePipelineCreateInfo>(VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO);
  cpi.stage.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO;
  cpi.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
  cpi.stage.module = module;
  cpi.stage.pName = "main";
  cpi.layout = layout_;
  VkPipeline p = VK_NULL_HANDLE;
  const VkResult r = api_.vkCreateComputePipelines(device_, VK_NULL_HANDLE, 1, &cpi, nullptr, &p);
  api_.vkDestroyShaderModule(device_, module, nullptr);
  if (r != VK_SUCCESS) return vk_error("compiling shader " + std::string(shader) + " for " + name_, r);
  try {
    pipelines_.emplace(std::string(shader), p);
  } catch (...) {
    api_.vkDestroyPipeline(device_, p, nullptr);
    return Status(StatusCode::out_of_memory, "caching a pipeline");
  }
  return p;
}

Expected<std::shared_ptr<Submission>> Context::submit(const std::function<void(VkCommandBuffer)>& record) noexcept {
  VkCommandBuffer cmd = VK_NULL_HANDLE;
  VkFence fence = VK_NULL_HANDLE;
  std::lock_guard lock(queue_mu_);
  auto cai = make_info<VkCommandBufferAllocateInfo>(VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO);
  cai.commandPool = pool_;
  cai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
  cai.commandBufferCount = 1;
  if (VkResult r = api_.vkAllocateCommandBuffers(device_, &cai, &cmd); r != VK_SUCCESS) {
    return vk_error("allocating a command buffer", r);
  }
  auto fci = make_info<VkFenceCreateInfo>(VK_STRUCTURE_TYPE_FENCE_CREATE_INFO);
  if (VkResult r = api_.vkCreateFence(device_, &fci, nullptr, &fence); r != VK_SUCCESS) {
    api_.vkFreeCommandBuffers(device_, pool_, 1, &cmd);
    return vk_error("creating a fence", r);
  }
  auto begin = make_info<VkCommandBufferBeginInfo>(VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO);
  begin.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
  api_.vkBeginCommandBuffer(cmd, &begin);
  // Everything submitted earlier on this queue (uploads, ops) is finished and visible first.
  auto mb = make_info<VkMemoryBarrier>(VK_STRUCTURE_TYPE_MEMORY_BARRIER);
  mb.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT | VK_ACCESS_HOST_WRITE_BIT;
  mb.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_READ_BIT |
                     VK_ACCESS_TRANSFER_WRITE_BIT;
  api_.vkCmdPipelineBarrier(
      cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT | VK_PIPELINE_STAGE_HOST_BIT,
      VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT, 0, 1, &mb, 0, nullptr, 0, nullptr);
  try {
    record(cmd);
  } catch (...) {
    api_.vkEndCommandBuffer(cmd);
    free_command(cmd, fence);
    return Status(StatusCode::internal, "recording GPU commands threw");
  }
  // Results are visible to the host (mapped buffers) once the fence signals.
  auto hb = make_info<VkMemoryBarrier>(VK_STRUCTURE_TYPE_MEMORY_BARRIER);
  hb.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
  hb.dstAccessMask = VK_ACCESS_HOST_READ_BIT;
  api_.vkCmdPipelineBarrier(cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                            VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &hb, 0, nullptr, 0, nullptr);
  if (VkResult r = api_.vkEndCommandBuffer(cmd); r != VK_SUCCESS) {
    free_command(cmd, fence);
    return vk_error("recording GPU commands", r);
  }
  auto si = make_info<VkSubmitInfo>(VK_STRUCTURE_TYPE_SUBMIT_INFO);
  si.commandBufferCount = 1;
  si.pCommandBuffers = &cmd;
  if (VkResult r = api_.vkQueueSubmit(queue_, 1, &si, fence); r != VK_SUCCESS) {
    free_command(cmd, fence);
    return vk_error("submitting GPU work", r);
  }
  try {
    return std::make_shared<Submission>(shared_from_this(), cmd, fence);
  } catch (...) {
    api_.vkWaitForFences(device_, 1, &fence, VK_TRUE, UINT64_MAX);
    free_command(cmd, fence);
    return Status(StatusCode::out_of_memory, "tracking a submission");
  }
}

void Context::free_command(VkCommandBuffer cmd, VkFence fence) noexcept {
  std::lock_guard lock(queue_mu_);  // the pool is externally synchronised
  if (cmd != VK_NULL_HANDLE) api_.vkFreeCommandBuffers(device_, pool_, 1, &cmd);
  if (fence != VK_NULL_HANDLE) api_.vkDestroyFence(device_, fence, nullptr);
}

void Context::record_commands(VkCommandBuffer cmd, const std::vector<Dispatch>& commands) const noexcept {
  for (std::size_t i = 0; i < commands.size(); ++i) {
    if (i > 0) {  // each command sees what the one before wrote
      auto mb = make_info<VkMemoryBarrier>(VK_STRUCTURE_TYPE_MEMORY_BARRIER);
      mb.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT;
      mb.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT;
      api_.vkCmdPipelineBarrier(cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, 1,
                                &mb, 0, nullptr, 0, nullptr);
    }
    api_.vkCmdBindPipeline(cmd, VK_PIPELINE_BIND_POINT_COMPUTE, commands[i].pipeline);
    api_.vkCmdPushConstants(cmd, layout_, VK_SHADER_STAGE_COMPUTE_BIT, 0,
                            static_cast<std::uint32_t>(commands[i].push.size()), commands[i].push.data());
    api_.vkCmdDispatch(cmd, commands[i].groups[0], commands[i].groups[1], commands[i].groups[2]);
  }
}

void Context::defer(std::vector<Dispatch> commands) {
  std::lock_guard lock(queue_mu_);
  deferred_.reserve(deferred_.size() + commands.size());
  for (auto& c : commands) deferred_.push_back(std::move(c));
  if (host_ != nullptr) host_->counter_add("deferred_ops_total", 1);
  // Bounded: a long prefill would otherwise be one command buffer (a driver's watchdog, a GPU idle while the host
  // records). A failure is kept for the next call, as the ops queued so far have returned.
  constexpr std::size_t kMaxQueued = 1024;
  if (deferred_.size() >= kMaxQueued) submit_deferred();
}

void Context::submit_deferred() noexcept {
  std::lock_guard lock(queue_mu_);
  if (deferred_.empty()) return;
  std::vector<Dispatch> commands;
  commands.swap(deferred_);
  // Finished ones go (each holds this Context, and the list would otherwise grow with every flush).
  drop_finished_locked();
  ++queued_submissions_;
  auto sub = queued_submissions_ == fail_queued_submission_
                 ? Expected<std::shared_ptr<Submission>>(vk_error("submitting GPU work", VK_ERROR_DEVICE_LOST))
                 : submit([&](VkCommandBuffer cmd) { record_commands(cmd, commands); });
  if (!sub) {
    // The calls that queued them have returned: the next call to look says so.
    keep_deferred_error(sub.error().with_context(std::to_string(commands.size()) +
                                                 " queued GPU commands did not run (they are dropped)"));
    return;
  }
  try {
    deferred_running_.push_back(std::move(*sub));
  } catch (...) {
    if (Status w = (*sub)->wait(); !w) keep_deferred_error(std::move(w));  // untracked: waited for here instead
  }
  if (host_ != nullptr) host_->counter_add("deferred_submissions_total", 1);
}

void Context::wait_deferred() noexcept {
  std::vector<std::shared_ptr<Submission>> running;
  {
    std::lock_guard lock(queue_mu_);
    submit_deferred();
    try {
      running = deferred_running_;  // copied, not taken: a thread that comes now waits for them too
    } catch (...) {
      for (auto& s : deferred_running_) (void)s->wait();  // waited for under the lock instead
    }
  }
  // Waited for without the queue's lock: other threads' copies and submissions go on meanwhile.
  for (auto& s : running) (void)s->wait();
  std::lock_guard lock(queue_mu_);
  drop_finished_locked();
}

void Context::drop_finished_locked() noexcept {
  // By whichever thread finds them finished first, which keeps a GPU error one met (each kept once).
  std::erase_if(deferred_running_, [&](const std::shared_ptr<Submission>& s) {
    if (!s->ready()) return false;
    if (Status w = s->wait(); !w) keep_deferred_error(std::move(w));
    return true;
  });
}

Status Context::flush_deferred() noexcept {
  submit_deferred();
  return take_deferred_error();
}

Status Context::settle_deferred() noexcept {
  wait_deferred();
  return take_deferred_error();
}

void Context::keep_deferred_error(Status s) noexcept {
  std::lock_guard lock(queue_mu_);
  if (deferred_error_) deferred_error_ = std::move(s);
}

Status Context::take_deferred_error() noexcept {
  std::lock_guard lock(queue_mu_);
  return std::exchange(deferred_error_, Status{});
}

Status Context::wait_idle() noexcept {
  std::lock_guard lock(queue_mu_);
  if (VkResult r = api_.vkDeviceWaitIdle(device_); r != VK_SUCCESS) return vk_error("waiting for the GPU", r);
  return {};
}

}  // namespace colibri::vulkan
