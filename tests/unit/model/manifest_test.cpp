#include "colibri/model/manifest.hpp"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "colibri/model/paths.hpp"
#include "colibri/model/verify.hpp"
#include "colibri/sdk/testing/resource_limits.hpp"
#include "test_files.hpp"

namespace colibri::model {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A hand-made one-layer dense model (two experts would need a router; dense is the smallest valid shape).
struct TinyModel {
  fs::path dir;
  json manifest;
};

HyperParams tiny_hparams() {
  HyperParams h;
  h.architecture = "llama";
  h.hf_architecture = "LlamaForCausalLM";
  h.vocab_size = 4;
  h.hidden_size = 2;
  h.num_layers = 1;
  h.num_heads = 1;
  h.num_kv_heads = 1;
  h.head_dim = 2;
  h.max_position_embeddings = 16;
  h.dense = true;
  h.n_experts = 1;
  h.n_experts_per_tok = 1;
  h.intermediate_size = 4;
  return h;
}

json tensor(const std::string& name, std::uint64_t offset, std::vector<std::int64_t> shape) {
  std::uint64_t n = 4;
  for (auto d : shape) n *= static_cast<std::uint64_t>(d);
  return {{"name", name},  {"offset", offset}, {"size", n},
          {"type", "f32"}, {"shape", shape},   {"xxh64", "0000000000000000"}};
}

// Parameters of make_model's shared tensors.
constexpr std::uint64_t kSharedParams = 8 + 2 + 8 + 2 + 4 * 4 + 2;

TinyModel make_model(const std::string& name) {
  TinyModel t;
  t.dir = testing::temp_dir(name);
  testing::write_file(t.dir / "shared.bin", std::string(4096, '\1'));
  testing::write_file(t.dir / "experts/L000/E000.bin", std::string(4096, '\2'));
  // Every shared tensor a one-layer llama has, 32 bytes apart: tensors[0] and [1] are used by the tests below.
  json shared = json::array();
  const std::pair<const char*, std::vector<std::int64_t>> kShared[] = {
      {"token_embd.weight", {4, 2}},   {"output_norm.weight", {2}},          {"output.weight", {4, 2}},
      {"blk.0.attn_norm.weight", {2}}, {"blk.0.attn_q.weight", {2, 2}},      {"blk.0.attn_k.weight", {2, 2}},
      {"blk.0.attn_v.weight", {2, 2}}, {"blk.0.attn_output.weight", {2, 2}}, {"blk.0.ffn_norm.weight", {2}}};
  std::uint64_t offset = 0;
  for (const auto& [name, shape] : kShared) {
    json x = tensor(name, offset, shape);
    x["file"] = "shared.bin";
    shared.push_back(x);
    offset += 64;
  }
  json m = {{"format", kManifestFormatName},
            {"format_version", kManifestFormatVersion},
            {"hparams", tiny_hparams().to_json()},
            {"files",
             {{{"path", "shared.bin"}, {"size", 4096}, {"xxh64", "0000000000000000"}},
              {{"path", "experts/L000/E000.bin"}, {"size", 4096}, {"xxh64", "0000000000000000"}}}},
            {"tensors", shared},
            {"experts",
             {{{"layer", 0},
               {"expert", 0},
               {"file", "experts/L000/E000.bin"},
               {"offset", 0},
               {"size", 4096},
               {"gate", tensor("g", 0, {4, 2})},
               {"up", tensor("u", 64, {4, 2})},
               {"down", tensor("d", 128, {2, 4})}}}}};
  t.manifest = m;
  testing::write_file(t.dir / "manifest.json", m.dump());
  return t;
}

void expect_rejected(const TinyModel& t, const json& m, const std::string& what) {
  testing::write_file(t.dir / "manifest.json", m.dump());
  auto r = load_manifest(t.dir);
  ASSERT_FALSE(r.has_value()) << what;
  EXPECT_NE(r.error().message().find(what), std::string::npos) << r.error().message();
}

TEST(Manifest, LoadsAValidModelAndComputesSizes) {
  auto t = make_model("manifest ok 模型");
  auto m = load_manifest(t.dir);
  ASSERT_TRUE(m.has_value()) << m.error().to_string();
  EXPECT_EQ(m->expert(0, 0)->size, 4096u);
  EXPECT_EQ(m->total_params(), kSharedParams + 8u + 8u + 8u);
  EXPECT_EQ(m->active_params(), m->total_params());
  EXPECT_EQ(m->bytes_per_token_all_miss(), 4096u);
  EXPECT_EQ(describe_model_file(*m, "experts/L000/E000.bin"), "L0/E0");
  // Round trip through JSON.
  auto again = parse_manifest(m->to_json(), "round trip");
  ASSERT_TRUE(again.has_value()) << again.error().to_string();
  EXPECT_EQ(again->to_json(), m->to_json());
}

// A manifest the OS will not open (the open-file limit here) is named with the OS's reason and its fix, not called
// missing with "re-run convert".
TEST(Manifest, AnOpenRefusedByTheOsIsNotCalledMissing) {
  auto t = make_model("manifest emfile");
  colibri::sdk::testing::NoFreeDescriptors no_free;
  ASSERT_TRUE(no_free.active());
  auto m = load_manifest(t.dir);
  no_free.restore();
  ASSERT_FALSE(m.has_value());
  EXPECT_NE(m.error().message().find("ulimit -n"), std::string::npos) << m.error().message();
  EXPECT_EQ(m.error().message().find("is missing"), std::string::npos) << m.error().message();
}

TEST(Manifest, RejectsEverythingOutOfBounds) {
  auto t = make_model("manifest bad");
  json m = t.manifest;
  m["files"][0]["path"] = "../shared.bin";
  expect_rejected(t, m, "not a path inside the model");
  m = t.manifest;
  m["tensors"][1]["offset"] = 4090;
  expect_rejected(t, m, "lies outside shared.bin");
  m = t.manifest;
  m["tensors"][1]["size"] = 12;
  expect_rejected(t, m, "does not match f32 of this shape");
  m = t.manifest;
  m["tensors"][1]["type"] = "q9_9";
  expect_rejected(t, m, "unknown type 'q9_9'");
  m = t.manifest;
  m["experts"][0]["down"]["offset"] = 4090;
  expect_rejected(t, m, "lies outside");
  m = t.manifest;
  m["experts"] = json::array();
  expect_rejected(t, m, "L0/E0 is missing from the expert index");
  m = t.manifest;
  m["format_version"] = 99;
  expect_rejected(t, m, "format_version 99 is not supported");
  m = t.manifest;
  m["hparams"]["num_kv_heads"] = 3;
  expect_rejected(t, m, "num_heads must be a multiple of num_kv_heads");
  m = t.manifest;
  m["hparams"].erase("rope_theta");
  expect_rejected(t, m, "missing field \"rope_theta\"");
  m = t.manifest;
  m["files"][1]["size"] = 8192;
  expect_rejected(t, m, "L0/E0: file experts/L000/E000.bin is 4096 bytes, expected 8192");
  testing::write_file(t.dir / "manifest.json", "{ not json");
  EXPECT_FALSE(load_manifest(t.dir).has_value());
  fs::remove(t.dir / "manifest.json");
  auto r = load_manifest(t.dir);
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.error().message().find("conversion did not finish"), std::string::npos);
}

