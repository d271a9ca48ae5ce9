#include "colibri/engine/sampler.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <sstream>
#include <unordered_map>

namespace colibri::engine {

using sdk::Status;
using sdk::StatusCode;

Status SamplingOptions::validate() const {
  auto bad = [](const std::string& m) { return Status(StatusCode::invalid_argument, m); };
  auto text = [](float v) {  // "2", "0.5": as the user wrote it, not "2.000000"
    std::ostringstream o;
    o << v;
    return o.str();
  };
  if (top_k < -1) return bad("--top-k must be positive, or 0 or -1 (off), got " + std::to_string(top_k));
  if (!std::isfinite(temperature) || temperature < 0.0f) {
    return bad("--temperature must be a finite number >= 0 (0: greedy), got " + text(temperature));
  }
  if (!(top_p > 0.0f && top_p <= 1.0f)) return bad("--top-p must be in (0, 1], got " + text(top_p));
  if (!(min_p >= 0.0f && min_p <= 1.0f)) return bad("--min-p must be in [0, 1], got " + text(min_p));
  if (!(repetition_penalty > 0.0f) || !std::isfinite(repetition_penalty)) {
    return bad("--repeat-penalty must be a positive number, got " + text(repetition_penalty));
  }
  if (!std::isfinite(presence_penalty) || !std::isfinite(frequency_penalty)) {
    return bad("--presence-penalty and --frequency-penalty must be finite numbers");
  }
  if (penalty_last_n < -1) return bad("--repeat-last-n must be -1 (all), 0 (off) or positive");
  for (const auto& [id, bias] : logit_bias) {
    if (id < 0) return bad("logit_bias: token id " + std::to_string(id) + " is negative");
    if (!(bias >= -100.0f && bias <= 100.0f)) {
      return bad("logit_bias: the bias of token " + std::to_string(id) + " must be in [-100, 100], got " + text(bias));
    }
  }
  return {};
}

TokenLogprob token_logprob(std::span<const float> logits, std::int32_t id, std::size_t top) {
  TokenLogprob out;
  out.id = id;
  if (logits.empty()) return out;
  // log-softmax in double: max + log(sum(exp(l - max))).
  const double max_l = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (const float l : logits) sum += std::exp(static_cast<double>(l) - max_l);
  const double log_z = max_l + std::log(sum);
  auto lp = [&](std::int32_t t) {
    return static_cast<float>(static_cast<double>(logits[static_cast<std::size_t>(t)]) - log_z);
  };
  if (id >= 0 && static_cast<std::size_t>(id) < logits.size()) out.logprob = lp(id);
  top = std::min(top, logits.size());
  if (top == 0) return out;
  std::vector<std::int32_t> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(top), ids.end(),
                    [&](std::int32_t a, std::int32_t b) {
                      const float la = logits[static_cast<std::size_t>(a)], lb = logits[static_cast<std::size_t>(b)];
                      return la > lb || (la == lb && a < b);
                    });
  out.top.reserve(top);
  for (std::size_t i = 0; i < top; ++i) out.top.emplace_back(ids[i], lp(ids[i]));
  return out;
}

Sampler::Sampler(SamplingOptions options) : options_(options), rng_(options.seed) {}

std::int32_t Sampler::sample(std::span<const float> logits, std::span<const std::int32_t> history,
                             std::span<const std::uint8_t> allowed, std::size_t prompt_size) {
  const auto n = static_cast<std::int32_t>(logits.size());
  work_.assign(logits.begin(), logits.end());
  if (!allowed.empty()) {
    for (std::size_t i = 0; i < work_.size() && i < allowed.size(); ++i) {
      if (allowed[i] == 0) work_[i] = -std::numeric_limits<float>::infinity();
    }
  }
  const auto& o = options_;
  for (const auto& [id, bias] : o.logit_bias) {
    if (id >= 0 && id < n) work_[static_cast<std::size_t>(id)] += bias;
  }
  const bool penalties = o.repetition_penalty != 1.0f || o.presence_penalty != 0.0f || o.frequency_penalty != 0.0f;
  if (penalties && o.penalty_last_n != 0 && !history.empty()) {
    std::size_t window =
        o.penalty_last_n < 0 ? history.size() : std::min(history.size(), static_cast<std::size_t>(o.penalty_last_n));
    // Every token in the window has an entry (the repetition penalty's); its count is of the occurrences presence
    // and frequency see.
    std::unordered_map<std::int32_t, int> counts;
    const std::size_t additive_from = o.penalize_prompt ? 0 : std::min(prompt_size, history.size());
    for (std::size_t i = history.size() - window; i < history.size(); ++i) {
      int& count = counts[history[i]];
      if (i >= additive_from) ++count;
    }
    for (const auto& [id, count] : counts) {
      if (id < 0 || id >= n) continue;
      float& l = work_[static_cast<std::size_t>(id)];
      if (o.repetition_penalty != 1.0f) l = l > 0 ? l / o.repetition_penalty : l * o.repetition_penalty;
      if (count > 0) l -= static_cast<float>(count) * o.frequency_penalty + o.presence_penalty;
    }
  }
  if (o.temperature <= 0.0f) {
    // Greedy; ties go to the lowest id.
    return static_cast<std::int32_t>(std::max_element(work_.begin(), work_.end()) - work_.begin());
  }
  ids_.resize(static_cast<std::size_t>(n));
  std::iota(ids_.begin(), ids_.end(), 0);
  auto by_logit = [&](std::int32_t a, std::int32_t b) {
    const float la = work_[static_cast<std::size_t>(a)], lb = work_[static_cast<std::size_t>(b)];
    return la > lb || (la == lb && a < b);
  };
  std::size_t keep = ids_.size();
  if (o.top_k > 0 && static_cast<std::size_t>(o.top_k) < keep) {
    keep = static_cast<std::size_t>(o.top_k);
    std::partial_sort(ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(keep), ids_.end(), by_logit);
  } else {
    std::sort(ids_.begin(), ids_.end(), by_logit);
  }
  // Softmax with temperature over the kept candidates, in double so the cut-offs do not depend on summation noise.
  std::vector<double> p(keep);
  const double max_l = work_[static_cast<std::size_t>(ids_[0])];
  double sum = 0;
  for (std::size_t i = 0; i < keep; ++i) {
    p[i] = std::exp((work_[static_cast<std::size_t>(ids_[i])] - max_l) / o.temperature);
    sum += p[i];
  }
  for (auto& x : p) x /= sum;
  if (o.top_p < 1.0f) {
    double cum = 0;
    std::size_t cut = keep;
    for (std::size_t i = 0; i < keep; ++i) {
      cum += p[i];
      if (cum >= o.top_p) {
        cut = i + 1;
        break;
      }
    }
    keep = cut;
  }
  if (o.min_p > 0.0f) {
    const double threshold = o.min_p * p[0];
    std::size_t cut = 1;
    while (cut < keep && p[cut] >= threshold) ++cut;
    keep = cut;
  }
  double total = 0;
  for (std::size_t i = 0; i < keep; ++i) total += p[i];
  // 53 random bits -> uniform in [0, 1): the same on every standard library.
  const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53 * total;
  double acc = 0;
  for (std::size_t i = 0; i < keep; ++i) {
    acc += p[i];
    if (u < acc) return ids_[i];
  }
  // Rounding left u at or past the sum: the last token that has any probability (never a banned one).
  while (keep > 1 && p[keep - 1] <= 0) --keep;
  return ids_[keep - 1];
}

}  // namespace colibri::engine
