// End-to-end tests of the converter on tiny generated checkpoints of every supported architecture.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "colibri/model/convert.hpp"
#include "colibri/model/gguf.hpp"
#include "colibri/model/manifest.hpp"
#include "colibri/model/paths.hpp"
#include "colibri/model/safetensors.hpp"
#include "colibri/model/verify.hpp"

namespace fs = std::filesystem;
using nlohmann::json;
using namespace colibri::model;

namespace {

// Paths with a space and CJK characters everywhere, on purpose.
const fs::path kWork = fs::path(COLIBRI_TEST_WORK_DIR) / "模型 work";
const std::vector<std::string> kArchs = {
    "mixtral",      "qwen2_moe",     "qwen3_moe",    "olmoe",       "llama",       "mistral",    "gpt_oss",
    "glm4_moe",     "minimax_m2",    "ernie4_5_moe", "deepseek_v2", "deepseek_v3", "dots1",      "bailing_moe_v2",
    "qwen3_vl_moe", "glm4_moe_lite", "qwen3_next",   "qwen3_5_moe", "qwen3_5",     "hunyuan_moe"};

std::string quote(const fs::path& p) {
  return "'" + p.string() + "'";
}

int run(const std::string& cmd) {
  int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

// Runs the fixture generator once per (name, args). ctest -j runs the cases as parallel processes
// sharing these fixtures, so each is written under a private name and renamed into place: nobody
// reads a half-written one (the generator is deterministic, so whichever copy lands is the same).
fs::path fixture(const std::string& name, const std::string& args, bool with_gguf = true) {
  const fs::path dir = kWork / "fixtures" / name;
  if (fs::exists(dir / "config.json")) return dir;
  fs::create_directories(dir.parent_path());
  const fs::path tmp = kWork / "fixtures" / (name + ".tmp-" + std::to_string(::getpid()));
  const fs::path tmp_gguf = tmp.string() + ".gguf";
  fs::remove_all(tmp);
  fs::remove(tmp_gguf);
  std::string cmd = std::string(COLIBRI_TEST_PYTHON) + " " +
                    quote(fs::path(COLIBRI_TEST_SOURCE_DIR) / "tests/fixtures/make_tiny_model.py") + " --out " +
                    quote(tmp) + " " + args;
  if (with_gguf) cmd += " --gguf " + quote(tmp_gguf);
  cmd += " 2>/dev/null";
  EXPECT_EQ(run(cmd), 0) << cmd;
  std::error_code ec;
  if (with_gguf) fs::rename(tmp_gguf, dir.string() + ".gguf", ec);  // before the directory: its presence means done
  fs::rename(tmp, dir, ec);  // fails when another process got there first; its copy is complete
  if (ec) fs::remove_all(tmp);
  return dir;
}

fs::path fresh_output(const std::string& name) {
  const fs::path p = kWork / "out" / name;
  fs::remove_all(p);
  fs::create_directories(p.parent_path());
  return p;
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

ConvertSummary convert_ok(const fs::path& in, const fs::path& out, const std::string& preset, bool split = true) {
  ConvertOptions o;
  o.input = in;
  o.output = out;
  o.preset = preset;
  o.threads = 2;
  o.split_experts = split;
  auto r = convert_model(o);
  EXPECT_TRUE(r.has_value()) << (r ? "" : r.error().to_string());
  return r ? *r : ConvertSummary{};
}

// No hidden "<name>.colibri-partial-*" sibling may be left behind.
bool partial_left(const fs::path& out) {
  for (const auto& e : fs::directory_iterator(out.parent_path())) {
    if (e.path().filename().string().find(out.filename().string() + ".colibri-partial") != std::string::npos)
      return true;
  }
  return false;
}

void expect_identical_models(const fs::path& a, const fs::path& b) {
  auto ma = load_manifest(a), mb = load_manifest(b);
  ASSERT_TRUE(ma.has_value()) << ma.error().to_string();
  ASSERT_TRUE(mb.has_value()) << mb.error().to_string();
  ASSERT_EQ(ma->files.size(), mb->files.size());
  for (std::size_t i = 0; i < ma->files.size(); ++i) {
    EXPECT_EQ(ma->files[i].path, mb->files[i].path);
    EXPECT_EQ(ma->files[i].checksum, mb->files[i].checksum) << ma->files[i].path << " differs";
    EXPECT_EQ(slurp(a / ma->files[i].path), slurp(b / mb->files[i].path)) << ma->files[i].path;
  }
  ASSERT_EQ(ma->tensors.size(), mb->tensors.size());
  for (std::size_t i = 0; i < ma->tensors.size(); ++i) {
    EXPECT_EQ(ma->tensors[i].name, mb->tensors[i].name);
    EXPECT_EQ(ma->tensors[i].type, mb->tensors[i].type) << ma->tensors[i].name;
    EXPECT_EQ(ma->tensors[i].checksum, mb->tensors[i].checksum) << ma->tensors[i].name;
  }
}

class ArchTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ArchTest, SafetensorsAndGgufOfTheSameWeightsGiveIdenticalBlobs) {
  const std::string arch = GetParam();
  // bf16 checkpoint (2 shards + index) and a bf16 GGUF; the GGUF's llama-arch Q/K rows are permuted as llama.cpp does.
  const fs::path src = fixture(arch + "-bf16", "--arch " + arch + " --dtype bf16 --shards 2");
  const fs::path from_st = fresh_output(arch + " from st"), from_gguf = fresh_output(arch + " from gguf");
  auto s1 = convert_ok(src, from_st, "bf16");
  auto s2 = convert_ok(src.string() + ".gguf", from_gguf, "bf16");
  EXPECT_GT(s1.experts, 0u);
  EXPECT_TRUE(s1.fallbacks.empty());
  expect_identical_models(from_st, from_gguf);
  EXPECT_TRUE(verify_model(from_st).ok());
  EXPECT_TRUE(verify_model(from_gguf).ok());
}

// An output whose parent directories do not exist yet (a fresh install's models directory) is made inside them.
TEST(ConvertOutput, MissingParentDirectoriesAreMade) {
  const fs::path src = fixture("mixtral-bf16", "--arch mixtral --dtype bf16 --shards 2");
  const fs::path root = kWork / "fresh home";
  fs::remove_all(root);
  const fs::path out = root / "colibri" / "models" / "mixtral";
  convert_ok(src, out, "q8_0");
  EXPECT_TRUE(verify_model(out).ok());
  // A parent that is a file is named, and nothing is made.
  std::ofstream(root / "file") << "x";
  ConvertOptions o;
  o.input = src;
  o.output = root / "file" / "m";
  o.preset = "q8_0";
  auto r = convert_model(o);
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.error().message().find("file"), std::string::npos) << r.error().message();
}

// A GGUF split by llama-gguf-split (here its layout written by tests/fixtures/split_gguf.py) converts from any of
// its parts into the model its whole file gives, the first part holding tensors or not.
TEST(GgufConvert, ASplitGgufConvertsAsTheWholeFile) {
  const fs::path src = fixture("mixtral-bf16", "--arch mixtral --dtype bf16 --shards 2");
  const fs::path whole = fresh_output("mixtral split whole");
  convert_ok(src.string() + ".gguf", whole, "q8_0");
  for (const bool empty_first : {false, true}) {
    const fs::path dir = kWork / "split" / (empty_first ? "empty first" : "plain");
    fs::remove_all(dir);
    fs::create_directories(dir);
    const std::string cmd = std::string(COLIBRI_TEST_PYTHON) + " " +
                            quote(fs::path(COLIBRI_TEST_SOURCE_DIR) / "tests/fixtures/split_gguf.py") + " " +
                            quote(src.string() + ".gguf") + " " + quote(dir / "mixtral") + " --parts 3" +
                            (empty_first ? " --no-tensor-first-split" : "");
    ASSERT_EQ(run(cmd), 0) << cmd;
    const fs::path out = fresh_output(std::string("mixtral split ") + (empty_first ? "empty first" : "plain"));
    convert_ok(dir / "mixtral-00002-of-00003.gguf", out, "q8_0");
    expect_identical_models(whole, out);
    auto m = load_manifest(out);
    ASSERT_TRUE(m.has_value());
    EXPECT_EQ(m->source.value("parts", 0), 3);
    EXPECT_EQ(m->source.value("path", ""), (dir / "mixtral-00001-of-00003.gguf").string());
  }
}

TEST_P(ArchTest, QuantizingTheSameFloatsFromEitherSourceIsIdentical) {
  const std::string arch = GetParam();
  const fs::path src = fixture(arch + "-f32", "--arch " + arch + " --dtype f32");
  const fs::path a = fresh_output(arch + " q8 st"), b = fresh_output(arch + " q8 gguf");
  convert_ok(src, a, "q8_0");
  convert_ok(src.string() + ".gguf", b, "q8_0");
  expect_identical_models(a, b);
}

TEST_P(ArchTest, ManifestCarriesTheConfigHyperParameters) {
  const std::string arch = GetParam();
  const fs::path src = fixture(arch + "-bf16", "--arch " + arch + " --dtype bf16 --shards 2");
  const fs::path out = fresh_output(arch + " hp");
  convert_ok(src, out, "f16");
  auto m = load_manifest(out);
  ASSERT_TRUE(m.has_value()) << m.error().to_string();
  json cfg = json::parse(slurp(src / "config.json"));
  if (cfg.contains("text_config")) {  // an image-text checkpoint: its language model's fields
    json text = cfg["text_config"];
    text["architectures"] = cfg["architectures"];
    for (const char* key : {"tie_word_embeddings", "bos_token_id", "eos_token_id"}) {
      if (!text.contains(key) && cfg.contains(key)) text[key] = cfg[key];
    }
    cfg = text;
  }
  // transformers >= 4.56 (Qwen3.5's config) keeps rope_theta in rope_parameters.
  if (!cfg.contains("rope_theta")) cfg["rope_theta"] = cfg["rope_parameters"]["rope_theta"];
  // Hunyuan's NTK-alpha RoPE: the base x alpha^(d / (d - 2)).
  if (arch == "hunyuan_moe") {
    const double d = cfg["attention_head_dim"].get<double>();
    cfg["rope_theta"] =
        cfg["rope_theta"].get<double>() * std::pow(cfg["rope_scaling"]["alpha"].get<double>(), d / (d - 2));
  }
  const auto& h = m->hparams;
  EXPECT_EQ(h.architecture, arch == "glm4_moe_lite" ? "deepseek_v3" : arch);  // GLM-4.7-Flash runs as DeepSeek-V3
  EXPECT_EQ(h.hf_architecture, cfg["architectures"][0]);
  EXPECT_EQ(h.hidden_size, cfg["hidden_size"]);
  EXPECT_EQ(h.num_layers, cfg["num_hidden_layers"]);
  EXPECT_EQ(h.num_heads, cfg["num_attention_heads"]);
  EXPECT_EQ(h.num_kv_heads, cfg["num_key_value_heads"]);
  EXPECT_EQ(h.vocab_size, cfg["vocab_size"]);
  EXPECT_DOUBLE_EQ(h.rope_theta, cfg["rope_theta"].get<double>());
  EXPECT_DOUBLE_EQ(h.rms_norm_eps, cfg["rms_norm_eps"].get<double>());
  EXPECT_EQ(h.tie_word_embeddings, cfg["tie_word_embeddings"].get<bool>());
  EXPECT_EQ(h.bos_token_id, cfg["bos_token_id"]);
  EXPECT_EQ(m->tensor("output.weight") == nullptr, h.tie_word_embeddings);
  std::size_t experts = 0;
  for (std::int64_t l = 0; l < h.num_layers; ++l) experts += static_cast<std::size_t>(h.layer_experts(l));
  EXPECT_EQ(m->experts.size(), experts);
  if (arch == "llama" || arch == "mistral") {
    EXPECT_TRUE(h.dense);
    EXPECT_EQ(m->experts.size(), static_cast<std::size_t>(h.num_layers));  // one always-selected expert per layer
    EXPECT_EQ(m->experts[0].gate.shape, (std::vector<std::int64_t>{cfg["intermediate_size"], cfg["hidden_size"]}));
  }
  if (arch == "llama") {
    EXPECT_EQ(h.rope_scaling["rope_type"], "llama3");
  }
  if (arch == "mistral") {
    EXPECT_EQ(h.sliding_window, cfg["sliding_window"]);
  }
  if (arch == "mixtral") {
    EXPECT_EQ(h.n_experts, cfg["num_local_experts"]);
    EXPECT_TRUE(h.norm_topk_prob);
  }
  if (arch == "qwen2_moe") {
    EXPECT_TRUE(h.attention_qkv_bias);
    EXPECT_NE(m->tensor("blk.0.attn_q.bias"), nullptr);
    EXPECT_NE(m->tensor("blk.0.ffn_gate_inp_shexp.weight"), nullptr);
    EXPECT_EQ(h.shared_expert_intermediate_size, cfg["shared_expert_intermediate_size"]);
    EXPECT_EQ(h.mlp_only_layers, (std::vector<std::int64_t>{1}));
    EXPECT_FALSE(h.layer_is_sparse(1));
    EXPECT_NE(m->expert(1, 0), nullptr);
    EXPECT_EQ(m->expert(1, 1), nullptr);  // the dense layer has a single expert
    EXPECT_EQ(m->expert(1, 0)->gate.shape[0], cfg["intermediate_size"]);
    EXPECT_EQ(m->expert(0, 0)->gate.shape[0], cfg["moe_intermediate_size"]);
  }
  if (arch == "qwen3_moe") {
    EXPECT_EQ(h.qk_norm, "per_head");
    EXPECT_EQ(m->tensor("blk.0.attn_q_norm.weight")->shape, (std::vector<std::int64_t>{h.head_dim}));
  }
  if (arch == "gpt_oss") {
    EXPECT_EQ(h.sliding_window, cfg["sliding_window"]);
    EXPECT_EQ(h.sliding_layers, (std::vector<std::int64_t>{0, 2}));  // layer_types: sliding, full, sliding
    EXPECT_DOUBLE_EQ(h.swiglu_limit, cfg["swiglu_limit"].get<double>());
    EXPECT_TRUE(h.norm_topk_prob);
    EXPECT_EQ(h.rope_scaling["truncate"], false);
  }
  if (arch == "olmoe") {
    EXPECT_EQ(h.qk_norm, "full");
    EXPECT_EQ(m->tensor("blk.0.attn_q_norm.weight")->shape, (std::vector<std::int64_t>{h.num_heads * h.head_dim}));
  }
  // Blobs: 4 KiB aligned, gate/up/down back to back in one range.
  for (const auto& e : m->experts) {
    EXPECT_EQ(e.offset % kBlobAlignment, 0u);
    EXPECT_EQ(e.size % kBlobAlignment, 0u);
    EXPECT_LT(e.gate.offset, e.up.offset);
    EXPECT_LT(e.up.offset, e.down.offset);
    EXPECT_LE(e.down.offset + e.down.size, e.offset + e.size);
  }
  for (const auto& t : m->tensors) {
    if (t.shape.size() == 1 || t.name.find("ffn_gate_inp") != std::string::npos) {
      EXPECT_EQ(t.type, colibri::sdk::DType::f32) << t.name;  // norms, biases, routers stay f32
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllArchitectures, ArchTest, ::testing::ValuesIn(kArchs));

TEST(ModelConvert, GgufTokenizerIsRebuiltWithTheSameVocabAndMerges) {
  const fs::path src = fixture("mixtral-bf16", "--arch mixtral --dtype bf16 --shards 2");
  const fs::path out = fresh_output("tok from gguf");
  convert_ok(src.string() + ".gguf", out, "bf16");
  const json orig = json::parse(slurp(src / "tokenizer.json")), rebuilt = json::parse(slurp(out / "tokenizer.json"));
  for (const auto& [tok, id] : orig["model"]["vocab"].items()) EXPECT_EQ(rebuilt["model"]["vocab"][tok], id) << tok;
  EXPECT_EQ(rebuilt["model"]["merges"], orig["model"]["merges"]);
  EXPECT_EQ(rebuilt["model"]["type"], "BPE");
  const json cfg = json::parse(slurp(out / "tokenizer_config.json"));
  EXPECT_EQ(cfg["bos_token"], "<|begin_of_text|>");
  auto m = load_manifest(out);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->tokenizer["source"], "gguf");
}

TEST(ModelConvert, VerifyNamesEachMissingTruncatedOrCorruptFile) {
  const fs::path src = fixture("mixtral-bf16", "--arch mixtral --dtype bf16 --shards 2");
  const fs::path out = fresh_output("verify me");
  convert_ok(src, out, "f16");
  ASSERT_TRUE(verify_model(out).ok());
  {  // flip one byte of L1/E2
    std::fstream f(out / "experts/L001/E002.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    char c = 0;
    f.read(&c, 1);
    f.seekp(100);
    c = static_cast<char>(c ^ 0x5a);
    f.write(&c, 1);
  }
  fs::resize_file(out / "experts/L000/E001.bin", 4096);
  fs::remove(out / "experts/L001/E003.bin");
  auto r = verify_model(out);
  EXPECT_FALSE(r.ok());
  std::map<std::string, std::string> by_where;
  for (const auto& p : r.problems) by_where[p.location] = p.message;
  ASSERT_EQ(r.problems.size(), 3u);
  EXPECT_EQ(by_where["L1/E2"], "L1/E2: checksum mismatch in experts/L001/E002.bin; re-run convert");
  EXPECT_NE(by_where["L0/E1"].find("truncated"), std::string::npos);
  EXPECT_NE(by_where["L1/E3"].find("missing"), std::string::npos);
  // A run refuses the model before reading anything.
  auto m = load_manifest(out);
  ASSERT_FALSE(m.has_value());
  EXPECT_NE(m.error().message().find("re-run convert"), std::string::npos);
  // An expert file that is no regular file, has grown, or links to itself is named as what it is, not "truncated".
  const fs::path odd = fresh_output("verify odd");
  convert_ok(src, odd, "f16");
  const fs::path l0 = odd / "experts/L000";
  fs::remove(l0 / "E000.bin");
  fs::create_directory(l0 / "E000.bin");
  fs::resize_file(l0 / "E002.bin", fs::file_size(l0 / "E002.bin") + 10);
  fs::remove(l0 / "E003.bin");
  fs::create_symlink("E003.bin", l0 / "E003.bin");
  std::map<std::string, std::string> odd_by_where;
  for (const auto& p : verify_model(odd).problems) odd_by_where[p.location] = p.message;
  EXPECT_NE(odd_by_where["L0/E0"].find("E000.bin is a directory, not a file"), std::string::npos)
      << odd_by_where["L0/E0"];
  EXPECT_NE(odd_by_where["L0/E2"].find("(written to since convert?)"), std::string::npos) << odd_by_where["L0/E2"];
  EXPECT_NE(odd_by_where["L0/E3"].find("is a symbolic link that leads back to itself"), std::string::npos)
      << odd_by_where["L0/E3"];
  // A FIFO in the place of the manifest or of a tokenizer file is named, not waited on (no writer will come).
  const fs::path whole = fresh_output("verify fifo");
  convert_ok(src, whole, "f16");
  for (const char* name : {"tokenizer.json", "manifest.json"}) {
    fs::remove(whole / name);
    ASSERT_EQ(::mkfifo((whole / name).c_str(), 0600), 0);
    auto fifo = load_manifest(whole);
    ASSERT_FALSE(fifo.has_value()) << name;
    EXPECT_NE(fifo.error().message().find(name), std::string::npos) << fifo.error().message();
    EXPECT_NE(fifo.error().message().find("FIFO"), std::string::npos) << fifo.error().message();
  }
}

TEST(ModelConvert, AManifestWhoseTensorChecksumChangedFailsVerifyAsARunWould) {
  // The files are as written, but manifest.json no longer matches a tensor: a run refuses it, so verify must too.
  const fs::path src = fixture("mixtral-bf16", "--arch mixtral --dtype bf16 --shards 2");
  const fs::path out = fresh_output("manifest edited");
  convert_ok(src, out, "f16");
  auto j = json::parse(slurp(out / "manifest.json"));
  auto& part = j["experts"][3]["up"];
  std::string sum = part["xxh64"].get<std::string>();
  sum[0] = sum[0] == '0' ? '1' : '0';
  part["xxh64"] = sum;
  std::ofstream(out / "manifest.json", std::ios::binary | std::ios::trunc) << j.dump();
  auto r = verify_model(out);
  ASSERT_EQ(r.problems.size(), 1u) << (r.problems.empty() ? "" : r.problems[0].message);
  EXPECT_NE(r.problems[0].message.find("does not match its checksum in manifest.json"), std::string::npos)
      << r.problems[0].message;
}

TEST(ModelConvert, AChangedTokenizerFileIsCaughtByVerifyAndAtLoad) {
  const fs::path src = fixture("mixtral-bf16", "--arch mixtral --dtype bf16 --shards 2");
  const fs::path out = fresh_output("tokenizer edited");
  convert_ok(src, out, "f16");
  ASSERT_TRUE(verify_model(out).ok());
  ASSERT_TRUE(load_manifest(out).has_value());
  std::string text = slurp(out / "tokenizer_config.json");
  ASSERT_FALSE(text.empty());
  text.back() = text.back() == ' ' ? '\n' : ' ';  // one byte: a template edit would be as silent
  std::ofstream(out / "tokenizer_config.json", std::ios::binary | std::ios::trunc) << text;
  auto r = verify_model(out);
  ASSERT_EQ(r.problems.size(), 1u);
  EXPECT_EQ(r.problems[0].message,
            "tokenizer: checksum mismatch in tokenizer_config.json (it changed since convert); restore it or re-run "
            "convert");
  auto m = load_manifest(out);
  ASSERT_FALSE(m.has_value());
  EXPECT_NE(m.error().message().find("checksum mismatch in tokenizer_config.json"), std::string::npos);
}

struct BadCase {
  std::string name;
  std::string expect;  // substring of the error
};

void expect_clean_failure(const fs::path& input, const std::string& expect, const std::string& tag) {
  const fs::path out = fresh_output("bad " + tag);
  ConvertOptions o;
  o.input = input;
  o.output = out;
  o.preset = "f16";
  auto r = convert_model(o);
  ASSERT_FALSE(r.has_value()) << tag;
  EXPECT_NE(r.error().message().find(expect), std::string::npos) << tag << ": " << r.error().message();
  EXPECT_FALSE(fs::exists(out)) << tag;
  EXPECT_FALSE(partial_left(out)) << tag;
}

fs::path copy_fixture(const fs::path& src, const std::string& name) {
  const fs::path dst = kWork / "bad" / name;
  fs::remove_all(dst);
  fs::create_directories(dst.parent_path());
  fs::copy(src, dst, fs::copy_options::recursive);
  return dst;
}

TEST(ModelConvert, BadInputsEndInAClearErrorAndNoOutput) {
  const fs::path src = fixture("qwen3_moe-bf16", "--arch qwen3_moe --dtype bf16 --shards 2");
  {  // truncated shard
    auto d = copy_fixture(src, "truncated");
    fs::resize_file(d / "model-00002-of-00002.safetensors",
                    fs::file_size(d / "model-00002-of-00002.safetensors") - 1000);
    expect_clean_failure(d, "truncated", "truncated shard");
  }
  {  // header length past the end of the file
    auto d = copy_fixture(src, "header");
    std::fstream f(d / "model-00001-of-00002.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    const unsigned char len[8] = {0xff, 0xff, 0xff, 0x7f, 0, 0, 0, 0};
    f.write(reinterpret_cast<const char*>(len), 8);
    f.close();
    expect_clean_failure(d, "header length", "header past end");
  }
  {  // wrong dtype: a weight declared I16 (same byte size, so only the dtype is wrong)
    auto d = copy_fixture(src, "dtype");
    const fs::path shard = d / "model-00001-of-00002.safetensors";
    std::string bytes = slurp(shard);
    auto pos = bytes.find("\"BF16\"");
    ASSERT_NE(pos, std::string::npos);
    bytes.replace(pos, 6, "\"I16\" ");
    std::ofstream(shard, std::ios::binary | std::ios::trunc) << bytes;
    expect_clean_failure(d, "dtype I16", "wrong dtype");
  }
  {  // an unknown dtype name
    auto d = copy_fixture(src, "dtype2");
    const fs::path shard = d / "model-00001-of-00002.safetensors";
    std::string bytes = slurp(shard);
    auto pos = bytes.find("\"BF16\"");
    bytes.replace(pos, 6, "\"F17\" ");
    std::ofstream(shard, std::ios::binary | std::ios::trunc) << bytes;
    expect_clean_failure(d, "unknown dtype 'F17'", "unknown dtype");
  }
  {  // the config names a layer the checkpoint lacks
    auto d = copy_fixture(src, "missing tensors");
    json cfg = json::parse(slurp(d / "config.json"));
    cfg["num_hidden_layers"] = cfg["num_hidden_layers"].get<int>() + 1;
    std::ofstream(d / "config.json", std::ios::trunc) << cfg.dump(2);
    expect_clean_failure(d, "tensor 'model.layers.2.input_layernorm.weight'", "missing tensors");
  }
  for (const auto& [bits, expect] :
       {std::pair{std::uint16_t{0x7F80}, std::string("holds inf; the checkpoint is damaged")},
        std::pair{std::uint16_t{0x7E00}, std::string("holds 4.25353e+37; f16 cannot hold it")}}) {
    // one bf16 weight set to +inf, or to 2^125 (finite, but past f16): refused by tensor, row and column
    auto d = copy_fixture(src, "weight " + std::to_string(bits));
    const fs::path shard = d / "model-00001-of-00002.safetensors";
    std::string bytes = slurp(shard);
    std::uint64_t header = 0;
    std::memcpy(&header, bytes.data(), 8);
    const json h = json::parse(bytes.substr(8, header));
    std::string name;
    std::uint64_t at = 0;
    for (const auto& [key, t] : h.items()) {
      if (key != "__metadata__" && t["dtype"] == "BF16" && t["shape"].size() == 2) {
        name = key;
        at = 8 + header + t["data_offsets"][0].get<std::uint64_t>() + 2 * 3;  // row 0, column 3
        break;
      }
    }
    ASSERT_FALSE(name.empty());
    std::memcpy(bytes.data() + at, &bits, 2);
    std::ofstream(shard, std::ios::binary | std::ios::trunc) << bytes;
    expect_clean_failure(d, "row 0, column 3 " + expect, "weight " + name);
  }
  {  // a tokenizer.json colibri cannot load fails the conversion, not the first run after it
    auto d = copy_fixture(src, "tokenizer");
    json tok = json::parse(slurp(d / "tokenizer.json"));
    tok["model"]["merges"] = json::array({"zz yy"});
    std::ofstream(d / "tokenizer.json", std::ios::trunc) << tok.dump();
    expect_clean_failure(d, "the checkpoint's tokenizer: ", "bad tokenizer");
  }
  {  // an unsupported architecture is refused by name, listing the supported ones
    auto d = copy_fixture(src, "arch");
    json cfg = json::parse(slurp(d / "config.json"));
    cfg["architectures"] = {"JambaForCausalLM"};
    std::ofstream(d / "config.json", std::ios::trunc) << cfg.dump(2);
    expect_clean_failure(d,
                         "'JambaForCausalLM' is not supported; supported: BailingMoeV2ForCausalLM, "
                         "DeepseekV2ForCausalLM, DeepseekV3ForCausalLM, Dots1ForCausalLM, Ernie4_5_MoeForCausalLM, "
                         "Glm4MoeForCausalLM",
                         "arch");
  }
  {  // an eos id that is no token id is refused, not dropped (generation would never stop)
    auto d = copy_fixture(src, "eos");
    json cfg = json::parse(slurp(d / "config.json"));
    cfg["eos_token_id"] = json::array({2, "abc"});
    std::ofstream(d / "config.json", std::ios::trunc) << cfg.dump(2);
    expect_clean_failure(d, "field \"eos_token_id\" is [2,\"abc\"]; it must be a token id or a list", "eos");
  }
  {  // an eos id past the vocabulary could never be sampled: refused, naming it
    auto d = copy_fixture(src, "eos-range");
    json cfg = json::parse(slurp(d / "config.json"));
    cfg["eos_token_id"] = cfg["vocab_size"].get<std::int64_t>() + 3;
    std::ofstream(d / "config.json", std::ios::trunc) << cfg.dump(2);
    expect_clean_failure(d,
                         "eos_token_id " + std::to_string(cfg["vocab_size"].get<std::int64_t>() + 3) +
                             " is outside the vocabulary (vocab_size " + cfg["vocab_size"].dump() +
                             "); fix it in config.json",
                         "eos-range");
  }
  {  // rope_scaling written as a string is refused, not ignored (plain RoPE would answer wrong past the context)
    auto d = copy_fixture(src, "rope-string");
    json cfg = json::parse(slurp(d / "config.json"));
    cfg["rope_scaling"] = "linear";
    std::ofstream(d / "config.json", std::ios::trunc) << cfg.dump(2);
    expect_clean_failure(d, "field \"rope_scaling\" is \"linear\"; it must be an object", "rope-string");
  }
  {  // inputs of the wrong kind are named as what they are
    const fs::path odd = kWork / "bad" / "odd inputs";
    fs::remove_all(odd);
    fs::create_directories(odd / "gguf dir");
    std::ofstream(odd / "gguf dir" / "model-q4.gguf") << "GGUF";
    expect_clean_failure(odd / "gguf dir", "holds model-q4.gguf; give the .gguf file itself", "dir of a gguf");
    std::ofstream(odd / "pytorch_model.bin") << "pickle";
    expect_clean_failure(odd / "pytorch_model.bin", "looks like a PyTorch pickle", "pickle");
    fs::copy_file(src / "model-00001-of-00002.safetensors", odd / "one.safetensors");
    expect_clean_failure(odd / "one.safetensors", "is one safetensors file; give the directory", "one file");
    // An output that is a file: "--force" would not help, so it is not offered.
    std::ofstream(odd / "a file") << "mine";
    ConvertOptions o;
    o.input = src;
    o.output = odd / "a file";
    o.force = true;
    auto r = convert_model(o);
    ASSERT_FALSE(r.has_value());
    EXPECT_NE(r.error().message().find("is a file; a model is a directory"), std::string::npos) << r.error().message();
    EXPECT_EQ(slurp(odd / "a file"), "mine");
  }
  {  // a checkpoint with more layers than the config says: refused, not run short
    auto d = copy_fixture(src, "fewer layers");
    json cfg = json::parse(slurp(d / "config.json"));
    cfg["num_hidden_layers"] = cfg["num_hidden_layers"].get<int>() - 1;
    std::ofstream(d / "config.json", std::ios::trunc) << cfg.dump(2);
    expect_clean_failure(d, "config.json says num_hidden_layers " + std::to_string(cfg["num_hidden_layers"].get<int>()),
                         "fewer layers");
  }
  {  // an unknown rope type is refused at convert, not at the first run
    auto d = copy_fixture(src, "rope");
    json cfg = json::parse(slurp(d / "config.json"));
    cfg["rope_scaling"] = {{"rope_type", "longrope"}, {"factor", 4}};
    std::ofstream(d / "config.json", std::ios::trunc) << cfg.dump(2);
    expect_clean_failure(d, "rope_scaling.rope_type 'longrope' is not supported", "rope");
  }
  {  // a damaged tokenizer_config.json is refused before any output, not found at the first chat
    auto d = copy_fixture(src, "tokcfg");
    std::ofstream(d / "tokenizer_config.json", std::ios::trunc) << "{bad";
    expect_clean_failure(d, "tokenizer_config.json is not a JSON object; fix it, or remove it", "tokcfg");
  }
  {  // a known rope type without a key it needs (the engine's check): refused at convert, naming config.json
    auto d = copy_fixture(src, "rope-key");
    json cfg = json::parse(slurp(d / "config.json"));
    cfg["rope_scaling"] = {{"rope_type", "linear"}};
    std::ofstream(d / "config.json", std::ios::trunc) << cfg.dump(2);
    expect_clean_failure(d, "config.json rope_scaling: rope_type 'linear' needs \"factor\"; fix it there", "rope-key");
  }
  {  // a tokenizer with ids past the embedding's rows (another model's vocabulary) is refused
    auto d = copy_fixture(src, "tokenizer too big");
    const json cfg = json::parse(slurp(d / "config.json"));
    json tok = json::parse(slurp(d / "tokenizer.json"));
    const std::int64_t past = cfg["vocab_size"].get<std::int64_t>() + 3;
    tok["model"]["vocab"]["\u0120colibri"] = past;
    std::ofstream(d / "tokenizer.json", std::ios::trunc) << tok.dump();
    expect_clean_failure(d,
                         "tokenizer.json: the tokenizer's vocabulary has token ids up to " + std::to_string(past) +
                             ", but the model's has " + cfg["vocab_size"].dump() +
                             " (vocab_size in config.json): ids past it have no embedding row",
                         "tokenizer too big");
    // Added tokens past the embedding (a <pad> added without resizing it) only fail a prompt that holds one: warned.
    tok = json::parse(slurp(src / "tokenizer.json"));
    const std::size_t model_ids = tok["model"]["vocab"].size(), rows = cfg["vocab_size"].get<std::size_t>();
    for (std::size_t i = 0; i < rows - model_ids + 5; ++i) {
      tok["added_tokens"].push_back({{"id", 0}, {"content", "<extra_" + std::to_string(i) + ">"}, {"special", true}});
    }
    std::ofstream(d / "tokenizer.json", std::ios::trunc) << tok.dump();
    const auto summary = convert_ok(d, fresh_output("tokenizer added past"), "f16");
    ASSERT_FALSE(summary.warnings.empty());
    const std::string want =
        "tokenizer.json: 5 added token(s) have ids past the model's " + cfg["vocab_size"].dump() + " (vocab_size";
    EXPECT_NE(summary.warnings.back().find(want), std::string::npos) << summary.warnings.back();
  }
  {  // GGUF: the same, and the keys llama.cpp requires are not given defaults that would change the answers
    const auto gguf = [&](const std::string& name, const std::string& args) {
      const fs::path g = kWork / "bad" / (name + ".gguf");
      const std::string cmd = std::string(COLIBRI_TEST_PYTHON) + " " +
                              quote(fs::path(COLIBRI_TEST_SOURCE_DIR) / "tests/fixtures/make_tiny_model.py") +
                              " --arch qwen3_moe --out " + quote(kWork / "bad" / (name + " src")) + " --gguf " +
                              quote(g) + " --gguf-only " + args + " 2>/dev/null";
      EXPECT_EQ(run(cmd), 0) << cmd;
      return g;
    };
    expect_clean_failure(gguf("extra tokens", "--gguf-extra-tokens 5"),
                         "(tokenizer.ggml.tokens): the tokenizer's vocabulary has token ids up to",
                         "gguf extra tokens");
    for (const std::string key : {"attention.layer_norm_rms_epsilon", "context_length"}) {
      expect_clean_failure(gguf("no " + key, "--gguf-drop-key '{arch}." + key + "'"),
                           "missing metadata qwen3moe." + key + " (llama.cpp needs it too); the GGUF is incomplete",
                           "gguf without " + key);
    }
  }
  {  // a GGUF with an unknown tensor type
    const fs::path g = kWork / "bad" / "unknown type.gguf";
    std::string cmd = std::string(COLIBRI_TEST_PYTHON) + " " +
                      quote(fs::path(COLIBRI_TEST_SOURCE_DIR) / "tests/fixtures/make_tiny_model.py") +
                      " --arch olmoe --out " + quote(kWork / "bad" / "olmoe src") + " --gguf " + quote(g) +
                      " --gguf-bad-type blk.1.attn_k.weight=99 2>/dev/null";
    ASSERT_EQ(run(cmd), 0);
    expect_clean_failure(g, "GGML type id 99", "gguf type");
    cmd.replace(cmd.find("=99"), 3, "=23");  // llama.cpp's IQ4_XS, named
    ASSERT_EQ(run(cmd), 0);
    expect_clean_failure(g, "has GGML type iq4_xs (id 23), which colibri does not know", "gguf iq4_xs");
    cmd.replace(cmd.find("=23"), 3, "=99");
    // A type GGUF knows but weights never use: refused while planning, by name.
    cmd.replace(cmd.find("=99"), 3, "=24");
    ASSERT_EQ(run(cmd), 0);
    expect_clean_failure(g, "tensor 'blk.1.attn_k.weight' is stored as i8, which colibri cannot convert", "gguf i8");
  }
  {  // a metadata key of the wrong type is named as such, not as missing: block_count's u32 (type 4) made f32 (6)
    const fs::path g = kWork / "bad" / "key type.gguf";
    std::string bytes = slurp(src.string() + ".gguf");
    const std::string key = "qwen3moe.block_count";
    const auto at = bytes.find(key);
    ASSERT_NE(at, std::string::npos);
    ASSERT_EQ(bytes[at + key.size()], '\x04');
    bytes[at + key.size()] = '\x06';
    std::ofstream(g, std::ios::binary | std::ios::trunc) << bytes;
    expect_clean_failure(g, "metadata qwen3moe.block_count is f32, not an integer; the GGUF is damaged",
                         "gguf key type");
    // So is an optional one: read as absent, its default would change the model (no EOS: answers never end).
    for (const std::string optional :
         {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.bos_token_id", "qwen3moe.context_length"}) {
      std::string flipped = slurp(src.string() + ".gguf");
      const auto pos = flipped.find(optional);
      ASSERT_NE(pos, std::string::npos) << optional;
      ASSERT_EQ(flipped[pos + optional.size()], '\x04') << optional;
      flipped[pos + optional.size()] = '\x06';
      std::ofstream(g, std::ios::binary | std::ios::trunc) << flipped;
      expect_clean_failure(g, "metadata " + optional + " is f32, not an integer; the GGUF is damaged", optional);
    }
  }
  {  // a FIFO where an input file belongs is refused by what it is, never waited on for a writer
    auto d = copy_fixture(src, "fifo");
    for (const char* name : {"config.json", "tokenizer_config.json"}) {
      const fs::path kept = d / (std::string(name) + ".kept");
      fs::rename(d / name, kept);
      ASSERT_EQ(::mkfifo((d / name).c_str(), 0600), 0);
      expect_clean_failure(d, std::string(name) + " is", name);
      expect_clean_failure(d, "FIFO", name);
      fs::remove(d / name);
      fs::rename(kept, d / name);
    }
    const fs::path g = kWork / "bad" / "fifo.gguf";
    fs::remove(g);
    ASSERT_EQ(::mkfifo(g.c_str(), 0600), 0);
    expect_clean_failure(g, "fifo.gguf is a named pipe (FIFO), not a file colibri can read", "fifo gguf");
  }
  {  // model.safetensors or its index there but no file: named as what it is, not "no model.safetensors"
    auto d = copy_fixture(src, "no file");
    fs::rename(d / "model.safetensors.index.json", d / "index.kept");
    fs::create_directory(d / "model.safetensors");
    expect_clean_failure(d, "model.safetensors is a directory, not a file", "safetensors dir");
    fs::remove(d / "model.safetensors");
    fs::create_symlink("model.safetensors.index.json", d / "model.safetensors.index.json");
    expect_clean_failure(d, "model.safetensors.index.json cannot be followed", "index loop");
  }
  {  // a truncated GGUF
    const fs::path g = kWork / "bad" / "truncated.gguf";
    fs::copy_file(src.string() + ".gguf", g, fs::copy_options::overwrite_existing);
    fs::resize_file(g, fs::file_size(g) / 2);
    expect_clean_failure(g, "truncated", "gguf truncated");
  }
}

// gpt-oss: the hyper-parameters its forward pass needs reach the manifest (format 2), each expert carries its three
// biases, both expert layouts (bf16 and MXFP4) convert, and broken configs or layouts are refused by name.
TEST(ModelConvert, GptOssConvertsBothExpertLayoutsAndRefusesBrokenOnesByName) {
  const fs::path src = fixture("gpt_oss-plain", "--arch gpt_oss --dtype bf16", false);
  const fs::path mx = fixture("gpt_oss-mxfp4", "--arch gpt_oss --dtype bf16 --mxfp4", false);
  for (const auto& in : {src, mx}) {
    const fs::path out = fresh_output("gpt-oss " + in.filename().string());
    const auto summary = convert_ok(in, out, "q8_0");
    auto m = load_manifest(out);
    ASSERT_TRUE(m.has_value()) << m.error().to_string();
    EXPECT_EQ(json::parse(slurp(out / "manifest.json"))["format_version"], 2);
    EXPECT_EQ(m->hparams.architecture, "gpt_oss");
    EXPECT_EQ(m->hparams.sliding_layers, (std::vector<std::int64_t>{0, 2}));
    EXPECT_EQ(m->hparams.layer_window(0), 4);
    EXPECT_EQ(m->hparams.layer_window(1), 0);
    EXPECT_TRUE(m->hparams.attention_sinks && m->hparams.router_bias);
    EXPECT_EQ(m->hparams.expert_activation, "swiglu_clamped");
    EXPECT_DOUBLE_EQ(m->hparams.swiglu_limit, 7.0);
    ASSERT_FALSE(m->experts.empty());
    // MXFP4 experts are kept bit-exact (listed as copied), never re-quantized; bf16 ones take the preset's type.
    const auto want = in == mx ? colibri::sdk::DType::mxfp4 : colibri::sdk::DType::q8_0;
    for (const auto& e : m->experts) {
      ASSERT_TRUE(e.has_bias());
      EXPECT_EQ(e.gate.type, want);
      EXPECT_EQ(e.down.type, want);
      EXPECT_EQ(e.down_bias.shape, std::vector<std::int64_t>{256});
    }
    EXPECT_EQ(summary.fallbacks.size(), in == mx ? 3u * m->experts.size() : 0u);
    EXPECT_NE(m->tensor("blk.1.attn_sinks.weight"), nullptr);
    EXPECT_NE(m->tensor("blk.1.ffn_gate_inp.bias"), nullptr);
    EXPECT_TRUE(verify_model(out).ok());
  }
  {  // generation_config.json's end tokens join config.json's (gpt-oss lists <|call|> only there)
    auto d = copy_fixture(src, "gpt-oss generation config");
    std::ofstream(d / "generation_config.json", std::ios::trunc) << R"({"eos_token_id": [7, 5, 7]})";
    const fs::path out = fresh_output("gpt-oss generation config");
    convert_ok(d, out, "f16");
    auto m = load_manifest(out);
    ASSERT_TRUE(m.has_value()) << m.error().to_string();
    const auto& eos = m->hparams.eos_token_ids;
    EXPECT_NE(std::find(eos.begin(), eos.end(), 5), eos.end());
    EXPECT_NE(std::find(eos.begin(), eos.end(), 7), eos.end());
    EXPECT_EQ(std::count(eos.begin(), eos.end(), 7), 1);
    std::ofstream(d / "generation_config.json", std::ios::trunc) << R"({"eos_token_id": "x"})";
    expect_clean_failure(d, "generation_config.json: eos_token_id is \"x\"", "gpt-oss generation config");
    std::ofstream(d / "generation_config.json", std::ios::trunc) << R"({"eos_token_id": [5, 99999999]})";
    expect_clean_failure(d, "generation_config.json: eos_token_id 99999999 is outside the vocabulary",
                         "gpt-oss generation config");
    // Its sampling values are the server's defaults, checked as a request's would be (the server refused to start).
    std::ofstream(d / "generation_config.json", std::ios::trunc) << R"({"temperature": "0.7"})";
    expect_clean_failure(d,
                         "generation_config.json: \"temperature\" is \"0.7\", not a number; a request may give 0 to 2; "
                         "fix it there, or remove the field",
                         "gpt-oss generation config");
    std::ofstream(d / "generation_config.json", std::ios::trunc) << R"({"top_k": 20, "temperature": null})";
    convert_ok(d, fresh_output("gpt-oss generation config ok"), "f16");
  }
  {  // a layer type colibri does not run
    auto d = copy_fixture(src, "gpt-oss layer type");
    json cfg = json::parse(slurp(d / "config.json"));
    cfg["layer_types"][1] = "chunked_attention";
    std::ofstream(d / "config.json", std::ios::trunc) << cfg.dump(2);
    expect_clean_failure(d, "layer_types[1] is chunked_attention", "gpt-oss layer type");
  }
  {  // layer_types of the wrong length
    auto d = copy_fixture(src, "gpt-oss layer count");
    json cfg = json::parse(slurp(d / "config.json"));
    cfg["layer_types"].erase(0);
    std::ofstream(d / "config.json", std::ios::trunc) << cfg.dump(2);
    expect_clean_failure(d, "layer_types must list one entry per layer", "gpt-oss layer count");
  }
  {  // MXFP4 blocks without their scales (a tensor renamed in the header, same length)
    auto d = copy_fixture(mx, "gpt-oss scales");
    for (const auto& f : fs::directory_iterator(d)) {
      if (f.path().extension() != ".safetensors") continue;
      std::string bytes = slurp(f.path());
      const auto pos = bytes.find("layers.1.mlp.experts.down_proj_scales");
      if (pos == std::string::npos) continue;
      bytes.replace(pos, 37, "layers.1.mlp.experts.down_proj_scalez");
      std::ofstream(f.path(), std::ios::binary | std::ios::trunc) << bytes;
    }
    expect_clean_failure(d, "has 'model.layers.1.mlp.experts.down_proj_blocks' but not", "gpt-oss scales");
  }
  {  // an expert tensor whose shape does not fit the config
    auto d = copy_fixture(src, "gpt-oss shape");
    json cfg = json::parse(slurp(d / "config.json"));
    cfg["intermediate_size"] = 128;
    std::ofstream(d / "config.json", std::ios::trunc) << cfg.dump(2);
    expect_clean_failure(d, "tensor 'model.layers.0.mlp.experts.gate_up_proj' has shape [4, 256, 512]",
                         "gpt-oss shape");
  }
  {  // an attention tensor whose shape does not fit the config (located by name, not cut from a fused tensor)
    auto d = copy_fixture(src, "gpt-oss head_dim");
    json cfg = json::parse(slurp(d / "config.json"));
    cfg["head_dim"] = cfg["head_dim"].get<int>() * 2;
    std::ofstream(d / "config.json", std::ios::trunc) << cfg.dump(2);
    expect_clean_failure(d, ".safetensors: tensor 'model.layers.0.self_attn.q_proj.weight' has shape [",
                         "gpt-oss head_dim");
  }
}

// GLM-4.5: its router and partial rotary reach the manifest (format 3), the selection bias stays f32, and the
// multi-token-prediction layer after the last one is skipped with a line in the summary, from HF and from GGUF. A
// layer past them is still refused: the config and the weights disagree.
TEST(ModelConvert, GlmSkipsItsPredictionLayerAndKeepsItsRouter) {
  const fs::path src = fixture("glm4_moe-plain", "--arch glm4_moe --dtype bf16");
  for (const fs::path& in : {src, fs::path(src.string() + ".gguf")}) {
    const fs::path out = fresh_output("glm " + in.filename().string());
    const auto summary = convert_ok(in, out, "q8_0");
    auto m = load_manifest(out);
    ASSERT_TRUE(m.has_value()) << m.error().to_string();
    EXPECT_EQ(json::parse(slurp(out / "manifest.json"))["format_version"], 3);
    const auto& hp = m->hparams;
    EXPECT_EQ(hp.architecture, "glm4_moe");
    EXPECT_EQ(hp.num_layers, 3);
    EXPECT_EQ(hp.rotary_dims, 64);
    EXPECT_EQ(hp.router_scoring, "sigmoid");
    EXPECT_TRUE(hp.router_selection_bias);
    EXPECT_DOUBLE_EQ(hp.routed_scaling_factor, 2.5);
    EXPECT_EQ(hp.mlp_only_layers, (std::vector<std::int64_t>{0}));
    EXPECT_EQ(hp.shared_expert_intermediate_size, 128);
    const auto* bias = m->tensor("blk.1.exp_probs_b.bias");
    ASSERT_NE(bias, nullptr);
    EXPECT_EQ(bias->type, colibri::sdk::DType::f32);
    EXPECT_EQ(m->tensor("blk.3.attn_q.weight"), nullptr);
    ASSERT_EQ(summary.warnings.size(), 1u) << in;
    EXPECT_NE(summary.warnings[0].find("of the multi-token-prediction layer after layer 2 were skipped"),
              std::string::npos)
        << summary.warnings[0];
    EXPECT_TRUE(verify_model(out).ok());
  }
  auto d = copy_fixture(src, "glm nextn");
  json cfg = json::parse(slurp(d / "config.json"));
  cfg["num_nextn_predict_layers"] = 0;
  std::ofstream(d / "config.json", std::ios::trunc) << cfg.dump(2);
  expect_clean_failure(d, "the weights hold layer 3", "glm nextn");
  // GGUF metadata that contradicts the tensors would run another model: llama.cpp refuses such files, so does colibri.
  const std::pair<std::string, std::string> damaged[] = {
      {"--gguf-set-u32 {arch}.nextn_predict_layers=0",
       "layer 3 holds multi-token-prediction tensors (nextn.eh_proj), but glm4moe.nextn_predict_layers 0 and "
       "block_count 4 make it a decoder layer"},
      {"--gguf-set-u32 {arch}.nextn_predict_layers=2", "layer 2 lacks multi-token-prediction tensors"},
      {"--gguf-set-u32 {arch}.expert_shared_count=0",
       "tensor 'blk.1.ffn_gate_shexp.weight' is in layer 1, but the metadata gives glm4_moe no such tensor there"},
      {"--gguf-drop-tensor blk.0.attn_q.bias",
       "tensor 'blk.0.attn_k.bias' is in layer 0, but the metadata gives glm4_moe no such tensor there"},
      {"--gguf-set-u32 {arch}.rope.dimension_count=0", "rope.dimension_count is 0; it must be even and in 2..128"},
      {"--gguf-set-u32 {arch}.expert_shared_count=100", "glm4moe.expert_shared_count is 100; it must be in 0..64"},
      {"--gguf-set-u32 {arch}.expert_group_count=8 --gguf-set-u32 {arch}.expert_group_used_count=4",
       "router_groups is 8; it must divide n_experts (8) into groups of two experts or more"},
  };
  int n = 0;
  for (const auto& [args, want] : damaged) {
    const std::string tag = "glm-gguf-damaged-" + std::to_string(n++);
    const fs::path g = fixture(tag, "--arch glm4_moe --dtype f32 --gguf-dtype f32 " + args);
    expect_clean_failure(g.string() + ".gguf", want, tag);
  }
}

// DeepSeek's multi-head latent attention is stored cut for the absorbed form: the queries' parts with and without
// RoPE, the latent and the RoPE key out of kv_a_proj_with_mqa, and kv_b_proj's key part transposed per head.
TEST(ModelConvert, DeepSeekCutsItsLatentAttentionAndSkipsItsPredictionLayer) {
  const fs::path src = fixture("deepseek_v3-mtp", "--arch deepseek_v3 --dtype f32 --set num_nextn_predict_layers=1");
  const fs::path out = fresh_output("deepseek mtp");
  const auto summary = convert_ok(src, out, "f32");
  auto m = load_manifest(out);
  ASSERT_TRUE(m.has_value()) << m.error().to_string();
  EXPECT_EQ(json::parse(slurp(out / "manifest.json"))["format_version"], 4);
  const auto& hp = m->hparams;
  const json cfg = json::parse(slurp(src / "config.json"));
  EXPECT_EQ(hp.architecture, "deepseek_v3");
  EXPECT_EQ(hp.kv_lora_rank, cfg["kv_lora_rank"]);
  EXPECT_EQ(hp.q_lora_rank, cfg["q_lora_rank"]);
  EXPECT_EQ(hp.v_head_dim, cfg["v_head_dim"]);
  EXPECT_EQ(hp.head_dim, cfg["qk_nope_head_dim"].get<std::int64_t>() + cfg["qk_rope_head_dim"].get<std::int64_t>());
  EXPECT_EQ(hp.rotary_dims, cfg["qk_rope_head_dim"]);
  EXPECT_TRUE(hp.rope_interleaved);
  EXPECT_EQ(hp.router_scoring, "sigmoid");
  EXPECT_TRUE(hp.router_selection_bias);
  EXPECT_EQ(hp.mlp_only_layers, (std::vector<std::int64_t>{0}));
  EXPECT_EQ(m->tensor("blk.3.attn_q_a.weight"), nullptr);  // the MTP layer
  ASSERT_EQ(summary.warnings.size(), 1u);
  EXPECT_NE(summary.warnings[0].find("multi-token-prediction layer after layer 2 were skipped"), std::string::npos);
  // Each cut against the checkpoint's own rows.
  const std::int64_t nh = hp.num_heads, dn = hp.qk_nope_dim(), dr = hp.rope_dims(), dc = hp.kv_lora_rank;
  const std::int64_t dv = hp.v_head_dim, ql = hp.q_lora_rank;
  auto st = colibri::model::SafetensorsCheckpoint::open(src);
  ASSERT_TRUE(st.has_value()) << st.error().to_string();
  const auto source = [&](const std::string& name) {
    const auto* t = st->find(name);
    EXPECT_NE(t, nullptr) << name;
    std::vector<float> v(t == nullptr ? 0 : t->size / sizeof(float));
    if (t != nullptr) {
      EXPECT_TRUE(st->read(*t, 0, v.data(), t->size).ok());
    }
    return v;
  };
  const auto stored = [&](const std::string& name, std::vector<std::int64_t> shape) {
    const auto* t = m->tensor(name);
    EXPECT_NE(t, nullptr) << name;
    if (t == nullptr) return std::vector<float>{};
    EXPECT_EQ(t->shape, shape) << name;
    std::ifstream f(out / t->file, std::ios::binary);
    std::vector<float> v(t->size / sizeof(float));
    f.seekg(static_cast<std::streamoff>(t->offset));
    f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(t->size));
    return v;
  };
  const std::string a = "model.layers.1.self_attn.";
  const auto q_b = source(a + "q_b_proj.weight"), kv_a = source(a + "kv_a_proj_with_mqa.weight");
  const auto kv_b = source(a + "kv_b_proj.weight");
  const auto q_nope = stored("blk.1.attn_q_nope.weight", {nh * dn, ql});
  const auto q_rope = stored("blk.1.attn_q_rope.weight", {nh * dr, ql});
  const auto latent = stored("blk.1.attn_kv_a.weight", {dc, hp.hidden_size});
  const auto k_rope = stored("blk.1.attn_k_rope.weight", {dr, hp.hidden_size});
  const auto k_b = stored("blk.1.attn_k_b.weight", {nh * dc, dn});
  const auto v_b = stored("blk.1.attn_v_b.weight", {nh * dv, dc});
  ASSERT_FALSE(q_b.empty() || kv_a.empty() || kv_b.empty() || k_b.empty() || v_b.empty());
  const std::int64_t h = nh - 1;  // the last head: a cut that ignored the head stride would miss it
  for (std::int64_t c = 0; c < ql; ++c) {
    EXPECT_EQ(q_nope[static_cast<std::size_t>((h * dn + 1) * ql + c)],
              q_b[static_cast<std::size_t>((h * (dn + dr) + 1) * ql + c)]);
    EXPECT_EQ(q_rope[static_cast<std::size_t>((h * dr + 1) * ql + c)],
              q_b[static_cast<std::size_t>((h * (dn + dr) + dn + 1) * ql + c)]);
  }
  for (std::int64_t c = 0; c < hp.hidden_size; ++c) {
    EXPECT_EQ(latent[static_cast<std::size_t>((dc - 1) * hp.hidden_size + c)],
              kv_a[static_cast<std::size_t>((dc - 1) * hp.hidden_size + c)]);
    EXPECT_EQ(k_rope[static_cast<std::size_t>(c)], kv_a[static_cast<std::size_t>(dc * hp.hidden_size + c)]);
  }
  for (std::int64_t i = 0; i < dc; ++i) {
    for (std::int64_t j = 0; j < dn; ++j) {  // k_b[h][i][j] = kv_b[h * (dn + dv) + j][i]
      ASSERT_EQ(k_b[static_cast<std::size_t>((h * dc + i) * dn + j)],
                kv_b[static_cast<std::size_t>((h * (dn + dv) + j) * dc + i)]);
    }
  }
  for (std::int64_t c = 0; c < dc; ++c) {
    EXPECT_EQ(v_b[static_cast<std::size_t>((h * dv + dv - 1) * dc + c)],
              kv_b[static_cast<std::size_t>((h * (dn + dv) + dn + dv - 1) * dc + c)]);
  }
  // A q8_0 GGUF's cut rows are copied, block for block, as quantizing the checkpoint's floats gives them.
  const fs::path q8 = fixture("deepseek_v2-q8gguf", "--arch deepseek_v2 --dtype f32 --gguf-dtype q8_0");
  const fs::path from_st = fresh_output("deepseek q8 from st"), copied = fresh_output("deepseek q8 copied");
  convert_ok(q8, from_st, "q8_0");
  convert_ok(q8.string() + ".gguf", copied, "q8_0");
  expect_identical_models(from_st, copied);
  // Damaged or unsupported files are refused by name, with nothing written.
  const std::pair<std::string, std::string> refused[] = {
      {"--gguf-drop-tensor blk.1.attn_k_b.weight",
       "tensor 'blk.1.attn_k_b.weight' (needed by its metadata) is missing"},
      {"--gguf-set-u32 {arch}.expert_group_count=8 --gguf-set-u32 {arch}.expert_group_used_count=4",
       "router_groups is 8; it must divide n_experts (8) into groups of two experts or more"},
      {"--gguf-set-u32 {arch}.attention.kv_lora_rank=32",
       "attention.key_length_mla 48, rope.dimension_count 16, attention.kv_lora_rank 32, key_length 80 and "
       "value_length 64 disagree"},
      {"--gguf-drop-key {arch}.attention.key_length_mla", "missing metadata deepseek2.attention.key_length_mla"},
      {"--gguf-drop-key {arch}.rope.dimension_count", "missing metadata deepseek2.rope.dimension_count"},
      {"--gguf-set-u32 {arch}.leading_dense_block_count=2",
       "deepseek2.leading_dense_block_count is 2, but the layers without a router (ffn_gate_inp) are not exactly the "
       "first 2"},
      {"--gguf-set-u32 {arch}.expert_group_count=0",
       "deepseek2.expert_group_count 0 and expert_group_used_count 1 must be 1 or more"},
  };
  int n = 0;
  for (const auto& [args, want] : refused) {
    const std::string tag = "deepseek-gguf-damaged-" + std::to_string(n++);
    const fs::path g = fixture(tag, "--arch deepseek_v3 --dtype f32 --gguf-dtype f32 " + args);
    expect_clean_failure(g.string() + ".gguf", want, tag);
  }
  auto d = copy_fixture(src, "deepseek groups");
  json c = json::parse(slurp(d / "config.json"));
  c["n_group"] = 8;
  c["topk_group"] = 4;
  std::ofstream(d / "config.json", std::ios::trunc) << c.dump(2);
  expect_clean_failure(d, "router_groups is 8; it must divide n_experts (8) into groups of two", "deepseek groups");
}

TEST(ModelConvert, AQuantizedGgufIsCopiedListedAndCheckedForBrokenScales) {
  // A q8_0 GGUF (ggml's reference quantizer, as llama-quantize writes it) against the f32 checkpoint at q8_0.
  const fs::path src = fixture("mixtral-q8gguf", "--arch mixtral --dtype f32 --gguf-dtype q8_0");
  const fs::path gguf = src.string() + ".gguf";
  const fs::path from_st = fresh_output("q8 from st"), copied = fresh_output("q8 copied");
  convert_ok(src, from_st, "q8_0");
  EXPECT_TRUE(convert_ok(gguf, copied, "q8_0").fallbacks.empty());
  expect_identical_models(from_st, copied);
  // Asked for another preset, its blocks are still copied (never re-quantized), and the summary and the manifest
  // say so for every tensor the preset wanted otherwise.
  const fs::path other = fresh_output("q8 as q4_k_m");
  const auto summary = convert_ok(gguf, other, "q4_k_m");
  ASSERT_FALSE(summary.fallbacks.empty());
  for (const auto& f : summary.fallbacks) {
    EXPECT_EQ(f.used, "q8_0") << f.tensor;
    EXPECT_NE(f.wanted, "q8_0") << f.tensor;
    EXPECT_EQ(f.reason, "already quantized in the input: copied, not re-quantized");
  }
  EXPECT_NE(slurp(other / "manifest.json").find("already quantized in the input"), std::string::npos);
  // A NaN block scale is refused by tensor, row and column, not copied into NaN logits.
  auto g = GgufFile::open(gguf);
  ASSERT_TRUE(g.has_value()) << g.error().to_string();
  const auto* t = g->find_tensor("output.weight");
  ASSERT_NE(t, nullptr);
  const fs::path bad = kWork / "bad" / "nan-scale.gguf";
  fs::create_directories(bad.parent_path());
  fs::copy_file(gguf, bad, fs::copy_options::overwrite_existing);
  {
    std::fstream f(bad, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(t->offset + 34));  // the second block's f16 scale
    const unsigned char nan_f16[2] = {0x00, 0x7e};
    f.write(reinterpret_cast<const char*>(nan_f16), 2);
  }
  expect_clean_failure(bad, "converting tensor 'output.weight': corrupt_data: row 0, column 32 holds nan", "nan scale");
}

// transformers reads model.safetensors before an index beside it; so does convert (an index left from another
// download, naming shards that are not there, does not stop it).
TEST(ModelConvert, ASingleFileWinsOverAnIndexBesideItAsInTransformers) {
  const fs::path src = copy_fixture(fixture("gpt_oss-plain", "--arch gpt_oss --dtype bf16", false), "both files");
  std::ofstream(src / "model.safetensors.index.json")
      << R"({"weight_map": {"model.norm.weight": "model-00001-of-00009.safetensors"}})";
  convert_ok(src, fresh_output("single wins"), "f16");
}

TEST(ModelConvert, AChatTemplateJinjaFileIsCarriedIntoTheModel) {
  const fs::path src = copy_fixture(fixture("mixtral-bf16", "--arch mixtral --dtype bf16 --shards 2"), "with jinja");
  std::ofstream(src / "chat_template.jinja") << "{{ bos_token }}{{ messages[0]['content'] }}";
  const fs::path out = fresh_output("jinja carried");
  convert_ok(src, out, "f16");
  EXPECT_EQ(slurp(out / "chat_template.jinja"), "{{ bos_token }}{{ messages[0]['content'] }}");
  auto m = load_manifest(out);
  ASSERT_TRUE(m.has_value());
  EXPECT_NE(std::find(m->tokenizer_files.begin(), m->tokenizer_files.end(), "chat_template.jinja"),
            m->tokenizer_files.end());
  EXPECT_TRUE(verify_model(out).ok());
  // One colibri cannot parse still converts (completions work), with a warning that says what chat then needs.
  std::ofstream(src / "chat_template.jinja", std::ios::trunc) << "{% if %}";
  const auto summary = convert_ok(src, fresh_output("jinja broken"), "f16");
  ASSERT_EQ(summary.warnings.size(), 1u);
  EXPECT_NE(summary.warnings[0].find("the chat template (chat_template.jinja) does not parse: chat_template.jinja "
                                     "line 1"),
            std::string::npos)
      << summary.warnings[0];
  EXPECT_NE(summary.warnings[0].find("need --chat-template FILE"), std::string::npos);
  // So does a tokenizer_config.json whose chat_template is no template at all (was skipped without a word).
  fs::remove(src / "chat_template.jinja");
  json cfg = json::parse(slurp(src / "tokenizer_config.json"));
  // No template at all is no warning: chat takes the architecture's built-in one.
  cfg.erase("chat_template");
  std::ofstream(src / "tokenizer_config.json", std::ios::trunc) << cfg.dump();
  const auto none = convert_ok(src, fresh_output("template none"), "f16");
  EXPECT_TRUE(none.warnings.empty()) << none.warnings.front();
  cfg["chat_template"] = 5;
  std::ofstream(src / "tokenizer_config.json", std::ios::trunc) << cfg.dump();
  const auto typed = convert_ok(src, fresh_output("template typed"), "f16");
  ASSERT_EQ(typed.warnings.size(), 1u);
  EXPECT_NE(typed.warnings[0].find("'chat_template': expected a string or a list"), std::string::npos)
      << typed.warnings[0];
  EXPECT_NE(typed.warnings[0].find("need --chat-template FILE"), std::string::npos);
}

TEST(ModelConvert, ExistingOutputIsRefusedAndForceReplacesOnlyACompleteModel) {
  const fs::path src = fixture("olmoe-bf16", "--arch olmoe --dtype bf16 --shards 2");
  const fs::path out = fresh_output("force");
  convert_ok(src, out, "f16");
  const std::string before = slurp(out / "manifest.json");
  ConvertOptions o;
  o.input = src;
  o.output = out;
  o.preset = "bf16";
  auto r = convert_model(o);
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.error().message().find("--force"), std::string::npos);
  // --force with a broken input: the old model stays, whole.
  auto broken = copy_fixture(src, "force broken");
  fs::resize_file(broken / "model-00002-of-00002.safetensors", 100);
  o.input = broken;
  o.force = true;
  ASSERT_FALSE(convert_model(o).has_value());
  EXPECT_EQ(slurp(out / "manifest.json"), before);
  EXPECT_TRUE(verify_model(out).ok());
  // --force with a good input replaces it.
  o.input = src;
  ASSERT_TRUE(convert_model(o).has_value());
  auto m = load_manifest(out);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->quantization["preset"], "bf16");
  EXPECT_FALSE(partial_left(out));
  // --force through a symlink replaces the model it points to, on that disk, and keeps the link.
  const fs::path link = fresh_output("force link");
  fs::create_directory_symlink(out, link);
  o.output = link;
  o.preset = "q8_0";
  ASSERT_TRUE(convert_model(o).has_value());
  EXPECT_TRUE(fs::is_symlink(link));
  auto through = load_manifest(out);
  ASSERT_TRUE(through.has_value());
  EXPECT_EQ(through->quantization["preset"], "q8_0");
  EXPECT_FALSE(partial_left(out));
}

// Every file of `dir` with its bytes, to show that a refused --force left a directory exactly as it was.
std::map<std::string, std::string> snapshot(const fs::path& dir) {
  std::map<std::string, std::string> files;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.is_regular_file()) files[fs::relative(e.path(), dir).string()] = slurp(e.path());
  }
  return files;
}

