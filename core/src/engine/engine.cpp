#include "colibri/engine/engine.hpp"

#include <spdlog/spdlog.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <new>
#include <utility>

#include "colibri/engine/memory_plan.hpp"
#include "colibri/registry/plugin_set.hpp"
#include "colibri/sdk/storage_view.hpp"
#include "colibri/util/bytes_text.hpp"
#include "colibri/util/host_info.hpp"

namespace colibri::engine {

using sdk::DType;
using sdk::Op;
using sdk::Status;
using sdk::StatusCode;
using sdk::Tensor;

namespace {

Tensor f32(float* p, std::int64_t a, std::int64_t b = 1, std::int64_t c = 1) {
  Tensor t;
  t.type = DType::f32;
  t.ne = {a, b, c, 1};
  t.data = p;
  return t;
}

Tensor i32(std::int32_t* p, std::int64_t n) {
  Tensor t;
  t.type = DType::i32;
  t.ne = {n, 1, 1, 1};
  t.data = p;
  return t;
}

Tensor i32_2d(std::int32_t* p, std::int64_t a, std::int64_t b) {
  Tensor t = i32(p, a);
  t.ne[1] = b;
  return t;
}

bool present(const Tensor& t) {
  return t.data != nullptr || t.buffer != nullptr;
}

using util::bytes_text;

// The op that runs several experts of `single` (expert_ffn or expert_ffn_clamped) in one call.
Op group_op(Op single) {
  return single == Op::expert_ffn_clamped ? Op::expert_ffn_clamped_group : Op::expert_ffn_group;
}

// An expert op's params: the clamped ops take gpt-oss's alpha and limit from the hyper-parameters.
sdk::OpParams expert_params(const model::HyperParams& hp, sdk::OpParams params) {
  if (hp.expert_bias()) {
    params.scale = static_cast<float>(hp.swiglu_alpha);
    params.eps = static_cast<float>(hp.swiglu_limit);
  }
  return params;
}

// Qwen3-Next's and Qwen3.5's optional ops (their gate's sigmoid is a required one).
constexpr Op kLinearOps[] = {Op::mul, Op::causal_conv, Op::gated_delta_rule};

// The first gate/up/down tensor of any expert that `compute` cannot run, or null.
const model::TensorEntry* unsupported_expert_part(const model::Manifest& manifest, const sdk::Compute& compute,
                                                  Op op = Op::expert_ffn) {
  for (const auto& e : manifest.experts) {
    for (const auto* part : {&e.gate, &e.up, &e.down}) {
      if (!compute.supports(op, part->type)) return part;
    }
  }
  return nullptr;
}

}  // namespace

struct Engine::Layer {
  Tensor attn_norm, wq, wk, wv, bq, bk, bv, wo, bo, q_norm, k_norm, ffn_norm, sinks;
  Tensor router, router_bias, selection_bias, sh_gate, sh_up, sh_down, sh_gate_inp;
  // Multi-head latent attention (wo as above): the query latent and its norm (q_lora_rank > 0), the queries' parts
  // without and with RoPE, the KV latent and its norm, the RoPE key, and per head k_b {nope, latent} and v_b.
  Tensor wq_a, q_a_norm, wq_nope, wq_rope, wkv_a, kv_a_norm, wk_rope, wk_b, wv_b;
  // Qwen3-Next: the attention output's gate projection; a gated-delta-rule layer's q, k, v, z, beta and alpha
  // projections, its convolution's taps for q, k and v, decay rate A, dt bias, per-head norm and output projection.
  Tensor wq_gate, lin_q, lin_k, lin_v, lin_z, lin_beta, lin_alpha, conv_q, conv_k, conv_v, lin_a, lin_dt, lin_norm,
      lin_out;
  // Every tensor above: memory.shared_on_device moves each one present to device memory and releases the host copy,
  // so one left out here would point at memory no longer mapped.
  auto tensors() {
    return std::array{
        &attn_norm, &wq,        &wk,       &wv,          &bq,     &bk,       &bv,          &wo,
        &bo,        &q_norm,    &k_norm,   &ffn_norm,    &sinks,  &router,   &router_bias, &selection_bias,
        &sh_gate,   &sh_up,     &sh_down,  &sh_gate_inp, &wq_a,   &q_a_norm, &wq_nope,     &wq_rope,
        &wkv_a,     &kv_a_norm, &wk_rope,  &wk_b,        &wv_b,   &wq_gate,  &lin_q,       &lin_k,
        &lin_v,     &lin_z,     &lin_beta, &lin_alpha,   &conv_q, &conv_k,   &conv_v,      &lin_a,
        &lin_dt,    &lin_norm,  &lin_out};
  }
  bool linear = false;
  bool sparse = false;
  std::int64_t top_k = 1;
};

// An activation array: host floats, or, with activations on the device, a buffer of the backend's own memory that
// the ops read and write in place (only what the host must see crosses the bus: routing, KV rows, logits).
struct Engine::Act {
  std::vector<float> host;
  std::unique_ptr<sdk::Buffer> buffer;
};

// Activations reused between calls (sizes follow the chunk length).
struct Engine::Scratch {
  sdk::Compute* device = nullptr;  // set: the Acts live in its buffers
  Act x, h, q, k, v, q2, k2, attn, tmp, moe, sum, shared, router;
  // Multi-head latent attention's activations, named by what they hold.
  struct Mla {
    Act q_latent, q_latent2, q_nope, q_rope, q_rope2, q_absorbed, q_cat, kv_latent, kv_latent2, k_rope, k_rope2, k_cat,
        o_cat, o_heads;
  } mla;
  // Qwen3-Next's gated-delta-rule activations: projections, then after the convolution, the rule's output, normed,
  // gated.
  struct Linear {
    Act q, k, v, z, beta, alpha, q_conv, k_conv, v_conv, o, o_norm, o_gated;
  } lin;
  Act rope_in;  // a pass's positions (i32 bits) and each segment's inv_freq: uploaded once, read by every layer
  Act gates;    // a layer's routing weights per routed expert (the "whole" combine)
  Act topk;     // decode on the device: topk_routing's ids (i32 bits), then its weights
  Act zeros;  // zeros on the device, the whole buffer: out = zeros + zeros starts the decode combine without an upload
  Act ones;   // {head_dim} of 1: the weight of qk_norm "l2" (Llama 4), uploaded once
  Act temperature;                    // a pass's query scales on Llama 4's NoPE layers
  Act input_weights, weighted_input;  // Llama 4: each token's routing weight, and its input to the expert scaled by it
  bool ones_ready = false;
  std::vector<Act> routed;  // per routed expert of a layer whose every token it runs (decode): its output
  std::vector<float> down, weights, gate, xe, ye, acc, last;  // host side: downloads, gathers, small vectors
  std::vector<std::int32_t> ids, positions, expert_ids;
  std::vector<float> pred_router, pred_weights;  // prefetch predictions (never the routing itself)
  std::vector<std::int32_t> pred_ids;
  std::map<std::int32_t, std::vector<float>> expert_out;  // routed experts' outputs until they are summed in order
  std::vector<Tensor> group_x, group_y, group_inputs;     // one expert_ffn(_clamped)_group call's tensors
  // expert_ffn_routed: each layer's table (W_gate, W_up, W_down per expert) while the experts' placement
  // (ExpertManager::placement_generation) is `routed_generation`, and the pass's choices, settled at its end.
  std::vector<std::vector<Tensor>> routed_tables;
  std::uint64_t routed_generation = 0;
  struct RoutedChoice {
    std::int64_t layer = 0;
    std::vector<std::int32_t> ids;
    std::vector<float> weights;
    std::size_t at = 0;      // on the device: where its ids start in `topk` (its weights follow), else unused
    bool on_device = false;  // the choice lies in `topk` until settled (one download for the whole pass)
  };
  std::vector<RoutedChoice> routed_choices;
  std::size_t routed_used = 0;
  std::size_t pass_trace_from = 0;  // the first routing record of the pass
};

Engine::Engine() = default;
Engine::~Engine() = default;

sdk::Expected<DType> parse_kv_type(const std::string& text) {
  if (text == "f16") return DType::f16;
  if (text == "q8_0") return DType::q8_0;
  if (text == "f32") return DType::f32;
  return Status(StatusCode::invalid_argument, "--kv-type '" + text + "' is not one of f16, q8_0, f32");
}

sdk::Expected<Plugins> Engine::plugins_from_profile(profile::Profile& profile, EngineOptions& options) {
  const auto reg = registry::scan_for_profile(profile);
  Plugins plugins;
  // With `auto`, a plugin whose create() fails gives way to the next score (registry::create_selected).
  auto compute = registry::create_selected_as<sdk::Compute>(profile, reg, sdk::PluginKind::compute);
  if (!compute) return compute.error();
  auto storage = registry::create_selected_as<sdk::Storage>(profile, reg, sdk::PluginKind::storage);
  if (!storage) return storage.error();
  auto cache = registry::create_selected_as<sdk::CachePolicy>(profile, reg, sdk::PluginKind::cache);
  if (!cache) return cache.error();
  if (const auto pins = profile.get_list("cache.pinned_experts");
      !pins.empty() && cache->object->wanted_pins().empty()) {
    spdlog::warn(
        "cache.pinned_experts ({} listed) ignored: cache policy {} does not pin experts; set cache.policy: "
        "pinned to keep them",
        pins.size(), cache->info->name);
  }
  if (auto s = memory_options(profile, options); !s) return s;
  if (*options.vram_budget_bytes > 0) {
    auto vram_cache = reg.create_as<sdk::CachePolicy>(*cache->info, profile.section("cache"));
    if (!vram_cache) return vram_cache.error().with_context("creating cache plugin " + cache->info->name);
    plugins.vram_cache = *vram_cache;
  }
  auto compute_section = profile.section("compute");
  if (profile.get_string("compute.cpu_fallback") == "auto" && compute->info->name != "cpu") {
    const auto* cpu_info = reg.find(sdk::PluginKind::compute, "cpu");
    if (cpu_info == nullptr) {
      return Status(StatusCode::not_found,
                    "compute.cpu_fallback: auto needs the cpu compute plugin (libcolibri-compute-cpu.so), which is not "
                    "in the plugin search path; install it or set compute.cpu_fallback: off");
    }
    auto cpu = reg.create_as<sdk::Compute>(*cpu_info, compute_section);
    if (!cpu) return cpu.error().with_context("compute.cpu_fallback: creating compute plugin cpu");
    plugins.cpu_fallback = *cpu;
  }
  for (auto [key, out] : {std::pair{"upload_gbps", &options.upload_gbps}, std::pair{"cpu_gbps", &options.cpu_gbps}}) {
    if (*out > 0) continue;
    auto v = compute_section.get_number(key, 0);
    if (!v) return v.error();
    if (*v < 0) {
      const std::string full = std::string("compute.") + key;
      const auto* entry = profile.find(full);
      return Status(StatusCode::invalid_argument,
                    full + " is " +
                        (entry != nullptr ? entry->text + " (" + entry->origin.describe() + ")" : "negative") +
                        "; it must be 0 (measure at load) or a positive GB/s");
    }
    *out = *v;
  }
  plugins.compute = compute->object;
  plugins.storage = storage->object;
  plugins.cache = cache->object;
  plugins.compute_name = compute->info->name;
  plugins.storage_name = storage->info->name;
  plugins.cache_name = cache->info->name;
  if (plugins.storage->query_interface(sdk::kStorageCopiesInterface) != nullptr) {
    for (const auto& p : profile.get_list("storage.paths")) options.mirror_dirs.emplace_back(p);
  }
  return plugins;
}

sdk::Status Engine::memory_options(const profile::Profile& profile, EngineOptions& options) {
  if (!options.vram_budget_bytes) {
    auto v = profile.get_int("memory.vram_budget");
    options.vram_budget_bytes = v ? static_cast<std::uint64_t>(*v) : 0;
  }
  for (auto [key, out] :
       {std::pair{"shared_on_device", &options.shared_on_device}, std::pair{"kv_on_device", &options.kv_on_device},
        std::pair{"activations_on_device", &options.activations_on_device},
        std::pair{"kv_sliding_window", &options.kv_sliding_window}}) {
    if (*out) continue;
    auto v = profile.section("memory").get_bool(key, true);
    if (!v) return v.error();
    *out = *v;
  }
  if (!options.kv_checkpoints) {
    auto v = profile.get_int("memory.kv_checkpoints");
    options.kv_checkpoints = v ? *v : kDefaultKvCheckpoints;
  }
  // Both choices were checked as the profile loaded (check_range); empty is the default.
  options.vram_admission = profile.get_string("memory.vram_admission") != "always";
  return {};
}

std::function<std::uint64_t(std::int64_t)> Engine::kv_cache_bytes(const model::HyperParams& hp,
                                                                  const EngineOptions& options) {
  return [hp, type = options.kv_type,
          windows = kv_windows(hp, options.ubatch, options.kv_sliding_window.value_or(true),
                               options.kv_checkpoints.value_or(kDefaultKvCheckpoints))](std::int64_t n) {
    return KvCache::bytes_for(type, hp.num_layers, hp.kv_cache_heads(), hp.kv_cache_dim(), n, windows, hp.mla());
  };
}

std::uint64_t Engine::expert_cache_budget(const profile::Profile& profile, const EngineOptions& options) {
  if (options.expert_cache_bytes) return *options.expert_cache_bytes;
  if (auto v = profile.get_int("memory.expert_cache")) return static_cast<std::uint64_t>(*v);
  return util::auto_expert_cache_bytes();
}

sdk::Expected<std::unique_ptr<Engine>> Engine::open(const std::filesystem::path& model_dir, profile::Profile& profile,
                                                    EngineOptions options, std::optional<model::Manifest> manifest) {
  auto loaded = plugins_from_profile(profile, options);
  if (!loaded) return loaded.error();
  Plugins plugins = std::move(*loaded);

  const std::uint64_t expert_cache = expert_cache_budget(profile, options);
  std::uint64_t kv_bytes = 0;
  if (auto v = profile.get_int("memory.kv_cache")) kv_bytes = static_cast<std::uint64_t>(*v);
  if (!options.prefetch_layers) {
    auto v = profile.get_int("prefetch.layers");
    options.prefetch_layers = v ? *v : 1;
  }
  if (!options.prefetch_confidence) {
    auto v = profile.section("prefetch").get_number("confidence", 1.0);
    if (!v) return v.error();
    options.prefetch_confidence = *v;
  }
  auto engine = open(model_dir, std::move(plugins), expert_cache, kv_bytes, options, std::move(manifest));
  // A memory value the model refuses (memory.kv_cache too small): say where it was set.
  if (!engine) return registry::with_value_origins(engine.error(), profile, "memory");
  return engine;
}

sdk::Expected<std::unique_ptr<Engine>> Engine::open(const std::filesystem::path& model_dir, Plugins plugins,
                                                    std::uint64_t expert_cache_bytes, std::uint64_t kv_cache_bytes,
                                                    EngineOptions options, std::optional<model::Manifest> manifest) {
  std::unique_ptr<Engine> e(new Engine());
  if (auto s = e->init(model_dir, std::move(plugins), expert_cache_bytes, kv_cache_bytes, options, std::move(manifest));
      !s) {
    return s;
  }
  return e;
}

Status Engine::init(const std::filesystem::path& dir, Plugins plugins, std::uint64_t expert_cache_bytes,
                    std::uint64_t kv_cache_bytes, EngineOptions options, std::optional<model::Manifest> manifest) {
  // One read without mirrors that succeeded found every file whole in `dir`: reading with them gives the same.
  if (!manifest) {
    auto m = model::load_manifest(dir, options.mirror_dirs);
    if (!m) return m.error();
    manifest = std::move(*m);
  }
  manifest_ = std::move(*manifest);
  hp_ = manifest_.hparams;
  dir_ = dir;
  plugins_ = std::move(plugins);
  options_ = options;
  if (options_.time_ops && plugins_.compute) {
    op_timing_ = std::make_shared<TimedCompute>(plugins_.compute);
    plugins_.compute = op_timing_;
  }
  scratch_ = std::make_unique<Scratch>();
  if (!plugins_.compute || !plugins_.storage)
    return Status(StatusCode::invalid_argument, "engine needs compute and storage");
  const auto devices = plugins_.compute->devices();
  // A backend with memory of its own must also take host tensors (kHostTensorsInterface): token ids, positions,
  // routing weights and logits stay in host memory, and without memory.*_on_device everything else does too.
  const bool host_tensors = plugins_.compute->query_interface(sdk::kHostTensorsInterface) != nullptr;
  if (devices.empty() || (!devices[0].host_memory && !host_tensors)) {
    return Status(StatusCode::unsupported, "compute backend " + plugins_.compute_name +
                                               " keeps buffers in device memory and cannot run host tensors; this "
                                               "engine needs one that can (use compute.backend: cpu or vulkan)");
  }
  // Memory of its own, for the VRAM tier (the CPU backend reports host RAM as memory_total: not a tier).
  const bool has_device_memory = !devices[0].host_memory || host_tensors;
  if (hp_.hidden_act != "silu") {
    return Status(StatusCode::unsupported,
                  "manifest.json hparams.hidden_act '" + hp_.hidden_act + "' is not supported (only silu)");
  }
  if (options_.ubatch <= 0) return Status(StatusCode::invalid_argument, "--batch must be positive");
  auto rope = RopeFrequencies::create(hp_);
  if (!rope) return rope.error();
  rope_ = std::move(*rope);
  if (options_.exact_activations) matmul_flags_ = sdk::kExactActivations;
  prefetch_layers_ = std::max<std::int64_t>(0, options_.prefetch_layers.value_or(0));
  prefetch_confidence_ = std::max(0.0, options_.prefetch_confidence.value_or(1.0));

  // Shared weights: every file they live in, read whole through the storage plugin, each tensor hash-checked.
  for (const auto& t : manifest_.tensors) {
    if (shared_files_.count(t.file) != 0) continue;
    const auto* fe = manifest_.file(t.file);
    const std::uint64_t size = fe != nullptr ? fe->size : t.offset + t.size;
    AlignedBuffer buf;
    try {
      buf = AlignedBuffer((size + 4095) / 4096 * 4096);
    } catch (const std::bad_alloc&) {
      return Status(StatusCode::out_of_memory, "no memory for the shared weights (" + bytes_text(size) + ")");
    }
    auto file = plugins_.storage->open((dir_ / t.file).string());
    // Named with the plugin the bytes come through: a third-party one may be where the error is.
    const std::string through =
        plugins_.storage_name.empty() ? std::string() : " through storage plugin '" + plugins_.storage_name + "'";
    if (!file) return file.error().with_context("opening " + t.file + through);
    auto s = plugins_.storage->read(**file, 0, std::span<std::byte>(buf.data(), size));
    for (int attempt = 1; !s && s.retryable() && attempt < 3; ++attempt) {  // a transient error: try again
      spdlog::warn("reading {}: {}; trying again", t.file, s.message());
      s = plugins_.storage->read(**file, 0, std::span<std::byte>(buf.data(), size));
    }
    if (!s) return s.with_context("reading " + t.file + through);
    shared_bytes_ += size;
    shared_files_.emplace(t.file, std::move(buf));
  }
  for (const auto& t : manifest_.tensors) {
    const auto* p = shared_files_.at(t.file).data() + t.offset;
    if (static_cast<std::uint64_t>(XXH64(p, t.size, 0)) != t.checksum) {
      return Status(StatusCode::corrupt_data, model::describe_model_file(manifest_, t.file) +
                                                  ": checksum mismatch in " + t.file + " (tensor " + t.name + ")" +
                                                  model::checksum_fix(plugins_.storage_name));
    }
  }
  Status missing;
  auto get = [&](const std::string& name, std::vector<std::int64_t> shape, bool required) -> Tensor {
    const auto* t = manifest_.tensor(name);
    if (t == nullptr) {
      if (required && missing) {
        missing = Status(StatusCode::corrupt_data, "manifest.json has no tensor " + name + "; re-run convert");
      }
      return {};
    }
    if (t->shape != shape && missing) {
      std::string want, got;
      for (auto d : shape) want += (want.empty() ? "" : "x") + std::to_string(d);
      for (auto d : t->shape) got += (got.empty() ? "" : "x") + std::to_string(d);
      missing = Status(StatusCode::corrupt_data,
                       "manifest.json: tensor " + name + " has shape " + got + ", the hyper-parameters need " + want);
      return {};
    }
    if (!plugins_.compute->supports(shape.size() > 1 ? Op::matmul : Op::rms_norm, t->type) && missing &&
        shape.size() > 1) {
      missing = Status(StatusCode::unsupported, "compute backend " + plugins_.compute_name + " cannot multiply " +
                                                    std::string(sdk::to_string(t->type)) + " weights (" + name + ")");
    }
    Tensor v;
    v.type = t->type;
    v.ne = {shape.size() > 1 ? shape[1] : shape[0], shape.size() > 1 ? shape[0] : 1, 1, 1};
    v.data = shared_files_.at(t->file).data() + t->offset;
    return v;
  };
  const std::int64_t D = hp_.hidden_size, hd = hp_.head_dim, qd = hp_.num_heads * hd, kvd = hp_.num_kv_heads * hd;
  embedding_ = get("token_embd.weight", {hp_.vocab_size, D}, true);
  output_norm_ = get("output_norm.weight", {D}, true);
  output_ = get("output.weight", {hp_.vocab_size, D}, !hp_.tie_word_embeddings);
  if (!present(output_)) output_ = embedding_;
  for (std::int64_t l = 0; l < hp_.num_layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    Layer L;
    L.attn_norm = get(b + "attn_norm.weight", {D}, true);
    if (hp_.mla()) {
      const std::int64_t nh = hp_.num_heads, dn = hp_.qk_nope_dim(), dr = hp_.rope_dims(), dc = hp_.kv_lora_rank;
      const std::int64_t dv = hp_.v_head_dim, ql = hp_.q_lora_rank, q_in = ql > 0 ? ql : D;
      L.wq_a = get(b + "attn_q_a.weight", {ql, D}, ql > 0);
      L.q_a_norm = get(b + "attn_q_a_norm.weight", {ql}, ql > 0);
      L.wq_nope = get(b + "attn_q_nope.weight", {nh * dn, q_in}, true);
      L.wq_rope = get(b + "attn_q_rope.weight", {nh * dr, q_in}, true);
      L.wkv_a = get(b + "attn_kv_a.weight", {dc, D}, true);
      L.kv_a_norm = get(b + "attn_kv_a_norm.weight", {dc}, true);
      L.wk_rope = get(b + "attn_k_rope.weight", {dr, D}, true);
      L.wk_b = get(b + "attn_k_b.weight", {nh * dc, dn}, true);
      L.wv_b = get(b + "attn_v_b.weight", {nh * dv, dc}, true);
      L.wk_b.ne = {dn, dc, nh, 1};  // one matrix per head, as matmul_heads takes them
      L.wv_b.ne = {dc, dv, nh, 1};
      L.wo = get(b + "attn_output.weight", {D, nh * dv}, true);
    } else if (hp_.layer_is_linear(l)) {
      const std::int64_t kd = hp_.linear_key_width(), vd = hp_.linear_value_width(), nv = hp_.linear_v_heads;
      const std::int64_t K = hp_.linear_conv_kernel;
      L.linear = true;
      L.lin_q = get(b + "ssm_q.weight", {kd, D}, true);
      L.lin_k = get(b + "ssm_k.weight", {kd, D}, true);
      L.lin_v = get(b + "ssm_v.weight", {vd, D}, true);
      L.lin_z = get(b + "ssm_z.weight", {vd, D}, true);
      L.lin_beta = get(b + "ssm_beta.weight", {nv, D}, true);
      L.lin_alpha = get(b + "ssm_alpha.weight", {nv, D}, true);
      L.conv_q = get(b + "ssm_conv1d_q.weight", {kd, K}, true);
      L.conv_k = get(b + "ssm_conv1d_k.weight", {kd, K}, true);
      L.conv_v = get(b + "ssm_conv1d_v.weight", {vd, K}, true);
      L.lin_a = get(b + "ssm_a", {nv}, true);
      L.lin_dt = get(b + "ssm_dt.bias", {nv}, true);
      L.lin_norm = get(b + "ssm_norm.weight", {hp_.linear_v_dim}, true);
      L.lin_out = get(b + "ssm_out.weight", {D, vd}, true);
      for (const auto* t : {&L.conv_q, &L.conv_k, &L.conv_v, &L.lin_a, &L.lin_dt}) {
        if (present(*t) && t->type != DType::f32 && missing) {
          missing = Status(StatusCode::corrupt_data, "manifest.json: layer " + std::to_string(l) +
                                                         "'s convolution, A and dt bias must be f32; re-run convert");
        }
      }
    } else {
      L.wq = get(b + "attn_q.weight", {qd, D}, true);
      L.wq_gate = get(b + "attn_q_gate.weight", {qd, D}, hp_.attn_output_gate);
      L.wk = get(b + "attn_k.weight", {kvd, D}, true);
      L.wv = get(b + "attn_v.weight", {kvd, D}, true);
      L.wo = get(b + "attn_output.weight", {D, qd}, true);
    }
    L.bq = get(b + "attn_q.bias", {qd}, hp_.attention_qkv_bias);
    L.bk = get(b + "attn_k.bias", {kvd}, hp_.attention_qkv_bias);
    L.bv = get(b + "attn_v.bias", {kvd}, hp_.attention_qkv_bias);
    L.bo = get(b + "attn_output.bias", {D}, hp_.attention_out_bias);
    L.sinks = get(b + "attn_sinks.weight", {hp_.num_heads}, hp_.attention_sinks);
    if (L.linear) {
      // no attention: no q/k norms
    } else if (hp_.qk_norm == "per_head" || hp_.qk_norm == "per_head_after_rope") {
      L.q_norm = get(b + "attn_q_norm.weight", {hd}, true);
      L.k_norm = get(b + "attn_k_norm.weight", {hd}, true);
    } else if (hp_.qk_norm == "full") {
      L.q_norm = get(b + "attn_q_norm.weight", {qd}, true);
      L.k_norm = get(b + "attn_k_norm.weight", {kvd}, true);
    } else if (hp_.qk_norm != "none" && hp_.qk_norm != "l2") {  // l2: no weights
      return Status(StatusCode::unsupported, "manifest.json hparams.qk_norm '" + hp_.qk_norm + "' is not supported");
    }
    L.ffn_norm = get(b + "ffn_norm.weight", {D}, true);
    L.sparse = hp_.layer_is_sparse(l);
    L.top_k = hp_.layer_top_k(l);
    if (L.sparse) {
      L.router = get(b + "ffn_gate_inp.weight", {hp_.n_experts, D}, true);
      L.router_bias = get(b + "ffn_gate_inp.bias", {hp_.n_experts}, hp_.router_bias);
      L.selection_bias = get(b + "exp_probs_b.bias", {hp_.n_experts}, hp_.router_selection_bias);
      const std::int64_t sff = hp_.shared_expert_intermediate_size;
      if (sff > 0) {
        L.sh_gate = get(b + "ffn_gate_shexp.weight", {sff, D}, true);
        L.sh_up = get(b + "ffn_up_shexp.weight", {sff, D}, true);
        L.sh_down = get(b + "ffn_down_shexp.weight", {D, sff}, true);
        L.sh_gate_inp = get(b + "ffn_gate_inp_shexp.weight", {1, D}, hp_.shared_expert_gate);
      }
    }
    layers_.push_back(L);
  }
  if (!missing) return missing;
  // topk_routing has no weight scale and only softmax scores: a router that scales its weights (DeepSeek-V2's x16) or
  // takes sigmoid scores without a selection bias runs as topk_routing_biased with a bias of zeros, which picks by
  // the scores alone.
  if (!hp_.router_selection_bias &&
      (hp_.router_scoring != "softmax" || hp_.routed_scaling_factor != 1.0 || hp_.grouped_routing())) {
    zero_bias_.assign(static_cast<std::size_t>(hp_.n_experts), 0.0f);
    for (auto& L : layers_) {
      if (L.sparse) L.selection_bias = f32(zero_bias_.data(), hp_.n_experts);
    }
  }
  // A NaN in a selection bias picks differently on each backend (the CPU refuses it, a GPU's comparisons skip it):
  // said once here, as the damaged file it is (convert refuses one).
  for (std::size_t l = 0; l < layers_.size(); ++l) {
    const Tensor& b = layers_[l].selection_bias;
    if (!present(b) || b.data == nullptr) continue;
    const std::string name = "blk." + std::to_string(l) + ".exp_probs_b.bias";
    if (b.type != DType::f32) {
      return Status(StatusCode::corrupt_data, "manifest.json: tensor " + name + " is " +
                                                  std::string(sdk::to_string(b.type)) + ", not f32; re-run convert");
    }
    const auto* v = static_cast<const float*>(b.data);
    for (std::int64_t e = 0; e < hp_.n_experts; ++e) {
      if (!std::isfinite(v[e])) {
        return Status(StatusCode::corrupt_data, "tensor " + name + " holds " + std::to_string(v[e]) + " for expert " +
                                                    std::to_string(e) +
                                                    ": the model's files are damaged (`colibri-cli inspect MODEL "
                                                    "--verify` checks them); re-run convert");
      }
    }
  }
  // A discrete GPU would otherwise receive every shared weight over the bus at every call.
  if (!devices[0].host_memory && options_.shared_on_device.value_or(true)) {
    if (auto s = upload_shared_weights(devices[0]); !s) return s;
  }
  if (const auto* part = unsupported_expert_part(manifest_, *plugins_.compute, expert_op())) {
    if (hp_.expert_bias()) {
      return Status(StatusCode::unsupported, "compute backend " + plugins_.compute_name +
                                                 " cannot run gpt-oss experts (its expert_ffn_clamped op is missing "
                                                 "for " +
                                                 std::string(sdk::to_string(part->type)) + " weights, " + part->name +
                                                 "); use compute.backend: cpu");
    }
    return Status(StatusCode::unsupported, "compute backend " + plugins_.compute_name + " cannot run " +
                                               std::string(sdk::to_string(part->type)) + " experts (" + part->name +
                                               ")");
  }
  if (!hp_.attention_sinks && !plugins_.compute->supports(Op::attention, options_.kv_type)) {
    return Status(StatusCode::unsupported, "compute backend " + plugins_.compute_name + " cannot run attention on a " +
                                               std::string(sdk::to_string(options_.kv_type)) +
                                               " KV cache; give another --kv-type (memory.kv_type), or use "
                                               "compute.backend: cpu");
  }
  if (hp_.attention_sinks && !plugins_.compute->supports(Op::attention_sinks, options_.kv_type)) {
    return Status(StatusCode::unsupported, "compute backend " + plugins_.compute_name +
                                               " cannot run attention with sinks (gpt-oss's attention_sinks op) on a " +
                                               std::string(sdk::to_string(options_.kv_type)) +
                                               " KV cache; use compute.backend: cpu");
  }
  if (hp_.grouped_routing() && !plugins_.compute->supports(Op::topk_routing_grouped, DType::f32)) {
    return Status(StatusCode::unsupported, "compute backend " + plugins_.compute_name +
                                               " cannot route this model's experts (" + hp_.architecture +
                                               " routes within the best of its expert groups: the "
                                               "topk_routing_grouped op); use compute.backend: cpu, cuda or vulkan");
  }
  if ((hp_.router_selection_bias || !zero_bias_.empty()) &&
      !plugins_.compute->supports(Op::topk_routing_biased, DType::f32)) {
    return Status(StatusCode::unsupported, "compute backend " + plugins_.compute_name +
                                               " cannot route this model's experts (" + hp_.architecture +
                                               "'s router needs the topk_routing_biased op); use compute.backend: "
                                               "cpu, cuda or vulkan");
  }
  if (!hp_.linear_layers.empty() || hp_.attn_output_gate) {
    // Qwen3-Next: its linear attention's ops. Their recurrent states live in host memory (the KV cache's), which a
    // device backend reads and writes back as it does any host tensor of a call.
    const bool ok = std::all_of(std::begin(kLinearOps), std::end(kLinearOps),
                                [&](Op op) { return plugins_.compute->supports(op, DType::f32); });
    if (!ok) {
      return Status(StatusCode::unsupported, "compute backend " + plugins_.compute_name + " cannot run " +
                                                 hp_.architecture +
                                                 "'s gated-delta-rule layers (the mul, causal_conv and "
                                                 "gated_delta_rule ops); use compute.backend: cpu, cuda or vulkan");
    }
  }
  if (hp_.mla()) {
    // DeepSeek's attention needs the two optional MLA ops for its per-head weights' types.
    const bool ok = plugins_.compute->supports(Op::concat_rows, DType::f32) &&
                    std::all_of(layers_.begin(), layers_.end(), [&](const Layer& L) {
                      return plugins_.compute->supports(Op::matmul_heads, L.wk_b.type) &&
                             plugins_.compute->supports(Op::matmul_heads, L.wv_b.type);
                    });
    if (!ok) {
      return Status(StatusCode::unsupported, "compute backend " + plugins_.compute_name + " cannot run " +
                                                 hp_.architecture +
                                                 "'s multi-head latent attention (its concat_rows and matmul_heads "
                                                 "ops); use compute.backend: cpu, cuda or vulkan");
    }
    // Device backends' attention takes rows of up to 576 values (sdk compute_checks; DeepSeek's 512 + 64); the CPU's
    // any. Said at load, not at the first token.
    constexpr std::int64_t kDeviceMaxRow = 576;
    if (hp_.mla_cache_dim() > kDeviceMaxRow && plugins_.compute_name != "cpu") {
      return Status(StatusCode::unsupported, "compute backend " + plugins_.compute_name +
                                                 "'s attention takes rows of at most " + std::to_string(kDeviceMaxRow) +
                                                 " values; this model's latent-attention cache row is " +
                                                 std::to_string(hp_.mla_cache_dim()) +
                                                 " (kv_lora_rank + qk_rope_head_dim); use compute.backend: cpu");
    }
  }
  // A layer's ready experts go in one call where the backend offers the group form of their op (gpt-oss's biased
  // experts: expert_ffn_clamped_group) for every expert weight type.
  group_experts_ = unsupported_expert_part(manifest_, *plugins_.compute, group_op(expert_op())) == nullptr;

  // KV cache: --ctx, else memory.kv_cache, else the model's context (reserved, paid for as it fills).
  // Sliding-window layers keep only their window's rows (memory.kv_sliding_window), so a budget holds more context.
  kv_windows_ = kv_windows(hp_, options_.ubatch, options_.kv_sliding_window.value_or(true),
                           options_.kv_checkpoints.value_or(kDefaultKvCheckpoints));
  const auto kv_bytes = Engine::kv_cache_bytes(hp_, options_);  // the windows computed once, as kv_windows_
  // What an automatic context must fit: every cache the caller may hold at once, with what is kept beside each.
  const auto kv_sequences = static_cast<std::uint64_t>(std::max<std::int64_t>(1, options_.kv_sequences));
  const auto all_kv_bytes = [&](std::int64_t n) {
    return kv_sequences * (kv_bytes(n) + (options_.kv_beside ? options_.kv_beside(n) : 0));
  };
  // The RAM tier's pages are taken as experts are read, after this: what it will fill is not the context's.
  const std::uint64_t kv_host = kv_host_available(util::available_memory_bytes(), manifest_.expert_bytes(),
                                                  expert_cache_bytes, options_.ram_beside);
  auto planned = kv_context(options_.context, kv_cache_bytes, kv_bytes, hp_.max_position_embeddings, kv_host,
                            all_kv_bytes, kMinAutoContext);
  if (!planned) return planned.error();
  std::int64_t ctx = *planned;
  if (const auto fits = largest_context(kv_host / 2, all_kv_bytes, hp_.max_position_embeddings);
      options_.context <= 0 && kv_cache_bytes == 0 && fits < ctx) {
    spdlog::warn(
        "memory.expert_cache ({}) leaves {} of RAM beside it, which holds an automatic context of only {} positions; "
        "taking {}, which may run out of memory as it fills (set --ctx, or lower memory.expert_cache)",
        sdk::format_size(expert_cache_bytes), sdk::format_size(kv_host), fits, ctx);
  }
  // Attention on a discrete GPU reads the KV cache in place; in host memory the whole prefix would cross the bus at
  // every layer of every token. Device memory is committed when allocated (host pages only as they fill), so an
  // automatic context there takes at most half of what the VRAM tier leaves free.
  kv_on_device_ = !devices[0].host_memory && options_.kv_on_device.value_or(true);
  if (kv_on_device_ && options_.context <= 0 && kv_cache_bytes == 0) {
    const std::uint64_t free = plugins_.compute->devices()[0].memory_available;
    const std::uint64_t tier = options_.vram_budget_bytes.value_or(0);
    const auto fits = largest_context(free > tier ? (free - tier) / 2 : 0, all_kv_bytes, hp_.max_position_embeddings);
    if (fits >= std::min<std::int64_t>(ctx, kMinAutoContext)) {
      ctx = std::min(ctx, fits);
    } else {
      spdlog::warn(
          "memory.kv_on_device: {} has room for {} positions of KV cache next to the VRAM tier; the KV cache "
          "stays in host memory (lower memory.vram_budget, or set --ctx to place a smaller one there)",
          devices[0].name, fits);
      kv_on_device_ = false;
    }
  }
  // Without forward() (sequences_only) the engine's own cache is only its shape: host pages are never written, so
  // never paid for, where a device cache would hold its memory from now on.
  auto kv = options_.sequences_only ? KvCache::create(options_.kv_type, hp_.num_layers, hp_.kv_cache_heads(),
                                                      hp_.kv_cache_dim(), ctx, nullptr, kv_windows_, hp_.mla())
                                    : make_kv_cache(ctx);
  if (!kv) return kv.error();
  kv_ = std::move(*kv);
  kv_own_bytes_ = kv_bytes;
  const bool host_caches = !kv_.on_device() && !(options_.sequences_only && kv_on_device_);
  if (host_caches) kv_host_budget_ = kv_host;
  // Host pages are paid for as the context fills: a reservation past the RAM there is only fails later, mid-answer.
  // Where the caller admits sequences within that RAM (kv_admission), only one cache outgrowing it alone would.
  const std::uint64_t counted = options_.kv_admission ? 1 : kv_sequences;
  if (const std::uint64_t ram = kv_host; host_caches && ram > 0 && counted * kv_sequence_bytes(ctx) > ram) {
    const std::string pos = std::to_string(ctx) + " positions";
    const std::string caches = counted > 1 ? "the " + std::to_string(counted) + " KV caches of " + pos +
                                                 " the server may hold (--max-batch" +
                                                 (options_.kv_beside ? ", each with its draft model's)" : ")")
                               : options_.kv_beside ? "the KV cache of " + pos + " and the draft model's"
                                                    : "the KV cache of " + pos;
    spdlog::warn(
        "{} {} to {}, more than the {} of RAM available beside the expert cache: {} that long will run out of "
        "memory (lower --ctx or memory.kv_cache, {}memory.expert_cache, or --kv-type q8_0)",
        caches, counted > 1 || options_.kv_beside ? "grow together" : "grows",
        sdk::format_size(counted * kv_sequence_bytes(ctx)), sdk::format_size(ram),
        options_.kv_admission ? "a request" : "a context", counted > 1 ? "--max-batch, " : "");
  }
  // Activations on a discrete GPU stay there from op to op; in host memory every op would send its inputs over the
  // bus and wait for its outputs to come back.
  if (!devices[0].host_memory && options_.activations_on_device.value_or(true)) {
    scratch_->device = plugins_.compute.get();
  }
  if (kv_.on_device()) {
    spdlog::info("KV cache: {} positions, {} in {} memory", ctx, sdk::format_size(kv_.bytes()), devices[0].name);
  } else if (options_.sequences_only) {
    std::string all;
    if (kv_sequences > 1 || options_.kv_beside) {
      all = " (up to " + std::to_string(kv_sequences) + ": " + sdk::format_size(all_kv_bytes(ctx)) +
            (options_.kv_beside ? " with the draft model's" : "") + ")";
    }
    spdlog::info("KV caches: {} positions, {} each in {} memory, made as sequences start{}{}", ctx,
                 sdk::format_size(kv_.bytes()), kv_on_device_ ? devices[0].name : "host", all,
                 kv_on_device_ ? "" : ", paid as they fill");
  }
  if (kv_.max_write() < ctx) {
    const bool chunked = hp_.attention_chunk > 0 && hp_.sliding_window <= 0;
    spdlog::info("KV cache: {} layers keep {} of {} positions ({} in all; memory.kv_sliding_window)",
                 chunked ? "chunked-attention" : "sliding-window",
                 KvCache::layer_positions(chunked ? hp_.attention_chunk : hp_.sliding_window, options_.ubatch, ctx),
                 ctx, sdk::format_size(kv_.bytes()));
  }

  experts_ = std::make_unique<ExpertManager>(manifest_, dir_, plugins_.storage, plugins_.cache, expert_cache_bytes);
  experts_->set_storage_name(plugins_.storage_name);
  experts_->set_policy_name(plugins_.cache_name);
  const std::uint64_t vram_budget = options_.vram_budget_bytes.value_or(0);
  if (vram_budget > 0 && !has_device_memory) {
    spdlog::warn("memory.vram_budget ({}) ignored: compute backend {} has no device memory",
                 sdk::format_size(vram_budget), plugins_.compute_name);
  } else if (vram_budget > 0) {
    if (!plugins_.vram_cache) {
      return Status(StatusCode::invalid_argument,
                    "memory.vram_budget is set but no cache policy instance was given "
                    "for the VRAM tier (Plugins::vram_cache)");
    }
    if (auto s = experts_->enable_vram(plugins_.compute, plugins_.vram_cache, vram_budget, options_.vram_admission);
        !s) {
      return s;
    }
  }
  if (auto s = experts_->preload(); !s) return s;
  // The backend routes decode's experts itself where it offers expert_ffn_routed for every expert weight type and
  // the experts are where it reads them: its VRAM tier, or host memory for a backend that runs from there.
  routed_experts_ = !hp_.expert_bias() &&
                    unsupported_expert_part(manifest_, *plugins_.compute, Op::expert_ffn_routed) == nullptr &&
                    (experts_->vram() != nullptr || !has_device_memory);
  return plugins_.cpu_fallback ? setup_cpu_fallback(has_device_memory) : Status{};
}

bool Engine::cpu_runs(std::int64_t l, std::int64_t e, std::int64_t tokens) const {
  if (!plugins_.cpu_fallback || experts_->in_vram(l, e)) return false;
  const auto* entry = manifest_.expert(l, e);
  return entry != nullptr && offload_.cpu_faster(entry->size, tokens);
}

Status Engine::run_expert(std::int64_t l, std::int64_t e, const Tensor& x, const Tensor& y, bool on_cpu,
                          const sdk::OpParams& params) {
  if (!on_cpu) {
    auto w = experts_->acquire(l, e);
    if (!w) return w.error();
    Status s = run_expert_op(*plugins_.compute, plugins_.compute_name, *w, x, y, params);
    experts_->release(l, e);
    return s;
  }
  // The CPU backend reads host memory: activations on the device come down and the result goes back up.
  auto& S = *scratch_;
  auto xp = host_view(x, S.xe);
  if (!xp) return xp.error();
  Tensor xh = x, yh = y;
  xh.buffer = yh.buffer = nullptr;
  xh.offset = yh.offset = 0;
  xh.data = const_cast<float*>(*xp);
  if (y.buffer != nullptr) {
    S.ye.resize(static_cast<std::size_t>(sdk::element_count(y)));
    yh.data = S.ye.data();
  }
  auto w = experts_->acquire_for_cpu(l, e);
  if (!w) return w.error();
  experts_->fill_vram(l, e);  // while VRAM has free slots: uploaded during the CPU run, a hit next time
  const auto start = std::chrono::steady_clock::now();
  Status s = run_expert_op(*plugins_.cpu_fallback, "cpu (compute.cpu_fallback)", *w, xh, yh, params);
  experts_->release_for_cpu(l, e, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  if (s && y.buffer != nullptr) s = from_host(S.ye.data(), y);
  return s;
}

std::size_t Engine::groupable(std::int64_t l, std::span<const std::int32_t> order, std::size_t from,
                              const std::set<std::int32_t>& on_cpu) const {
  std::size_t n = 0;
  while (group_experts_ && from + n < order.size() && on_cpu.count(order[from + n]) == 0 &&
         experts_->ready(l, order[from + n]))
    ++n;
  return n;
}

Status Engine::run_experts(std::int64_t l, std::span<const std::int32_t> experts, std::span<const Tensor> xs,
                           std::span<Tensor> ys, const std::set<std::int32_t>& on_cpu, const sdk::OpParams& params) {
  if (experts.size() == 1) return run_expert(l, experts[0], xs[0], ys[0], on_cpu.count(experts[0]) != 0, params);
  auto& in = scratch_->group_inputs;
  in.clear();
  std::size_t acquired = 0;
  Status s;
  for (const auto e : experts) {
    auto w = experts_->acquire(l, e);
    if (!w) {
      s = w.error();
      break;
    }
    in.insert(in.end(), {w->gate, w->up, w->down, xs[acquired]});
    if (hp_.expert_bias()) in.insert(in.end(), {w->gate_bias, w->up_bias, w->down_bias});
    ++acquired;
  }
  if (s) {
    sdk::OpCall call;
    call.op = group_op(expert_op());
    call.inputs = in;
    call.outputs = ys;
    call.params = expert_params(hp_, params);
    s = plugins_.compute->run(call);
    if (!s) s = s.with_context("compute backend " + plugins_.compute_name + ", " + sdk::op_name(call.op));
  }
  for (std::size_t i = 0; i < acquired; ++i) experts_->release(l, experts[i]);
  if (acquired == experts.size() && s.code() == StatusCode::unsupported) {
    // supports() said yes, the backend said no (a plugin older than its answer): one expert at a time from now on.
    spdlog::warn("{}; running experts one at a time", s.message());
    group_experts_ = false;
    for (std::size_t i = 0; i < experts.size(); ++i) {
      if (s = run_expert(l, experts[i], xs[i], ys[i], false, params); !s) return s;
    }
  }
  return s;
}

Status Engine::setup_cpu_fallback(bool has_device_memory) {
  if (!has_device_memory) {
    spdlog::warn("compute.cpu_fallback ignored: compute backend {} runs experts from host memory already",
                 plugins_.compute_name);
    plugins_.cpu_fallback.reset();
    return {};
  }
  if (experts_->vram() != nullptr && experts_->vram()->holds_all()) {
    spdlog::info("compute.cpu_fallback: every expert is in VRAM; nothing runs on the CPU");
    plugins_.cpu_fallback.reset();
    return {};
  }
  if (const auto* part = unsupported_expert_part(manifest_, *plugins_.cpu_fallback, expert_op())) {
    return Status(StatusCode::unsupported, "compute.cpu_fallback: the cpu backend cannot run " +
                                               std::string(sdk::to_string(part->type)) + " experts (" + part->name +
                                               "); set compute.cpu_fallback: off");
  }
  const model::ExpertEntry* probe = nullptr;
  for (const auto& e : manifest_.experts) {
    if (probe == nullptr || e.size > probe->size) probe = &e;
  }
  if (probe == nullptr) {
    plugins_.cpu_fallback.reset();
    return {};
  }
  // Calibration on the largest expert: each rate is the best of a few runs after a warm-up.
  const std::int64_t D = hp_.hidden_size;
  constexpr std::int64_t kBatch = 16;
  std::vector<float> x(static_cast<std::size_t>(D * kBatch)), y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 7919) % 2001) / 1000.0f - 1.0f;
  sdk::OpParams mm_p;
  mm_p.flags = matmul_flags_;
  // Decode reads an expert from DRAM, not from the cache where the previous run left it: the CPU runs are timed
  // after writing over more than a last-level cache, or a small expert would seem to run at cache speed.
  // Reads, not memset: large memsets use non-temporal stores, which leave the cache as it was.
  std::vector<unsigned char> evict(std::size_t{192} << 20, 1);
  const std::function<void()> cold = [&evict] {
    unsigned sum = 0;
    for (std::size_t i = 0; i < evict.size(); i += 64) sum += evict[i];
    volatile unsigned sink = sum;
    (void)sink;
  };
  auto best_of = [](int reps, const std::function<Status()>& fn,
                    const std::function<void()>& before = {}) -> sdk::Expected<double> {
    double best = 1e30;
    for (int r = 0; r <= reps; ++r) {  // r == 0: warm-up
      if (before) before();
      const auto start = std::chrono::steady_clock::now();
      if (auto s = fn(); !s) return s;
      const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (r > 0) best = std::min(best, t);
    }
    return std::max(best, 1e-9);
  };
  const double bytes = static_cast<double>(probe->size);
  auto s = experts_->with_ram_weights(probe->layer, probe->expert, [&](const ExpertWeights& w) -> Status {
    auto run_cpu = [&](std::int64_t n) {
      return [&, n] {
        return run_expert_op(*plugins_.cpu_fallback, "cpu", w, f32(x.data(), D, n), f32(y.data(), D, n), mm_p);
      };
    };
    auto one = best_of(3, run_cpu(1), cold);
    if (!one) return one.error();
    auto many = best_of(2, run_cpu(kBatch), cold);
    if (!many) return many.error();
    offload_.cpu_bytes_per_second = bytes / *one;
    offload_.cpu_extra_token = std::max(0.0, (*many / *one - 1.0) / static_cast<double>(kBatch - 1));
    auto buf = plugins_.compute->allocate(expert_slot_bytes(manifest_));  // the largest expert's slot
    if (!buf) return buf.error().with_context("allocating device memory for one expert");
    auto upload = best_of(2, [&]() -> Status {
      auto ev = plugins_.compute->copy_to_device_async(w.gate.data, **buf, 0, probe->size);
      return ev ? (*ev)->wait() : ev.error();
    });
    if (!upload) return upload.error();
    offload_.upload_bytes_per_second = bytes / *upload;
    auto* mapped = static_cast<std::byte*>((*buf)->host_pointer());
    const ExpertWeights dw = expert_weights(*probe, mapped, buf->get(), 0);
    auto device = best_of(3, [&] {
      return run_expert_op(*plugins_.compute, plugins_.compute_name, dw, f32(x.data(), D, 1), f32(y.data(), D, 1),
                           mm_p);
    });
    if (!device) return device.error();
    offload_.device_bytes_per_second = bytes / *device;
    return plugins_.compute->synchronize();
  });
  if (!s) return s.with_context("compute.cpu_fallback: measuring the cost model");
  if (options_.upload_gbps > 0) offload_.upload_bytes_per_second = options_.upload_gbps * 1e9;
  if (options_.cpu_gbps > 0) offload_.cpu_bytes_per_second = options_.cpu_gbps * 1e9;
  spdlog::info("compute.cpu_fallback: auto: {}", offload_.describe());
  spdlog::warn(
      "compute.cpu_fallback: auto runs some experts on the CPU: logits now depend on which experts were in VRAM "
      "(bit-identical results across placements need compute.cpu_fallback: off)");
  return {};
}

