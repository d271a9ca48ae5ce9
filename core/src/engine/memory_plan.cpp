#include "colibri/engine/memory_plan.hpp"

#include <algorithm>
#include <string>

#include "colibri/engine/kv_cache.hpp"
#include "colibri/sdk/config.hpp"

namespace colibri::engine {

using sdk::Status;
using sdk::StatusCode;

std::uint64_t expert_slot_bytes(const model::Manifest& manifest) {
  std::uint64_t slot = 0;
  for (const auto& e : manifest.experts) slot = std::max<std::uint64_t>(slot, (e.size + 4095) / 4096 * 4096);
  return slot;
}

std::uint64_t kv_host_available(std::uint64_t available, std::uint64_t expert_bytes, std::uint64_t expert_cache,
                                std::uint64_t ram_beside) {
  const std::uint64_t taken = std::min(expert_bytes, expert_cache) + ram_beside;
  return available > taken ? available - taken : 0;
}

std::int64_t largest_context(std::uint64_t budget, const std::function<std::uint64_t(std::int64_t)>& context_bytes,
                             std::int64_t model_max) {
  std::int64_t lo = 0, hi = std::max<std::int64_t>(0, model_max);  // context_bytes(lo) fits, or lo = 0
  while (lo < hi) {
    const std::int64_t mid = lo + (hi - lo + 1) / 2;
    if (context_bytes(mid) <= budget) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

KvWindows kv_windows(const model::HyperParams& hp, std::int64_t max_write, bool sliding, std::int64_t checkpoints) {
  KvWindows w;
  w.checkpoints = checkpoints;
  for (std::int64_t l = 0; !hp.linear_layers.empty() && l < hp.num_layers; ++l) {
    w.state.push_back(hp.layer_is_linear(l) ? hp.linear_state_floats() : 0);
  }
  if (!sliding || (hp.sliding_window <= 0 && hp.attention_chunk <= 0)) return w;
  w.max_write = max_write;
  // A chunked layer's query at p reads from p - p % chunk on: within the last `chunk` positions, as a window's.
  for (std::int64_t l = 0; l < hp.num_layers; ++l) {
    w.window.push_back(hp.layer_window(l) > 0 ? hp.layer_window(l) : hp.layer_chunk(l));
  }
  return w;
}

sdk::Expected<std::int64_t> kv_context(std::int64_t requested, std::uint64_t kv_cache_bytes,
                                       const std::function<std::uint64_t(std::int64_t)>& context_bytes,
                                       std::int64_t model_max, std::uint64_t host_available,
                                       const std::function<std::uint64_t(std::int64_t)>& all_bytes,
                                       std::int64_t floor) {
  if (requested > 0) {
    if (requested > model_max) {
      return Status(StatusCode::invalid_argument, "--ctx " + std::to_string(requested) +
                                                      " exceeds the model's context (" + std::to_string(model_max) +
                                                      " positions)");
    }
    return requested;
  }
  if (kv_cache_bytes > 0) {
    const auto ctx = largest_context(kv_cache_bytes, context_bytes, model_max);
    if (ctx <= 0) {
      return Status(StatusCode::invalid_argument,
                    "memory.kv_cache (" + std::to_string(kv_cache_bytes) + " bytes) holds no position; one needs " +
                        std::to_string(context_bytes(1)) + " bytes: raise memory.kv_cache, or leave it auto");
    }
    return ctx;
  }
  return std::max({std::int64_t{1}, std::min(floor, model_max),
                   largest_context(host_available / 2, all_bytes ? all_bytes : context_bytes, model_max)});
}

sdk::Status check_expert_cache(std::uint64_t expert_cache, std::uint64_t slot_bytes) {
  if (expert_cache >= slot_bytes) return {};
  std::string have = sdk::format_size(expert_cache), need = sdk::format_size(slot_bytes);
  if (have == need) {  // rounded alike: the bytes tell them apart
    have = std::to_string(expert_cache) + " bytes";
    need = std::to_string(slot_bytes) + " bytes";
  }
  return sdk::Status(sdk::StatusCode::invalid_argument, "memory.expert_cache (" + have +
                                                            ") holds no expert: one slot needs " + need +
                                                            " (the largest expert); raise it (--expert-cache-size)");
}

sdk::Expected<MemoryPlan> plan_memory(const model::Manifest& manifest, std::uint64_t expert_cache,
                                      std::uint64_t vram_budget, std::int64_t requested_context,
                                      std::uint64_t kv_cache_bytes, sdk::DType kv_type, std::uint64_t host_available,
                                      const KvWindows& windows, std::int64_t sequences,
                                      const std::function<std::uint64_t(std::int64_t)>& kv_beside,
                                      std::uint64_t ram_beside) {
  const auto& hp = manifest.hparams;
  MemoryPlan p;
  p.shared_bytes = manifest.resident_bytes();
  p.expert_bytes = manifest.expert_bytes();
  p.expert_count = manifest.experts.size();
  p.expert_cache = expert_cache;
  p.slot_bytes = expert_slot_bytes(manifest);
  p.resident = p.expert_bytes <= expert_cache;
  if (p.resident) {
    p.ram_bytes = p.expert_bytes;
  } else if (p.slot_bytes > 0) {
    if (auto s = check_expert_cache(expert_cache, p.slot_bytes); !s) return s;
    p.ram_slots = std::min<std::uint64_t>(expert_cache / p.slot_bytes, p.expert_count);
    p.ram_bytes = p.ram_slots * p.slot_bytes;
  }
  p.vram_budget = vram_budget;
  if (vram_budget > 0 && p.slot_bytes > 0) {
    p.vram_slots = std::min<std::uint64_t>(vram_budget / p.slot_bytes, p.expert_count);
    if (p.vram_slots == 0) {
      return Status(StatusCode::invalid_argument,
                    "memory.vram_budget (" + sdk::format_size(vram_budget) + ") holds no expert: one slot needs " +
                        sdk::format_size(p.slot_bytes) + "; raise it (--vram-budget) or set it to 0");
    }
    p.vram_bytes = p.vram_slots * p.slot_bytes;
  }
  if (sdk::row_bytes(kv_type, hp.kv_cache_dim()) == 0) {
    return Status(StatusCode::invalid_argument, "KV cache type " + std::string(sdk::to_string(kv_type)) +
                                                    " does not fit its rows of " + std::to_string(hp.kv_cache_dim()));
  }
  p.kv_bytes_per_position =
      KvCache::bytes_per_position(kv_type, hp.attention_layers(), hp.kv_cache_heads(), hp.kv_cache_dim(), hp.mla());
  const auto bytes = [&](std::int64_t n) {
    return KvCache::bytes_for(kv_type, hp.num_layers, hp.kv_cache_heads(), hp.kv_cache_dim(), n, windows, hp.mla());
  };
  p.kv_sequences = static_cast<std::uint64_t>(std::max<std::int64_t>(1, sequences));
  const auto all = [&](std::int64_t n) { return p.kv_sequences * (bytes(n) + (kv_beside ? kv_beside(n) : 0)); };
  auto ctx =
      kv_context(requested_context, kv_cache_bytes, bytes, hp.max_position_embeddings,
                 kv_host_available(host_available, p.expert_bytes, expert_cache, ram_beside), all, kMinAutoContext);
  if (!ctx) return ctx.error();
  p.context = *ctx;
  p.kv_bytes = bytes(p.context);
  p.kv_beside_bytes = kv_beside ? kv_beside(p.context) : 0;
  p.kv_checkpoint_bytes = KvCache::checkpoint_bytes_for(kv_type, hp.num_layers, hp.kv_cache_heads(), hp.kv_cache_dim(),
                                                        p.context, windows, hp.mla());
  for (const auto w : windows.window) {
    const auto rows = KvCache::layer_positions(w, windows.max_write, p.context);
    if (rows >= p.context) continue;
    ++p.kv_sliding_layers;
    p.kv_sliding_rows = rows;
  }
  return p;
}

}  // namespace colibri::engine
