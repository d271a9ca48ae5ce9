#include "model/architecture.hpp"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace colibri::model {
namespace {

using nlohmann::json;

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
  for (const auto& [want, patch] : bad) {
    auto c = minimal("Qwen3MoeForCausalLM");
    c.update(patch);
    auto h = hparams_from_hf_config(c, "config.json");
    ASSERT_FALSE(h) << patch.dump();
    EXPECT_NE(h.error().message().find(want), std::string::npos) << h.error().message();
  }
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

}  // namespace
}  // namespace colibri::model
