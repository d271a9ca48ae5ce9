#include "colibri/engine/expert_manager.hpp"

#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <new>

#include "colibri/engine/memory_plan.hpp"

namespace colibri::engine {

using sdk::Status;
using sdk::StatusCode;

namespace {

// Expert buffers are whole pages: O_DIRECT reads land in them.
std::uint64_t round_to_page(std::uint64_t bytes) {
  return (bytes + 4095) / 4096 * 4096;
}

std::string key_name(std::int64_t layer, std::int64_t expert) {
  return "L" + std::to_string(layer) + "/E" + std::to_string(expert);
}

sdk::ExpertKey key_of(std::int64_t layer, std::int64_t expert) {
  return {static_cast<std::uint32_t>(layer), static_cast<std::uint32_t>(expert)};
}

sdk::Tensor weight_view(const model::TensorEntry& t, std::byte* base, sdk::Buffer* buffer, std::size_t offset) {
  sdk::Tensor v;
  v.type = t.type;
  v.ne = {t.shape.size() > 1 ? t.shape[1] : t.shape[0], t.shape.size() > 1 ? t.shape[0] : 1, 1, 1};
  v.data = base;
  v.buffer = buffer;
  v.offset = offset;
  return v;
}

}  // namespace

ExpertWeights expert_weights(const model::ExpertEntry& e, std::byte* host, sdk::Buffer* buffer, std::size_t offset) {
  auto part = [&](const model::TensorEntry& t) {
    const std::size_t at = t.offset - e.offset;
    return weight_view(t, host != nullptr ? host + at : nullptr, buffer, buffer != nullptr ? offset + at : 0);
  };
  if (!e.has_bias()) return {part(e.gate), part(e.up), part(e.down), {}, {}, {}};
  return {part(e.gate), part(e.up), part(e.down), part(e.gate_bias), part(e.up_bias), part(e.down_bias)};
}

ExpertManager::ExpertManager(const model::Manifest& manifest, std::filesystem::path model_dir,
                             std::shared_ptr<sdk::Storage> storage, std::shared_ptr<sdk::CachePolicy> policy,
                             std::uint64_t budget_bytes)
    : manifest_(manifest),
      dir_(std::move(model_dir)),
      storage_(std::move(storage)),
      policy_(std::move(policy)),
      budget_(budget_bytes) {
  manifest_identity_ = manifest_identity();
  resident_ = manifest_.expert_bytes() <= budget_;
  if (!resident_) {
    // Streaming: one slot size, the largest expert's, so that every evicted buffer fits the next expert. With exact
    // sizes the layers' two expert sizes (e.g. q4_k vs q6_k down) rarely matched a spare, and each mismatch freed it
    // and faulted in a fresh buffer: zeroing those pages was 23% of the CPU time of a streamed decode.
    slot_bytes_ = expert_slot_bytes(manifest_);
  }
  async_storage_ = storage_ && storage_->capabilities().async;
  if (async_storage_)
    cancel_ = static_cast<sdk::StorageCancel*>(storage_->query_interface(sdk::kStorageCancelInterface));
  if (storage_) copies_ = static_cast<sdk::StorageCopies*>(storage_->query_interface(sdk::kStorageCopiesInterface));
  // Registered slots pay off when slots are read into again and again; resident mode reads each one once.
  if (storage_ && !resident_)
    buffers_ = static_cast<sdk::StorageBuffers*>(storage_->query_interface(sdk::kStorageBuffersInterface));
}

ExpertManager::~ExpertManager() {
  // Prefetch reads write into our slots and call back into mutex_: let them finish first.
  if (storage_ && !inflight_.empty()) storage_->drain();
  if (policy_) policy_->clear();
}

Status ExpertManager::preload() {
  if (!resident_ && slot_bytes_ > 0) {
    if (auto s = check_expert_cache(budget_, slot_bytes_); !s) return s;
  }
  if (policy_) {
    for (const auto key : policy_->wanted_pins()) {
      const auto* e = manifest_.expert(key.layer, key.expert);
      if (e == nullptr) {
        return Status(
            StatusCode::invalid_argument,
            "the pinned experts (cache.pinned_experts, or the history cache.auto_pin_history names) include " +
                key_name(key.layer, key.expert) + ", which this model does not have; fix the list, or " +
                "clear a history recorded for another model (colibri-cli cache clear --model M)");
      }
      const auto hits = stats_.hits, misses = stats_.misses;
      auto w = acquire(key.layer, key.expert);
      if (!w) return w.error();
      release(key.layer, key.expert);
      uncount_use(key);  // loading a pin is not a use
      // Nor a lookup: hits + misses stay the workload's (as ab replay counts a preload apart); the read still counts.
      if (stats_.hits == hits && stats_.misses == misses + 1) ++stats_.preloaded;
      stats_.hits = hits;
      stats_.misses = misses;
      auto& slot = slots_[key.packed()];
      if (!slot.pinned) {
        slot.pinned = true;
        policy_->on_pin(key, true);
      }
    }
  }
  if (!resident_ && slot_bytes_ > 0) {
    // Streaming: the slots are fixed, so map them now. A storage that registers buffers (io_uring) pins, and so
    // faults in, each one as it is mapped: at load, not on the forward pass's thread in the middle of a prefill.
    const std::uint64_t room = used_bytes_ < budget_ ? budget_ - used_bytes_ : 0;  // pins may already use some
    const std::uint64_t free_slots =
        std::min<std::uint64_t>(room / slot_bytes_, manifest_.experts.size() - slots_.size());
    try {
      while (spare_.size() < free_slots) spare_.push_back(new_buffer(slot_bytes_));
    } catch (const std::bad_alloc&) {
      // The reads map what they need, and report it if that fails.
    }
  }
  if (resident_) {
    for (const auto& e : manifest_.experts) {
      if (slots_.count(key_of(e.layer, e.expert).packed()) != 0) continue;
      Slot slot;
      if (auto s = load(e, slot); !s) return s;
      used_bytes_ += slot.data.size();
      slots_.emplace(key_of(e.layer, e.expert).packed(), std::move(slot));
      if (policy_) policy_->on_insert(key_of(e.layer, e.expert), e.size);
    }
  }
  return vram_ ? preload_vram() : Status{};
}

Status ExpertManager::preload_vram() {
  std::vector<sdk::ExpertKey> wanted;
  if (vram_->holds_all()) {
    for (const auto& e : manifest_.experts) wanted.push_back(key_of(e.layer, e.expert));
  } else if (policy_) {
    wanted = policy_->wanted_pins();
  }
  // Pins leave room for the most experts one layer runs at once, so demand uploads always find a slot.
  std::int64_t top_k = 1;
  for (std::int64_t l = 0; l < manifest_.hparams.num_layers; ++l) {
    top_k = std::max(top_k, manifest_.hparams.layer_top_k(l));
  }
  const bool pin = !vram_->holds_all();
  std::size_t pinned = 0;
  for (const auto key : wanted) {
    if (pin && pinned + static_cast<std::size_t>(top_k) >= vram_->slot_count()) break;
    if (!vram_->contains(key)) {
      auto ram = acquire_ram(key.layer, key.expert);
      if (!ram) return ram.error();
      uncount_use(key);  // loading is not a use
      const auto& slot = slots_.at(key.packed());
      auto w = vram_->upload(key, *slot.entry, slot.data.data());
      release_ram(key.layer, key.expert);
      if (!w) return w.error();
      vram_->release(key);
    }
    if (pin && vram_->pin(key)) ++pinned;
  }
  return {};
}

std::array<std::int64_t, 4> ExpertManager::manifest_identity() const {
  struct stat st {};
  if (::stat((dir_ / "manifest.json").c_str(), &st) != 0) return {-1, -1, -1, -1};
  return {static_cast<std::int64_t>(st.st_dev), static_cast<std::int64_t>(st.st_ino),
          static_cast<std::int64_t>(st.st_size),
          static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec};
}

Status ExpertManager::explain_replaced(Status s) const {
  if (s || manifest_identity() == manifest_identity_) return s;
  // The cause first: the read's own advice (inspect --verify, re-convert) would send the user after a damage that
  // is not there.
  return Status(s.code(),
                "this model was replaced on disk after it was loaded (by convert --force or a copy): restart to load "
                "the new one; the read found: " +
                    s.message(),
                s.retryable());
}

Status ExpertManager::load(const model::ExpertEntry& e, Slot& slot) {
  return explain_replaced(load_from_disk(e, slot));
}

Status ExpertManager::load_from_disk(const model::ExpertEntry& e, Slot& slot) {
  const std::string where = key_name(e.layer, e.expert);
  try {
    slot.data = take_buffer(slot_bytes(e));
  } catch (const std::bad_alloc&) {
    return Status(StatusCode::out_of_memory, "no memory for expert " + where);
  }
  slot.entry = &e;
  const auto start = std::chrono::steady_clock::now();
  auto file = storage_->open((dir_ / e.file).string());
  // The fix goes with the error: a missing or damaged blob comes back by copying it again or re-converting; an open
  // the OS refused for another reason (the open-file limit, permissions) is fixed where the storage's message says.
  const std::string fix = "; restore " + e.file + " from a good copy or re-run convert";
  // Which plugin the bytes come through: a third-party one may be where the error is, not the file.
  const std::string through = storage_name_.empty() ? std::string() : " through storage plugin '" + storage_name_ + "'";
  if (!file) {
    const bool missing =
        file.error().code() == StatusCode::not_found || file.error().code() == StatusCode::corrupt_data;
    return Status(file.error().code(),
                  "opening expert " + where + " (" + e.file + ")" + through + ": " + file.error().message() +
                      (missing ? fix : ""),
                  file.error().retryable());
  }
  auto s = storage_->read(**file, e.offset, std::span<std::byte>(slot.data.data(), e.size));
  // An error the storage marks retryable (a timeout, a transient device error) is tried again before it ends the run.
  constexpr int kReadAttempts = 3;
  int attempts = 1;
  for (; !s && s.retryable() && attempts < kReadAttempts; ++attempts) {
    spdlog::warn("reading expert {} ({}): {}; trying again", where, e.file, s.message());
    s = storage_->read(**file, e.offset, std::span<std::byte>(slot.data.data(), e.size));
  }
  stats_.stall_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!s && s.retryable()) {
    return Status(s.code(),
                  "reading expert " + where + " (" + e.file + ")" + through + ": " + s.message() + " (failed " +
                      std::to_string(attempts) + " times; check the disk: dmesg, smartctl)",
                  true);
  }
  if (!s) return Status(s.code(), "reading expert " + where + " (" + e.file + ")" + through + ": " + s.message() + fix);
  stats_.bytes_read += e.size;
  return verify_or_other_copy(e, **file, slot.data.data());
}

