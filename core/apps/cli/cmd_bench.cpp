// colibri-cli bench --model M [--prompt-tokens N] [--gen-tokens N] [--[no-]warmup] [--json]
// Prefill and decode speed on seeded random tokens, the expert cache and I/O counters, and the memory-bandwidth
// bound of decode (active weight bytes per token over measured read bandwidth).
#include <sys/resource.h>

#include <chrono>
#include <cstring>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "colibri/ab/record.hpp"
#include "colibri/engine/sampler.hpp"
#include "colibri/util/host_info.hpp"
#include "colibri/util/metrics.hpp"
#include "colibri/util/output_file.hpp"
#include "engine_cli.hpp"

namespace colibri::cli::bench_command {
namespace {

struct BenchOptions {
  EngineCliOptions engine;
  std::int64_t prompt_tokens = 128;
  std::int64_t gen_tokens = 64;
  bool json = false;
  std::uint64_t seed = 1;
  std::string record_trace;
  bool warmup = false, no_warmup = false;  // neither: warm up where it leaves the expert tiers as they were
};

nlohmann::json ops_json(const std::vector<engine::OpTime>& ops) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& op : ops) out.push_back({{"name", op.name}, {"calls", op.calls}, {"seconds", op.seconds}});
  return out;
}

// bench --ops: the backend calls of one phase, `per` of its tokens (decode: per token; prefill: the whole prompt,
// per 1), and the share of the phase's wall time each took; what is left is the engine's own work on the host.
void print_ops(const char* phase, const std::vector<engine::OpTime>& ops, double phase_seconds, double per) {
  const bool whole = per == 1;
  std::printf("ops        %s: host time in the backend's calls (an asynchronous backend's kernels run beside it)\n",
              phase);
  std::printf("           %-26s %12s %10s %12s %7s\n", "call", whole ? "calls" : "calls/token", "us/call",
              whole ? "ms" : "us/token", "share");
  const double unit = whole ? 1e3 : 1e6 / per;  // ms per phase, or us per token
  double in_calls = 0;
  for (const auto& op : ops) {
    in_calls += op.seconds;
    std::printf("           %-26s %12.*f %10.2f %12.*f %6.1f%%\n", op.name.c_str(), whole ? 0 : 2,
                static_cast<double>(op.calls) / per, 1e6 * op.seconds / static_cast<double>(op.calls), whole ? 3 : 1,
                unit * op.seconds, 100.0 * op.seconds / phase_seconds);
  }
  const double outside = std::max(0.0, phase_seconds - in_calls);
  std::printf("           %-26s %12s %10s %12.*f %6.1f%%\n", "(outside the backend)", "", "", whole ? 3 : 1,
              unit * outside, 100.0 * outside / phase_seconds);
}

// An unmeasured run first (as llama-bench does): the KV cache's and the scratch buffers' pages are then mapped and the
// threads awake, as for every request of a server after its first. A 64-token prefill of a Qwen3-MoE-shaped model
// spent 15% of its time in the kernel zeroing such pages. By default only where every expert the run reads is
// already in the tier it runs from (all resident, and a VRAM tier that holds them all or none): elsewhere the warm-up
// would fill the expert cache that a streamed run measures.
bool wants_warmup(const BenchOptions& o, const engine::Engine& e) {
  if (o.warmup || o.no_warmup) return o.warmup;
  const auto* vram = e.experts().vram();
  return e.mode() == "resident" && (vram == nullptr || vram->holds_all());
}