// load (and so verify) checks what a run needs: every shared tensor the hyper-parameters call for, in their shape.
TEST(Manifest, SharedTensorsMustFitTheHyperParameters) {
  auto t = make_model("manifest shapes");
  json m = t.manifest;
  m["hparams"]["vocab_size"] = 5;  // an edited hparams entry
  expect_rejected(t, m, "tensor 'token_embd.weight' has shape [4, 2] but the hyper-parameters imply [5, 2]");
  m = t.manifest;
  m["tensors"].erase(5);
  expect_rejected(t, m, "tensor 'blk.0.attn_k.weight' is missing; re-run convert");
  m = t.manifest;
  HyperParams sinks = tiny_hparams();
  sinks.attention_sinks = true;
  m["hparams"] = sinks.to_json();
  m["format_version"] = 2;
  expect_rejected(t, m, "tensor 'blk.0.attn_sinks.weight' is missing");
  m["hparams"].erase("swiglu_limit");  // one format-2 field without the others is not read as format 1
  expect_rejected(t, m, "missing field \"swiglu_limit\"");
  m = t.manifest;  // tied embeddings: output.weight may be absent, but if present must fit
  m["hparams"]["tie_word_embeddings"] = true;
  m["tensors"][2]["shape"] = {2, 4};
  expect_rejected(t, m, "tensor 'output.weight' has shape [2, 4] but the hyper-parameters imply [4, 2]");
  m["tensors"].erase(2);
  testing::write_file(t.dir / "manifest.json", m.dump());
  auto loaded = load_manifest(t.dir);
  EXPECT_TRUE(loaded.has_value()) << loaded.error().to_string();
  auto report = verify_model(t.dir);
  EXPECT_TRUE(report.manifest_ok);
  m = t.manifest;
  m["hparams"]["vocab_size"] = 5;
  testing::write_file(t.dir / "manifest.json", m.dump());
  report = verify_model(t.dir);
  EXPECT_FALSE(report.manifest_ok);
}