Status ExpertManager::verify_or_other_copy(const model::ExpertEntry& e, sdk::StorageFile& file, std::byte* data) const {
  Status first = verify(e, data);
  if (first || first.code() != StatusCode::corrupt_data || copies_ == nullptr) return first;
  const std::size_t n = copies_->copy_count(file);
  for (std::size_t i = 1; i < n; ++i) {
    if (!copies_->read_copy(file, i, e.offset, std::span<std::byte>(data, e.size))) continue;
    if (verify(e, data)) {
      // Said once per damaged file: an expert streamed again and again would repeat it at every read.
      const std::string damaged = copies_->copy_path(file, 0);
      bool first_time = false;
      {
        std::lock_guard lock(warned_mutex_);
        first_time = warned_damaged_.insert(damaged).second;
      }
      if (first_time) {
        spdlog::warn(
            "{}: {} failed its checksum; served from its copy {} (restore the damaged {} from it; later reads of it "
            "are served from the copy without this warning)",
            key_name(e.layer, e.expert), damaged, copies_->copy_path(file, i), damaged);
      }
      return {};
    }
  }
  if (n > 1) return first.with_context("every copy (" + std::to_string(n) + ") failed its checksum");
  return first;
}

Status ExpertManager::verify(const model::ExpertEntry& e, const Slot& slot) const {
  return verify(e, slot.data.data());
}

