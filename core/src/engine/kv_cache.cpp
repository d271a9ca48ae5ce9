#include "colibri/engine/kv_cache.hpp"

#include <algorithm>
#include <cstring>
#include <new>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "colibri/quant/quant.hpp"

namespace colibri::engine {

using sdk::DType;
using sdk::Status;
using sdk::StatusCode;

std::uint64_t KvCache::bytes_per_position(DType type, std::int64_t layers, std::int64_t kv_heads, std::int64_t head_dim,
                                          bool values_are_keys) {
  return (values_are_keys ? 1ull : 2ull) * static_cast<std::uint64_t>(layers * kv_heads) *
         sdk::row_bytes(type, head_dim);
}

namespace {
constexpr std::int64_t kRowAlign = 64;  // the attention key blocks' alignment (compute contract)

// Copies between a device's buffers (sdk::kDeviceCopyInterface), started in order and waited for together.
class DeviceCopies {
 public:
  explicit DeviceCopies(sdk::ComputeDeviceCopy& device) : device_(device) {}
  DeviceCopies(const DeviceCopies&) = delete;
  DeviceCopies& operator=(const DeviceCopies&) = delete;
  ~DeviceCopies() { (void)finish(); }

  // A failure is also kept for finish(), which waits for the copies started before it.
  Status start(const sdk::Buffer& src, std::size_t src_offset, sdk::Buffer& dst, std::size_t dst_offset,
               std::size_t bytes) {
    auto copy = device_.copy_between_async(src, src_offset, dst, dst_offset, bytes);
    if (!copy) {
      if (first_) first_ = copy.error();
      return copy.error();
    }
    started_.push_back(std::move(*copy));
    return {};
  }
  // Waits for every copy started; the first error.
  Status finish() {
    for (auto& c : started_) {
      if (Status s = c->wait(); !s && first_) first_ = s;
    }
    started_.clear();
    return std::exchange(first_, Status{});
  }