Status Engine::upload_shared_weights(const sdk::DeviceInfo& device) {
  constexpr std::size_t kAlign = 256;                           // every backend's buffer offset alignment
  constexpr std::size_t kBufferBytes = std::size_t{256} << 20;  // as the VRAM tier: one allocation stays modest
  std::vector<Tensor*> views = {&embedding_, &output_norm_, &output_};
  for (auto& L : layers_) {
    for (Tensor* t : L.tensors()) {
      if (t->data != nullptr) views.push_back(t);
    }
  }
  // Each distinct tensor (tied embeddings share one) gets a place: buffer index and offset.
  struct Place {
    std::size_t buffer = 0, offset = 0, bytes = 0;
  };
  std::map<const void*, Place> places;
  std::vector<std::size_t> buffer_bytes;
  std::uint64_t total = 0;
  for (const Tensor* t : views) {
    if (places.count(t->data) != 0) continue;
    const std::size_t bytes = sdk::row_bytes(t->type, t->ne[0]) * static_cast<std::size_t>(sdk::row_count(*t));
    const std::size_t padded = (bytes + kAlign - 1) / kAlign * kAlign;
    if (buffer_bytes.empty() || (buffer_bytes.back() > 0 && buffer_bytes.back() + padded > kBufferBytes)) {
      buffer_bytes.push_back(0);
    }
    places[t->data] = {buffer_bytes.size() - 1, buffer_bytes.back(), bytes};
    buffer_bytes.back() += padded;
    total += padded;
  }
  if (device.memory_total > 0 && total > device.memory_available) {
    spdlog::warn(
        "memory.shared_on_device: {} has {} free, the shared weights need {}; they stay in host memory and "
        "cross the bus at every call (set memory.shared_on_device: false to silence this)",
        device.name, sdk::format_size(device.memory_available), sdk::format_size(total));
    return {};
  }
  std::vector<std::unique_ptr<sdk::Buffer>> buffers;
  for (const std::size_t bytes : buffer_bytes) {
    auto buf = plugins_.compute->allocate(bytes);
    if (!buf) {
      return Status(buf.error().code(),
                    "memory.shared_on_device: allocating " + sdk::format_size(total) + " of shared weights on " +
                        device.name + " failed: " + buf.error().message() + "; set memory.shared_on_device: false");
    }
    buffers.push_back(std::move(*buf));
  }
  std::vector<std::unique_ptr<sdk::Event>> copies;
  for (const auto& [host, place] : places) {
    auto ev = plugins_.compute->copy_to_device_async(host, *buffers[place.buffer], place.offset, place.bytes);
    if (!ev) return ev.error().with_context("memory.shared_on_device: uploading the shared weights");
    copies.push_back(std::move(*ev));
  }
  for (auto& ev : copies) {
    if (auto s = ev->wait(); !s) return s.with_context("memory.shared_on_device: uploading the shared weights");
  }
  for (Tensor* t : views) {
    const Place& place = places.at(t->data);
    sdk::Buffer* buf = buffers[place.buffer].get();
    auto* mapped = static_cast<std::byte*>(buf->host_pointer());
    t->buffer = buf;
    t->offset = place.offset;
    t->data = mapped != nullptr ? mapped + place.offset : nullptr;
  }
  shared_device_ = std::move(buffers);
  shared_device_bytes_ = total;
  shared_files_.clear();  // the host copy is not read again
  return {};
}

