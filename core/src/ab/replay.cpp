#include "colibri/ab/replay.hpp"

#include <algorithm>
#include <limits>
#include <numeric>
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
  if (it == self->slots_.end() || it->second.in_use != 0 || it->second.pinned) return false;
  // A read not yet told to the policy is still in flight in the manager: not evictable.
  return std::find(self->untold_.begin(), self->untold_.end(), key) == self->untold_.end();
}

bool CacheSim::evictable_sparing(void* ctx, ExpertKey key) noexcept {
  auto* self = static_cast<CacheSim*>(ctx);
  if (!evictable(ctx, key) || self->slots_.at(key.packed()).fetched) return false;
  return std::find(self->sparing_.begin(), self->sparing_.end(), key) == self->sparing_.end();
}

bool CacheSim::ready(ExpertKey key) const {
  auto it = slots_.find(key.packed());
  return it != slots_.end() && !it->second.fetched;
}

Status CacheSim::make_room(std::uint64_t bytes) {
  const auto ok = sparing_.empty() ? &CacheSim::evictable : &CacheSim::evictable_sparing;
  while (used_ + bytes > budget_) {
    std::optional<ExpertKey> victim;
    if (policy_) victim = policy_->pick_victim(sdk::EvictablePredicate{ok, this});
    if (!victim || !ok(this, *victim)) {
      std::size_t pinned = 0, could_go = 0;
      for (const auto& [key, slot] : slots_) {
        pinned += slot.pinned ? 1 : 0;
        could_go += ok(this, ExpertKey::unpack(key)) ? 1 : 0;
      }
      if (policy_ && could_go > 0) {  // something could go, but the policy named nothing usable: its fault
        return Status(StatusCode::internal,
                      "the policy named " +
                          (victim ? "L" + std::to_string(victim->layer) + "/E" + std::to_string(victim->expert) +
                                        ", which cannot be evicted,"
                                  : std::string("no victim")) +
                          " while " + std::to_string(could_go) +
                          " cached experts could be; its pick_victim() must return one the predicate accepts");
      }
      std::string msg =
          "a cache of " + std::to_string(budget_) + " bytes cannot hold the experts one layer needs at once";
      if (pinned > 0) {
        msg += ", or pins more experts than it has room for: the " + std::to_string(pinned) +
               " pinned so far fill it; give a larger --cache-experts or pin fewer experts";
      }
      return Status(StatusCode::out_of_memory, msg);
    }
    auto it = slots_.find(victim->packed());
    used_ -= it->second.bytes;
    slots_.erase(it);
    policy_->on_erase(*victim);
    ++stats_.evictions;
  }
  return {};
}

std::size_t CacheSim::fetch(std::span<const ExpertKey> needed) {
  if (resident_) return 0;
  tell_fetched();
  std::size_t queued = 0;
  sparing_ = needed;
  for (const auto key : needed) {
    if (slots_.count(key.packed()) != 0) continue;
    const auto read = sizes_.read_bytes(key);
    if (!read) continue;  // acquire() reports it
    const auto bytes = slot_of(key);
    if (!make_room(bytes)) break;  // acquire() makes room for the rest, one at a time
    Slot slot;
    slot.bytes = bytes;
    slot.fetched = true;
    used_ += bytes;
    stats_.bytes_read += *read;
    slots_.emplace(key.packed(), slot);
    untold_.push_back(key);
    ++queued;
  }
  sparing_ = {};
  return queued;
}

void CacheSim::tell_fetched() {
  for (const auto key : untold_) {
    if (policy_) policy_->on_insert(key, *sizes_.read_bytes(key));
  }
  untold_.clear();
}