// The engine uses a tensor where it lies in its buffer: an f32 tensor at an odd offset would be read misaligned.
TEST(Manifest, TensorsThatStartWhereTheirTypeCannotAreRejected) {
  auto t = make_model("manifest misaligned");
  json m = t.manifest;
  m["tensors"][1]["offset"] = 66;
  expect_rejected(t, m,
                  "tensor 'output_norm.weight' starts at offset 66 of shared.bin, which f32 data cannot start at (it "
                  "needs a multiple of 4); re-run convert");
  m = t.manifest;
  m["experts"][0]["up"]["offset"] = 70;
  expect_rejected(t, m, "expert L0/E0 up starts at offset 70 of experts/L000/E000.bin, which f32 data cannot start at");
  m = t.manifest;
  m["tensors"][1]["offset"] = 68;  // a multiple of 4 is enough for f32
  testing::write_file(t.dir / "manifest.json", m.dump());
  EXPECT_TRUE(load_manifest(t.dir).has_value());
  m = t.manifest;
  for (auto& x : m["tensors"]) {  // bf16: two-byte values (the sizes follow the type)
    x["type"] = "bf16";
    x["size"] = x["size"].get<std::uint64_t>() / 2;
  }
  m["tensors"][1]["offset"] = 66;
  testing::write_file(t.dir / "manifest.json", m.dump());
  auto two = load_manifest(t.dir);
  EXPECT_TRUE(two.has_value()) << two.error().message();
  m["tensors"][1]["offset"] = 67;
  expect_rejected(t, m, "which bf16 data cannot start at (it needs a multiple of 2)");
}

TEST(Manifest, PartOffsetsThatWrapAroundAreRejectedByName) {
  auto t = make_model("manifest wrap");
  json m = t.manifest;
  // offset + size wraps to 16: inside the blob if added naively.
  m["experts"][0]["down"]["offset"] = std::numeric_limits<std::uint64_t>::max() - 15;
  expect_rejected(t, m, "experts[0].down: part [18446744073709551600, +32) of expert L0/E0 lies outside its blob");
  m = t.manifest;
  m["experts"][0]["up"]["offset"] = 4096 - 32 + 1;
  expect_rejected(t, m, "experts[0].up: part [4065, +32) of expert L0/E0 lies outside its blob [0, +4096)");
  m = t.manifest;
  m["experts"][0]["up"]["offset"] = 4096 - 32;  // exactly at the end is fine
  testing::write_file(t.dir / "manifest.json", m.dump());
  EXPECT_TRUE(load_manifest(t.dir).has_value());
}

