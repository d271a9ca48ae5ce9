#include "colibri/server/scheduler.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <limits>
#include <optional>

#include "colibri/engine/generate.hpp"
#include "colibri/engine/rope.hpp"
#include "colibri/engine/usage_history.hpp"
#include "colibri/sdk/config.hpp"

namespace colibri::server {

using clock_type = std::chrono::steady_clock;

struct Scheduler::Sequence {
  Sequence(std::shared_ptr<Job> j, const tokenizer::Tokenizer& tok, std::int64_t draft_tokens, std::int64_t draft_ngram)
      : job(std::move(j)),
        history(job->request.prompt),
        sampler(job->request.sampling),
        decoder(tok, /*skip_special=*/!job->request.keep_special,
                job->request.continues_prompt ? std::span<const std::int32_t>(job->request.prompt)
                                              : std::span<const std::int32_t>{}),
        stops(job->request.stop),
        spec(draft_tokens, draft_ngram, job->request.draft_min) {
    if (job->request.json_object) json.emplace(job->request.json_schema.get(), job->request.json_thinking);
  }
  std::shared_ptr<Job> job;
  std::vector<std::int32_t> history;  // prompt + generated
  engine::Sampler sampler;
  tokenizer::StreamDecoder decoder;
  engine::StopMatcher stops;
  std::vector<float> logits;         // next-token distribution after the last forward
  std::vector<float> prompt_logits;  // prompt_logprobs: every row of the last prefill chunk
  std::int64_t generated = 0;
  bool prefilled = false;
  bool done = false;
  std::int32_t pending = -1;                        // sampled token still to run through the model
  std::unique_ptr<engine::Engine::Sequence> state;  // its KV cache and position
  std::size_t prompt_done = 0;                      // prompt tokens already run (prefill goes in chunks)
  std::int64_t request_id = 0;                      // in the routing trace
  std::int64_t cached = 0;                          // prompt tokens reused from an earlier request's KV cache
  std::optional<engine::JsonAnswer> json;           // JSON mode
  std::vector<std::int32_t> pass;                   // this step's tokens: pending, then its drafts
  std::vector<std::uint8_t> allowed;                // JSON mode: this step's token mask
  std::vector<std::int64_t> checkpoints;            // prompt positions its KV cache keeps a checkpoint at, ascending
  engine::Speculation spec;                         // --draft: the drafts its last pass ran after `pending`
  std::int64_t kv_valid = 0;  // KV positions holding history's tokens (the rest: a pass's drafts not yet kept)
  std::unique_ptr<engine::DraftModel::State> draft_state;  // --draft-model: its KV cache in the draft model
  std::uint64_t kv_need = 0;  // kv_budget: the bytes its cache takes to start (its prompt, or its replay)
  // kv_budget: preempted (its KV cache given up for the others'), it waits to run again; then its history, the pending
  // token last, is run again from position 0 before it samples on (the same bits: KV rows depend only on the tokens).
  bool paused = false;
  std::vector<std::int32_t> replay;
  std::size_t replay_done = 0;
};

Scheduler::Scheduler(engine::Engine& engine, const tokenizer::Tokenizer& tokenizer, SchedulerOptions options)
    : engine_(engine), tokenizer_(tokenizer), options_(std::move(options)) {
  context_ = engine_.context();
  vocab_ = engine_.vocab_size();
  keeps_checkpoints_ = engine_.kv_cache().keeps_checkpoints();
  draft_tokens_ = engine::draft_limit(engine_.kv_cache(), options_.draft_tokens);
  if (options_.draft_tokens > 0 && engine_.kv_cache().has_recurrent()) {
    spdlog::warn("--draft is off for this model: its recurrent layers' states cannot step back over rejected drafts");
  } else if (options_.draft_tokens > draft_tokens_) {
    spdlog::warn(
        "--draft drafts at most {} tokens here: a pass with drafts is one --batch chunk of the sliding-window "
        "layers' KV rows (raise --batch for more)",
        draft_tokens_);
  }
  eos_ = engine_.hparams().eos_token_ids;
  if (auto rope = engine::RopeFrequencies::create(engine_.hparams())) same_kv_up_to_ = rope->same_kv_up_to();
  if (auto e = tokenizer_.eos_id()) eos_.push_back(*e);
  for (const std::int32_t t : options_.end_tokens) {
    if (std::find(eos_.begin(), eos_.end(), t) == eos_.end()) eos_.push_back(t);
  }
  options_.max_batch = std::max(1, options_.max_batch);
  options_.prefill_chunk = std::max<std::int64_t>(1, options_.prefill_chunk);
  stats_.kv_budget_bytes = options_.kv_budget;
  refresh_expert_stats();  // the cache's budget and residency are known before the first step
  thread_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() {
  shutdown(std::chrono::milliseconds(0));
}

namespace {

// The terminal event of a job that never ran: cancelled while it waited in the queue.
void end_unrun(Job& job) {
  GenerationEvent ev;
  ev.kind = GenerationEvent::Kind::finished;
  ev.finish_reason = "cancelled";
  ev.prompt_tokens = static_cast<std::int64_t>(job.request.prompt.size());
  if (job.on_event) job.on_event(std::move(ev));
}

}  // namespace

Scheduler::Submit Scheduler::submit(std::shared_ptr<Job> job) {
  return submit(std::span<const std::shared_ptr<Job>>(&job, 1));
}

Scheduler::Submit Scheduler::submit(std::span<const std::shared_ptr<Job>> jobs) {
  std::vector<std::shared_ptr<Job>> dropped;
  Submit result = Submit::accepted;
  {
    std::lock_guard lock(mu_);
    if (closed_) return Submit::closed;
    // A client that left while its job waited must not keep others out.
    for (auto it = queue_.begin(); it != queue_.end();) {
      if ((*it)->cancelled()) {
        dropped.push_back(std::move(*it));
        it = queue_.erase(it);
        ++stats_.queue_abandoned;
      } else {
        ++it;
      }
    }
    // Jobs join free batch slots at the next token boundary: only those beyond the free slots wait, so a burst
    // that arrives during a step is not refused while slots are free.
    // A sequence that has ended counts as free: its client, answered, may ask again before the step is over.
    const std::size_t busy = stats_.active - std::min(stats_.active, ended_in_step_);
    const std::size_t free_slots = busy < static_cast<std::size_t>(options_.max_batch) ? options_.max_batch - busy : 0;
    const std::size_t wanted = queue_.size() + jobs.size();  // compared without a sum that could wrap
    if (wanted > free_slots && wanted - free_slots > options_.max_queue) {
      result = Submit::queue_full;
    } else {
      queue_.insert(queue_.end(), jobs.begin(), jobs.end());
      cv_.notify_one();
    }
    stats_.queue_depth = queue_.size();
  }
  for (auto& job : dropped) end_unrun(*job);  // every job gets its one terminal event, outside the lock
  return result;
}

bool Scheduler::post(std::function<void(engine::Engine&)> task) {
  std::lock_guard lock(mu_);
  if (stopping_) return false;
  tasks_.push_back(std::move(task));
  cv_.notify_one();
  return true;
}

void Scheduler::shutdown(std::chrono::milliseconds grace) {
  std::lock_guard guard(shutdown_mu_);
  if (!thread_.joinable()) return;
  {
    std::unique_lock lock(mu_);
    closed_ = true;
    cv_.notify_all();
    const auto deadline = clock_type::now() + grace;
    cv_.wait_until(lock, deadline,
                   [this] { return grace_ended_ || (queue_.empty() && stats_.active == 0 && stats_.paused == 0); });
    cancel_all_ = true;
    stopping_ = true;
    cv_.notify_all();
  }
  thread_.join();
  save_usage_history();
}

void Scheduler::end_grace() {
  std::lock_guard lock(mu_);
  grace_ended_ = true;
  cv_.notify_all();
}

SchedulerStats Scheduler::stats() const {
  std::lock_guard lock(mu_);
  SchedulerStats s = stats_;
  // Jobs whose client left still sit in the queue until the next submit or admission; they wait for no one.
  s.queue_depth = static_cast<std::size_t>(
      std::count_if(queue_.begin(), queue_.end(), [](const auto& job) { return !job->cancelled(); }));
  // Rate over the last 10 s of generated tokens (decays to 0 when idle).
  const auto now = clock_type::now();
  std::uint64_t n = 0;
  for (const auto& [t, k] : recent_) {
    if (now - t <= std::chrono::seconds(10)) n += k;
  }
  s.recent_tokens_per_second = static_cast<double>(n) / 10.0;
  return s;
}

void Scheduler::loop() {
  std::vector<std::unique_ptr<Sequence>> active;
  std::deque<std::unique_ptr<Sequence>> paused;  // kv_budget: preempted, oldest first
  for (;;) {
    std::deque<std::function<void(engine::Engine&)>> tasks;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock,
               [&] { return stopping_ || !tasks_.empty() || !queue_.empty() || !active.empty() || !paused.empty(); });
      tasks.swap(tasks_);
      if (cancel_all_) {
        for (auto& seq : active) seq->job->cancel();
        for (auto& seq : paused) seq->job->cancel();
        for (auto& job : queue_) job->cancel();
      }
      // Join at a token boundary: sequences paused for KV room first (oldest first), then the queue's.
      while (!paused.empty() && static_cast<int>(active.size()) < options_.max_batch) {
        Sequence& seq = *paused.front();
        if (!seq.job->cancelled()) {
          const std::uint64_t need = kv_resume_need(seq);
          if (!kv_admits(need, seq.history, active, nullptr)) break;  // counted when it was paused
          seq.kv_need = need;
        }
        seq.paused = false;
        if (seq.prefilled) {
          seq.replay = seq.history;  // the pending token last: its logits are the next token's distribution
          seq.replay_done = 0;
        }
        active.push_back(std::move(paused.front()));
        paused.pop_front();
      }
      while (paused.empty() && !queue_.empty() && static_cast<int>(active.size()) < options_.max_batch) {
        const std::uint64_t need = options_.kv_budget > 0 ? kv_need(*queue_.front()) : 0;
        if (!queue_.front()->cancelled() &&
            !kv_admits(need, queue_.front()->request.prompt, active, &queue_.front()->request)) {
          break;
        }
        // speculative.n_max: this request's drafts per step instead of --draft's, within what the KV cache allows.
        const auto& asked = queue_.front()->request.draft_max;
        const std::int64_t drafts = asked ? engine::draft_limit(engine_.kv_cache(), *asked) : draft_tokens_;
        active.push_back(
            std::make_unique<Sequence>(std::move(queue_.front()), tokenizer_, drafts, options_.draft_ngram));
        active.back()->request_id = next_request_id_++;
        active.back()->kv_need = need;
        queue_.pop_front();
        ++stats_.started;
      }
      if (options_.kv_budget > 0) stats_.kv_bytes = kv_counted(active);
      stats_.queue_depth = queue_.size();
      stats_.active = active.size();
      stats_.paused = paused.size();
      if (stopping_ && active.empty() && paused.empty() && queue_.empty() && tasks.empty()) break;
    }
    for (auto& task : tasks) task(engine_);
    if (!active.empty()) step(active);
    for (auto& seq : active) {
      if (seq->done) release_state(*seq);
    }
    std::erase_if(active, [](const auto& s) { return s->done; });
    for (auto& seq : active) {
      if (!seq->paused) continue;
      const auto at =
          std::find_if(paused.begin(), paused.end(), [&](const auto& p) { return p->request_id > seq->request_id; });
      paused.insert(at, std::move(seq));
    }
    std::erase_if(active, [](const auto& s) { return s == nullptr; });
    {
      std::lock_guard lock(mu_);
      stats_.active = active.size();
      stats_.paused = paused.size();
      if (options_.kv_budget > 0) stats_.kv_bytes = kv_counted(active);
      ended_in_step_ = 0;
    }
    cv_.notify_all();  // shutdown() waits for the queue to drain
  }
  // Jobs still queued when stopping (shutdown with no grace) end as cancelled.
  std::deque<std::shared_ptr<Job>> left;
  {
    std::lock_guard lock(mu_);
    left.swap(queue_);
    stats_.queue_depth = 0;
  }
  for (auto& job : left) end_unrun(*job);
}