Status ExpertManager::verify(const model::ExpertEntry& e, const std::byte* data) const {
  const std::string where = key_name(e.layer, e.expert);
  for (const auto* part : e.parts()) {
    if (part->offset < e.offset || part->size > e.size || part->offset - e.offset > e.size - part->size) {
      return Status(StatusCode::corrupt_data,
                    where + ": tensor " + part->name + " lies outside its blob; re-run convert");
    }
    const auto* p = data + (part->offset - e.offset);
    if (static_cast<std::uint64_t>(XXH64(p, part->size, 0)) != part->checksum) {
      return Status(StatusCode::corrupt_data, where + ": checksum mismatch in " + e.file + " (tensor " + part->name +
                                                  ")" + model::checksum_fix(storage_name_));
    }
  }
  return {};
}

bool ExpertManager::evictable(void* ctx, sdk::ExpertKey key) noexcept {
  auto* self = static_cast<ExpertManager*>(ctx);
  auto it = self->slots_.find(key.packed());
  if (it == self->slots_.end() || it->second.in_use != 0 || it->second.pinned || it->second.pending) return false;
  if (self->prefetch_eviction_) {
    if (it->second.prefetched_unused || it->second.fetched) return false;
    for (const auto k : self->keep_) {
      if (k.packed() == key.packed()) return false;
    }
  }
  return true;
}

void ExpertManager::erase_slot(std::map<std::uint64_t, Slot>::iterator it) {
  const auto key = sdk::ExpertKey::unpack(it->first);
  const bool known_to_policy = !it->second.pending;
  if (it->second.prefetched_unused) ++stats_.prefetch_wasted;
  used_bytes_ -= it->second.data.size();
  try {
    spare_.push_back(std::move(it->second.data));
  } catch (const std::bad_alloc&) {
    // Not kept for reuse: the buffer is freed with its slot.
  }
  slots_.erase(it);
  ++freed_slots_;
  if (policy_ && known_to_policy) policy_->on_erase(key);
}

bool ExpertManager::make_room_sparing(std::uint64_t bytes, std::span<const sdk::ExpertKey> keep) {
  // The prefetch rules: never wait for a read, never evict what is in use, pinned, read but not yet used, or in `keep`.
  prefetch_eviction_ = true;
  keep_ = keep;
  const bool room = static_cast<bool>(make_room(bytes));
  prefetch_eviction_ = false;
  keep_ = {};
  return room;
}