// gpt-oss's additions: format 2 only when used, expert biases inside the blob, checked like the weights.
TEST(Manifest, ExpertBiasesOfFormatTwoAreLoadedAndCheckedLikeTheWeights) {
  auto t = make_model("manifest gpt-oss");
  auto plain = load_manifest(t.dir);
  ASSERT_TRUE(plain.has_value()) << plain.error().to_string();
  EXPECT_EQ(plain->to_json()["format_version"], 1);  // older colibri still reads a model without the new fields
  EXPECT_FALSE(plain->to_json()["hparams"].contains("expert_activation"));
  json m = t.manifest;
  HyperParams h = tiny_hparams();
  h.expert_activation = "swiglu_clamped";
  h.attention_sinks = true;
  h.sliding_window = 3;
  h.sliding_layers = {0};
  m["hparams"] = h.to_json();
  m["format_version"] = 2;
  m["experts"][0]["gate_bias"] = tensor("gb", 256, {4});
  m["experts"][0]["up_bias"] = tensor("ub", 512, {4});
  m["experts"][0]["down_bias"] = tensor("db", 768, {2});
  json sinks = tensor("blk.0.attn_sinks.weight", 640, {1});
  sinks["file"] = "shared.bin";
  m["tensors"].push_back(sinks);
  testing::write_file(t.dir / "manifest.json", m.dump());
  auto loaded = load_manifest(t.dir);
  ASSERT_TRUE(loaded.has_value()) << loaded.error().to_string();
  const auto* e = loaded->expert(0, 0);
  ASSERT_TRUE(e->has_bias());
  EXPECT_EQ(e->parts().size(), 6u);
  EXPECT_EQ(e->up_bias.offset, 512u);
  EXPECT_EQ(loaded->hparams.layer_window(0), 3);
  EXPECT_EQ(loaded->hparams.layer_window(1), 0);
  EXPECT_EQ(loaded->total_params(), kSharedParams + 1u + 8u + 8u + 8u + 4u + 4u + 2u);
  const json again = loaded->to_json();
  EXPECT_EQ(again["format_version"], 2);
  EXPECT_EQ(again["experts"][0]["down_bias"]["offset"], 768);
  json bad = m;
  bad["experts"][0].erase("down_bias");
  expect_rejected(t, bad, "experts[0].down_bias: missing field \"name\"");
  bad = m;
  bad["experts"][0]["up_bias"]["offset"] = 4090;
  expect_rejected(t, bad, "experts[0].up_bias: part [4090, +16) of expert L0/E0 lies outside its blob");
  bad = m;
  bad["experts"][0]["down_bias"] = tensor("db", 768, {4});
  expect_rejected(t, bad, "L0/E0 has shapes that do not match the hyper-parameters");
  bad = m;
  bad["hparams"]["sliding_layers"] = {5};
  expect_rejected(t, bad, "sliding_layers lists a layer outside 0..num_layers-1");
  bad = m;
  bad["hparams"]["expert_activation"] = "geglu";
  expect_rejected(t, bad, "expert_activation 'geglu' is not supported");
  bad = m;
  bad["format_version"] = kManifestFormatVersion + 1;
  expect_rejected(t, bad,
                  "format_version " + std::to_string(kManifestFormatVersion + 1) +
                      " is not supported (this colibri reads 1 to " + std::to_string(kManifestFormatVersion) + ")");
}

// GLM's additions: format 3 only when used; the fields come all together, typed and in range.
TEST(Manifest, GlmRouterAndPartialRotaryAreFormatThree) {
  auto t = make_model("manifest glm");
  HyperParams wide = tiny_hparams();
  wide.hidden_size = wide.head_dim = 8;
  EXPECT_EQ(wide.format_version(), 1);
  EXPECT_EQ(wide.rope_dims(), 8);
  wide.rotary_dims = 8;  // the whole head is no partial rotary
  EXPECT_EQ(wide.format_version(), 1);
  wide.rotary_dims = 4;
  EXPECT_EQ(wide.format_version(), 3);
  EXPECT_EQ(wide.rope_dims(), 4);
  wide.nextn_layers = 1;
  const json wj = wide.to_json();
  EXPECT_FALSE(wj.contains("nextn_layers"));  // a conversion detail
  auto wide_back = HyperParams::from_json(wj);
  ASSERT_TRUE(wide_back.has_value()) << wide_back.error().to_string();
  EXPECT_EQ(wide_back->rotary_dims, 4);
  EXPECT_EQ(wide_back->router_scoring, "softmax");

  HyperParams h = tiny_hparams();
  h.router_scoring = "sigmoid";
  h.router_selection_bias = true;
  h.routed_scaling_factor = 2.5;
  EXPECT_EQ(h.format_version(), 3);
  const json j = h.to_json();
  auto back = HyperParams::from_json(j);
  ASSERT_TRUE(back.has_value()) << back.error().to_string();
  EXPECT_EQ(back->router_scoring, "sigmoid");
  EXPECT_TRUE(back->router_selection_bias);
  EXPECT_DOUBLE_EQ(back->routed_scaling_factor, 2.5);
  EXPECT_EQ(back->rotary_dims, 0);
  json m = t.manifest;
  m["hparams"] = j;
  m["format_version"] = 3;
  testing::write_file(t.dir / "manifest.json", m.dump());
  auto loaded = load_manifest(t.dir);
  ASSERT_TRUE(loaded.has_value()) << loaded.error().to_string();
  EXPECT_EQ(loaded->to_json()["format_version"], 3);
  json bad = m;
  bad["hparams"].erase("rotary_dims");
  expect_rejected(t, bad, "missing field \"rotary_dims\"");
  bad = m;
  bad["hparams"]["router_scoring"] = "softmax_then_sigmoid";
  expect_rejected(t, bad, "router_scoring 'softmax_then_sigmoid' is not supported (softmax, sigmoid)");
  bad = m;
  bad["hparams"]["routed_scaling_factor"] = 0;
  expect_rejected(t, bad, "routed_scaling_factor is 0.0; it must be in (0, 1000]");
  bad = m;
  bad["hparams"]["rotary_dims"] = 3;
  expect_rejected(t, bad, "rotary_dims is 3; it must be even and in 0..head_dim (2)");
  bad = m;
  bad["hparams"]["rotary_dims"] = 4;
  expect_rejected(t, bad, "rotary_dims is 4; it must be even and in 0..head_dim (2)");
  bad = m;
  bad["hparams"]["router_selection_bias"] = "yes";
  expect_rejected(t, bad, "field \"router_selection_bias\" must be true or false");
}