// Single-pass read bandwidth over a buffer far larger than the caches (bytes per second), read by `threads` threads
// at once: decode reads its weights with every compute thread, and one thread alone reaches about half of that.
double read_bandwidth(int threads) {
  // 256 MiB: far above any last-level cache, and small enough for a bench run inside a memory budget (a cgroup
  // sized for the expert cache), where it briefly adds to what the process holds.
  const std::size_t n = std::size_t{256} << 20;
  std::vector<std::uint64_t> buf(n / 8);
  for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = i;
  const std::size_t per = buf.size() / static_cast<std::size_t>(threads) / 4 * 4;
  std::vector<std::uint64_t> sums(static_cast<std::size_t>(threads));
  auto read_slice = [&](int w) {
    const std::uint64_t* p = buf.data() + static_cast<std::size_t>(w) * per;
    std::uint64_t a = 0, b = 0, c = 0, d = 0;
    for (std::size_t i = 0; i < per; i += 4) {
      a += p[i];
      b += p[i + 1];
      c += p[i + 2];
      d += p[i + 3];
    }
    sums[static_cast<std::size_t>(w)] += a + b + c + d;
  };
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::jthread> others;
    for (int w = 1; w < threads; ++w) others.emplace_back(read_slice, w);
    read_slice(0);
    others.clear();  // joins
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, static_cast<double>(per * sizeof(std::uint64_t)) * threads / s);
  }
  volatile std::uint64_t sink = 0;
  for (const auto v : sums) sink = sink + v;
  return best;
}

// The threads the CPU backend runs: compute.threads, or (auto) the physical cores, as compute/cpu picks them.
int compute_threads(const profile::Profile& prof) {
  const auto configured = prof.get_int("compute.threads");
  const auto n = configured.value_or(0) > 0 ? *configured : static_cast<std::int64_t>(util::host_info().physical_cores);
  return static_cast<int>(std::clamp<std::int64_t>(n, 1, 1024));
}

// Weight bytes one decoded token reads: all shared tensors but the embedding table (one row), and the top-k
// experts of each layer (the mean expert size of that layer).
double active_bytes_per_token(const model::Manifest& m) {
  double bytes = 0;
  const auto& hp = m.hparams;
  for (const auto& t : m.tensors) {
    if (t.name == "token_embd.weight" && !hp.tie_word_embeddings) {
      bytes += static_cast<double>(t.size) / static_cast<double>(hp.vocab_size);
    } else {
      bytes += static_cast<double>(t.size);
    }
  }
  std::map<std::int64_t, std::pair<double, int>> per_layer;
  for (const auto& e : m.experts) {
    for (const auto* part : e.parts()) per_layer[e.layer].first += static_cast<double>(part->size);
    per_layer[e.layer].second += 1;
  }
  for (const auto& [layer, sum] : per_layer) {
    bytes += sum.first / sum.second * static_cast<double>(hp.layer_top_k(layer));
  }
  return bytes;
}

