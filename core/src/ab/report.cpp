#include "colibri/ab/report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <sstream>

#include "colibri/util/bytes_text.hpp"

namespace colibri::ab {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const auto n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

namespace {

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// Two-sided exact binomial sign test, p = 1/2.
double sign_test(int plus, int minus) {
  const int n = plus + minus;
  if (n == 0) return 1;
  const int k = std::min(plus, minus);
  double tail = 0;
  for (int i = 0; i <= k; ++i) {
    tail += std::exp(std::lgamma(n + 1.0) - std::lgamma(i + 1.0) - std::lgamma(n - i + 1.0) - n * std::log(2.0));
  }
  return std::min(1.0, 2 * tail);
}

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

const char* const kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2"};

void render_replay(std::ostringstream& h, const ReplayReport& r) {
  h << "<h2>Offline replay</h2>\n<p>Trace <code>" << escape(r.trace) << "</code>: " << r.records << " records, "
    << r.accesses << " expert accesses, replayed in " << fmt("%.2f", r.seconds) << " s.</p>\n";
  if (r.sizes.empty()) return;
  // Plot: hit rate (0..100%) against cache size in experts.
  const double W = 640, H = 360, left = 60, right = 170, top = 20, bottom = 50;
  const double pw = W - left - right, ph = H - top - bottom;
  const double xmin = static_cast<double>(r.sizes.front().cache_experts);
  const double xmax = static_cast<double>(r.sizes.back().cache_experts);
  auto X = [&](double v) { return left + (xmax > xmin ? (v - xmin) / (xmax - xmin) * pw : pw / 2); };
  auto Y = [&](double rate) { return top + (1 - rate) * ph; };
  h << "<svg id=\"hit-rate-plot\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H
    << "\" viewBox=\"0 0 " << W << " " << H << "\" role=\"img\" aria-label=\"hit rate against cache size\">\n";
  h << "<rect x=\"" << left << "\" y=\"" << top << "\" width=\"" << pw << "\" height=\"" << ph
    << "\" fill=\"none\" stroke=\"#999\"/>\n";
  for (int i = 0; i <= 4; ++i) {
    const double rate = i / 4.0;
    h << "<line x1=\"" << left << "\" x2=\"" << left + pw << "\" y1=\"" << Y(rate) << "\" y2=\"" << Y(rate)
      << "\" stroke=\"#eee\"/><text x=\"" << left - 6 << "\" y=\"" << Y(rate) + 4
      << "\" text-anchor=\"end\" font-size=\"11\">" << i * 25 << "%</text>\n";
  }
  for (const auto& s : r.sizes) {
    const double x = X(static_cast<double>(s.cache_experts));
    h << "<text x=\"" << x << "\" y=\"" << top + ph + 16 << "\" text-anchor=\"middle\" font-size=\"11\">"
      << s.cache_experts << "</text>\n";
  }
  h << "<text x=\"" << left + pw / 2 << "\" y=\"" << H - 10
    << "\" text-anchor=\"middle\" font-size=\"12\">cache size (experts)</text>\n";
  h << "<text x=\"14\" y=\"" << top + ph / 2 << "\" transform=\"rotate(-90 14 " << top + ph / 2
    << ")\" text-anchor=\"middle\" font-size=\"12\">hit rate</text>\n";
  auto series = [&](const std::string& name, const std::string& color, bool dashed, auto get) {
    h << "<polyline class=\"series\" data-policy=\"" << escape(name) << "\" fill=\"none\" stroke=\"" << color
      << "\" stroke-width=\"2\"" << (dashed ? " stroke-dasharray=\"6 4\"" : "") << " points=\"";
    for (const auto& s : r.sizes) {
      h << fmt("%.1f", X(static_cast<double>(s.cache_experts))) << "," << fmt("%.1f", Y(get(s).hit_rate())) << " ";
    }
    h << "\"/>\n";
    for (const auto& s : r.sizes) {
      h << "<circle cx=\"" << fmt("%.1f", X(static_cast<double>(s.cache_experts))) << "\" cy=\""
        << fmt("%.1f", Y(get(s).hit_rate())) << "\" r=\"3\" fill=\"" << color << "\"><title>" << escape(name) << " @ "
        << s.cache_experts << ": " << fmt("%.2f%%", 100 * get(s).hit_rate()) << "</title></circle>\n";
    }
  };
  const auto n = r.sizes.front().policies.size();
  double ly = top + 10;
  auto legend = [&](const std::string& name, const std::string& color, bool dashed) {
    h << "<line x1=\"" << left + pw + 12 << "\" x2=\"" << left + pw + 36 << "\" y1=\"" << ly << "\" y2=\"" << ly
      << "\" stroke=\"" << color << "\" stroke-width=\"2\"" << (dashed ? " stroke-dasharray=\"6 4\"" : "")
      << "/><text x=\"" << left + pw + 42 << "\" y=\"" << ly + 4 << "\" font-size=\"11\">" << escape(name)
      << "</text>\n";
    ly += 18;
  };
  for (std::size_t p = 0; p < n; ++p) {
    const std::string color = kColors[p % (sizeof kColors / sizeof kColors[0])];
    series(r.sizes.front().policies[p].policy, color, false,
           [p](const SizeResults& s) -> const ReplayResult& { return s.policies[p]; });
    legend(r.sizes.front().policies[p].policy, color, false);
  }
  series("optimal (Belady)", "#000", true, [](const SizeResults& s) -> const ReplayResult& { return s.optimal; });
  legend("optimal (Belady)", "#000", true);
  h << "</svg>\n";

  h << "<table><tr><th>cache (experts)</th><th>policy</th><th>hit rate</th><th>misses</th><th>preload</th>"
       "<th>bytes read</th></tr>\n";
  for (const auto& s : r.sizes) {
    auto row = [&](const ReplayResult& x, const std::string& name) {
      h << "<tr><td>" << s.cache_experts << "</td><td>" << escape(name) << "</td><td>"
        << fmt("%.2f%%", 100 * x.hit_rate()) << "</td><td>" << x.stats.misses << "</td><td>" << x.stats.preload_loads
        << "</td><td>" << (r.bytes_known ? util::bytes_text(x.stats.bytes_read) : "n/a") << "</td></tr>\n";
    };
    for (const auto& p : s.policies) row(p, p.policy);
    row(s.optimal, "optimal (Belady)");
  }
  h << "</table>\n<p class=\"note\">Hit rate counts trace accesses. Policies that preload (pinned experts, or a "
       "cache that holds every expert) read those experts before the first token; their misses include those "
       "reads, so compare misses and bytes read with the optimum too.</p>\n";
}

void render_live(std::ostringstream& h, const LiveReport& l) {
  h << "<h2>Live paired runs</h2>\n<p>Model <code>" << escape(l.model) << "</code>, " << escape(l.mode)
    << " cache, runs interleaved A B A B.</p>\n";
  h << "<table id=\"live\"><tr><th>profile</th><th>runs</th><th>decode tok/s (median)</th><th>min</th><th>max</th>"
       "<th>hit rate (median)</th><th>bytes read (median)</th></tr>\n";
  for (const auto* side : {&l.a, &l.b}) {
    const auto& t = side->decode_tps;
    h << "<tr><td>" << escape(side->profile) << "</td><td>" << t.size() << "</td><td>" << fmt("%.2f", median(t))
      << "</td><td>" << fmt("%.2f", t.empty() ? 0 : *std::min_element(t.begin(), t.end())) << "</td><td>"
      << fmt("%.2f", t.empty() ? 0 : *std::max_element(t.begin(), t.end())) << "</td><td>"
      << fmt("%.2f%%", 100 * median(side->hit_rate)) << "</td><td>"
      << util::bytes_text(static_cast<std::uint64_t>(median(side->bytes_read))) << "</td></tr>\n";
  }
  h << "</table>\n<p id=\"verdict\"><b>Verdict:</b> " << escape(l.verdict.text) << "</p>\n";
}

}  // namespace

LiveVerdict compare_paired(const std::vector<double>& a, const std::vector<double>& b, std::uint64_t seed) {
  LiveVerdict v;
  std::vector<double> d;
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    d.push_back(b[i] - a[i]);
    if (b[i] > a[i]) ++v.b_faster;
    if (a[i] > b[i]) ++v.a_faster;
  }
  v.median_diff = median(d);
  v.sign_p = sign_test(v.b_faster, v.a_faster);
  if (d.size() >= 2) {
    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<std::size_t> pick(0, d.size() - 1);
    std::vector<double> meds, s(d.size());
    for (int it = 0; it < 2000; ++it) {
      for (auto& x : s) x = d[pick(rng)];
      meds.push_back(median(s));
    }
    std::sort(meds.begin(), meds.end());
    v.ci_low = meds[static_cast<std::size_t>(0.025 * (meds.size() - 1))];
    v.ci_high = meds[static_cast<std::size_t>(0.975 * (meds.size() - 1))];
  } else {
    v.ci_low = v.ci_high = v.median_diff;
  }
  // Significant only when both the sign test and the bootstrap interval agree.
  v.within_noise = d.size() < 2 || v.sign_p >= 0.05 || (v.ci_low <= 0 && v.ci_high >= 0);
  const double base = median(a);
  const std::string stats = "median paired difference B-A " + fmt("%+.2f", v.median_diff) + " tok/s (" +
                            (base > 0 ? fmt("%+.1f%%", 100 * v.median_diff / base) : std::string("n/a")) +
                            "), 95% bootstrap CI [" + fmt("%+.2f", v.ci_low) + ", " + fmt("%+.2f", v.ci_high) +
                            "], B faster in " + std::to_string(v.b_faster) + " of " + std::to_string(d.size()) +
                            " pairs, sign test p = " + fmt("%.3f", v.sign_p);
  if (v.within_noise) {
    v.text = "no clear difference: within noise (" + stats + ")" +
             (d.size() < 6 ? "; with under 6 pairs the sign test cannot reach p < 0.05, use more --runs" : "");
  } else {
    v.text = std::string(v.median_diff > 0 ? "B is faster" : "A is faster") + " (" + stats + ")";
  }
  return v;
}

