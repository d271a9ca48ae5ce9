// The scheduler on a real engine: a request whose tokens make the model fail (activations that overflow) fails
// alone; the requests batched with it finish with the tokens they get on their own. Requests whose KV caches would
// outgrow SchedulerOptions::kv_budget together wait for the running ones to end, with the same tokens. Tiny Mixtral
// from tests/fixtures/make_tiny_model.py, changed so that one token id overflows layer 0's router and no other does;
// the built cpu/pread/lru plugins.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "colibri/engine/draft_model.hpp"
#include "colibri/engine/engine.hpp"
#include "colibri/model/safetensors.hpp"
#include "colibri/profile/profile.hpp"
#include "colibri/server/scheduler.hpp"
#include "colibri/tokenizer/tokenizer.hpp"
#include "tiny_engine.hpp"

namespace fs = std::filesystem;
using namespace colibri;

namespace {

const fs::path kWork = COLIBRI_TEST_WORK_DIR;
constexpr std::int32_t kPoison = 7;  // the token id that overflows layer 0's router

// Calls f(row, col, value&) for every element of the f32 tensor `name` (row-major [rows, cols]) of a safetensors
// file, then writes the tensor back in place.
template <class F>
void edit_f32(const fs::path& file, const std::string& name, F f) {
  auto ckpt = model::SafetensorsCheckpoint::open(file);
  ASSERT_TRUE(ckpt) << ckpt.error().message();
  const model::SafetensorsTensor* t = ckpt->find(name);
  ASSERT_TRUE(t != nullptr && t->dtype == "F32") << name;
  std::vector<float> v(t->size / sizeof(float));
  ASSERT_TRUE(ckpt->read(*t, 0, v.data(), t->size)) << name;
  const auto cols = static_cast<std::size_t>(t->shape.back());
  for (std::size_t i = 0; i < v.size(); ++i) f(i / cols, i % cols, v[i]);
  std::fstream out(file, std::ios::in | std::ios::out | std::ios::binary);
  out.seekp(static_cast<std::streamoff>(t->offset));
  out.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(t->size));
  ASSERT_TRUE(out.good()) << name;
}

// Hidden dimension 0 is zero for every token but kPoison (embedding column 0, and layer 0's attention output row 0,
// are zero), where it is large; layer 0's router weighs it with 3e38. So only kPoison's router logits overflow.
void poison(const fs::path& ckpt) {
  const fs::path file = ckpt / "model.safetensors";
  edit_f32(file, "model.embed_tokens.weight", [](std::size_t r, std::size_t c, float& v) {
    if (c == 0)
      v = r == kPoison ? 100.0f : 0.0f;
    else if (r == kPoison)
      v = 0.0f;
  });
  edit_f32(file, "model.layers.0.self_attn.o_proj.weight", [](std::size_t r, std::size_t, float& v) {
    if (r == 0) v = 0.0f;
  });
  edit_f32(file, "model.layers.0.post_attention_layernorm.weight", [](std::size_t, std::size_t c, float& v) {
    if (c == 0) v = 1.0f;
  });
  edit_f32(file, "model.layers.0.block_sparse_moe.gate.weight", [](std::size_t, std::size_t c, float& v) {
    if (c == 0) v = 3e38f;
  });
}

std::optional<profile::Profile> test_profile() {
  ::setenv("COLIBRI_PLUGIN_PATH", COLIBRI_TEST_PLUGIN_DIR, 1);
  profile::LoadOptions lo;
  lo.use_process_environment = false;  // the built-in defaults (cpu backend), whatever $COLIBRI_PROFILE says
  lo.overrides = {{"storage.plugin", "pread", "--set"}, {"cache.policy", "lru", "--set"}};
  auto prof = profile::Profile::load(lo);
  EXPECT_TRUE(prof) << (prof ? "" : prof.error().message());
  if (!prof) return std::nullopt;
  return std::move(*prof);
}

std::unique_ptr<engine::Engine> open_engine(const fs::path& model) {
  auto prof = test_profile();
  if (!prof) return nullptr;
  engine::EngineOptions eo;
  eo.context = 64;
  auto e = engine::Engine::open(model, *prof, eo);
  EXPECT_TRUE(e) << (e ? "" : e.error().message());
  return e ? std::move(*e) : nullptr;
}

// What a job saw: its generated token ids, and how it ended.
struct Outcome {
  std::vector<std::int32_t> ids;
  bool failed = false;
  std::string error, finish_reason;
};

struct Watched {
  std::shared_ptr<server::Job> job = std::make_shared<server::Job>();
  std::promise<Outcome> done;
  Outcome seen;
};