ExpertStats ExpertStats::since(const ExpertStats& e) const {
  // Every field is 8 bytes: one added without a line here would fail this.
  static_assert(sizeof(ExpertStats) == 26 * 8, "ExpertStats::since subtracts every field; add the new one");
  ExpertStats d = *this;
  for (auto [now, then] : {std::pair{&d.hits, e.hits},
                           {&d.misses, e.misses},
                           {&d.evictions, e.evictions},
                           {&d.bytes_read, e.bytes_read},
                           {&d.preloaded, e.preloaded},
                           {&d.buffers_mapped, e.buffers_mapped},
                           {&d.prefetch_issued, e.prefetch_issued},
                           {&d.prefetch_used, e.prefetch_used},
                           {&d.prefetch_wasted, e.prefetch_wasted},
                           {&d.prefetch_failed, e.prefetch_failed},
                           {&d.prefetch_cancelled, e.prefetch_cancelled},
                           {&d.predicted, e.predicted},
                           {&d.predicted_correct, e.predicted_correct},
                           {&d.actual, e.actual},
                           {&d.cpu_runs, e.cpu_runs},
                           {&d.cpu_run_bytes, e.cpu_run_bytes},
                           {&d.vram_hits, e.vram_hits},
                           {&d.vram_misses, e.vram_misses},
                           {&d.vram_evictions, e.vram_evictions},
                           {&d.uploads, e.uploads},
                           {&d.bytes_uploaded, e.bytes_uploaded},
                           {&d.vram_bypassed, e.vram_bypassed}}) {
    *now -= then;
  }
  for (auto [now, then] : {std::pair{&d.stall_seconds, e.stall_seconds},
                           {&d.stall_saved_seconds, e.stall_saved_seconds},
                           {&d.cpu_run_seconds, e.cpu_run_seconds},
                           {&d.upload_seconds, e.upload_seconds}}) {
    *now -= then;
  }
  return d;
}

Status ExpertManager::no_room_error(const std::optional<sdk::ExpertKey>& victim) {
  std::size_t pinned = 0, evictable_count = 0;
  for (const auto& [packed, slot] : slots_) {
    pinned += slot.pinned ? 1 : 0;
    evictable_count += evictable(this, sdk::ExpertKey::unpack(packed)) ? 1 : 0;
  }
  if (evictable_count > 0) {
    // Something could go, but the policy named nothing usable: its fault, not the budget's.
    return Status(StatusCode::internal,
                  "the cache policy" + (policy_name_.empty() ? std::string() : " '" + policy_name_ + "'") +
                      " (cache.policy) named " +
                      (victim ? key_name(victim->layer, victim->expert) + ", which cannot be evicted," : "no victim") +
                      " while " + std::to_string(evictable_count) +
                      " cached experts could be; its pick_victim() must return one the predicate accepts");
  }
  std::string msg = "memory.expert_cache (" + sdk::format_size(budget_) + ") cannot hold the experts one layer " +
                    "needs at once; raise it (--expert-cache-size)";
  if (pinned > 0) {
    // Pins load as they are first used: count the ones resident, not the ones listed.
    msg += " or pin fewer experts: the " + std::to_string(pinned) + " pinned ones loaded so far take " +
           sdk::format_size(static_cast<std::uint64_t>(pinned) * std::max<std::uint64_t>(slot_bytes_, 1)) +
           " of it (cache.pinned_experts, cache.auto_pin_count)";
  }
  return Status(StatusCode::out_of_memory, msg);
}

Status ExpertManager::make_room(std::uint64_t bytes) {
  while (used_bytes_ + bytes > budget_) {
    std::optional<sdk::ExpertKey> victim;
    if (policy_) victim = policy_->pick_victim(sdk::EvictablePredicate{&ExpertManager::evictable, this});
    if ((!victim || !evictable(this, *victim)) && !prefetch_eviction_ && !inflight_.empty()) {
      // Prefetches in flight hold the room a demand read needs: wait for one to land (it becomes evictable).
      std::vector<std::shared_ptr<Pending>> pending;
      for (const auto k : inflight_) pending.push_back(slots_.at(k).pending);
      const auto start = std::chrono::steady_clock::now();
      {
        std::unique_lock lock(mutex_);
        landed_.wait(
            lock, [&] { return std::any_of(pending.begin(), pending.end(), [](const auto& p) { return p->done; }); });
      }
      stats_.stall_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      reap();
      continue;
    }
    if ((!victim || !evictable(this, *victim)) && !copy_holds_.empty() && release_copy_holds(!prefetch_eviction_)) {
      continue;  // uploads held the room: they are done now (a prefetch never waits for them)
    }
    if (!victim || !evictable(this, *victim)) return no_room_error(victim);
    erase_slot(slots_.find(victim->packed()));
    ++stats_.evictions;
  }
  return {};
}

ExpertWeights ExpertManager::weights_of(const Slot& slot) const {
  return expert_weights(*slot.entry, const_cast<std::byte*>(slot.data.data()));
}

