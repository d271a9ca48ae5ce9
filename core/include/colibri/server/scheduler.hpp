// The engine scheduler: one thread owns the engine and its sequences. Requests wait in a bounded queue and join the
// running batch at token boundaries; every step runs each active sequence one token further (a newly joined one
// runs its prompt), checks cancellation first, and streams finished text through the job's callback.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "colibri/ab/trace_writer.hpp"
#include "colibri/engine/draft_model.hpp"
#include "colibri/engine/engine.hpp"
#include "colibri/engine/json_constraint.hpp"
#include "colibri/engine/sampler.hpp"
#include "colibri/server/api.hpp"
#include "colibri/tokenizer/tokenizer.hpp"

namespace colibri::server {

struct GenerationRequest {
  std::vector<std::int32_t> prompt;
  std::int64_t max_tokens = 16;  // >= 1; generation also ends when the context is full
  std::vector<std::string> stop;
  engine::SamplingOptions sampling;
  int logprobs = -1;         // >= 0: report each generated token's logprob with this many alternatives
  bool json_object = false;  // JSON mode: only tokens that keep the text valid JSON; ends when the object closes
  std::shared_ptr<const engine::JsonSchema> json_schema;  // JSON mode: the object must also conform to this
  // JSON mode: a thinking model's <think> block comes first, free (may_open: if the answer opens it).
  engine::JsonAnswer::Thinking json_thinking = engine::JsonAnswer::Thinking::none;
  std::int64_t min_tokens = 0;  // end tokens are banned until this many tokens are generated
  bool ignore_eos = false;      // end tokens are banned throughout: generation ends by length, stop or context
  // Speculation for this request (CompletionRequest's speculative.*): drafts per step (unset: the server's), fewer
  // than draft_min not run, a draft model's floor (unset: its own).
  std::optional<std::int64_t> draft_max;
  std::int64_t draft_min = 0;
  std::optional<double> draft_p_min;
  std::vector<std::int32_t> stop_token_ids;  // these end it too (banned before min_tokens); not in the text
  bool keep_special = false;      // special tokens are decoded into the text (a tool call marker that is one)
  bool continues_prompt = false;  // the text continues the prompt's (completions): see engine::GenerateOptions
  bool prompt_logprobs = false;   // with logprobs: also every prompt token's (echo); the prompt runs whole, uncached
  // Non-zero: the choices of one request (n > 1) share it; one runs the prompt, the others copy its KV rows.
  std::uint64_t prompt_group = 0;
  // Prompt positions where a later request may part from this one (chat::parting_positions): the KV cache keeps a
  // checkpoint there, and at the prompt's end, where it keeps any (sliding-window or recurrent layers).
  std::vector<std::int64_t> checkpoints;
};

struct GenerationEvent {
  enum class Kind { text, finished, failed };
  Kind kind = Kind::text;
  std::string text;                            // text: the new final text
  std::vector<engine::TokenLogprob> logprobs;  // text: the tokens generated with it (when asked for)
  // text: prompt tokens' logprobs (prompt_logprobs), in order over the events; the first token's is NaN (nothing
  // predicts it)
  std::vector<engine::TokenLogprob> prompt_logprobs;
  std::string finish_reason;  // finished: "eos" | "stop" | "length" | "context" | "cancelled"
  std::int64_t prompt_tokens = 0;
  std::int64_t cached_tokens = 0;  // of the prompt, taken from an earlier request's KV cache instead of being run
  std::int64_t completion_tokens = 0;
  ApiError error;  // failed
};

// One request in the scheduler. Every accepted job gets exactly one terminal event (finished or failed).
class Job {
 public:
  GenerationRequest request;
  // Called on the scheduler thread; must not block (post the work elsewhere).
  std::function<void(GenerationEvent&&)> on_event;

  void cancel() noexcept { cancelled_.store(true, std::memory_order_relaxed); }
  [[nodiscard]] bool cancelled() const noexcept { return cancelled_.load(std::memory_order_relaxed); }

