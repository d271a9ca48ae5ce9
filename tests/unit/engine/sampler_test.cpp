#include "colibri/engine/sampler.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "colibri/engine/generate.hpp"

namespace colibri::engine {
namespace {

SamplingOptions plain(float temperature = 1.0f) {
  SamplingOptions o;
  o.temperature = temperature;
  o.top_k = 0;
  o.top_p = 1.0f;
  o.min_p = 0.0f;
  return o;
}

TEST(Sampler, GreedyTakesTheArgmaxAndTiesGoToTheLowestId) {
  Sampler s(plain(0.0f));
  std::vector<float> logits = {0.1f, 2.0f, -1.0f, 2.0f};
  EXPECT_EQ(s.sample(logits, {}), 1);
  logits[3] = 2.5f;
  EXPECT_EQ(s.sample(logits, {}), 3);
}

TEST(Sampler, SameSeedSameTokensDifferentSeedDifferentTokens) {
  std::vector<float> logits(50);
  for (std::size_t i = 0; i < logits.size(); ++i) logits[i] = std::sin(static_cast<float>(i));
  auto draw = [&](std::uint64_t seed) {
    auto o = plain();
    o.seed = seed;
    Sampler s(o);
    std::vector<std::int32_t> out;
    for (int i = 0; i < 64; ++i) out.push_back(s.sample(logits, {}));
    return out;
  };
  EXPECT_EQ(draw(7), draw(7));
  EXPECT_NE(draw(7), draw(8));
}

TEST(Sampler, FollowsTheSoftmaxDistribution) {
  const std::vector<float> logits = {0.0f, 1.0f, 2.0f};
  auto o = plain(1.0f);
  o.seed = 42;
  Sampler s(o);
  std::vector<int> counts(3);
  const int n = 30000;
  for (int i = 0; i < n; ++i) ++counts[static_cast<std::size_t>(s.sample(logits, {}))];
  const double z = 1 + std::exp(1.0) + std::exp(2.0);
  EXPECT_NEAR(counts[0] / double(n), 1 / z, 0.01);
  EXPECT_NEAR(counts[1] / double(n), std::exp(1.0) / z, 0.01);
  EXPECT_NEAR(counts[2] / double(n), std::exp(2.0) / z, 0.01);
}

TEST(Sampler, TemperatureSharpens) {
  const std::vector<float> logits = {0.0f, 1.0f};
  auto o = plain(0.1f);
  Sampler s(o);
  int best = 0;
  for (int i = 0; i < 2000; ++i) best += s.sample(logits, {}) == 1;
  EXPECT_GT(best, 1990);  // p = 1 / (1 + e^-10)
}

TEST(Sampler, TopKTopPAndMinPCutTheTail) {
  const std::vector<float> logits = {3.0f, 2.9f, 0.0f, -1.0f, 2.8f};
  auto count_distinct = [&](SamplingOptions o) {
    Sampler s(o);
    std::vector<int> seen(logits.size());
    for (int i = 0; i < 3000; ++i) seen[static_cast<std::size_t>(s.sample(logits, {}))] = 1;
    return seen;
  };
  auto o = plain();
  o.top_k = 2;
  EXPECT_EQ(count_distinct(o), (std::vector<int>{1, 1, 0, 0, 0}));
  o = plain();
  o.top_p = 0.3f;  // the best token alone holds about 0.35
  EXPECT_EQ(count_distinct(o), (std::vector<int>{1, 0, 0, 0, 0}));
  o = plain();
  o.min_p = 0.5f;  // tokens 2 and 3 are below half of the best one's probability
  EXPECT_EQ(count_distinct(o), (std::vector<int>{1, 1, 0, 0, 1}));
}

TEST(Sampler, PenaltiesLowerRepeatedTokens) {
  const std::vector<float> logits = {1.0f, 0.9f, -2.0f};
  const std::vector<std::int32_t> history = {0, 0, 2};
  auto o = plain(0.0f);
  o.repetition_penalty = 1.2f;  // 1.0 / 1.2 < 0.9
  EXPECT_EQ(Sampler(o).sample(logits, history), 1);
  o = plain(0.0f);
  o.frequency_penalty = 0.06f;  // 1.0 - 2 * 0.06 < 0.9
  EXPECT_EQ(Sampler(o).sample(logits, history), 1);
  o.frequency_penalty = 0.04f;  // 1.0 - 0.08 > 0.9
  EXPECT_EQ(Sampler(o).sample(logits, history), 0);
  o = plain(0.0f);
  o.presence_penalty = 0.2f;
  EXPECT_EQ(Sampler(o).sample(logits, history), 1);
  o.penalty_last_n = 1;  // only token 2 is in the window
  EXPECT_EQ(Sampler(o).sample(logits, history), 0);
}

// OpenAI's and vLLM's presence and frequency penalties count the answer's tokens only (the server's setting);
// llama.cpp's count the prompt's too (the CLI's). The repetition penalty counts the prompt in both.
TEST(Sampler, AdditivePenaltiesCountThePromptOnlyWhenAsked) {
  const std::vector<float> logits = {1.0f, 0.9f, -2.0f};
  const std::vector<std::int32_t> history = {0, 0, 0, 2};  // the prompt: token 0 three times; then 2 generated
  auto o = plain(0.0f);
  o.frequency_penalty = 0.5f;
  EXPECT_EQ(Sampler(o).sample(logits, history, {}, 3), 1) << "penalize_prompt: the prompt's 0s count";
  o.penalize_prompt = false;
  EXPECT_EQ(Sampler(o).sample(logits, history, {}, 3), 0) << "the prompt's 0s do not count";
  EXPECT_EQ(Sampler(o).sample(logits, history, {}, 2), 1) << "one 0 generated: 1.0 - 0.5 < 0.9";
  o = plain(0.0f);
  o.presence_penalty = 0.5f;
  o.penalize_prompt = false;
  EXPECT_EQ(Sampler(o).sample(logits, history, {}, 3), 0);
  o = plain(0.0f);
  o.repetition_penalty = 1.2f;
  o.penalize_prompt = false;
  EXPECT_EQ(Sampler(o).sample(logits, history, {}, 3), 1) << "the repetition penalty still sees the prompt";
}

TEST(Sampler, ValidateNamesTheFlag) {
  auto o = plain();
  o.top_p = 1.5f;
  EXPECT_NE(o.validate().message().find("--top-p must be in (0, 1], got 1.5"), std::string::npos)
      << o.validate().message();
  o = plain();
  o.top_k = -5;
  EXPECT_NE(o.validate().message().find("--top-k must be positive, or 0 or -1 (off), got -5"), std::string::npos);
  o.top_k = -1;
  EXPECT_TRUE(o.validate().is_ok());
  o = plain();
  o.repetition_penalty = 0.0f;
  EXPECT_NE(o.validate().message().find("--repeat-penalty"), std::string::npos);
  EXPECT_NE(plain(-1.0f).validate().message().find("--temperature must be a finite number >= 0"), std::string::npos);
  EXPECT_TRUE(plain(0.0f).validate().is_ok());
  EXPECT_TRUE(plain().validate().is_ok());
}

TEST(Sampler, LogitBiasShiftsTheLogitBeforeSampling) {
  const std::vector<float> logits = {0.0f, 3.0f, 1.0f};
  auto o = plain(0.0f);
  EXPECT_EQ(Sampler(o).sample(logits, {}), 1);
  o.logit_bias = {{2, 2.5f}};
  EXPECT_EQ(Sampler(o).sample(logits, {}), 2);
  o.logit_bias = {{1, -100.0f}, {7, 50.0f}};  // an id past the logits is ignored here (the server refuses it)
  EXPECT_EQ(Sampler(o).sample(logits, {}), 2);
  // Under sampling, -100 bans: 2000 draws never give token 1.
  o = plain(1.0f);
  o.logit_bias = {{1, -100.0f}};
  Sampler s(o);
  for (int i = 0; i < 2000; ++i) ASSERT_NE(s.sample(logits, {}), 1);
  o.logit_bias = {{0, 100.5f}};
  EXPECT_NE(o.validate().message().find("logit_bias: the bias of token 0 must be in [-100, 100]"), std::string::npos);
  o.logit_bias = {{-3, 1.0f}};
  EXPECT_NE(o.validate().message().find("token id -3 is negative"), std::string::npos);
}

TEST(Sampler, OnlyAllowedTokensAreEverChosen) {
  const std::vector<float> logits = {5.0f, 1.0f, 4.0f, 0.5f, 3.0f};
  const std::vector<std::uint8_t> allowed = {0, 1, 0, 1, 1};
  EXPECT_EQ(Sampler(plain(0.0f)).sample(logits, {}, allowed), 4);  // greedy: the best allowed one
  for (const float t : {0.5f, 1.0f, 2.0f}) {
    auto o = plain(t);
    o.top_k = 0;
    o.seed = 9;
    o.repetition_penalty = 1.3f;
    o.logit_bias = {{0, 50.0f}};  // a bias does not lift a ban
    Sampler s(o);
    std::vector<int> counts(logits.size());
    const std::vector<std::int32_t> history = {0, 2};
    for (int i = 0; i < 3000; ++i) ++counts[static_cast<std::size_t>(s.sample(logits, history, allowed))];
    EXPECT_EQ(counts[0] + counts[2], 0) << t;
    EXPECT_GT(counts[1], 0) << t;  // every allowed token keeps its chance
    EXPECT_GT(counts[3], 0) << t;
  }
}

TEST(Sampler, TokenLogprobIsTheLogSoftmaxOfTheRawLogits) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 3.0f, -50.0f};
  double z = 0;
  for (float l : logits) z += std::exp(static_cast<double>(l));
  auto lp = [&](int i) { return static_cast<float>(logits[static_cast<std::size_t>(i)] - std::log(z)); };
  const auto r = token_logprob(logits, 2, 3);
  EXPECT_EQ(r.id, 2);
  EXPECT_FLOAT_EQ(r.logprob, lp(2));
  ASSERT_EQ(r.top.size(), 3u);
  // Most likely first, the tie between 1 and 3 to the lower id.
  EXPECT_EQ(r.top[0].first, 1);
  EXPECT_EQ(r.top[1].first, 3);
  EXPECT_EQ(r.top[2].first, 2);
  EXPECT_FLOAT_EQ(r.top[0].second, lp(1));
  EXPECT_FLOAT_EQ(r.top[2].second, r.logprob);
  EXPECT_TRUE(token_logprob(logits, 4, 0).top.empty());
  EXPECT_EQ(token_logprob(logits, 0, 99).top.size(), logits.size());
  // Large logits do not overflow: the shift by the max keeps exp in range.
  const std::vector<float> big = {1000.0f, 1000.0f};
  EXPECT_FLOAT_EQ(token_logprob(big, 0, 0).logprob, static_cast<float>(-std::log(2.0)));
}