void Scheduler::finish(Sequence& seq, const std::string& reason) {
  if (reason != "stop" && reason != "cancelled") {
    // Mirror engine::generate: whatever the decoder and the stop matcher held back is final now.
    std::string tail = seq.stops.push(seq.decoder.flush());
    std::string last;
    std::string r = reason;
    if (seq.stops.stopped()) {
      r = "stop";
    } else {
      last = seq.stops.flush();
    }
    tail += last;
    if (!tail.empty() && seq.job->on_event) {
      GenerationEvent ev;
      ev.text = std::move(tail);
      seq.job->on_event(std::move(ev));
    }
    seq.done = true;
    GenerationEvent ev;
    ev.kind = GenerationEvent::Kind::finished;
    ev.finish_reason = r;
    ev.prompt_tokens = static_cast<std::int64_t>(seq.job->request.prompt.size());
    ev.cached_tokens = seq.cached;
    ev.completion_tokens = seq.generated;
    {
      std::lock_guard lock(mu_);
      ++stats_.finished;
      ++ended_in_step_;  // its slot is free for the queue check at once (its client may ask again this step)
      publish_drafts();  // the drafts its answer kept are in the metrics when its client has the answer
    }
    if (seq.job->on_event) seq.job->on_event(std::move(ev));
    return;
  }
  seq.done = true;
  GenerationEvent ev;
  ev.kind = GenerationEvent::Kind::finished;
  ev.finish_reason = reason;
  ev.prompt_tokens = static_cast<std::int64_t>(seq.job->request.prompt.size());
  ev.cached_tokens = seq.cached;
  ev.completion_tokens = seq.generated;
  {
    std::lock_guard lock(mu_);
    ++(reason == "cancelled" ? stats_.cancelled : stats_.finished);
    ++ended_in_step_;
  }
  if (seq.job->on_event) seq.job->on_event(std::move(ev));
}

