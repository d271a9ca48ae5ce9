// The A/B report: a self-contained HTML page (inline SVG and CSS, no scripts, no network) with hit rate against
// cache size per policy beside Belady's optimum, per-size tables, and paired live runs when present.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "colibri/ab/replay.hpp"

namespace colibri::ab {

struct SizeResults {
  std::uint64_t cache_experts = 0;
  std::uint64_t budget_bytes = 0;
  std::vector<ReplayResult> policies;  // in --policy order
  ReplayResult optimal;
};

struct ReplayReport {
  std::string trace;
  std::uint64_t records = 0;
  std::uint64_t accesses = 0;
  std::uint32_t layers = 0;
  std::uint64_t experts = 0;  // experts a cache may hold: the model's (with --model), else those the trace uses
  bool experts_of_model = false;
  bool bytes_known = false;
  double seconds = 0;
  std::vector<SizeResults> sizes;  // ascending cache size
};

// One profile's side of a live A/B run.
struct LiveSide {
  std::string profile;
  std::vector<double> decode_tps, hit_rate, bytes_read;  // one per run
};

struct LiveVerdict {
  double median_diff = 0;          // median of paired (B - A) decode tok/s
  double ci_low = 0, ci_high = 0;  // 95% bootstrap CI of the median paired difference
  int b_faster = 0, a_faster = 0;  // sign test counts
  double sign_p = 1;               // two-sided sign test p-value
  bool within_noise = true;
  std::string text;  // the plain-language verdict
};

struct LiveReport {
  std::string model;
  std::string mode;  // "cold" or "warm"
  LiveSide a, b;
  LiveVerdict verdict;
};

double median(std::vector<double> v);
// Paired analysis of decode tok/s: sign test and a seeded bootstrap CI of the median difference.
LiveVerdict compare_paired(const std::vector<double>& a, const std::vector<double>& b, std::uint64_t seed = 1);
// The same paired sign test on another measure of the runs (hit rate, bytes read), as a line of its own: "bytes
// read per run: A is better (median B-A +1.6 MiB, +16.3%, B higher in 6 of 6 pairs, sign test p = 0.031)".
// `format` prints a value of it; `more_is_better` names the better side.
std::string compare_measure(const std::string& name, const std::vector<double>& a, const std::vector<double>& b,
                            const std::function<std::string(double)>& format, bool more_is_better);

// Either part may be absent (null).
std::string render_html(const ReplayReport* replay, const LiveReport* live);

}  // namespace colibri::ab