Status ExpertManager::enable_vram(std::shared_ptr<sdk::Compute> compute, std::shared_ptr<sdk::CachePolicy> policy,
                                  std::uint64_t budget_bytes, bool admission) {
  auto* host = static_cast<sdk::ComputeHostRegister*>(compute->query_interface(sdk::kHostRegisterInterface));
  auto tier = VramTier::create(manifest_, std::move(compute), std::move(policy), budget_bytes, stats_);
  if (!tier) return tier.error();
  vram_ = std::move(*tier);
  vram_->set_admission(admission);
  // RAM slots the backend reads directly: uploads skip its staging copy. Not when every expert has a VRAM slot
  // (each is uploaded once, at load).
  if (!vram_->holds_all()) host_register_ = host;
  return {};
}

sdk::Expected<ExpertWeights> ExpertManager::acquire(std::int64_t layer, std::int64_t expert) {
  if (!vram_) return acquire_ram(layer, expert);
  if (!copy_holds_.empty()) release_copy_holds(false);
  const auto key = key_of(layer, expert);
  if (auto w = vram_->acquire(key)) {
    vram_->note_use(key);
    ++usage_[key.packed()];
    return *w;
  }
  const bool admitted = vram_->admits(key);  // on the uses before this one, as staging decides
  vram_->note_use(key);
  if (!admitted) {
    // Not worth a slot yet: runs from its RAM slot, which the backend reads per call (same bytes, same bits).
    auto ram = acquire_ram(layer, expert);
    if (!ram) return ram;
    ++stats_.vram_bypassed;
    ++bypassed_[key.packed()];
    return ram;
  }
  // VRAM miss: through the RAM tier (a hit there or a read), then upload; the RAM slot is free again once copied.
  if (auto s = vram_->make_room(); !s) return s;
  auto ram = acquire_ram(layer, expert);
  if (!ram) return ram;
  const auto& slot = slots_.at(key.packed());
  auto w = vram_->upload(key, *slot.entry, slot.data.data());
  release_ram(layer, expert);
  return w;
}

std::size_t ExpertManager::stage_uploads(std::span<const sdk::ExpertKey> needed) {
  if (!vram_) return 0;
  reap();
  release_copy_holds(false);
  std::size_t started = 0;
  for (const auto key : needed) {
    if (vram_->contains(key)) continue;
    auto it = slots_.find(key.packed());
    if (it == slots_.end() || it->second.pending) continue;  // not in RAM yet: acquire() reads, then uploads
    if (!vram_->begin_upload(key, *it->second.entry, it->second.data.data(), needed)) continue;
    hold_for_copy(key, it->second);
    ++started;
    // The RAM tier served it: a hit (counted, heard by the policy) whose use is counted once, by the acquire() that
    // runs it. The slot is ready, so this neither reads nor waits.
    if (auto ram = acquire_ram(key.layer, key.expert); ram) release_ram(key.layer, key.expert);
    uncount_use(key);
  }
  return started;
}

sdk::Expected<ExpertWeights> ExpertManager::acquire_ram(std::int64_t layer, std::int64_t expert) {
  const auto key = key_of(layer, expert);
  ++usage_[key.packed()];
  reap();
  auto it = slots_.find(key.packed());
  if (it != slots_.end() && it->second.pending) {
    // Single flight: wait for the read of this expert in flight instead of reading it again.
    const auto start = std::chrono::steady_clock::now();
    auto pending = it->second.pending;
    {
      std::unique_lock lock(mutex_);
      landed_.wait(lock, [&] { return pending->done; });
    }
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    stats_.stall_seconds += waited;
    const auto packed = key.packed();
    reap(&packed);
    it = slots_.find(packed);
    if (it != slots_.end() && !pending->demand) {
      stats_.stall_saved_seconds += std::max(0.0, pending->read_seconds - waited);
    }
  }
  if (it != slots_.end() && it->second.fetched) {
    // Read by fetch() for this use: a miss, handed to the policy as an insert when it landed.
    it->second.fetched = false;
    ++stats_.misses;
    ++it->second.in_use;
    if (policy_) policy_->on_access(key);
    return weights_of(it->second);
  }
  if (it != slots_.end()) {
    if (it->second.prefetched_unused) {
      it->second.prefetched_unused = false;
      ++stats_.prefetch_used;
    }
    ++stats_.hits;
    ++it->second.in_use;
    if (policy_) policy_->on_access(key);
    return weights_of(it->second);
  }
  const auto* e = manifest_.expert(layer, expert);
  if (e == nullptr) {
    return Status(StatusCode::not_found, "the manifest has no expert " + key_name(layer, expert));
  }
  const std::uint64_t bytes = slot_bytes(*e);
  if (auto s = make_room(bytes); !s) return s;
  Slot slot;
  if (auto s = load(*e, slot); !s) return s;
  ++stats_.misses;
  slot.in_use = 1;
  used_bytes_ += slot.data.size();
  auto [pos, inserted] = slots_.emplace(key.packed(), std::move(slot));
  (void)inserted;
  if (policy_) {
    policy_->on_insert(key, e->size);
    policy_->on_access(key);  // read for this use
  }
  return weights_of(pos->second);
}