void Scheduler::fail(Sequence& seq, const ApiError& error) {
  seq.done = true;
  GenerationEvent ev;
  ev.kind = GenerationEvent::Kind::failed;
  ev.error = error;
  ev.prompt_tokens = static_cast<std::int64_t>(seq.job->request.prompt.size());
  ev.cached_tokens = seq.cached;
  ev.completion_tokens = seq.generated;
  {
    std::lock_guard lock(mu_);
    ++stats_.failed;
    ++ended_in_step_;
  }
  if (seq.job->on_event) seq.job->on_event(std::move(ev));
}

void Scheduler::step(std::vector<std::unique_ptr<Sequence>>& active) {
  // 1. Every prefilled sequence samples its next token, and the ones after it while they are the drafts its last pass
  // ran (--draft); finished ones leave at this boundary.
  std::uint64_t generated_now = 0;
  std::vector<engine::DraftModel::Request> asks;  // --draft-model: the drafts each sequence's next pass may run
  std::vector<Sequence*> asking;
  for (auto& sp : active) {
    Sequence& seq = *sp;
    if (seq.job->cancelled()) {
      finish(seq, "cancelled");
      continue;
    }
    if (!seq.prefilled || !seq.replay.empty()) continue;  // its prompt or its replay still runs
    if (seq.job->request.max_tokens <= 0) {  // echo with max_tokens 0: the prompt's logprobs were the answer
      finish(seq, "length");
      continue;
    }
    const std::int64_t drafted = seq.spec.drafted();
    for (std::size_t row = 0;; ++row) {
      if (!sample_next(seq, row, generated_now)) break;
      if (seq.spec.matches(row, seq.history.back())) {
        ++seq.kv_valid;  // the draft that ran there: its KV row is the answer's
        ++unpublished_accepted_;
        continue;
      }
      // The drafts past the one that differed go, then the next pass runs this token and new drafts.
      if (seq.state->n_past > seq.kv_valid) {
        seq.state->n_past = seq.state->kv.rewind(seq.kv_valid);
        if (seq.state->n_past != seq.kv_valid) {
          fail(seq, internal_error("The KV cache could not drop rejected draft tokens; run the server without "
                                   "--draft"));
          break;
        }
      }
      seq.pending = seq.history.back();
      const std::int64_t room = std::min({seq.job->request.max_tokens - seq.generated, context_ - seq.kv_valid,
                                          same_kv_up_to_ - seq.kv_valid}) -
                                1;
      if (!options_.draft_model) {
        seq.spec.plan(seq.history, row, room);
      } else if (const auto n = seq.spec.next_length(row, room); n > 0) {
        if (!seq.draft_state) {
          auto state = options_.draft_model->acquire(seq.history);
          if (!state) {
            spdlog::warn("the draft model has no KV cache for a request ({}); it runs without drafts",
                         state.error().message());
            seq.spec.run({});
            break;
          }
          seq.draft_state = std::move(*state);
        }
        auto& ask = asks.emplace_back();
        ask.state = seq.draft_state.get();
        ask.history = seq.history;
        ask.count = n;
        ask.end_tokens = eos_;
        ask.p_min = seq.job->request.draft_p_min.value_or(-1);
        asking.push_back(&seq);
      } else {
        seq.spec.run({});
      }
      break;
    }
    unpublished_drafted_ += static_cast<std::uint64_t>(seq.spec.drafted() - drafted);
  }
  if (!asks.empty()) {
    // One draft model pass per draft position for all of them. Drafts only speed answers up: without them
    // (the draft model failed) each runs its token alone.
    if (auto s = options_.draft_model->propose(asks); !s)
      spdlog::warn("{}; this step runs without drafts", s.message());
    for (std::size_t i = 0; i < asks.size(); ++i) {
      unpublished_drafted_ += asking[i]->spec.run(std::move(asks[i].drafts), /*costly=*/true).size();
    }
  }
  if (unpublished_drafted_ + unpublished_accepted_ > 0) {
    std::lock_guard lock(mu_);
    publish_drafts();
  }

  // 2. One forward pass over the whole batch: joining sequences run (a chunk of) their prompt, the others their
  // sampled token; each routed expert is read once for all of them.
  std::uint64_t tokens_run = 0, prompt_run = 0;
  const auto t0 = clock_type::now();
  std::vector<engine::RoutingRecord> trace;
  std::vector<engine::Engine::BatchItem> items;
  std::vector<Sequence*> members;
  std::vector<std::int64_t> first_positions;  // each item's n_past before the pass (for the trace)
  make_kv_room(active);
  for (auto& sp : active) {
    Sequence& seq = *sp;
    if (seq.done || seq.paused) continue;
    if (!seq.state) {
      // A choice whose sibling is running the shared prompt waits for its rows instead of running them too.
      const Sequence* sibling = nullptr;
      if (seq.replay.empty() && seq.job->request.prompt_group != 0 && !seq.job->request.prompt_logprobs) {
        for (const auto& other : active) {
          if (other.get() != &seq && other->state && !other->done &&
              other->job->request.prompt_group == seq.job->request.prompt_group) {
            sibling = other.get();
          }
        }
      }
      if (sibling != nullptr && !sibling->prefilled) continue;
      take_state(seq, sibling);
      if (!seq.state) continue;
    }
    engine::Engine::BatchItem item;
    item.sequence = seq.state.get();
    if (!seq.replay.empty()) {
      // Resumed after a pause: its history again, in prompt-sized chunks; the last row's logits are the next token's.
      const std::size_t n =
          std::min<std::size_t>(seq.replay.size() - seq.replay_done, static_cast<std::size_t>(options_.prefill_chunk));
      item.tokens = std::span<const std::int32_t>(seq.replay.data() + seq.replay_done, n);
      item.pass_end = static_cast<std::int64_t>(seq.replay.size());  // within same_kv_up_to_ (make_kv_room)
      if (seq.replay_done + n == seq.replay.size()) item.logits = &seq.logits;
    } else if (!seq.prefilled) {
      const auto& prompt = seq.job->request.prompt;
      std::size_t chunk = static_cast<std::size_t>(options_.prefill_chunk);
      if (seq.job->request.prompt_logprobs) {  // every row's logits are held: at most 64 MiB of them per step
        chunk =
            std::min(chunk, std::max<std::size_t>(1, (std::size_t{64} << 20) / (static_cast<std::size_t>(vocab_) * 4)));
      }
      std::size_t n = std::min<std::size_t>(prompt.size() - seq.prompt_done, chunk);
      // The chunk ends at the next checkpoint, which the KV cache keeps after this pass.
      const auto next =
          std::upper_bound(seq.checkpoints.begin(), seq.checkpoints.end(), static_cast<std::int64_t>(seq.prompt_done));
      if (next != seq.checkpoints.end()) n = std::min(n, static_cast<std::size_t>(*next) - seq.prompt_done);
      item.tokens = std::span<const std::int32_t>(prompt.data() + seq.prompt_done, n);
      item.pass_end = static_cast<std::int64_t>(prompt.size());  // as one pass over the prompt (dynamic rope)
      if (seq.job->request.prompt_logprobs) {
        item.logits = &seq.prompt_logits;
        item.all_logits = true;
      } else if (seq.prompt_done + n == prompt.size()) {
        item.logits = &seq.logits;
      }
      prompt_run += n;
    } else {
      seq.pass.assign(1, seq.pending);
      seq.pass.insert(seq.pass.end(), seq.spec.fed().begin(), seq.spec.fed().end());
      item.tokens = seq.pass;
      item.logits = &seq.logits;
      item.all_logits = seq.pass.size() > 1;  // a row for each draft too
    }
    tokens_run += item.tokens.size();
    items.push_back(item);
    members.push_back(&seq);
    first_positions.push_back(seq.state->n_past);
  }
  if (!items.empty()) {
    auto failed = [&](std::size_t i, const sdk::Status& s) {
      spdlog::error("generation failed: {}", s.message());
      const std::string message = without_model_dir(s.message(), engine_.model_dir());
      fail(*members[i],
           s.retryable() ? unavailable_for_now("The server is short of a resource for now: " + message + "; try again")
                         : internal_error("The model failed to run: " + message +
                                          " (the server log has the whole message)"));  // marks it done
      tokens_run -= items[i].tokens.size();
      if (!members[i]->prefilled) prompt_run -= items[i].tokens.size();
    };
    if (auto s = engine_.forward_batch(items, &trace); !s) {
      trace.clear();  // the layers before the error: no token finished them
      if (items.size() == 1) {
        failed(0, s);
      } else {
        // One request's tokens can fail the pass for all (activations that overflow): each runs alone once, so only
        // what fails alone fails. The others get the bits they would have got in the batch (batch invariance).
        spdlog::warn("a batch of {} sequences failed ({}); running each alone", items.size(), s.message());
        for (std::size_t i = 0; i < items.size(); ++i) {
          std::vector<engine::RoutingRecord> alone;
          if (auto si = engine_.forward_batch(std::span(&items[i], 1), &alone); !si) {
            failed(i, si);
            continue;
          }
          if (options_.trace) record_trace(alone, {items[i]}, {members[i]}, {first_positions[i]});
          trace.insert(trace.end(), alone.begin(), alone.end());
        }
      }
    } else if (options_.trace) {
      record_trace(trace, items, members, first_positions);
    }
    for (std::size_t i = 0; i < members.size(); ++i) {
      Sequence& seq = *members[i];
      if (seq.done) continue;
      if (!seq.replay.empty()) {
        seq.replay_done += items[i].tokens.size();
        {
          std::lock_guard lock(mu_);
          stats_.replayed_tokens += items[i].tokens.size();
        }
        seq.kv_valid = seq.state->n_past;
        if (seq.replay_done == seq.replay.size()) seq.replay.clear();
        continue;
      }
      if (seq.prefilled) {
        seq.kv_valid = first_positions[i] + 1;  // the pending token's; its drafts' wait for the next step
        continue;
      }
      seq.kv_valid = seq.state->n_past;
      if (seq.job->request.prompt_logprobs) emit_prompt_logprobs(seq, items[i].tokens.size());
      seq.prompt_done += items[i].tokens.size();
      if (std::binary_search(seq.checkpoints.begin(), seq.checkpoints.end(),
                             static_cast<std::int64_t>(seq.prompt_done))) {
        if (auto kept = seq.state->kv.checkpoint(seq.state->n_past); !kept) {
          spdlog::warn("keeping a KV cache checkpoint: {}", kept.message());
        }
      }
      if (seq.prompt_done == seq.job->request.prompt.size()) seq.prefilled = true;
    }
  }
  const double seconds = std::chrono::duration<double>(clock_type::now() - t0).count();
  count_routing(trace);
  refresh_stats(seconds, generated_now, tokens_run, prompt_run, items.size());
}