 private:
  std::atomic<bool> cancelled_{false};
};

struct SchedulerOptions {
  std::size_t max_queue = 64;        // waiting requests (beyond the free batch slots) past this are refused (429)
  int max_batch = 8;                 // sequences decoding together
  std::int64_t prefill_chunk = 512;  // prompt tokens a joining sequence runs per step (bounds a step's latency)
  // memory.kv_checkpoint_every: a prompt without parting positions (completions) keeps KV checkpoints at multiples of
  // this many positions before its end, as many as the cache keeps beside the end's (0: at its end only).
  std::int64_t checkpoint_every = 512;
  std::filesystem::path usage_history;  // expert usage counts merged into this file at shutdown ("" = none)
  // Non-null (--record-trace): every step appends its routing, one request id per job in the order jobs joined.
  std::shared_ptr<ab::TraceWriter> trace;
  // End tokens beyond the model's config (harmony's <|call|>, which gpt-oss lists only in generation_config.json).
  std::vector<std::int32_t> end_tokens;
  // --draft / --draft-ngram: prompt-lookup speculation (engine::GenerateOptions::draft_tokens); 0: off.
  std::int64_t draft_tokens = 0;
  std::int64_t draft_ngram = 3;
  // --draft-model: drafts from this model instead of prompt lookup (used on the scheduler thread alone).
  std::shared_ptr<engine::DraftModel> draft_model;
  // Bytes the KV caches may take together (Engine::kv_host_budget(): the RAM beside the expert cache); 0: no limit.
  // A request joins the batch only while its cache, with its prompt, fits beside what the running ones have reached
  // and the kept ones took (the model's and a draft model's, given up first, least recently used first); else it
  // waits in the queue. Where the running caches would outgrow it as they fill, the newest sequences are paused,
  // their caches given up, and run their tokens again when there is room (vLLM's recompute preemption: the same
  // answer). The oldest always runs on, whatever it needs.
  std::uint64_t kv_budget = 0;
};

struct SchedulerStats {
  std::size_t queue_depth = 0;
  std::size_t active = 0;
  // Every started request ends once: started = finished + cancelled + failed + active. A request whose client left
  // while it waited in the queue never starts: queue_abandoned counts those.
  std::uint64_t started = 0, finished = 0, cancelled = 0, failed = 0, queue_abandoned = 0;
  std::uint64_t prompt_tokens = 0, generated_tokens = 0, steps = 0, batched_tokens = 0, batched_sequences = 0;
  std::uint64_t cached_prompt_tokens = 0;  // prompt tokens whose KV came from an earlier request (not run)
  std::uint64_t draft_tokens = 0, draft_tokens_accepted = 0;  // --draft: drafts run, and those the answers kept
  std::uint64_t draft_model_bytes_read = 0;                   // --draft-model: what it read of its experts
  double busy_seconds = 0;                                    // time spent in forward passes
  double recent_tokens_per_second = 0;                        // generated tokens over the last 10 s
  // SchedulerOptions::kv_budget, and what the caches count for against it: the running ones' the most they may reach,
  // the kept ones' what they took. kv_waits: requests that waited in the queue for room in it.
  std::uint64_t kv_budget_bytes = 0, kv_bytes = 0, kv_waits = 0;
  // Sequences paused for the budget (their caches given up; each runs its tokens again when there is room), and how
  // many are paused now.
  std::uint64_t preempted = 0;
  std::size_t paused = 0;
  // Tokens the resumed ones ran again, and those they took from a kept cache sharing their history instead.
  std::uint64_t replayed_tokens = 0, replay_cached_tokens = 0;
  engine::ExpertStats experts;
  std::uint64_t expert_resident_bytes = 0, expert_budget_bytes = 0;
  std::size_t expert_resident_count = 0;
};

class Scheduler {
 public:
  Scheduler(engine::Engine& engine, const tokenizer::Tokenizer& tokenizer, SchedulerOptions options);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  enum class Submit { accepted, queue_full, closed };
  Submit submit(std::shared_ptr<Job> job);
  // All of `jobs` (a request's n choices) or none: queue_full unless the free batch slots and the queue have room
  // for every one. Queued jobs already cancelled (their client left) give up their places first.
  Submit submit(std::span<const std::shared_ptr<Job>> jobs);