TEST(StopMatcher, HoldsBackPrefixesAndCutsAtTheStop) {
  StopMatcher m({"STOP", "END"});
  EXPECT_EQ(m.push("Hello S"), "Hello ");
  EXPECT_EQ(m.push("T"), "");
  EXPECT_EQ(m.push("OP and more"), "");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.push("x"), "");
}

TEST(StopMatcher, ReleasesAFalseStartAndFlushes) {
  StopMatcher m({"STOP"});
  EXPECT_EQ(m.push("ST"), "");
  EXPECT_EQ(m.push("AR"), "STAR");
  EXPECT_EQ(m.push("ST"), "");
  EXPECT_FALSE(m.stopped());
  EXPECT_EQ(m.flush(), "ST");
}

// --draft's proposals: what followed the latest earlier occurrence of the longest matching suffix.
TEST(LookupDraft, TakesWhatFollowedTheLatestLongestMatch) {
  using V = std::vector<std::int32_t>;
  EXPECT_EQ(lookup_draft(V{1, 2, 3, 4}, 3, 4), V{}) << "no earlier occurrence of any suffix";
  EXPECT_EQ(lookup_draft(V{7}, 3, 4), V{}) << "one token has nothing before it";
  EXPECT_EQ(lookup_draft(V{1, 2, 9, 9, 2}, 3, 2), (V{9, 9})) << "one token matched when no longer suffix is";
  // The suffix 5 6 occurs at 0 (then 1) and at 4 (then 8); 6 alone also at 6 (then 7): the longest, latest wins.
  EXPECT_EQ(lookup_draft(V{5, 6, 1, 0, 5, 6, 8, 6, 7, 5, 6}, 3, 3), (V{8, 6, 7}));
  EXPECT_EQ(lookup_draft(V{5, 6, 1, 0, 5, 6, 8, 6, 7, 5, 6}, 1, 3), (V{7, 5, 6})) << "only the last token matched";
  EXPECT_EQ(lookup_draft(V{5, 6, 1, 0, 5, 6, 8, 6, 7, 5, 6}, 3, 1), (V{8})) << "at most count";
  EXPECT_EQ(lookup_draft(V{5, 6, 1, 5, 6}, 3, 0), V{}) << "count 0";
  // A cycle drafts whole periods: the continuation runs into the end and goes on with the draft itself.
  EXPECT_EQ(lookup_draft(V{4, 1, 2, 3, 1, 2, 3}, 3, 7), (V{1, 2, 3, 1, 2, 3, 1}));
  EXPECT_EQ(lookup_draft(V{3, 3}, 3, 4), (V{3, 3, 3, 3}));
}