void ExpertManager::reap(const std::uint64_t* only) {
  if (inflight_.empty()) return;
  std::vector<std::uint64_t> landed;
  {
    std::lock_guard lock(mutex_);
    for (const auto k : inflight_) {
      if (only != nullptr && k != *only) continue;
      auto it = slots_.find(k);
      if (it != slots_.end() && it->second.pending && it->second.pending->done) landed.push_back(k);
    }
  }
  for (const auto k : landed) {
    inflight_.erase(std::find(inflight_.begin(), inflight_.end(), k));
    auto it = slots_.find(k);
    auto& slot = it->second;
    const Status s = slot.pending->status;  // the read's, then the checksum's
    const bool demand = slot.pending->demand;
    if (!s) {
      // A failed read in flight is dropped quietly: the synchronous demand read that follows reports the fault.
      if (!demand) ++(s.code() == StatusCode::cancelled ? stats_.prefetch_cancelled : stats_.prefetch_failed);
      erase_slot(it);
      continue;
    }
    stats_.bytes_read += slot.entry->size;
    slot.pending.reset();
    (demand ? slot.fetched : slot.prefetched_unused) = true;
    if (policy_) policy_->on_insert(sdk::ExpertKey::unpack(k), slot.entry->size);
  }
}

std::size_t ExpertManager::prefetch(std::span<const sdk::ExpertKey> wanted, std::span<const sdk::ExpertKey> keep) {
  // A synchronous storage would read inline on the forward pass's thread: nothing to overlap, only cost.
  if (resident_ || wanted.empty() || !async_storage_ || (vram_ && vram_->holds_all())) return 0;
  reap();
  std::size_t queued = 0;
  for (const auto key : wanted) {
    if (slots_.count(key.packed()) != 0 || (vram_ && vram_->contains(key))) continue;
    const auto* e = manifest_.expert(key.layer, key.expert);
    if (e == nullptr) continue;
    const std::uint64_t bytes = slot_bytes(*e);
    const bool room = make_room_sparing(bytes, keep);
    if (!room) break;  // the rest would not fit either without evicting what is needed now
    if (!start_read(key, *e, bytes, sdk::ReadPriority::prefetch)) continue;  // the demand read reports why
    ++stats_.prefetch_issued;
    ++queued;
  }
  return queued;
}

std::uint64_t ExpertManager::prefetches_open() const {
  std::uint64_t open = 0;
  for (const auto& [key, slot] : slots_) {
    // `demand` is set before the read is submitted and never changes: no lock needed to read it.
    open += slot.prefetched_unused || (slot.pending && !slot.pending->demand) ? 1 : 0;
  }
  return open;
}

void ExpertManager::settle_prefetches() {
  if (inflight_.empty()) return;
  storage_->drain();  // every submitted read has called back after this
  reap();
}

CacheClearResult ExpertManager::clear() {
  settle_prefetches();
  if (vram_) release_copy_holds(true);
  CacheClearResult r;
  for (auto it = slots_.begin(); it != slots_.end();) {
    auto next = std::next(it);
    if (it->second.in_use != 0) {
      ++r.kept_in_use;
    } else if (it->second.pinned) {
      ++r.kept_pinned;
    } else {
      ++r.dropped;
      r.dropped_bytes += it->second.data.size();
      erase_slot(it);
    }
    it = next;
  }
  spare_.clear();  // clearing gives the memory back, not just the slots
  if (vram_) r.vram_dropped = vram_->clear();
  return r;
}

sdk::Expected<CacheWarmResult> ExpertManager::warm(std::span<const sdk::ExpertKey> keys) {
  for (const auto key : keys) {
    if (manifest_.expert(key.layer, key.expert) == nullptr) {
      return Status(StatusCode::invalid_argument, "the model has no expert " + key_name(key.layer, key.expert));
    }
  }
  settle_prefetches();
  CacheWarmResult r;
  const double stall_before = stats_.stall_seconds;  // warming is not time a forward pass waited
  const std::uint64_t read_before = stats_.bytes_read;
  Status failed;
  for (const auto key : keys) {
    if (slots_.count(key.packed()) != 0) {
      ++r.already_resident;
      continue;
    }
    const auto* e = manifest_.expert(key.layer, key.expert);
    const std::uint64_t bytes = slot_bytes(*e);
    const bool room = make_room_sparing(bytes, keys);
    if (!room) {
      ++r.no_room;
      continue;
    }
    Slot slot;
    if (failed = load(*e, slot); !failed) break;
    used_bytes_ += slot.data.size();
    slots_.emplace(key.packed(), std::move(slot));
    if (policy_) policy_->on_insert(key, e->size);
    ++r.loaded;
  }
  r.bytes_read = stats_.bytes_read - read_before;
  stats_.stall_seconds = stall_before;
  if (!failed) return failed;
  return r;
}

