// The KV cache: per layer, K and V rows of head_dim for every (position, kv head), stored as f16 (default), q8_0 or
// f32. The attention op reads it as {head_dim, n_kv_heads, positions}. In host memory, or in a compute backend's
// buffers (a discrete GPU's memory): attention then reads it in place instead of receiving the whole prefix over the
// bus at every layer of every token; a write sends only the new rows.
//
// A sliding-window layer (gpt-oss's even layers, Mistral's window) keeps only the positions its attention can still
// read: a few windows' worth of rows, not the whole context. Its rows start at first_position(layer), always a
// multiple of 64, so key row j holds position first_position + j and the backends' attention, whose key blocks are
// aligned to row 0 modulo 64 (the compute contract), sums in the order it would over the whole cache: same bits.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "colibri/engine/memory.hpp"
#include "colibri/sdk/compute.hpp"
#include "colibri/sdk/dtype.hpp"
#include "colibri/sdk/status.hpp"

namespace colibri::engine {

// Which layers slide, which carry a recurrent state instead of rows, and the most positions one write brings.
struct KvWindows {
  std::vector<std::int64_t> window;  // per layer: its sliding window, 0 for full attention; empty: every layer full
  std::int64_t max_write = 0;        // the most positions one write() or store() brings (the engine's ubatch)
  // Per layer: the floats of a recurrent layer's state (Qwen3-Next's linear attention), which holds no KV rows;
  // 0 (or empty) for attention layers.
  std::vector<std::int64_t> state;
  // The most checkpoints (checkpoint()) a cache keeps: copies of the sliding layers' rows and the recurrent states at
  // chosen positions, to which a later prompt sharing that much returns (memory.kv_checkpoints).
  std::int64_t checkpoints = 1;
};

class KvCache {
 public:
  // Rows one layer keeps: the context, or for a window W (> 0) enough for the W - 1 positions before a write, up to
  // 63 more from aligning its first row to 64, the write itself, and W + 64 of slack (so rows move once every W or
  // more positions), when that is less than the context.
  static std::int64_t layer_positions(std::int64_t window, std::int64_t max_write, std::int64_t context);
  // Bytes of a cache of `context` positions (K and V of every layer; K alone where values_are_keys), with the most
  // its checkpoints' copies take.
  static std::uint64_t bytes_for(sdk::DType type, std::int64_t layers, std::int64_t kv_heads, std::int64_t head_dim,
                                 std::int64_t context, const KvWindows& windows = {}, bool values_are_keys = false);
  // Of bytes_for: the most its checkpoints' copies take (host memory).
  static std::uint64_t checkpoint_bytes_for(sdk::DType type, std::int64_t layers, std::int64_t kv_heads,
                                            std::int64_t head_dim, std::int64_t context, const KvWindows& windows,
                                            bool values_are_keys = false);
  // Bytes one position takes over all layers (K and V; K alone where values_are_keys).
  static std::uint64_t bytes_per_position(sdk::DType type, std::int64_t layers, std::int64_t kv_heads,
                                          std::int64_t head_dim, bool values_are_keys = false);
  // type: f16, q8_0 (head_dim a multiple of 32) or f32; errors name the type and why. With `device`, the rows live
  // in buffers from device->allocate() (one per layer for K and one for V); an allocation that fails is an error.
  // With `windows`, sliding layers keep layer_positions() rows. With values_are_keys (multi-head latent attention,
  // whose values are the keys' latent part) only keys are stored: values() are the keys, and writes take no v.
  static sdk::Expected<KvCache> create(sdk::DType type, std::int64_t layers, std::int64_t kv_heads,
                                       std::int64_t head_dim, std::int64_t context,
                                       std::shared_ptr<sdk::Compute> device = nullptr, KvWindows windows = {},
                                       bool values_are_keys = false);