// Drafts cost their experts' reads kept or not: the next pass's length follows what the last one kept.
TEST(Speculation, PacesDraftsByWhatTheLastPassKept) {
  using V = std::vector<std::int32_t>;
  Speculation spec(4, 3);
  EXPECT_EQ(spec.next_length(0, 100), 4) << "the limit at first";
  spec.run(V{1, 2, 3, 4});
  EXPECT_EQ(spec.next_length(0, 100), 2) << "none kept: halved";
  spec.run(V{1, 2});
  EXPECT_EQ(spec.next_length(0, 100), 1);
  spec.run(V{1});
  EXPECT_EQ(spec.next_length(0, 100), 0) << "a single draft missed: a pause of 1 step";
  spec.run(V{});
  EXPECT_EQ(spec.next_length(0, 100), 1);
  spec.run(V{5});
  EXPECT_EQ(spec.next_length(1, 100), 2) << "all kept: doubled";
  spec.run(V{5, 6});
  EXPECT_EQ(spec.next_length(2, 1), 1) << "at most the room";
  spec.run(V{7});
  EXPECT_EQ(spec.next_length(1, 100), 4) << "doubled up to the limit";
  EXPECT_EQ(spec.drafted(), 11);
  // Prompt lookup's empty answer costs nothing: no pause. A draft model's does (its passes ran).
  spec.run(V{});
  EXPECT_EQ(spec.next_length(0, 100), 4);
  spec.run(V{}, /*costly=*/true);
  EXPECT_EQ(spec.next_length(0, 100), 0) << "a draft model proposed none: paused";
  spec.run(V{}, true);  // asked for none: not a decline
  EXPECT_EQ(spec.next_length(0, 100), 4);
  spec.run(V{}, true);
  EXPECT_EQ(spec.next_length(0, 100), 0) << "declined again: a pause of 2";
  spec.run(V{}, true);
  EXPECT_EQ(spec.next_length(0, 100), 0);
  spec.run(V{}, true);
  EXPECT_EQ(spec.next_length(0, 100), 4);
  EXPECT_EQ(spec.drafted(), 11);

  // At least 3 drafts a pass (speculative.n_min): never halved below, and none where fewer would fit.
  Speculation least(8, 3, 3);
  EXPECT_EQ(least.next_length(0, 100), 8);
  least.run(V(8, 1));
  EXPECT_EQ(least.next_length(0, 100), 4);
  least.run(V(4, 1));
  EXPECT_EQ(least.next_length(0, 100), 3) << "halved to the floor, not below";
  least.run(V(3, 1));
  EXPECT_EQ(least.next_length(0, 100), 0) << "missed at the floor: paused";
  least.run(V{});
  EXPECT_EQ(least.next_length(0, 2), 0) << "room for 2 only";
  least.run(V{});
  EXPECT_EQ(least.next_length(0, 100), 3);
  least.run(V(2, 1));
  EXPECT_TRUE(least.fed().empty()) << "2 proposed where 3 at least are worth a pass: none run";
}

}  // namespace
}  // namespace colibri::engine
