#version 460
// expert_ffn_routed on the device (one token, nothing read back): takes the router's choice where topk_routing left
// it, orders the picks by ascending expert id (the engine's combine order) and writes, per pick in that order, the
// addresses of its expert's gate, up and down weights (which the matmuls read with w_indirect) and its weight. A pick
// outside the experts or a repeated one marks the token: every weight NaN (with expert 0's addresses), so its column
// is NaN, which the engine reports when it reads the choice.
#include "common.glsl"

layout(local_size_x = 1) in;

layout(push_constant) uniform Params {
  uint64_t ids;      // {k} i32, as topk_routing lists them
  uint64_t weights;  // {k} f32
  uint64_t table;    // {3, E} addresses: gate, up, down of each expert
  uint64_t slots;    // out {3, k} addresses, by ascending expert id
  uint64_t sorted;   // out {k} f32 weights, in the same order
  uint k;            // at most kMaxPicks (the host routes more itself)
  uint e;
}
p;

const uint kMaxPicks = 64u;

void main() {
  int id[kMaxPicks];
  uint pick[kMaxPicks];
  bool marked = false;
  for (uint j = 0u; j < p.k; ++j) {  // insertion sort: k is small
    const int v = Ints(p.ids).v[j];
    marked = marked || v < 0 || v >= int(p.e);
    uint i = j;
    while (i > 0u && id[i - 1u] > v) {
      id[i] = id[i - 1u];
      pick[i] = pick[i - 1u];
      --i;
    }
    id[i] = v;
    pick[i] = j;
  }
  for (uint i = 1u; i < p.k; ++i) marked = marked || id[i] == id[i - 1u];
  for (uint i = 0u; i < p.k; ++i) {
    const uint e = marked ? 0u : uint(id[i]);
    for (uint r = 0u; r < 3u; ++r) Addresses(p.slots).v[3u * i + r] = Addresses(p.table).v[3u * e + r];
    Floats(p.sorted).v[i] = marked ? uintBitsToFloat(0x7FC00000u) : Floats(p.weights).v[pick[i]];
  }
}