TEST(ModelConvert, ForceNeverReplacesANonModelDirectoryOrTheInput) {
  const fs::path src = fixture("olmoe-bf16", "--arch olmoe --dtype bf16 --shards 2");
  ConvertOptions o;
  o.preset = "bf16";
  o.threads = 2;
  o.force = true;
  auto refused = [&](const fs::path& in, const fs::path& out, const std::string& why) {
    o.input = in;
    o.output = out;
    auto r = convert_model(o);
    ASSERT_FALSE(r.has_value()) << in << " -> " << out;
    EXPECT_NE(r.error().message().find(why), std::string::npos) << r.error().message();
  };
  {  // a directory of the user's that is not a colibri model
    const fs::path user = fresh_output("user notes");
    fs::create_directories(user / "sub");
    std::ofstream(user / "notes.txt") << "precious";
    std::ofstream(user / "sub" / "more.txt") << "also precious";
    const auto before = snapshot(user);
    refused(src, user, "is not a colibri model (it has no manifest.json)");
    EXPECT_EQ(snapshot(user), before);
    EXPECT_FALSE(partial_left(user));
    // A plain file is no model either.
    const fs::path file = fresh_output("user file");
    std::ofstream(file) << "precious";
    refused(src, file, "is a file; a model is a directory");
    EXPECT_EQ(slurp(file), "precious");
  }
  {  // the input itself, a directory inside it, one containing it, and a GGUF file as its own output
    const fs::path in = copy_fixture(src, "force onto input");
    const auto before = snapshot(in);
    refused(in, in, "is the input itself");
    refused(in, in / ".", "is the input itself");
    refused(in, in / "model", "lies inside the input");
    refused(in, in.parent_path(), "contains the input");
    EXPECT_EQ(snapshot(in), before);
    const fs::path gguf = kWork / "bad" / "force onto input.gguf";
    fs::copy_file(src.string() + ".gguf", gguf, fs::copy_options::overwrite_existing);
    const std::string gguf_before = slurp(gguf);
    refused(gguf, gguf, "is the input itself");
    EXPECT_EQ(slurp(gguf), gguf_before);
    // Through a symlink to the input, too.
    const fs::path link = kWork / "bad" / "force link";
    fs::remove(link);
    fs::create_directory_symlink(in, link);
    refused(in, link, "is the input itself");
    EXPECT_EQ(snapshot(in), before);
  }
  {  // an empty directory and an earlier model are still replaced
    const fs::path empty = fresh_output("force empty");
    fs::create_directories(empty);
    o.input = src;
    o.output = empty;
    ASSERT_TRUE(convert_model(o).has_value());
    ASSERT_TRUE(convert_model(o).has_value());
    EXPECT_TRUE(verify_model(empty).ok());
  }
  {  // an earlier model that also holds the user's files is not replaced; colibri's own stripe.yaml may go
    const fs::path model = fresh_output("force model with notes");
    o.input = src;
    o.output = model;
    ASSERT_TRUE(convert_model(o).has_value());
    std::ofstream(model / "stripe.yaml") << "storage: {plugin: stripe}\n";
    ASSERT_TRUE(convert_model(o).has_value());
    EXPECT_FALSE(fs::exists(model / "stripe.yaml"));
    std::ofstream(model / "notes.txt") << "precious";
    std::ofstream(model / "experts" / "L000" / "mine.bin") << "also precious";
    const auto before = snapshot(model);
    refused(src, model, "holds files convert did not write (experts/L000/mine.bin, notes.txt)");
    EXPECT_EQ(snapshot(model), before);
    EXPECT_FALSE(partial_left(model));
    // A manifest colibri cannot read: it cannot tell whose files are whose.
    fs::remove(model / "notes.txt");
    fs::remove(model / "experts" / "L000" / "mine.bin");
    std::ofstream(model / "manifest.json") << "{\"format\": ";
    const auto broken = snapshot(model);
    refused(src, model, "has a manifest.json colibri cannot read");
    EXPECT_EQ(snapshot(model), broken);
  }
}

