// What backends of the compute kind share around run(): the standard type sets, supports() for a backend that
// runs every op with them, and the host-side validation of an OpCall with errors that name the op and tensor.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "colibri/sdk/compute.hpp"

namespace colibri::sdk {

// Weight types of matmul, expert_ffn and embedding that every in-tree backend runs: f32, f16, bf16, q8_0, q4_0,
// q2_k .. q6_k.
[[nodiscard]] bool is_weight_type(DType type) noexcept;
// Optional weight types: mxfp4 (gpt-oss's experts, kept bit-exact at 4.25 bits per weight). check_op_call accepts
// them for matmul, matmul_heads and the expert ops (expert_ffn, expert_ffn_clamped and their groups; not embedding),
// but no backend has to run them: one that does says so in its own supports(), and supports_every_op never does. The
// engine asks supports() before it places such a weight on a backend.
[[nodiscard]] bool is_optional_weight_type(DType type) noexcept;
// KV cache row types of attention: f32, f16, q8_0.
[[nodiscard]] bool is_kv_type(DType type) noexcept;
// Compute::supports() of a backend that runs every required op: weights of is_weight_type, KV of is_kv_type, f32
// otherwise; false for the optional ops (expert_ffn_group, attention_sinks, expert_ffn_clamped and its group,
// expert_ffn_routed, topk_routing_biased, concat_rows, matmul_heads, topk_routing_grouped) and the optional weight
// types (is_optional_weight_type), which a backend claims itself once it implements them.
[[nodiscard]] bool supports_every_op(Op op, DType weight_type) noexcept;

// "f32 {4096, 7, 1, 1}": a tensor's type and all four dims, for messages.
[[nodiscard]] std::string shape_text(const Tensor& t);

// The checks a device backend makes on the host before it dispatches `call`, so a bad call is an error naming the
// op and tensor instead of a device fault: input and output counts, types (weights of is_weight_type, and for
// matmul, matmul_heads and the expert ops also of is_optional_weight_type; KV of is_kv_type), shapes and parameter
// ranges as compute.hpp states them, and the limits device kernels share (32-bit element indices: no tensor, F x T
// of expert_ffn or embedding table of 2^31 or more; head_dim <= 576). Unsupported types and ops name `backend`:
// "matmul: weight type q4_1 is not supported by cuda". An optional weight type passes: whether this backend runs
// it is its supports()'s answer, and one that does not must still answer such a call with an error (the
// conformance suite checks it). Grid-size limits are the backend's own. Buffers and addresses are not looked at.
[[nodiscard]] Status check_op_call(const OpCall& call, std::string_view backend);

// Bytes of `t` when it has a known type, every dim >= 1 and rows of whole blocks; else an invalid_argument error
// "<op>: <what> has a non-positive dimension: f32 {0, 1, 1, 1}" (`what` names the tensor: "W", "X", ...).
[[nodiscard]] Expected<std::size_t> checked_bytes(const Tensor& t, std::string_view op, std::string_view what);
// Whether the `bytes` of `t` lie inside t.buffer from t.offset on, at an offset that suits its type
// (data_alignment); else "<op>: <what> f32 {..} needs N bytes at offset O but its buffer holds S", or "... starts at
// offset O, not a multiple of 4 as f32 data needs".
[[nodiscard]] Status check_buffer_range(const Tensor& t, std::size_t bytes, std::string_view op, std::string_view what);

}  // namespace colibri::sdk