bool Scheduler::sample_next(Sequence& seq, std::size_t row, std::uint64_t& generated_now) {
  if (seq.json) {  // its mask never allows an end token
    if (!json_tokens_) json_tokens_ = std::make_unique<engine::JsonTokenMask>(tokenizer_, vocab_, eos_);
    seq.json->allowed(*json_tokens_, seq.allowed);
    if (std::find(seq.allowed.begin(), seq.allowed.end(), 1) == seq.allowed.end()) {
      finish(seq, "length");  // no token continues the JSON (nesting or whitespace limit): end it, do not break it
      return false;
    }
  } else if (seq.job->request.ignore_eos || seq.generated < seq.job->request.min_tokens) {
    seq.allowed.assign(static_cast<std::size_t>(vocab_), 1);
    for (const auto e : eos_) {
      if (e >= 0 && e < vocab_) seq.allowed[static_cast<std::size_t>(e)] = 0;
    }
    if (seq.generated < seq.job->request.min_tokens) {  // as vLLM: min_tokens holds back the stop tokens too
      for (const auto e : seq.job->request.stop_token_ids) {
        if (e >= 0 && e < vocab_) seq.allowed[static_cast<std::size_t>(e)] = 0;
      }
    }
  } else {
    seq.allowed.clear();
  }
  const auto vocab = static_cast<std::size_t>(vocab_);
  const auto logits = std::span<const float>(seq.logits).subspan(row * vocab, vocab);
  const std::int32_t next = seq.sampler.sample(logits, seq.history, seq.allowed, seq.job->request.prompt.size());
  const auto& ids = seq.job->request.stop_token_ids;
  if (std::find(eos_.begin(), eos_.end(), next) != eos_.end() || std::find(ids.begin(), ids.end(), next) != ids.end()) {
    if (seq.spec.matches(row, next)) ++unpublished_accepted_;  // a draft of the end, right (as engine::generate)
    finish(seq, "eos");  // a stop token id: finish_reason "stop", as vLLM; what the decoder held back goes out
    return false;
  }
  ++seq.generated;
  ++generated_now;
  seq.history.push_back(next);
  // Before min_tokens no stop string ends the answer either, as vLLM: the text goes out unmatched.
  std::string text =
      seq.generated < seq.job->request.min_tokens ? seq.decoder.push(next) : seq.stops.push(seq.decoder.push(next));
  const int top = seq.job->request.logprobs;
  if ((!text.empty() || top >= 0) && seq.job->on_event) {
    GenerationEvent ev;
    ev.text = std::move(text);
    if (top >= 0) ev.logprobs.push_back(engine::token_logprob(logits, next, static_cast<std::size_t>(top)));
    seq.job->on_event(std::move(ev));
  }
  if (seq.json) seq.json->push(*json_tokens_, next);
  if (seq.stops.stopped()) {
    finish(seq, "stop");
  } else if (seq.json && seq.json->complete()) {
    finish(seq, "eos");  // the object is the whole answer: what a stop matcher held back is released
  } else if (seq.generated >= seq.job->request.max_tokens) {
    finish(seq, "length");
  } else if (static_cast<std::int64_t>(seq.history.size()) >= context_) {  // prompt + answer fill the context
    finish(seq, "context");
  } else {
    return true;
  }
  return false;
}

