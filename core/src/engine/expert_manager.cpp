#include "colibri/engine/expert_manager.hpp"

#include <xxhash.h>

#include <new>

namespace colibri::engine {

using sdk::Status;
using sdk::StatusCode;

namespace {

std::string key_name(std::int64_t layer, std::int64_t expert) {
  return "L" + std::to_string(layer) + "/E" + std::to_string(expert);
}

sdk::ExpertKey key_of(std::int64_t layer, std::int64_t expert) {
  return {static_cast<std::uint32_t>(layer), static_cast<std::uint32_t>(expert)};
}

sdk::Tensor weight_view(const model::TensorEntry& t, std::byte* base) {
  sdk::Tensor v;
  v.type = t.type;
  v.ne = {t.shape.size() > 1 ? t.shape[1] : t.shape[0], t.shape.size() > 1 ? t.shape[0] : 1, 1, 1};
  v.data = base;
  return v;
}

}  // namespace

ExpertManager::ExpertManager(const model::Manifest& manifest, std::filesystem::path model_dir,
                             std::shared_ptr<sdk::Storage> storage, std::shared_ptr<sdk::CachePolicy> policy,
                             std::uint64_t budget_bytes)
    : manifest_(manifest),
      dir_(std::move(model_dir)),
      storage_(std::move(storage)),
      policy_(std::move(policy)),
      budget_(budget_bytes) {
  resident_ = manifest_.expert_bytes() <= budget_;
}

ExpertManager::~ExpertManager() {
  if (policy_) policy_->clear();
}

Status ExpertManager::preload() {
  if (policy_) {
    for (const auto key : policy_->wanted_pins()) {
      const auto* e = manifest_.expert(key.layer, key.expert);
      if (e == nullptr) {
        return Status(StatusCode::invalid_argument, "cache.pinned_experts names " + key_name(key.layer, key.expert) +
                                                        ", which this model does not have");
      }
      auto w = acquire(key.layer, key.expert);
      if (!w) return w.error();
      release(key.layer, key.expert);
      auto& slot = slots_[key.packed()];
      if (!slot.pinned) {
        slot.pinned = true;
        policy_->on_pin(key, true);
      }
    }
  }
  if (!resident_) return {};
  for (const auto& e : manifest_.experts) {
    if (slots_.count(key_of(e.layer, e.expert).packed()) != 0) continue;
    Slot slot;
    if (auto s = load(e, slot); !s) return s;
    used_bytes_ += slot.data.size();
    slots_.emplace(key_of(e.layer, e.expert).packed(), std::move(slot));
    if (policy_) policy_->on_insert(key_of(e.layer, e.expert), e.size);
  }
  return {};
}

Status ExpertManager::load(const model::ExpertEntry& e, Slot& slot) {
  const std::string where = key_name(e.layer, e.expert);
  try {
    slot.data = AlignedBuffer((e.size + 4095) / 4096 * 4096);
  } catch (const std::bad_alloc&) {
    return Status(StatusCode::out_of_memory, "no memory for expert " + where);
  }
  slot.entry = &e;
  const auto start = std::chrono::steady_clock::now();
  auto file = storage_->open((dir_ / e.file).string());
  if (!file) return file.error().with_context("opening " + where + " (" + e.file + ")");
  auto s = storage_->read(**file, e.offset, std::span<std::byte>(slot.data.data(), e.size));
  stats_.stall_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!s) return s.with_context("reading " + where + " (" + e.file + ")");
  stats_.bytes_read += e.size;
  for (const auto* part : {&e.gate, &e.up, &e.down}) {
    if (part->offset < e.offset || part->offset + part->size > e.offset + e.size) {
      return Status(StatusCode::corrupt_data,
                    where + ": tensor " + part->name + " lies outside its blob; re-run convert");
    }
    const auto* p = slot.data.data() + (part->offset - e.offset);
    if (static_cast<std::uint64_t>(XXH64(p, part->size, 0)) != part->checksum) {
      return Status(StatusCode::corrupt_data, where + ": checksum mismatch; re-run convert");
    }
  }
  return {};
}

bool ExpertManager::evictable(void* ctx, sdk::ExpertKey key) noexcept {
  auto* self = static_cast<ExpertManager*>(ctx);
  auto it = self->slots_.find(key.packed());
  return it != self->slots_.end() && it->second.in_use == 0 && !it->second.pinned;
}

Status ExpertManager::make_room(std::uint64_t bytes) {
  while (used_bytes_ + bytes > budget_) {
    std::optional<sdk::ExpertKey> victim;
    if (policy_) victim = policy_->pick_victim(sdk::EvictablePredicate{&ExpertManager::evictable, this});
    if (!victim || !evictable(this, *victim)) {
      return Status(StatusCode::out_of_memory,
                    "memory.expert_cache (" + std::to_string(budget_) +
                        " bytes) cannot hold the experts one layer needs at once; raise it (--expert-cache-size)");
    }
    auto it = slots_.find(victim->packed());
    used_bytes_ -= it->second.data.size();
    slots_.erase(it);
    policy_->on_erase(*victim);
    ++stats_.evictions;
  }
  return {};
}

ExpertWeights ExpertManager::weights_of(const Slot& slot) const {
  const auto& e = *slot.entry;
  return {weight_view(e.gate, slot.data.data() + (e.gate.offset - e.offset)),
          weight_view(e.up, slot.data.data() + (e.up.offset - e.offset)),
          weight_view(e.down, slot.data.data() + (e.down.offset - e.offset))};
}

sdk::Expected<ExpertWeights> ExpertManager::acquire(std::int64_t layer, std::int64_t expert) {
  const auto key = key_of(layer, expert);
  auto it = slots_.find(key.packed());
  if (it != slots_.end()) {
    ++stats_.hits;
    ++it->second.in_use;
    if (policy_) policy_->on_access(key);
    return weights_of(it->second);
  }
  const auto* e = manifest_.expert(layer, expert);
  if (e == nullptr) {
    return Status(StatusCode::not_found, "the manifest has no expert " + key_name(layer, expert));
  }
  const std::uint64_t bytes = (e->size + 4095) / 4096 * 4096;
  if (auto s = make_room(bytes); !s) return s;
  Slot slot;
  if (auto s = load(*e, slot); !s) return s;
  ++stats_.misses;
  slot.in_use = 1;
  used_bytes_ += slot.data.size();
  auto [pos, inserted] = slots_.emplace(key.packed(), std::move(slot));
  (void)inserted;
  if (policy_) policy_->on_insert(key, e->size);
  return weights_of(pos->second);
}

void ExpertManager::release(std::int64_t layer, std::int64_t expert) {
  auto it = slots_.find(key_of(layer, expert).packed());
  if (it != slots_.end() && it->second.in_use > 0) --it->second.in_use;
}

}  // namespace colibri::engine