TEST(Manifest, LatentAttentionIsFormatFour) {
  auto t = make_model("manifest mla");
  HyperParams h = tiny_hparams();
  h.head_dim = 6;
  h.rotary_dims = 2;
  h.rope_interleaved = true;
  h.kv_lora_rank = 32;
  h.q_lora_rank = 16;
  h.v_head_dim = 4;
  ASSERT_TRUE(h.validate()) << h.validate().to_string();
  EXPECT_EQ(h.format_version(), 4);
  EXPECT_EQ(h.qk_nope_dim(), 4);
  EXPECT_EQ(h.mla_cache_dim(), 34);
  const json j = h.to_json();
  auto back = HyperParams::from_json(j);
  ASSERT_TRUE(back.has_value()) << back.error().to_string();
  EXPECT_EQ(back->kv_lora_rank, 32);
  EXPECT_EQ(back->q_lora_rank, 16);
  EXPECT_EQ(back->v_head_dim, 4);
  EXPECT_TRUE(back->rope_interleaved);
  json m = t.manifest;
  m["hparams"] = j;
  m["format_version"] = 4;
  // (A whole MLA model's load is in model.convert and engine.reference: the plan's tensors are many.)
  json bad = m;
  bad["hparams"].erase("v_head_dim");
  expect_rejected(t, bad, "missing field \"v_head_dim\"");
  bad = m;
  bad["hparams"]["rotary_dims"] = 0;
  expect_rejected(t, bad, "multi-head latent attention needs it in 2..head_dim - 2");
  bad = m;
  bad["hparams"]["kv_lora_rank"] = 0;
  expect_rejected(t, bad, "kv_lora_rank");
  // Routing within groups.
  HyperParams g = tiny_hparams();
  g.architecture = "deepseek_v3";
  g.dense = false;
  g.n_experts = 8;
  g.n_experts_per_tok = 2;
  g.moe_intermediate_size = 4;
  g.router_groups = 4;
  g.router_groups_used = 2;
  ASSERT_TRUE(g.validate()) << g.validate().to_string();
  EXPECT_EQ(g.format_version(), 4);
  auto g_back = HyperParams::from_json(g.to_json());
  ASSERT_TRUE(g_back.has_value()) << g_back.error().to_string();
  EXPECT_EQ(g_back->router_groups, 4);
  EXPECT_EQ(g_back->router_groups_used, 2);
  EXPECT_EQ(g_back->router_group_score, "top2_sum");
  g.router_group_score = "mean";
  EXPECT_NE(g.validate().message().find("router_group_score 'mean' is not supported (top2_sum, max)"),
            std::string::npos);
  g.router_group_score = "top2_sum";
  g.router_groups = 3;
  EXPECT_NE(g.validate().message().find("router_groups is 3; it must divide n_experts (8) into groups of two"),
            std::string::npos);
  g.router_groups = 4;
  g.router_groups_used = 5;
  EXPECT_NE(g.validate().message().find("router_groups_used is 5; it must be in 1..4"), std::string::npos);
  // A colibri that reads format 3 at most says so, rather than running the model without its latent attention.
  bad = m;
  bad["format_version"] = kManifestFormatVersion + 1;
  expect_rejected(t, bad, "format_version " + std::to_string(kManifestFormatVersion + 1) + " is not supported");
}