  // Stores T positions starting at `position`: k and v are f32 {head_dim, kv_heads, T}. A sliding layer first moves
  // its last rows to the front when the new ones would not fit (its first position stays a multiple of 64); rows it
  // dropped that these positions' queries need, or T above max_write, are errors (rewind() first).
  sdk::Status write(std::int64_t layer, std::int64_t position, std::int64_t count, const float* k, const float* v);
  // Whether store() can run: the cache is in device memory whose backend encodes rows there (Op::store_rows).
  [[nodiscard]] bool stores_on_device() const;
  // Stores T positions starting at `position` from k and v {head_dim * kv_heads, T} f32 tensors the cache's backend
  // reads (its device buffers): encoded there by store_rows, so nothing crosses the bus. Same bytes as write().
  sdk::Status store(std::int64_t layer, std::int64_t position, std::int64_t count, const sdk::Tensor& k,
                    const sdk::Tensor& v);
  // Views of positions [first_position(layer), length) of a layer: host data, or a device buffer (data set only when
  // it is mapped). Attention over them takes its query positions less first_position(layer).
  [[nodiscard]] sdk::Tensor keys(std::int64_t layer, std::int64_t length) const;
  [[nodiscard]] sdk::Tensor values(std::int64_t layer, std::int64_t length) const;
  // The position row 0 of the layer holds: 0, or for a sliding layer a multiple of 64.
  [[nodiscard]] std::int64_t first_position(std::int64_t layer) const;
  // The most positions m <= n (n <= the positions written) that running on from position m finds every row for:
  // n where the sliding layers still hold n's window, else the furthest checkpoint that serves, else 0.
  [[nodiscard]] std::int64_t reusable(std::int64_t n) const;
  // Keeps reusable(n) positions, putting a checkpoint's rows and states back where the layers have moved on; returns
  // them. Checkpoints past them are forgotten (the positions after them will be written again).
  std::int64_t rewind(std::int64_t n);
  // Keeps a copy of what running on from position n, or up to 64 before it, reads that the cache would not keep
  // (n <= the positions written, and held): the sliding layers' last rows and the recurrent layers' states, which
  // must be at n. A prompt's end, to which the next turn returns when the reply's tokens are not in its prompt (a
  // reasoning channel the history drops); where its last message or its system prompt starts (an edited last message;
  // another conversation with the same system prompt). Up to KvWindows::checkpoints; making one more forgets the one
  // least recently made or returned to. Nothing to keep (only full-attention layers) or nothing at n: nothing done.
  sdk::Status checkpoint(std::int64_t n);
  // Whether checkpoint() keeps anything: a layer slides or carries a recurrent state, and checkpoints are allowed.
  [[nodiscard]] bool keeps_checkpoints() const;
  // How many checkpoints it keeps at most (KvWindows::checkpoints).
  [[nodiscard]] std::int64_t checkpoint_limit() const { return windows_.checkpoints; }
  // The positions checkpoints are kept at, ascending (tests, logs).
  [[nodiscard]] std::vector<std::int64_t> checkpoint_positions() const;

  // Copies positions [0, count) of every layer from `src`, a cache of the same shape, type and windows, each in host
  // or device memory (on the device itself where both caches are on one whose backend copies between its buffers,
  // sdk::kDeviceCopyInterface; else through host memory). The rows are the bytes `src` holds, so attention
  // over them gives the bits running those positions again would. A sliding layer copies the rows it holds (they must
  // serve count); a recurrent layer its state, which `src` must hold at count (where it is, or in a checkpoint). A
  // copy that fails part way leaves this cache holding nothing.
  sdk::Status copy_prefix_from(const KvCache& src, std::int64_t count);

  // Recurrent layers (KvWindows::state): a state that sums up every position before state_position(), where the rows
  // are (host memory, or the device's: a layer's state never crosses the bus in a pass). A recurrent model's cache
  // serves only the positions a state is kept for: where the states are, and its checkpoints (host copies);
  // reusable() and rewind() answer so.
  [[nodiscard]] bool recurrent(std::int64_t layer) const;
  [[nodiscard]] bool has_recurrent() const { return !state_.empty(); }
  // Layer l's state for a pass from `position`, an f32 tensor of its floats (host data, or a device buffer): zeros at
  // position 0, else the state, which must be at `position` (rewind() first). Until state_written() the layer's state
  // counts as lost: a pass that fails part way leaves it so.
  sdk::Expected<sdk::Tensor> state_for(std::int64_t layer, std::int64_t position);
  void state_written(std::int64_t layer, std::int64_t position) {
    state_at_[static_cast<std::size_t>(layer)] = position;
  }

  [[nodiscard]] std::int64_t context() const { return context_; }
  // The most positions one write() or store() takes: windows.max_write where a layer slides, else the context.
  [[nodiscard]] std::int64_t max_write() const;
  [[nodiscard]] sdk::DType type() const { return type_; }
  // Every byte it may take: its rows and states, and its checkpoints' copies (host memory, at most).
  [[nodiscard]] std::uint64_t bytes() const { return total_bytes_; }
  // Of bytes(): the checkpoints' copies, at most (the rest is where the rows are: a device's memory or the host's).
  [[nodiscard]] std::uint64_t checkpoint_bytes() const { return checkpoint_bytes_; }
  [[nodiscard]] bool on_device() const { return device_ != nullptr; }
  // The most positions it has held (written or copied in): host rows it has paid for, which stay paid when it is
  // rewound (its bytes for that many positions are the most its pages take).
  [[nodiscard]] std::int64_t reach() const { return reach_; }