std::string compare_measure(const std::string& name, const std::vector<double>& a, const std::vector<double>& b,
                            const std::function<std::string(double)>& format, bool more_is_better) {
  const LiveVerdict v = compare_paired(a, b);
  if (v.b_faster == 0 && v.a_faster == 0) return name + ": the same for A and B";
  const double base = median(a);
  const std::string stats =
      "median B-A " + std::string(v.median_diff < 0 ? "-" : "+") + format(std::abs(v.median_diff)) +
      (base > 0 ? ", " + fmt("%+.1f%%", 100 * v.median_diff / base) : std::string()) + ", B higher in " +
      std::to_string(v.b_faster) + " of " + std::to_string(std::min(a.size(), b.size())) +
      " pairs, sign test p = " + fmt("%.3f", v.sign_p);
  // A measure of the expert cache (not of time) barely varies run to run: the sign test alone decides.
  if (v.sign_p >= 0.05) return name + ": no clear difference (" + stats + ")";
  const bool b_better = (v.median_diff > 0) == more_is_better;
  return name + ": " + (b_better ? "B" : "A") + " is better (" + stats + ")";
}

std::string render_html(const ReplayReport* replay, const LiveReport* live) {
  std::ostringstream h;
  h << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>colibri cache A/B report</title>\n"
       "<style>body{font-family:sans-serif;margin:2em;max-width:60em}table{border-collapse:collapse;margin:1em 0}"
       "td,th{border:1px solid #ccc;padding:.25em .6em;text-align:right}th{background:#f4f4f4}"
       "code{background:#f4f4f4}.note{color:#555;font-size:.9em}</style></head><body>\n"
       "<h1>colibri cache A/B report</h1>\n";
  if (replay != nullptr) render_replay(h, *replay);
  if (live != nullptr) render_live(h, *live);
  h << "</body></html>\n";
  return h.str();
}

}  // namespace colibri::ab