 private:
  sdk::ComputeDeviceCopy& device_;
  std::vector<std::unique_ptr<sdk::Event>> started_;
  Status first_;
};

std::int64_t layer_window(const KvWindows& w, std::int64_t layer) {
  return static_cast<std::size_t>(layer) < w.window.size() ? w.window[static_cast<std::size_t>(layer)] : 0;
}
std::int64_t layer_state(const KvWindows& w, std::int64_t layer) {
  return static_cast<std::size_t>(layer) < w.state.size() ? w.state[static_cast<std::size_t>(layer)] : 0;
}
}  // namespace

std::int64_t KvCache::layer_positions(std::int64_t window, std::int64_t max_write, std::int64_t context) {
  if (window <= 0 || max_write <= 0) return context;
  const std::int64_t need = window + (kRowAlign - 1) + max_write + window + kRowAlign;
  return std::min(context, (need + kRowAlign - 1) / kRowAlign * kRowAlign);
}

std::uint64_t KvCache::bytes_for(DType type, std::int64_t layers, std::int64_t kv_heads, std::int64_t head_dim,
                                 std::int64_t context, const KvWindows& windows, bool values_are_keys) {
  const auto checkpoints = static_cast<std::uint64_t>(std::max<std::int64_t>(0, windows.checkpoints));
  std::uint64_t rows = 0, state_floats = 0;
  for (std::int64_t l = 0; l < layers; ++l) {
    if (const auto st = layer_state(windows, l); st > 0) {
      state_floats += (1 + checkpoints) * static_cast<std::uint64_t>(st);  // the state and its checkpoints' copies
      continue;
    }
    const auto window = layer_window(windows, l);
    const auto held = layer_positions(window, windows.max_write, context);
    rows += static_cast<std::uint64_t>(held);
    // A checkpoint's copy of a sliding layer: its window, the 64 positions before, and up to 63 from alignment.
    if (held < context) rows += checkpoints * static_cast<std::uint64_t>(std::min(held, window + 2 * kRowAlign - 1));
  }
  return (values_are_keys ? 1ull : 2ull) * rows * static_cast<std::uint64_t>(kv_heads) *
             sdk::row_bytes(type, head_dim) +
         state_floats * sizeof(float);
}

std::uint64_t KvCache::checkpoint_bytes_for(DType type, std::int64_t layers, std::int64_t kv_heads,
                                            std::int64_t head_dim, std::int64_t context, const KvWindows& windows,
                                            bool values_are_keys) {
  KvWindows none = windows;
  none.checkpoints = 0;
  return bytes_for(type, layers, kv_heads, head_dim, context, windows, values_are_keys) -
         bytes_for(type, layers, kv_heads, head_dim, context, none, values_are_keys);
}

sdk::Expected<KvCache> KvCache::create(DType type, std::int64_t layers, std::int64_t kv_heads, std::int64_t head_dim,
                                       std::int64_t context, std::shared_ptr<sdk::Compute> device, KvWindows windows,
                                       bool values_are_keys) {
  if (type != DType::f16 && type != DType::q8_0 && type != DType::f32) {
    return Status(StatusCode::invalid_argument,
                  "KV cache type " + std::string(sdk::to_string(type)) + " is not supported; use f16, q8_0 or f32");
  }
  if (sdk::row_bytes(type, head_dim) == 0) {
    return Status(StatusCode::invalid_argument, "KV cache type " + std::string(sdk::to_string(type)) +
                                                    " needs rows of a multiple of its block size (rows of " +
                                                    std::to_string(head_dim) +
                                                    ": head_dim, or latent attention's kv_lora_rank + "
                                                    "qk_rope_head_dim); use --kv-type f16");
  }
  if (context <= 0) return Status(StatusCode::invalid_argument, "the context must hold at least one token");
  if ((!windows.window.empty() && static_cast<std::int64_t>(windows.window.size()) != layers) ||
      (!windows.state.empty() && static_cast<std::int64_t>(windows.state.size()) != layers)) {
    return Status(StatusCode::invalid_argument, "KV cache windows name " + std::to_string(windows.window.size()) +
                                                    " layers, the model has " + std::to_string(layers));
  }
  KvCache c;
  c.type_ = type;
  c.layers_ = layers;
  c.kv_heads_ = kv_heads;
  c.head_dim_ = head_dim;
  c.context_ = context;
  c.planes_ = values_are_keys ? 1 : 2;
  c.row_bytes_ = sdk::row_bytes(type, head_dim);
  for (std::int64_t l = 0; l < layers; ++l) {
    c.rows_.push_back(
        layer_state(windows, l) > 0 ? 0 : layer_positions(layer_window(windows, l), windows.max_write, context));
  }
  c.first_.assign(static_cast<std::size_t>(layers), 0);
  c.windows_ = std::move(windows);
  c.total_bytes_ = bytes_for(type, layers, kv_heads, head_dim, context, c.windows_, values_are_keys);
  c.checkpoint_bytes_ = checkpoint_bytes_for(type, layers, kv_heads, head_dim, context, c.windows_, values_are_keys);
  auto layer_bytes = [&c](std::int64_t l) {
    return c.row_bytes_ * static_cast<std::size_t>(c.kv_heads_ * c.rows_[static_cast<std::size_t>(l)]);
  };
  try {
    if (std::any_of(c.windows_.state.begin(), c.windows_.state.end(), [](std::int64_t n) { return n > 0; })) {
      for (std::int64_t l = 0; l < layers; ++l)
        c.state_.emplace_back(device ? 0 : static_cast<std::size_t>(layer_state(c.windows_, l)));
      c.state_at_.assign(c.state_.size(), 0);
    }
  } catch (const std::bad_alloc&) {
    return Status(StatusCode::out_of_memory,
                  "cannot reserve the recurrent layers' states; lower --ctx or memory.kv_cache");
  }
  if (device) {
    for (std::int64_t l = 0; l < layers; ++l) {
      for (auto* list : {&c.k_dev_, &c.v_dev_}) {
        if (list == &c.v_dev_ && values_are_keys) continue;
        auto buf = device->allocate(layer_bytes(l));
        if (!buf) {
          return buf.error().with_context("allocating the KV cache of " + std::to_string(context) + " positions (" +
                                          std::to_string(c.total_bytes_) + " bytes) in device memory");
        }
        list->push_back(std::move(*buf));
      }
    }
    for (std::int64_t l = 0; l < static_cast<std::int64_t>(c.state_.size()); ++l) {
      const auto floats = static_cast<std::size_t>(layer_state(c.windows_, l));
      if (floats == 0) {
        c.state_dev_.emplace_back();
        continue;
      }
      auto buf = device->allocate(floats * sizeof(float));
      if (!buf) return buf.error().with_context("allocating layer " + std::to_string(l) + "'s state in device memory");
      c.state_dev_.push_back(std::move(*buf));
    }
    c.device_copy_ = static_cast<sdk::ComputeDeviceCopy*>(device->query_interface(sdk::kDeviceCopyInterface));
    c.device_ = std::move(device);
    return c;
  }
  try {
    for (std::int64_t l = 0; l < layers; ++l) {
      c.k_.emplace_back(layer_bytes(l));
      if (!values_are_keys) c.v_.emplace_back(layer_bytes(l));
    }
  } catch (const std::bad_alloc&) {
    return Status(StatusCode::out_of_memory, "cannot reserve " + std::to_string(c.total_bytes_) +
                                                 " bytes for the KV cache of " + std::to_string(context) +
                                                 " positions; lower --ctx or memory.kv_cache");
  }
  return c;
}

sdk::Expected<std::size_t> KvCache::make_room(std::int64_t layer, std::int64_t position, std::int64_t count) {
  if (layer < 0 || layer >= layers_ || position < 0 || count < 0 || position + count > context_) {
    return Status(StatusCode::invalid_argument, "KV cache write outside the context");
  }
  const auto L = static_cast<std::size_t>(layer);
  if (rows_[L] < context_) {
    if (count > windows_.max_write) {
      return Status(StatusCode::invalid_argument, "KV cache write of " + std::to_string(count) +
                                                      " positions; a sliding-window or chunked layer takes at most " +
                                                      std::to_string(windows_.max_write) + " at once");
    }
    forget_after(position);                                 // positions from here on are written again
    const std::int64_t needed = window_start(L, position);  // the first query's first key
    if (position == 0) first_[L] = 0;                       // starting over
    if (needed < first_[L]) {
      return Status(StatusCode::internal, "KV cache layer " + std::to_string(layer) + " no longer holds position " +
                                              std::to_string(needed) + " (its rows start at " +
                                              std::to_string(first_[L]) + "); run from position 0 again");
    }
    if (position + count - first_[L] > rows_[L]) {
      const std::int64_t first = needed / kRowAlign * kRowAlign;
      if (auto s = move_rows(L, first - first_[L], position - first); !s) return s;
      first_[L] = first;
    }
  }
  reach_ = std::max(reach_, position + count);
  return static_cast<std::size_t>((position - first_[L]) * kv_heads_) * row_bytes_;
}

Status KvCache::move_rows(std::size_t layer, std::int64_t from, std::int64_t n) {
  if (from == 0 || n <= 0) return {};
  const std::size_t row = static_cast<std::size_t>(kv_heads_) * row_bytes_;
  const std::size_t at = static_cast<std::size_t>(from) * row, bytes = static_cast<std::size_t>(n) * row;
  for (int which = 0; which < planes_; ++which) {
    std::byte* base = nullptr;
    if (!device_) {
      base = (which == 0 ? k_ : v_)[layer].data();
    } else {
      base = static_cast<std::byte*>((which == 0 ? k_dev_ : v_dev_)[layer]->host_pointer());
    }
    if (base != nullptr) {
      std::memmove(base, base + at, bytes);
      continue;
    }
    if (device_copy_ != nullptr) {
      // On the device, in pieces no longer than the shift (a copy's two ranges must not overlap); each comes after
      // the one before on the device, so it reads its rows before a later piece writes over them.
      sdk::Buffer& buffer = *(which == 0 ? k_dev_ : v_dev_)[layer];
      DeviceCopies pieces(*device_copy_);
      for (std::size_t done = 0; done < bytes; done += at) {
        if (auto s = pieces.start(buffer, at + done, buffer, done, std::min(at, bytes - done)); !s) break;
      }
      if (auto s = pieces.finish(); !s) return s.with_context("moving a sliding-window layer's KV rows");
      continue;
    }
    // Through the host: rows move once every window or more positions, a few windows' rows at a time.
    staging_.resize(bytes);
    if (auto s = rows_to_host(layer, which, from, n, staging_.data()); !s)
      return s.with_context("moving a sliding-window layer's KV rows");
    if (auto s = rows_from_host(layer, which, 0, n, staging_.data()); !s)
      return s.with_context("moving a sliding-window layer's KV rows");
  }
  return {};
}

std::int64_t KvCache::max_write() const {
  for (std::size_t l = 0; l < rows_.size(); ++l) {
    if (sliding(l)) return windows_.max_write;
  }
  return context_;
}

std::int64_t KvCache::first_position(std::int64_t layer) const {
  return layer >= 0 && layer < layers_ ? first_[static_cast<std::size_t>(layer)] : 0;
}

std::int64_t KvCache::window_start(std::size_t layer, std::int64_t n) const {
  const std::int64_t window = layer_window(windows_, static_cast<std::int64_t>(layer));
  return window > 0 ? std::max<std::int64_t>(0, n - window + 1) : 0;
}

bool KvCache::serves(std::int64_t n, const std::vector<std::int64_t>& first) const {
  for (std::size_t l = 0; l < first.size(); ++l) {
    if (rows_[l] < context_ && n > 0 && first[l] > window_start(l, n)) return false;
  }
  return true;
}

std::int64_t KvCache::reusable(std::int64_t n) const {
  n = std::max<std::int64_t>(0, n);
  std::int64_t best = 0;
  if (has_recurrent()) {
    // Only where a state is kept: where the states are, or a checkpoint.
    const std::int64_t cur = state_position();
    if (cur > 0 && cur <= n && serves(cur, first_)) best = cur;
  } else if (serves(n, first_)) {
    return n;
  }
  for (const auto& c : checkpoints_) best = std::max(best, checkpoint_serves(c, n));
  return best;
}

std::int64_t KvCache::checkpoint_serves(const Checkpoint& c, std::int64_t n) const {
  if (c.holds_state()) return c.at <= n && serves(c.at, c.first) ? c.at : 0;
  const std::int64_t m = std::min(n, c.at);
  return m > 0 && serves(m, c.first) ? m : 0;
}

void KvCache::forget_after(std::int64_t position) {
  std::erase_if(checkpoints_, [&](Checkpoint& c) {
    if (c.at <= position) return false;
    if (c.holds_state() || position <= 0 || !serves(position, c.first)) return true;
    c.at = position;  // its rows up to `position` are still this cache's
    return false;
  });
}

bool KvCache::keeps_checkpoints() const {
  if (windows_.checkpoints <= 0) return false;
  for (std::size_t l = 0; l < rows_.size(); ++l) {
    if (sliding(l) || recurrent(static_cast<std::int64_t>(l))) return true;
  }
  return false;
}

std::vector<std::int64_t> KvCache::checkpoint_positions() const {
  std::vector<std::int64_t> at;
  for (const auto& c : checkpoints_) at.push_back(c.at);
  std::sort(at.begin(), at.end());
  return at;
}

bool KvCache::sliding(std::size_t layer) const {
  return rows_[layer] < context_ && !recurrent(static_cast<std::int64_t>(layer));
}

bool KvCache::recurrent(std::int64_t layer) const {
  return layer >= 0 && static_cast<std::size_t>(layer) < state_.size() && layer_state(windows_, layer) > 0;
}

std::int64_t KvCache::state_position() const {
  std::int64_t at = -2;
  for (std::size_t l = 0; l < state_.size(); ++l) {
    if (!recurrent(static_cast<std::int64_t>(l))) continue;
    if (at == -2) at = state_at_[l];
    if (state_at_[l] != at || at < 0) return -1;
  }
  return at < 0 ? -1 : at;
}

sdk::Expected<sdk::Tensor> KvCache::state_for(std::int64_t layer, std::int64_t position) {
  if (!recurrent(layer)) {
    return Status(StatusCode::internal, "layer " + std::to_string(layer) + " has no recurrent state");
  }
  const auto L = static_cast<std::size_t>(layer);
  if (position == 0) {
    if (auto s = state_from_host(L, nullptr); !s) return s;
  } else if (state_at_[L] != position) {
    return Status(StatusCode::internal, "the recurrent state of layer " + std::to_string(layer) + " is " +
                                            (state_at_[L] < 0 ? std::string("lost (a pass failed part way)")
                                                              : "at position " + std::to_string(state_at_[L])) +
                                            ", not " + std::to_string(position) + "; run from position 0 again");
  }
  forget_after(position);  // positions from here on are run again
  state_at_[L] = -1;       // lost until state_written()
  sdk::Tensor t;
  t.type = DType::f32;
  t.ne = {layer_state(windows_, layer), 1, 1, 1};
  if (device_) {
    t.buffer = state_dev_[L].get();
    t.data = t.buffer->host_pointer();
  } else {
    t.data = state_[L].data();
  }
  return t;
}

Status KvCache::state_to_host(std::size_t layer, float* dst) const {
  const std::size_t bytes =
      static_cast<std::size_t>(layer_state(windows_, static_cast<std::int64_t>(layer))) * sizeof(float);
  if (!device_) {
    std::memcpy(dst, state_[layer].data(), bytes);
    return {};
  }
  sdk::Buffer& buffer = *state_dev_[layer];
  if (const auto* mapped = static_cast<const std::byte*>(buffer.host_pointer())) {
    std::memcpy(dst, mapped, bytes);
    return {};
  }
  auto down = device_->copy_to_host_async(buffer, 0, dst, bytes);
  if (!down) return down.error().with_context("reading a recurrent state");
  return (*down)->wait();
}

Status KvCache::state_from_host(std::size_t layer, const float* src) {
  const auto floats = static_cast<std::size_t>(layer_state(windows_, static_cast<std::int64_t>(layer)));
  if (!device_) {
    if (src == nullptr) {
      std::fill(state_[layer].begin(), state_[layer].end(), 0.0f);
    } else {
      std::copy_n(src, floats, state_[layer].begin());
    }
    return {};
  }
  sdk::Buffer& buffer = *state_dev_[layer];
  if (auto* mapped = static_cast<float*>(buffer.host_pointer())) {
    if (src == nullptr) {
      std::fill_n(mapped, floats, 0.0f);
    } else {
      std::copy_n(src, floats, mapped);
    }
    return {};
  }
  std::vector<float> zeros;
  if (src == nullptr) {
    zeros.assign(floats, 0.0f);
    src = zeros.data();
  }
  auto up = device_->copy_to_device_async(src, buffer, 0, floats * sizeof(float));
  if (!up) return up.error().with_context("writing a recurrent state");
  return (*up)->wait();
}

std::int64_t KvCache::rewind(std::int64_t n) {
  const std::int64_t kept = reusable(n);
  const bool live = kept > 0 && (has_recurrent() ? kept == state_position() : serves(kept, first_));
  Checkpoint* from = nullptr;  // the checkpoint to put back
  if (!live && kept > 0) {
    for (auto& c : checkpoints_) {
      if (checkpoint_serves(c, n) == kept) from = &c;
    }
  }
  if (from != nullptr) {
    from->used = ++clock_;
    const auto lost = [&] {
      checkpoints_.clear();
      if (has_recurrent()) std::fill(state_at_.begin(), state_at_.end(), 0);
      return std::int64_t{0};  // nothing kept: the next pass runs from position 0
    };
    for (std::size_t l = 0; l < state_.size(); ++l) {
      if (!recurrent(static_cast<std::int64_t>(l))) continue;
      if (!state_from_host(l, from->state[l].data())) return lost();
      state_at_[l] = kept;
    }
    for (std::size_t l = 0; l < first_.size(); ++l) {
      if (!sliding(l)) continue;
      const auto held =
          static_cast<std::int64_t>(from->k[l].size() / (static_cast<std::size_t>(kv_heads_) * row_bytes_));
      if (!rows_from_host(l, 0, 0, held, from->k[l].data()) ||
          (planes_ == 2 && !rows_from_host(l, 1, 0, held, from->v[l].data()))) {
        return lost();
      }
      first_[l] = from->first[l];
    }
  } else if (kept == 0 && has_recurrent()) {
    std::fill(state_at_.begin(), state_at_.end(), 0);  // the next pass starts from zeros
  }
  forget_after(kept);
  return kept;
}

Status KvCache::checkpoint(std::int64_t n) {
  if (!keeps_checkpoints() || n <= 0) return {};
  for (auto& c : checkpoints_) {
    if (c.at == n) {  // the same positions: the same rows and states
      c.used = ++clock_;
      return {};
    }
  }
  if (!serves(n, first_) || (has_recurrent() && state_position() != n)) return {};
  Checkpoint c;
  c.at = n;
  try {
    c.first.assign(first_.size(), 0);
    c.k.resize(first_.size());
    c.v.resize(first_.size());
    c.state.resize(state_.size());
    for (std::size_t l = 0; l < state_.size(); ++l) {
      if (!recurrent(static_cast<std::int64_t>(l))) continue;
      c.state[l].resize(static_cast<std::size_t>(layer_state(windows_, static_cast<std::int64_t>(l))));
      if (auto s = state_to_host(l, c.state[l].data()); !s) return s;
    }
    for (std::size_t l = 0; l < first_.size(); ++l) {
      if (!sliding(l)) continue;
      // Also what the 64 positions before n read: a next prompt may share a little less than all of this one.
      const std::int64_t from = std::max(first_[l], window_start(l, n - kRowAlign)) / kRowAlign * kRowAlign;
      const std::int64_t count = n - from;
      const std::size_t bytes = static_cast<std::size_t>(count * kv_heads_) * row_bytes_;
      c.k[l].resize(bytes);
      c.v[l].resize(planes_ == 2 ? bytes : 0);
      if (auto s = rows_to_host(l, 0, from - first_[l], count, c.k[l].data()); !s) return s;
      if (planes_ == 2) {
        if (auto s = rows_to_host(l, 1, from - first_[l], count, c.v[l].data()); !s) return s;
      }
      c.first[l] = from;
    }
  } catch (const std::bad_alloc&) {
    return Status(StatusCode::out_of_memory, "no memory to keep a checkpoint of the KV cache at position " +
                                                 std::to_string(n) + " (lower memory.kv_checkpoints)");
  }
  c.used = ++clock_;
  if (static_cast<std::int64_t>(checkpoints_.size()) >= windows_.checkpoints) {
    checkpoints_.erase(std::min_element(checkpoints_.begin(), checkpoints_.end(),
                                        [](const Checkpoint& a, const Checkpoint& b) { return a.used < b.used; }));
  }
  checkpoints_.push_back(std::move(c));
  return {};
}

Status KvCache::rows_to_host(std::size_t layer, int which, std::int64_t row, std::int64_t n, std::byte* dst) const {
  const std::size_t at = static_cast<std::size_t>(row * kv_heads_) * row_bytes_;
  const std::size_t bytes = static_cast<std::size_t>(n * kv_heads_) * row_bytes_;
  if (!device_) {
    std::memcpy(dst, (which == 0 ? k_ : v_)[layer].data() + at, bytes);
    return {};
  }
  sdk::Buffer& buffer = *(which == 0 ? k_dev_ : v_dev_)[layer];
  if (auto* mapped = static_cast<std::byte*>(buffer.host_pointer())) {
    std::memcpy(dst, mapped + at, bytes);
    return {};
  }
  auto down = device_->copy_to_host_async(buffer, at, dst, bytes);
  if (!down) return down.error().with_context("reading KV rows");
  return (*down)->wait();
}

Status KvCache::rows_from_host(std::size_t layer, int which, std::int64_t row, std::int64_t n, const std::byte* src) {
  const std::size_t at = static_cast<std::size_t>(row * kv_heads_) * row_bytes_;
  const std::size_t bytes = static_cast<std::size_t>(n * kv_heads_) * row_bytes_;
  if (!device_) {
    std::memcpy((which == 0 ? k_ : v_)[layer].data() + at, src, bytes);
    return {};
  }
  sdk::Buffer& buffer = *(which == 0 ? k_dev_ : v_dev_)[layer];
  if (auto* mapped = static_cast<std::byte*>(buffer.host_pointer())) {
    std::memcpy(mapped + at, src, bytes);
    return {};
  }
  auto up = device_->copy_to_device_async(src, buffer, at, bytes);
  if (!up) return up.error().with_context("writing KV rows");
  return (*up)->wait();
}

Status KvCache::copy_prefix_from(const KvCache& src, std::int64_t count) {
  if (src.type_ != type_ || src.layers_ != layers_ || src.kv_heads_ != kv_heads_ || src.head_dim_ != head_dim_ ||
      src.planes_ != planes_ || src.rows_ != rows_ || src.windows_.window != windows_.window) {
    return Status(StatusCode::invalid_argument, "copying KV rows between caches of different shapes");
  }
  if (count < 0 || count > context_ || count > src.context_) {
    return Status(StatusCode::invalid_argument,
                  "copying " + std::to_string(count) + " KV positions into a context of " + std::to_string(context_));
  }
  if (!src.serves(count, src.first_)) {
    return Status(StatusCode::invalid_argument, "the source KV cache no longer holds every row position " +
                                                    std::to_string(count) + " needs (sliding-window layers)");
  }
  if (src.windows_.state != windows_.state) {
    return Status(StatusCode::invalid_argument, "copying KV rows between caches of different shapes");
  }
  const bool current = has_recurrent() && count > 0 && src.state_position() == count;
  const Checkpoint* saved = nullptr;
  if (has_recurrent()) {
    for (const auto& c : src.checkpoints_) {
      if (c.at == count && c.holds_state()) saved = &c;
    }
    if (count > 0 && !current && saved == nullptr) {
      return Status(StatusCode::unsupported, "the source holds no recurrent state at position " +
                                                 std::to_string(count) + " (only where it is and at its checkpoints)");
    }
  }
  checkpoints_.clear();
  reach_ = std::max(reach_, count);
  // From here on a failure leaves nothing kept: the next pass runs from position 0.
  const auto failed = [&](const Status& s) {
    std::fill(first_.begin(), first_.end(), 0);
    std::fill(state_at_.begin(), state_at_.end(), 0);
    return s;
  };
  try {
    // Rows and states where either cache keeps them: host memory directly; one device's memory on that device where
    // its backend copies between buffers; else through a host copy (one download and one upload, far less than
    // running the prefix again).
    std::optional<DeviceCopies> on_device;
    if (device_copy_ != nullptr && src.device_ == device_) on_device.emplace(*device_copy_);
    std::vector<std::byte> rows;
    for (std::size_t l = 0; l < first_.size(); ++l) {
      const std::int64_t n = std::min(count - src.first_[l], rows_[l]);
      first_[l] = src.first_[l];
      if (n <= 0) continue;  // a recurrent layer holds no rows
      const std::size_t bytes = static_cast<std::size_t>(n * kv_heads_) * row_bytes_;
      for (int which = 0; which < planes_; ++which) {
        if (on_device) {
          const auto& from = which == 0 ? src.k_dev_ : src.v_dev_;
          auto& to = which == 0 ? k_dev_ : v_dev_;
          if (auto s = on_device->start(*from[l], 0, *to[l], 0, bytes); !s) return failed(on_device->finish());
          continue;
        }
        rows.resize(bytes);
        if (auto s = src.rows_to_host(l, which, 0, n, rows.data()); !s) return failed(s);
        if (auto s = rows_from_host(l, which, 0, n, rows.data()); !s) return failed(s);
      }
    }
    std::vector<float> state;
    for (std::size_t l = 0; l < state_.size(); ++l) {
      if (!recurrent(static_cast<std::int64_t>(l))) continue;
      state_at_[l] = count;
      const auto floats = static_cast<std::size_t>(layer_state(windows_, static_cast<std::int64_t>(l)));
      const float* from = nullptr;  // zeros at count 0
      if (current && on_device) {
        if (auto s = on_device->start(*src.state_dev_[l], 0, *state_dev_[l], 0, floats * sizeof(float)); !s) {
          return failed(on_device->finish());
        }
        continue;
      }
      if (current) {
        state.resize(floats);
        if (auto s = src.state_to_host(l, state.data()); !s) return failed(s);
        from = state.data();
      } else if (count > 0) {
        from = saved->state[l].data();
      }
      if (auto s = state_from_host(l, from); !s) return failed(s);
    }
    if (on_device) {
      if (auto s = on_device->finish(); !s)
        return failed(s.with_context("copying KV rows between caches on the device"));
    }
  } catch (const std::bad_alloc&) {
    return failed(Status(StatusCode::out_of_memory, "no host memory to copy KV rows between caches"));
  }
  return {};
}

Status KvCache::write(std::int64_t layer, std::int64_t position, std::int64_t count, const float* k, const float* v) {
  auto room = make_room(layer, position, count);
  if (!room) return room.error();
  if (count == 0) return {};
  const std::int64_t n = count * kv_heads_ * head_dim_;
  const std::size_t at = *room;
  const std::size_t bytes = static_cast<std::size_t>(count * kv_heads_) * row_bytes_;
  const auto L = static_cast<std::size_t>(layer);
  auto encode = [&](const float* src, std::byte* dst) -> Status {
    if (type_ == DType::f32) {
      std::memcpy(dst, src, static_cast<std::size_t>(n) * sizeof(float));
      return {};
    }
    if (auto s = quant::quantize_row(type_, src, dst, n); !s) return s.with_context("storing the KV cache");
    return {};
  };
  for (int which = 0; which < planes_; ++which) {
    const float* src = which == 0 ? k : v;
    sdk::Buffer* buffer = device_ ? (which == 0 ? k_dev_ : v_dev_)[L].get() : nullptr;
    std::byte* rows = nullptr;  // where attention reads them, when the host can write there
    if (buffer == nullptr) {
      rows = (which == 0 ? k_ : v_)[L].data() + at;
    } else if (auto* mapped = static_cast<std::byte*>(buffer->host_pointer())) {
      rows = mapped + at;
    }
    if (rows != nullptr) {
      if (auto s = encode(src, rows); !s) return s;
      continue;
    }
    // Unmapped device memory: encode the new rows in staging (f32 rows go as they are) and send only them up.
    const void* up = src;
    if (type_ != DType::f32) {
      staging_.resize(bytes);
      if (auto s = encode(src, staging_.data()); !s) return s;
      up = staging_.data();
    }
    auto ev = device_->copy_to_device_async(up, *buffer, at, bytes);
    if (!ev) return ev.error().with_context("uploading KV cache rows");
    // Waited here: the attention that reads these rows is the next op (copy_to_device_async is done with `up` at
    // return, so staging may be reused for V at once).
    if (auto s = (*ev)->wait(); !s) return s.with_context("uploading KV cache rows");
  }
  return {};
}

bool KvCache::stores_on_device() const {
  return device_ != nullptr && device_->supports(sdk::Op::store_rows, type_);
}

Status KvCache::store(std::int64_t layer, std::int64_t position, std::int64_t count, const sdk::Tensor& k,
                      const sdk::Tensor& v) {
  if (!stores_on_device()) return Status(StatusCode::internal, "KV cache store() without a device that encodes rows");
  auto room = make_room(layer, position, count);
  if (!room) return room.error();
  if (count == 0) return {};
  const auto L = static_cast<std::size_t>(layer);
  for (int which = 0; which < planes_; ++which) {
    sdk::Tensor rows;
    rows.type = type_;
    rows.ne = {kv_heads_ * head_dim_, count, 1, 1};
    rows.buffer = (which == 0 ? k_dev_ : v_dev_)[L].get();
    rows.offset = *room;
    if (auto* mapped = static_cast<std::byte*>(rows.buffer->host_pointer())) rows.data = mapped + rows.offset;
    const sdk::Tensor& src = which == 0 ? k : v;
    sdk::OpCall call{sdk::Op::store_rows, std::span<const sdk::Tensor>(&src, 1), std::span<sdk::Tensor>(&rows, 1), {}};
    if (auto s = device_->run(call); !s) return s.with_context("storing the KV cache");
  }
  return {};
}

sdk::Tensor KvCache::keys(std::int64_t layer, std::int64_t length) const {
  return rows(k_, k_dev_, layer, length);
}

sdk::Tensor KvCache::values(std::int64_t layer, std::int64_t length) const {
  if (planes_ == 1) return keys(layer, length);
  return rows(v_, v_dev_, layer, length);
}

sdk::Tensor KvCache::rows(const std::vector<AlignedBuffer>& host, const std::vector<std::unique_ptr<sdk::Buffer>>& dev,
                          std::int64_t layer, std::int64_t length) const {
  sdk::Tensor t;
  t.type = type_;
  const auto L = static_cast<std::size_t>(layer);
  t.ne = {head_dim_, kv_heads_, length - first_[L], 1};
  if (device_) {
    t.buffer = dev[L].get();
    t.data = t.buffer->host_pointer();
  } else {
    t.data = host[L].data();
  }
  return t;
}

}  // namespace colibri::engine
