// GET /metrics: Prometheus text exposition format 0.0.4.
#include <cstdio>
#include <sstream>

#include "colibri/server/server.hpp"
#include "colibri/util/metrics.hpp"

namespace colibri::server {

namespace {

std::string escape_label(std::string_view v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

// Metric names allow [a-zA-Z0-9_:]; plugins name theirs freely ("storage.io_uring.sqe").
std::string sanitize_name(std::string_view v) {
  std::string out;
  for (char c : v) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
    out += ok ? c : '_';
  }
  return out;
}

class Writer {
 public:
  void family(const char* name, const char* type, const char* help) {
    out_ << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n';
  }
  void sample(std::string_view name, double value, std::string_view labels = {}) {
    out_ << name;
    if (!labels.empty()) out_ << '{' << labels << '}';
    char buf[64];
    std::snprintf(buf, sizeof buf, " %.17g\n", value);
    out_ << buf;
  }
  void one(const char* name, const char* type, const char* help, double value) {
    family(name, type, help);
    sample(name, value);
  }
  std::string str() const { return out_.str(); }

 private:
  std::ostringstream out_;
};

}  // namespace

std::string render_metrics(const SchedulerStats& s,
                           const std::map<std::pair<std::string, int>, std::uint64_t>& http_requests,
                           const std::string& model_name, double uptime_seconds) {
  Writer w;
  w.family("colibri_info", "gauge", "The served model (always 1).");
  w.sample("colibri_info", 1, "model=\"" + escape_label(model_name) + "\"");
  w.one("colibri_uptime_seconds", "gauge", "Seconds since the server started.", uptime_seconds);

  w.family("colibri_http_requests_total", "counter", "HTTP requests answered, by route and status.");
  for (const auto& [key, n] : http_requests) {
    w.sample("colibri_http_requests_total", static_cast<double>(n),
             "route=\"" + escape_label(key.first) + "\",status=\"" + std::to_string(key.second) + "\"");
  }
  w.one("colibri_requests_started_total", "counter", "Generation requests that joined the batch.",
        static_cast<double>(s.started));
  w.one("colibri_requests_finished_total", "counter", "Generation requests that ran to a finish reason.",
        static_cast<double>(s.finished));
  w.one("colibri_requests_cancelled_total", "counter",
        "Started generation requests cancelled (client disconnected or server shutting down).",
        static_cast<double>(s.cancelled));
  w.one("colibri_requests_abandoned_in_queue_total", "counter",
        "Generation requests whose client left while they waited in the queue (never started).",
        static_cast<double>(s.queue_abandoned));
  w.one("colibri_requests_failed_total", "counter", "Generation requests that failed in the engine.",
        static_cast<double>(s.failed));
  w.one("colibri_prompt_tokens_total", "counter", "Prompt tokens run (prefill).", static_cast<double>(s.prompt_tokens));
  w.one("colibri_prompt_tokens_cached_total", "counter",
        "Prompt tokens taken from an earlier request's KV cache instead of being run.",
        static_cast<double>(s.cached_prompt_tokens));
  w.one("colibri_generated_tokens_total", "counter", "Tokens generated.", static_cast<double>(s.generated_tokens));
  w.one("colibri_draft_tokens_total", "counter",
        "Draft tokens run (speculation: --draft, --draft-model, speculative.n_max).",
        static_cast<double>(s.draft_tokens));
  w.one("colibri_draft_tokens_accepted_total", "counter", "Of the draft tokens, those the answers kept.",
        static_cast<double>(s.draft_tokens_accepted));
  w.one("colibri_draft_model_read_bytes_total", "counter",
        "Bytes the draft model (--draft-model) read of its experts (the expert metrics are the model's alone).",
        static_cast<double>(s.draft_model_bytes_read));
  w.one("colibri_generated_tokens_per_second", "gauge", "Generated tokens per second over the last 10 seconds.",
        s.recent_tokens_per_second);
  w.one("colibri_forward_seconds_total", "counter", "Time spent in forward passes.", s.busy_seconds);
  w.one("colibri_engine_steps_total", "counter", "Forward steps run (one per token boundary).",
        static_cast<double>(s.steps));
  w.one("colibri_engine_step_tokens_total", "counter",
        "Tokens run through the model over all steps (prompt and generated).", static_cast<double>(s.batched_tokens));
  w.one("colibri_engine_step_sequences_total", "counter",
        "Sequences run over all steps (divided by steps: the mean batch size).",
        static_cast<double>(s.batched_sequences));
  w.one("colibri_queue_depth", "gauge", "Requests waiting to join the batch.", static_cast<double>(s.queue_depth));
  w.one("colibri_active_sequences", "gauge", "Sequences in the running batch.", static_cast<double>(s.active));
  w.one("colibri_kv_budget_bytes", "gauge",
        "RAM the sequences' KV caches may take together (0: no limit; caches in device memory).",
        static_cast<double>(s.kv_budget_bytes));
  w.one("colibri_kv_bytes", "gauge",
        "What the KV caches count for against that budget: what the running and the kept ones have reached.",
        static_cast<double>(s.kv_bytes));
  w.one("colibri_requests_waited_for_kv_total", "counter",
        "Requests that waited in the queue until their KV cache fit beside the running ones'.",
        static_cast<double>(s.kv_waits));
  w.one("colibri_sequences_preempted_total", "counter",
        "Sequences paused because the KV caches outgrew memory.kv_budget (each runs its tokens again on resuming).",
        static_cast<double>(s.preempted));
  w.one("colibri_paused_sequences", "gauge", "Sequences paused for KV room, waiting to run again.",
        static_cast<double>(s.paused));
  w.one("colibri_replayed_tokens_total", "counter",
        "Tokens paused sequences ran again on resuming (the cost of the pauses; one paused within its prompt runs "
        "the prompt again, counted as prompt tokens).",
        static_cast<double>(s.replayed_tokens));
  w.one("colibri_replay_tokens_cached_total", "counter",
        "Tokens resuming sequences took from a kept KV cache sharing their history instead of running them again.",
        static_cast<double>(s.replay_cached_tokens));

  w.family("colibri_expert_hits_total", "counter",
           "Expert lookups served from a memory tier (tier=\"ram\" counts only lookups the VRAM tier missed).");
  w.sample("colibri_expert_hits_total", static_cast<double>(s.experts.hits), "tier=\"ram\"");
  w.sample("colibri_expert_hits_total", static_cast<double>(s.experts.vram_hits), "tier=\"vram\"");
  w.family("colibri_expert_misses_total", "counter",
           "Expert lookups that missed a tier (a VRAM miss uploads from RAM, a RAM miss reads from storage).");
  w.sample("colibri_expert_misses_total", static_cast<double>(s.experts.misses), "tier=\"ram\"");
  w.sample("colibri_expert_misses_total", static_cast<double>(s.experts.vram_misses), "tier=\"vram\"");
  w.one("colibri_expert_bytes_uploaded_total", "counter", "Bytes of expert weights uploaded into the VRAM tier.",
        static_cast<double>(s.experts.bytes_uploaded));
  w.one("colibri_expert_cpu_fallback_runs_total", "counter",
        "Experts not in VRAM run on the CPU instead of uploaded (compute.cpu_fallback: auto).",
        static_cast<double>(s.experts.cpu_runs));
  w.one("colibri_expert_evictions_total", "counter", "Experts evicted from the RAM tier.",
        static_cast<double>(s.experts.evictions));
  w.one("colibri_expert_bytes_read_total", "counter", "Bytes of expert weights read from storage.",
        static_cast<double>(s.experts.bytes_read));
  w.one("colibri_io_stall_seconds_total", "counter", "Time the forward pass waited for expert reads.",
        s.experts.stall_seconds);
  w.one("colibri_expert_cache_resident_bytes", "gauge", "Bytes of experts resident in the RAM tier.",
        static_cast<double>(s.expert_resident_bytes));
  w.one("colibri_expert_cache_budget_bytes", "gauge", "RAM tier budget (memory.expert_cache).",
        static_cast<double>(s.expert_budget_bytes));
  w.one("colibri_prefetch_issued_total", "counter", "Prefetch reads issued for the next layers' predicted experts.",
        static_cast<double>(s.experts.prefetch_issued));
  w.one("colibri_prefetch_used_total", "counter", "Prefetched experts the router then picked.",
        static_cast<double>(s.experts.prefetch_used));
  w.one("colibri_prefetch_wasted_total", "counter", "Prefetched experts evicted before any use.",
        static_cast<double>(s.experts.prefetch_wasted));
  w.one("colibri_prefetch_cancelled_total", "counter",
        "Prefetches withdrawn from the disk queue before they started (their layer had passed).",
        static_cast<double>(s.experts.prefetch_cancelled));
  w.one("colibri_prefetch_accuracy", "gauge",
        "Prediction precision: share of predicted experts the router then picked (0..1).",
        s.experts.prediction_precision());
  w.one("colibri_prefetch_recall", "gauge", "Prediction recall: share of picked experts that were predicted (0..1).",
        s.experts.prediction_recall());

  // What the plugins report through the host services (process-wide).
  const auto plugin_values = util::Metrics::global().snapshot();
  if (!plugin_values.empty()) {
    w.family("colibri_plugin_metric", "untyped", "Counters and gauges reported by plugins, by name.");
    for (const auto& [name, v] : plugin_values) {
      w.sample("colibri_plugin_metric", v, "name=\"" + escape_label(sanitize_name(name)) + "\"");
    }
  }
  return w.str();
}

}  // namespace colibri::server