sdk::Expected<KvCache> Engine::make_kv_cache(std::int64_t context) const {
  if (kv_on_device_) {
    auto kv = KvCache::create(options_.kv_type, hp_.num_layers, hp_.kv_cache_heads(), hp_.kv_cache_dim(), context,
                              plugins_.compute, kv_windows_, hp_.mla());
    if (kv) return kv;
    spdlog::warn(
        "memory.kv_on_device: {}; this KV cache stays in host memory and crosses the bus at every attention "
        "(lower --ctx, or set memory.kv_on_device: false to silence this)",
        kv.error().message());
  }
  return KvCache::create(options_.kv_type, hp_.num_layers, hp_.kv_cache_heads(), hp_.kv_cache_dim(), context, nullptr,
                         kv_windows_, hp_.mla());
}

Op Engine::expert_op() const {
  return hp_.expert_bias() ? Op::expert_ffn_clamped : Op::expert_ffn;
}

Status Engine::run_expert_op(sdk::Compute& compute, const std::string& name, const ExpertWeights& w, const Tensor& x,
                             const Tensor& y, sdk::OpParams params) {
  if (!hp_.expert_bias()) return run_op_on(compute, name, Op::expert_ffn, {w.gate, w.up, w.down, x}, {y}, params);
  return run_op_on(compute, name, Op::expert_ffn_clamped,
                   {w.gate, w.up, w.down, x, w.gate_bias, w.up_bias, w.down_bias}, {y}, expert_params(hp_, params));
}

