#version 460
// Routing top-k, one invocation per token (E is small). Scores are raw logits, a softmax over
// all E, or sigmoids. Pick i takes the best (score, id) after pick i-1 in the order "higher score,
// then lower id", so ties go to the lower expert id and ids come out by descending weight.
// BIASED (topk_routing_biased): the order is by score + bias[id] instead, each weight is still the
// score, divided by (sum + 1e-20) with renormalize, then times scale.
// GROUPED (with BIASED; topk_routing_grouped): only the experts of the groups_used best of the groups
// (E / groups consecutive experts each) compete; a group scores the sum of its two highest
// score + bias (its highest alone with group_max), ties to the lower group.
#include "common.glsl"

layout(local_size_x = 64) in;

layout(push_constant) uniform Params {
  uint64_t logits;   // {E, T}
  uint64_t ids;      // {k, T} i32
  uint64_t weights;  // {k, T} f32
  uint e;
  uint t;
  uint k;
  uint mode;  // 0 raw, 1 softmax, 2 sigmoid
  uint renormalize;
#ifdef BIASED
  float scale;    // times every weight, last
  uint64_t bias;  // {E} f32: added to the scores to pick, never to the weights
#endif
#ifdef GROUPED
  uint groups;       // of E / groups experts each
  uint groups_used;  // the best groups, whose experts compete
  uint group_max;    // 1: a group scores its highest score + bias alone (kRoutingGroupMax)
  uint pad;
#endif
}
p;

float score(uint base, uint i, float mx, float sum) {
  const float l = Floats(p.logits).v[base + i];
  if (p.mode == 1u) {
    precise float v = exp(l - mx) / sum;
    return v;
  }
  if (p.mode == 2u) {
    precise float v = 1.0 / (1.0 + exp(-l));
    return v;
  }
  return l;
}

#ifdef GROUPED
// Group g's score from its experts' score + bias (the same precise sums the picks rank by): the two highest added,
// the higher first, or the highest alone. Starts from the group's first two (no infinities; groups of one need
// group_max, which check_op_call enforces).
float group_score(uint base, uint g, uint per, float mx, float sum) {
  const uint first = g * per;
  precise float hi = score(base, first, mx, sum) + Floats(p.bias).v[first];
  if (p.group_max != 0u && per == 1u) return hi;
  precise float lo = score(base, first + 1u, mx, sum) + Floats(p.bias).v[first + 1u];
  if (lo > hi) {
    const float swap = hi;
    hi = lo;
    lo = swap;
  }
  for (uint i = first + 2u; i < first + per; ++i) {
    precise float key = score(base, i, mx, sum) + Floats(p.bias).v[i];
    if (key > hi) {
      lo = hi;
      hi = key;
    } else if (key > lo) {
      lo = key;
    }
  }
  precise float two = hi + lo;
  return p.group_max != 0u ? hi : two;
}
#endif

void main() {
  const uint tok = gl_GlobalInvocationID.x;
  if (tok >= p.t) return;
  const uint base = tok * p.e;
  const uint obase = tok * p.k;
  // A NaN logit: every pick of the token is id -1 with weight NaN (compute.hpp), which the engine reports. Tested on
  // the bits: without SignedZeroInfNanPreserve a driver may assume no NaN and fold isnan() to false.
  for (uint i = 0u; i < p.e; ++i) {
    if ((floatBitsToUint(Floats(p.logits).v[base + i]) & 0x7FFFFFFFu) > 0x7F800000u) {
      for (uint pick = 0u; pick < p.k; ++pick) {
        Ints(p.ids).v[obase + pick] = -1;
        Floats(p.weights).v[obase + pick] = uintBitsToFloat(0x7FC00000u);
      }
      return;
    }
  }
  float mx = Floats(p.logits).v[base];
  for (uint i = 1u; i < p.e; ++i) mx = max(mx, Floats(p.logits).v[base + i]);
  precise float sum = 0.0;
  if (p.mode == 1u) {
    for (uint i = 0u; i < p.e; ++i) sum = sum + exp(Floats(p.logits).v[base + i] - mx);
  }

#ifdef GROUPED
  // The last of the groups_used best groups in (group score desc, group asc) order, found as the picks are: a group
  // competes iff it ranks at or before it. Every group competes when all are used.
  const uint per = p.e / p.groups;
  const bool every_group = p.groups_used >= p.groups;
  float last_gs = 0.0;
  uint last_g = 0u;
  for (uint gp = 0u; !every_group && gp < p.groups_used; ++gp) {
    float best_gs = 0.0;
    uint best_g = 0xFFFFFFFFu;
    for (uint g = 0u; g < p.groups; ++g) {
      const float gs = group_score(base, g, per, mx, sum);
      const bool after_prev = gp == 0u || gs < last_gs || (gs == last_gs && g > last_g);
      if (after_prev && (best_g == 0xFFFFFFFFu || gs > best_gs)) {
        best_gs = gs;
        best_g = g;
      }
    }
    last_gs = best_gs;
    last_g = best_g;
  }
#endif

  // Picks are ranked by key (the score, or score + bias when BIASED); the weight is the score.
  float prev_key = 0.0;
  uint prev_id = 0u;
  precise float chosen_sum = 0.0;
  for (uint pick = 0u; pick < p.k; ++pick) {
    float best_key = 0.0;
    float best_s = 0.0;
    uint best_id = 0xFFFFFFFFu;
    for (uint i = 0u; i < p.e; ++i) {
#ifdef GROUPED
      if (!every_group && i % per == 0u) {
        const uint g = i / per;
        const float gs = group_score(base, g, per, mx, sum);
        if (!(gs > last_gs || (gs == last_gs && g <= last_g))) {
          i += per - 1u;  // a losing group: none of its experts is picked
          continue;
        }
      }
#endif
      const float s = score(base, i, mx, sum);
#ifdef BIASED
      precise float key = s + Floats(p.bias).v[i];
#else
      const float key = s;
#endif
      const bool after_prev = pick == 0u || key < prev_key || (key == prev_key && i > prev_id);
      if (after_prev && (best_id == 0xFFFFFFFFu || key > best_key)) {
        best_key = key;
        best_s = s;
        best_id = i;
      }
    }
    Ints(p.ids).v[obase + pick] = int(best_id);
    Floats(p.weights).v[obase + pick] = best_s;
    chosen_sum = chosen_sum + best_s;
    prev_key = best_key;
    prev_id = best_id;
  }
  if (p.renormalize != 0u) {
#ifdef BIASED
    chosen_sum = chosen_sum + 1e-20;  // HF's biased routers: w / (sum + 1e-20)
#endif
    for (uint pick = 0u; pick < p.k; ++pick) {
      precise float v = Floats(p.weights).v[obase + pick] / chosen_sum;
      Floats(p.weights).v[obase + pick] = v;
    }
  }
#ifdef BIASED
  for (uint pick = 0u; pick < p.k; ++pick) {
    precise float v = Floats(p.weights).v[obase + pick] * p.scale;
    Floats(p.weights).v[obase + pick] = v;
  }
#endif
}