std::size_t ExpertManager::fetch(std::span<const sdk::ExpertKey> needed) {
  if (resident_ || needed.empty() || !async_storage_) return 0;
  reap();
  std::size_t queued = 0;
  for (const auto key : needed) {
    if (slots_.count(key.packed()) != 0 || (vram_ && vram_->contains(key))) continue;
    const auto* e = manifest_.expert(key.layer, key.expert);
    if (e == nullptr) continue;  // acquire() reports it
    const std::uint64_t bytes = slot_bytes(*e);
    const bool room = make_room_sparing(bytes, needed);
    if (!room) break;  // acquire() makes room for the rest, one at a time
    if (start_read(key, *e, bytes, sdk::ReadPriority::demand)) ++queued;
  }
  return queued;
}

std::size_t ExpertManager::cancel_stale(std::int64_t layer) {
  if (cancel_ == nullptr || inflight_.empty()) return 0;
  std::vector<std::uint64_t> stale;  // tags; cancel() calls back into mutex_, so it runs unlocked
  {
    std::lock_guard lock(mutex_);
    for (const auto k : inflight_) {
      const auto& p = *slots_.at(k).pending;
      if (!p.demand && !p.done && static_cast<std::int64_t>(sdk::ExpertKey::unpack(k).layer) <= layer) {
        stale.push_back(p.tag);
      }
    }
  }
  std::size_t withdrawn = 0;
  for (const auto tag : stale) withdrawn += cancel_->cancel(tag) ? 1 : 0;
  reap();  // the withdrawn slots go back to the budget now
  return withdrawn;
}

bool ExpertManager::ready(std::int64_t layer, std::int64_t expert) const {
  if (vram_) return vram_->ready(key_of(layer, expert));
  auto it = slots_.find(key_of(layer, expert).packed());
  return it != slots_.end() && !it->second.pending;
}

bool ExpertManager::routed_table(std::int64_t layer, std::vector<sdk::Tensor>& out) const {
  out.clear();
  if (vram_ ? !vram_->holds_all() : !resident_) return false;
  for (std::int64_t e = 0; e < manifest_.hparams.n_experts; ++e) {
    const auto key = key_of(layer, e);
    std::optional<ExpertWeights> w;
    if (vram_) {
      w = vram_->resident_weights(key);
    } else if (auto it = slots_.find(key.packed()); it != slots_.end() && !it->second.pending) {
      w = weights_of(it->second);
    }
    if (!w) {
      out.clear();
      return false;
    }
    out.insert(out.end(), {w->gate, w->up, w->down});
  }
  return true;
}

bool ExpertManager::start_read(sdk::ExpertKey key, const model::ExpertEntry& e, std::uint64_t bytes,
                               sdk::ReadPriority priority) {
  auto file = storage_->open((dir_ / e.file).string());
  if (!file) return false;
  Slot slot;
  try {
    slot.data = take_buffer(bytes);
  } catch (const std::bad_alloc&) {
    return false;
  }
  slot.entry = &e;
  auto pending = std::make_shared<Pending>();
  pending->file = std::move(*file);
  pending->submitted = std::chrono::steady_clock::now();
  pending->demand = priority == sdk::ReadPriority::demand;
  slot.pending = pending;
  sdk::ReadRequest req;
  req.file = pending->file.get();
  req.offset = e.offset;
  req.length = e.size;
  req.buffer = slot.data.data();
  req.priority = priority;
  static std::atomic<std::uint64_t> next_tag{1};
  pending->tag = next_tag.fetch_add(1, std::memory_order_relaxed);
  req.user_tag = pending->tag;
  std::byte* data = slot.data.data();
  used_bytes_ += slot.data.size();
  slots_.emplace(key.packed(), std::move(slot));
  inflight_.push_back(key.packed());
  const auto st = storage_->submit(req, [this, pending, entry = &e, data](sdk::ReadRequest& done) {
    const auto now = std::chrono::steady_clock::now();
    // The checksum runs here, on the storage thread, while the forward pass computes.
    Status s = done.status;
    if (s) s = verify_or_other_copy(*entry, *pending->file, data);
    std::lock_guard lock(mutex_);
    pending->status = s;
    pending->read_seconds = std::chrono::duration<double>(now - pending->submitted).count();
    pending->done = true;
    landed_.notify_all();
  });
  if (!st) {
    inflight_.pop_back();
    erase_slot(slots_.find(key.packed()));
    return false;
  }
  return true;
}

std::uint64_t ExpertManager::slot_bytes(const model::ExpertEntry& e) const {
  return slot_bytes_ != 0 ? slot_bytes_ : round_to_page(e.size);
}