void Scheduler::emit_prompt_logprobs(Sequence& seq, std::size_t rows) {
  // Row r of the chunk predicts prompt token prompt_done + r + 1; the last prompt row is the first sampled token's
  // distribution.
  const auto& prompt = seq.job->request.prompt;
  const auto V = static_cast<std::size_t>(vocab_);
  const auto top = static_cast<std::size_t>(std::max(0, seq.job->request.logprobs));
  GenerationEvent ev;
  if (seq.prompt_done == 0) ev.prompt_logprobs.push_back({prompt[0], std::numeric_limits<float>::quiet_NaN(), {}});
  for (std::size_t r = 0; r < rows; ++r) {
    const std::span<const float> row(seq.prompt_logits.data() + r * V, V);
    const std::size_t next = seq.prompt_done + r + 1;
    if (next < prompt.size()) {
      ev.prompt_logprobs.push_back(engine::token_logprob(row, prompt[next], top));
    } else {
      seq.logits.assign(row.begin(), row.end());
    }
  }
  if (seq.job->on_event) seq.job->on_event(std::move(ev));
}

void Scheduler::take_state(Sequence& seq, const Sequence* sibling) {
  // A sequence resumed after a pause runs its history again (Sequence::replay), from what a kept cache shares of it.
  const bool replaying = !seq.replay.empty();
  const std::span<const std::int32_t> prompt =
      replaying ? std::span<const std::int32_t>(seq.replay) : std::span<const std::int32_t>(seq.job->request.prompt);
  auto common_with = [&](const FreeState& f) {
    return static_cast<std::size_t>(
        std::mismatch(f.tokens.begin(), f.tokens.end(), prompt.begin(), prompt.end()).first - f.tokens.begin());
  };
  std::size_t best = free_states_.size(), best_common = 0;
  for (std::size_t i = 0; i < free_states_.size(); ++i) {
    const auto common = common_with(free_states_[i]);
    if (best == free_states_.size() || common > best_common) {
      best = i;
      best_common = common;
    }
  }
  // A kept cache is taken when the shared prefix is at least half of the prompt or of what the cache holds (as
  // llama-server's slot similarity). Otherwise taking it would throw away a prefix another request may come back
  // to (a system prompt between two unrelated calls): a new cache is made while there are fewer than --max-batch,
  // else the least recently used one (the front) is given up.
  if (best < free_states_.size() && best_common * 2 < prompt.size() &&
      best_common * 2 < free_states_[best].tokens.size()) {
    if (states_made_ < static_cast<std::size_t>(options_.max_batch)) {
      best = free_states_.size();
      best_common = 0;
    } else {
      best = 0;
      best_common = common_with(free_states_[0]);
    }
  }
  // Positions of a kept cache holding `held_length` tokens that this prompt may reuse. The last prompt token always
  // runs: its logits are the first token's distribution. With "dynamic" rope the kept entries are only the cold run's
  // bits while neither run's passes went past the original context.
  auto reusable = [&](std::size_t held_length) -> std::int64_t {
    if (seq.job->request.prompt_logprobs) return 0;  // every prompt row's logits are wanted
    if (static_cast<std::int64_t>(std::max(held_length, prompt.size())) > same_kv_up_to_) return 0;
    return static_cast<std::int64_t>(std::min(best_common, prompt.size() - 1));
  };
  auto start_at = [&](std::int64_t reuse) {
    seq.state->n_past = reuse;
    seq.kv_valid = reuse;
    if (replaying) {
      seq.replay_done = static_cast<std::size_t>(reuse);
      {
        std::lock_guard lock(mu_);
        stats_.replay_cached_tokens += static_cast<std::uint64_t>(reuse);
      }
      if (reuse > 0) {
        spdlog::info("a paused sequence resumes: {} of its {} tokens from a kept KV cache, {} to run again", reuse,
                     prompt.size(), static_cast<std::int64_t>(prompt.size()) - reuse);
      } else {
        spdlog::info("a paused sequence resumes: its {} tokens run again from position 0", prompt.size());
      }
      return;
    }
    seq.prompt_done = static_cast<std::size_t>(reuse);
    seq.cached = reuse;
    plan_checkpoints(seq);
    std::lock_guard lock(mu_);
    stats_.cached_prompt_tokens += static_cast<std::uint64_t>(reuse);
  };
  // A kept cache that holds much more than this prompt shares (a long conversation; this a short call with its system
  // prompt) is copied from, not cut, while a new cache may still be made: the conversation's next turn finds it
  // whole (a device cache's rows come through host memory). Where the rows cannot be copied (sliding rows gone, no
  // recurrent state kept there) the new cache is kept empty and the old one is cut, as before.
  if (best < free_states_.size() && best_common * 2 < free_states_[best].tokens.size() &&
      states_made_ < static_cast<std::size_t>(options_.max_batch) && sibling == nullptr) {
    // A recurrent cache copies a state it keeps: where it is, or a checkpoint.
    const auto& held = free_states_[best].state->kv;
    if (const auto copied = held.has_recurrent() ? held.reusable(reusable(free_states_[best].tokens.size()))
                                                 : reusable(free_states_[best].tokens.size());
        copied > 0) {
      if (auto st = engine_.new_sequence()) {
        ++states_made_;
        if ((*st)->kv.copy_prefix_from(free_states_[best].state->kv, copied)) {
          seq.state = std::move(*st);
          return start_at(copied);
        }
        free_states_.insert(free_states_.begin(), FreeState{std::move(*st), {}});  // least recently used
        ++best;
      }
    }
  }
  if (best == free_states_.size()) {
    if (auto st = engine_.new_sequence()) {
      seq.state = std::move(*st);
      ++states_made_;
    } else if (!free_states_.empty()) {  // no memory for one more: a kept one is given up instead
      spdlog::warn("a new KV cache could not be made ({}); reusing the least recently used one", st.error().message());
      states_made_ = static_cast<std::size_t>(options_.max_batch);
      best = 0;
      best_common = common_with(free_states_[0]);
    } else {
      fail(seq, unavailable("No memory for another sequence's KV cache: " + st.error().message()));
      return;
    }
  }
  std::size_t held_length = 0;
  if (best < free_states_.size()) {
    held_length = free_states_[best].tokens.size();
    seq.state = std::move(free_states_[best].state);
    free_states_.erase(free_states_.begin() + static_cast<std::ptrdiff_t>(best));
  }
  // Sliding-window layers may have dropped rows the reused prefix needs.
  auto reuse = seq.state->kv.rewind(reusable(held_length));
  const auto shared = static_cast<std::int64_t>(prompt.size()) - 1;
  if (sibling != nullptr && reuse < shared && static_cast<std::int64_t>(prompt.size()) <= same_kv_up_to_ &&
      seq.state->kv.copy_prefix_from(sibling->state->kv, shared)) {
    reuse = shared;  // the sibling ran the same prompt: its rows are this choice's
  }
  start_at(reuse);
}

