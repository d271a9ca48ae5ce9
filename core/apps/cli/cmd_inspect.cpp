// colibri-cli inspect MODEL [--verify] [--json]
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "colibri/model/manifest.hpp"
#include "colibri/model/paths.hpp"
#include "colibri/model/verify.hpp"
#include "command.hpp"

namespace colibri::cli::inspect_command {
namespace {

struct InspectOptions {
  std::string model;
  bool verify = false;
  bool json = false;
  std::string models_dir;
};

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", b, units[u]);
  return buf;
}

// manifest.json's "quantization" is informational (what convert was asked for): shown, never trusted to be well-formed.
std::string quantization_preset(const nlohmann::json& q) {
  if (!q.is_object()) return "?";
  const auto it = q.find("preset");
  return it != q.end() && it->is_string() ? it->get<std::string>() : "?";
}

std::string human_count(std::uint64_t n) {
  char buf[32];
  if (n >= 1000000000ull) {
    std::snprintf(buf, sizeof buf, "%.2fB", static_cast<double>(n) / 1e9);
  } else if (n >= 1000000ull) {
    std::snprintf(buf, sizeof buf, "%.2fM", static_cast<double>(n) / 1e6);
  } else {
    std::snprintf(buf, sizeof buf, "%llu", static_cast<unsigned long long>(n));
  }
  return buf;
}

int run_inspect(const GlobalOptions& global, const InspectOptions& o) {
  std::filesystem::path models_dir = o.models_dir;
  if (models_dir.empty()) {
    if (auto prof = global.load_profile()) models_dir = prof->get_string("models.dir");
  }
  auto dir = model::resolve_model_path(o.model, models_dir);
  if (!dir) return fail(dir.error().message());
  auto m = model::load_manifest(*dir);
  model::VerifyReport report;
  if (o.verify) {
    const bool tty = ::isatty(STDERR_FILENO) && !o.json;
    report = model::verify_model(*dir, [tty](std::uint64_t done, std::uint64_t total) {
      if (tty)
        std::fprintf(stderr, "\rverifying %5.1f%%",
                     total ? 100.0 * static_cast<double>(done) / static_cast<double>(total) : 100.0);
    });
    if (tty) std::fprintf(stderr, "\n");
  }
  if (!m && !(o.verify && report.manifest_ok)) {
    if (o.json) {
      nlohmann::json out = {{"model", dir->string()}, {"ok", false}, {"error", m.error().message()}};
      if (o.verify) {
        out["problems"] = nlohmann::json::array();
        for (const auto& p : report.problems) out["problems"].push_back(p.message);
      }
      std::cout << out.dump(2) << "\n";
      return 1;
    }
    if (o.verify && !report.problems.empty()) {
      for (const auto& p : report.problems) std::cout << "problem: " << p.message << "\n";
      return fail(std::to_string(report.problems.size()) + " problem(s), listed above");
    }
    // Without --verify only the first problem is known: say how to list them all.
    const bool unconverted = m.error().message().find("is a HuggingFace checkpoint") != std::string::npos;
    return fail(m.error().message() + (o.verify || unconverted
                                           ? ""
                                           : "\n  colibri-cli inspect " + o.model + " --verify lists every problem"));
  }
  model::Manifest man;
  if (m) {
    man = std::move(*m);
  } else {
    // The manifest parses but a file is missing or truncated: verify lists each; show the model anyway.
    auto text = std::string{};
    FILE* f = std::fopen((*dir / "manifest.json").c_str(), "rb");
    if (f != nullptr) {
      char buf[65536];
      std::size_t n;
      while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, n);
      std::fclose(f);
    }
    auto parsed = model::parse_manifest(nlohmann::json::parse(text, nullptr, false), "manifest.json");
    if (!parsed) return fail(parsed.error().message());
    man = std::move(*parsed);
  }
  const auto& hp = man.hparams;
  std::map<std::string, std::uint64_t> type_bytes;
  for (const auto& t : man.tensors) type_bytes[std::string(sdk::to_string(t.type))] += t.size;
  for (const auto& e : man.experts) {
    for (const auto* p : e.parts()) type_bytes[std::string(sdk::to_string(p->type))] += p->size;
  }
  std::uint64_t largest = 0;
  for (const auto& e : man.experts) largest = std::max(largest, e.size);
  const std::size_t file_count = man.files.size() + man.tokenizer_files.size() + 1;
  const bool ok = !o.verify || report.ok();
  if (o.json) {
    nlohmann::json out;
    out["model"] = dir->string();
    out["architecture"] = hp.architecture;
    out["hparams"] = hp.to_json();
    out["params_total"] = man.total_params();
    out["params_active_per_token"] = man.active_params();
    out["experts"] = {{"count", man.experts.size()},
                      {"per_layer", hp.n_experts},
                      {"top_k", hp.n_experts_per_tok},
                      {"bytes", man.expert_bytes()},
                      {"bytes_per_expert", largest}};  // the largest: layers may mix block types
    out["resident_bytes"] = man.resident_bytes();
    out["bytes_per_token_all_miss"] = man.bytes_per_token_all_miss();
    out["quantization"] = man.quantization;
    out["types_bytes"] = type_bytes;
    out["files"] = file_count;
    if (o.verify) {
      out["verify"] = {
          {"ok", report.ok()}, {"files_checked", report.files_checked}, {"bytes_hashed", report.bytes_hashed}};
      out["verify"]["problems"] = nlohmann::json::array();
      for (const auto& p : report.problems) {
        out["verify"]["problems"].push_back(
            {{"file", p.file}, {"location", p.location}, {"kind", p.kind}, {"message", p.message}});
      }
    }
    std::cout << out.dump(2) << "\n";
    return ok ? 0 : 1;
  }
  std::cout << "model:         " << dir->string() << "\n"
            << "architecture:  " << hp.architecture
            << (hp.hf_architecture.empty() ? "" : " (" + hp.hf_architecture + ")") << "\n"
            << "layers:        " << hp.num_layers << ", hidden " << hp.hidden_size << ", heads " << hp.num_heads << "/"
            << hp.num_kv_heads << " (q/kv), head_dim " << hp.head_dim << ", vocab " << hp.vocab_size << "\n"
            << "parameters:    " << human_count(man.total_params()) << " total, " << human_count(man.active_params())
            << " active per token\n";
  std::cout << "attention:     context " << hp.max_position_embeddings;
  if (hp.sliding_window > 0) {
    std::int64_t sliding = 0;
    for (std::int64_t l = 0; l < hp.num_layers; ++l) sliding += hp.layer_window(l) > 0 ? 1 : 0;
    std::cout << ", sliding window " << hp.sliding_window << " on " << sliding << " of " << hp.num_layers
              << " layers (their KV keeps only the window's rows: memory.kv_sliding_window)";
  }
  if (hp.rope_dims() != hp.head_dim) std::cout << ", rope on " << hp.rope_dims() << " of " << hp.head_dim << " dims";
  if (hp.attention_chunk > 0) {
    std::cout << ", within chunks of " << hp.attention_chunk << " on " << hp.chunked_layers.size() << " of "
              << hp.num_layers << " layers";
  }
  if (!hp.nope_layers.empty()) {
    std::cout << ", no rope on " << hp.nope_layers.size() << " layer" << (hp.nope_layers.size() > 1 ? "s" : "");
    if (hp.attn_temperature_floor > 0) {
      std::cout << " (their queries scaled from position " << hp.attn_temperature_floor - 1 << " on)";
    }
  }
  if (hp.qk_norm == "l2") std::cout << ", q/k RMS-normalized after rope";
  if (hp.attn_output_gate) std::cout << ", output gated";
  if (!hp.linear_layers.empty()) {
    // What the KV cache holds instead of rows on those layers: one fixed state per sequence.
    std::cout << "; linear attention (gated delta rule) on " << hp.linear_layers.size() << " of " << hp.num_layers
              << " layers: " << hp.linear_k_heads << " key / " << hp.linear_v_heads << " value heads of "
              << hp.linear_k_dim << " / " << hp.linear_v_dim << ", a state of "
              << human_bytes(static_cast<double>(hp.linear_state_floats()) * 4)
              << " per layer and sequence, no KV rows";
  }
  if (hp.mla()) {
    // What the KV cache holds per token and layer: one row of the latent and the RoPE key, not a row per head.
    std::cout << "; multi-head latent: keys and values from a latent of " << hp.kv_lora_rank
              << (hp.q_lora_rank > 0 ? ", queries from one of " + std::to_string(hp.q_lora_rank) : "") << ", values of "
              << hp.v_head_dim << " per head; the KV cache holds " << hp.mla_cache_dim()
              << " values per token and layer";
  }
  std::cout << "\n";
  if (hp.dense) {
    std::cout << "experts:       dense FFN (one always-selected expert per layer), "
              << human_bytes(static_cast<double>(largest)) << " per layer\n";
  } else {
    std::int64_t sparse = 0;
    for (std::int64_t l = 0; l < hp.num_layers; ++l) sparse += hp.layer_is_sparse(l) ? 1 : 0;
    std::cout << "experts:       " << man.experts.size() << " (" << hp.n_experts << " per layer, top-"
              << hp.n_experts_per_tok;
    // Dense layers (GLM's first ones, Qwen's mlp_only_layers) keep their FFN as one expert: say which is which.
    if (sparse < hp.num_layers) {
      std::cout << ", in " << sparse << " MoE layers; " << hp.num_layers - sparse << " dense layer"
                << (hp.num_layers - sparse > 1 ? "s" : "") << " of one";
    }
    if (hp.shared_expert_intermediate_size > 0) std::cout << "; a shared expert per MoE layer";
    std::cout << "), up to " << human_bytes(static_cast<double>(largest)) << " each, "
              << human_bytes(static_cast<double>(man.expert_bytes())) << " in all\n";
    if (hp.router_scoring != "softmax" || hp.router_selection_bias || hp.routed_scaling_factor != 1.0 ||
        hp.grouped_routing()) {
      std::cout << "router:        " << hp.router_scoring << " scores"
                << (hp.router_selection_bias ? ", experts picked with a learned bias" : "");
      if (hp.grouped_routing()) {
        std::cout << " within the best " << hp.router_groups_used << " of " << hp.router_groups << " groups (a group's"
                  << (hp.router_group_score == "max" ? " best score)" : " best two scores)");
      }
      std::cout << (hp.norm_topk_prob ? ", weights renormalized" : "");
      if (hp.routed_scaling_factor != 1.0) std::cout << ", x" << hp.routed_scaling_factor;
      if (hp.router_weight_on_input) std::cout << ", the weight scales the expert's input";
      std::cout << "\n";
    }
  }
  std::cout << "resident:      " << human_bytes(static_cast<double>(man.resident_bytes())) << " (shared.bin)\n"
            << "read/token:    " << human_bytes(static_cast<double>(man.bytes_per_token_all_miss()))
            << " if every expert misses the cache\n"
            << "quantization:  " << quantization_preset(man.quantization) << ":";
  for (const auto& [t, b] : type_bytes) std::cout << " " << t << " " << human_bytes(static_cast<double>(b));
  std::cout << "\n";
  if (man.quantization.is_object() && man.quantization.contains("fallbacks") &&
      man.quantization["fallbacks"].is_array() && !man.quantization["fallbacks"].empty()) {
    std::cout << "fallbacks:     " << man.quantization["fallbacks"].size() << " tensors kept another type\n";
  }
  if (const auto& t = man.tokenizer; t.is_object() && t.contains("source") && t["source"].is_string()) {
    // Where the tokenizer.json came from: the checkpoint's own, or rebuilt (a GGUF's vocabulary, a tiktoken file).
    const auto field = [&](const char* key) {
      return t.contains(key) && t[key].is_string() ? t[key].get<std::string>() : "";
    };
    const std::string source = t["source"].get<std::string>();
    std::cout << "tokenizer:     ";
    if (source == "tiktoken") {
      const std::string file = field("file").empty() ? "tiktoken.model" : field("file");  // before 7 Dec: Kimi's
      std::cout << "rebuilt from " << file << " (" << field("family") << "'s split, " << field("code") << ")\n";
    } else if (source == "gguf") {
      std::cout << "rebuilt from the GGUF's vocabulary (" << field("model") << ")\n";
    } else {
      std::cout << "the checkpoint's tokenizer.json\n";
    }
  }
  std::cout << "files:         " << file_count << " (manifest.json and the " << file_count - 1
            << " files it holds checksums of)\n";
  if (o.verify) {
    if (report.ok()) {
      std::cout << "verify:        ok (" << report.files_checked << " files, "
                << human_bytes(static_cast<double>(report.bytes_hashed)) << " hashed)\n";
    } else {
      // In the report (stdout), so that `inspect M --verify > report.txt` keeps them; the error names the count.
      std::cout << "verify:        " << report.problems.size() << " problem(s)\n";
      for (const auto& p : report.problems) std::cout << "  " << p.message << "\n";
      std::cout.flush();
      std::cerr << "error: " << report.problems.size() << " problem(s), listed in the report\n";
    }
  }
  return ok ? 0 : 1;
}

void setup(CLI::App& app, GlobalOptions& global) {
  auto o = std::make_shared<InspectOptions>();
  auto* cmd = app.add_subcommand("inspect",
                                 "Show a colibri model: architecture, parameters, experts, sizes; --verify re-hashes");
  // Positional, or -m/--model as every other command takes it.
  cmd->add_option("model,-m,--model", o->model, "Model directory or name under the models directory")->required();
  cmd->add_flag("--verify", o->verify, "Re-hash every file and report each missing, truncated or corrupt one");
  cmd->add_flag("--json", o->json, "Machine-readable output");
  cmd->add_option("--models-dir", o->models_dir, "Where model names are looked up (default: profile models.dir)");
  add_profile_selection(*cmd, global);
  cmd->callback([&global, o] { global.exit_code = run_inspect(global, *o); });
}

}  // namespace

COLIBRI_CLI_COMMAND(41, setup);

}  // namespace colibri::cli::inspect_command
