#include "colibri/engine/vram_tier.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>

#include "colibri/engine/expert_manager.hpp"
#include "colibri/engine/memory_plan.hpp"
#include "colibri/sdk/config.hpp"

namespace colibri::engine {

using sdk::Status;
using sdk::StatusCode;

namespace {

std::string key_text(sdk::ExpertKey key) {
  return "L" + std::to_string(key.layer) + "/E" + std::to_string(key.expert);
}

}  // namespace

sdk::Expected<std::unique_ptr<VramTier>> VramTier::create(const model::Manifest& manifest,
                                                          std::shared_ptr<sdk::Compute> compute,
                                                          std::shared_ptr<sdk::CachePolicy> policy,
                                                          std::uint64_t budget_bytes, ExpertStats& stats) {
  if (!compute) return Status(StatusCode::invalid_argument, "the VRAM tier needs a compute backend");
  std::unique_ptr<VramTier> t(new VramTier(std::move(compute), std::move(policy), stats));
  t->budget_ = budget_bytes;
  t->expert_count_ = manifest.experts.size();
  t->slot_bytes_ = expert_slot_bytes(manifest);
  if (t->slot_bytes_ == 0) return t;  // no experts: nothing to hold
  const std::uint64_t count = std::min<std::uint64_t>(budget_bytes / t->slot_bytes_, t->expert_count_);
  if (count == 0) {
    return Status(StatusCode::invalid_argument,
                  "memory.vram_budget (" + sdk::format_size(budget_bytes) + ") holds no expert: one slot needs " +
                      sdk::format_size(t->slot_bytes_) + "; raise it (--vram-budget) or set it to 0");
  }
  if (const auto devices = t->compute_->devices();
      !devices.empty() && devices[0].memory_total > 0 && count * t->slot_bytes_ > devices[0].memory_available) {
    return Status(StatusCode::out_of_memory,
                  "memory.vram_budget (" + sdk::format_size(budget_bytes) + "): " + devices[0].name + " has only " +
                      sdk::format_size(devices[0].memory_available) + " free for the " +
                      sdk::format_size(count * t->slot_bytes_) + " of expert slots; lower it (--vram-budget)");
  }
  const std::uint64_t per_buffer = std::max<std::uint64_t>(1, kBufferBytes / t->slot_bytes_);
  for (std::uint64_t first = 0; first < count; first += per_buffer) {
    const std::uint64_t n = std::min(per_buffer, count - first);
    auto buf = t->compute_->allocate(n * t->slot_bytes_);
    if (!buf) {
      return Status(buf.error().code(), "memory.vram_budget (" + sdk::format_size(budget_bytes) +
                                            "): allocating expert slots on the device failed after " +
                                            sdk::format_size(t->allocated_) + ": " + buf.error().message() +
                                            "; lower it (--vram-budget)");
    }
    for (std::uint64_t i = 0; i < n; ++i)
      t->slots_.push_back({buf->get(), static_cast<std::size_t>(i * t->slot_bytes_)});
    t->allocated_ += n * t->slot_bytes_;
    t->buffers_.push_back(std::move(*buf));
  }
  // Lowest slot first: pop_back hands out slot 0 first.
  for (std::size_t i = t->slots_.size(); i-- > 0;) t->free_.push_back(i);
  return t;
}

VramTier::~VramTier() {
  // Nothing runs after the engine is gone; make sure no upload still reads a RAM slot or writes a buffer.
  if (compute_) (void)compute_->synchronize();
  if (policy_) policy_->clear();
}

ExpertWeights VramTier::weights_of(const Entry& entry) const {
  const Place& p = slots_[entry.slot];
  auto* host = static_cast<std::byte*>(p.buffer->host_pointer());
  return expert_weights(*entry.expert, host != nullptr ? host + p.offset : nullptr, p.buffer, p.offset);
}

std::optional<ExpertWeights> VramTier::acquire(sdk::ExpertKey key) {
  auto it = entries_.find(key.packed());
  if (it != entries_.end() && it->second.upload) {
    finish_copy(key);
    it = entries_.find(key.packed());  // gone when the copy failed: a miss, and the caller uploads again
  }
  if (it == entries_.end()) {
    ++stats_.vram_misses;
    return std::nullopt;
  }
  Entry& entry = it->second;
  if (entry.miss_counted) {
    entry.miss_counted = false;  // counted when begin_upload() started it
  } else {
    ++stats_.vram_hits;
  }
  ++entry.in_use;
  if (policy_) policy_->on_access(key);
  return weights_of(entry);
}

bool VramTier::copying(sdk::ExpertKey key) const {
  auto it = entries_.find(key.packed());
  return it != entries_.end() && it->second.upload && !it->second.upload->ready();
}

void VramTier::finish_copy(sdk::ExpertKey key) {
  auto it = entries_.find(key.packed());
  if (it == entries_.end() || !it->second.upload) return;
  const auto start = std::chrono::steady_clock::now();
  const Status s = it->second.upload->wait();
  stats_.upload_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  it->second.upload.reset();
  if (!s) {
    // The slot's bytes are undefined: forget it; its next acquire() misses and uploads again (reporting a lasting
    // error).
    spdlog::warn("uploading expert {} to the VRAM tier failed ({}); it will be uploaded again", key_text(key),
                 s.message());
    if (it->second.miss_counted) --stats_.vram_misses;  // that acquire() counts the miss itself
    erase(it);
  }
}

bool VramTier::ready(sdk::ExpertKey key) const {
  auto it = entries_.find(key.packed());
  return it != entries_.end() && (!it->second.upload || it->second.upload->ready());
}

std::optional<ExpertWeights> VramTier::resident_weights(sdk::ExpertKey key) const {
  // Not while an upload's event is held: one that failed is found (and the expert uploaded again) by acquire() alone.
  auto it = entries_.find(key.packed());
  if (it == entries_.end() || it->second.upload) return std::nullopt;
  return weights_of(it->second);
}

bool VramTier::evictable(void* ctx, sdk::ExpertKey key) noexcept {
  const auto* self = static_cast<const VramTier*>(ctx);
  auto it = self->entries_.find(key.packed());
  if (it == self->entries_.end() || it->second.in_use != 0 || it->second.pinned) return false;
  if (it->second.upload && !it->second.upload->ready()) return false;
  return std::find(self->keep_.begin(), self->keep_.end(), key) == self->keep_.end();
}

void VramTier::erase(std::map<std::uint64_t, Entry>::iterator it) {
  const auto key = sdk::ExpertKey::unpack(it->first);
  free_.push_back(it->second.slot);
  entries_.erase(it);
  ++freed_slots_;
  if (policy_) policy_->on_erase(key);
}

void VramTier::note_use(sdk::ExpertKey key) {
  ++uses_[key.packed()];
  if (++uses_since_halving_ < 10 * std::max<std::uint64_t>(slots_.size(), 1)) return;
  uses_since_halving_ = 0;
  for (auto it = uses_.begin(); it != uses_.end();) {
    it->second /= 2;
    it = it->second == 0 ? uses_.erase(it) : std::next(it);
  }
}

bool VramTier::admits(sdk::ExpertKey key) {
  if (!admission_ || !free_.empty() || !policy_) return true;
  const auto victim = policy_->pick_victim(sdk::EvictablePredicate{&VramTier::evictable, this});
  if (!victim || !evictable(this, *victim)) return true;  // make_room() reports what is wrong
  auto count = [&](sdk::ExpertKey k) {
    auto it = uses_.find(k.packed());
    return it == uses_.end() ? 0u : it->second;
  };
  return count(key) > count(*victim);
}

Status VramTier::make_room() {
  if (!free_.empty()) return {};
  std::optional<sdk::ExpertKey> victim;
  if (policy_) victim = policy_->pick_victim(sdk::EvictablePredicate{&VramTier::evictable, this});
  if (!victim || !evictable(this, *victim)) {
    return Status(StatusCode::out_of_memory,
                  "memory.vram_budget (" + sdk::format_size(budget_) + ", " + std::to_string(slots_.size()) +
                      " expert slots) cannot hold the experts one layer needs at once; raise it (--vram-budget)");
  }
  erase(entries_.find(victim->packed()));
  ++stats_.vram_evictions;
  return {};
}

VramTier::Entry* VramTier::start_upload(sdk::ExpertKey key, const model::ExpertEntry& e, const std::byte* blob,
                                        bool wait, Status& error) {
  if (e.size > slot_bytes_) {
    error = Status(StatusCode::internal, key_text(key) + " (" + std::to_string(e.size) +
                                             " bytes) is larger than a VRAM slot; the manifest changed under us");
    return nullptr;
  }
  if (error = make_room(); !error) return nullptr;
  const std::size_t slot = free_.back();
  const Place& p = slots_[slot];
  const auto start = std::chrono::steady_clock::now();
  auto event = compute_->copy_to_device_async(blob, *p.buffer, p.offset, e.size);
  if (event && wait) {
    error = (*event)->wait();
    event->reset();
  } else if (!event) {
    error = event.error();
  }
  stats_.upload_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!error) {
    error = error.with_context("uploading expert " + key_text(key) + " to the VRAM tier");
    return nullptr;
  }
  free_.pop_back();
  stats_.bytes_uploaded += e.size;
  ++stats_.uploads;
  Entry entry{&e, slot, 0, false, nullptr, false};
  if (!wait) entry.upload = std::move(*event);
  auto [it, inserted] = entries_.emplace(key.packed(), std::move(entry));
  (void)inserted;
  if (policy_) policy_->on_insert(key, e.size);
  return &it->second;
}