std::shared_ptr<Watched> job(std::vector<std::int32_t> prompt) {
  auto w = std::make_shared<Watched>();
  w->job->request.prompt = std::move(prompt);
  w->job->request.max_tokens = 6;
  w->job->request.ignore_eos = true;
  w->job->request.logprobs = 0;  // each text event carries its token ids
  w->job->request.sampling.temperature = 0;
  w->job->request.sampling.logit_bias = {{kPoison, -100.0f}};  // never generates the token that fails
  // A weak reference: the job is the Watched's, and a strong one here would keep both alive for ever (a cycle).
  w->job->on_event = [weak = std::weak_ptr<Watched>(w)](server::GenerationEvent&& ev) {
    const auto w = weak.lock();
    if (!w) return;
    for (const auto& lp : ev.logprobs) w->seen.ids.push_back(lp.id);
    if (ev.kind == server::GenerationEvent::Kind::text) return;
    w->seen.failed = ev.kind == server::GenerationEvent::Kind::failed;
    w->seen.error = ev.error.message;
    w->seen.finish_reason = ev.finish_reason;
    w->done.set_value(w->seen);
  };
  return w;
}

// Runs `prompts` (each one job, all queued while the scheduler thread is held, so they could join one batch) and
// returns what each saw, with the most that were between their first event and their last at once.
std::vector<Outcome> run_together(server::Scheduler& scheduler, const std::vector<std::vector<std::int32_t>>& prompts,
                                  std::size_t& most_at_once) {
  std::mutex mu;
  std::vector<int> state(prompts.size(), 0);  // 0: no event yet, 1: running, 2: ended
  most_at_once = 0;
  std::promise<void> held, release;
  auto released = release.get_future().share();
  EXPECT_TRUE(scheduler.post([&](engine::Engine&) {
    held.set_value();
    released.wait();
  }));
  held.get_future().wait();
  std::vector<std::shared_ptr<Watched>> jobs;
  std::vector<std::future<Outcome>> results;
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    auto w = job(prompts[i]);
    auto inner = w->job->on_event;
    w->job->on_event = [&, i, inner](server::GenerationEvent&& ev) {
      {
        std::lock_guard lock(mu);
        state[i] = ev.kind == server::GenerationEvent::Kind::text ? 1 : 2;
        most_at_once = std::max<std::size_t>(most_at_once, std::count(state.begin(), state.end(), 1));
      }
      inner(std::move(ev));
    };
    results.push_back(w->done.get_future());
    EXPECT_EQ(scheduler.submit(w->job), server::Scheduler::Submit::accepted);
    jobs.push_back(std::move(w));
  }
  release.set_value();
  std::vector<Outcome> out;
  for (auto& r : results) out.push_back(r.get());
  return out;
}

// The tiny Mixtral with its poisoned token, an engine on it and its tokenizer.
class SchedulerEngine : public ::testing::Test {
 protected:
  void SetUp() override {
    model = test_support::tiny_model(kWork, "poisoned", "mixtral", "f32", false, poison);
    e = open_engine(model);
    ASSERT_TRUE(e);
    auto t = tokenizer::Tokenizer::from_file(model / "tokenizer.json");
    ASSERT_TRUE(t) << t.error().message();
    tok.emplace(std::move(*t));
  }
  fs::path model;
  std::unique_ptr<engine::Engine> e;
  std::optional<tokenizer::Tokenizer> tok;
};

TEST_F(SchedulerEngine, ARequestThatMakesTheModelFailFailsAloneInItsBatch) {
  const std::vector<std::int32_t> good_a{3, 4, 5, 6}, good_b{11, 12}, bad{1, kPoison, 12};

  server::Scheduler scheduler(*e, *tok, {});
  // Alone first: the reference tokens, and the failure itself.
  std::vector<Outcome> alone;
  for (const auto& prompt : {good_a, good_b, bad}) {
    auto w = job(prompt);
    auto f = w->done.get_future();
    ASSERT_EQ(scheduler.submit(w->job), server::Scheduler::Submit::accepted);
    alone.push_back(f.get());
  }
  EXPECT_FALSE(alone[0].failed) << alone[0].error;
  EXPECT_FALSE(alone[1].failed) << alone[1].error;
  EXPECT_EQ(alone[0].ids.size(), 6u);
  ASSERT_TRUE(alone[2].failed);
  EXPECT_NE(alone[2].error.find("layer 0's router"), std::string::npos) << alone[2].error;

  // All three join one batch.
  const auto failed_before = scheduler.stats().failed;
  std::size_t at_once = 0;
  const auto together = run_together(scheduler, {good_a, bad, good_b}, at_once);
  const Outcome &a = together[0], &b = together[1], &c = together[2];
  EXPECT_TRUE(b.failed);
  EXPECT_NE(b.error.find("layer 0's router"), std::string::npos) << b.error;
  EXPECT_FALSE(a.failed) << a.error;
  EXPECT_FALSE(c.failed) << c.error;
  EXPECT_EQ(a.ids, alone[0].ids);
  EXPECT_EQ(c.ids, alone[1].ids);
  EXPECT_EQ(a.finish_reason, "length");
  EXPECT_EQ(scheduler.stats().failed, failed_before + 1);
}

