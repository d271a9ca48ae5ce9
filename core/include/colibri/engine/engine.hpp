// The inference engine: a converted model (manifest + shared weights resident + experts through the expert
// manager), one sequence with its KV cache, and the per-layer program run through the compute plugin's op set.
//
// THE ONE PROMISE (DESIGN.md): for one backend and one model file, logits are bit-identical whatever the storage
// plugin, cache policy, cache sizes or batch composition. The program keeps it by running every op per token
// (the compute contract), combining routed experts in ascending expert id, and never changing routing or precision
// for speed. The one opt-in exception is compute.cpu_fallback: auto, which runs some experts on a second backend.
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "colibri/engine/expert_manager.hpp"
#include "colibri/engine/kv_cache.hpp"
#include "colibri/engine/memory.hpp"
#include "colibri/engine/offload_cost.hpp"
#include "colibri/engine/op_timing.hpp"
#include "colibri/engine/rope.hpp"
#include "colibri/model/manifest.hpp"
#include "colibri/profile/profile.hpp"
#include "colibri/sdk/cache_policy.hpp"
#include "colibri/sdk/compute.hpp"
#include "colibri/sdk/storage.hpp"

namespace colibri::engine {

struct EngineOptions {
  // Directories holding mirror copies of the model's files (storage.paths, when the storage plugin reads copies):
  // a file missing or damaged in the model directory but whole there does not stop the load.
  std::vector<std::filesystem::path> mirror_dirs;
  std::int64_t context = 0;                         // 0: from memory.kv_cache, else the model's max_position_embeddings
  sdk::DType kv_type = sdk::DType::f16;             // f16 | q8_0 | f32
  std::int64_t ubatch = 512;                        // tokens per forward chunk (prefill memory bound)
  std::optional<std::uint64_t> expert_cache_bytes;  // overrides memory.expert_cache
  bool exact_activations = false;                   // forbid per-token activation quantization in quantized matmuls
  std::optional<std::int64_t> prefetch_layers;      // overrides prefetch.layers (0: off; only when streaming)
  std::optional<double> prefetch_confidence;        // overrides prefetch.confidence
  std::optional<std::uint64_t> vram_budget_bytes;   // overrides memory.vram_budget (0: no VRAM tier)
  std::optional<bool> shared_on_device;             // overrides memory.shared_on_device
  std::optional<bool> kv_on_device;                 // overrides memory.kv_on_device
  std::optional<bool> kv_sliding_window;            // overrides memory.kv_sliding_window
  std::optional<std::int64_t> kv_checkpoints;       // overrides memory.kv_checkpoints
  std::optional<bool> activations_on_device;        // overrides memory.activations_on_device
  bool vram_admission = true;                       // memory.vram_admission: frequency (true) | always
  // compute.cpu_fallback's cost model: host-to-device and CPU expert rates in GB/s (0: measured at load).
  double upload_gbps = 0;
  double cpu_gbps = 0;
  // bench --ops: count and time every call to the compute backend (op_timing()).
  bool time_ops = false;
  // The caller runs only new_sequence()'s KV caches (the server, a draft model): the engine's own (forward()'s) stays
  // a host reservation never written, so device memory holds only the caches sequences use.
  bool sequences_only = false;
  // KV caches of context() positions the caller may hold at once (the server: --max-batch) and, beside each, the
  // bytes of n positions of another engine's (a draft model's: Engine::kv_cache_bytes): an automatic context fits
  // them all, and the warning for caches that would outgrow the RAM counts them.
  std::int64_t kv_sequences = 1;
  std::function<std::uint64_t(std::int64_t)> kv_beside;
  // RAM another engine opened after this one will take (a draft model's shared weights and its part of the expert
  // cache): not there for the KV caches, though available when this one opens.
  std::uint64_t ram_beside = 0;
  // The caller starts a sequence only while the caches together fit kv_host_budget() (the server's scheduler): a
  // context whose kv_sequences caches would outgrow the RAM is then warned about only where one alone would.
  bool kv_admission = false;
};

struct Plugins {
  std::shared_ptr<sdk::Compute> compute;
  std::shared_ptr<sdk::Storage> storage;
  std::shared_ptr<sdk::CachePolicy> cache;
  std::shared_ptr<sdk::CachePolicy> vram_cache;  // the VRAM tier's own instance of the same policy plugin
  // compute.cpu_fallback: auto: the CPU backend, for experts not in VRAM that the cost model says run faster there
  // than uploaded. Logits then depend on which experts were in VRAM (two backends, two sets of low bits).
  std::shared_ptr<sdk::Compute> cpu_fallback;
  std::string compute_name, storage_name, cache_name;
};

// Routing of one token in one sparse layer (for --trace).
struct RoutingRecord {
  std::int64_t position = 0;
  std::int64_t layer = 0;
  std::int64_t step = 0;  // the forward pass (prefill chunk or batch step) it ran in: one expert access per step
  std::vector<std::int32_t> experts;  // by descending weight, as the router ranked them
  std::vector<float> weights;
};

enum class LogitsWanted { none, last, all };

class Engine {
 public:
  // Creates the plugins the profile names and opens the model. Errors name the file or key at fault. `manifest`: one
  // the caller already read from model_dir (model::load_manifest succeeded), not read again.
  static sdk::Expected<std::unique_ptr<Engine>> open(const std::filesystem::path& model_dir, profile::Profile& profile,
                                                     EngineOptions options,
                                                     std::optional<model::Manifest> manifest = std::nullopt);
  // The profile's compute, storage and cache plugins, created and checked as open() does (plugin options, canonical
  // choices such as memory.vram_admission); fills the options the profile sets. `profile show` runs it too, so a
  // profile it passes does not fail at the first run.
  static sdk::Expected<Plugins> plugins_from_profile(profile::Profile& profile, EngineOptions& options);
  // The RAM tier's budget open() gives the experts: options.expert_cache_bytes, else memory.expert_cache, else
  // util::auto_expert_cache_bytes().
  static std::uint64_t expert_cache_budget(const profile::Profile& profile, const EngineOptions& options);
  // Fills the memory.* options the caller left unset from the profile (plugins_from_profile does too).
  static sdk::Status memory_options(const profile::Profile& profile, EngineOptions& options);
  // The bytes of one KV cache of n positions for a model of `hp` with these options (memory_options filled).
  static std::function<std::uint64_t(std::int64_t)> kv_cache_bytes(const model::HyperParams& hp,
                                                                   const EngineOptions& options);
  // With plugins the caller made (tests).
  static sdk::Expected<std::unique_ptr<Engine>> open(const std::filesystem::path& model_dir, Plugins plugins,
                                                     std::uint64_t expert_cache_bytes, std::uint64_t kv_cache_bytes,
                                                     EngineOptions options,
                                                     std::optional<model::Manifest> manifest = std::nullopt);
  ~Engine();