int run_bench(const GlobalOptions& global, const BenchOptions& o) {
  auto t0 = std::chrono::steady_clock::now();
  std::optional<profile::Profile> prof;
  auto opened = open_engine(global, o.engine, &prof);
  if (!opened.engine) return opened.exit_code;
  auto& engine = opened.engine;
  if (!o.record_trace.empty()) {  // checked before the work, not after it
    const auto model = engine->model_dir().string();
    if (auto e = overwrite_error("--record-trace", o.record_trace, "--model", model); !e.empty()) return fail(e);
    if (auto f = util::OutputFile::open(o.record_trace); !f) return fail("--record-trace: " + f.error().message());
  }
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (o.prompt_tokens + o.gen_tokens > engine->context()) {
    return fail(
        "--prompt-tokens + --gen-tokens (" + std::to_string(o.prompt_tokens + o.gen_tokens) +
        ") exceed the context of " + std::to_string(engine->context()) + " positions; " +
        (engine->context() < engine->hparams().max_position_embeddings
             ? "raise --ctx (the model allows " + std::to_string(engine->hparams().max_position_embeddings) + ")"
             : "that is the model's own limit: ask for fewer tokens"));
  }
  std::mt19937_64 rng(o.seed);
  std::vector<std::int32_t> prompt(static_cast<std::size_t>(o.prompt_tokens));
  for (auto& t : prompt) t = static_cast<std::int32_t>(rng() % static_cast<std::uint64_t>(engine->vocab_size()));
  std::vector<float> logits;
  const bool warmup = wants_warmup(o, *engine);
  const engine::ExpertStats before_warmup = engine->experts().stats();
  if (warmup) {  // other tokens than the prompt's, one prefill and one decode step, then every position forgotten
    std::vector<std::int32_t> other(prompt.size());
    for (auto& t : other) t = static_cast<std::int32_t>(rng() % static_cast<std::uint64_t>(engine->vocab_size()));
    if (auto s = engine->forward(other, engine::LogitsWanted::last, logits); !s) return fail(s.message());
    if (o.gen_tokens > 0) {
      const std::int32_t next[1] = {other.front()};
      if (auto s = engine->forward(next, engine::LogitsWanted::last, logits); !s) return fail(s.message());
    }
    engine->truncate(0);
    if (engine->n_past() != 0) return fail("the warm-up run's positions could not be forgotten; use --no-warmup");
  }
  // The counters below leave out the warm-up's lookups and reads (what loading did, e.g. uploads, stays in them).
  const engine::ExpertStats before = engine->experts().stats().since(before_warmup);
  // Prefetches the warm-up left open are settled (used, wasted...) in the measured run's counters.
  const std::uint64_t prefetch_open_at_start = engine->experts().prefetches_open();
  auto* op_timing = engine->op_timing();
  if (op_timing != nullptr) op_timing->reset();
  t0 = std::chrono::steady_clock::now();
  std::vector<engine::RoutingRecord> routing;
  auto* routing_out = o.record_trace.empty() ? nullptr : &routing;
  std::vector<std::int32_t> trace_tokens(prompt);  // tokens by position, for the trace
  if (auto s = engine->forward(prompt, engine::LogitsWanted::last, logits, routing_out); !s) return fail(s.message());
  const double prefill_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const auto after_prefill = engine->experts().stats().since(before);
  std::vector<engine::OpTime> prefill_ops, decode_ops;
  if (op_timing != nullptr) {
    prefill_ops = op_timing->totals();
    op_timing->reset();
  }
  engine::SamplingOptions greedy;
  greedy.temperature = 0;
  engine::Sampler sampler(greedy);
  t0 = std::chrono::steady_clock::now();
  for (std::int64_t i = 0; i < o.gen_tokens; ++i) {
    const std::int32_t next[1] = {sampler.sample(logits, prompt)};
    if (auto s = engine->forward(next, engine::LogitsWanted::last, logits, routing_out); !s) return fail(s.message());
    if (routing_out != nullptr) trace_tokens.push_back(next[0]);
  }
  const double decode_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (op_timing != nullptr) decode_ops = op_timing->totals();
  if (routing_out != nullptr) {
    std::vector<ab::TraceRecord> trace;
    ab::append_routing(trace, 0, routing, trace_tokens, 0);
    if (auto s = ab::write_trace(o.record_trace, trace); !s) return fail(s.message());
    std::cerr << "routing trace: " << trace.size() << " records in " << o.record_trace << "\n";
  }
  const engine::ExpertStats st = engine->experts().stats().since(before);
  const double prefill_tps = static_cast<double>(o.prompt_tokens) / prefill_s;
  const double decode_tps = o.gen_tokens > 0 ? static_cast<double>(o.gen_tokens) / decode_s : 0;
  const double active = active_bytes_per_token(engine->manifest());
  // The run's peak RSS, before the bandwidth probe's buffer adds to it.
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  const int bw_threads = compute_threads(*prof);
  const double bandwidth = read_bandwidth(bw_threads);
  const double bound = bandwidth / active;
  const auto& hp = engine->hparams();
  nlohmann::json j = {
      {"model", engine->model_dir().string()},
      {"architecture", hp.architecture},
      {"preset", engine->manifest().quantization.value("preset", "")},
      {"mode", engine->mode()},
      {"backend", engine->plugins().compute_name},
      {"storage", engine->plugins().storage_name},
      {"cache", engine->plugins().cache_name},
      {"kv_type", std::string(sdk::to_string(engine->kv_cache().type()))},
      {"context", engine->context()},
      {"kv_bytes", engine->kv_cache().bytes()},  // reserved; host pages are paid as they fill
      {"load_seconds", load_s},
      {"warmup", warmup},  // an unmeasured prefill and decode step ran first (not counted below)
      {"prompt_tokens", o.prompt_tokens},
      {"gen_tokens", o.gen_tokens},
      {"prefill_tokens_per_second", prefill_tps},
      {"decode_tokens_per_second", decode_tps},
      {"expert_hits", st.hits},
      {"expert_misses", st.misses},
      {"experts_preloaded", st.preloaded},
      {"expert_hit_rate", st.hit_rate()},
      {"decode_expert_misses", st.misses - after_prefill.misses},
      {"bytes_read", st.bytes_read},
      {"io_stall_seconds", st.stall_seconds},
      {"active_weight_bytes_per_token", active},
      {"memory_read_bandwidth_bytes_per_second", bandwidth},
      {"memory_read_bandwidth_threads", bw_threads},
      {"decode_bandwidth_bound_tokens_per_second", bound},
      {"decode_fraction_of_bound", decode_tps / bound},
  };
  // Streaming figures: what the disk delivered, prefetch quality, memory high-water mark.
  const std::uint64_t decode_bytes = st.bytes_read - after_prefill.bytes_read;
  const double bytes_per_token = o.gen_tokens > 0
                                     ? static_cast<double>(decode_bytes) / static_cast<double>(o.gen_tokens)
                                     : static_cast<double>(st.bytes_read) / static_cast<double>(o.prompt_tokens);
  const double run_s = prefill_s + decode_s;
  j["prefetch_layers"] = engine->prefetch_layers();
  j["prefetch_confidence"] = engine->prefetch_confidence();
  j["prefetch_issued"] = st.prefetch_issued;
  j["prefetch_used"] = st.prefetch_used;
  j["prefetch_wasted"] = st.prefetch_wasted;
  j["prefetch_failed"] = st.prefetch_failed;
  j["prefetch_cancelled"] = st.prefetch_cancelled;
  // Open (still reading, or in the cache unused) when the run started and ended: with them the counters add up,
  // issued + open_at_start = used + wasted + failed + cancelled + open_at_end.
  j["prefetch_open_at_start"] = prefetch_open_at_start;
  j["prefetch_open_at_end"] = engine->experts().prefetches_open();
  j["buffers_mapped"] = st.buffers_mapped;
  // null where nothing was guessed: 0.0 would read as "every guess wrong" (and advice to raise the confidence).
  j["prefetch_precision"] = st.predicted > 0 ? nlohmann::json(st.prediction_precision()) : nlohmann::json(nullptr);
  j["prefetch_recall"] = st.actual > 0 ? nlohmann::json(st.prediction_recall()) : nlohmann::json(nullptr);
  j["prefetch_predicted"] = st.predicted;  // experts predicted for the next layers (prefetch.confidence filters)
  j["stall_saved_seconds"] = st.stall_saved_seconds;
  j["bytes_read_per_token"] = bytes_per_token;
  // The measured run's reads only: a resident model's experts were read at load, before the clock started (they
  // made a 12 MiB load read in a 1 ms run look like a 9 GB/s disk).
  const std::uint64_t run_bytes = st.bytes_read - std::min(st.bytes_read, before_warmup.bytes_read);
  j["disk_bytes_per_second"] = run_s > 0 ? static_cast<double>(run_bytes) / run_s : 0.0;
  // Decode alone: what the disk delivered while decoding, and the experts that had to come from it (demand misses
  // plus prefetches that were used), the figure a disk bound divides by.
  j["decode_disk_bytes_per_second"] = decode_s > 0 ? static_cast<double>(decode_bytes) / decode_s : 0.0;
  j["decode_prefetch_used"] = st.prefetch_used - after_prefill.prefetch_used;
  j["decode_io_stall_seconds"] = st.stall_seconds - after_prefill.stall_seconds;
  j["peak_rss_bytes"] = static_cast<std::uint64_t>(usage.ru_maxrss) * 1024;
  // The VRAM tier, when the backend has device memory and memory.vram_budget > 0 (expert_hits above: RAM tier).
  const auto* vram = engine->experts().vram();
  j["vram_budget_bytes"] = vram != nullptr ? vram->budget_bytes() : 0;
  j["vram_slots"] = vram != nullptr ? vram->slot_count() : 0;
  j["vram_allocated_bytes"] = vram != nullptr ? vram->allocated_bytes() : 0;
  j["vram_hits"] = st.vram_hits;
  j["vram_misses"] = st.vram_misses;
  j["vram_hit_rate"] = vram != nullptr ? st.vram_hit_rate() : 0.0;
  j["vram_evictions"] = st.vram_evictions;
  j["vram_uploads"] = st.uploads;
  j["vram_bypassed"] = st.vram_bypassed;  // misses memory.vram_admission ran from RAM instead of uploading
  j["bytes_uploaded"] = st.bytes_uploaded;
  j["upload_seconds"] = st.upload_seconds;
  // compute.cpu_fallback: experts run on the CPU instead of uploaded, and the cost model that chose them.
  j["cpu_fallback_runs"] = st.cpu_runs;
  j["cpu_fallback_bytes"] = st.cpu_run_bytes;
  j["cpu_fallback_seconds"] = st.cpu_run_seconds;
  if (const auto* cost = engine->offload_cost()) {
    j["cost_model"] = {{"upload_bytes_per_second", cost->upload_bytes_per_second},
                       {"device_bytes_per_second", cost->device_bytes_per_second},
                       {"cpu_bytes_per_second", cost->cpu_bytes_per_second},
                       {"cpu_extra_token", cost->cpu_extra_token},
                       {"cpu_token_limit", cost->cpu_token_limit()}};
  } else {
    j["cost_model"] = nullptr;
  }
  j["shared_device_bytes"] = engine->shared_device_bytes();  // shared weights uploaded once (memory.shared_on_device)
  j["kv_device_bytes"] = engine->kv_device_bytes();          // KV cache in device memory (memory.kv_on_device)
  j["activations_on_device"] = engine->activations_on_device();  // memory.activations_on_device
  // What the storage plugin counted itself (host metrics): reads per stripe directory, io_uring's fixed and plain
  // reads, errors. Counters are whole numbers; JSON shows them so.
  const auto counters_of = [](sdk::PluginKind kind, const std::string& name) {
    const auto counters = util::Metrics::global().with_prefix(util::plugin_metric_prefix(sdk::to_string(kind), name));
    nlohmann::json out = nlohmann::json::object();
    for (const auto& [metric, v] : counters) {
      if (v >= 0 && v < 9e15 && v == static_cast<double>(static_cast<std::uint64_t>(v))) {
        out[metric] = static_cast<std::uint64_t>(v);
      } else {
        out[metric] = v;
      }
    }
    return out;
  };
  const nlohmann::json storage_json = counters_of(sdk::PluginKind::storage, engine->plugins().storage_name);
  j["storage_metrics"] = storage_json;
  // And the compute plugin's (CUDA: the graphs it launched, instantiated and updated).
  const nlohmann::json compute_json = counters_of(sdk::PluginKind::compute, engine->plugins().compute_name);
  j["compute_metrics"] = compute_json;
  // stripe: reads_dir<N>_total, directory 0 the model's own, then storage.paths in order (as the plugin numbers
  // them); a directory that served nothing has no counter yet, and counts 0.
  std::vector<nlohmann::json> reads_per_dir;
  const bool per_dir = std::any_of(storage_json.items().begin(), storage_json.items().end(),
                                   [](const auto& kv) { return kv.key().starts_with("reads_dir"); });
  if (per_dir) {
    std::vector<std::string> dirs{engine->model_dir().string()};
    for (const auto& p : prof->get_list("storage.paths")) dirs.push_back(p);
    for (std::size_t d = 0; d < dirs.size(); ++d) {
      reads_per_dir.push_back(storage_json.value("reads_dir" + std::to_string(d) + "_total", nlohmann::json(0)));
    }
    j["storage_reads_per_dir"] = reads_per_dir;
    j["storage_reads_dirs"] = dirs;
  }
  if (op_timing != nullptr) j["op_times"] = {{"prefill", ops_json(prefill_ops)}, {"decode", ops_json(decode_ops)}};
  save_usage(*engine);
  if (o.json) {
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::printf("model      %s (%s, %s)\n", j["model"].get<std::string>().c_str(), hp.architecture.c_str(),
              j["preset"].get<std::string>().c_str());
  std::printf("plugins    %s | backend %s | storage %s | cache %s | kv %s | ctx %lld\n", engine->mode().c_str(),
              engine->plugins().compute_name.c_str(), engine->plugins().storage_name.c_str(),
              engine->plugins().cache_name.c_str(), j["kv_type"].get<std::string>().c_str(),
              static_cast<long long>(engine->context()));
  std::printf("load       %.2f s%s\n", load_s, warmup ? ", then an unmeasured warm-up run" : "");
  std::printf("prefill    %lld tokens: %.1f tok/s\n", static_cast<long long>(o.prompt_tokens), prefill_tps);
  std::printf("decode     %lld token%s: %.2f tok/s\n", static_cast<long long>(o.gen_tokens),
              o.gen_tokens == 1 ? "" : "s", decode_tps);
  const std::string preloaded =
      st.preloaded > 0 ? "; " + std::to_string(st.preloaded) + " pinned ones read at load, in the bytes read" : "";
  // A hit is an expert found in RAM at its lookup, kept there or read ahead by a prefetch: say how many were the
  // latter.
  const std::string prefetched =
      st.prefetch_used > 0 ? ", " + std::to_string(st.prefetch_used) + " of them read ahead by prefetch" : "";
  std::printf("experts    hit rate %.1f%% (%llu hits%s, %llu misses%s), read %s, I/O stall %.3f s\n",
              100.0 * st.hit_rate(), static_cast<unsigned long long>(st.hits), prefetched.c_str(),
              static_cast<unsigned long long>(st.misses), preloaded.c_str(), util::bytes_text(st.bytes_read).c_str(),
              st.stall_seconds);
  if (vram != nullptr) {
    std::printf(
        "vram       %zu slots (%s of %s budget): hit rate %.1f%% (%llu hits, %llu misses), %llu uploads, %s "
        "uploaded in %.3f s\n",
        vram->slot_count(), util::bytes_text(vram->allocated_bytes()).c_str(),
        util::bytes_text(vram->budget_bytes()).c_str(), 100.0 * st.vram_hit_rate(),
        static_cast<unsigned long long>(st.vram_hits), static_cast<unsigned long long>(st.vram_misses),
        static_cast<unsigned long long>(st.uploads), util::bytes_text(st.bytes_uploaded).c_str(), st.upload_seconds);
  }
  if (engine->mode() == "resident") {
    std::printf("streaming  none: every expert resident (read at load); peak RSS %s\n",
                util::bytes_text(j["peak_rss_bytes"].get<std::uint64_t>()).c_str());
  } else {
    std::printf("streaming  %s read/token, disk %.3f GB/s, stall %.3f s (prefetch saved %.3f s), peak RSS %s\n",
                util::bytes_text(static_cast<std::uint64_t>(bytes_per_token)).c_str(),
                j["disk_bytes_per_second"].get<double>() / 1e9, st.stall_seconds, st.stall_saved_seconds,
                util::bytes_text(j["peak_rss_bytes"].get<std::uint64_t>()).c_str());
  }
  // Nothing predicted (resident, or prefetch off): no rate to show, rather than "precision 0.0%".
  char prediction[96] = "no router predictions made";
  if (st.predicted > 0) {
    std::snprintf(prediction, sizeof prediction, "prediction precision %.1f%%, recall %.1f%%",
                  100.0 * st.prediction_precision(), 100.0 * st.prediction_recall());
  }
  const std::string failed =
      st.prefetch_failed > 0 ? std::to_string(st.prefetch_failed) + " failed (read again on demand), " : "";
  std::printf(
      "prefetch   %lld %s, confidence %g: %llu issued, %llu used, %llu wasted, %s%llu cancelled, %llu unused at the "
      "end; %s\n",
      static_cast<long long>(engine->prefetch_layers()), engine->prefetch_layers() == 1 ? "layer" : "layers",
      engine->prefetch_confidence(), static_cast<unsigned long long>(st.prefetch_issued),
      static_cast<unsigned long long>(st.prefetch_used), static_cast<unsigned long long>(st.prefetch_wasted),
      failed.c_str(), static_cast<unsigned long long>(st.prefetch_cancelled),
      static_cast<unsigned long long>(engine->experts().prefetches_open()), prediction);
  for (const auto& [label, name, counters] : {std::tuple{"storage", engine->plugins().storage_name, &storage_json},
                                              std::tuple{"compute", engine->plugins().compute_name, &compute_json}}) {
    if (counters->empty()) continue;
    std::string line;
    for (const auto& [metric, v] : counters->items()) line += (line.empty() ? "" : ", ") + metric + " " + v.dump();
    std::printf("%-10s %s: %s\n", label, name.c_str(), line.c_str());
  }
  if (!reads_per_dir.empty()) {
    std::string dirs;
    for (std::size_t d = 0; d < reads_per_dir.size(); ++d) {
      dirs += (d == 0 ? "" : ", ") + std::string("dir") + std::to_string(d) + " " + reads_per_dir[d].dump();
    }
    std::printf("stripe     reads per directory (dir0: the model directory, dirN: storage.paths[N-1]): %s\n",
                dirs.c_str());
  }
  char decode_share[48] = "no decode measured: --gen-tokens 0";
  if (o.gen_tokens > 0)
    std::snprintf(decode_share, sizeof decode_share, "decode at %.0f%%", 100.0 * decode_tps / bound);
  std::printf("bound      %.2f MiB active weights/token at %.1f GB/s read bandwidth (%d thread%s): %.2f tok/s (%s)\n",
              active / (1024.0 * 1024.0), bandwidth / 1e9, bw_threads, bw_threads == 1 ? "" : "s", bound, decode_share);
  if (op_timing != nullptr) {
    print_ops("prefill, the whole prompt", prefill_ops, prefill_s, 1);
    if (o.gen_tokens > 0) print_ops("decode, per token", decode_ops, decode_s, static_cast<double>(o.gen_tokens));
  }
  return 0;
}

void setup(CLI::App& app, GlobalOptions& global) {
  auto o = std::make_shared<BenchOptions>();
  auto* cmd = app.add_subcommand("bench", "Prefill and decode speed, expert cache and I/O, memory-bandwidth bound");
  add_engine_options(*cmd, o->engine, global);
  cmd->add_option("--prompt-tokens", o->prompt_tokens, "Prompt length (default 128)")
      ->check(apps::integer_at_least(1, "give a prompt length of 1 or more tokens"));
  cmd->add_option("--gen-tokens", o->gen_tokens, "Tokens decoded one at a time (default 64)")
      ->check(apps::integer_at_least(0, "give 0 (prefill only) or more"));
  cmd->add_option("--seed", o->seed, "Seed of the random prompt tokens");
  auto* warm = cmd->add_flag("--warmup", o->warmup,
                             "Run the prompt and a decode step once unmeasured first (default where every expert "
                             "is resident: it would fill a streamed run's cache)");
  cmd->add_flag("--no-warmup", o->no_warmup, "Measure the process's first run")->excludes(warm);
  cmd->add_flag("--json", o->json, "Machine-readable output");
  cmd->add_option("--record-trace", o->record_trace, "Write the routing trace (JSONL, see README) to this file");
  cmd->add_flag("--ops", o->engine.time_ops,
                "Count and time every call to the compute backend: per op, calls per token, microseconds per call and "
                "share of the phase (on an asynchronous backend the host's queueing and waits)");
  cmd->callback([&global, o] { global.exit_code = run_bench(global, *o); });
}

}  // namespace

COLIBRI_CLI_COMMAND(44, setup);

}  // namespace colibri::cli::bench_command
