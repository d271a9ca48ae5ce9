#include "colibri/ab/record.hpp"

#include <algorithm>

namespace colibri::ab {

void append_routing(std::vector<TraceRecord>& out, std::int64_t request,
                    const std::vector<engine::RoutingRecord>& routing, std::span<const std::int32_t> tokens,
                    std::int64_t first_position) {
  for (const auto& r : routing) {
    TraceRecord t;
    t.request = request;
    t.position = r.position;
    const auto i = r.position - first_position;
    t.token = i >= 0 && i < static_cast<std::int64_t>(tokens.size()) ? tokens[static_cast<std::size_t>(i)] : -1;
    t.layer = r.layer;
    t.step = r.step;
    t.experts = r.experts;
    t.weights = r.weights;
    out.push_back(std::move(t));
  }
}

sdk::Status record_generation(engine::Engine& e, std::span<const std::int32_t> prompt,
                              std::span<const std::int32_t> decoded, std::int64_t request,
                              std::vector<TraceRecord>& out) {
  e.reset();
  std::vector<float> logits;
  std::vector<engine::RoutingRecord> routing;
  if (auto s = e.forward(prompt, engine::LogitsWanted::none, logits, &routing); !s) return s;
  // The engine's step counter runs on from the generation this re-runs: the trace's steps start after what `out`
  // holds (0 for a new trace), as a replay of this request alone would count them.
  const std::size_t first = out.size();
  const std::int64_t base = out.empty() ? 0 : out.back().step + 1;
  append_routing(out, request, routing, prompt, 0);
  if (first < out.size()) {
    const std::int64_t shift = base - out[first].step;
    for (std::size_t i = first; i < out.size(); ++i) out[i].step += shift;
  }
  if (decoded.empty()) return {};
  routing.clear();
  if (auto s = e.forward(decoded, engine::LogitsWanted::none, logits, &routing); !s) return s;
  std::stable_sort(routing.begin(), routing.end(), [](const auto& a, const auto& b) {
    return a.position != b.position ? a.position < b.position : a.layer < b.layer;
  });
  // The run decoded one token per forward pass: one step per position, after the prompt's.
  const std::int64_t after_prompt = out.empty() ? 0 : out.back().step + 1;
  for (auto& r : routing) r.step = after_prompt + (r.position - static_cast<std::int64_t>(prompt.size()));
  append_routing(out, request, routing, decoded, static_cast<std::int64_t>(prompt.size()));
  return {};
}

}  // namespace colibri::ab