sdk::Expected<bool> CacheSim::acquire(ExpertKey key) {
  tell_fetched();  // the manager's reap(): reads that landed reach the policy before this use
  auto it = slots_.find(key.packed());
  if (it != slots_.end() && it->second.fetched) {
    it->second.fetched = false;
    ++stats_.misses;
    ++it->second.in_use;
    if (policy_) policy_->on_access(key);
    return false;
  }
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
  s.records = trace.size();
  std::vector<std::int32_t> experts;
  for (std::size_t r = 0; r < trace.size();) {
    const auto& first = trace[r];
    std::size_t end = r + 1;
    if (first.step >= 0) {
      while (end < trace.size() && trace[end].step == first.step && trace[end].layer == first.layer) ++end;
    }
    experts.clear();
    for (auto i = r; i < end; ++i) experts.insert(experts.end(), trace[i].experts.begin(), trace[i].experts.end());
    std::sort(experts.begin(), experts.end());
    experts.erase(std::unique(experts.begin(), experts.end()), experts.end());
    s.begin.push_back(s.keys.size());
    s.first_record.push_back(r);
    for (auto e : experts) {
      s.keys.push_back({static_cast<std::uint32_t>(first.layer), static_cast<std::uint32_t>(e)});
    }
    s.layers = std::max(s.layers, static_cast<std::uint32_t>(first.layer) + 1);
    r = end;
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

Status replay_group(CacheSim& sim, std::span<const ExpertKey> group, const std::function<void(ExpertKey, bool)>& seen) {
  // This layer's misses go to the disk together, then the experts resident before them run first.
  sim.fetch(group);
  std::vector<ExpertKey> order(group.begin(), group.end());
  std::stable_partition(order.begin(), order.end(), [&](ExpertKey k) { return sim.ready(k); });
  for (const auto k : order) {
    auto hit = sim.acquire(k);
    if (!hit) return hit.error().with_context("layer " + std::to_string(k.layer));
    sim.release(k);
    seen(k, *hit);
  }
  return {};
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
  for (std::size_t g = 0; g < seq.groups(); ++g) {
    const std::span<const ExpertKey> group(seq.keys.data() + seq.begin[g], seq.begin[g + 1] - seq.begin[g]);
    auto s = replay_group(sim, group, [&](ExpertKey k, bool hit) {
      auto& l = out.per_layer[k.layer];
      if (hit) {
        ++l.hits;
      } else {
        ++l.misses;
        l.bytes_read += sizes.read_bytes(k).value_or(0);
      }
    });
    if (!s) return s.with_context("replaying trace record " + std::to_string(seq.first_record[g] + 1));
  }
  out.stats = sim.stats();
  // Trace accesses only; preload reads stay in preload_loads and bytes_read.
  out.stats.hits -= before.hits;
  out.stats.misses -= before.misses;
  return out;
}

sdk::Expected<ReplayResult> belady(const AccessSequence& seq, std::uint64_t slots, const ExpertSizes& sizes) {
  if (slots == 0) return Status(StatusCode::invalid_argument, "a cache of 0 experts holds nothing");
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
  std::vector<std::size_t> order;  // access indices of the group, as the replay orders them
  for (std::size_t g = 0; g < seq.groups(); ++g) {
    order.resize(seq.begin[g + 1] - seq.begin[g]);
    std::iota(order.begin(), order.end(), seq.begin[g]);
    const auto first_miss = std::stable_partition(
        order.begin(), order.end(), [&](std::size_t i) { return resident.count(seq.keys[i].packed()) != 0; });
    // The misses needed latest are read first: when the group's experts do not all fit, those read early are the
    // ones evicted before the group ends, and the ones needed soonest stay.
    std::stable_sort(first_miss, order.end(), [&](std::size_t x, std::size_t y) { return next_use[x] > next_use[y]; });
    for (const auto i : order) {
      const auto key = seq.keys[i].packed();
      auto& l = out.per_layer[seq.keys[i].layer];
      auto it = resident.find(key);
      if (it != resident.end()) {
        ++out.stats.hits;
        ++l.hits;
        by_next.erase({it->second, key});
        it->second = next_use[i];
        by_next.insert({next_use[i], key});
        continue;
      }
      // The group's experts resident at its start were used first, so every resident expert may go.
      if (resident.size() >= slots) {
        const auto victim = by_next.begin();
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
  }
  return out;
}

}  // namespace colibri::ab
