// Test doubles for the expert manager's unit tests: a storage serving files from memory and a manifest of small
// f32 experts whose bytes are known, so tests can check what was read and from where.
#pragma once

#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "colibri/engine/expert_manager.hpp"
#include "colibri/model/manifest.hpp"
#include "colibri/sdk/cache_policy.hpp"
#include "colibri/sdk/storage.hpp"

namespace colibri::testing {

// Serves files from memory, synchronously; counts reads.
class MemoryStorage : public sdk::StorageBase {
 public:
  class File final : public sdk::StorageFile {
   public:
    File(std::string path, std::uint64_t size) : path_(std::move(path)), size_(size) {}
    std::uint64_t size() const noexcept override { return size_; }
    const std::string& path() const noexcept override { return path_; }
    bool direct_io() const noexcept override { return false; }

   private:
    std::string path_;
    std::uint64_t size_;
  };
  std::map<std::string, std::vector<std::byte>> files;
  std::atomic<int> reads{0};
  // Reported as asynchronous (reads still run inline in submit()), as every storage plugin is: the expert manager
  // then reads a layer's misses together (fetch) as it does in a run.
  bool async = false;

  sdk::Expected<std::unique_ptr<sdk::StorageFile>> open(const std::string& path) noexcept override {
    auto it = files.find(path);
    if (it == files.end()) return sdk::Status(sdk::StatusCode::not_found, path + ": no such file");
    return std::unique_ptr<sdk::StorageFile>(std::make_unique<File>(path, it->second.size()));
  }
  sdk::Status read(sdk::StorageFile& f, std::uint64_t offset, std::span<std::byte> dst) noexcept override {
    const auto& bytes = files.at(f.path());
    if (offset + dst.size() > bytes.size()) return sdk::Status(sdk::StatusCode::corrupt_data, "short read");
    std::copy_n(bytes.begin() + static_cast<std::ptrdiff_t>(offset), dst.size(), dst.begin());
    ++reads;
    return {};
  }
  sdk::StorageCapabilities capabilities() const noexcept override {
    sdk::StorageCapabilities c;
    c.async = async;
    return c;
  }
};

// Least recently used first; `pins` is what it asks to pin.
class ListPolicy final : public sdk::CachePolicy {
 public:
  std::list<sdk::ExpertKey> order;
  std::vector<sdk::ExpertKey> pins;
  bool ignore_predicate = false;  // a faulty policy: names the oldest entry whether it may go or not
  void on_insert(sdk::ExpertKey k, std::uint64_t) noexcept override { order.push_back(k); }
  void on_access(sdk::ExpertKey k) noexcept override {
    order.remove(k);
    order.push_back(k);
  }
  void on_erase(sdk::ExpertKey k) noexcept override { order.remove(k); }
  std::optional<sdk::ExpertKey> pick_victim(const sdk::EvictablePredicate& ok) noexcept override {
    for (auto k : order) {
      if (ok(k) || ignore_predicate) return k;
    }
    return std::nullopt;
  }
  std::vector<sdk::ExpertKey> wanted_pins() const noexcept override { return pins; }
  void clear() noexcept override { order.clear(); }
};

// Adds `layers` x `experts` experts of `blob_bytes` each to `manifest`, their files to `storage` under `model_dir`
// (file names `file_prefix`L<l>E<e>.bin). Every byte of expert (l, e) is l * 16 + e; gate, up and down are f32
// {8, 32} at offsets 0, 1024 and 2048, with their checksums.
inline void add_memory_experts(model::Manifest& manifest, MemoryStorage& storage, int layers, int experts,
                               std::uint64_t blob_bytes, const std::string& file_prefix = "experts/",
                               const std::string& model_dir = "/m/") {
  for (int l = 0; l < layers; ++l) {
    for (int e = 0; e < experts; ++e) {
      model::ExpertEntry x;
      x.layer = l;
      x.expert = e;
      x.file = file_prefix + "L" + std::to_string(l) + "E" + std::to_string(e) + ".bin";
      x.size = blob_bytes;
      std::vector<std::byte> bytes(blob_bytes, std::byte(l * 16 + e));
      std::uint64_t at = 0;
      for (auto* part : {&x.gate, &x.up, &x.down}) {
        part->type = sdk::DType::f32;
        part->shape = {8, 32};
        part->offset = at;
        part->size = 8 * 32 * 4;
        part->checksum = XXH64(bytes.data() + at, part->size, 0);
        at += 1024;
      }
      storage.files[model_dir + x.file] = std::move(bytes);
      manifest.experts.push_back(x);
    }
  }
}

// `layers` x `experts` in-memory experts of `blob_bytes` each in a Storage (MemoryStorage or a subclass), an LRU
// list policy, and expert managers over them (model dir "/m").
template <typename Storage = MemoryStorage>
struct MemoryExpertSet {
  model::Manifest manifest;
  std::shared_ptr<Storage> storage = std::make_shared<Storage>();
  std::shared_ptr<ListPolicy> policy = std::make_shared<ListPolicy>();

  MemoryExpertSet(int layers, int experts, std::uint64_t blob_bytes) {
    add_memory_experts(manifest, *storage, layers, experts, blob_bytes);
  }
  [[nodiscard]] engine::ExpertManager manager(std::uint64_t budget_bytes) const {
    return engine::ExpertManager(manifest, "/m", storage, policy, budget_bytes);
  }
};

}  // namespace colibri::testing
