// colibri-cli perplexity --model M --file TEXT [--ctx N] [--save-logits FILE] [--kl-base FILE]
// Splits the tokenized text into chunks of --ctx tokens, runs each from an empty cache and scores every token
// after the first of its chunk. --save-logits keeps the logits of a (base) run; --kl-base compares this run with
// such a file: KL(base || this) per token and how often the top token agrees.
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "colibri/tokenizer/tokenizer.hpp"
#include "colibri/util/output_file.hpp"
#include "engine_cli.hpp"
#include "interrupt.hpp"

namespace colibri::cli::perplexity_command {
namespace {

constexpr const char* kMagic = "COLIBRI-LOGITS 1";

struct PerplexityOptions {
  EngineCliOptions engine;
  std::string file;
  std::string save_logits;
  std::string kl_base;
  std::int64_t max_chunks = 0;
};

// log-softmax of one row, in double.
void log_softmax(const float* x, std::size_t n, std::vector<double>& out) {
  out.resize(n);
  double m = -INFINITY;
  for (std::size_t i = 0; i < n; ++i) m = std::max(m, static_cast<double>(x[i]));
  double sum = 0;
  for (std::size_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(x[i]) - m);
  const double lse = m + std::log(sum);
  for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<double>(x[i]) - lse;
}

// Why a --kl-base file's header (vocab, ctx, tokens) cannot be compared with this run, or "" when it can: the same
// vocabulary and --ctx, and tokens that begin with this run's (a base saved over every chunk serves a run with
// --max-chunks).
std::string base_mismatch(const nlohmann::json& h, std::size_t vocab, std::int64_t ctx,
                          const std::vector<std::int32_t>& used) {
  const auto* v = h.is_object() && h.contains("vocab") ? &h["vocab"] : nullptr;
  const auto* c = h.is_object() && h.contains("ctx") ? &h["ctx"] : nullptr;
  const auto* t = h.is_object() && h.contains("tokens") ? &h["tokens"] : nullptr;
  if (v == nullptr || c == nullptr || t == nullptr || !v->is_number_unsigned() || !c->is_number_integer() ||
      !t->is_array()) {
    return "is not a logits file written by colibri-cli perplexity --save-logits (its header lacks vocab, ctx or "
           "tokens)";
  }
  if (v->get<std::uint64_t>() != vocab) {
    return "was saved from a model with a vocabulary of " + v->dump() + " tokens, this one has " +
           std::to_string(vocab) + "; the base must share this model's tokenizer";
  }
  if (c->get<std::int64_t>() != ctx) {
    return "was saved with --ctx " + c->dump() + ", this run's is " + std::to_string(ctx) + "; give --ctx " + c->dump();
  }
  const std::size_t common = std::min(t->size(), used.size());
  for (std::size_t i = 0; i < common; ++i) {
    if (!(*t)[i].is_number_integer() || (*t)[i].get<std::int64_t>() != used[i]) {
      return "was saved from other text (its token " + std::to_string(i) +
             " differs); re-run the base model with the same --file";
    }
  }
  if (t->size() < used.size()) {
    const auto base_chunks = static_cast<std::int64_t>(t->size()) / ctx;
    return "covers " + std::to_string(base_chunks) + " chunk" + (base_chunks == 1 ? "" : "s") + ", this run scores " +
           std::to_string(static_cast<std::int64_t>(used.size()) / ctx) + "; give --max-chunks " +
           std::to_string(base_chunks) + ", or save the base over as many";
  }
  return "";
}

int run_perplexity(const GlobalOptions& global, PerplexityOptions& o) {
  const bool ctx_given = o.engine.ctx != 0;
  if (!ctx_given) o.engine.ctx = 512;
  if (o.engine.ctx < 2) {
    return usage_fail("--ctx " + std::to_string(o.engine.ctx) +
                      ": a chunk needs 2 tokens to score one; give 2 or more (0 or unset: 512)");
  }
  if (std::filesystem::is_directory(o.file)) return fail("--file " + o.file + " is a directory; give a text file");
  std::ifstream in(o.file, std::ios::binary);
  if (!in) return fail("cannot read --file " + o.file + ": " + std::strerror(errno));
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return fail("--file " + o.file + ": reading failed");
  warn_if_not_utf8("--file " + o.file, ss.view(), ", which changes the perplexity");
  auto opened = open_engine(global, o.engine, nullptr, [&](const std::filesystem::path& dir, const model::Manifest* m) {
    // The default chunk is 512 tokens, or the model's whole context where that is shorter: only a --ctx the user
    // gave is refused for exceeding it (open_engine reads o.engine.ctx after this).
    if (!ctx_given && m != nullptr) {
      o.engine.ctx = std::min<std::int64_t>(o.engine.ctx, m->hparams.max_position_embeddings);
    }
    return overwrite_error("--save-logits", o.save_logits,
                           {{"--model", dir.string()}, {"--file", o.file}, {"--kl-base", o.kl_base}});
  });
  if (!opened.engine) return opened.exit_code;
  auto& engine = opened.engine;
  auto tok = tokenizer::Tokenizer::from_file(engine->model_dir());
  if (!tok) return fail(tok.error().message());
  const auto ids = tok->encode(ss.str(), false);
  const auto ctx = engine->context();
  std::int64_t chunks = static_cast<std::int64_t>(ids.size()) / ctx;
  if (o.max_chunks > 0) chunks = std::min(chunks, o.max_chunks);
  if (chunks == 0) {
    return fail(o.file + " has " + std::to_string(ids.size()) + " tokens, fewer than one chunk of --ctx " +
                std::to_string(ctx) + "; lower --ctx or give more text");
  }
  const auto V = static_cast<std::size_t>(engine->vocab_size());
  const std::vector<std::int32_t> used(ids.begin(), ids.begin() + chunks * ctx);
  const nlohmann::json header = {{"vocab", V}, {"ctx", ctx}, {"tokens", used}};

  std::ifstream base;
  bool base_longer = false;  // saved over more chunks than --max-chunks lets this run score: their first ones compared
  if (!o.kl_base.empty()) {
    base.open(o.kl_base, std::ios::binary);
    if (!base) return fail("cannot read --kl-base " + o.kl_base + ": " + std::strerror(errno));
    std::string magic, line;
    std::getline(base, magic);
    std::getline(base, line);
    const auto h = nlohmann::json::parse(line, nullptr, false);
    if (magic != kMagic || h.is_discarded()) {
      return fail(o.kl_base + " is not a logits file written by colibri-cli perplexity --save-logits");
    }
    if (auto why = base_mismatch(h, V, ctx, used); !why.empty()) return fail(o.kl_base + " " + why);
    base_longer = h["tokens"].size() > used.size();
  }
  std::optional<util::OutputFile> save;  // a failed run leaves no half-written file and the old one as it was
  if (!o.save_logits.empty()) {
    auto f = util::OutputFile::open(o.save_logits);
    if (!f) return fail("--save-logits: " + f.error().message());
    save.emplace(std::move(*f));
    save->stream() << kMagic << "\n" << header.dump() << "\n";
  }
  double nll = 0, kl_sum = 0, kl_max = 0;
  std::int64_t scored = 0, agree = 0;
  std::vector<float> logits, base_row(V);
  std::vector<double> lp, lq;
  const bool tty = ::isatty(STDERR_FILENO) != 0;
  const auto t0 = std::chrono::steady_clock::now();
  interrupt::Interruptible interruptible;  // Ctrl-C: the chunks scored so far are reported, nothing is saved
  std::int64_t done = 0;
  for (std::int64_t c = 0; c < chunks && !interrupt::stop_requested(); ++c, ++done) {
    engine->reset();
    const std::span<const std::int32_t> chunk(used.data() + c * ctx, static_cast<std::size_t>(ctx));
    if (auto s = engine->forward(chunk, engine::LogitsWanted::all, logits); !s) return fail(s.message());
    for (std::int64_t i = 0; i + 1 < ctx; ++i) {
      const float* row = logits.data() + static_cast<std::size_t>(i) * V;
      log_softmax(row, V, lq);
      nll -= lq[static_cast<std::size_t>(chunk[static_cast<std::size_t>(i + 1)])];
      ++scored;
      if (save) save->stream().write(reinterpret_cast<const char*>(row), static_cast<std::streamsize>(V * 4));
      if (base.is_open()) {
        if (!base.read(reinterpret_cast<char*>(base_row.data()), static_cast<std::streamsize>(V * 4))) {
          return fail(o.kl_base + " is truncated; re-run the base model with --save-logits");
        }
        log_softmax(base_row.data(), V, lp);
        double kl = 0;
        for (std::size_t v = 0; v < V; ++v) kl += std::exp(lp[v]) * (lp[v] - lq[v]);
        kl_sum += kl;
        kl_max = std::max(kl_max, kl);
        agree +=
            std::max_element(lp.begin(), lp.end()) - lp.begin() == std::max_element(lq.begin(), lq.end()) - lq.begin();
      }
    }
    if (tty)
      std::cerr << "\rchunk " << c + 1 << "/" << chunks << ": perplexity so far " << std::exp(nll / scored)
                << std::flush;
  }
  if (tty) std::cerr << "\n";
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (done < chunks) {
    if (scored > 0) {
      std::printf("interrupted after %lld of %lld chunks: perplexity %.4f over %lld tokens%s\n",
                  static_cast<long long>(done), static_cast<long long>(chunks), std::exp(nll / scored),
                  static_cast<long long>(scored), save ? " (--save-logits not written)" : "");
    }
    return 130;
  }
  if (base.is_open() && !base_longer && base.peek() != std::char_traits<char>::eof()) {
    return fail(o.kl_base + " holds more logits than this run scored; it was not saved from this --file and --ctx");
  }
  if (save) {
    if (auto s = save->commit(); !s) return fail("--save-logits: " + s.message());
  }
  std::printf("perplexity %.4f over %lld tokens (%lld %s of %lld, %.1f tok/s)\n", std::exp(nll / scored),
              static_cast<long long>(scored), static_cast<long long>(chunks), chunks == 1 ? "chunk" : "chunks",
              static_cast<long long>(ctx), static_cast<double>(chunks * ctx) / secs);
  if (base.is_open()) {
    std::printf("KL(base || this) mean %.6f max %.6f, top-1 agreement %.2f%%\n", kl_sum / scored, kl_max,
                100.0 * static_cast<double>(agree) / static_cast<double>(scored));
  }
  return 0;
}

void setup(CLI::App& app, GlobalOptions& global) {
  auto o = std::make_shared<PerplexityOptions>();
  auto* cmd = app.add_subcommand("perplexity", "Perplexity of a text file; KL divergence against a saved base run");
  add_engine_options(*cmd, o->engine, global);
  if (auto* ctx = cmd->get_option_no_throw("--ctx")) {
    ctx->description("Tokens per scored chunk (default 512)");
    ctx->get_validator(apps::kContextLengthCheck)->active(false);  // its "0 for the model's context" is not this --ctx
  }
  cmd->add_option("--file,-f", o->file, "UTF-8 text to score")->required();
  cmd->add_option("--max-chunks", o->max_chunks, "Score at most this many chunks (0: all)")
      ->check(apps::integer_at_least(0, "give 0 (all) or more"));
  cmd->add_option("--save-logits", o->save_logits, "Save this run's logits (to compare quantized runs against)");
  cmd->add_option("--kl-base", o->kl_base, "Logits saved by --save-logits from the base model: report KL divergence");
  cmd->callback([&global, o] { global.exit_code = run_perplexity(global, *o); });
}

}  // namespace

COLIBRI_CLI_COMMAND(43, setup);

}  // namespace colibri::cli::perplexity_command