Status Engine::router_logits(const Layer& L, const Tensor& h, const Tensor& logits) {
  // The router runs unquantized activations: routing must not depend on how activations are packed.
  sdk::OpParams router_p;
  router_p.flags = sdk::kExactActivations;
  if (present(L.router_bias)) return run_op(Op::matmul, {L.router, h, L.router_bias}, {logits}, router_p);
  return run_op(Op::matmul, {L.router, h}, {logits}, router_p);
}

sdk::OpParams Engine::routing_params(std::int64_t top_k) const {
  sdk::OpParams p;
  p.top_k = static_cast<std::int32_t>(top_k);
  p.flags = (hp_.router_scoring == "sigmoid" ? sdk::kRoutingSigmoid : sdk::kRoutingSoftmax) |
            (hp_.norm_topk_prob ? sdk::kRoutingRenormalize : 0);
  p.scale = static_cast<float>(hp_.routed_scaling_factor);
  if (hp_.grouped_routing()) {
    p.groups = static_cast<std::int32_t>(hp_.router_groups);
    p.groups_used = static_cast<std::int32_t>(hp_.router_groups_used);
    if (hp_.router_group_score == "max") p.flags |= sdk::kRoutingGroupMax;
  }
  return p;
}

Status Engine::choose_experts(const Layer& L, const Tensor& logits, const Tensor& ids, const Tensor& weights,
                              const sdk::OpParams& params) {
  if (hp_.grouped_routing()) {
    return run_op(Op::topk_routing_grouped, {logits, L.selection_bias}, {ids, weights}, params);
  }
  if (present(L.selection_bias)) {
    return run_op(Op::topk_routing_biased, {logits, L.selection_bias}, {ids, weights}, params);
  }
  return run_op(Op::topk_routing, {logits}, {ids, weights}, params);
}

Status Engine::run_op(Op op, std::initializer_list<Tensor> inputs, std::initializer_list<Tensor> outputs,
                      sdk::OpParams params) {
  return run_op_on(*plugins_.compute, plugins_.compute_name, op, inputs, outputs, params);
}

Status Engine::run_op_on(sdk::Compute& compute, const std::string& name, Op op, std::initializer_list<Tensor> inputs,
                         std::initializer_list<Tensor> outputs, sdk::OpParams params) {
  std::array<Tensor, 8> in{}, out{};
  std::size_t ni = 0, no = 0;
  for (const auto& t : inputs) in[ni++] = t;
  for (const auto& t : outputs) out[no++] = t;
  sdk::OpCall call;
  call.op = op;
  call.inputs = std::span<const Tensor>(in.data(), ni);
  call.outputs = std::span<Tensor>(out.data(), no);
  call.params = params;
  auto s = compute.run(call);
  if (!s) return s.with_context("compute backend " + name + ", " + std::string(op_name(op)));
  return s;
}

bool Engine::activations_on_device() const {
  return scratch_->device != nullptr;
}

Status Engine::size(Act& a, std::size_t floats) {
  if (scratch_->device == nullptr) {
    a.host.resize(floats);
    return {};
  }
  const std::size_t bytes = std::max<std::size_t>(floats, 1) * sizeof(float);
  if (a.buffer && a.buffer->size() >= bytes) return {};
  a.buffer.reset();
  auto b = scratch_->device->allocate(bytes + bytes / 2);  // room to grow with the next chunk
  if (!b) return b.error().with_context("allocating " + bytes_text(bytes) + " of activations in device memory");
  a.buffer = std::move(*b);
  return {};
}

Tensor Engine::view(Act& a, std::int64_t ne0, std::int64_t ne1, std::int64_t ne2, std::size_t at) const {
  if (!a.buffer) return f32(a.host.data() + at, ne0, ne1, ne2);
  Tensor t = f32(nullptr, ne0, ne1, ne2);
  t.buffer = a.buffer.get();
  t.offset = at * sizeof(float);
  return t;
}

Status Engine::to_host(const Tensor& t, float* dst) {
  const auto bytes = static_cast<std::size_t>(sdk::element_count(t)) * sizeof(float);
  if (t.buffer == nullptr) {
    if (t.data != dst) std::memcpy(dst, t.data, bytes);
    return {};
  }
  auto ev = plugins_.compute->copy_to_host_async(*t.buffer, t.offset, dst, bytes);
  if (!ev) return ev.error().with_context("downloading activations");
  return (*ev)->wait();
}

Status Engine::from_host_all(std::initializer_list<std::pair<const float*, Tensor>> copies) {
  std::vector<std::unique_ptr<sdk::Event>> pending;
  for (const auto& [src, t] : copies) {
    const auto bytes = static_cast<std::size_t>(sdk::element_count(t)) * sizeof(float);
    if (t.buffer == nullptr) {
      if (t.data != src) std::memcpy(t.data, src, bytes);
      continue;
    }
    auto ev = plugins_.compute->copy_to_device_async(src, *t.buffer, t.offset, bytes);
    if (!ev) return ev.error().with_context("uploading activations");
    pending.push_back(std::move(*ev));
  }
  // All in flight before the first wait: one round trip for the lot.
  Status first;
  for (auto& ev : pending) {
    if (Status s = ev->wait(); !s && first) first = s;
  }
  return first;
}

Status Engine::from_host(const float* src, const Tensor& t) {
  return from_host_all({{src, t}});  // the op that reads them runs next
}

sdk::Expected<const float*> Engine::host_view(const Tensor& t, std::vector<float>& staging) {
  if (t.buffer == nullptr) return static_cast<const float*>(t.data);
  staging.resize(static_cast<std::size_t>(sdk::element_count(t)));
  if (auto s = to_host(t, staging.data()); !s) return s;
  return staging.data();
}

Status Engine::clamp(const Tensor& t, float limit) {
  auto values = host_view(t, scratch_->down);
  if (!values) return values.error();
  auto* p = const_cast<float*>(*values);  // t's own host data, or the downloaded copy
  for (std::int64_t i = 0; i < sdk::element_count(t); ++i) p[i] = std::clamp(p[i], -limit, limit);
  return from_host(p, t);  // nothing to copy for a host tensor
}

Status Engine::output_head(const Tensor& x, float* logits) {
  const std::int64_t rows = sdk::row_count(x);
  sdk::OpParams norm_p;
  norm_p.eps = static_cast<float>(hp_.rms_norm_eps);
  sdk::OpParams mm_p;
  mm_p.flags = matmul_flags_;
  const Tensor h = view(scratch_->h, hp_.hidden_size, rows);
  if (auto s = run_op(Op::rms_norm, {x, output_norm_}, {h}, norm_p); !s) return s;
  if (auto s = run_op(Op::matmul, {output_, h}, {f32(logits, hp_.vocab_size, rows)}, mm_p); !s) return s;
  // A NaN or infinite logit would be sampled as some token all the same: a silent wrong answer. Finite weights
  // only get here through activations that overflowed (damaged or out-of-range weights, or a wrong architecture).
  const auto n = static_cast<std::size_t>(hp_.vocab_size * rows);
  for (std::size_t i = 0; i < n; ++i) {
    if (!std::isfinite(logits[i])) {
      const auto V = static_cast<std::size_t>(hp_.vocab_size);
      return Status(StatusCode::corrupt_data,
                    "the model's logit for token id " + std::to_string(i % V) + " (output row " +
                        std::to_string(i / V) + ") is " + std::to_string(logits[i]) +
                        ": its activations overflowed. The weights are damaged or do not suit this model "
                        "(`colibri-cli inspect MODEL --verify` checks the files)");
    }
  }
  return {};
}