  // Runs `tokens` at positions n_past() .. n_past()+T-1 and appends them to the KV cache. Fills `logits` with
  // [rows x vocab] floats: every position (all), the last one (last) or nothing. `trace` (may be null) receives the
  // routing of every token in every sparse layer. Errors leave n_past() unchanged. The KV cache keeps a checkpoint
  // (KvCache::checkpoint) at each of `checkpoints` (positions) this run passes or ends at, where it keeps any; the
  // run stops there for it, which never changes a result (as --batch).
  sdk::Status forward(std::span<const std::int32_t> tokens, LogitsWanted wanted, std::vector<float>& logits,
                      std::vector<RoutingRecord>* trace = nullptr, std::span<const std::int64_t> checkpoints = {});

  // --- Several sequences in one step (continuous batching) ---
  // A sequence with its own KV cache (this engine's context and KV type) and position.
  struct Sequence {
    KvCache kv;
    std::int64_t n_past = 0;
  };
  [[nodiscard]] sdk::Expected<std::unique_ptr<Sequence>> new_sequence() const;
  struct BatchItem {
    Sequence* sequence = nullptr;
    std::span<const std::int32_t> tokens;  // run at sequence->n_past ..; appended to its KV cache
    std::vector<float>* logits = nullptr;  // non-null: the last token's [vocab] logits
    bool all_logits = false;               // with logits: every token's, [tokens x vocab] (prompt logprobs)
    // A prompt run in chunks: the position after its last token (0: after these tokens). Dynamic rope rotates a
    // pass by its length, so every chunk of one prompt takes the whole prompt's, as one forward() would.
    std::int64_t pass_end = 0;
  };
  // Runs every item's tokens in one pass: per-token ops over the union of all tokens (each routed expert is read
  // once and runs all its tokens together), attention per sequence. Each sequence gets exactly the logits a
  // forward() of its own would give (the compute contract's batch-composition invariance). Errors leave every
  // n_past unchanged.
  sdk::Status forward_batch(std::span<const BatchItem> items, std::vector<RoutingRecord>* trace = nullptr);