  // Runs `task` on the scheduler thread between steps (engine access from outside goes through here). Returns false
  // when the scheduler is closed.
  bool post(std::function<void(engine::Engine&)> task);
  // Publishes the expert cache's statistics to stats() now; only on the scheduler thread (in a posted task), so a
  // task that changes the cache can answer with stats() already showing the change.
  void publish_expert_stats();

  // Stops accepting jobs; lets active and queued ones finish for up to `grace`, then cancels the rest (they end
  // with finish_reason "cancelled"), saves the usage history and joins the thread. Idempotent.
  void shutdown(std::chrono::milliseconds grace);
  // Ends a shutdown's grace now (a second SIGINT/SIGTERM): what still runs is cancelled at the next token.
  void end_grace();

  [[nodiscard]] SchedulerStats stats() const;
  [[nodiscard]] std::int64_t context() const { return context_; }
  // Whether the KV caches keep checkpoints (GenerationRequest::checkpoints): sliding-window or recurrent layers.
  [[nodiscard]] bool keeps_checkpoints() const { return keeps_checkpoints_; }
  [[nodiscard]] std::int64_t vocab_size() const { return vocab_; }
  [[nodiscard]] const SchedulerOptions& options() const { return options_; }

  struct Sequence;

 private:
  void loop();
  void step(std::vector<std::unique_ptr<Sequence>>& active);
  // Samples seq's next token from row `row` of its last logits and sends its text; false when that ends it.
  bool sample_next(Sequence& seq, std::size_t row, std::uint64_t& generated_now);
  void release_state(Sequence& seq);
  // Where seq's prompt run keeps KV checkpoints (Sequence::checkpoints), and those kept already made most recent.
  void plan_checkpoints(Sequence& seq);
  // prompt_logprobs: the logprobs of the prompt tokens the prefill chunk of `rows` tokens just predicted.
  void emit_prompt_logprobs(Sequence& seq, std::size_t rows);
  void finish(Sequence& seq, const std::string& reason);
  void fail(Sequence& seq, const ApiError& error);
  void count_routing(const std::vector<engine::RoutingRecord>& trace);
  void record_trace(const std::vector<engine::RoutingRecord>& trace,
                    const std::vector<engine::Engine::BatchItem>& items, const std::vector<Sequence*>& members,
                    const std::vector<std::int64_t>& first_positions);
  void refresh_expert_stats();  // under mu_ (or before the thread starts)
  void refresh_stats(double forward_seconds, std::uint64_t tokens_generated, std::uint64_t tokens_run,
                     std::uint64_t prompt_tokens, std::uint64_t sequences_run);
  void save_usage_history();