Status Engine::forward(std::span<const std::int32_t> tokens, LogitsWanted wanted, std::vector<float>& logits,
                       std::vector<RoutingRecord>* trace, std::span<const std::int64_t> checkpoints) {
  if (tokens.empty()) return Status(StatusCode::invalid_argument, "no tokens to run");
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= hp_.vocab_size) {
      return Status(StatusCode::invalid_argument, "token " + std::to_string(tokens[i]) + " (at index " +
                                                      std::to_string(i) + ") is outside the vocabulary 0.." +
                                                      std::to_string(hp_.vocab_size - 1));
    }
  }
  const auto T = static_cast<std::int64_t>(tokens.size());
  if (n_past_ + T > context()) {
    // Raising the context helps only below the model's own; at it, the text must be shorter.
    const std::string fix =
        context() < hp_.max_position_embeddings
            ? "raise --ctx or memory.kv_cache, up to the model's " + std::to_string(hp_.max_position_embeddings)
            : "the model's own context; give fewer tokens";
    return Status(StatusCode::invalid_argument,
                  "the context is full: " + std::to_string(n_past_) + " positions used + " + std::to_string(T) +
                      " new tokens exceed the context of " + std::to_string(context()) + " positions (" + fix + ")");
  }
  const auto V = static_cast<std::size_t>(hp_.vocab_size);
  logits.assign(wanted == LogitsWanted::all    ? V * static_cast<std::size_t>(T)
                : wanted == LogitsWanted::last ? V
                                               : 0,
                0.0f);
  std::vector<std::int64_t> stops;  // offsets a chunk ends at for a checkpoint
  if (kv_.keeps_checkpoints()) {
    for (const auto at : checkpoints) {
      if (at > n_past_ && at <= n_past_ + T) stops.push_back(at - n_past_);
      // Kept already (this prompt shares them): made the most recently used, so the new ones push out others.
      if (at <= n_past_) (void)kv_.checkpoint(at);
    }
    std::sort(stops.begin(), stops.end());
  }
  for (std::int64_t off = 0, n = 0; off < T; off += n) {
    n = std::min(options_.ubatch, T - off);
    const auto stop = std::upper_bound(stops.begin(), stops.end(), off);
    if (stop != stops.end()) n = std::min(n, *stop - off);
    const bool last_chunk = off + n == T;
    LogitsWanted w = wanted == LogitsWanted::all                    ? LogitsWanted::all
                     : (wanted == LogitsWanted::last && last_chunk) ? LogitsWanted::last
                                                                    : LogitsWanted::none;
    float* dst = wanted == LogitsWanted::all ? logits.data() + static_cast<std::size_t>(off) * V : logits.data();
    // Every chunk rotates as one pass over all the tokens would (dynamic rope): --batch never changes a result.
    if (auto s = forward_chunk(tokens.subspan(static_cast<std::size_t>(off), static_cast<std::size_t>(n)),
                               n_past_ + off, n_past_ + T, w, dst, trace);
        !s) {
      return s;
    }
    if (std::binary_search(stops.begin(), stops.end(), off + n)) {
      // Only a later prompt's reuse depends on it: a checkpoint that cannot be kept costs this run nothing.
      if (auto s = kv_.checkpoint(n_past_ + off + n); !s) spdlog::warn("KV cache checkpoint: {}", s.message());
    }
  }
  n_past_ += T;
  return {};
}

// t {ne0, ne1, S} from its row `first` on (a KV cache's rows of one layer, for a chunk's attention).
Tensor Engine::rows_from(Tensor t, std::int64_t first) {
  const std::size_t bytes =
      static_cast<std::size_t>(first) * static_cast<std::size_t>(t.ne[1]) * sdk::row_bytes(t.type, t.ne[0]);
  if (t.data != nullptr) t.data = static_cast<std::byte*>(t.data) + bytes;
  if (t.buffer != nullptr) t.offset += bytes;
  t.ne[2] -= first;
  return t;
}

// Every query and key head of the pass RMS-normalized with these weights of head_dim (qk_norm "per_head" before RoPE,
// "per_head_after_rope" after it); null weights: 1 (qk_norm "l2", Llama 4, after RoPE).
Status Engine::norm_heads(const Tensor* q_weight, const Tensor* k_weight, std::int64_t nh, std::int64_t nkv,
                          std::int64_t T, const sdk::OpParams& norm_p) {
  auto& S = *scratch_;
  const std::int64_t hd = hp_.head_dim;
  Tensor qw, kw;
  if (q_weight != nullptr) {
    qw = *q_weight;
    kw = *k_weight;
  } else {
    if (!S.ones_ready) {
      const std::vector<float> ones(static_cast<std::size_t>(hd), 1.0f);
      if (auto s = size(S.ones, ones.size()); !s) return s;
      if (auto s = from_host(ones.data(), view(S.ones, hd)); !s) return s;
      S.ones_ready = true;
    }
    qw = kw = view(S.ones, hd);
  }
  if (auto s = run_op(Op::rms_norm, {view(S.q, hd, nh * T), qw}, {view(S.q2, hd, nh * T)}, norm_p); !s) return s;
  if (auto s = run_op(Op::rms_norm, {view(S.k, hd, nkv * T), kw}, {view(S.k2, hd, nkv * T)}, norm_p); !s) return s;
  std::swap(S.q, S.q2);
  std::swap(S.k, S.k2);
  return {};
}

// Llama 4's NoPE layers: each query times log(floor((pos + 1) / floor) + 1) * scale + 1, in f32 as transformers
// computes it. Below the floor (8192 positions in the released models) every factor is 1 and nothing runs.
Status Engine::scale_queries_by_temperature(std::int64_t qd, std::int64_t T) {
  auto& S = *scratch_;
  const auto floor_scale = static_cast<float>(hp_.attn_temperature_floor);
  const auto attn_scale = static_cast<float>(hp_.attn_temperature_scale);
  std::vector<float> factors(static_cast<std::size_t>(T));
  bool any = false;
  for (std::int64_t t = 0; t < T; ++t) {
    const float pos = static_cast<float>(S.positions[static_cast<std::size_t>(t)]);
    const float f = std::log(std::floor((pos + 1.0f) / floor_scale) + 1.0f) * attn_scale + 1.0f;
    factors[static_cast<std::size_t>(t)] = f;
    any = any || f != 1.0f;
  }
  if (!any) return {};
  if (auto s = scaled_columns(view(S.q, qd, T), qd, factors, S.temperature, S.q2); !s) return s;
  std::swap(S.q, S.q2);
  return {};
}

// out[:, t] = w[t] * x[:, t] for x {rows, T}: out = 0, then scale_add, so each product is rounded once, as x * w.
Status Engine::scaled_columns(const Tensor& x, std::int64_t rows, std::span<const float> w, Act& weights, Act& out) {
  auto& S = *scratch_;
  const auto T = static_cast<std::int64_t>(w.size());
  S.acc.assign(static_cast<std::size_t>(rows * T), 0.0f);
  if (auto s = size(weights, w.size()); !s) return s;
  if (auto s = size(out, S.acc.size()); !s) return s;
  if (auto s = from_host_all({{S.acc.data(), view(out, rows, T)}, {w.data(), view(weights, T)}}); !s) return s;
  return run_op(Op::scale_add, {x, view(weights, T)}, {view(out, rows, T)});
}

Status Engine::forward_chunk(std::span<const std::int32_t> tokens, std::int64_t position, std::int64_t pass_end,
                             LogitsWanted wanted, float* logits, std::vector<RoutingRecord>* trace) {
  auto& S = *scratch_;
  const auto T = static_cast<std::int64_t>(tokens.size());
  const std::int64_t D = hp_.hidden_size;
  S.ids.assign(tokens.begin(), tokens.end());
  const Segment one{&kv_, position, 0, T, pass_end};
  if (auto s = run_layers(std::span<const Segment>(&one, 1), trace, false); !s) return s;
  Status out;
  if (wanted != LogitsWanted::none) {
    // Logits for every position, or only the last one.
    const std::int64_t rows = wanted == LogitsWanted::all ? T : 1;
    const auto first = static_cast<std::size_t>(wanted == LogitsWanted::all ? 0 : D * (T - 1));
    out = output_head(view(S.x, D, rows, 1, first), logits);
  }
  // The routed layers' bookkeeping once the output head is queued, so a device runs it meanwhile; a NaN it finds
  // explains the logits, so it comes first.
  const Status settled = finish_routed(trace);
  return settled ? out : settled;
}

// The layers over S.ids, the concatenated tokens of `segments`: per-token ops (norms, matmuls, the MoE with each
// routed expert run once for all its tokens) see all tokens at once; rope, the KV writes and attention go per
// segment, each at its own positions in its own KV cache. Leaves the last hidden states in S.x.
Status Engine::run_layers(std::span<const Segment> segments, std::vector<RoutingRecord>* trace, bool settle) {
  ++passes_;
  auto& S = *scratch_;
  S.pass_trace_from = trace != nullptr ? trace->size() : 0;
  const auto T = static_cast<std::int64_t>(S.ids.size());
  const std::int64_t D = hp_.hidden_size, hd = hp_.head_dim, nh = hp_.num_heads, nkv = hp_.num_kv_heads;
  const std::int64_t qd = nh * hd, kvd = nkv * hd;
  auto sz = [](std::int64_t a, std::int64_t b) { return static_cast<std::size_t>(a * b); };
  Status s;
  // A failure part way settles the routed layers before it is returned: a NaN one of them let through is what a
  // later layer then trips on, so the settle's error comes first, and those layers' uses count as unrouted ones do.
  const auto failed = [&](Status error) {
    const Status settled = finish_routed(trace);
    return settled ? error : settled;
  };
#define COLIBRI_TRY(expr) \
  if (s = (expr); !s) return failed(s)

  for (Act* a : {&S.x, &S.h, &S.tmp, &S.moe}) COLIBRI_TRY(size(*a, sz(D, T)));
  if (!hp_.mla()) {  // MLA sizes its own (mla_attention)
    for (Act* a : {&S.q, &S.q2, &S.attn}) COLIBRI_TRY(size(*a, sz(qd, T)));
    for (Act* a : {&S.k, &S.k2, &S.v}) COLIBRI_TRY(size(*a, sz(kvd, T)));
  }
  S.positions.resize(static_cast<std::size_t>(T));
  // rope's inputs, in one array (host, or device memory beside the activations, uploaded once for every layer):
  // positions as i32 bits, then each segment's inv_freq ("dynamic" rope depends on the length of its pass).
  std::vector<float> rope_host(static_cast<std::size_t>(T));
  std::vector<std::pair<std::size_t, std::int64_t>> freq_at;  // per segment: element offset, count
  for (const auto& g : segments) {
    for (std::int64_t t = 0; t < g.n; ++t) {
      S.positions[static_cast<std::size_t>(g.first + t)] = static_cast<std::int32_t>(g.position + t);
    }
    const auto f = rope_->inv_freq(std::max(g.position + g.n, g.pass_end));
    freq_at.emplace_back(rope_host.size(), static_cast<std::int64_t>(f.size()));
    rope_host.insert(rope_host.end(), f.begin(), f.end());
  }
  std::memcpy(rope_host.data(), S.positions.data(), S.positions.size() * sizeof(std::int32_t));
  COLIBRI_TRY(size(S.rope_in, rope_host.size()));
  COLIBRI_TRY(from_host(rope_host.data(), view(S.rope_in, static_cast<std::int64_t>(rope_host.size()))));
  sdk::OpParams norm_p;
  norm_p.eps = static_cast<float>(hp_.rms_norm_eps);
  sdk::OpParams mm_p;
  mm_p.flags = matmul_flags_;
  sdk::OpParams rope_p;
  rope_p.rope_dims = rope_->rope_dims();
  rope_p.scale = rope_->attention_scaling();
  rope_p.flags = hp_.rope_interleaved ? sdk::kRopeInterleaved : 0;  // ERNIE: GPT-J's pairs (2i, 2i + 1)

  COLIBRI_TRY(run_op(Op::embedding, {embedding_, i32(S.ids.data(), T)}, {view(S.x, D, T)}));
  for (std::int64_t l = 0; l < hp_.num_layers; ++l) {
    const Layer& L = layers_[static_cast<std::size_t>(l)];
    COLIBRI_TRY(run_op(Op::rms_norm, {view(S.x, D, T), L.attn_norm}, {view(S.h, D, T)}, norm_p));
    const Tensor h = view(S.h, D, T);
    if (L.linear) {
      COLIBRI_TRY(linear_attention(L, l, segments, norm_p, mm_p));
    } else if (hp_.mla()) {
      COLIBRI_TRY(mla_attention(L, l, segments, freq_at, rope_p, norm_p, mm_p));
    } else {
      if (present(L.bq)) {
        COLIBRI_TRY(run_op(Op::matmul, {L.wq, h, L.bq}, {view(S.q, qd, T)}, mm_p));
        COLIBRI_TRY(run_op(Op::matmul, {L.wk, h, L.bk}, {view(S.k, kvd, T)}, mm_p));
        COLIBRI_TRY(run_op(Op::matmul, {L.wv, h, L.bv}, {view(S.v, kvd, T)}, mm_p));
      } else {
        COLIBRI_TRY(run_op(Op::matmul, {L.wq, h}, {view(S.q, qd, T)}, mm_p));
        COLIBRI_TRY(run_op(Op::matmul, {L.wk, h}, {view(S.k, kvd, T)}, mm_p));
        COLIBRI_TRY(run_op(Op::matmul, {L.wv, h}, {view(S.v, kvd, T)}, mm_p));
      }
      if (hp_.qk_norm == "per_head") {
        COLIBRI_TRY(norm_heads(&L.q_norm, &L.k_norm, nh, nkv, T, norm_p));
      } else if (hp_.qk_norm == "full") {
        COLIBRI_TRY(run_op(Op::rms_norm, {view(S.q, qd, T), L.q_norm}, {view(S.q2, qd, T)}, norm_p));
        COLIBRI_TRY(run_op(Op::rms_norm, {view(S.k, kvd, T), L.k_norm}, {view(S.k2, kvd, T)}, norm_p));
        std::swap(S.q, S.q2);
        std::swap(S.k, S.k2);
      }
      if (hp_.clip_qkv > 0) {
        const auto c = static_cast<float>(hp_.clip_qkv);
        COLIBRI_TRY(clamp(view(S.q, qd, T), c));
        COLIBRI_TRY(clamp(view(S.k, kvd, T), c));
        COLIBRI_TRY(clamp(view(S.v, kvd, T), c));
      }
      // RoPE (not on Llama 4's NoPE layers), then each segment's new keys into its cache and its attention.
      const bool rope_layer = hp_.layer_has_rope(l);
      for (std::size_t i = 0; rope_layer && i < segments.size(); ++i) {
        const auto& [kv, pos, off, n, pass_end] = segments[i];
        const Tensor freq = view(S.rope_in, freq_at[i].second, 1, 1, freq_at[i].first);
        Tensor positions = view(S.rope_in, n, 1, 1, static_cast<std::size_t>(off));
        positions.type = DType::i32;
        COLIBRI_TRY(run_op(Op::rope, {view(S.q, hd, nh, n, sz(qd, off)), positions, freq},
                           {view(S.q2, hd, nh, n, sz(qd, off))}, rope_p));
        COLIBRI_TRY(run_op(Op::rope, {view(S.k, hd, nkv, n, sz(kvd, off)), positions, freq},
                           {view(S.k2, hd, nkv, n, sz(kvd, off))}, rope_p));
      }
      if (rope_layer) {
        std::swap(S.q, S.q2);
        std::swap(S.k, S.k2);
        if (hp_.qk_norm == "l2") COLIBRI_TRY(norm_heads(nullptr, nullptr, nh, nkv, T, norm_p));
      } else if (hp_.attn_temperature_floor > 0) {
        COLIBRI_TRY(scale_queries_by_temperature(qd, T));
      }
      if (hp_.qk_norm == "per_head_after_rope") COLIBRI_TRY(norm_heads(&L.q_norm, &L.k_norm, nh, nkv, T, norm_p));
      for (std::size_t i = 0; i < segments.size(); ++i) {
        const auto& [kv, pos, off, n, pass_end] = segments[i];
        COLIBRI_TRY(write_kv(*kv, l, pos, view(S.k, kvd, n, 1, sz(kvd, off)), view(S.v, kvd, n, 1, sz(kvd, off))));
        // A sliding layer's rows start at first_position (a multiple of 64): the queries' positions count from there.
        sdk::OpParams attn_p;
        attn_p.position = static_cast<std::int32_t>(pos - kv->first_position(l));
        attn_p.window = static_cast<std::int32_t>(hp_.layer_window(l));
        attn_p.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
        if (present(L.sinks)) {
          COLIBRI_TRY(run_op(Op::attention_sinks,
                             {view(S.q, hd, nh, n, sz(qd, off)), kv->keys(l, pos + n), kv->values(l, pos + n), L.sinks},
                             {view(S.attn, hd, nh, n, sz(qd, off))}, attn_p));
        } else if (const std::int64_t chunk = hp_.layer_chunk(l); chunk > 0) {
          // Llama 4's chunked layers: the queries of each chunk attend to that chunk's keys alone, so each run of
          // queries within one chunk is one call on the cache's rows from the chunk's start.
          for (std::int64_t p0 = pos; p0 < pos + n;) {
            const std::int64_t start = p0 - p0 % chunk, p1 = std::min(pos + n, start + chunk);
            const std::size_t q_at = static_cast<std::size_t>(off + p0 - pos);
            sdk::OpParams chunk_p = attn_p;
            chunk_p.position = static_cast<std::int32_t>(p0 - start);
            COLIBRI_TRY(run_op(
                Op::attention,
                {view(S.q, hd, nh, p1 - p0, sz(qd, q_at)), rows_from(kv->keys(l, p1), start - kv->first_position(l)),
                 rows_from(kv->values(l, p1), start - kv->first_position(l))},
                {view(S.attn, hd, nh, p1 - p0, sz(qd, q_at))}, chunk_p));
            p0 = p1;
          }
        } else {
          COLIBRI_TRY(run_op(Op::attention,
                             {view(S.q, hd, nh, n, sz(qd, off)), kv->keys(l, pos + n), kv->values(l, pos + n)},
                             {view(S.attn, hd, nh, n, sz(qd, off))}, attn_p));
        }
      }
      if (present(L.wq_gate)) {  // Qwen3-Next: the output times sigmoid(gate projection of the input)
        COLIBRI_TRY(run_op(Op::matmul, {L.wq_gate, h}, {view(S.q2, qd, T)}, mm_p));
        COLIBRI_TRY(run_op(Op::sigmoid, {view(S.q2, qd, T)}, {view(S.q, qd, T)}));
        COLIBRI_TRY(run_op(Op::mul, {view(S.attn, qd, T), view(S.q, qd, T)}, {view(S.q2, qd, T)}));
        std::swap(S.attn, S.q2);
      }
      if (present(L.bo)) {
        COLIBRI_TRY(run_op(Op::matmul, {L.wo, view(S.attn, qd, T), L.bo}, {view(S.tmp, D, T)}, mm_p));
      } else {
        COLIBRI_TRY(run_op(Op::matmul, {L.wo, view(S.attn, qd, T)}, {view(S.tmp, D, T)}, mm_p));
      }
    }
    COLIBRI_TRY(run_op(Op::add, {view(S.x, D, T), view(S.tmp, D, T)}, {view(S.h, D, T)}));
    std::swap(S.x, S.h);
    COLIBRI_TRY(run_op(Op::rms_norm, {view(S.x, D, T), L.ffn_norm}, {view(S.h, D, T)}, norm_p));
    // Routing records carry rows of the concatenation; they become each token's position.
    const std::size_t trace_from = trace != nullptr ? trace->size() : 0;
    COLIBRI_TRY(moe(L, l, T, view(S.h, D, T), S.moe, trace));
    if (trace != nullptr) {
      for (std::size_t r = trace_from; r < trace->size(); ++r) {
        auto& rec = (*trace)[r];
        rec.position = S.positions[static_cast<std::size_t>(rec.position)];
        rec.step = passes_;
      }
    }
    COLIBRI_TRY(run_op(Op::add, {view(S.x, D, T), view(S.moe, D, T)}, {view(S.h, D, T)}));
    std::swap(S.x, S.h);
  }
#undef COLIBRI_TRY
  return settle ? finish_routed(trace) : Status{};
}