std::int64_t Scheduler::drafts_of(const GenerationRequest& r) const {
  return r.draft_max ? engine::draft_limit(engine_.kv_cache(), *r.draft_max) : draft_tokens_;
}

std::uint64_t Scheduler::kv_bytes_for(std::int64_t tokens, std::int64_t drafts) const {
  // Each term is at most the context once clamped, so the sum cannot wrap.
  const auto clamp = [&](std::int64_t n) { return std::clamp<std::int64_t>(n, 0, context_); };
  return engine_.kv_sequence_bytes(clamp(clamp(tokens) + 1 + clamp(drafts)));
}

std::uint64_t Scheduler::kv_need(const Job& job) const {
  return kv_bytes_for(static_cast<std::int64_t>(job.request.prompt.size()), drafts_of(job.request));
}

std::uint64_t Scheduler::kv_resume_need(const Sequence& seq) const {
  return kv_bytes_for(static_cast<std::int64_t>(seq.history.size()), drafts_of(seq.job->request));
}

std::uint64_t Scheduler::kv_counted(const std::vector<std::unique_ptr<Sequence>>& active, bool this_step) const {
  std::uint64_t n = 0;
  for (const auto& sp : active) {
    const Sequence& seq = *sp;
    if (seq.done || seq.paused) continue;
    // What it took to start, or has reached (a kept cache it took may have reached further), or with this step's
    // tokens reaches after the pass.
    std::int64_t reach = seq.state ? seq.state->kv.reach() : 0;
    if (this_step) {
      std::int64_t tokens = 1 + static_cast<std::int64_t>(seq.spec.fed().size());
      if (!seq.replay.empty()) {
        tokens = static_cast<std::int64_t>(seq.replay.size() - seq.replay_done);
      } else if (!seq.prefilled) {
        tokens = static_cast<std::int64_t>(seq.job->request.prompt.size() - seq.prompt_done);
      }
      reach = std::max(reach, (seq.state ? seq.state->n_past : 0) + std::min(tokens, options_.prefill_chunk));
    }
    n += std::max(seq.kv_need, reach > 0 ? engine_.kv_sequence_bytes(reach) : 0);
  }
  // Kept caches: the model's, and the draft model's (kept apart, in its own pool).
  for (const auto& kept : free_states_) n += engine_.kv_sequence_bytes(kept.state->kv.reach(), /*beside=*/false);
  if (options_.draft_model) n += options_.draft_model->kept_bytes();
  return n;
}