TEST_F(SchedulerEngine, WithinAKvBudgetRequestsWaitOrArePausedAndGetTheSameTokens) {
  const std::vector<std::vector<std::int32_t>> prompts{{3, 4, 5, 6}, {11, 12, 13, 14}, {20, 21, 22, 23}, {5, 9, 2, 8}};
  // Each takes 5 positions to start (its prompt and the first token) and reaches 10 (max_tokens 6).
  ASSERT_GT(e->kv_sequence_bytes(5), 0u);
  ASSERT_LT(e->kv_sequence_bytes(10), e->kv_sequence_bytes(64));
  std::size_t unlimited_at_once = 0;
  std::vector<Outcome> unlimited;
  {
    server::Scheduler scheduler(*e, *tok, {});
    unlimited = run_together(scheduler, prompts, unlimited_at_once);
    EXPECT_EQ(scheduler.stats().kv_waits, 0u);
    EXPECT_EQ(scheduler.stats().kv_budget_bytes, 0u);
  }
  EXPECT_EQ(unlimited_at_once, prompts.size());
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_FALSE(unlimited[i].failed) << unlimited[i].error;
    EXPECT_EQ(unlimited[i].ids.size(), 6u);
  }
  const auto check = [&](std::uint64_t budget, std::size_t want_at_once, bool want_waits, bool want_pauses) {
    server::SchedulerOptions so;
    so.kv_budget = budget;
    server::Scheduler scheduler(*e, *tok, so);
    std::size_t at_once = 0;
    const auto within = run_together(scheduler, prompts, at_once);
    const auto st = scheduler.stats();
    EXPECT_EQ(at_once, want_at_once);
    EXPECT_EQ(st.kv_waits > 0, want_waits) << st.kv_waits;
    EXPECT_EQ(st.preempted > 0, want_pauses) << st.preempted;
    EXPECT_EQ(st.replayed_tokens > 0, want_pauses) << st.replayed_tokens;
    EXPECT_EQ(st.paused, 0u);
    EXPECT_EQ(st.kv_budget_bytes, budget);
    EXPECT_GT(st.kv_bytes, 0u);  // the kept caches
    EXPECT_LE(st.kv_bytes, std::max(budget, e->kv_sequence_bytes(10)));
    EXPECT_EQ(st.finished, prompts.size());
    for (std::size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(within[i].ids, unlimited[i].ids) << "request " << i;
    // One that needs more than the whole budget runs alone rather than never.
    auto big = job({3, 4, 5, 6});
    big->job->request.max_tokens = 40;
    auto f = big->done.get_future();
    ASSERT_EQ(scheduler.submit(big->job), server::Scheduler::Submit::accepted);
    const Outcome o = f.get();
    EXPECT_FALSE(o.failed) << o.error;
    EXPECT_EQ(o.ids.size(), 40u);
  };
  // Room for one start beside another's cache: they run one at a time, the others waiting in the queue.
  check(e->kv_sequence_bytes(8), 1, true, false);
  // All four start (5 positions each), then outgrow it as they fill: the newest are paused and, resumed, run their
  // tokens again, with the same answers.
  check(e->kv_sequence_bytes(25), 4, false, true);
}

TEST_F(SchedulerEngine, APausedSequenceResumesFromAKeptCacheSharingItsHistory) {
  // Four requests with one 16-token system prompt, each its own 2-token question: 19 positions to start, 24 at the
  // end. Room for four caches of 20 positions: all start, the newest is paused as they grow past it, and resumes
  // when the others end, from one of their kept caches (the system prompt's rows) instead of from position 0.
  std::vector<std::int32_t> system;
  for (std::int32_t id = 30; id < 46; ++id) system.push_back(id);
  std::vector<std::vector<std::int32_t>> prompts;
  for (const auto& question : std::vector<std::vector<std::int32_t>>{{3, 4}, {11, 12}, {20, 21}, {5, 9}}) {
    prompts.push_back(system);
    prompts.back().insert(prompts.back().end(), question.begin(), question.end());
  }
  std::size_t at_once = 0;
  std::vector<Outcome> unlimited;
  {
    server::Scheduler scheduler(*e, *tok, {});
    unlimited = run_together(scheduler, prompts, at_once);
  }
  server::SchedulerOptions so;
  so.kv_budget = 4 * e->kv_sequence_bytes(20);
  server::Scheduler scheduler(*e, *tok, so);
  const auto within = run_together(scheduler, prompts, at_once);
  const auto st = scheduler.stats();
  EXPECT_EQ(at_once, prompts.size());
  EXPECT_GT(st.preempted, 0u);
  EXPECT_EQ(st.paused, 0u);
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_FALSE(within[i].failed) << within[i].error;
    EXPECT_EQ(within[i].ids, unlimited[i].ids) << "request " << i;
  }
  // Each resumption took the system prompt's 16 rows and ran only what followed them again.
  EXPECT_EQ(st.replay_cached_tokens, 16 * st.preempted);
  EXPECT_GT(st.replayed_tokens, 0u);
  EXPECT_LE(st.replayed_tokens, 8 * st.preempted);  // its question, the tokens it had written and the pending one
}