void expect_invalid(const HyperParams& h, const std::string& what) {
  auto s = h.validate();
  ASSERT_FALSE(s.is_ok()) << what;
  EXPECT_NE(s.message().find(what), std::string::npos) << s.message();
}

// Llama 4's layer lists and router (format 5): read back as written, and refused where they cannot run.
TEST(HyperParams, Llama4LayerListsAreFormatFiveAndChecked) {
  HyperParams h = tiny_hparams();
  h.architecture = "llama4";
  h.num_layers = 4;
  h.dense = false;
  h.n_experts = 4;
  h.moe_intermediate_size = 16;
  h.router_scoring = "sigmoid";
  ASSERT_TRUE(h.validate().is_ok()) << h.validate().message();
  EXPECT_LT(h.format_version(), 5);
  h.nope_layers = {3};
  h.attention_chunk = 8;
  h.chunked_layers = {0, 1, 2};
  h.attn_temperature_floor = 8192;
  h.attn_temperature_scale = 0.1;
  h.router_weight_on_input = true;
  h.qk_norm = "l2";
  ASSERT_TRUE(h.validate().is_ok()) << h.validate().message();
  EXPECT_EQ(h.format_version(), 5);
  auto back = HyperParams::from_json(h.to_json());
  ASSERT_TRUE(back.has_value()) << back.error().to_string();
  EXPECT_EQ(back->nope_layers, h.nope_layers);
  EXPECT_EQ(back->chunked_layers, h.chunked_layers);
  EXPECT_EQ(back->attention_chunk, 8);
  EXPECT_EQ(back->attn_temperature_floor, 8192);
  EXPECT_TRUE(back->router_weight_on_input);
  auto j = h.to_json();
  j.erase("attention_chunk");  // one field of format 5 present asks for all of them
  EXPECT_FALSE(HyperParams::from_json(j).has_value());
  HyperParams bad = h;
  bad.chunked_layers = {4};
  expect_invalid(bad, "nope_layers / chunked_layers list a layer outside 0..num_layers-1");
  bad = h;
  bad.sliding_window = 16;
  expect_invalid(bad, "attention_chunk and sliding_window exclude each other");
  bad = h;
  bad.n_experts_per_tok = 2;
  expect_invalid(bad, "router_weight_on_input needs one expert a token (n_experts_per_tok 2)");
  bad = h;
  bad.attention_chunk = 0;
  expect_invalid(bad, "chunked_layers needs attention_chunk > 0");
  bad = h;
  bad.attn_temperature_floor = -1;
  expect_invalid(bad, "attn_temperature_floor must be 0 (off) or positive");
}

TEST(HyperParams, AbsurdCountsAndSizesAreRejectedNamingTheKey) {
  ASSERT_TRUE(tiny_hparams().validate().is_ok());
  auto h = tiny_hparams();
  h.num_layers = 99999;
  expect_invalid(h, "num_layers (config num_hidden_layers, GGUF block_count) is 99999; it must be in 1..4096");
  h = tiny_hparams();
  h.num_layers = 1ll << 40;
  expect_invalid(h, "num_layers");
  h = tiny_hparams();
  h.hidden_size = 1ll << 30;
  expect_invalid(h, "hidden_size is 1073741824");
  h = tiny_hparams();
  h.max_position_embeddings = -5;
  expect_invalid(h, "max_position_embeddings is -5");
  h = tiny_hparams();
  h.intermediate_size = 0;
  expect_invalid(h, "intermediate_size is 0");
  // Each count within its cap, the product not: the expert index would need billions of entries.
  h = tiny_hparams();
  h.dense = false;
  h.num_layers = 4000;
  h.n_experts = 65535;
  h.n_experts_per_tok = 2;
  h.moe_intermediate_size = 4;
  expect_invalid(h, "num_layers x n_experts is 262140000");
  h.n_experts = 32;
  EXPECT_TRUE(h.validate().is_ok()) << h.validate().message();
  h.n_experts = 70000;
  expect_invalid(h, "n_experts (config num_local_experts / num_experts) is 70000");
}