  void reset() { n_past_ = 0; }
  // Forgets positions >= n (n <= n_past()), or more where a sliding-window layer no longer holds the rows position n
  // needs, or a recurrent layer's state is not kept for: back to a checkpoint that serves, else every position.
  // n_past() tells which.
  void truncate(std::int64_t n) { n_past_ = kv_.rewind(std::min(n_past_, std::max<std::int64_t>(0, n))); }
  [[nodiscard]] std::int64_t n_past() const { return n_past_; }
  [[nodiscard]] std::int64_t context() const { return kv_.context(); }
  [[nodiscard]] std::int64_t vocab_size() const { return hp_.vocab_size; }
  [[nodiscard]] const model::HyperParams& hparams() const { return hp_; }
  [[nodiscard]] const model::Manifest& manifest() const { return manifest_; }
  [[nodiscard]] const std::filesystem::path& model_dir() const { return dir_; }
  [[nodiscard]] const Plugins& plugins() const { return plugins_; }
  // The compute backend's calls counted and timed, with EngineOptions::time_ops; null without.
  [[nodiscard]] TimedCompute* op_timing() const { return op_timing_.get(); }
  [[nodiscard]] const ExpertManager& experts() const { return *experts_; }
  // Cache admin (clear, warm): only between forward passes, on the thread that runs them.
  [[nodiscard]] ExpertManager& experts() { return *experts_; }
  [[nodiscard]] std::int64_t prefetch_layers() const { return prefetch_layers_; }
  [[nodiscard]] double prefetch_confidence() const { return prefetch_confidence_; }
  [[nodiscard]] const KvCache& kv_cache() const { return kv_; }
  [[nodiscard]] std::uint64_t shared_bytes() const { return shared_bytes_; }
  // Bytes of shared weights held in the compute backend's device memory (memory.shared_on_device).
  [[nodiscard]] std::uint64_t shared_device_bytes() const { return shared_device_bytes_; }
  // Bytes of this engine's KV cache held in the compute backend's device memory (memory.kv_on_device).
  [[nodiscard]] std::uint64_t kv_device_bytes() const { return kv_.on_device() ? kv_.bytes() : 0; }
  // Host memory the sequences' KV caches may take together: the RAM available at open beside the expert tier; 0
  // where they are made in device memory (an allocation there that fails is an error new_sequence() returns).
  [[nodiscard]] std::uint64_t kv_host_budget() const { return kv_host_budget_; }
  // Bytes a sequence's KV cache takes at `positions` (at most the context), with what EngineOptions::kv_beside keeps
  // beside it (its draft model's cache) unless `beside` is false.
  [[nodiscard]] std::uint64_t kv_sequence_bytes(std::int64_t positions, bool beside = true) const {
    if (!kv_own_bytes_) return 0;
    const std::int64_t n = std::clamp<std::int64_t>(positions, 0, kv_.context());
    return kv_own_bytes_(n) + (beside && options_.kv_beside ? options_.kv_beside(n) : 0);
  }
  // Whether activations stay in the compute backend's device memory between ops (memory.activations_on_device).
  [[nodiscard]] bool activations_on_device() const;
  [[nodiscard]] std::string mode() const { return experts_->resident() ? "resident" : "streaming"; }
  // compute.cpu_fallback's cost model; null when the fallback is off (or had nothing to fall back for).
  [[nodiscard]] const OffloadCost* offload_cost() const { return plugins_.cpu_fallback ? &offload_ : nullptr; }