bool Scheduler::give_up_kept(std::span<const std::int32_t> tokens) {
  if (!free_states_.empty()) {
    // The one sharing the most of these tokens (which they would run from) goes last.
    std::size_t best = 0, best_common = 0;
    for (std::size_t i = 0; i < free_states_.size(); ++i) {
      const auto& held = free_states_[i].tokens;
      const auto common = static_cast<std::size_t>(
          std::mismatch(held.begin(), held.end(), tokens.begin(), tokens.end()).first - held.begin());
      if (common >= best_common) {
        best = i;
        best_common = common;
      }
    }
    const std::size_t drop = best == 0 && free_states_.size() > 1 ? 1 : 0;
    free_states_.erase(free_states_.begin() + static_cast<std::ptrdiff_t>(drop));
    --states_made_;
    return true;
  }
  return options_.draft_model && options_.draft_model->drop_kept();
}

bool Scheduler::kv_admits(std::uint64_t need, std::span<const std::int32_t> tokens,
                          const std::vector<std::unique_ptr<Sequence>>& active, const GenerationRequest* request) {
  if (options_.kv_budget == 0) return true;
  std::uint64_t counted = kv_counted(active);
  // Kept caches only save prompt runs: given up, least recently used first, before a request waits for room.
  while (counted + need > options_.kv_budget && give_up_kept(tokens)) counted = kv_counted(active);
  const bool running = std::any_of(active.begin(), active.end(), [](const auto& s) { return !s->done; });
  if (counted + need <= options_.kv_budget || !running) return true;
  if (request != nullptr && kv_waiting_ != request) {
    kv_waiting_ = request;
    ++stats_.kv_waits;
    spdlog::info(
        "a request waits in the queue: its KV cache needs {} to start, and the {} running count for {}, together past "
        "memory.kv_budget {} (it joins as they end)",
        sdk::format_size(need), active.size(), sdk::format_size(counted), sdk::format_size(options_.kv_budget));
  }
  return false;
}

void Scheduler::make_kv_room(std::vector<std::unique_ptr<Sequence>>& active) {
  if (options_.kv_budget == 0) return;
  std::uint64_t counted = kv_counted(active, /*this_step=*/true);
  while (counted > options_.kv_budget && give_up_kept({})) counted = kv_counted(active, true);
  // The newest running sequences are paused, never the oldest (which always runs on). One whose prompt's logprobs
  // went out, or whose rope depends on the pass's length past the original context, is not run again.
  const Sequence* oldest = nullptr;
  for (const auto& seq : active) {
    if (!seq->done && (oldest == nullptr || seq->request_id < oldest->request_id)) oldest = seq.get();
  }
  while (counted > options_.kv_budget) {
    Sequence* victim = nullptr;
    for (const auto& seq : active) {
      if (seq->done || seq->paused || seq.get() == oldest || seq->job->request.prompt_logprobs ||
          static_cast<std::int64_t>(seq->history.size()) > same_kv_up_to_) {
        continue;
      }
      if (victim == nullptr || seq->request_id > victim->request_id) victim = seq.get();
    }
    if (victim == nullptr) break;
    pause(*victim);
    counted = kv_counted(active, true);
  }
}

void Scheduler::pause(Sequence& seq) {
  seq.paused = true;
  if (seq.state) {
    seq.state.reset();  // its rows are given up: it runs its tokens again when it resumes
    --states_made_;
  }
  if (seq.draft_state) options_.draft_model->discard(std::move(seq.draft_state));
  seq.spec.run({});
  seq.kv_valid = 0;
  seq.replay.clear();
  seq.replay_done = 0;
  if (!seq.prefilled) {
    seq.prompt_done = 0;  // its prompt runs again from the start
    seq.cached = 0;
  }
  std::lock_guard lock(mu_);
  ++stats_.preempted;
  spdlog::info(
      "a sequence is paused: the KV caches outgrow memory.kv_budget {}; it runs {} again when there is room "
      "(the same answer)",
      sdk::format_size(options_.kv_budget),
      seq.prefilled ? "its " + std::to_string(seq.history.size()) + " tokens" : std::string("its prompt"));
}

