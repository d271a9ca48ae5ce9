#include "model/architecture.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>

namespace colibri::model {
namespace {

using nlohmann::json;

// Each patch of `base` is refused, with a message that holds its text.
template <std::size_t N>
void expect_refused(const json& base, const std::pair<const char*, json> (&bad)[N]) {
  for (const auto& [want, patch] : bad) {
    json c = base;
    c.update(patch);
    auto h = hparams_from_hf_config(c, "config.json");
    ASSERT_FALSE(h) << patch.dump();
    EXPECT_NE(h.error().message().find(want), std::string::npos) << h.error().message();
  }
}

// The shared tensor `name` of a plan, or null.
const PlannedTensor* find_planned(const ModelPlan& plan, const std::string& name) {
  for (const auto& t : plan.shared) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

// The keys every config needs; the rest are left out to see their defaults.
json minimal(const std::string& hf_arch) {
  json c{{"architectures", {hf_arch}}, {"vocab_size", 64},           {"hidden_size", 64},      {"num_hidden_layers", 2},
         {"num_attention_heads", 16},  {"intermediate_size", 48},    {"num_local_experts", 4}, {"num_experts", 4},
         {"num_experts_per_tok", 2},   {"moe_intermediate_size", 16}};
  return c;
}

// A key config.json leaves out takes the default of transformers' config class for that architecture: Mixtral's
// eps is 1e-5, not Llama's 1e-6 (a wrong eps changes every logit).
TEST(HfConfigDefaults, FollowTheArchitecturesConfigClass) {
  struct Want {
    const char* arch;
    double eps, theta;
    std::int64_t kv_heads, max_positions, sliding_window;
  };
  for (const Want& w :
       {Want{"MixtralForCausalLM", 1e-5, 1e6, 8, 131072, 0}, Want{"MistralForCausalLM", 1e-6, 10000.0, 8, 131072, 4096},
        Want{"LlamaForCausalLM", 1e-6, 10000.0, 16, 2048, 0}, Want{"Qwen2MoeForCausalLM", 1e-6, 10000.0, 16, 32768, 0},
        Want{"Qwen3MoeForCausalLM", 1e-6, 10000.0, 4, 32768, 0},
        Want{"OlmoeForCausalLM", 1e-5, 10000.0, 16, 4096, 0}}) {
    auto h = hparams_from_hf_config(minimal(w.arch), "config.json");
    ASSERT_TRUE(h) << w.arch << ": " << h.error().message();
    EXPECT_EQ(h->rms_norm_eps, w.eps) << w.arch;
    EXPECT_EQ(h->rope_theta, w.theta) << w.arch;
    EXPECT_EQ(h->num_kv_heads, w.kv_heads) << w.arch;
    EXPECT_EQ(h->max_position_embeddings, w.max_positions) << w.arch;
    EXPECT_EQ(h->sliding_window, w.sliding_window) << w.arch;
  }
  // Given keys win over every default.
  auto c = minimal("MixtralForCausalLM");
  c["rms_norm_eps"] = 1e-6;
  c["num_key_value_heads"] = 2;
  c["max_position_embeddings"] = 1000;
  auto h = hparams_from_hf_config(c, "config.json");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->rms_norm_eps, 1e-6);
  EXPECT_EQ(h->num_kv_heads, 2);
  EXPECT_EQ(h->max_position_embeddings, 1000);
}

// A value of the wrong type, or a layer the model lacks, is refused by name: read as absent, it would change the
// model (hidden_act 5 taken as silu; mlp_only_layers [5] of 2 layers dropped).
TEST(HfConfigValues, WrongTypesAndLayersTheModelLacksAreRefusedByName) {
  const std::pair<const char*, json> bad[] = {
      {"field \"hidden_act\" is 5", json{{"hidden_act", 5}}},
      {"field \"hidden_act\" is [\"silu\"]", json{{"hidden_act", {"silu"}}}},
      {"mlp_only_layers must list layer numbers", json{{"mlp_only_layers", "0"}}},
      {"mlp_only_layers lists layer 5, but the model has 2", json{{"mlp_only_layers", {5}}}},
      {"mlp_only_layers lists layer -1", json{{"mlp_only_layers", {-1}}}},
  };
  expect_refused(minimal("Qwen3MoeForCausalLM"), bad);
  // A default that cannot hold is named as the default it is (the key is not in config.json to be fixed).
  auto few_heads = minimal("MixtralForCausalLM");
  few_heads["num_attention_heads"] = 4;
  auto refused = hparams_from_hf_config(few_heads, "config.json");
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message().find("has no num_key_value_heads, and its architecture's default (8"),
            std::string::npos)
      << refused.error().message();
  auto c = minimal("Qwen3MoeForCausalLM");
  c["hidden_act"] = nullptr;  // null is absent: the class's default
  c["mlp_only_layers"] = {1};
  auto h = hparams_from_hf_config(c, "config.json");
  ASSERT_TRUE(h) << h.error().message();
  EXPECT_EQ(h->hidden_act, "silu");
  EXPECT_EQ(h->mlp_only_layers, (std::vector<std::int64_t>{1}));
}

// GLM-4.5-Air's config.json, tiny: what each GLM field becomes.
json glm_air() {
  return json{{"architectures", {"Glm4MoeForCausalLM"}},
              {"vocab_size", 64},
              {"hidden_size", 64},
              {"head_dim", 32},  // not hidden / heads, as in GLM
              {"num_hidden_layers", 3},
              {"num_attention_heads", 4},
              {"num_key_value_heads", 2},
              {"intermediate_size", 96},
              {"moe_intermediate_size", 16},
              {"n_routed_experts", 8},
              {"num_experts_per_tok", 2},
              {"n_shared_experts", 1},
              {"routed_scaling_factor", 1.0},
              {"first_k_dense_replace", 1},
              {"partial_rotary_factor", 0.5},
              {"attention_bias", true},
              {"use_qk_norm", false},
              {"norm_topk_prob", true},
              {"n_group", 1},
              {"topk_group", 1},
              {"num_nextn_predict_layers", 1}};
}

TEST(HfConfigValues, GlmMoeReadsItsRouterSharedExpertDenseLayersAndPartialRotary) {
  auto c = glm_air();
  c["routed_scaling_factor"] = 2.5;
  auto h = hparams_from_hf_config(c, "config.json");
  ASSERT_TRUE(h) << h.error().message();
  EXPECT_EQ(h->architecture, "glm4_moe");
  EXPECT_EQ(h->head_dim, 32);
  EXPECT_EQ(h->rotary_dims, 16);
  EXPECT_EQ(h->rope_dims(), 16);
  EXPECT_TRUE(h->attention_qkv_bias);
  EXPECT_FALSE(h->attention_out_bias);
  EXPECT_EQ(h->qk_norm, "none");
  EXPECT_EQ(h->router_scoring, "sigmoid");
  EXPECT_TRUE(h->router_selection_bias);
  EXPECT_DOUBLE_EQ(h->routed_scaling_factor, 2.5);
  EXPECT_TRUE(h->norm_topk_prob);
  EXPECT_EQ(h->n_experts, 8);
  EXPECT_EQ(h->shared_expert_intermediate_size, 16);
  EXPECT_FALSE(h->shared_expert_gate);
  EXPECT_FALSE(h->layer_is_sparse(0));
  EXPECT_TRUE(h->layer_is_sparse(1));
  EXPECT_EQ(h->layer_ffn_size(0), 96);
  EXPECT_EQ(h->nextn_layers, 1);
  EXPECT_EQ(h->rms_norm_eps, 1e-5);  // Glm4MoeConfig's default
  EXPECT_EQ(h->format_version(), 3);
  // GLM-4.5 (355B): q/k norms per head, two shared experts; transformers >= 4.56 keeps the factor in rope_parameters.
  c["use_qk_norm"] = true;
  c["n_shared_experts"] = 2;
  c.erase("partial_rotary_factor");
  c["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e6}, {"partial_rotary_factor", 0.25}};
  h = hparams_from_hf_config(c, "config.json");
  ASSERT_TRUE(h) << h.error().message();
  EXPECT_EQ(h->qk_norm, "per_head");
  EXPECT_EQ(h->shared_expert_intermediate_size, 32);
  EXPECT_EQ(h->rotary_dims, 8);
  EXPECT_EQ(h->rope_theta, 1e6);
  // The plan names GLM's tensors: the plural shared_experts, the selection bias, the dense first layer.
  const ModelPlan plan = build_plan(*h, "glm4moe");
  auto find = [&](const std::string& name) { return find_planned(plan, name); };
  ASSERT_NE(find("blk.1.exp_probs_b.bias"), nullptr);
  EXPECT_EQ(find("blk.1.exp_probs_b.bias")->hf_name, "model.layers.1.mlp.gate.e_score_correction_bias");
  EXPECT_EQ(find("blk.0.exp_probs_b.bias"), nullptr);  // layer 0 is dense
  ASSERT_NE(find("blk.2.ffn_up_shexp.weight"), nullptr);
  EXPECT_EQ(find("blk.2.ffn_up_shexp.weight")->hf_name, "model.layers.2.mlp.shared_experts.up_proj.weight");
  EXPECT_EQ(find("blk.2.ffn_norm.weight")->gguf_name, "blk.2.post_attention_norm.weight");
  EXPECT_EQ(find("blk.2.attn_q.weight")->gguf_permute_heads, 0);  // NeoX order already
  ASSERT_EQ(plan.experts[0].size(), 1u);
  EXPECT_EQ(plan.experts[0][0][0].hf_name, "model.layers.0.mlp.gate_proj.weight");
  EXPECT_EQ(plan.experts[1].size(), 8u);
  // A plain Qwen2-MoE keeps its singular shared_expert.
  auto q = minimal("Qwen2MoeForCausalLM");
  q["shared_expert_intermediate_size"] = 8;
  auto qh = hparams_from_hf_config(q, "config.json");
  ASSERT_TRUE(qh) << qh.error().message();
  const ModelPlan qplan = build_plan(*qh);
  EXPECT_TRUE(std::any_of(qplan.shared.begin(), qplan.shared.end(), [](const PlannedTensor& t) {
    return t.hf_name == "model.layers.0.mlp.shared_expert.up_proj.weight";
  }));
}

TEST(HfConfigValues, GlmMoeRefusesWhatItCannotRunByName) {
  const std::pair<const char*, json> bad[] = {
      {"router_groups is 8; it must divide n_experts (8) into groups of two experts or more",
       json{{"n_group", 8}, {"topk_group", 4}}},
      {"router_groups_used is 1; it must be in 1..4 and its groups must hold n_experts_per_tok (4) experts",
       json{{"n_group", 4}, {"topk_group", 1}, {"num_experts_per_tok", 4}}},
      {"partial_rotary_factor 0.0 gives 0 rotated dims", json{{"partial_rotary_factor", 0.0}}},
      {"partial_rotary_factor 0.1 gives 3 rotated dims of head_dim 32", json{{"partial_rotary_factor", 0.1}}},
      {"first_k_dense_replace is 4; it must be in 0..num_hidden_layers (3)", json{{"first_k_dense_replace", 4}}},
      {"routed_scaling_factor is -1.0; it must be in (0, 1000]", json{{"routed_scaling_factor", -1.0}}},
      {"missing required field \"n_routed_experts\"", json{{"n_routed_experts", nullptr}}},
      {"num_layers", json{{"num_hidden_layers", 1LL << 40}, {"first_k_dense_replace", 1LL << 40}}},  // no endless loop
      {"num_nextn_predict_layers is -1; it must be in 0..num_hidden_layers (3)",
       json{{"num_nextn_predict_layers", -1}}},
      {"num_nextn_predict_layers is 4611686018427387904; it must be in 0..num_hidden_layers (3)",
       json{{"num_nextn_predict_layers", 4611686018427387904LL}}},
      {"n_shared_experts is 4611686018427387904; it must be in 0..64",
       json{{"n_shared_experts", 4611686018427387904LL}}},
      {"partial_rotary_factor 1e+300 gives 0 rotated dims", json{{"partial_rotary_factor", 1e300}}},
  };
  expect_refused(glm_air(), bad);
  // n_group with every group chosen is no limit at all.
  auto c = glm_air();
  c["n_group"] = 4;
  c["topk_group"] = 4;
  auto all = hparams_from_hf_config(c, "config.json");
  ASSERT_TRUE(all) << all.error().message();
  EXPECT_FALSE(all->grouped_routing());
  EXPECT_EQ(all->format_version(), 3);
  // Within the best 2 of 4 groups, as DeepSeek-V3: format 4.
  c["topk_group"] = 2;
  auto grouped = hparams_from_hf_config(c, "config.json");
  ASSERT_TRUE(grouped) << grouped.error().message();
  EXPECT_TRUE(grouped->grouped_routing());
  EXPECT_EQ(grouped->router_groups, 4);
  EXPECT_EQ(grouped->router_groups_used, 2);
  EXPECT_EQ(grouped->router_group_score, "top2_sum");
  EXPECT_EQ(grouped->format_version(), 4);
}

// dots.llm1's config.json, tiny (the released one has no sliding layer: max_window_layers = num_hidden_layers).
json dots1() {
  return json{{"architectures", {"Dots1ForCausalLM"}},
              {"vocab_size", 64},
              {"hidden_size", 64},
              {"num_hidden_layers", 4},
              {"num_attention_heads", 4},
              {"num_key_value_heads", 4},
              {"intermediate_size", 96},
              {"moe_intermediate_size", 16},
              {"n_routed_experts", 8},
              {"num_experts_per_tok", 2},
              {"n_shared_experts", 2},
              {"routed_scaling_factor", 2.5},
              {"first_k_dense_replace", 1},
              {"scoring_func", "noaux_tc"},
              {"norm_topk_prob", true},
              {"n_group", 1},
              {"topk_group", 1},
              {"attention_bias", false},
              {"sliding_window", nullptr},
              {"max_window_layers", 4},
              {"rms_norm_eps", 1e-5},
              {"rope_theta", 1e7}};
}

TEST(HfConfigValues, Dots1ReadsQwen3AttentionAndDeepSeekV3Routing) {
  auto h = hparams_from_hf_config(dots1(), "config.json");
  ASSERT_TRUE(h) << h.error().message();
  EXPECT_EQ(h->architecture, "dots1");
  EXPECT_EQ(h->head_dim, 16);
  EXPECT_EQ(h->rope_dims(), 16);  // the whole head
  EXPECT_FALSE(h->rope_interleaved);
  EXPECT_EQ(h->qk_norm, "per_head");
  EXPECT_FALSE(h->attention_qkv_bias);
  EXPECT_FALSE(h->attention_out_bias);
  EXPECT_EQ(h->router_scoring, "sigmoid");
  EXPECT_TRUE(h->router_selection_bias);
  EXPECT_TRUE(h->norm_topk_prob);
  EXPECT_DOUBLE_EQ(h->routed_scaling_factor, 2.5);
  EXPECT_EQ(h->shared_expert_intermediate_size, 32);
  EXPECT_FALSE(h->layer_is_sparse(0));
  EXPECT_TRUE(h->layer_is_sparse(1));
  EXPECT_EQ(h->sliding_window, 0);
  EXPECT_EQ(h->nextn_layers, 0);
  // The plan: plural shared_experts, the selection bias under mlp.gate, q/k norms, ffn_norm in GGUF.
  const ModelPlan plan = build_plan(*h, "dots1");
  auto find = [&](const std::string& name) { return find_planned(plan, name); };
  ASSERT_NE(find("blk.1.ffn_gate_shexp.weight"), nullptr);
  EXPECT_EQ(find("blk.1.ffn_gate_shexp.weight")->hf_name, "model.layers.1.mlp.shared_experts.gate_proj.weight");
  ASSERT_NE(find("blk.1.exp_probs_b.bias"), nullptr);
  EXPECT_EQ(find("blk.1.exp_probs_b.bias")->hf_name, "model.layers.1.mlp.gate.e_score_correction_bias");
  ASSERT_NE(find("blk.0.attn_k_norm.weight"), nullptr);
  EXPECT_EQ(find("blk.0.ffn_norm.weight")->gguf_name, "blk.0.ffn_norm.weight");
  // Dots1Config's defaults where config.json leaves the keys out: no renormalizing, no dense layer, a window of 4096
  // from layer max_window_layers (62) on; and q/k/v/o biases with attention_bias.
  auto c = dots1();
  for (const char* key : {"norm_topk_prob", "first_k_dense_replace", "sliding_window", "max_window_layers"})
    c.erase(key);
  c["attention_bias"] = true;
  h = hparams_from_hf_config(c, "config.json");
  ASSERT_TRUE(h) << h.error().message();
  EXPECT_FALSE(h->norm_topk_prob);
  EXPECT_TRUE(h->layer_is_sparse(0));
  EXPECT_EQ(h->sliding_window, 0);  // 4 layers: none from 62 on
  EXPECT_TRUE(h->attention_qkv_bias);
  EXPECT_TRUE(h->attention_out_bias);
  // A window from max_window_layers on; or on the layers layer_types names.
  c["max_window_layers"] = 2;
  h = hparams_from_hf_config(c, "config.json");
  ASSERT_TRUE(h) << h.error().message();
  EXPECT_EQ(h->sliding_window, 4096);
  EXPECT_EQ(h->sliding_layers, (std::vector<std::int64_t>{2, 3}));
  c["sliding_window"] = 8;
  c["layer_types"] = {"sliding_attention", "full_attention", "sliding_attention", "full_attention"};
  h = hparams_from_hf_config(c, "config.json");
  ASSERT_TRUE(h) << h.error().message();
  EXPECT_EQ(h->sliding_window, 8);
  EXPECT_EQ(h->sliding_layers, (std::vector<std::int64_t>{0, 2}));
  c["sliding_window"] = nullptr;  // null: no window, whatever layer_types says
  h = hparams_from_hf_config(c, "config.json");
  ASSERT_TRUE(h) << h.error().message();
  EXPECT_EQ(h->sliding_window, 0);
  EXPECT_TRUE(h->sliding_layers.empty());
}

TEST(HfConfigValues, Dots1RefusesWhatItCannotRunByName) {
  const std::pair<const char*, json> bad[] = {
      {"scoring_func is \"softmax\"; dots.llm1 scores its experts by sigmoid", json{{"scoring_func", "softmax"}}},
      {"missing required field \"n_shared_experts\"", json{{"n_shared_experts", nullptr}}},
      {"layer_types", json{{"sliding_window", 8}, {"layer_types", {"full_attention"}}}},
      {"first_k_dense_replace is 5; it must be in 0..num_hidden_layers (4)", json{{"first_k_dense_replace", 5}}},
  };
  expect_refused(dots1(), bad);
}

// The shared tensor `name` of a plan (a failure, and an empty tensor, where it is not planned).
const PlannedTensor& planned(const ModelPlan& plan, const std::string& name) {
  if (const auto* t = find_planned(plan, name)) return *t;
  ADD_FAILURE() << name << " is not planned";
  static const PlannedTensor none;
  return none;
}

// Qwen3-Next-80B-A3B's config.json, tiny (no layer_types: attention every full_attention_interval-th layer).
json qwen3_next() {
  return json{{"architectures", {"Qwen3NextForCausalLM"}},
              {"vocab_size", 64},
              {"hidden_size", 64},
              {"head_dim", 32},
              {"num_hidden_layers", 8},
              {"num_attention_heads", 4},
              {"num_key_value_heads", 2},
              {"intermediate_size", 96},
              {"moe_intermediate_size", 16},
              {"shared_expert_intermediate_size", 16},
              {"num_experts", 8},
              {"num_experts_per_tok", 2},
              {"linear_conv_kernel_dim", 4},
              {"linear_key_head_dim", 16},
              {"linear_value_head_dim", 8},
              {"linear_num_key_heads", 2},
              {"linear_num_value_heads", 4},
              {"full_attention_interval", 4},
              {"partial_rotary_factor", 0.25}};
}

TEST(HfConfigValues, Qwen3NextReadsItsLinearAndGatedAttentionLayers) {
  auto h = hparams_from_hf_config(qwen3_next(), "config.json");
  ASSERT_TRUE(h) << h.error().message();
  EXPECT_EQ(h->architecture, "qwen3_next");
  EXPECT_EQ(h->linear_layers, (std::vector<std::int64_t>{0, 1, 2, 4, 5, 6}));
  EXPECT_TRUE(h->layer_is_linear(2));
  EXPECT_FALSE(h->layer_is_linear(3));
  EXPECT_EQ(h->attention_layers(), 2);
  EXPECT_EQ(h->rope_dims(), 8);
  EXPECT_EQ(h->qk_norm, "per_head");
  EXPECT_TRUE(h->attn_output_gate);
  EXPECT_TRUE(h->norm_topk_prob);  // Qwen3NextConfig's default
  EXPECT_TRUE(h->shared_expert_gate);
  EXPECT_EQ(h->linear_conv_dim(), 2 * 32 + 32);
  EXPECT_EQ(h->linear_state_floats(), 96 * 3 + 4 * 16 * 8);
  EXPECT_EQ(h->format_version(), 6);
  auto back = HyperParams::from_json(h->to_json());
  ASSERT_TRUE(back) << back.error().message();
  EXPECT_EQ(back->linear_layers, h->linear_layers);
  EXPECT_EQ(back->linear_v_heads, 4);
  EXPECT_TRUE(back->attn_output_gate);
  // The plan: in_proj_qkvz cut by key-head group (q, k, v, z of each), the gate rows of q_proj, norms stored as 1 + w
  // (not the gated norm of the delta rule), -exp(A_log); llama.cpp's names for the GGUF.
  const ModelPlan plan = build_plan(*h, "qwen3next");
  auto find = [&](const std::string& name) -> const PlannedTensor& { return planned(plan, name); };
  const auto& v = find("blk.0.ssm_v.weight");
  EXPECT_EQ(v.hf_name, "model.layers.0.linear_attn.in_proj_qkvz.weight");
  EXPECT_EQ((std::vector<std::int64_t>{v.hf_pick.blocks, v.hf_pick.block, v.hf_pick.first, v.hf_pick.count}),
            (std::vector<std::int64_t>{2, 2 * 16 + 2 * 2 * 8, 32, 16}));
  EXPECT_EQ(v.gguf_name, "blk.0.attn_qkv.weight");
  EXPECT_EQ(v.gguf_pick.first, 64);
  EXPECT_EQ(find("blk.0.ssm_z.weight").gguf_name, "blk.0.attn_gate.weight");
  EXPECT_EQ(find("blk.0.ssm_alpha.weight").gguf_name, "blk.0.ssm_ba.weight");
  EXPECT_EQ(find("blk.0.ssm_alpha.weight").hf_pick.first, 2);
  EXPECT_EQ(find("blk.0.ssm_a").hf_transform, ValueTransform::neg_exp);
  EXPECT_EQ(find("blk.0.ssm_norm.weight").hf_transform, ValueTransform::none);
  EXPECT_EQ(find("blk.0.attn_norm.weight").hf_transform, ValueTransform::add_one);
  EXPECT_EQ(find("blk.3.attn_q_norm.weight").hf_transform, ValueTransform::add_one);
  EXPECT_EQ(find("output_norm.weight").hf_transform, ValueTransform::add_one);
  EXPECT_EQ(find("blk.3.attn_q_gate.weight").hf_pick.first, 32);
  EXPECT_EQ(find("blk.3.attn_q_gate.weight").gguf_name, "blk.3.attn_q.weight");
  EXPECT_EQ(find("blk.3.ffn_norm.weight").gguf_name, "blk.3.post_attention_norm.weight");
  // layer_types instead of the interval.
  auto c = qwen3_next();
  c["layer_types"] = {"linear_attention", "full_attention", "linear_attention", "full_attention",
                      "full_attention",   "full_attention", "full_attention",   "linear_attention"};
  h = hparams_from_hf_config(c, "config.json");
  ASSERT_TRUE(h) << h.error().message();
  EXPECT_EQ(h->linear_layers, (std::vector<std::int64_t>{0, 2, 7}));
}

TEST(HfConfigValues, Qwen3NextRefusesWhatItCannotRunByName) {
  const std::pair<const char*, json> bad[] = {
      {"attention_bias=true is not supported for Qwen3-Next", json{{"attention_bias", true}}},
      {"layer_types[1] is sliding_attention",
       json{{"layer_types",
             {"linear_attention", "sliding_attention", "linear_attention", "full_attention", "linear_attention",
              "linear_attention", "linear_attention", "full_attention"}}}},
      {"full_attention_interval is 0", json{{"full_attention_interval", 0}}},
      {"linear_v_heads (config linear_num_value_heads) must be a multiple of linear_k_heads",
       json{{"linear_num_value_heads", 3}}},
      {"partial_rotary_factor 0.01 gives 0 rotated dims", json{{"partial_rotary_factor", 0.01}}},
      {"linear_layers lists a layer outside 0..num_layers-1, or every layer", json{{"full_attention_interval", 9}}},
  };
  expect_refused(qwen3_next(), bad);
}

// Qwen3.5-35B-A3B's config.json, tiny: the language model in text_config, rope_parameters with mrope sections.
TEST(HfConfigValues, Qwen35ReadsItsTextConfigAndTilesItsValueHeads) {
  json text = qwen3_next();
  text.erase("architectures");
  text.erase("partial_rotary_factor");
  text["model_type"] = "qwen3_5_moe_text";
  text["rope_parameters"] = {{"rope_type", "default"},
                             {"rope_theta", 1e7},
                             {"partial_rotary_factor", 0.25},
                             {"mrope_section", {3, 3, 2}},
                             {"mrope_interleaved", true}};
  text["mlp_only_layers"] = {1};  // a key Qwen3_5MoeTextConfig deletes: no layer is dense
  const json c{{"architectures", {"Qwen3_5MoeForConditionalGeneration"}},
               {"model_type", "qwen3_5_moe"},
               {"text_config", text},
               {"vision_config", {{"depth", 2}}},
               {"tie_word_embeddings", false}};
  auto h = hparams_from_hf_config(c, "config.json");
  ASSERT_TRUE(h) << h.error().message();
  EXPECT_EQ(h->architecture, "qwen3_5_moe");
  EXPECT_TRUE(h->linear_tiled_heads);
  EXPECT_DOUBLE_EQ(h->rope_theta, 1e7);
  EXPECT_TRUE(h->rope_scaling.is_null()) << "multimodal RoPE is plain RoPE for text";
  EXPECT_EQ(h->rope_dims(), 8);
  EXPECT_TRUE(h->norm_topk_prob);
  EXPECT_TRUE(h->layer_is_sparse(1));
  EXPECT_EQ(h->linear_layers, (std::vector<std::int64_t>{0, 1, 2, 4, 5, 6}));
  const ModelPlan plan = build_plan(*h, "qwen35moe");
  auto find = [&](const std::string& name) -> const PlannedTensor& { return planned(plan, name); };
  const auto& v = find("blk.0.ssm_v.weight");
  EXPECT_EQ(v.hf_name, "model.language_model.layers.0.linear_attn.in_proj_qkv.weight");
  EXPECT_EQ((std::vector<std::int64_t>{v.hf_tiling.groups, v.hf_tiling.per, v.hf_tiling.width}),
            (std::vector<std::int64_t>{2, 2, 8}));
  EXPECT_FALSE(v.hf_tiling.columns);
  EXPECT_EQ(v.gguf_name, "blk.0.attn_qkv.weight");
  EXPECT_EQ(find("blk.0.ssm_z.weight").hf_name, "model.language_model.layers.0.linear_attn.in_proj_z.weight");
  EXPECT_EQ(find("blk.0.ssm_beta.weight").gguf_name, "blk.0.ssm_beta.weight");
  EXPECT_EQ(find("blk.0.ssm_alpha.weight").hf_tiling.width, 1);
  EXPECT_TRUE(find("blk.0.ssm_out.weight").hf_tiling.columns);
  EXPECT_TRUE(find("blk.0.ssm_a").hf_tiling.columns);
  EXPECT_EQ(find("blk.0.ssm_norm.weight").hf_tiling.groups, 0) << "shared by the heads";
  EXPECT_EQ(find("blk.3.ffn_norm.weight").gguf_name, "blk.3.post_attention_norm.weight");
  EXPECT_EQ(find("output.weight").hf_name, "lm_head.weight");
  const auto& gate = plan.experts[0][1][0];
  EXPECT_EQ(gate.hf_name, "model.language_model.layers.0.mlp.experts.gate_up_proj");
  EXPECT_TRUE(gate.hf_fused_output_major);
  EXPECT_TRUE(gate.hf_fused_halves);
  // Tiled head t = j * groups + g holds grouped head g * per + j: 2 groups of 2 heads of 3 rows.
  const HeadTiling tiling{2, 2, 3, false};
  EXPECT_EQ(tiling.source(0), 0);
  EXPECT_EQ(tiling.source(3), 6);
  EXPECT_EQ(tiling.source(7), 4);
  EXPECT_EQ(tiling.source(10), 10);
}

// Qwen3.5-0.8B's config.json, tiny: Qwen3.5-MoE's layers with a dense MLP in each, the embedding tied. Expert keys a
// config might carry are not read (Qwen3_5TextConfig has none).
TEST(HfConfigValues, Qwen35DenseRunsOneExpertPerLayer) {
  json text = qwen3_next();
  text.erase("architectures");
  text["model_type"] = "qwen3_5_text";
  text["tie_word_embeddings"] = true;
  for (const char* key : {"moe_intermediate_size", "shared_expert_intermediate_size", "num_experts_per_tok"})
    text.erase(key);
  const json c{{"architectures", {"Qwen3_5ForConditionalGeneration"}},
               {"model_type", "qwen3_5"},
               {"text_config", text},
               {"vision_config", {{"depth", 2}}}};
  auto h = hparams_from_hf_config(c, "config.json");
  ASSERT_TRUE(h) << h.error().message();
  EXPECT_EQ(h->architecture, "qwen3_5");
  EXPECT_TRUE(h->dense);
  EXPECT_TRUE(h->tie_word_embeddings);
  EXPECT_TRUE(h->linear_tiled_heads);
  EXPECT_EQ(h->layer_experts(0), 1);
  EXPECT_EQ(h->layer_ffn_size(0), 96);
  EXPECT_EQ(h->shared_expert_intermediate_size, 0);
  EXPECT_EQ(h->num_kv_heads, text["num_key_value_heads"].get<std::int64_t>());
  const ModelPlan plan = build_plan(*h, "qwen35");
  const auto& gate = plan.experts[0][0][0];
  EXPECT_EQ(gate.hf_name, "model.language_model.layers.0.mlp.gate_proj.weight");
  EXPECT_EQ(gate.gguf_name, "blk.0.ffn_gate.weight");
  EXPECT_EQ(planned(plan, "blk.0.ffn_norm.weight").gguf_name, "blk.0.post_attention_norm.weight");
  EXPECT_EQ(planned(plan, "blk.0.ssm_out.weight").hf_tiling.groups, 2);
  EXPECT_EQ(find_planned(plan, "output.weight"), nullptr) << "tied to the embedding";
  EXPECT_EQ(find_planned(plan, "blk.0.ffn_gate_inp.weight"), nullptr) << "no router";
}

// Ling-mini-2.0's config.json, tiny.
json ling() {
  return json{{"architectures", {"BailingMoeV2ForCausalLM"}},
              {"vocab_size", 64},
              {"hidden_size", 64},
              {"head_dim", 32},
              {"num_hidden_layers", 3},
              {"num_attention_heads", 4},
              {"num_key_value_heads", 2},
              {"intermediate_size", 96},
              {"moe_intermediate_size", 16},
              {"num_experts", 16},
              {"num_experts_per_tok", 4},
              {"num_shared_experts", 1},
              {"n_group", 4},
              {"topk_group", 2},
              {"routed_scaling_factor", 2.5},
              {"first_k_dense_replace", 1},
              {"score_function", "sigmoid"},
              {"norm_topk_prob", true},
              {"partial_rotary_factor", 0.5},
              {"use_qkv_bias", false},
              {"use_bias", false},
              {"use_qk_norm", true},
              {"rms_norm_eps", 1e-6},
              {"rope_theta", 600000}};
}

TEST(HfConfigValues, LingReadsItsFusedAttentionAndGroupedRouter) {
  auto h = hparams_from_hf_config(ling(), "config.json");
  ASSERT_TRUE(h) << h.error().message();
  EXPECT_EQ(h->architecture, "bailing_moe_v2");
  EXPECT_EQ(h->qk_norm, "per_head");
  EXPECT_EQ(h->rotary_dims, 16);
  EXPECT_FALSE(h->rope_interleaved);
  EXPECT_FALSE(h->attention_out_bias);
  EXPECT_EQ(h->router_scoring, "sigmoid");
  EXPECT_TRUE(h->router_selection_bias);
  EXPECT_TRUE(h->norm_topk_prob);
  EXPECT_DOUBLE_EQ(h->routed_scaling_factor, 2.5);
  EXPECT_EQ(h->router_groups, 4);
  EXPECT_EQ(h->router_groups_used, 2);
  EXPECT_EQ(h->shared_expert_intermediate_size, 16);
  EXPECT_FALSE(h->layer_is_sparse(0));
  EXPECT_TRUE(h->layer_is_sparse(1));
  // q, k and v are cut from one tensor, in HF and GGUF alike.
  const ModelPlan plan = build_plan(*h, "bailingmoe2");
  auto find = [&](const std::string& name) { return find_planned(plan, name); };
  const PlannedTensor* k = find("blk.0.attn_k.weight");
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k->hf_name, "model.layers.0.attention.query_key_value.weight");
  EXPECT_EQ(k->gguf_name, "blk.0.attn_qkv.weight");
  EXPECT_EQ(k->shape, (std::vector<std::int64_t>{64, 64}));
  EXPECT_EQ((std::vector<std::int64_t>{k->hf_pick.blocks, k->hf_pick.block, k->hf_pick.first, k->hf_pick.count}),
            (std::vector<std::int64_t>{1, 256, 128, 64}));
  EXPECT_EQ(find("blk.0.attn_output.weight")->hf_name, "model.layers.0.attention.dense.weight");
  EXPECT_EQ(find("blk.0.attn_q_norm.weight")->hf_name, "model.layers.0.attention.query_layernorm.weight");
  EXPECT_EQ(find("token_embd.weight")->hf_name, "model.word_embeddings.weight");
  EXPECT_EQ(find("blk.1.exp_probs_b.bias")->hf_name, "model.layers.1.mlp.gate.expert_bias");
  EXPECT_EQ(find("blk.1.ffn_up_shexp.weight")->hf_name, "model.layers.1.mlp.shared_experts.up_proj.weight");
  // The gate renormalizes whenever it picks several, whatever norm_topk_prob says; Ling-1T's rotary_dim; no groups;
  // attention.dense's bias; no q/k norms.
  auto c = ling();
  c["norm_topk_prob"] = false;
  c.erase("partial_rotary_factor");
  c["rotary_dim"] = 8;
  c["n_group"] = 1;
  c["topk_group"] = 1;
  c["use_bias"] = true;
  c["use_qk_norm"] = false;
  h = hparams_from_hf_config(c, "config.json");
  ASSERT_TRUE(h) << h.error().message();
  EXPECT_TRUE(h->norm_topk_prob);
  EXPECT_EQ(h->rotary_dims, 8);
  EXPECT_FALSE(h->grouped_routing());
  EXPECT_TRUE(h->attention_out_bias);
  EXPECT_EQ(h->qk_norm, "none");
  c["num_experts_per_tok"] = 1;  // one pick: its score as it is
  h = hparams_from_hf_config(c, "config.json");
  ASSERT_TRUE(h) << h.error().message();
  EXPECT_FALSE(h->norm_topk_prob);
}

TEST(HfConfigValues, LingRefusesWhatItCannotRunByName) {
  const std::pair<const char*, json> bad[] = {
      {"use_qkv_bias=true is not supported", json{{"use_qkv_bias", true}}},
      {"field \"use_bias\" must be true or false (the released Ling 2.0 configs write it)",
       json{{"use_bias", nullptr}}},
      {"field \"use_qk_norm\" must be true or false", json{{"use_qk_norm", "yes"}}},
      {"score_function is \"softmax\"; Ling 2.0 scores its experts by \"sigmoid\"",
       json{{"score_function", "softmax"}}},
      {"missing required field \"routed_scaling_factor\"", json{{"routed_scaling_factor", nullptr}}},
      {"missing required field \"num_shared_experts\"", json{{"num_shared_experts", nullptr}}},
      {"missing required field \"first_k_dense_replace\"", json{{"first_k_dense_replace", nullptr}}},
      {"rotary_dim / partial_rotary_factor give 33 rotated dims of head_dim 32", json{{"rotary_dim", 33}}},
      {"n_group 4 and topk_group 5 must be 1 or more", json{{"topk_group", 5}}},
      {"num_nextn_predict_layers is 4; it must be in 0..num_hidden_layers (3)", json{{"num_nextn_predict_layers", 4}}},
  };
  expect_refused(ling(), bad);
}

// Hunyuan-A13B-Instruct's config.json, tiny.
json hunyuan() {
  return json{{"architectures", {"HunYuanMoEV1ForCausalLM"}},
              {"model_type", "hunyuan"},
              {"vocab_size", 64},
              {"hidden_size", 64},
              {"attention_head_dim", 16},
              {"num_hidden_layers", 2},
              {"num_attention_heads", 4},
              {"num_key_value_heads", 2},
              {"intermediate_size", 24},
              {"moe_intermediate_size", {24, 24}},
              {"num_experts", 8},
              {"moe_topk", {3, 3}},
              {"num_shared_expert", {1, 1}},
              {"use_mixed_mlp_moe", true},
              {"use_qk_norm", true},
              {"use_cla", false},
              {"use_mla", false},
              {"max_position_embeddings", 32768},
              {"rope_theta", 10000.0},
              {"rope_scaling", {{"alpha", 1000.0}, {"factor", 1.0}, {"type", "dynamic"}}},
              {"tie_word_embeddings", true}};
}

TEST(HfConfigValues, HunyuanReadsItsAlphaRopeAndPerLayerLists) {
  auto h = hparams_from_hf_config(hunyuan(), "config.json");
  ASSERT_TRUE(h) << h.error().message();
  EXPECT_EQ(h->architecture, "hunyuan_moe");
  EXPECT_EQ(h->qk_norm, "per_head_after_rope");
  EXPECT_EQ(h->format_version(), 7);
  EXPECT_EQ(h->head_dim, 16);
  // NTK alpha: the base x alpha^(d / (d - 2)) at every position, no scaling left; trained to 256K.
  EXPECT_NEAR(h->rope_theta / (10000.0 * std::pow(1000.0, 16.0 / 14.0)), 1.0, 1e-12);
  EXPECT_TRUE(h->rope_scaling.is_null());
  EXPECT_EQ(h->max_position_embeddings, 262144);
  EXPECT_EQ(h->n_experts, 8);
  EXPECT_EQ(h->n_experts_per_tok, 3);
  EXPECT_EQ(h->moe_intermediate_size, 24);
  EXPECT_TRUE(h->norm_topk_prob);
  EXPECT_EQ(h->router_scoring, "softmax");
  EXPECT_EQ(h->shared_expert_intermediate_size, 24);
  EXPECT_FALSE(h->shared_expert_gate);
  EXPECT_TRUE(h->tie_word_embeddings);
  EXPECT_TRUE(h->layer_is_sparse(0));
  const ModelPlan plan = build_plan(*h, "hunyuan-moe");
  auto find = [&](const std::string& name) { return find_planned(plan, name); };
  ASSERT_NE(find("blk.0.attn_q_norm.weight"), nullptr);
  EXPECT_EQ(find("blk.0.attn_q_norm.weight")->hf_name, "model.layers.0.self_attn.query_layernorm.weight");
  EXPECT_EQ(find("blk.0.attn_k_norm.weight")->hf_name, "model.layers.0.self_attn.key_layernorm.weight");
  EXPECT_EQ(find("blk.0.ffn_gate_inp.weight")->hf_name, "model.layers.0.mlp.gate.wg.weight");
  EXPECT_EQ(find("blk.1.ffn_down_shexp.weight")->hf_name, "model.layers.1.mlp.shared_mlp.down_proj.weight");
  EXPECT_EQ(find("blk.0.attn_q.weight")->gguf_permute_heads, 0);  // NeoX RoPE: llama.cpp keeps HF's rows
  // One number instead of the lists; two shared experts' width; top-1 keeps its probability; no alpha: the dynamic
  // NTK scaling of its code (by the pass's length) stays, with the config's context.
  auto c = hunyuan();
  c["moe_topk"] = 1;
  c["num_shared_expert"] = 2;
  c["moe_intermediate_size"] = 24;
  c["use_qk_norm"] = false;
  c["rope_scaling"] = {{"alpha", nullptr}, {"factor", 2.0}, {"type", "dynamic"}};
  h = hparams_from_hf_config(c, "config.json");
  ASSERT_TRUE(h) << h.error().message();
  EXPECT_EQ(h->n_experts_per_tok, 1);
  EXPECT_FALSE(h->norm_topk_prob);
  EXPECT_EQ(h->shared_expert_intermediate_size, 48);
  EXPECT_EQ(h->qk_norm, "none");
  EXPECT_DOUBLE_EQ(h->rope_theta, 10000.0);
  EXPECT_EQ(h->rope_scaling["factor"], 2.0);
  EXPECT_EQ(h->max_position_embeddings, 32768);
  c["use_mixed_mlp_moe"] = false;  // no shared MLP
  h = hparams_from_hf_config(c, "config.json");
  ASSERT_TRUE(h) << h.error().message();
  EXPECT_EQ(h->shared_expert_intermediate_size, 0);
}

TEST(HfConfigValues, HunyuanRefusesWhatItCannotRunByName) {
  const std::pair<const char*, json> bad[] = {
      {"use_cla=true is not supported", json{{"use_cla", true}}},
      {"use_mla=true is not supported", json{{"use_mla", true}}},
      {"attention_bias=true is not supported", json{{"attention_bias", true}}},
      {"moe_layer_num_skipped other than 0 is not supported", json{{"moe_layer_num_skipped", 2}}},
      {"field \"moe_topk\" is [3,2]; colibri runs the same whole number for every layer", json{{"moe_topk", {3, 2}}}},
      {"field \"num_shared_expert\" is []", json{{"num_shared_expert", json::array()}}},
      {"missing required field \"num_experts\"", json{{"num_experts", nullptr}}},
      {"rope_scaling.alpha is \"x\"; it must be a positive number",
       json{{"rope_scaling", {{"alpha", "x"}, {"type", "dynamic"}}}}},
      {"rope_scaling.alpha is -2.0", json{{"rope_scaling", {{"alpha", -2.0}, {"type", "dynamic"}}}}},
  };
  expect_refused(hunyuan(), bad);
}

// Qwen3-VL-30B-A3B's config.json, tiny: the language model's fields in text_config.
json qwen3_vl() {
  return json{
      {"architectures", {"Qwen3VLMoeForConditionalGeneration"}},
      {"model_type", "qwen3_vl_moe"},
      {"tie_word_embeddings", false},
      {"vision_config", {{"depth", 1}}},
      {"text_config",
       {{"model_type", "qwen3_vl_moe_text"},
        {"vocab_size", 64},
        {"hidden_size", 64},
        {"head_dim", 32},
        {"num_hidden_layers", 2},
        {"num_attention_heads", 4},
        {"num_key_value_heads", 2},
        {"intermediate_size", 96},
        {"moe_intermediate_size", 16},
        {"num_experts", 8},
        {"num_experts_per_tok", 2},
        {"decoder_sparse_step", 1},
        {"mlp_only_layers", json::array()},
        {"rope_theta", 5000000},
        {"rope_scaling", {{"mrope_interleaved", true}, {"mrope_section", {8, 4, 4}}, {"rope_type", "default"}}}}}};
}

TEST(HfConfigValues, Qwen3VlMoeReadsItsLanguageModel) {
  auto h = hparams_from_hf_config(qwen3_vl(), "config.json");
  ASSERT_TRUE(h) << h.error().message();
  EXPECT_EQ(h->architecture, "qwen3_vl_moe");
  EXPECT_EQ(h->qk_norm, "per_head");
  EXPECT_TRUE(h->rope_scaling.is_null());  // multimodal RoPE is plain RoPE for text
  EXPECT_EQ(h->rope_theta, 5000000);
  EXPECT_TRUE(h->norm_topk_prob);
  EXPECT_FALSE(h->tie_word_embeddings);
  EXPECT_EQ(h->max_position_embeddings, 128000);  // Qwen3VLMoeTextConfig's default
  // The experts fused as gate_up_proj halves and down_proj under model.language_model.; lm_head where it is.
  const ModelPlan plan = build_plan(*h);
  const PlannedTensor& gate = plan.experts[1][3][0];
  EXPECT_EQ(gate.hf_name, "model.language_model.layers.1.mlp.experts.gate_up_proj");
  EXPECT_EQ(gate.hf_expert, 3);
  EXPECT_EQ(gate.hf_fused_part, 0);
  EXPECT_TRUE(gate.hf_fused_halves);
  EXPECT_EQ(plan.experts[1][3][2].hf_name, "model.language_model.layers.1.mlp.experts.down_proj");
  EXPECT_EQ(plan.shared.front().hf_name, "model.language_model.embed_tokens.weight");
  EXPECT_EQ(plan.shared.back().hf_name, "lm_head.weight");
  // Neither config says: the text config's default ties the embeddings; norm_topk_prob false is not read.
  auto c = qwen3_vl();
  c.erase("tie_word_embeddings");
  c["text_config"]["norm_topk_prob"] = false;
  h = hparams_from_hf_config(c, "config.json");
  ASSERT_TRUE(h) << h.error().message();
  EXPECT_TRUE(h->tie_word_embeddings);
  EXPECT_TRUE(h->norm_topk_prob);
  // A scaling that is no multimodal RoPE stays (and is refused or run by its own rules).
  c["text_config"]["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2.0}};
  h = hparams_from_hf_config(c, "config.json");
  ASSERT_TRUE(h) << h.error().message();
  EXPECT_EQ(h->rope_scaling.value("rope_type", ""), "linear");
}

// GLM-4.7-Flash's config.json, tiny: DeepSeek-V3's attention, GLM-4.5's router, dense layers by mlp_layer_types.
json glm_flash() {
  return json{{"architectures", {"Glm4MoeLiteForCausalLM"}},
              {"vocab_size", 64},
              {"hidden_size", 64},
              {"num_hidden_layers", 3},
              {"num_attention_heads", 4},
              {"intermediate_size", 96},
              {"moe_intermediate_size", 16},
              {"n_routed_experts", 8},
              {"num_experts_per_tok", 2},
              {"n_shared_experts", 1},
              {"q_lora_rank", 32},
              {"kv_lora_rank", 32},
              {"qk_nope_head_dim", 16},
              {"qk_rope_head_dim", 8},
              {"v_head_dim", 24},
              {"mlp_layer_types", {"dense", "sparse", "sparse"}},
              {"num_nextn_predict_layers", 1}};
}

TEST(HfConfigValues, GlmFlashRunsAsDeepSeekV3WithItsOwnDefaults) {
  auto h = hparams_from_hf_config(glm_flash(), "config.json");
  ASSERT_TRUE(h) << h.error().message();
  EXPECT_EQ(h->architecture, "deepseek_v3");
  EXPECT_EQ(h->hf_architecture, "Glm4MoeLiteForCausalLM");
  EXPECT_TRUE(h->mla());
  EXPECT_TRUE(h->rope_interleaved);
  EXPECT_EQ(h->router_scoring, "sigmoid");
  EXPECT_TRUE(h->norm_topk_prob);
  EXPECT_DOUBLE_EQ(h->routed_scaling_factor, 1.8);  // Glm4MoeLiteConfig's, not DeepSeek-V3's 2.5
  EXPECT_EQ(h->rms_norm_eps, 1e-5);
  EXPECT_EQ(h->max_position_embeddings, 202752);
  EXPECT_EQ(h->mlp_only_layers, (std::vector<std::int64_t>{0}));
  EXPECT_EQ(h->nextn_layers, 1);
  auto c = glm_flash();
  c["mlp_layer_types"] = {"dense", "dense", "sparse"};
  h = hparams_from_hf_config(c, "config.json");
  ASSERT_TRUE(h) << h.error().message();
  EXPECT_EQ(h->mlp_only_layers, (std::vector<std::int64_t>{0, 1}));
  c.erase("mlp_layer_types");  // the class's default: the first layer dense
  h = hparams_from_hf_config(c, "config.json");
  ASSERT_TRUE(h) << h.error().message();
  EXPECT_EQ(h->mlp_only_layers, (std::vector<std::int64_t>{0}));
  const std::pair<const char*, json> bad[] = {
      {"mlp_layer_types must list \"dense\" or \"sparse\" for each of the 3 layers",
       json{{"mlp_layer_types", {"dense"}}}},
      {"mlp_layer_types[1] is \"moe\"", json{{"mlp_layer_types", {"dense", "moe", "sparse"}}}},
      {"partial_rotary_factor 0.5 is not supported",
       json{{"rope_parameters", {{"rope_type", "default"}, {"partial_rotary_factor", 0.5}}}}},
  };
  expect_refused(glm_flash(), bad);
}

// MiniMax-M2's config.json, tiny.
json minimax() {
  return json{{"architectures", {"MiniMaxM2ForCausalLM"}},
              {"vocab_size", 64},
              {"hidden_size", 64},
              {"head_dim", 32},
              {"rotary_dim", 16},
              {"num_hidden_layers", 2},
              {"num_attention_heads", 4},
              {"num_key_value_heads", 2},
              {"intermediate_size", 16},
              {"num_local_experts", 8},
              {"num_experts_per_tok", 2},
              {"scoring_func", "sigmoid"},
              {"use_routing_bias", true},
              {"use_qk_norm", true},
              {"qk_norm_type", "per_layer"},
              {"attn_window_size", nullptr},
              {"rope_theta", 5e6}};
}

TEST(HfConfigValues, MiniMaxM2ReadsItsRouterNormsAndRotaryDim) {
  auto h = hparams_from_hf_config(minimax(), "config.json");
  ASSERT_TRUE(h) << h.error().message();
  EXPECT_EQ(h->architecture, "minimax_m2");
  EXPECT_EQ(h->rotary_dims, 16);
  EXPECT_EQ(h->qk_norm, "full");  // over the whole projection, not per head
  EXPECT_EQ(h->router_scoring, "sigmoid");
  EXPECT_TRUE(h->router_selection_bias);
  EXPECT_TRUE(h->norm_topk_prob);
  EXPECT_DOUBLE_EQ(h->routed_scaling_factor, 1.0);
  EXPECT_EQ(h->moe_intermediate_size, 16);
  EXPECT_EQ(h->shared_expert_intermediate_size, 0);
  EXPECT_TRUE(h->layer_is_sparse(0));
  const ModelPlan plan = build_plan(*h, "minimax-m2");
  auto hf = [&](const std::string& name) {
    for (const auto& t : plan.shared) {
      if (t.name == name) return t.hf_name;
    }
    return std::string("(none)");
  };
  EXPECT_EQ(hf("blk.1.exp_probs_b.bias"), "model.layers.1.block_sparse_moe.e_score_correction_bias");
  EXPECT_EQ(hf("blk.1.ffn_gate_inp.weight"), "model.layers.1.block_sparse_moe.gate.weight");
  EXPECT_EQ(hf("blk.0.attn_q_norm.weight"), "model.layers.0.self_attn.q_norm.weight");
  EXPECT_EQ(plan.experts[1][3][2].hf_name, "model.layers.1.block_sparse_moe.experts.3.w2.weight");
  // transformers' own port writes partial_rotary_factor instead of rotary_dim.
  auto port = minimax();
  port.erase("rotary_dim");
  port["partial_rotary_factor"] = 0.25;
  h = hparams_from_hf_config(port, "config.json");
  ASSERT_TRUE(h) << h.error().message();
  EXPECT_EQ(h->rotary_dims, 8);
  port["partial_rotary_factor"] = 1e300;  // refused, not cast (an overflowing cast is undefined)
  h = hparams_from_hf_config(port, "config.json");
  ASSERT_FALSE(h);
  EXPECT_NE(h.error().message().find("rotary_dim is 0; it must be even"), std::string::npos) << h.error().message();
  auto c = minimax();
  c["use_routing_bias"] = false;
  c["scoring_func"] = "softmax";
  c["qk_norm_type"] = "per_head";
  h = hparams_from_hf_config(c, "config.json");
  ASSERT_TRUE(h) << h.error().message();
  EXPECT_FALSE(h->router_selection_bias);
  EXPECT_EQ(h->router_scoring, "softmax");
  EXPECT_EQ(h->qk_norm, "per_head");
  {  // A sigmoid router without its bias picks by the scores alone (the engine passes topk_routing_biased zeros).
    auto b = minimax();
    b["use_routing_bias"] = false;
    auto r = hparams_from_hf_config(b, "config.json");
    ASSERT_TRUE(r) << r.error().message();
    EXPECT_FALSE(r->router_selection_bias);
    EXPECT_EQ(r->router_scoring, "sigmoid");
  }
  const std::pair<const char*, json> bad[] = {
      {"attn_window_size (sliding-window layers) is not supported", json{{"attn_window_size", {0, 4096}}}},
      {"rotary_dim is 33; it must be even and in 2..head_dim (32)", json{{"rotary_dim", 33}}},
      {"rotary_dim is 64; it must be even", json{{"rotary_dim", 64}}},
      {"qk_norm_type 'per_token' is not supported", json{{"qk_norm_type", "per_token"}}},
      {"qk_norm_type is 3; it must be \"per_layer\" or \"per_head\"", json{{"qk_norm_type", 3}}},
      {"attn_type_list holds 0; only softmax attention layers (1) are supported", json{{"attn_type_list", {1, 0}}}},
      {"scoring_func is \"relu\"; it must be \"sigmoid\" or \"softmax\"", json{{"scoring_func", "relu"}}},
      {"use_grouped_topk (routing within the best groups only) is not supported",
       json{{"use_grouped_topk", true}, {"num_expert_group", 4}, {"topk_group", 2}}},
  };
  expect_refused(minimax(), bad);
}

TEST(HfConfigValues, ErnieMoeReadsItsLayerPatternRouterAndInterleavedRope) {
  json c{{"architectures", {"Ernie4_5_MoeForCausalLM"}},
         {"vocab_size", 64},
         {"hidden_size", 64},
         {"num_hidden_layers", 6},
         {"num_attention_heads", 4},
         {"num_key_value_heads", 2},
         {"intermediate_size", 96},
         {"moe_intermediate_size", 16},
         {"moe_num_experts", 8},
         {"moe_k", 2},
         {"moe_num_shared_experts", 2},
         {"moe_layer_start_index", 1},
         {"moe_layer_end_index", 4},
         {"moe_layer_interval", 2},
         {"tie_word_embeddings", true}};
  auto h = hparams_from_hf_config(c, "config.json");
  ASSERT_TRUE(h) << h.error().message();
  EXPECT_EQ(h->architecture, "ernie4_5_moe");
  EXPECT_TRUE(h->rope_interleaved);
  EXPECT_EQ(h->router_scoring, "softmax");
  EXPECT_TRUE(h->router_selection_bias);
  EXPECT_TRUE(h->norm_topk_prob);
  EXPECT_EQ(h->shared_expert_intermediate_size, 32);
  EXPECT_EQ(h->rope_theta, 500000.0);  // Ernie4_5_MoeConfig's default
  // MoE where 1 <= l <= 4 and (l + 1) % 2 == 0: layers 1 and 3.
  EXPECT_EQ(h->mlp_only_layers, (std::vector<std::int64_t>{0, 2, 4, 5}));
  EXPECT_EQ(h->format_version(), 3);
  const ModelPlan plan = build_plan(*h);
  EXPECT_TRUE(std::any_of(plan.shared.begin(), plan.shared.end(), [](const PlannedTensor& t) {
    return t.hf_name == "model.layers.3.mlp.moe_statics.e_score_correction_bias";
  }));
  const std::pair<const char*, json> bad[] = {
      {"use_bias=true (biases on every projection) is not supported", json{{"use_bias", true}}},
      {"moe_layer_start_index 1, moe_layer_end_index 6 and moe_layer_interval 2 must name layers",
       json{{"moe_layer_end_index", 6}}},
      {"moe_layer_interval 0", json{{"moe_layer_interval", 0}}},
      {"moe_num_shared_experts is 65; it must be in 0..64", json{{"moe_num_shared_experts", 65}}},
  };
  expect_refused(c, bad);
}

// DeepSeek-V2-Lite's config.json, shrunk.
json deepseek_v2_lite() {
  return json{{"architectures", {"DeepseekV2ForCausalLM"}},
              {"vocab_size", 64},
              {"hidden_size", 64},
              {"num_hidden_layers", 4},
              {"num_attention_heads", 4},
              {"num_key_value_heads", 4},
              {"intermediate_size", 96},
              {"moe_intermediate_size", 16},
              {"n_routed_experts", 8},
              {"n_shared_experts", 2},
              {"num_experts_per_tok", 2},
              {"first_k_dense_replace", 1},
              {"moe_layer_freq", 1},
              {"q_lora_rank", nullptr},
              {"kv_lora_rank", 32},
              {"qk_nope_head_dim", 16},
              {"qk_rope_head_dim", 8},
              {"v_head_dim", 12},
              {"norm_topk_prob", false},
              {"routed_scaling_factor", 1.0},
              {"scoring_func", "softmax"},
              {"topk_method", "greedy"},
              {"n_group", 1},
              {"topk_group", 1},
              {"rope_scaling",
               {{"type", "yarn"},
                {"factor", 40},
                {"mscale", 0.707},
                {"mscale_all_dim", 0.707},
                {"original_max_position_embeddings", 4096}}}};
}

TEST(HfConfigValues, DeepSeekReadsItsLatentAttentionRouterAndDenseLayers) {
  auto h = hparams_from_hf_config(deepseek_v2_lite(), "config.json");
  ASSERT_TRUE(h) << h.error().message();
  EXPECT_EQ(h->architecture, "deepseek_v2");
  EXPECT_TRUE(h->mla());
  EXPECT_EQ(h->q_lora_rank, 0);
  EXPECT_EQ(h->kv_lora_rank, 32);
  EXPECT_EQ(h->head_dim, 24);
  EXPECT_EQ(h->rotary_dims, 8);
  EXPECT_EQ(h->qk_nope_dim(), 16);
  EXPECT_EQ(h->v_head_dim, 12);
  EXPECT_EQ(h->kv_cache_heads(), 1);
  EXPECT_EQ(h->kv_cache_dim(), 40);
  EXPECT_TRUE(h->rope_interleaved);
  EXPECT_EQ(h->router_scoring, "softmax");
  EXPECT_FALSE(h->router_selection_bias);
  EXPECT_FALSE(h->norm_topk_prob);
  EXPECT_EQ(h->shared_expert_intermediate_size, 32);
  EXPECT_EQ(h->mlp_only_layers, (std::vector<std::int64_t>{0}));
  EXPECT_EQ(h->rms_norm_eps, 1e-6);  // DeepseekV2Config's default
  EXPECT_EQ(h->format_version(), 4);
  // The plan cuts q (per head: nope then RoPE), kv_a (latent then RoPE key) and kv_b (per head: key part, transposed,
  // then value part).
  const ModelPlan plan = build_plan(*h, "deepseek2");
  auto find = [&](const std::string& name) { return find_planned(plan, name); };
  const auto* q_rope = find("blk.1.attn_q_rope.weight");
  ASSERT_NE(q_rope, nullptr);
  EXPECT_EQ(q_rope->hf_name, "model.layers.1.self_attn.q_proj.weight");
  EXPECT_EQ(q_rope->gguf_name, "blk.1.attn_q.weight");
  EXPECT_EQ(q_rope->shape, (std::vector<std::int64_t>{32, 64}));
  EXPECT_EQ(q_rope->hf_pick.blocks, 4);
  EXPECT_EQ(q_rope->hf_pick.block, 24);
  EXPECT_EQ(q_rope->hf_pick.first, 16);
  EXPECT_EQ(q_rope->hf_pick.count, 8);
  const auto* k_b = find("blk.1.attn_k_b.weight");
  ASSERT_NE(k_b, nullptr);
  EXPECT_EQ(k_b->shape, (std::vector<std::int64_t>{4 * 32, 16}));
  EXPECT_TRUE(k_b->hf_pick.transpose);
  EXPECT_EQ(k_b->hf_pick.block, 16 + 12);
  EXPECT_EQ(k_b->gguf_pick.blocks, 0);  // llama.cpp stores it cut and transposed already
  const auto* v_b = find("blk.1.attn_v_b.weight");
  ASSERT_NE(v_b, nullptr);
  EXPECT_EQ(v_b->hf_pick.first, 16);
  EXPECT_EQ(find("blk.1.attn_q.weight"), nullptr);
  EXPECT_EQ(find("blk.1.attn_q_a.weight"), nullptr);  // no query latent
  EXPECT_NE(find("blk.1.ffn_gate_shexp.weight"), nullptr);
  EXPECT_EQ(find("blk.1.ffn_gate_shexp.weight")->hf_name, "model.layers.1.mlp.shared_experts.gate_proj.weight");
  // DeepSeek-V2's code scales the weights only where it does not renormalize them.
  auto c = deepseek_v2_lite();
  c["routed_scaling_factor"] = 16.0;
  h = hparams_from_hf_config(c, "config.json");
  ASSERT_TRUE(h) << h.error().message();
  EXPECT_DOUBLE_EQ(h->routed_scaling_factor, 16.0);
  c["norm_topk_prob"] = true;
  h = hparams_from_hf_config(c, "config.json");
  ASSERT_TRUE(h) << h.error().message();
  EXPECT_DOUBLE_EQ(h->routed_scaling_factor, 1.0);
  EXPECT_TRUE(h->norm_topk_prob);
  c["num_experts_per_tok"] = 1;  // one pick is never renormalized in V2's code: it is scaled
  h = hparams_from_hf_config(c, "config.json");
  ASSERT_TRUE(h) << h.error().message();
  EXPECT_FALSE(h->norm_topk_prob);
  EXPECT_DOUBLE_EQ(h->routed_scaling_factor, 16.0);
  // Kimi K2 / Moonlight / V3: a query latent, sigmoid scores with a selection bias, scaled after renormalizing;
  // MoE layers every moe_layer_freq from first_k_dense_replace on.
  c = deepseek_v2_lite();
  c["architectures"] = {"DeepseekV3ForCausalLM"};
  c.erase("scoring_func");
  c.erase("norm_topk_prob");
  c["q_lora_rank"] = 24;
  c["routed_scaling_factor"] = 2.827;
  c["moe_layer_freq"] = 2;
  c["num_nextn_predict_layers"] = 1;
  h = hparams_from_hf_config(c, "config.json");
  ASSERT_TRUE(h) << h.error().message();
  EXPECT_EQ(h->architecture, "deepseek_v3");
  EXPECT_EQ(h->q_lora_rank, 24);
  EXPECT_EQ(h->router_scoring, "sigmoid");
  EXPECT_TRUE(h->router_selection_bias);
  EXPECT_TRUE(h->norm_topk_prob);
  EXPECT_DOUBLE_EQ(h->routed_scaling_factor, 2.827);
  EXPECT_EQ(h->mlp_only_layers, (std::vector<std::int64_t>{0, 1, 3}));
  EXPECT_EQ(h->nextn_layers, 1);
  EXPECT_FALSE(h->grouped_routing());
  EXPECT_TRUE(h->rope_interleaved);
  c["rope_interleave"] = false;  // transformers' V3 then rotates halves
  EXPECT_FALSE(hparams_from_hf_config(c, "config.json")->rope_interleaved);
  c.erase("rope_interleave");
  // DeepSeek-V3 / R1 route within their best groups (a group's worth: its best two); V2's group_limited_greedy by a
  // group's best one; V2's greedy ignores the groups.
  auto g = c;
  g["n_group"] = 4;
  g["topk_group"] = 2;
  auto v3g = hparams_from_hf_config(g, "config.json");
  ASSERT_TRUE(v3g) << v3g.error().message();
  EXPECT_EQ(v3g->router_groups, 4);
  EXPECT_EQ(v3g->router_groups_used, 2);
  EXPECT_EQ(v3g->router_group_score, "top2_sum");
  g = deepseek_v2_lite();
  g["n_group"] = 4;
  g["topk_group"] = 2;
  EXPECT_FALSE(hparams_from_hf_config(g, "config.json")->grouped_routing()) << "greedy";
  g["topk_method"] = "group_limited_greedy";
  auto v2g = hparams_from_hf_config(g, "config.json");
  ASSERT_TRUE(v2g) << v2g.error().message();
  EXPECT_EQ(v2g->router_groups, 4);
  EXPECT_EQ(v2g->router_group_score, "max");
  const ModelPlan v3 = build_plan(*h);
  EXPECT_TRUE(std::any_of(v3.shared.begin(), v3.shared.end(), [](const PlannedTensor& t) {
    return t.hf_name == "model.layers.2.mlp.gate.e_score_correction_bias";
  }));
  EXPECT_TRUE(std::any_of(v3.shared.begin(), v3.shared.end(), [](const PlannedTensor& t) {
    return t.name == "blk.0.attn_q_a_norm.weight" && t.hf_name == "model.layers.0.self_attn.q_a_layernorm.weight";
  }));
}

TEST(HfConfigValues, DeepSeekRefusesWhatItCannotRunByName) {
  const std::pair<const char*, json> bad[] = {
      {"topk_method is \"top2\"; DeepseekV2ForCausalLM's must be \"greedy\" or \"group_limited_greedy\"",
       json{{"topk_method", "top2"}}},
      {"topk_method is \"noaux_tc\"; DeepseekV2ForCausalLM's must be", json{{"topk_method", "noaux_tc"}}},
      {"scoring_func is \"sigmoid\"; DeepseekV2ForCausalLM scores its experts by \"softmax\"",
       json{{"scoring_func", "sigmoid"}}},
      {"n_group 0 and topk_group 1 must be 1 or more, topk_group at most n_group", json{{"n_group", 0}}},
      {"n_group 4 and topk_group 9 must be 1 or more, topk_group at most n_group",
       json{{"n_group", 4}, {"topk_group", 9}}},
      {"rope_scaling has mscale but no \"factor\"",
       json{{"rope_scaling", {{"type", "yarn"}, {"mscale", 0.707}, {"mscale_all_dim", 0.707}}}}},
      {"mscale_all_dim is -50; it must be in 0..100",
       json{{"rope_scaling", {{"type", "yarn"}, {"factor", 40}, {"mscale_all_dim", -50}}}}},
      {"routed_scaling_factor is 4000000000.0; it must be in (0, 1000]", json{{"routed_scaling_factor", 4e9}}},
      {"qk_nope_head_dim 15 and qk_rope_head_dim 8 must be even and 2 or more", json{{"qk_nope_head_dim", 15}}},
      {"router_groups is 16; it must divide n_experts (8) into groups of one expert or more",
       json{{"n_group", 16}, {"topk_group", 4}, {"topk_method", "group_limited_greedy"}}},
      {"attention_bias=true is not supported", json{{"attention_bias", true}}},
      {"missing required field \"kv_lora_rank\"", json{{"kv_lora_rank", nullptr}}},
      {"qk_nope_head_dim 16 and qk_rope_head_dim 7 must be even and 2 or more", json{{"qk_rope_head_dim", 7}}},
      {"qk_nope_head_dim 0 and qk_rope_head_dim 8", json{{"qk_nope_head_dim", 0}}},
      {"qk_nope_head_dim 4611686018427387904", json{{"qk_nope_head_dim", 4611686018427387904LL}}},
      {"v_head_dim", json{{"v_head_dim", 0}}},
      {"kv_lora_rank", json{{"kv_lora_rank", -1}}},
      {"first_k_dense_replace 5 and moe_layer_freq 1 must be in 0..num_hidden_layers (4)",
       json{{"first_k_dense_replace", 5}}},
      {"moe_layer_freq 0", json{{"moe_layer_freq", 0}}},
      {"scoring_func is \"relu\"; DeepseekV2ForCausalLM scores its experts by \"softmax\"",
       json{{"scoring_func", "relu"}}},
      {"n_shared_experts is 65; it must be in 0..64", json{{"n_shared_experts", 65}}},
  };
  expect_refused(deepseek_v2_lite(), bad);
}

// Llama 4 Scout's text_config (tiny sizes), nested as transformers' Llama4Config saves it.
json llama4_scout() {
  json text{{"hidden_size", 64},
            {"intermediate_size", 16},
            {"intermediate_size_mlp", 48},
            {"num_hidden_layers", 8},
            {"num_attention_heads", 4},
            {"num_key_value_heads", 2},
            {"head_dim", 16},
            {"vocab_size", 64},
            {"num_local_experts", 4},
            {"num_experts_per_tok", 1},
            {"interleave_moe_layer_step", 1},
            {"attention_chunk_size", 8192},
            {"attn_temperature_tuning", 4},
            {"rope_scaling",
             {{"rope_type", "llama3"},
              {"factor", 16.0},
              {"low_freq_factor", 1.0},
              {"high_freq_factor", 1.0},
              {"original_max_position_embeddings", 8192}}}};
  return json{{"architectures", {"Llama4ForConditionalGeneration"}}, {"text_config", text}};
}

TEST(HfConfigValues, Llama4ReadsItsLayerPatternsFromTextConfig) {
  auto h = hparams_from_hf_config(llama4_scout(), "config.json");
  ASSERT_TRUE(h) << h.error().message();
  EXPECT_EQ(h->architecture, "llama4");
  EXPECT_EQ(h->rms_norm_eps, 1e-5);
  EXPECT_EQ(h->rope_theta, 500000.0);
  EXPECT_TRUE(h->rope_interleaved);
  // transformers' defaults: every 4th layer without RoPE, the others chunked; q/k norms; queries scaled from 8192.
  EXPECT_EQ(h->nope_layers, (std::vector<std::int64_t>{3, 7}));
  EXPECT_EQ(h->chunked_layers, (std::vector<std::int64_t>{0, 1, 2, 4, 5, 6}));
  EXPECT_EQ(h->attention_chunk, 8192);
  EXPECT_EQ(h->qk_norm, "l2");
  EXPECT_EQ(h->attn_temperature_floor, 8192.0);
  EXPECT_EQ(h->attn_temperature_scale, 0.1);
  // intermediate_size is the experts' (and the shared expert's) width, intermediate_size_mlp the dense layers'.
  EXPECT_EQ(h->moe_intermediate_size, 16);
  EXPECT_EQ(h->shared_expert_intermediate_size, 16);
  EXPECT_EQ(h->intermediate_size, 48);
  EXPECT_EQ(h->router_scoring, "sigmoid");
  EXPECT_TRUE(h->router_weight_on_input);
  EXPECT_FALSE(h->norm_topk_prob);
  for (std::int64_t l = 0; l < 8; ++l) EXPECT_TRUE(h->layer_is_sparse(l)) << l;
  EXPECT_EQ(h->format_version(), 5);
  auto back = HyperParams::from_json(h->to_json());
  ASSERT_TRUE(back) << back.error().message();
  EXPECT_EQ(back->to_json(), h->to_json());

  // Maverick: MoE on odd layers (by the step, or by moe_layers), no q/k norm; temperature tuning off.
  auto c = llama4_scout();
  c["text_config"].update(
      json{{"interleave_moe_layer_step", 2}, {"use_qk_norm", false}, {"attn_temperature_tuning", false}});
  h = hparams_from_hf_config(c, "config.json");
  ASSERT_TRUE(h) << h.error().message();
  for (std::int64_t l = 0; l < 8; ++l) EXPECT_EQ(h->layer_is_sparse(l), l % 2 == 1) << l;
  EXPECT_EQ(h->qk_norm, "none");
  EXPECT_EQ(h->attn_temperature_floor, 0.0);
  c["text_config"]["moe_layers"] = json{0, 5};
  h = hparams_from_hf_config(c, "config.json");
  ASSERT_TRUE(h) << h.error().message();
  for (std::int64_t l = 0; l < 8; ++l) EXPECT_EQ(h->layer_is_sparse(l), l == 0 || l == 5) << l;

  // Explicit lists win over the defaults: no_rope_layers (1: RoPE) and layer_types.
  c = llama4_scout();
  c["text_config"]["no_rope_layers"] = json{1, 0, 1, 1, 1, 1, 1, 0};
  c["text_config"]["layer_types"] =
      json{"chunked_attention", "full_attention",    "full_attention",    "chunked_attention",
           "chunked_attention", "chunked_attention", "chunked_attention", "full_attention"};
  h = hparams_from_hf_config(c, "config.json");
  ASSERT_TRUE(h) << h.error().message();
  EXPECT_EQ(h->nope_layers, (std::vector<std::int64_t>{1, 7}));
  EXPECT_EQ(h->chunked_layers, (std::vector<std::int64_t>{0, 3, 4, 5, 6}));
  EXPECT_FALSE(h->layer_has_rope(1));
  EXPECT_EQ(h->layer_chunk(2), 0);
  EXPECT_EQ(h->layer_chunk(3), 8192);
  // A text-only Llama4ForCausalLM checkpoint keeps the fields at the top: the same model.
  c = llama4_scout()["text_config"];
  c["architectures"] = json{"Llama4ForCausalLM"};
  h = hparams_from_hf_config(c, "config.json");
  ASSERT_TRUE(h) << h.error().message();
  EXPECT_EQ(h->architecture, "llama4");
  EXPECT_EQ(h->nope_layers, (std::vector<std::int64_t>{3, 7}));
  EXPECT_TRUE(h->router_weight_on_input);
  // attention_chunk_size null: every layer attends to the whole context.
  c = llama4_scout();
  c["text_config"]["attention_chunk_size"] = nullptr;
  h = hparams_from_hf_config(c, "config.json");
  ASSERT_TRUE(h) << h.error().message();
  EXPECT_TRUE(h->chunked_layers.empty());
  EXPECT_EQ(h->layer_chunk(0), 0);
}

TEST(HfConfigValues, Llama4RefusesWhatItCannotRunByName) {
  const std::pair<const char*, json> bad[] = {
      {"no_rope_layers must hold one 0 or 1 per layer (num_hidden_layers 8", json{{"no_rope_layers", {1, 0}}}},
      {"no_rope_layers must hold one 0 or 1 per layer", json{{"no_rope_layers", {1, 1, 1, 2, 1, 1, 1, 1}}}},
      {"attention_chunk_size is 0; it must be a whole number of 1 or more, or null", json{{"attention_chunk_size", 0}}},
      {"layer_types[2] is sliding_attention; it must be \"chunked_attention\" or \"full_attention\"",
       json{{"layer_types",
             {"chunked_attention", "chunked_attention", "sliding_attention", "full_attention", "chunked_attention",
              "chunked_attention", "chunked_attention", "full_attention"}}}},
      {"moe_layers lists 9; layers are 0..7", json{{"moe_layers", {1, 9}}}},
      {"interleave_moe_layer_step must be a whole number of 1 or more", json{{"interleave_moe_layer_step", 0}}},
      {"router_weight_on_input needs one expert a token (n_experts_per_tok 2)", json{{"num_experts_per_tok", 2}}},
      {"attention_bias=true is not supported", json{{"attention_bias", true}}},
      {"floor_scale must be positive", json{{"floor_scale", 0}}},
  };
  for (const auto& [want, patch] : bad) {
    auto c = llama4_scout();
    c["text_config"].update(patch);
    auto h = hparams_from_hf_config(c, "config.json");
    ASSERT_FALSE(h) << patch.dump();
    EXPECT_NE(h.error().message().find(want), std::string::npos) << h.error().message();
    EXPECT_NE(h.error().message().find("config.json (text_config)"), std::string::npos) << h.error().message();
  }
}

}  // namespace
}  // namespace colibri::model