 private:
  Engine();
  struct Layer;
  sdk::Status init(const std::filesystem::path& dir, Plugins plugins, std::uint64_t expert_cache_bytes,
                   std::uint64_t kv_cache_bytes, EngineOptions options, std::optional<model::Manifest> manifest);
  sdk::Status forward_chunk(std::span<const std::int32_t> tokens, std::int64_t position, std::int64_t pass_end,
                            LogitsWanted wanted, float* logits, std::vector<RoutingRecord>* trace);
  sdk::Status run_op(sdk::Op op, std::initializer_list<sdk::Tensor> inputs, std::initializer_list<sdk::Tensor> outputs,
                     sdk::OpParams params = {});
  // expert_ffn, or expert_ffn_clamped for gpt-oss's biased experts (alpha and limit from the hyper-parameters).
  [[nodiscard]] sdk::Op expert_op() const;
  sdk::Status run_expert_op(sdk::Compute& compute, const std::string& name, const ExpertWeights& w,
                            const sdk::Tensor& x, const sdk::Tensor& y, sdk::OpParams params);
  // The router's logits (with its bias where the model has one), from unquantized activations.
  sdk::Status router_logits(const Layer& L, const sdk::Tensor& h, const sdk::Tensor& logits);
  // topk_routing's params for a layer of top_k experts (scores, renormalization, GLM's scaling factor).
  [[nodiscard]] sdk::OpParams routing_params(std::int64_t top_k) const;
  // The experts the router picks from its logits: topk_routing, or topk_routing_biased where the layer has a
  // selection bias (GLM's e_score_correction_bias).
  sdk::Status choose_experts(const Layer& L, const sdk::Tensor& logits, const sdk::Tensor& ids,
                             const sdk::Tensor& weights, const sdk::OpParams& params);
  sdk::Status run_op_on(sdk::Compute& compute, const std::string& name, sdk::Op op,
                        std::initializer_list<sdk::Tensor> inputs, std::initializer_list<sdk::Tensor> outputs,
                        sdk::OpParams params = {});
  // compute.cpu_fallback: keeps the CPU backend only where experts can miss VRAM, and measures the cost model.
  sdk::Status setup_cpu_fallback(bool has_device_memory);
  // Whether expert e of layer l runs on the CPU for `tokens` tokens (compute.cpu_fallback and its cost model).
  [[nodiscard]] bool cpu_runs(std::int64_t l, std::int64_t e, std::int64_t tokens) const;
  // Runs the expert over x into y: on the CPU backend from RAM when `on_cpu`, else on the backend (VRAM or RAM).
  sdk::Status run_expert(std::int64_t l, std::int64_t e, const sdk::Tensor& x, const sdk::Tensor& y, bool on_cpu,
                         const sdk::OpParams& params);
  // How many experts of `order` from `from` on can run as one group call (expert_ffn_group, or
  // expert_ffn_clamped_group for biased experts): ready (acquire() will not wait) and not on the CPU fallback; 0
  // where the backend does not offer the op.
  [[nodiscard]] std::size_t groupable(std::int64_t l, std::span<const std::int32_t> order, std::size_t from,
                                      const std::set<std::int32_t>& on_cpu) const;
  // Runs experts[i] over xs[i] into ys[i]: one alone through run_expert, several (all groupable()) in one group
  // call, with the same bits as run_expert per expert.
  sdk::Status run_experts(std::int64_t l, std::span<const std::int32_t> experts, std::span<const sdk::Tensor> xs,
                          std::span<sdk::Tensor> ys, const std::set<std::int32_t>& on_cpu, const sdk::OpParams& params);
  sdk::Status upload_shared_weights(const sdk::DeviceInfo& device);
  // A KV cache of `context` positions: in device memory when kv_on_device_ and it fits there, else in host memory.
  [[nodiscard]] sdk::Expected<KvCache> make_kv_cache(std::int64_t context) const;
  struct Act;
  // Activations: sized for `floats` (host vector, or a device buffer that grows), viewed as an f32 tensor from
  // element `at`, copied to and from host memory (memcpy for host arrays), clamped in place.
  sdk::Status size(Act& a, std::size_t floats);
  [[nodiscard]] sdk::Tensor view(Act& a, std::int64_t ne0, std::int64_t ne1 = 1, std::int64_t ne2 = 1,
                                 std::size_t at = 0) const;
  sdk::Status to_host(const sdk::Tensor& t, float* dst);
  sdk::Status from_host(const float* src, const sdk::Tensor& t);
  // Several from_host() copies, all started before any is waited for.
  sdk::Status from_host_all(std::initializer_list<std::pair<const float*, sdk::Tensor>> copies);
  sdk::Expected<const float*> host_view(const sdk::Tensor& t, std::vector<float>& staging);
  sdk::Status clamp(const sdk::Tensor& t, float limit);
  // Per-head q/k norms (null weights: 1, Llama 4's); Llama 4's attention steps (run_layers): a cache tensor from a row
  // on, NoPE query scales.
  sdk::Status norm_heads(const sdk::Tensor* q_weight, const sdk::Tensor* k_weight, std::int64_t nh, std::int64_t nkv,
                         std::int64_t T, const sdk::OpParams& norm_p);
  [[nodiscard]] static sdk::Tensor rows_from(sdk::Tensor t, std::int64_t first);
  sdk::Status scale_queries_by_temperature(std::int64_t qd, std::int64_t T);
  sdk::Status scaled_columns(const sdk::Tensor& x, std::int64_t rows, std::span<const float> w, Act& weights, Act& out);
  // Logits of the rows of x {D, rows} (host or device): output norm, then the output matmul into logits.
  sdk::Status output_head(const sdk::Tensor& x, float* logits);
  // Appends k and v {kv_heads * head_dim, T} (host or device) at `position` of layer l.
  sdk::Status write_kv(KvCache& kv, std::int64_t l, std::int64_t position, const sdk::Tensor& k, const sdk::Tensor& v);
  // The layer's experts over h {D, T} into out (its Act: the no-gate shared expert swaps in its sum); routing
  // records carry the row t.
  sdk::Status moe(const Layer& layer, std::int64_t l, std::int64_t T, const sdk::Tensor& h, Act& out,
                  std::vector<RoutingRecord>* trace);
  // Pick j of token row t of layer l: a NaN mark, a weight that is not finite or an expert outside the model is an
  // error that says so.
  [[nodiscard]] sdk::Status check_pick(std::int64_t l, std::int64_t t, std::int32_t e, float weight) const;
  // A token's pick repeated (the SDK has topk_routing's picks distinct): the error naming the backend.
  [[nodiscard]] sdk::Status repeated_pick(std::int64_t l, std::int64_t t, std::int32_t e) const;
  // expert_ffn_routed: whether layer l's table (scratch) holds, refreshed when the experts moved.
  bool routed_table(std::int64_t l);
  // Views of layer l's region of the device buffer that holds decode's router choices (K ids, K weights), which
  // starts choice_at(l) floats into it.
  sdk::Status device_choice(std::int64_t l, std::int64_t K, sdk::Tensor& ids, sdk::Tensor& weights);
  [[nodiscard]] std::size_t choice_at(std::int64_t l) const;
  // Whether the next layers' routers predict experts to prefetch (and their hits are counted): streaming, with
  // prefetch on, and no VRAM tier that holds every expert (nothing is read then).
  [[nodiscard]] bool predicts() const;
  // topk_routing and expert_ffn_routed for one token into out, the choice kept (in host memory, or in its layer's
  // region of device memory) for settle_routed(). Every pass ends with finish_routed(), on failure too, so no choice
  // outlives its pass. An `unsupported` answer comes back as it is: nothing was queued, and the layer runs as before.
  sdk::Status route_on_backend(std::int64_t l, std::int64_t K, const sdk::Tensor& h, Act& out,
                               const sdk::OpParams& topk_p, const sdk::OpParams& mm_p);
  // At the end of a pass: downloads the routed layers' choices left in device memory (one copy for all), then
  // checks them and counts the experts' uses and records as moe() does while it routes.
  sdk::Status settle_routed(std::vector<RoutingRecord>* trace);
  // The shared expert (Qwen-MoE), added to out.
  sdk::Status shared_expert(const Layer& layer, std::int64_t T, const sdk::Tensor& h, Act& out,
                            const sdk::OpParams& mm_p);
  // T tokens' rows [first, first + n) of S.ids at positions position.. of one KV cache.
  struct Segment {
    KvCache* kv;
    std::int64_t position, first, n;
    std::int64_t pass_end = 0;  // the end of the pass (prompt) these tokens belong to, for dynamic rope (0: own end)
  };
  // `settle`: end with finish_routed(); without it the caller does, once it has queued what follows the layers.
  sdk::Status run_layers(std::span<const Segment> segments, std::vector<RoutingRecord>* trace, bool settle = true);
  // Qwen3-Next's gated-delta-rule layer l over S.h (the normed input) into S.tmp (after its output projection): the
  // convolution and the delta rule per segment, on its sequence's recurrent state.
  sdk::Status linear_attention(const Layer& L, std::int64_t l, std::span<const Segment> segments,
                               const sdk::OpParams& norm_p, const sdk::OpParams& mm_p);
  // Multi-head latent attention of layer l over S.h (the normed input) into S.tmp (after o_proj); freq_at: each
  // segment's inv_freq in S.rope_in (offset, count).
  sdk::Status mla_attention(const Layer& L, std::int64_t l, std::span<const Segment> segments,
                            std::span<const std::pair<std::size_t, std::int64_t>> freq_at, const sdk::OpParams& rope_p,
                            const sdk::OpParams& norm_p, const sdk::OpParams& mm_p);
  // MLA's softmax scale: 1 / sqrt(head_dim), times DeepSeek's yarn mscale(factor, mscale_all_dim) squared.
  [[nodiscard]] double mla_softmax_scale() const;
  // settle_routed() for the pass's routed layers, if any, and their records put back in layer order.
  sdk::Status finish_routed(std::vector<RoutingRecord>* trace);

