#include "colibri/engine/rope.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace colibri::engine {
namespace {

using sdk::Status;
using sdk::StatusCode;

Status bad_in(std::string_view source, const std::string& what) {
  if (!source.empty()) {
    return Status(StatusCode::invalid_argument, std::string(source) + " rope_scaling: " + what + "; fix it there");
  }
  return Status(StatusCode::invalid_argument,
                "manifest.json hparams.rope_scaling: " + what + "; re-convert the model or fix its config.json");
}

std::vector<double> default_inv_freq(double theta, std::int32_t dims) {
  std::vector<double> f(static_cast<std::size_t>(dims / 2));
  for (std::size_t i = 0; i < f.size(); ++i) {
    f[i] = 1.0 / std::pow(theta, static_cast<double>(2 * i) / dims);
  }
  return f;
}

std::vector<float> to_float(const std::vector<double>& v) {
  return {v.begin(), v.end()};
}

}  // namespace

sdk::Expected<RopeFrequencies> RopeFrequencies::create(const model::HyperParams& hp, std::string_view source) {
  auto bad = [source](const std::string& what) { return bad_in(source, what); };
  RopeFrequencies r;
  r.dims_ = static_cast<std::int32_t>(hp.rope_dims());  // partial rotary: HF's frequencies span only these
  r.theta_ = hp.rope_theta;
  r.original_max_ = hp.max_position_embeddings;
  if (r.dims_ <= 0 || r.dims_ % 2 != 0)
    return bad("the rotated dims (head_dim or rotary_dims) must be even and positive for rope");
  std::vector<double> inv = default_inv_freq(r.theta_, r.dims_);
  const auto& rs = hp.rope_scaling;
  if (rs.is_object()) {
    std::string type = "default";
    if (rs.contains("rope_type") && rs["rope_type"].is_string()) {
      type = rs["rope_type"].get<std::string>();
    } else if (rs.contains("type") && rs["type"].is_string()) {
      type = rs["type"].get<std::string>();
    }
    auto number = [&](const char* key, std::optional<double> def) -> sdk::Expected<double> {
      if (!rs.contains(key) || rs[key].is_null()) {
        if (def) return *def;
        return bad(std::string("rope_type '") + type + "' needs \"" + key + "\"");
      }
      if (!rs[key].is_number() || !std::isfinite(rs[key].get<double>()))
        return bad(std::string("\"") + key + "\" must be a finite number");
      return rs[key].get<double>();
    };
    r.type_ = type;
    if (type == "default") {
      // nothing to change
    } else if (type == "linear") {
      auto factor = number("factor", std::nullopt);
      if (!factor) return factor.error();
      if (*factor <= 0) return bad("\"factor\" must be positive");
      for (auto& f : inv) f /= *factor;
    } else if (type == "dynamic") {
      auto factor = number("factor", std::nullopt);
      if (!factor) return factor.error();
      if (*factor <= 0) return bad("\"factor\" must be positive");
      r.factor_ = *factor;
      auto orig = number("original_max_position_embeddings", static_cast<double>(hp.max_position_embeddings));
      if (!orig) return orig.error();
      if (*orig < 1 || *orig > 1e12) return bad("\"original_max_position_embeddings\" is out of range");
      r.original_max_ = static_cast<std::int64_t>(*orig);
    } else if (type == "llama3") {
      auto factor = number("factor", std::nullopt);
      auto low = number("low_freq_factor", std::nullopt);
      auto high = number("high_freq_factor", std::nullopt);
      auto orig = number("original_max_position_embeddings", std::nullopt);
      for (const auto* e : {&factor, &low, &high, &orig}) {
        if (!*e) return e->error();
      }
      if (*factor <= 0 || *low <= 0 || *high <= 0 || *orig <= 0) {
        return bad("llama3 needs factor, low_freq_factor, high_freq_factor and original_max_position_embeddings > 0");
      }
      const double low_wavelen = *orig / *low, high_wavelen = *orig / *high;
      for (auto& f : inv) {
        const double wavelen = 2 * std::numbers::pi / f;
        if (wavelen < high_wavelen) continue;  // high frequencies are kept
        if (wavelen > low_wavelen) {
          f /= *factor;
        } else if (*high != *low) {  // equal (Llama 4): no band between the two, every frequency kept or divided
          const double smooth = (*orig / wavelen - *low) / (*high - *low);
          f = (1 - smooth) * f / *factor + smooth * f;
        }
      }
    } else if (type == "yarn") {
      // transformers' _compute_yarn_parameters: the explicit factor wins; original_max defaults to the model's.
      auto orig = number("original_max_position_embeddings", static_cast<double>(hp.max_position_embeddings));
      if (!orig) return orig.error();
      if (*orig <= 0) return bad("\"original_max_position_embeddings\" must be positive");
      auto factor = number("factor", static_cast<double>(hp.max_position_embeddings) / *orig);
      if (!factor) return factor.error();
      if (*factor <= 0) return bad("\"factor\" must be positive");
      auto get_mscale = [](double scale, double mscale) {
        return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
      };
      double attention = 0;
      if (rs.contains("attention_factor") && rs["attention_factor"].is_number()) {
        attention = rs["attention_factor"].get<double>();
      } else {
        auto mscale = number("mscale", 0.0), mscale_all = number("mscale_all_dim", 0.0);  // a string here threw
        if (!mscale) return mscale.error();
        if (!mscale_all) return mscale_all.error();
        attention = (*mscale != 0 && *mscale_all != 0) ? get_mscale(*factor, *mscale) / get_mscale(*factor, *mscale_all)
                                                       : get_mscale(*factor, 1.0);
      }
      const double beta_fast =
          rs.contains("beta_fast") && rs["beta_fast"].is_number() ? rs["beta_fast"].get<double>() : 32.0;
      const double beta_slow =
          rs.contains("beta_slow") && rs["beta_slow"].is_number() ? rs["beta_slow"].get<double>() : 1.0;
      const bool truncate = !rs.contains("truncate") || !rs["truncate"].is_boolean() || rs["truncate"].get<bool>();
      const double dim = r.dims_;
      auto correction_dim = [&](double rotations) {
        return dim * std::log(*orig / (rotations * 2 * std::numbers::pi)) / (2 * std::log(r.theta_));
      };
      double low = correction_dim(beta_fast), high = correction_dim(beta_slow);
      if (truncate) {
        low = std::floor(low);
        high = std::ceil(high);
      }
      low = std::max(low, 0.0);
      high = std::min(high, dim - 1);
      if (low == high) high += 0.001;
      for (std::size_t i = 0; i < inv.size(); ++i) {
        const double extrapolation = inv[i];
        const double interpolation = inv[i] / *factor;
        const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
        const double extrapolation_factor = 1 - ramp;
        inv[i] = interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor;
      }
      r.attention_scaling_ = static_cast<float>(attention);
    } else if (type == "freq_factors") {
      // llama.cpp's rope_freqs: each rotated pair's frequency divided by its factor.
      if (!rs.contains("factors") || !rs["factors"].is_array() || rs["factors"].size() != inv.size()) {
        return bad("freq_factors needs \"factors\", one per rotated pair (" + std::to_string(inv.size()) + ")");
      }
      for (std::size_t i = 0; i < inv.size(); ++i) {
        const auto& f = rs["factors"][i];
        if (!f.is_number() || !(f.get<double>() > 0) || !std::isfinite(f.get<double>())) {
          return bad("factors[" + std::to_string(i) + "] must be a finite number > 0");
        }
        inv[i] /= f.get<double>();
      }
    } else {
      return Status(StatusCode::unsupported, "manifest.json hparams.rope_scaling: rope_type '" + type +
                                                 "' is not supported (supported: " + model::rope_types_text() + ")");
    }
  }
  r.base_ = to_float(inv);
  r.current_ = r.base_;
  return r;
}

const std::vector<float>& RopeFrequencies::inv_freq(std::int64_t seq_len) {
  if (type_ != "dynamic") return base_;
  if (seq_len <= original_max_) {
    current_len_ = 0;
    current_ = base_;
    return current_;
  }
  if (seq_len != current_len_) {
    // HF dynamic NTK: base grows with the sequence once it exceeds the original context.
    const double dim = dims_;
    const double base =
        theta_ * std::pow(factor_ * static_cast<double>(seq_len) / static_cast<double>(original_max_) - (factor_ - 1),
                          dim / (dim - 2));
    current_ = to_float(default_inv_freq(base, dims_));
    current_len_ = seq_len;
  }
  return current_;
}

}  // namespace colibri::engine