TEST(ModelConvert, PackedLayerFilesWhenExpertsAreNotSplit) {
  const fs::path src = fixture("mixtral-bf16", "--arch mixtral --dtype bf16 --shards 2");
  const fs::path out = fresh_output("packed");
  convert_ok(src, out, "bf16", false);
  auto m = load_manifest(out);
  ASSERT_TRUE(m.has_value()) << m.error().to_string();
  EXPECT_EQ(m->expert(1, 3)->file, "experts/L001.bin");
  EXPECT_EQ(m->expert(1, 3)->offset % kBlobAlignment, 0u);
  EXPECT_TRUE(verify_model(out).ok());
}

TEST(ModelConvert, QuantizedPresetsConvertVerifyAndReportFallbacks) {
  const fs::path src = fixture("qwen2_moe-bf16", "--arch qwen2_moe --dtype bf16 --shards 2");
  for (const char* preset : {"Q8_0", "q4_k_m", "q2_k"}) {
    const fs::path out = fresh_output(std::string("quant ") + preset);
    auto s = convert_ok(src, out, preset);
    auto m = load_manifest(out);
    ASSERT_TRUE(m.has_value()) << m.error().to_string();
    EXPECT_TRUE(verify_model(out).ok());
    // Recorded in the preset's own spelling, however it was typed.
    std::string lower(preset);
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    EXPECT_EQ(m->quantization["preset"], lower);
    if (lower == "q8_0") {
      EXPECT_TRUE(s.fallbacks.empty());
      EXPECT_EQ(m->expert(0, 0)->gate.type, colibri::sdk::DType::q8_0);
    } else {
      // Routed experts' down rows have moe_intermediate_size=128 elements: not a whole 256-element k-block.
      EXPECT_FALSE(s.fallbacks.empty());
      EXPECT_NE(m->expert(0, 0)->down.type, colibri::sdk::DType::q4_k);
      EXPECT_FALSE(m->quantization["fallbacks"].empty());
    }
  }
  auto m = load_manifest(kWork / "out" / "quant q4_k_m");
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->expert(0, 0)->gate.type, colibri::sdk::DType::q4_k);
  EXPECT_EQ(m->tensor("output.weight")->type, colibri::sdk::DType::q6_k);
}