  engine::Engine& engine_;
  const tokenizer::Tokenizer& tokenizer_;
  SchedulerOptions options_;
  std::int64_t context_ = 0, vocab_ = 0;
  bool keeps_checkpoints_ = false;
  std::int64_t draft_tokens_ = 0;  // engine::draft_limit of options_.draft_tokens
  // This step's drafts run and kept, not yet in stats_ (publish_drafts, under mu_).
  std::uint64_t unpublished_drafted_ = 0, unpublished_accepted_ = 0;
  void publish_drafts() {
    stats_.draft_tokens += std::exchange(unpublished_drafted_, 0);
    stats_.draft_tokens_accepted += std::exchange(unpublished_accepted_, 0);
  }
  std::vector<std::int64_t> eos_;
  std::unique_ptr<engine::JsonTokenMask> json_tokens_;  // JSON mode, built at first use

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  std::deque<std::function<void(engine::Engine&)>> tasks_;
  bool closed_ = false, stopping_ = false, cancel_all_ = false, grace_ended_ = false;
  SchedulerStats stats_;
  // Active sequences that ended this step: their clients have their answers, their slots free at the step's end.
  std::size_t ended_in_step_ = 0;
  std::deque<std::pair<std::chrono::steady_clock::time_point, std::uint64_t>> recent_;
  std::int64_t next_request_id_ = 0;              // trace request ids, in join order
  std::map<std::uint64_t, std::uint64_t> usage_;  // (layer << 32 | expert) -> router picks
  // KV caches kept for reuse, each with the tokens it holds: a new request takes the one sharing the longest
  // prefix with its prompt and runs only the rest (KV entries depend only on the tokens before them, so the
  // result is the same bits as running the whole prompt).
  struct FreeState {
    std::unique_ptr<engine::Engine::Sequence> state;
    std::vector<std::int32_t> tokens;
  };
  std::vector<FreeState> free_states_;  // least recently used first
  std::size_t states_made_ = 0;         // KV caches made, in use or kept: at most --max-batch are kept
  // Kept KV entries are reused only while both runs stay within this length (RopeFrequencies::same_kv_up_to).
  std::int64_t same_kv_up_to_ = std::numeric_limits<std::int64_t>::max();
  // KV budget (SchedulerOptions::kv_budget). The drafts a request's passes may run; the bytes a cache holding `tokens`
  // takes with a pending token and those drafts; what a job's cache takes to start, and a paused sequence's to resume;
  // what the running and kept caches count for now.
  [[nodiscard]] std::int64_t drafts_of(const GenerationRequest& r) const;
  [[nodiscard]] std::uint64_t kv_bytes_for(std::int64_t tokens, std::int64_t drafts) const;
  [[nodiscard]] std::uint64_t kv_need(const Job& job) const;
  [[nodiscard]] std::uint64_t kv_resume_need(const Sequence& seq) const;
  // With `this_step`: what they count for after this step's pass (its tokens written).
  [[nodiscard]] std::uint64_t kv_counted(const std::vector<std::unique_ptr<Sequence>>& active,
                                         bool this_step = false) const;
  // Gives up one kept cache (the model's, least recently used first, the one sharing the most of `tokens` last; else
  // a draft model's); false when none is kept.
  bool give_up_kept(std::span<const std::int32_t> tokens);
  // Whether a cache needing `need` to start (of `tokens`) may join `active` now, giving up kept caches where that
  // makes room; under mu_. The first time a queued `request` must wait it is counted and logged (null: a paused
  // sequence's resumption, counted when it was paused).
  bool kv_admits(std::uint64_t need, std::span<const std::int32_t> tokens,
                 const std::vector<std::unique_ptr<Sequence>>& active, const GenerationRequest* request);
  // Before a pass: where the running caches would outgrow the budget with this step's tokens, kept caches are given
  // up, then the newest sequences paused (pause()) until they fit; the oldest always runs on.
  void make_kv_room(std::vector<std::unique_ptr<Sequence>>& active);
  // Gives up seq's KV cache (and its draft model state); it waits to run its history again (Sequence::replay).
  void pause(Sequence& seq);
  const GenerationRequest* kv_waiting_ = nullptr;  // the request kv_admits last held back
  // Gives `seq` a KV cache: a free one holding the longest prefix of its prompt, or of its history where it resumes
  // after a pause (when that is at least half of those tokens or of what it holds), a new one, or the least recently
  // used; with `sibling` (a choice of the same request whose prompt has run) the prompt's rows are copied from it.
  void take_state(Sequence& seq, const Sequence* sibling);
  std::thread thread_;
  std::mutex shutdown_mu_;
};

}  // namespace colibri::server