TEST(HyperParams, EndAndBeginningIdsMustBeInTheVocabulary) {
  auto h = tiny_hparams();
  h.eos_token_ids = {2, h.vocab_size - 1};
  h.bos_token_id = -1;
  EXPECT_TRUE(h.validate().is_ok()) << h.validate().message();
  h.eos_token_ids = {2, h.vocab_size};
  expect_invalid(h, "eos_token_id " + std::to_string(h.vocab_size) + " is outside the vocabulary (vocab_size " +
                        std::to_string(h.vocab_size) + ")");
  h = tiny_hparams();
  h.bos_token_id = h.vocab_size + 7;
  expect_invalid(h, "bos_token_id " + std::to_string(h.vocab_size + 7) + " is outside the vocabulary");
}

TEST(HyperParams, RopeScalingValuesTheRopeDividesByAreChecked) {
  auto with = [](json rs) {
    auto h = tiny_hparams();
    h.rope_scaling = std::move(rs);
    return h;
  };
  EXPECT_TRUE(with({{"rope_type", "linear"}, {"factor", 2.0}}).validate().is_ok());
  expect_invalid(with({{"rope_type", "llama3"},
                       {"factor", 0},
                       {"low_freq_factor", 1},
                       {"high_freq_factor", 4},
                       {"original_max_position_embeddings", 8192}}),
                 "rope_scaling.factor is 0; it must be > 0");
  expect_invalid(with({{"rope_type", "linear"}, {"factor", -3}}), "rope_scaling.factor is -3");
  expect_invalid(with({{"rope_type", "yarn"}, {"factor", std::numeric_limits<double>::infinity()}}),
                 "rope_scaling.factor");
  expect_invalid(with({{"rope_type", "yarn"}, {"factor", 4}, {"original_max_position_embeddings", 0}}),
                 "rope_scaling.original_max_position_embeddings is 0");
  expect_invalid(with({{"rope_type", "dynamic"}, {"factor", 4}, {"original_max_position_embeddings", 1e300}}),
                 "rope_scaling.original_max_position_embeddings is 1e+300");
  expect_invalid(with({{"rope_type", "yarn"}, {"factor", 4}, {"mscale", "1"}}),
                 "rope_scaling.mscale is \"1\"; it must be a finite number");
  expect_invalid(with({{"rope_type", 5}}), "rope_scaling.rope_type must be a string");
  expect_invalid(with({{"rope_type", "llama3"}, {"factor", 8}, {"low_freq_factor", 0}}),
                 "rope_scaling.low_freq_factor is 0");
  expect_invalid(with(json::array()), "rope_scaling must be an object or null");
  expect_invalid(with({{"rope_type", "longrope"}, {"factor", 4}}),
                 "rope_scaling.rope_type 'longrope' is not supported (supported: default, linear, dynamic, llama3, "
                 "yarn, freq_factors)");
  expect_invalid(with({{"rope_type", "freq_factors"}, {"factors", {1.0, 0.0}}}),
                 "rope_scaling.factors[1] is 0.0; it must be a number > 0");
  expect_invalid(with({{"rope_type", "freq_factors"}, {"factors", "x"}}), "rope_scaling.factors must be a non-empty");
  expect_invalid(with({{"type", "su"}}), "rope_scaling.type 'su' is not supported");
  EXPECT_TRUE(with({{"rope_type", "yarn"}, {"type", "su"}, {"factor", 4}}).validate().is_ok());
  auto h = tiny_hparams();
  h.rope_theta = 1;
  expect_invalid(h, "rope_theta is 1.0; it must be above 1 and at most 1e12");
  h.rope_theta = 1e300;
  expect_invalid(h, "rope_theta is 1e+300");
  h.rope_theta = 1e8;
  EXPECT_TRUE(h.validate().is_ok());
  h.clip_qkv = -1;  // would be read as off
  expect_invalid(h, "clip_qkv is -1.0; it must be 0 (off) or a positive bound");
  h.clip_qkv = 8;
  EXPECT_TRUE(h.validate().is_ok());
}