TEST(ModelConvert, CliConvertInspectAndNameResolution) {
  const fs::path src = fixture("llama-bf16", "--arch llama --dtype bf16 --shards 2");
  const fs::path models = kWork / "models dir 模型";
  fs::remove_all(models);
  fs::create_directories(models);
  const std::string cli = quote(COLIBRI_TEST_CLI);
  ASSERT_EQ(
      run(cli + " convert --quiet -i " + quote(src) + " -o " + quote(models / "tiny llama") + " -q f16 > /dev/null"),
      0);
  EXPECT_NE(
      run(cli + " convert --quiet -i " + quote(src) + " -o " + quote(models / "tiny llama") + " -q f16 2> /dev/null"),
      0);
  const fs::path json_out = kWork / "inspect.json";
  ASSERT_EQ(run(cli + " inspect 'tiny llama' --models-dir " + quote(models) + " --verify --json > " + quote(json_out)),
            0);
  const json j = json::parse(slurp(json_out));
  EXPECT_EQ(j["architecture"], "llama");
  EXPECT_TRUE(j["verify"]["ok"].get<bool>());
  EXPECT_EQ(j["params_total"], j["params_active_per_token"]);  // dense: every weight is active
  // -m/--model, as every other command takes the model, says the same as the positional form.
  const fs::path flag_out = kWork / "inspect-flag.json";
  ASSERT_EQ(run(cli + " inspect --models-dir " + quote(models) + " --model 'tiny llama' --json > " + quote(flag_out)),
            0);
  const json jf = json::parse(slurp(flag_out));
  EXPECT_EQ(jf["params_total"], j["params_total"]);
  EXPECT_EQ(jf["model"], j["model"]);
  auto resolved = resolve_model_path("tiny llama", models);
  ASSERT_TRUE(resolved.has_value());
  EXPECT_EQ(*resolved, models / "tiny llama");
  fs::remove(models / "tiny llama" / "experts/L001/E000.bin");
  const fs::path err = kWork / "inspect.err", report = kWork / "inspect.out";
  EXPECT_EQ(
      run(cli + " inspect " + quote(models / "tiny llama") + " --verify 2> " + quote(err) + " > " + quote(report)), 1);
  // The problems are in the report (stdout: `> report.txt` keeps them); the error says how many.
  EXPECT_NE(slurp(report).find("L1/E0: experts/L001/E000.bin is missing; re-run convert"), std::string::npos)
      << slurp(report);
  EXPECT_NE(slurp(err).find("problem(s)"), std::string::npos) << slurp(err);
  // Without --verify the first problem is named, and how to list them all.
  EXPECT_EQ(run(cli + " inspect " + quote(models / "tiny llama") + " 2> " + quote(err) + " > /dev/null"), 1);
  EXPECT_NE(slurp(err).find("--verify lists every problem"), std::string::npos) << slurp(err);
}

}  // namespace
