#include "vulkan_loader.hpp"

#include <dlfcn.h>

#include <mutex>

namespace colibri::vulkan {

namespace {

void* loader_handle(std::string& error) {
  static std::once_flag once;
  static void* handle = nullptr;
  static std::string open_error;
  std::call_once(once, [] {
    handle = dlopen("libvulkan.so.1", RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* e = dlerror();
      open_error = e != nullptr ? e : "dlopen failed";
    }
  });
  error = open_error;
  return handle;
}

}  // namespace

std::string load_loader(Api& api) {
  std::string error;
  void* h = loader_handle(error);
  if (h == nullptr) return "the Vulkan loader libvulkan.so.1 cannot be opened (" + error + ")";
  api.vkGetInstanceProcAddr = reinterpret_cast<PFN_vkGetInstanceProcAddr>(dlsym(h, "vkGetInstanceProcAddr"));
  if (api.vkGetInstanceProcAddr == nullptr) return "libvulkan.so.1 has no vkGetInstanceProcAddr";
#define COLIBRI_VK_LOAD(name)                                                                \
  api.name = reinterpret_cast<PFN_##name>(api.vkGetInstanceProcAddr(VK_NULL_HANDLE, #name)); \
  if (api.name == nullptr) return "the Vulkan loader lacks " #name " (Vulkan 1.1 or newer is needed)";
  COLIBRI_VK_GLOBAL_FUNCTIONS(COLIBRI_VK_LOAD)
#undef COLIBRI_VK_LOAD
  return {};
}

std::string load_instance(Api& api, VkInstance instance) {
#define COLIBRI_VK_LOAD(name)                                                          \
  api.name = reinterpret_cast<PFN_##name>(api.vkGetInstanceProcAddr(instance, #name)); \
  if (api.name == nullptr) return #name;
  COLIBRI_VK_INSTANCE_FUNCTIONS(COLIBRI_VK_LOAD)
#undef COLIBRI_VK_LOAD
  return {};
}

std::string load_device(Api& api, VkDevice device) {
#define COLIBRI_VK_LOAD(name)                                                      \
  api.name = reinterpret_cast<PFN_##name>(api.vkGetDeviceProcAddr(device, #name)); \
  if (api.name == nullptr) return #name;
  COLIBRI_VK_DEVICE_FUNCTIONS(COLIBRI_VK_LOAD)
#undef COLIBRI_VK_LOAD
  return {};
}

const char* result_name(VkResult result) noexcept {
  switch (result) {
    case VK_SUCCESS: return "VK_SUCCESS";
    case VK_NOT_READY: return "VK_NOT_READY";
    case VK_TIMEOUT: return "VK_TIMEOUT";
    case VK_INCOMPLETE: return "VK_INCOMPLETE";
    case VK_ERROR_OUT_OF_HOST_MEMORY: return "VK_ERROR_OUT_OF_HOST_MEMORY";
    case VK_ERROR_OUT_OF_DEVICE_MEMORY: return "VK_ERROR_OUT_OF_DEVICE_MEMORY";
    case VK_ERROR_INITIALIZATION_FAILED: return "VK_ERROR_INITIALIZATION_FAILED";
    case VK_ERROR_DEVICE_LOST: return "VK_ERROR_DEVICE_LOST";
    case VK_ERROR_MEMORY_MAP_FAILED: return "VK_ERROR_MEMORY_MAP_FAILED";
    case VK_ERROR_LAYER_NOT_PRESENT: return "VK_ERROR_LAYER_NOT_PRESENT";
    case VK_ERROR_EXTENSION_NOT_PRESENT: return "VK_ERROR_EXTENSION_NOT_PRESENT";
    case VK_ERROR_FEATURE_NOT_PRESENT: return "VK_ERROR_FEATURE_NOT_PRESENT";
    case VK_ERROR_INCOMPATIBLE_DRIVER: return "VK_ERROR_INCOMPATIBLE_DRIVER";
    case VK_ERROR_TOO_MANY_OBJECTS: return "VK_ERROR_TOO_MANY_OBJECTS";
    case VK_ERROR_FORMAT_NOT_SUPPORTED: return "VK_ERROR_FORMAT_NOT_SUPPORTED";
    case VK_ERROR_UNKNOWN: return "VK_ERROR_UNKNOWN";
    case VK_ERROR_OUT_OF_POOL_MEMORY: return "VK_ERROR_OUT_OF_POOL_MEMORY";
    case VK_ERROR_INVALID_EXTERNAL_HANDLE: return "VK_ERROR_INVALID_EXTERNAL_HANDLE";
    case VK_ERROR_INVALID_OPAQUE_CAPTURE_ADDRESS: return "VK_ERROR_INVALID_OPAQUE_CAPTURE_ADDRESS";
    default: return "VkResult (unknown code)";
  }
}

}  // namespace colibri::vulkan