Status Engine::linear_attention(const Layer& L, std::int64_t l, std::span<const Segment> segments,
                                const sdk::OpParams& norm_p, const sdk::OpParams& mm_p) {
  auto& S = *scratch_;
  auto& A = S.lin;
  const auto T = static_cast<std::int64_t>(S.ids.size());
  const std::int64_t D = hp_.hidden_size, nk = hp_.linear_k_heads, nv = hp_.linear_v_heads;
  const std::int64_t dk = hp_.linear_k_dim, dv = hp_.linear_v_dim, kd = hp_.linear_key_width();
  const std::int64_t vd = hp_.linear_value_width(), taps = hp_.linear_conv_kernel - 1;
  const auto sz = [](std::int64_t a, std::int64_t b) { return static_cast<std::size_t>(a * b); };
  for (Act* a : {&A.q, &A.k, &A.q_conv, &A.k_conv}) {
    if (auto s = size(*a, sz(kd, T)); !s) return s;
  }
  for (Act* a : {&A.v, &A.z, &A.v_conv, &A.o, &A.o_norm, &A.o_gated}) {
    if (auto s = size(*a, sz(vd, T)); !s) return s;
  }
  for (Act* a : {&A.beta, &A.alpha}) {
    if (auto s = size(*a, sz(nv, T)); !s) return s;
  }
  const Tensor h = view(S.h, D, T);
  const std::pair<const Tensor*, Act*> projections[] = {{&L.lin_q, &A.q},       {&L.lin_k, &A.k},
                                                        {&L.lin_v, &A.v},       {&L.lin_z, &A.z},
                                                        {&L.lin_beta, &A.beta}, {&L.lin_alpha, &A.alpha}};
  for (const auto& [w, out] : projections) {
    if (auto s = run_op(Op::matmul, {*w, h}, {view(*out, w->ne[1], T)}, mm_p); !s) return s;
  }
  // Per sequence, on its state: [q's, k's, v's convolution inputs (taps each)] then the delta rule's {dv, dk, nv}.
  for (const auto& [kv, pos, off, n, pass_end] : segments) {
    if (n == 0) continue;
    auto state = kv->state_for(l, pos);
    if (!state) return state.error();
    // The state's floats from `at` on as a tensor of shape ne (host data or a device buffer, as the cache's).
    std::int64_t at = 0;
    const auto part = [&](std::int64_t a, std::int64_t b, std::int64_t c = 1) {
      Tensor t = *state;
      t.ne = {a, b, c, 1};
      const auto bytes = static_cast<std::size_t>(at) * sizeof(float);
      if (t.data != nullptr) t.data = static_cast<std::byte*>(t.data) + bytes;
      if (t.buffer != nullptr) t.offset += bytes;
      at += a * b * c;
      return t;
    };
    const struct {
      Act* in;
      Act* out;
      const Tensor* w;
      std::int64_t width;
    } convs[] = {{&A.q, &A.q_conv, &L.conv_q, kd}, {&A.k, &A.k_conv, &L.conv_k, kd}, {&A.v, &A.v_conv, &L.conv_v, vd}};
    for (const auto& c : convs) {
      if (auto s = run_op(Op::causal_conv, {view(*c.in, c.width, n, 1, sz(c.width, off)), *c.w},
                          {view(*c.out, c.width, n, 1, sz(c.width, off)), part(c.width, taps)});
          !s)
        return s;
    }
    sdk::OpParams rule_p;
    rule_p.flags = hp_.linear_tiled_heads ? sdk::kDeltaTiledHeads : 0;
    if (auto s = run_op(Op::gated_delta_rule,
                        {view(A.q_conv, dk, nk, n, sz(kd, off)), view(A.k_conv, dk, nk, n, sz(kd, off)),
                         view(A.v_conv, dv, nv, n, sz(vd, off)), view(A.alpha, nv, n, 1, sz(nv, off)),
                         view(A.beta, nv, n, 1, sz(nv, off)), L.lin_a, L.lin_dt},
                        {view(A.o, dv, nv, n, sz(vd, off)), part(dv, dk, nv)}, rule_p);
        !s)
      return s;
    kv->state_written(l, pos + n);
  }
  // Per head: RMS norm with its weight, times silu(z); then the output projection.
  if (auto s = run_op(Op::rms_norm, {view(A.o, dv, nv * T), L.lin_norm}, {view(A.o_norm, dv, nv * T)}, norm_p); !s)
    return s;
  if (auto s = run_op(Op::swiglu, {view(A.z, vd, T), view(A.o_norm, vd, T)}, {view(A.o_gated, vd, T)}); !s) return s;
  return run_op(Op::matmul, {L.lin_out, view(A.o_gated, vd, T)}, {view(S.tmp, D, T)}, mm_p);
}

double Engine::mla_softmax_scale() const {
  double scale = 1.0 / std::sqrt(static_cast<double>(hp_.head_dim));
  const auto& rs = hp_.rope_scaling;
  if (rs.is_object() && rs.contains("mscale_all_dim") && rs["mscale_all_dim"].is_number() && rs.contains("factor") &&
      rs["factor"].is_number()) {
    const double m = rs["mscale_all_dim"].get<double>(), factor = rs["factor"].get<double>();
    if (m != 0 && factor > 1) {
      const double mscale = 0.1 * m * std::log(factor) + 1.0;
      scale *= mscale * mscale;
    }
  }
  return scale;
}

// Multi-head latent attention in the absorbed form llama.cpp also runs: the KV cache holds one row per token, its
// normed latent beside its RoPE key, which every head reads as keys and, its latent part, as values. Each head's
// query is its part without RoPE through k_b (onto the latent) beside its RoPE part; its output's latent part goes
// through v_b. HF's per-head keys and values give the same numbers up to rounding; the cache is heads x (key + value
// dims) / (latent + RoPE dims) times smaller (71x for DeepSeek-V3: 128 x (192 + 128) / 576).
Status Engine::mla_attention(const Layer& L, std::int64_t l, std::span<const Segment> segments,
                             std::span<const std::pair<std::size_t, std::int64_t>> freq_at, const sdk::OpParams& rope_p,
                             const sdk::OpParams& norm_p, const sdk::OpParams& mm_p) {
  auto& S = *scratch_;
  auto& M = S.mla;
  const auto T = static_cast<std::int64_t>(S.ids.size());
  const std::int64_t D = hp_.hidden_size, nh = hp_.num_heads, dn = hp_.qk_nope_dim(), dr = hp_.rope_dims();
  const std::int64_t dc = hp_.kv_lora_rank, dv = hp_.v_head_dim, ql = hp_.q_lora_rank, dk = dc + dr;
  auto sz = [](std::int64_t a, std::int64_t b) { return static_cast<std::size_t>(a * b); };
  const std::pair<Act*, std::int64_t> sizes[] = {
      {&M.q_latent, ql},        {&M.q_latent2, ql},  {&M.q_nope, nh * dn}, {&M.q_rope, nh * dr}, {&M.q_rope2, nh * dr},
      {&M.q_absorbed, nh * dc}, {&M.q_cat, nh * dk}, {&M.kv_latent, dc},   {&M.kv_latent2, dc},  {&M.k_rope, dr},
      {&M.k_rope2, dr},         {&M.k_cat, dk},      {&M.o_cat, nh * dk},  {&M.o_heads, nh * dv}};
  for (const auto& [act, width] : sizes) {
    if (width == 0) continue;
    if (auto s = size(*act, sz(std::max<std::int64_t>(width, 1), T)); !s) return s;
  }
  // The latents' norms keep RMSNorm's default eps (1e-6) whatever rms_norm_eps says, as DeepSeek's code builds them.
  sdk::OpParams latent_norm_p = norm_p;
  latent_norm_p.eps = 1e-6f;
  const Tensor h = view(S.h, D, T);
  Tensor q_in = h;
  if (ql > 0) {
    if (auto s = run_op(Op::matmul, {L.wq_a, h}, {view(M.q_latent, ql, T)}, mm_p); !s) return s;
    if (auto s = run_op(Op::rms_norm, {view(M.q_latent, ql, T), L.q_a_norm}, {view(M.q_latent2, ql, T)}, latent_norm_p);
        !s)
      return s;
    q_in = view(M.q_latent2, ql, T);
  }
  if (auto s = run_op(Op::matmul, {L.wq_nope, q_in}, {view(M.q_nope, nh * dn, T)}, mm_p); !s) return s;
  if (auto s = run_op(Op::matmul, {L.wq_rope, q_in}, {view(M.q_rope, nh * dr, T)}, mm_p); !s) return s;
  if (auto s = run_op(Op::matmul, {L.wkv_a, h}, {view(M.kv_latent, dc, T)}, mm_p); !s) return s;
  if (auto s =
          run_op(Op::rms_norm, {view(M.kv_latent, dc, T), L.kv_a_norm}, {view(M.kv_latent2, dc, T)}, latent_norm_p);
      !s)
    return s;
  if (auto s = run_op(Op::matmul, {L.wk_rope, h}, {view(M.k_rope, dr, T)}, mm_p); !s) return s;
  if (auto s = run_op(Op::matmul_heads, {L.wk_b, view(M.q_nope, dn, nh, T)}, {view(M.q_absorbed, dc, nh, T)}, mm_p); !s)
    return s;
  for (std::size_t i = 0; i < segments.size(); ++i) {
    const auto& g = segments[i];
    const Tensor freq = view(S.rope_in, freq_at[i].second, 1, 1, freq_at[i].first);
    Tensor positions = view(S.rope_in, g.n, 1, 1, static_cast<std::size_t>(g.first));
    positions.type = DType::i32;
    if (auto s = run_op(Op::rope, {view(M.q_rope, dr, nh, g.n, sz(nh * dr, g.first)), positions, freq},
                        {view(M.q_rope2, dr, nh, g.n, sz(nh * dr, g.first))}, rope_p);
        !s)
      return s;
    if (auto s = run_op(Op::rope, {view(M.k_rope, dr, 1, g.n, sz(dr, g.first)), positions, freq},
                        {view(M.k_rope2, dr, 1, g.n, sz(dr, g.first))}, rope_p);
        !s)
      return s;
  }
  if (auto s = run_op(Op::concat_rows, {view(M.q_absorbed, dc, nh * T), view(M.q_rope2, dr, nh * T)},
                      {view(M.q_cat, dk, nh * T)});
      !s)
    return s;
  if (auto s = run_op(Op::concat_rows, {view(M.kv_latent2, dc, T), view(M.k_rope2, dr, T)}, {view(M.k_cat, dk, T)}); !s)
    return s;
  const auto scale = static_cast<float>(mla_softmax_scale());
  for (const auto& [kv, pos, off, n, pass_end] : segments) {
    const Tensor row = view(M.k_cat, dk, n, 1, sz(dk, off));
    if (auto s = write_kv(*kv, l, pos, row, row); !s) return s;
    sdk::OpParams attn_p;
    attn_p.position = static_cast<std::int32_t>(pos - kv->first_position(l));
    attn_p.scale = scale;
    if (auto s = run_op(Op::attention,
                        {view(M.q_cat, dk, nh, n, sz(nh * dk, off)), kv->keys(l, pos + n), kv->values(l, pos + n)},
                        {view(M.o_cat, dk, nh, n, sz(nh * dk, off))}, attn_p);
        !s)
      return s;
  }
  if (auto s = run_op(Op::matmul_heads, {L.wv_b, view(M.o_cat, dk, nh, T)}, {view(M.o_heads, dv, nh, T)}, mm_p); !s)
    return s;
  return run_op(Op::matmul, {L.wo, view(M.o_heads, nh * dv, T)}, {view(S.tmp, D, T)}, mm_p);
}

Status Engine::finish_routed(std::vector<RoutingRecord>* trace) {
  auto& S = *scratch_;
  if (S.routed_used == 0) return {};
  if (Status s = settle_routed(trace); !s) return s;
  // The routed layers' records came last: back in layer order, as moe() writes them.
  if (trace != nullptr) {
    std::stable_sort(trace->begin() + static_cast<std::ptrdiff_t>(S.pass_trace_from), trace->end(),
                     [](const RoutingRecord& a, const RoutingRecord& b) { return a.layer < b.layer; });
  }
  return {};
}

