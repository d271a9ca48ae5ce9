// What a model will take where under a profile's memory keys, from its manifest alone (colibri-cli profile show
// --model prints it before anything is loaded). The engine sizes its tiers and its KV cache with these same functions.
#pragma once

#include <cstdint>
#include <functional>

#include "colibri/engine/kv_cache.hpp"
#include "colibri/model/manifest.hpp"
#include "colibri/sdk/dtype.hpp"
#include "colibri/sdk/status.hpp"

namespace colibri::engine {

// One expert slot: the largest expert blob rounded up to 4 KiB (the RAM tier's slots when streaming, the VRAM tier's).
[[nodiscard]] std::uint64_t expert_slot_bytes(const model::Manifest& manifest);

// A streaming RAM tier (memory.expert_cache below every expert's bytes) needs room for at least one slot; the error
// names the key, the flag and the sizes.
[[nodiscard]] sdk::Status check_expert_cache(std::uint64_t expert_cache, std::uint64_t slot_bytes);

// The KV cache's positions: `requested` (--ctx; at most the model's), else as many as memory.kv_cache holds (at
// most the model's), else as many as half of `host_available` holds (at least 1, at most the model's).
// context_bytes(n): a context of n positions' bytes (sliding-window layers cost a fixed amount past their rows);
// all_bytes(n), when given, what the automatic context must fit instead: every cache of n positions held at once (a
// server's sequences, a draft model's); it is at least min(floor, model_max). Errors name the flag or key.
sdk::Expected<std::int64_t> kv_context(std::int64_t requested, std::uint64_t kv_cache_bytes,
                                       const std::function<std::uint64_t(std::int64_t)>& context_bytes,
                                       std::int64_t model_max, std::uint64_t host_available,
                                       const std::function<std::uint64_t(std::int64_t)>& all_bytes = {},
                                       std::int64_t floor = 1);
// The automatic context's floor (kv_context's `floor`; at most the model's): below it a model is of little use, so a
// RAM tier that leaves less beside it is warned about instead. Below it, too, a KV cache does not move to a device.
inline constexpr std::int64_t kMinAutoContext = 2048;
// The RAM an automatic context may take half of: what is available less what the RAM expert tier will fill
// (min(expert_bytes, expert_cache): its pages are taken as experts are read, after the context is sized) and what
// `ram_beside` another engine opened after it takes (EngineOptions::ram_beside: a draft model's weights).
[[nodiscard]] std::uint64_t kv_host_available(std::uint64_t available, std::uint64_t expert_bytes,
                                              std::uint64_t expert_cache, std::uint64_t ram_beside = 0);
// The most positions (0..model_max) whose bytes fit `budget`; context_bytes grows with the positions.
[[nodiscard]] std::int64_t largest_context(std::uint64_t budget,
                                           const std::function<std::uint64_t(std::int64_t)>& context_bytes,
                                           std::int64_t model_max);

// memory.kv_checkpoints' default: a prompt's end, its generation prompt's, its last message's and its system prompt's.
inline constexpr std::int64_t kDefaultKvCheckpoints = 4;

// The model's sliding-window layers for its KV cache (memory.kv_sliding_window), with writes of up to max_write
// positions (none where `sliding` is off), its recurrent layers' states, and the checkpoints a cache keeps.
[[nodiscard]] KvWindows kv_windows(const model::HyperParams& hp, std::int64_t max_write, bool sliding,
                                   std::int64_t checkpoints = kDefaultKvCheckpoints);

struct MemoryPlan {
  std::uint64_t shared_bytes = 0;  // shared.bin: host RAM, or a discrete GPU's memory (memory.shared_on_device)
  std::uint64_t expert_bytes = 0;  // every routed expert
  std::uint64_t expert_count = 0;
  std::uint64_t expert_cache = 0;           // memory.expert_cache, resolved
  bool resident = false;                    // every expert fits: loaded at start, never evicted
  std::uint64_t slot_bytes = 0;             // one expert slot (RAM when streaming, VRAM)
  std::uint64_t ram_slots = 0;              // streaming: slots the RAM tier holds
  std::uint64_t ram_bytes = 0;              // RAM the expert tier takes at most
  std::uint64_t vram_budget = 0;            // memory.vram_budget
  std::uint64_t vram_slots = 0;             // experts the VRAM tier holds
  std::uint64_t vram_bytes = 0;             // device memory its slots take
  std::int64_t context = 0;                 // KV cache positions
  std::uint64_t kv_bytes_per_position = 0;  // every layer
  std::uint64_t kv_bytes = 0;
  std::int64_t kv_sliding_layers = 0;     // layers that keep only their window's rows
  std::int64_t kv_sliding_rows = 0;       // the rows each of them keeps
  std::uint64_t kv_checkpoint_bytes = 0;  // of kv_bytes: the most its checkpoints take (memory.kv_checkpoints)
  std::uint64_t kv_sequences = 1;         // caches of kv_bytes held at once (the server's --max-batch)
  std::uint64_t kv_beside_bytes = 0;      // beside each of them: a draft model's cache of the context
};

// Errors as the engine would give them at load (a context over the model's, a RAM or VRAM budget below one slot).
// `sequences`: KV caches held at once (EngineOptions::kv_sequences), which an automatic context fits together, each
// with `kv_beside` bytes of n positions beside it (EngineOptions::kv_beside: a draft model's); `ram_beside` as
// kv_host_available's.
sdk::Expected<MemoryPlan> plan_memory(const model::Manifest& manifest, std::uint64_t expert_cache,
                                      std::uint64_t vram_budget, std::int64_t requested_context,
                                      std::uint64_t kv_cache_bytes, sdk::DType kv_type, std::uint64_t host_available,
                                      const KvWindows& windows = {}, std::int64_t sequences = 1,
                                      const std::function<std::uint64_t(std::int64_t)>& kv_beside = {},
                                      std::uint64_t ram_beside = 0);

}  // namespace colibri::engine