ExpertManager::SlotBuffer ExpertManager::take_buffer(std::uint64_t bytes) {
  // The smallest spare that fits (when streaming all slots have one size; resident slots keep each expert's own).
  // Taking a spare keeps resident + spare bytes.
  auto best = spare_.end();
  for (auto it = spare_.begin(); it != spare_.end(); ++it) {
    if (it->size() >= bytes && (best == spare_.end() || it->size() < best->size())) best = it;
  }
  if (best != spare_.end()) {
    SlotBuffer b = std::move(*best);
    spare_.erase(best);
    return b;
  }
  spare_.clear();  // none fits: free them before allocating, so resident + spare bytes stay within the budget
  return new_buffer(bytes);
}

ExpertManager::SlotBuffer ExpertManager::new_buffer(std::uint64_t bytes) {
  AlignedBuffer data(bytes);
  ++stats_.buffers_mapped;
  // Each registry while it accepts: the first refusal is logged once and ends further attempts, which would fail
  // the same way. Reads still work, each pinning its pages; uploads still work, staged by the backend.
  auto accepted = [](auto*& registry, const Status& s, const char* what) {
    if (!s) {
      spdlog::warn("expert cache: {}: {}", what, s.message());
      registry = nullptr;
    }
    return registry;
  };
  sdk::StorageBuffers* storage = nullptr;
  if (buffers_ != nullptr) {
    storage = accepted(buffers_, buffers_->register_buffer({data.data(), data.size()}),
                       "the storage did not register a slot buffer, so expert reads go without registered buffers");
  }
  sdk::ComputeHostRegister* host = nullptr;
  if (host_register_ != nullptr) {
    host = accepted(host_register_, host_register_->register_host(data.data(), data.size()),
                    "the compute backend did not register a slot buffer, so uploads are staged");
  }
  return SlotBuffer(std::move(data), storage, host);
}

void ExpertManager::hold_for_copy(sdk::ExpertKey key, Slot& slot) {
  if (!slot.data.host_registered() || !vram_->copying(key)) return;
  ++slot.in_use;
  copy_holds_.push_back(key);
}

bool ExpertManager::release_copy_holds(bool wait) {
  bool released = false;
  std::erase_if(copy_holds_, [&](sdk::ExpertKey key) {
    if (wait) vram_->finish_copy(key);
    if (vram_->copying(key)) return false;
    release_ram(key.layer, key.expert);
    released = true;
    return true;
  });
  return released;
}

void ExpertManager::release(std::int64_t layer, std::int64_t expert) {
  if (vram_) {
    auto it = bypassed_.find(key_of(layer, expert).packed());
    if (it == bypassed_.end()) {
      vram_->release(key_of(layer, expert));
      return;
    }
    if (--it->second == 0) bypassed_.erase(it);
  }
  release_ram(layer, expert);
}

sdk::Expected<ExpertWeights> ExpertManager::acquire_for_cpu(std::int64_t layer, std::int64_t expert) {
  auto w = acquire_ram(layer, expert);
  if (!w) return w;
  if (vram_) {
    ++stats_.vram_misses;
    vram_->note_use(key_of(layer, expert));
  }
  ++stats_.cpu_runs;
  if (const auto* e = manifest_.expert(layer, expert)) stats_.cpu_run_bytes += e->size;
  return w;
}

void ExpertManager::release_for_cpu(std::int64_t layer, std::int64_t expert, double seconds) {
  stats_.cpu_run_seconds += seconds;
  release_ram(layer, expert);
}

bool ExpertManager::fill_vram(std::int64_t layer, std::int64_t expert) {
  if (!vram_) return false;
  release_copy_holds(false);
  auto it = slots_.find(key_of(layer, expert).packed());
  if (it == slots_.end() || it->second.pending) return false;
  if (!vram_->begin_fill(key_of(layer, expert), *it->second.entry, it->second.data.data())) return false;
  hold_for_copy(key_of(layer, expert), it->second);
  return true;
}

bool ExpertManager::in_vram(std::int64_t layer, std::int64_t expert) const {
  return vram_ && vram_->contains(key_of(layer, expert));
}

void ExpertManager::uncount_use(sdk::ExpertKey key) {
  if (auto it = usage_.find(key.packed()); it != usage_.end() && --it->second == 0) usage_.erase(it);
}

Status ExpertManager::with_ram_weights(std::int64_t layer, std::int64_t expert,
                                       const std::function<Status(const ExpertWeights&)>& fn) {
  const ExpertStats before = stats_;
  auto w = acquire_ram(layer, expert);
  Status s = w ? fn(*w) : w.error();
  if (w) release_ram(layer, expert);
  // A load, not a use (whether or not `fn` succeeded): what it read and evicted counts, not the lookup.
  const ExpertStats after = stats_;
  stats_ = before;
  stats_.bytes_read = after.bytes_read;
  stats_.buffers_mapped = after.buffers_mapped;
  stats_.evictions = after.evictions;
  uncount_use(key_of(layer, expert));
  return s;
}

void ExpertManager::release_ram(std::int64_t layer, std::int64_t expert) {
  auto it = slots_.find(key_of(layer, expert).packed());
  if (it != slots_.end() && it->second.in_use > 0) --it->second.in_use;
}

}  // namespace colibri::engine