Status Engine::write_kv(KvCache& kv, std::int64_t l, std::int64_t position, const Tensor& k, const Tensor& v) {
  // K and V already in the cache's device memory: encoded there, no round trip through the host.
  if (k.buffer != nullptr && v.buffer != nullptr && kv.stores_on_device()) return kv.store(l, position, k.ne[1], k, v);
  auto& S = *scratch_;
  auto kp = host_view(k, S.down);
  if (!kp) return kp.error();
  if (v.data == k.data && v.buffer == k.buffer && v.offset == k.offset) {
    return kv.write(l, position, k.ne[1], *kp, *kp);  // latent attention: the values are the keys' rows
  }
  auto vp = host_view(v, S.acc);
  if (!vp) return vp.error();
  return kv.write(l, position, k.ne[1], *kp, *vp);
}

Status Engine::check_pick(std::int64_t l, std::int64_t t, std::int32_t e, float weight) const {
  if (e == -1 && std::isnan(weight)) {  // a backend's mark for a NaN logit (compute.hpp, topk_routing)
    return Status(StatusCode::corrupt_data,
                  "layer " + std::to_string(l) + "'s router logits for token row " + std::to_string(t) +
                      " include a NaN: the activations overflowed. The weights are damaged or do not suit this "
                      "model (`colibri-cli inspect MODEL --verify` checks the files)");
  }
  if (!std::isfinite(weight)) {
    return Status(StatusCode::corrupt_data,
                  "layer " + std::to_string(l) + "'s router gave expert " + std::to_string(e) + " the weight " +
                      std::to_string(weight) + " (token row " + std::to_string(t) +
                      "): the activations overflowed. The weights are damaged or do not suit this model "
                      "(`colibri-cli inspect MODEL --verify` checks the files)");
  }
  if (e < 0 || e >= hp_.n_experts) {
    return Status(StatusCode::internal, "compute backend " + plugins_.compute_name + " routed to expert " +
                                            std::to_string(e) + " of " + std::to_string(hp_.n_experts));
  }
  return {};
}

Status Engine::repeated_pick(std::int64_t l, std::int64_t t, std::int32_t e) const {
  return Status(StatusCode::internal,
                "compute backend " + plugins_.compute_name + " routed token row " + std::to_string(t) + " of layer " +
                    std::to_string(l) + " to expert " + std::to_string(e) +
                    " twice; topk_routing's picks of a token must be distinct (a bug of the backend: report it to "
                    "its authors, or choose another with compute.backend)");
}

bool Engine::routed_table(std::int64_t l) {
  auto& S = *scratch_;
  const auto generation = experts_->placement_generation();
  if (S.routed_tables.size() != static_cast<std::size_t>(hp_.num_layers) || S.routed_generation != generation) {
    S.routed_tables.assign(static_cast<std::size_t>(hp_.num_layers), {});
    S.routed_generation = generation;
  }
  auto& table = S.routed_tables[static_cast<std::size_t>(l)];
  return !table.empty() || experts_->routed_table(l, table);
}

// Each layer's choice has a region of its own (2E floats: K <= E ids, then K weights): a routed layer's choice
// stays there until the pass is settled, while later layers route, on the backend or here.
std::size_t Engine::choice_at(std::int64_t l) const {
  return static_cast<std::size_t>(l) * static_cast<std::size_t>(2 * hp_.n_experts);
}

Status Engine::device_choice(std::int64_t l, std::int64_t K, Tensor& ids, Tensor& weights) {
  auto& S = *scratch_;
  if (Status s = size(S.topk, choice_at(hp_.num_layers)); !s) return s;
  const std::size_t at = choice_at(l);
  ids = view(S.topk, K, 1, 1, at);
  ids.type = DType::i32;
  weights = view(S.topk, K, 1, 1, at + static_cast<std::size_t>(K));
  return {};
}

Status Engine::route_on_backend(std::int64_t l, std::int64_t K, const Tensor& h, Act& out, const sdk::OpParams& topk_p,
                                const sdk::OpParams& mm_p) {
  auto& S = *scratch_;
  const std::int64_t E = hp_.n_experts, D = hp_.hidden_size;
  if (S.routed_used == S.routed_choices.size()) S.routed_choices.emplace_back();
  auto& choice = S.routed_choices[S.routed_used];
  choice.layer = l;
  choice.ids.resize(static_cast<std::size_t>(K));
  choice.weights.resize(static_cast<std::size_t>(K));
  Tensor ids = i32_2d(choice.ids.data(), K, 1), weights = f32(choice.weights.data(), K, 1);
  Status s;
  if (activations_on_device()) {
    if (s = device_choice(l, K, ids, weights); !s) return s;
  }
  if (s = choose_experts(layers_[static_cast<std::size_t>(l)], view(S.router, E, 1), ids, weights, topk_p); !s) {
    return s.with_context("layer " + std::to_string(l) + "'s routing");
  }
  auto& in = S.group_inputs;
  in.assign({h, ids, weights});
  const auto& table = S.routed_tables[static_cast<std::size_t>(l)];
  in.insert(in.end(), table.begin(), table.end());
  Tensor y = view(out, D, 1);
  sdk::OpCall call;
  call.op = Op::expert_ffn_routed;
  call.inputs = in;
  call.outputs = std::span<Tensor>(&y, 1);
  call.params = mm_p;
  s = plugins_.compute->run(call);
  if (s.code() == StatusCode::unsupported) return s;  // the caller runs the layer as before
  if (!s) return s.with_context("compute backend " + plugins_.compute_name + ", expert_ffn_routed");
  // On the device the choice stays where topk left it (its layer's region) until the pass is settled, which
  // downloads every routed layer's at once: no copy between the layers, so a backend queues the whole pass without
  // a break (a CUDA graph of it).
  choice.on_device = activations_on_device();
  choice.at = choice.on_device ? choice_at(l) : 0;
  ++S.routed_used;
  return {};
}

Status Engine::settle_routed(std::vector<RoutingRecord>* trace) {
  auto& S = *scratch_;
  const std::size_t used = std::exchange(S.routed_used, 0);
  Status s;
  // The choices left in device memory: one download of the span of their regions (unrouted layers' regions between
  // them come along unread), then each split into its ids and weights.
  std::size_t lo = SIZE_MAX, hi = 0;
  for (std::size_t i = 0; i < used; ++i) {
    const auto& c = S.routed_choices[i];
    if (!c.on_device) continue;
    lo = std::min(lo, c.at);
    hi = std::max(hi, c.at + 2 * c.ids.size());
  }
  if (lo < hi) {
    S.down.resize(hi - lo);
    const Tensor span = view(S.topk, static_cast<std::int64_t>(hi - lo), 1, 1, lo);
    if (s = to_host(span, S.down.data()); !s) return s.with_context("downloading the pass's routing");
    for (std::size_t i = 0; i < used; ++i) {
      auto& c = S.routed_choices[i];
      if (!c.on_device) continue;
      const std::size_t k = c.ids.size();
      std::memcpy(c.ids.data(), S.down.data() + (c.at - lo), k * sizeof(std::int32_t));
      std::memcpy(c.weights.data(), S.down.data() + (c.at - lo) + k, k * sizeof(float));
    }
  }
  // What moe() does as it routes, in the same order: the checks, then each expert's use in ascending id (the
  // cache's counts and the policy's accesses), and the routing record.
  for (std::size_t i = 0; i < used; ++i) {
    const auto& c = S.routed_choices[i];
    const std::size_t k = c.ids.size();
    for (std::size_t j = 0; j < k; ++j) {
      if (s = check_pick(c.layer, 0, c.ids[j], c.weights[j]); !s) return s;
    }
    std::vector<std::int32_t> ascending(c.ids.begin(), c.ids.end());
    std::sort(ascending.begin(), ascending.end());
    if (auto twice = std::adjacent_find(ascending.begin(), ascending.end()); twice != ascending.end()) {
      return repeated_pick(c.layer, 0, *twice);
    }
    for (const auto e : ascending) {
      auto w = experts_->acquire(c.layer, e);
      if (!w) return w.error();
      experts_->release(c.layer, e);
    }
    if (trace != nullptr) {
      RoutingRecord rec;
      rec.experts.assign(c.ids.begin(), c.ids.end());
      rec.weights.assign(c.weights.begin(), c.weights.end());
      rec.position = S.positions[0];
      rec.layer = c.layer;
      rec.step = passes_;
      trace->push_back(std::move(rec));
    }
  }
  return {};
}

Status Engine::shared_expert(const Layer& L, std::int64_t T, const Tensor& h, Act& out, const sdk::OpParams& mm_p) {
  auto& S = *scratch_;
  const std::int64_t D = hp_.hidden_size;
  const auto DT = static_cast<std::size_t>(D * T);
  Status s;
  if (!present(L.sh_gate)) return {};
  if (s = size(S.shared, DT); !s) return s;
  if (s = run_op(Op::expert_ffn, {L.sh_gate, L.sh_up, L.sh_down, h}, {view(S.shared, D, T)}, mm_p); !s) return s;
  if (present(L.sh_gate_inp)) {
    S.gate.resize(static_cast<std::size_t>(T));
    S.acc.resize(static_cast<std::size_t>(T));
    sdk::OpParams gate_p;
    gate_p.flags = sdk::kExactActivations;  // as the router: a gate must not depend on activation packing
    if (s = run_op(Op::matmul, {L.sh_gate_inp, h}, {f32(S.acc.data(), 1, T)}, gate_p); !s) return s;
    if (s = run_op(Op::sigmoid, {f32(S.acc.data(), 1, T)}, {f32(S.gate.data(), 1, T)}); !s) return s;
    return run_op(Op::scale_add, {view(S.shared, D, T), f32(S.gate.data(), T)}, {view(out, D, T)});
  }
  if (s = size(S.sum, DT); !s) return s;
  if (s = run_op(Op::add, {view(out, D, T), view(S.shared, D, T)}, {view(S.sum, D, T)}); !s) return s;
  std::swap(out, S.sum);
  return {};
}