TEST_F(SchedulerEngine, TheKvBudgetKeepsTheCacheANewTurnRunsFrom) {
  server::SchedulerOptions so;
  so.kv_budget = e->kv_sequence_bytes(30);
  server::Scheduler scheduler(*e, *tok, so);
  const auto run = [&](std::vector<std::int32_t> prompt) {
    auto w = job(std::move(prompt));
    auto f = w->done.get_future();
    EXPECT_EQ(scheduler.submit(w->job), server::Scheduler::Submit::accepted);
    return f.get();
  };
  const std::vector<std::int32_t> first{3, 4, 5, 6};
  const Outcome a = run(first);  // kept: 4 + 6 positions at most
  ASSERT_EQ(a.ids.size(), 6u);
  ASSERT_EQ(run({11, 12, 13, 14}).ids.size(), 6u);  // kept too, the more recent
  // The first conversation's next turn may reach 12 + 6 positions: one kept cache must go, and it is the other one,
  // though the first is the least recently used.
  std::vector<std::int32_t> next = first;
  next.insert(next.end(), a.ids.begin(), a.ids.end());
  next.insert(next.end(), {30, 31});
  const auto cached_before = scheduler.stats().cached_prompt_tokens;
  ASSERT_EQ(run(next).ids.size(), 6u);
  EXPECT_GE(scheduler.stats().cached_prompt_tokens - cached_before, 9u);
}

TEST_F(SchedulerEngine, TheKvBudgetGivesUpTheDraftModelsKeptCachesToo) {
  auto prof = test_profile();
  ASSERT_TRUE(prof);
  // The model drafts for itself, keeping up to 8 states.
  auto draft = engine::DraftModel::open(model, *prof, engine::EngineOptions{}, *e, *tok, 0.0, 8);
  ASSERT_TRUE(draft) << draft.error().message();
  std::shared_ptr<engine::DraftModel> shared = std::move(*draft);
  server::SchedulerOptions so;
  so.draft_model = shared;
  so.draft_tokens = 4;
  // What the draft model keeps, read on the scheduler thread (its only user).
  const auto kept_bytes = [&](server::Scheduler& scheduler) {
    std::promise<std::uint64_t> kept;
    EXPECT_TRUE(scheduler.post([&](engine::Engine&) { kept.set_value(shared->kept_bytes()); }));
    return kept.get_future().get();
  };
  const std::vector<std::vector<std::int32_t>> prompts{{3, 4, 5, 6}, {11, 12, 13, 14}};
  std::uint64_t kept_two = 0;
  {
    // Without a budget two requests together leave two draft states kept.
    server::Scheduler scheduler(*e, *tok, so);
    std::size_t at_once = 0;
    for (const Outcome& o : run_together(scheduler, prompts, at_once)) {
      EXPECT_FALSE(o.failed) << o.error;
      EXPECT_EQ(o.ids.size(), 6u);
    }
    EXPECT_EQ(at_once, 2u);
    EXPECT_GT(scheduler.stats().draft_tokens, 0u);
    kept_two = kept_bytes(scheduler);
  }
  // Each reached at least its prompt and a token past it.
  EXPECT_GE(kept_two, 2 * shared->engine().kv_sequence_bytes(5));
  so.kv_budget = 1;  // holds nothing: a request runs alone, and whatever is kept is given up for it
  server::Scheduler scheduler(*e, *tok, so);
  auto w = job({20, 21, 22, 23});
  auto f = w->done.get_future();
  ASSERT_EQ(scheduler.submit(w->job), server::Scheduler::Submit::accepted);
  const Outcome o = f.get();
  EXPECT_FALSE(o.failed) << o.error;
  // Only its own draft state is kept now.
  const std::uint64_t kept = kept_bytes(scheduler);
  EXPECT_GT(kept, 0u);
  EXPECT_LT(kept, kept_two);
  EXPECT_LE(kept, shared->engine().kv_sequence_bytes(14));  // at most 4 + 6 + 4 positions
}

}  // namespace