sdk::Expected<ExpertWeights> VramTier::upload(sdk::ExpertKey key, const model::ExpertEntry& e, const std::byte* blob) {
  if (auto it = entries_.find(key.packed()); it != entries_.end()) {
    ++it->second.in_use;  // uploaded meanwhile: nothing to copy
    return weights_of(it->second);
  }
  Status error;
  Entry* entry = start_upload(key, e, blob, true, error);
  if (entry == nullptr) return error;
  entry->in_use = 1;
  if (policy_) policy_->on_access(key);  // uploaded for this use
  return weights_of(*entry);
}

bool VramTier::begin_upload(sdk::ExpertKey key, const model::ExpertEntry& e, const std::byte* blob,
                            std::span<const sdk::ExpertKey> keep) {
  if (entries_.count(key.packed()) != 0) return false;
  keep_ = keep;
  Status error;
  Entry* entry = admits(key) ? start_upload(key, e, blob, false, error) : nullptr;
  keep_ = {};
  if (entry == nullptr) return false;  // acquire() misses and upload() reports what is wrong
  entry->miss_counted = true;
  ++stats_.vram_misses;
  return true;
}

bool VramTier::begin_fill(sdk::ExpertKey key, const model::ExpertEntry& e, const std::byte* blob) {
  if (free_.empty() || entries_.count(key.packed()) != 0) return false;
  Status error;
  return start_upload(key, e, blob, false, error) != nullptr;
}

void VramTier::release(sdk::ExpertKey key) {
  auto it = entries_.find(key.packed());
  if (it != entries_.end() && it->second.in_use > 0) --it->second.in_use;
}

bool VramTier::pin(sdk::ExpertKey key) {
  auto it = entries_.find(key.packed());
  if (it == entries_.end()) return false;
  if (!it->second.pinned) {
    it->second.pinned = true;
    if (policy_) policy_->on_pin(key, true);
  }
  return true;
}

std::size_t VramTier::clear() {
  std::size_t dropped = 0;
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (it->second.upload) (void)it->second.upload->wait();  // the copy still writes the slot
    if (it->second.in_use != 0 || it->second.pinned) {
      ++it;
      continue;
    }
    auto next = std::next(it);
    erase(it);
    ++dropped;
    it = next;
  }
  return dropped;
}

}  // namespace colibri::engine