Status Engine::moe(const Layer& L, std::int64_t l, std::int64_t T, const Tensor& h, Act& out,
                   std::vector<RoutingRecord>* trace) {
  auto& S = *scratch_;
  const std::int64_t D = hp_.hidden_size;
  const auto DT = static_cast<std::size_t>(D * T);
  sdk::OpParams mm_p;
  mm_p.flags = matmul_flags_;
  Status s;
  if (l == 0) predicted_.clear();  // a new pass: predictions are per pass
  if (!L.sparse) {
    const sdk::ExpertKey dense_key{static_cast<std::uint32_t>(l), 0};
    if (s = prefetch_ahead(l, T, h, std::span<const sdk::ExpertKey>(&dense_key, 1)); !s) return s;
    return run_expert(l, 0, h, view(out, D, T), cpu_runs(l, 0, T), mm_p);
  }
  const std::int64_t E = hp_.n_experts, K = L.top_k;
  if (s = size(S.router, static_cast<std::size_t>(E * T)); !s) return s;
  S.weights.resize(static_cast<std::size_t>(K * T));
  S.expert_ids.resize(static_cast<std::size_t>(K * T));
  if (s = router_logits(L, h, view(S.router, E, T)); !s) return s;
  const sdk::OpParams topk_p = routing_params(K);
  // Decode where every expert of the layer lies where the backend reads it: the backend routes them itself
  // (expert_ffn_routed), so the host does not wait for the choice; its bookkeeping waits for the end of the pass.
  if (T == 1 && routed_experts_ && routed_table(l) && !hp_.router_weight_on_input) {
    s = route_on_backend(l, K, h, out, topk_p, mm_p);
    if (s) return shared_expert(L, T, h, out, mm_p);
    if (s.code() != StatusCode::unsupported) return s;
    // supports() said yes, the backend said no (a shape or flag its kernels do not route): as before from now on.
    spdlog::warn("{}; the engine routes the experts from now on", s.message());
    routed_experts_ = false;
  }
  // Decode with activations on the device: the choice stays there too (ids, then weights, in S.topk), so the
  // combine below reads each expert's weight where it lies; the host downloads both in one copy to pick the experts.
  const bool device_gates = activations_on_device() && T == 1 && !hp_.router_weight_on_input;
  Tensor choice_weights;  // device_gates: the weights where topk_routing leaves them
  if (device_gates) {
    Tensor ids;
    s = device_choice(l, K, ids, choice_weights);
    if (s) s = choose_experts(L, view(S.router, E, T), ids, choice_weights, topk_p);
    S.down.resize(static_cast<std::size_t>(2 * K));
    if (s) s = to_host(Tensor{DType::f32, {2 * K, 1, 1, 1}, nullptr, ids.buffer, ids.offset}, S.down.data());
    if (s) {
      std::memcpy(S.expert_ids.data(), S.down.data(), sizeof(std::int32_t) * static_cast<std::size_t>(K));
      std::memcpy(S.weights.data(), S.down.data() + K, sizeof(float) * static_cast<std::size_t>(K));
    }
  } else {
    s = choose_experts(L, view(S.router, E, T), i32_2d(S.expert_ids.data(), K, T), f32(S.weights.data(), K, T), topk_p);
  }
  if (!s) return s.with_context("layer " + std::to_string(l) + "'s routing");
  // Each expert's tokens, experts in ascending id: this order fixes the per-token sum for every placement.
  std::map<std::int32_t, std::vector<std::pair<std::int64_t, float>>> groups;
  for (std::int64_t t = 0; t < T; ++t) {
    RoutingRecord rec;
    for (std::int64_t j = 0; j < K; ++j) {
      const auto idx = static_cast<std::size_t>(t * K + j);
      const std::int32_t e = S.expert_ids[idx];
      if (s = check_pick(l, t, e, S.weights[idx]); !s) return s;
      const auto first = S.expert_ids.begin() + static_cast<std::ptrdiff_t>(t * K);
      if (std::find(first, first + j, e) != first + j) return repeated_pick(l, t, e);
      groups[e].emplace_back(t, S.weights[idx]);
      if (trace != nullptr) {
        rec.experts.push_back(e);
        rec.weights.push_back(S.weights[idx]);
      }
    }
    if (trace != nullptr) {
      rec.position = t;  // the row; run_layers turns it into the token's position
      rec.layer = l;
      trace->push_back(std::move(rec));
    }
  }
  // Llama 4: the weight scales the expert's input (x * w, rounded once, as transformers' routed_in), and the expert's
  // output joins with a weight of 1 (1 * y + 0 is y).
  Tensor x_in = h;
  if (hp_.router_weight_on_input) {
    S.gate.assign(static_cast<std::size_t>(T), 0.0f);
    for (auto& [e, members] : groups) {
      for (auto& [t, w] : members) {
        S.gate[static_cast<std::size_t>(t)] = w;
        w = 1.0f;
      }
    }
    if (s = scaled_columns(h, D, S.gate, S.input_weights, S.weighted_input); !s) return s;
    x_in = view(S.weighted_input, D, T);
  }
  std::vector<sdk::ExpertKey> needed;
  for (const auto& g : groups) needed.push_back({static_cast<std::uint32_t>(l), static_cast<std::uint32_t>(g.first)});
  // This layer's misses go to the disk together (they share the device queue) before any is waited for.
  if (!experts_->resident()) experts_->fetch(needed);
  if (predicts()) {
    if (auto it = predicted_.find(l); it != predicted_.end()) {
      std::uint64_t correct = 0;
      for (const auto& g : groups) correct += it->second.count(g.first);
      experts_->note_prediction(it->second.size(), correct, groups.size());
      predicted_.erase(it);
    }
    if (s = prefetch_ahead(l, T, h, needed); !s) return s;
  }
  // compute.cpu_fallback: the experts not in VRAM that the cost model gives to the CPU, for this many tokens.
  std::set<std::int32_t> on_cpu;
  if (plugins_.cpu_fallback) {
    for (const auto& [e, members] : groups) {
      if (cpu_runs(l, e, static_cast<std::int64_t>(members.size()))) on_cpu.insert(e);
    }
    std::erase_if(needed, [&](sdk::ExpertKey k) { return on_cpu.count(static_cast<std::int32_t>(k.expert)) != 0; });
  }
  // With a VRAM tier, the uploads of the experts in RAM start now and cross the bus while those in VRAM compute.
  experts_->stage_uploads(needed);
  // Experts already resident run first, while the reads of the others are still in flight (and, with a VRAM tier,
  // the uploads), then those on the CPU; their outputs are summed afterwards in ascending expert id, with the same
  // operations on the same buffers as when computed in that order, so what was resident never changes the result.
  std::vector<std::int32_t> order, cpu_order, waiting;
  for (const auto& g : groups) {
    if (on_cpu.count(g.first) != 0) {
      cpu_order.push_back(g.first);
    } else {
      (experts_->ready(l, g.first) ? order : waiting).push_back(g.first);
    }
  }
  order.insert(order.end(), cpu_order.begin(), cpu_order.end());
  order.insert(order.end(), waiting.begin(), waiting.end());
  // When every routed expert runs every token (always in decode), each takes h as it is and adds into out where it
  // lies, on the device with activations there; otherwise rows are gathered and scattered in host memory. Both do
  // the same operations on the same values.
  const bool whole = std::all_of(groups.begin(), groups.end(),
                                 [&](const auto& g) { return static_cast<std::int64_t>(g.second.size()) == T; });
  if (whole) {
    if (S.routed.size() < groups.size()) S.routed.resize(groups.size());
    std::map<std::int32_t, std::size_t> slot;
    for (const auto& g : groups) slot.emplace(g.first, slot.size());
    for (std::size_t i = 0; i < order.size();) {
      // The experts ready to run on the backend go in one call where it offers the group op.
      const std::size_t n = std::max<std::size_t>(1, groupable(l, order, i, on_cpu));
      auto& xs = S.group_x;
      auto& ys = S.group_y;
      xs.clear();
      ys.clear();
      for (std::size_t j = i; j < i + n; ++j) {
        Act& y = S.routed[slot.at(order[j])];
        if (s = size(y, DT); !s) return s;
        xs.push_back(x_in);
        ys.push_back(view(y, D, T));
      }
      if (s = run_experts(l, std::span(order).subspan(i, n), xs, ys, on_cpu, mm_p); !s) return s;
      i += n;
    }
    if (prefetch_layers_ > 0 && !experts_->resident()) experts_->cancel_stale(l);
    // out = 0, then out += w_e * y_e in ascending expert id on the backend. In decode with activations on the
    // device neither needs an upload (so no wait): out = zeros + zeros, from a buffer zeroed once, and each w_e is
    // read where topk_routing left it. Otherwise out's zeros and every expert's weights go up together (one wait).
    std::vector<Tensor> gate_of(groups.size());
    if (device_gates) {
      if (!S.zeros.buffer || S.zeros.buffer->size() < DT * sizeof(float)) {  // zeroed whole when allocated
        if (s = size(S.zeros, DT); !s) return s;
        S.acc.assign(S.zeros.buffer->size() / sizeof(float), 0.0f);
        if (s = from_host(S.acc.data(), view(S.zeros, static_cast<std::int64_t>(S.acc.size()))); !s) return s;
      }
      if (s = run_op(Op::add, {view(S.zeros, D, T), view(S.zeros, D, T)}, {view(out, D, T)}); !s) return s;
      for (std::int64_t j = 0; j < K; ++j) {
        Tensor w = choice_weights;
        w.ne = {1, 1, 1, 1};
        w.offset += static_cast<std::size_t>(j) * sizeof(float);
        gate_of[slot.at(S.expert_ids[static_cast<std::size_t>(j)])] = w;
      }
    } else {
      S.acc.assign(DT, 0.0f);
      S.gate.assign(groups.size() * static_cast<std::size_t>(T), 0.0f);
      for (const auto& [e, members] : groups) {
        for (std::size_t i = 0; i < members.size(); ++i)
          S.gate[slot.at(e) * static_cast<std::size_t>(T) + i] = members[i].second;
      }
      if (s = size(S.gates, S.gate.size()); !s) return s;
      if (s = from_host_all({{S.acc.data(), view(out, D, T)},
                             {S.gate.data(), view(S.gates, static_cast<std::int64_t>(S.gate.size()))}});
          !s) {
        return s;
      }
      for (std::size_t at = 0; at < groups.size(); ++at)
        gate_of[at] = view(S.gates, T, 1, 1, at * static_cast<std::size_t>(T));
    }
    for (const auto& g : groups) {
      const std::size_t at = slot.at(g.first);
      if (s = run_op(Op::scale_add, {view(S.routed[at], D, T), gate_of[at]}, {view(out, D, T)}); !s) return s;
    }
  } else {
    auto hp = host_view(x_in, S.down);
    if (!hp) return hp.error();
    const float* h_ptr = *hp;
    for (std::size_t i = 0; i < order.size();) {
      // Each expert's rows gathered one after another; the experts ready on the backend go in one call where it
      // offers the group op.
      const std::size_t count = std::max<std::size_t>(1, groupable(l, order, i, on_cpu));
      const auto batch = std::span(order).subspan(i, count);
      std::size_t rows = 0;
      for (const auto e : batch) rows += groups[e].size();
      S.xe.resize(rows * static_cast<std::size_t>(D));
      S.ye.resize(S.xe.size());
      auto& xs = S.group_x;
      auto& ys = S.group_y;
      xs.clear();
      ys.clear();
      for (std::size_t at = 0; const auto e : batch) {
        const auto& members = groups[e];
        const auto n = static_cast<std::int64_t>(members.size());
        for (std::int64_t r = 0; r < n; ++r) {
          const auto t = static_cast<std::size_t>(members[static_cast<std::size_t>(r)].first);
          std::memcpy(S.xe.data() + at + static_cast<std::size_t>(r * D), h_ptr + t * static_cast<std::size_t>(D),
                      sizeof(float) * static_cast<std::size_t>(D));
        }
        xs.push_back(f32(S.xe.data() + at, D, n));
        ys.push_back(f32(S.ye.data() + at, D, n));
        at += static_cast<std::size_t>(D * n);
      }
      if (s = run_experts(l, batch, xs, ys, on_cpu, mm_p); !s) return s;
      for (std::size_t j = 0; j < count; ++j) {
        const auto* y = static_cast<const float*>(ys[j].data);
        S.expert_out[batch[j]].assign(y, y + sdk::element_count(ys[j]));
      }
      i += count;
    }
    // Prefetches of this layer still queued were for experts the router did not pick: free the disk queue.
    if (prefetch_layers_ > 0 && !experts_->resident()) experts_->cancel_stale(l);
    // The sum in host memory: out itself, or (activations on the device) a host copy uploaded at the end.
    float* sum = out.host.data();
    if (out.buffer) {
      S.last.resize(DT);
      sum = S.last.data();
    }
    std::fill(sum, sum + DT, 0.0f);
    for (const auto& [e, members] : groups) {
      const auto n = static_cast<std::int64_t>(members.size());
      const auto Dn = static_cast<std::size_t>(D * n);
      S.acc.resize(Dn);
      S.gate.resize(static_cast<std::size_t>(n));
      for (std::int64_t i = 0; i < n; ++i) {
        const auto t = static_cast<std::size_t>(members[static_cast<std::size_t>(i)].first);
        std::memcpy(S.acc.data() + i * D, sum + t * static_cast<std::size_t>(D),
                    sizeof(float) * static_cast<std::size_t>(D));
        S.gate[static_cast<std::size_t>(i)] = members[static_cast<std::size_t>(i)].second;
      }
      if (s = run_op(Op::scale_add, {f32(S.expert_out[e].data(), D, n), f32(S.gate.data(), n)},
                     {f32(S.acc.data(), D, n)});
          !s) {
        return s;
      }
      for (std::int64_t i = 0; i < n; ++i) {
        const auto t = static_cast<std::size_t>(members[static_cast<std::size_t>(i)].first);
        std::memcpy(sum + t * static_cast<std::size_t>(D), S.acc.data() + i * D,
                    sizeof(float) * static_cast<std::size_t>(D));
      }
    }
    if (s = from_host(sum, view(out, D, T)); !s) return s;
  }
  return shared_expert(L, T, h, out, mm_p);
}

// Prefetch: the routers of the next prefetch_layers_ layers applied to this layer's hidden state predict their
// experts; the predicted misses are queued below demand reads. Only timing changes: routing itself is untouched.
// Only confident guesses are read (weight >= prefetch_confidence_ x the mean of the token's top-k): a guess waits in
// its slot until used, so with a cache smaller than a token's experts every wrong one held a slot the cache policy
// would have kept a much used expert in (at 25% of the experts, all top-2 guesses left no decode hit at all).
bool Engine::predicts() const {
  return prefetch_layers_ > 0 && !experts_->resident() && !(experts_->vram() && experts_->vram()->holds_all());
}

Status Engine::prefetch_ahead(std::int64_t l, std::int64_t T, const Tensor& h, std::span<const sdk::ExpertKey> keep) {
  if (!predicts()) return {};
  auto& S = *scratch_;
  const std::int64_t E = hp_.n_experts;
  std::vector<sdk::ExpertKey> wanted;
  for (std::int64_t m = l + 1; m <= l + prefetch_layers_ && m < hp_.num_layers; ++m) {
    const Layer& M = layers_[static_cast<std::size_t>(m)];
    if (!M.sparse) {
      wanted.push_back({static_cast<std::uint32_t>(m), 0});
      continue;
    }
    const std::int64_t K = M.top_k;
    S.pred_router.resize(static_cast<std::size_t>(E * T));
    S.pred_weights.resize(static_cast<std::size_t>(K * T));
    S.pred_ids.resize(static_cast<std::size_t>(K * T));
    Status s = router_logits(M, h, f32(S.pred_router.data(), E, T));
    if (!s) return s;
    s = choose_experts(M, f32(S.pred_router.data(), E, T), i32_2d(S.pred_ids.data(), K, T),
                       f32(S.pred_weights.data(), K, T), routing_params(K));
    if (!s) return s;
    std::set<std::int32_t> mine;
    for (std::int64_t t = 0; t < T; ++t) {
      const auto at = static_cast<std::size_t>(t * K);
      float sum = 0;
      for (std::int64_t k = 0; k < K; ++k) sum += S.pred_weights[at + static_cast<std::size_t>(k)];
      const double floor = prefetch_confidence_ * static_cast<double>(sum) / static_cast<double>(K);
      for (std::int64_t k = 0; k < K; ++k) {
        const auto i = at + static_cast<std::size_t>(k);
        const auto e = S.pred_ids[i];
        // k = 0 is the most likely (topk_routing ranks); at confidence <= 1 it is at least the mean, rounding aside.
        const bool confident = (k == 0 && prefetch_confidence_ <= 1) || static_cast<double>(S.pred_weights[i]) >= floor;
        if (e >= 0 && e < E && confident) mine.insert(e);
      }
    }
    for (const auto e : mine) wanted.push_back({static_cast<std::uint32_t>(m), static_cast<std::uint32_t>(e)});
    predicted_[m].insert(mine.begin(), mine.end());
  }
  experts_->prefetch(wanted, keep);
  return {};
}

// --- Several sequences in one step ---------------------------------------------------------------------------
// The same program as forward_chunk over the concatenation of every item's tokens: per-token ops (norms, matmuls,
// rope, the MoE with each routed expert run once for all its tokens) see all tokens at once, attention and the KV
// writes go per sequence. Per-token results are those of a single-sequence forward (batch-composition invariance
// of the compute contract; experts combined in ascending id per token).

sdk::Expected<std::unique_ptr<Engine::Sequence>> Engine::new_sequence() const {
  auto kv = make_kv_cache(kv_.context());
  if (!kv) return kv.error();
  auto seq = std::make_unique<Sequence>();
  seq->kv = std::move(*kv);
  return seq;
}

Status Engine::forward_batch(std::span<const BatchItem> items, std::vector<RoutingRecord>* trace) {
  if (items.empty()) return Status(StatusCode::invalid_argument, "no sequences to run");
  for (std::size_t i = 0; i < items.size(); ++i) {
    const auto& it = items[i];
    if (it.sequence == nullptr || it.tokens.empty()) {
      return Status(StatusCode::invalid_argument, "batch item " + std::to_string(i) + " has no sequence or no tokens");
    }
    for (std::size_t j = 0; j < i; ++j) {
      if (items[j].sequence == it.sequence) {
        return Status(StatusCode::invalid_argument, "a sequence appears twice in one batch");
      }
    }
    for (std::size_t t = 0; t < it.tokens.size(); ++t) {
      if (it.tokens[t] < 0 || it.tokens[t] >= hp_.vocab_size) {
        return Status(StatusCode::invalid_argument, "token " + std::to_string(it.tokens[t]) + " (at index " +
                                                        std::to_string(t) + ") is outside the vocabulary 0.." +
                                                        std::to_string(hp_.vocab_size - 1));
      }
    }
    const auto n = static_cast<std::int64_t>(it.tokens.size());
    if (n > it.sequence->kv.max_write()) {
      return Status(StatusCode::invalid_argument,
                    "batch item " + std::to_string(i) + " runs " + std::to_string(n) +
                        " tokens in one step; a KV cache with sliding-window or chunked layers "
                        "takes at most " +
                        std::to_string(it.sequence->kv.max_write()) + " (--batch)");
    }
    if (it.sequence->n_past + n > it.sequence->kv.context()) {
      return Status(StatusCode::invalid_argument, "the context is full: " + std::to_string(it.sequence->n_past) +
                                                      " positions used + " + std::to_string(n) +
                                                      " new tokens exceed the context of " +
                                                      std::to_string(it.sequence->kv.context()) + " positions");
    }
  }
  auto& S = *scratch_;
  const std::int64_t D = hp_.hidden_size;
  auto sz = [](std::int64_t a, std::int64_t b) { return static_cast<std::size_t>(a * b); };
  S.ids.clear();
  std::vector<Segment> segments;
  std::vector<std::int64_t> first(items.size());  // each item's first row in the concatenation
  for (std::size_t i = 0; i < items.size(); ++i) {
    first[i] = static_cast<std::int64_t>(S.ids.size());
    S.ids.insert(S.ids.end(), items[i].tokens.begin(), items[i].tokens.end());
    segments.push_back({&items[i].sequence->kv, items[i].sequence->n_past, first[i],
                        static_cast<std::int64_t>(items[i].tokens.size()), items[i].pass_end});
  }
  Status s;
#define COLIBRI_TRY(expr) \
  if (s = (expr); !s) return s
  COLIBRI_TRY(run_layers(segments, trace));
  // Logits of each item's last token (or every token, all_logits) that wants them, as rows of one output matmul.
  std::vector<std::pair<std::size_t, std::int64_t>> want;  // (item, row in the concatenation)
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (items[i].logits == nullptr) continue;
    const auto n = static_cast<std::int64_t>(items[i].tokens.size());
    for (std::int64_t t = items[i].all_logits ? 0 : n - 1; t < n; ++t) want.emplace_back(i, first[i] + t);
  }
  if (!want.empty()) {
    const auto rows = static_cast<std::int64_t>(want.size());
    const auto V = static_cast<std::size_t>(hp_.vocab_size);
    S.last.resize(sz(D, rows));
    for (std::size_t r = 0; r < want.size(); ++r) {
      COLIBRI_TRY(
          to_host(view(S.x, D, 1, 1, sz(D, want[r].second)), S.last.data() + sz(D, static_cast<std::int64_t>(r))));
    }
    std::vector<float> all(V * want.size());
    COLIBRI_TRY(output_head(f32(S.last.data(), D, rows), all.data()));
    for (std::size_t r = 0; r < want.size();) {
      const std::size_t i = want[r].first;
      std::size_t end = r;
      while (end < want.size() && want[end].first == i) ++end;
      items[i].logits->assign(all.begin() + static_cast<std::ptrdiff_t>(r * V),
                              all.begin() + static_cast<std::ptrdiff_t>(end * V));
      r = end;
    }
  }
#undef COLIBRI_TRY
  for (const auto& it : items) it.sequence->n_past += static_cast<std::int64_t>(it.tokens.size());
  return {};
}

}  // namespace colibri::engine