  model::Manifest manifest_;
  model::HyperParams hp_;
  std::filesystem::path dir_;
  Plugins plugins_;
  std::shared_ptr<TimedCompute> op_timing_;
  EngineOptions options_;
  std::map<std::string, AlignedBuffer> shared_files_;  // file -> its bytes
  std::uint64_t shared_bytes_ = 0;
  struct Scratch;
  std::unique_ptr<Scratch> scratch_;
  std::vector<Layer> layers_;
  sdk::Tensor embedding_, output_norm_, output_;
  std::optional<RopeFrequencies> rope_;
  std::int32_t matmul_flags_ = 0;
  KvCache kv_;
  std::vector<float> zero_bias_;  // the selection bias of a router that scales without one (choose_experts)
  bool group_experts_ = false;    // the backend offers the experts' group op for every expert weight type
  bool routed_experts_ = false;   // decode routes on the backend (expert_ffn_routed) where routed_table() holds
  bool kv_on_device_ = false;     // memory.kv_on_device on a backend whose memory is not the host's
  std::uint64_t kv_host_budget_ = 0;
  std::function<std::uint64_t(std::int64_t)> kv_own_bytes_;  // Engine::kv_cache_bytes of this engine's caches
  KvWindows kv_windows_;  // the sliding-window layers every KV cache of this engine has (memory_plan's kv_windows)
  std::unique_ptr<ExpertManager> experts_;
  OffloadCost offload_;
  std::vector<std::unique_ptr<sdk::Buffer>> shared_device_;  // the shared weights in device memory, when uploaded
  std::uint64_t shared_device_bytes_ = 0;
  std::int64_t n_past_ = 0;
  std::int64_t passes_ = 0;  // forward passes run (routing records' step)
  // Prefetch: layers ahead, and the experts predicted for each coming layer of the current pass.
  sdk::Status prefetch_ahead(std::int64_t l, std::int64_t T, const sdk::Tensor& h,
                             std::span<const sdk::ExpertKey> keep);
  std::int64_t prefetch_layers_ = 0;
  double prefetch_confidence_ = 1.0;
  std::map<std::int64_t, std::set<std::int32_t>> predicted_;
};

// "f16" | "q8_0" | "f32" -> DType; errors name the flag value.
sdk::Expected<sdk::DType> parse_kv_type(const std::string& text);

}  // namespace colibri::engine
