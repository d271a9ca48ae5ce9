#include "vulkan_shaders.hpp"

namespace colibri::vulkan {

namespace {

struct ShaderEntry {
  std::string_view name;
  std::span<const std::uint32_t> words;
};

#include "shader_table.inc"

}  // namespace

std::span<const std::uint32_t> shader_spirv(std::string_view name) noexcept {
  for (const auto& s : kShaders) {
    if (s.name == name) return s.words;
  }
  return {};
}

}  // namespace colibri::vulkan
