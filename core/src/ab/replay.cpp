#include "colibri/ab/replay.hpp"

#include <algorithm>
#include <limits>
#include <set>
#include <unordered_set>

namespace colibri::ab {

using sdk::ExpertKey;
using sdk::Status;
using sdk::StatusCode;

namespace {

std::string key_name(ExpertKey k) {
  return "L" + std::to_string(k.layer) + "/E" + std::to_string(k.expert);
}

constexpr std::uint64_t kSlotAlign = 4096;  // the manager's AlignedBuffer granularity

}  // namespace

std::optional<std::uint64_t> ExpertSizes::read_bytes(ExpertKey k) const {
  if (manifest_ == nullptr) return bytes_;
  const auto* e = manifest_->expert(k.layer, k.expert);
  if (e == nullptr) return std::nullopt;
  return e->size;
}

std::optional<std::uint64_t> ExpertSizes::slot_bytes(ExpertKey k) const {
  auto r = read_bytes(k);
  if (!r) return std::nullopt;
  if (manifest_ == nullptr && bytes_ == 0) return 1;
  return (*r + kSlotAlign - 1) / kSlotAlign * kSlotAlign;
}

CacheSim::CacheSim(std::shared_ptr<sdk::CachePolicy> policy, std::uint64_t budget_bytes, const ExpertSizes& sizes,
                   std::vector<ExpertKey> universe)
    : policy_(std::move(policy)), budget_(budget_bytes), sizes_(sizes), universe_(std::move(universe)) {
  std::uint64_t all = 0;
  for (auto k : universe_) all += sizes_.known() ? sizes_.read_bytes(k).value_or(0) : 1;
  resident_ = all <= budget_;
  if (!resident_ && sizes_.known()) {
    // As the expert manager: when streaming, every slot has the largest expert's size.
    for (auto k : universe_) stream_slot_ = std::max(stream_slot_, sizes_.slot_bytes(k).value_or(0));
  }
}

std::uint64_t CacheSim::slot_of(ExpertKey key) const {
  return stream_slot_ != 0 ? stream_slot_ : *sizes_.slot_bytes(key);
}

CacheSim::~CacheSim() {
  if (policy_) policy_->clear();
}

Status CacheSim::preload() {
  if (policy_) {
    for (const auto key : policy_->wanted_pins()) {
      if (!sizes_.read_bytes(key)) {
        return Status(StatusCode::invalid_argument,
                      "cache.pinned_experts names " + key_name(key) + ", which this model does not have");
      }
      auto hit = acquire(key);
      if (!hit) return hit.error();
      if (!*hit) ++stats_.preload_loads;
      release(key);
      auto& slot = slots_[key.packed()];
      if (!slot.pinned) {
        slot.pinned = true;
        policy_->on_pin(key, true);
      }
    }
  }
  if (!resident_) return {};
  for (const auto key : universe_) {
    if (slots_.count(key.packed()) != 0) continue;
    Slot slot;
    slot.bytes = slot_of(key);
    used_ += slot.bytes;
    stats_.bytes_read += *sizes_.read_bytes(key);
    ++stats_.preload_loads;
    slots_.emplace(key.packed(), slot);
    if (policy_) policy_->on_insert(key, *sizes_.read_bytes(key));
  }
  return {};
}

bool CacheSim::evictable(void* ctx, ExpertKey key) noexcept {
  auto* self = static_cast<CacheSim*>(ctx);
  auto it = self->slots_.find(key.packed());
  return it != self->slots_.end() && it->second.in_use == 0 && !it->second.pinned;
}

Status CacheSim::make_room(std::uint64_t bytes) {
  while (used_ + bytes > budget_) {
    std::optional<ExpertKey> victim;
    if (policy_) victim = policy_->pick_victim(sdk::EvictablePredicate{&CacheSim::evictable, this});
    if (!victim || !evictable(this, *victim)) {
      return Status(StatusCode::out_of_memory,
                    "a cache of " + std::to_string(budget_) + " bytes cannot hold the experts one layer needs at once");
    }
    auto it = slots_.find(victim->packed());
    used_ -= it->second.bytes;
    slots_.erase(it);
    policy_->on_erase(*victim);
    ++stats_.evictions;
  }
  return {};
}

sdk::Expected<bool> CacheSim::acquire(ExpertKey key) {
  auto it = slots_.find(key.packed());
  if (it != slots_.end()) {
    ++stats_.hits;
    ++it->second.in_use;
    if (policy_) policy_->on_access(key);
    return true;
  }
  const auto read = sizes_.read_bytes(key);
  if (!read) return Status(StatusCode::not_found, "the manifest has no expert " + key_name(key));
  const auto slot_bytes = slot_of(key);
  if (auto s = make_room(slot_bytes); !s) return s;
  ++stats_.misses;
  stats_.bytes_read += *read;
  Slot slot;
  slot.bytes = slot_bytes;
  slot.in_use = 1;
  used_ += slot_bytes;
  slots_.emplace(key.packed(), slot);
  if (policy_) {
    policy_->on_insert(key, *read);
    policy_->on_access(key);  // read for this use, as the expert manager tells it
  }
  return false;
}

void CacheSim::release(ExpertKey key) {
  auto it = slots_.find(key.packed());
  if (it != slots_.end() && it->second.in_use > 0) --it->second.in_use;
}

AccessSequence AccessSequence::from_trace(const std::vector<TraceRecord>& trace) {
  AccessSequence s;
  s.begin.reserve(trace.size() + 1);
  for (const auto& r : trace) {
    s.begin.push_back(s.keys.size());
    for (auto e : r.experts) {
      s.keys.push_back({static_cast<std::uint32_t>(r.layer), static_cast<std::uint32_t>(e)});
    }
    s.layers = std::max(s.layers, static_cast<std::uint32_t>(r.layer) + 1);
  }
  s.begin.push_back(s.keys.size());
  return s;
}

std::vector<ExpertKey> universe_of(const AccessSequence& seq, const ExpertSizes& sizes) {
  std::vector<ExpertKey> out;
  if (const auto* m = sizes.manifest()) {
    for (const auto& e : m->experts) {
      out.push_back({static_cast<std::uint32_t>(e.layer), static_cast<std::uint32_t>(e.expert)});
    }
    return out;
  }
  std::unordered_set<std::uint64_t> seen;
  for (auto k : seq.keys) {
    if (seen.insert(k.packed()).second) out.push_back(k);
  }
  std::sort(out.begin(), out.end());
  return out;
}

sdk::Expected<ReplayResult> replay(const AccessSequence& seq, std::shared_ptr<sdk::CachePolicy> policy,
                                   std::string name, std::uint64_t budget_bytes, const ExpertSizes& sizes,
                                   const std::vector<ExpertKey>& universe) {
  ReplayResult out;
  out.policy = std::move(name);
  out.accesses = seq.keys.size();
  out.per_layer.resize(seq.layers);
  CacheSim sim(std::move(policy), budget_bytes, sizes, universe);
  if (auto s = sim.preload(); !s) return s;
  const SimStats before = sim.stats();
  for (std::size_t r = 0; r < seq.records(); ++r) {
    for (auto i = seq.begin[r]; i < seq.begin[r + 1]; ++i) {
      const auto k = seq.keys[i];
      auto hit = sim.acquire(k);
      if (!hit) {
        return hit.error().with_context("replaying record " + std::to_string(r + 1) + " (layer " +
                                        std::to_string(k.layer) + ")");
      }
      auto& l = out.per_layer[k.layer];
      if (*hit) {
        ++l.hits;
      } else {
        ++l.misses;
        l.bytes_read += sizes.read_bytes(k).value_or(0);
      }
    }
    for (auto i = seq.begin[r]; i < seq.begin[r + 1]; ++i) sim.release(seq.keys[i]);
  }
  out.stats = sim.stats();
  // Trace accesses only; preload reads stay in preload_loads and bytes_read.
  out.stats.hits -= before.hits;
  out.stats.misses -= before.misses;
  return out;
}

sdk::Expected<ReplayResult> belady(const AccessSequence& seq, std::uint64_t slots, const ExpertSizes& sizes) {
  constexpr auto kNever = std::numeric_limits<std::uint64_t>::max();
  const auto n = seq.keys.size();
  // next_use[i]: the next access index of the same expert after i.
  std::vector<std::uint64_t> next_use(n, kNever);
  {
    std::unordered_map<std::uint64_t, std::uint64_t> last;
    last.reserve(4096);
    for (std::size_t i = n; i-- > 0;) {
      auto [it, fresh] = last.try_emplace(seq.keys[i].packed(), i);
      if (!fresh) {
        next_use[i] = it->second;
        it->second = i;
      }
    }
  }
  ReplayResult out;
  out.policy = "optimal";
  out.accesses = n;
  out.per_layer.resize(seq.layers);
  std::unordered_map<std::uint64_t, std::uint64_t> resident;  // key -> its next use
  std::set<std::pair<std::uint64_t, std::uint64_t>, std::greater<>> by_next;
  std::vector<std::uint64_t> current;  // keys of the record being replayed (in use)
  for (std::size_t r = 0; r < seq.records(); ++r) {
    current.clear();
    for (auto i = seq.begin[r]; i < seq.begin[r + 1]; ++i) {
      const auto key = seq.keys[i].packed();
      auto& l = out.per_layer[seq.keys[i].layer];
      auto it = resident.find(key);
      if (it != resident.end()) {
        ++out.stats.hits;
        ++l.hits;
        by_next.erase({it->second, key});
        it->second = next_use[i];
        by_next.insert({next_use[i], key});
      } else {
        if (resident.size() >= slots) {
          auto victim = by_next.begin();
          while (victim != by_next.end() &&
                 std::find(current.begin(), current.end(), victim->second) != current.end()) {
            ++victim;
          }
          if (victim == by_next.end()) {
            return Status(StatusCode::out_of_memory, "a cache of " + std::to_string(slots) +
                                                         " experts cannot hold the experts of record " +
                                                         std::to_string(r + 1) + " at once");
          }
          resident.erase(victim->second);
          by_next.erase(victim);
          ++out.stats.evictions;
        }
        const auto bytes = sizes.read_bytes(seq.keys[i]).value_or(0);
        ++out.stats.misses;
        ++l.misses;
        out.stats.bytes_read += bytes;
        l.bytes_read += bytes;
        resident.emplace(key, next_use[i]);
        by_next.insert({next_use[i], key});
      }
      current.push_back(key);
    }
  }
  return out;
}

}  // namespace colibri::ab