 private:
  // write() and store(): positions [position, position + count) of a layer fit the cache; a sliding layer's rows
  // are moved first where they would not. Returns the row `position` goes to.
  sdk::Expected<std::size_t> make_room(std::int64_t layer, std::int64_t position, std::int64_t count);
  // Moves rows [from, from + n) of a layer's K and V to row 0.
  sdk::Status move_rows(std::size_t layer, std::int64_t from, std::int64_t n);
  // keys() or values(): one layer's rows in host memory or in its device buffer.
  [[nodiscard]] sdk::Tensor rows(const std::vector<AlignedBuffer>& host,
                                 const std::vector<std::unique_ptr<sdk::Buffer>>& dev, std::int64_t layer,
                                 std::int64_t length) const;

  sdk::DType type_ = sdk::DType::f16;
  std::int64_t layers_ = 0, kv_heads_ = 0, head_dim_ = 0, context_ = 0;
  int planes_ = 2;  // K and V; 1 where the values are the keys
  KvWindows windows_;
  std::vector<std::int64_t> rows_;   // per layer: rows held (the context, or fewer for a sliding layer)
  std::vector<std::int64_t> first_;  // per layer: the position of row 0
  // checkpoint(): what running on from `at` (or up to 64 positions before it) needs that the layers may not hold.
  struct Checkpoint {
    std::int64_t at = 0;
    std::uint64_t used = 0;                    // when made or last returned to (the least recent goes first)
    std::vector<std::int64_t> first;           // per layer: the position of its first saved row (sliding layers)
    std::vector<std::vector<std::byte>> k, v;  // per sliding layer: K and V rows of positions [first, at)
    std::vector<std::vector<float>> state;     // per recurrent layer: its state at `at` (empty: none kept)
    [[nodiscard]] bool holds_state() const {
      return std::any_of(state.begin(), state.end(), [](const auto& s) { return !s.empty(); });
    }
  };
  std::vector<Checkpoint> checkpoints_;
  std::uint64_t clock_ = 0;
  // Recurrent layers: their states (empty vectors for attention layers, and for every layer of a cache on a device,
  // whose states are in state_dev_) and the position each state is at (-1: lost).
  std::vector<std::vector<float>> state_;
  std::vector<std::unique_ptr<sdk::Buffer>> state_dev_;  // per recurrent layer, when on a device (else empty)
  std::vector<std::int64_t> state_at_;
  // Copies layer l's state into dst, or src (null: zeros) into it, wherever it lives.
  sdk::Status state_to_host(std::size_t layer, float* dst) const;
  sdk::Status state_from_host(std::size_t layer, const float* src);
  // Whether a layer keeps fewer rows than the context (a sliding window; not a recurrent layer, which keeps none).
  [[nodiscard]] bool sliding(std::size_t layer) const;
  // The position every recurrent layer's state is at, or -1 where they differ or one is lost.
  [[nodiscard]] std::int64_t state_position() const;
  // The most positions m <= n that checkpoint c serves (0: none): its `at` where it holds states, else up to it.
  [[nodiscard]] std::int64_t checkpoint_serves(const Checkpoint& c, std::int64_t n) const;
  // Positions after `position` will be written again: checkpoints past it no longer describe this cache's positions
  // (one of sliding rows alone still serves `position` itself where it holds its window).
  void forget_after(std::int64_t position);
  // The first position a query at n reads in a layer: 0 where it has no window.
  [[nodiscard]] std::int64_t window_start(std::size_t layer, std::int64_t n) const;
  // Whether layers whose rows start at `first` hold what running on from position n reads.
  [[nodiscard]] bool serves(std::int64_t n, const std::vector<std::int64_t>& first) const;
  // Copies rows [row, row + n) of a layer's K (which 0) or V (1) into dst, or from src into them.
  sdk::Status rows_to_host(std::size_t layer, int which, std::int64_t row, std::int64_t n, std::byte* dst) const;
  sdk::Status rows_from_host(std::size_t layer, int which, std::int64_t row, std::int64_t n, const std::byte* src);
  std::size_t row_bytes_ = 0;
  std::uint64_t total_bytes_ = 0, checkpoint_bytes_ = 0;
  std::int64_t reach_ = 0;
  std::vector<AlignedBuffer> k_, v_;
  std::shared_ptr<sdk::Compute> device_;                     // keeps the buffers' backend alive
  sdk::ComputeDeviceCopy* device_copy_ = nullptr;            // device_'s copies between its buffers, if it has them
  std::vector<std::unique_ptr<sdk::Buffer>> k_dev_, v_dev_;  // per layer, when on a device
  std::vector<std::byte> staging_;                           // new rows in the cache's type, on their way up
};

}  // namespace colibri::engine