void Scheduler::plan_checkpoints(Sequence& seq) {
  seq.checkpoints.clear();
  auto& kv = seq.state->kv;
  if (!kv.keeps_checkpoints()) return;
  // The prompt's end: a recurrent cache's state before the last token, which always runs (the first token's logits),
  // so that the same prompt, or one sharing all of it but not the reply, reuses all it can.
  const auto size = static_cast<std::int64_t>(seq.job->request.prompt.size());
  const std::int64_t end = kv.has_recurrent() ? size - 1 : size;
  for (const auto at : seq.job->request.checkpoints) {
    if (at > 0 && at < end) seq.checkpoints.push_back(at);
  }
  if (end > 0) seq.checkpoints.push_back(end);
  // Without a chat's structure a later prompt may part from this one anywhere (an edit in a document, another
  // question after the same examples): multiples of checkpoint_every before the end, only the last ones (earlier ones
  // would be pushed out as the later are made), and only past what the cache already held.
  if (seq.job->request.checkpoints.empty() && options_.checkpoint_every > 0) {
    const std::int64_t every = options_.checkpoint_every;
    std::int64_t room = kv.checkpoint_limit() - 1;
    for (std::int64_t at = (end - 1) / every * every; room > 0 && at > seq.state->n_past; at -= every, --room) {
      seq.checkpoints.push_back(at);
    }
  }
  std::sort(seq.checkpoints.begin(), seq.checkpoints.end());
  seq.checkpoints.erase(std::unique(seq.checkpoints.begin(), seq.checkpoints.end()), seq.checkpoints.end());
  // Those this prompt shares with what the cache held are kept already: made the most recently used, so the new ones
  // push out others (a system prompt's outlives an earlier turn's end).
  for (const auto at : seq.checkpoints) {
    if (at > seq.state->n_past) break;
    if (auto kept = kv.checkpoint(at); !kept) spdlog::warn("keeping a KV cache checkpoint: {}", kept.message());
  }
}

void Scheduler::release_state(Sequence& seq) {
  if (seq.draft_state) options_.draft_model->release(std::move(seq.draft_state));
  if (!seq.state) return;
  // The KV holds the first n_past tokens of prompt + generated (the last sampled token may not have run), of which
  // the first kv_valid (drafts past them may not be the answer's).
  const auto n = std::min(
      {static_cast<std::size_t>(seq.state->n_past), static_cast<std::size_t>(seq.kv_valid), seq.history.size()});
  free_states_.push_back(
      {std::move(seq.state),
       std::vector<std::int32_t>(seq.history.begin(), seq.history.begin() + static_cast<std::ptrdiff_t>(n))});
}

void Scheduler::count_routing(const std::vector<engine::RoutingRecord>& trace) {
  for (const auto& r : trace) {
    for (auto e : r.experts) {
      ++usage_[(static_cast<std::uint64_t>(r.layer) << 32) | static_cast<std::uint32_t>(e)];
    }
  }
}

void Scheduler::record_trace(const std::vector<engine::RoutingRecord>& trace,
                             const std::vector<engine::Engine::BatchItem>& items, const std::vector<Sequence*>& members,
                             const std::vector<std::int64_t>& first_positions) {
  // forward_batch gives, for each sparse layer in order, one record per token of the concatenated batch in row
  // order; the row says which sequence (item) the record belongs to. Positions are checked against that mapping.
  std::vector<std::size_t> item_of_row;
  for (std::size_t i = 0; i < items.size(); ++i) item_of_row.insert(item_of_row.end(), items[i].tokens.size(), i);
  const std::size_t rows = item_of_row.size();
  std::vector<ab::TraceRecord> out;
  out.reserve(trace.size());
  for (std::size_t k = 0; k < trace.size(); ++k) {
    const std::size_t row = rows == 0 ? 0 : k % rows;
    const std::size_t i = rows == 0 ? 0 : item_of_row[row];
    const std::int64_t offset = trace[k].position - first_positions[i];
    if (rows == 0 || trace.size() % rows != 0 || offset < 0 ||
        offset >= static_cast<std::int64_t>(items[i].tokens.size())) {
      spdlog::error("routing trace {}: the engine's routing records do not match the batch; recording stops",
                    options_.trace->path().string());
      options_.trace.reset();
      return;
    }
    ab::TraceRecord r;
    r.request = members[i]->request_id;
    r.position = trace[k].position;
    r.token = items[i].tokens[static_cast<std::size_t>(offset)];
    r.layer = trace[k].layer;
    r.step = trace[k].step;
    r.experts = trace[k].experts;
    r.weights = trace[k].weights;
    out.push_back(std::move(r));
  }
  if (auto s = options_.trace->append(out); !s) {
    spdlog::error("{}", s.message());
    options_.trace.reset();
  }
}

void Scheduler::publish_expert_stats() {
  std::lock_guard lock(mu_);
  refresh_expert_stats();
}

void Scheduler::refresh_expert_stats() {
  stats_.experts = engine_.experts().stats();
  stats_.expert_resident_bytes = engine_.experts().resident_bytes();
  stats_.expert_budget_bytes = engine_.experts().budget_bytes();
  stats_.expert_resident_count = engine_.experts().resident_count();
  if (options_.draft_model) stats_.draft_model_bytes_read = options_.draft_model->engine().experts().stats().bytes_read;
}

void Scheduler::refresh_stats(double forward_seconds, std::uint64_t tokens_generated, std::uint64_t tokens_run,
                              std::uint64_t prompt_tokens, std::uint64_t sequences_run) {
  const auto now = clock_type::now();
  std::lock_guard lock(mu_);
  stats_.busy_seconds += forward_seconds;
  stats_.generated_tokens += tokens_generated;
  stats_.prompt_tokens += prompt_tokens;
  stats_.batched_sequences += sequences_run;
  stats_.batched_tokens += tokens_run;
  if (tokens_run > 0) ++stats_.steps;
  refresh_expert_stats();
  if (tokens_generated > 0) recent_.emplace_back(now, tokens_generated);
  while (!recent_.empty() && now - recent_.front().first > std::chrono::seconds(10)) recent_.pop_front();
}

void Scheduler::save_usage_history() {
  if (options_.usage_history.empty() || usage_.empty()) return;
  // Merged with what earlier runs counted, as run and bench do; a malformed file is left as it is (it may be the
  // user's edit), never replaced or half-written.
  if (auto s =
          engine::merge_usage_history(options_.usage_history, usage_, engine_.model_dir(), engine_.manifest().identity);
      !s) {
    spdlog::error("the expert usage history was not saved: {}", s.message());
  } else {
    spdlog::info("saved expert usage history ({} experts) to {}", usage_.size(), options_.usage_history.string());
  }
}

}  // namespace colibri::server
