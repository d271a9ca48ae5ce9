// Turning the engine's routing into trace records (--record-trace on run and bench).
#pragma once

#include <span>
#include <vector>

#include "colibri/ab/trace.hpp"
#include "colibri/engine/engine.hpp"

namespace colibri::ab {

// Appends `routing` as records of `request`; `tokens[i]` is the token at position first_position + i.
void append_routing(std::vector<TraceRecord>& out, std::int64_t request,
                    const std::vector<engine::RoutingRecord>& routing, std::span<const std::int32_t> tokens,
                    std::int64_t first_position);

// Records the routing of a finished generation by running it again from position 0 (the engine is reset): the prompt
// in one forward, in the order and steps (forward passes) of the run's prefill, then the decoded tokens in one
// forward whose records are put in decode order (position, then layer), a step per token as the run decoded them.
// Routing does not depend on how tokens are batched (the compute contract), so the trace is the run's. Call it after
// the run's statistics are taken: it moves them.
sdk::Status record_generation(engine::Engine& e, std::span<const std::int32_t> prompt,
                              std::span<const std::int32_t> decoded, std::int64_t request,
                              std::vector<TraceRecord>& out);

}  // namespace colibri::ab