TEST(Manifest, BadHyperParametersNameTheManifestAndTheField) {
  auto t = make_model("manifest hparams");
  json m = t.manifest;
  m["hparams"]["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 0}};
  expect_rejected(t, m, "rope_scaling.factor is 0; it must be > 0 (in hparams); re-run convert");
  m = t.manifest;
  m["hparams"]["max_position_embeddings"] = -5;
  expect_rejected(t, m, "max_position_embeddings is -5");
  // Numbers of the wrong kind are refused, not rounded or wrapped.
  m = t.manifest;
  m["hparams"]["num_layers"] = 1.5;
  expect_rejected(t, m, "manifest hparams: field \"num_layers\" must be a whole number, not 1.5");
  m = t.manifest;
  m["hparams"]["eos_token_ids"] = json::array({2, 2.5});
  expect_rejected(t, m, "field \"eos_token_ids\" must be a list of whole numbers, not [2,2.5]");
  m = t.manifest;
  m["hparams"]["dense"] = 1;
  expect_rejected(t, m, "field \"dense\" must be true or false, not 1");
  m = t.manifest;
  m["tensors"][1]["offset"] = -1;
  expect_rejected(t, m, "field \"offset\" must be a whole number of 0 or more, not -1");
  m = t.manifest;
  m["hparams"]["rope_theta"] = 10000;  // an integer where a float is expected is fine
  testing::write_file(t.dir / "manifest.json", m.dump());
  EXPECT_TRUE(load_manifest(t.dir).has_value());
}

TEST(Manifest, VerifyReportsChecksumMismatchByExpert) {
  auto t = make_model("manifest verify");
  auto r = verify_model(t.dir);
  EXPECT_TRUE(r.manifest_ok);
  ASSERT_EQ(r.problems.size(), 2u);  // the hand-made checksums are zero
  EXPECT_EQ(r.problems[1].message, "L0/E0: checksum mismatch in experts/L000/E000.bin; re-run convert");
  EXPECT_EQ(r.problems[0].location, "shared");
}

TEST(ModelPaths, ResolvesDirectoriesAndNamesUnderTheModelsDir) {
  auto base = testing::temp_dir("paths 模型 dir");
  fs::create_directories(base / "models" / "my model");
  auto byname = resolve_model_path("my model", base / "models");
  ASSERT_TRUE(byname.has_value()) << byname.error().to_string();
  EXPECT_EQ(*byname, base / "models" / "my model");
  auto bypath = resolve_model_path((base / "models" / "my model").string(), "/nonexistent");
  ASSERT_TRUE(bypath.has_value());
  auto missing = resolve_model_path("nope", base / "models");
  ASSERT_FALSE(missing.has_value());
  EXPECT_NE(missing.error().message().find((base / "models" / "nope").string()), std::string::npos);
  std::ofstream(base / "model.gguf") << "GGUF";
  auto file = resolve_model_path((base / "model.gguf").string(), base / "models");
  ASSERT_FALSE(file.has_value());
  EXPECT_NE(file.error().message().find("is a file, not a colibri model directory; convert it first"),
            std::string::npos)
      << file.error().message();
  // A link that loops or names nothing (an unmounted disk) is said as such, not as a model that is not there.
  fs::create_symlink(base / "loop", base / "loop");
  fs::create_symlink("/nonexistent/colibri-model", base / "dangling");
  for (const auto& [name, why] :
       {std::pair{"loop", "Too many levels of symbolic links"}, std::pair{"dangling", "No such file or directory"}}) {
    auto link = resolve_model_path((base / name).string(), base / "models");
    ASSERT_FALSE(link.has_value()) << name;
    EXPECT_NE(link.error().message().find("is a link to"), std::string::npos) << link.error().message();
    EXPECT_NE(link.error().message().find(why), std::string::npos) << link.error().message();
  }
  ::setenv("XDG_DATA_HOME", (base / "xdg").c_str(), 1);
  EXPECT_EQ(default_models_dir(), base / "xdg" / "colibri" / "models");
  ::unsetenv("XDG_DATA_HOME");
  ::setenv("HOME", "/home/someone", 1);
  EXPECT_EQ(default_models_dir(), fs::path("/home/someone/.local/share/colibri/models"));
}

}  // namespace
}  // namespace colibri::model
