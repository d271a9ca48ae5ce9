// SPIR-V of every shader, compiled by glslc at build time and embedded (see CMakeLists.txt).
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

namespace colibri::vulkan {

// The words of the shader called `name` ("matmul_q4_k", "rope", ...); empty when there is none.
std::span<const std::uint32_t> shader_spirv(std::string_view name) noexcept;

}  // namespace colibri::vulkan
