// The Vulkan loader opened at run time with dlopen: the plugin does not link libvulkan, so it
// loads anywhere and can report a missing loader or driver as a score of 0 with the reason.
#pragma once

#define VK_NO_PROTOTYPES
#include <vulkan/vulkan.h>

#include <string>

namespace colibri::vulkan {

#define COLIBRI_VK_GLOBAL_FUNCTIONS(X) \
  X(vkCreateInstance)                  \
  X(vkEnumerateInstanceVersion)        \
  X(vkEnumerateInstanceExtensionProperties)

#define COLIBRI_VK_INSTANCE_FUNCTIONS(X)      \
  X(vkDestroyInstance)                        \
  X(vkEnumeratePhysicalDevices)               \
  X(vkGetPhysicalDeviceProperties)            \
  X(vkGetPhysicalDeviceProperties2)           \
  X(vkGetPhysicalDeviceFeatures2)             \
  X(vkGetPhysicalDeviceMemoryProperties)      \
  X(vkGetPhysicalDeviceMemoryProperties2)     \
  X(vkGetPhysicalDeviceQueueFamilyProperties) \
  X(vkEnumerateDeviceExtensionProperties)     \
  X(vkCreateDevice)                           \
  X(vkGetDeviceProcAddr)

#define COLIBRI_VK_DEVICE_FUNCTIONS(X) \
  X(vkDestroyDevice)                   \
  X(vkGetDeviceQueue)                  \
  X(vkDeviceWaitIdle)                  \
  X(vkCreateBuffer)                    \
  X(vkDestroyBuffer)                   \
  X(vkGetBufferMemoryRequirements)     \
  X(vkGetBufferDeviceAddress)          \
  X(vkAllocateMemory)                  \
  X(vkFreeMemory)                      \
  X(vkBindBufferMemory)                \
  X(vkMapMemory)                       \
  X(vkUnmapMemory)                     \
  X(vkFlushMappedMemoryRanges)         \
  X(vkInvalidateMappedMemoryRanges)    \
  X(vkCreateShaderModule)              \
  X(vkDestroyShaderModule)             \
  X(vkCreatePipelineLayout)            \
  X(vkDestroyPipelineLayout)           \
  X(vkCreateComputePipelines)          \
  X(vkDestroyPipeline)                 \
  X(vkCreateCommandPool)               \
  X(vkDestroyCommandPool)              \
  X(vkAllocateCommandBuffers)          \
  X(vkFreeCommandBuffers)              \
  X(vkBeginCommandBuffer)              \
  X(vkEndCommandBuffer)                \
  X(vkCmdBindPipeline)                 \
  X(vkCmdPushConstants)                \
  X(vkCmdDispatch)                     \
  X(vkCmdPipelineBarrier)              \
  X(vkCmdCopyBuffer)                   \
  X(vkQueueSubmit)                     \
  X(vkCreateFence)                     \
  X(vkDestroyFence)                    \
  X(vkWaitForFences)                   \
  X(vkGetFenceStatus)

// Function pointers of one instance and one device; filled by load_instance / load_device.
struct Api {
#define COLIBRI_VK_DECLARE(name) PFN_##name name = nullptr;
  COLIBRI_VK_GLOBAL_FUNCTIONS(COLIBRI_VK_DECLARE)
  COLIBRI_VK_INSTANCE_FUNCTIONS(COLIBRI_VK_DECLARE)
  COLIBRI_VK_DEVICE_FUNCTIONS(COLIBRI_VK_DECLARE)
#undef COLIBRI_VK_DECLARE
  PFN_vkGetInstanceProcAddr vkGetInstanceProcAddr = nullptr;
  PFN_vkGetMemoryHostPointerPropertiesEXT vkGetMemoryHostPointerPropertiesEXT = nullptr;  // optional
};

// Opens libvulkan.so.1 (once per process; never closed) and fills the global functions. Returns
// an empty string on success, else why not.
std::string load_loader(Api& api);
// Fills the instance-level functions; returns the name of the first missing one, or "".
std::string load_instance(Api& api, VkInstance instance);
std::string load_device(Api& api, VkDevice device);

// A zeroed Vulkan info struct with its sType set.
template <typename T>
T make_info(VkStructureType type) noexcept {
  T t{};
  t.sType = type;
  return t;
}

// "VK_ERROR_OUT_OF_DEVICE_MEMORY" for a result code.
const char* result_name(VkResult result) noexcept;

}  // namespace colibri::vulkan
