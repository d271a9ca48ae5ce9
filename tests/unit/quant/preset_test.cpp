// Preset tables: per-tensor types as llama.cpp's llama_tensor_get_type chooses them.
#include "colibri/quant/preset.hpp"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

namespace colibri::quant {
namespace {

DType type_of(Preset p, const ModelShape& m, TensorRole role, int layer, std::int64_t row) {
  auto r = choose_type(p, m, TensorDesc{role, layer, row});
  EXPECT_TRUE(r.has_value()) << (r ? "" : r.error().to_string());
  return r ? r->type : DType::i8;
}

// Types of every tensor of a dense Llama-style model, counted like llama.cpp's loader summary.
std::map<DType, int> count_dense_llama(Preset p, const ModelShape& m, std::int64_t hidden, std::int64_t ffn) {
  std::map<DType, int> counts;
  auto add = [&](TensorRole role, int layer, std::int64_t row) { ++counts[type_of(p, m, role, layer, row)]; };
  add(TensorRole::token_embd, -1, hidden);
  add(TensorRole::output, -1, hidden);
  add(TensorRole::norm, -1, hidden);
  for (int l = 0; l < m.n_layers; ++l) {
    for (TensorRole r : {TensorRole::attn_q, TensorRole::attn_k, TensorRole::attn_v, TensorRole::attn_output,
                         TensorRole::ffn_gate, TensorRole::ffn_up}) {
      add(r, l, hidden);
    }
    add(TensorRole::ffn_down, l, ffn);
    add(TensorRole::norm, l, hidden);
    add(TensorRole::norm, l, hidden);
  }
  return counts;
}

const ModelShape kLlama7B{32, 0, 32, 32, false, false};

TEST(QuantPreset, UseMoreBitsPicksFirstLastEighthAndEveryThirdLayer) {
  std::set<int> picked;
  for (int l = 0; l < 32; ++l) {
    if (use_more_bits(l, 32)) picked.insert(l);
  }
  EXPECT_EQ(picked, (std::set<int>{0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31}));
}

// q4_k_m / q5_k_m / q3_k_m: the tensor-type counts llama.cpp's loader prints for Llama-2-7B files;
// q2_k follows today's rules (older llama.cpp releases mixed q2_k differently).
TEST(QuantPreset, Llama7BCountsMatchLlamaCpp) {
  auto q4km = count_dense_llama(Preset::q4_k_m, kLlama7B, 4096, 11008);
  EXPECT_EQ(q4km[DType::f32], 65);
  EXPECT_EQ(q4km[DType::q4_k], 193);
  EXPECT_EQ(q4km[DType::q6_k], 33);  // 16 attn_v + 16 ffn_down + output
  auto q5km = count_dense_llama(Preset::q5_k_m, kLlama7B, 4096, 11008);
  EXPECT_EQ(q5km[DType::q5_k], 193);
  EXPECT_EQ(q5km[DType::q6_k], 33);
  auto q3km = count_dense_llama(Preset::q3_k_m, kLlama7B, 4096, 11008);
  EXPECT_EQ(q3km[DType::q3_k], 129);
  EXPECT_EQ(q3km[DType::q4_k], 92);
  EXPECT_EQ(q3km[DType::q5_k], 4);
  EXPECT_EQ(q3km[DType::q6_k], 1);
  auto q6k = count_dense_llama(Preset::q6_k, kLlama7B, 4096, 11008);
  EXPECT_EQ(q6k[DType::q6_k], 226);
  auto q80 = count_dense_llama(Preset::q8_0, kLlama7B, 4096, 11008);
  EXPECT_EQ(q80[DType::q8_0], 226);  // output stays q8_0 under q8_0
  auto f16 = count_dense_llama(Preset::f16, kLlama7B, 4096, 11008);
  EXPECT_EQ(f16[DType::f16], 226);
  EXPECT_EQ(f16[DType::f32], 65);
  auto q2k = count_dense_llama(Preset::q2_k, kLlama7B, 4096, 11008);
  EXPECT_EQ(q2k[DType::q3_k], 96);  // attn_v, attn_output, ffn_down
  EXPECT_EQ(q2k[DType::q6_k], 1);
  EXPECT_EQ(q2k[DType::q2_k], 129);
}

TEST(QuantPreset, Q4KMKeepsPartOfAttnVAndFfnDownAtQ6K) {
  EXPECT_EQ(type_of(Preset::q4_k_m, kLlama7B, TensorRole::attn_v, 0, 4096), DType::q6_k);
  EXPECT_EQ(type_of(Preset::q4_k_m, kLlama7B, TensorRole::attn_v, 4, 4096), DType::q4_k);
  EXPECT_EQ(type_of(Preset::q4_k_m, kLlama7B, TensorRole::attn_v, 6, 4096), DType::q6_k);
  EXPECT_EQ(type_of(Preset::q4_k_m, kLlama7B, TensorRole::ffn_down, 31, 11008), DType::q6_k);
  EXPECT_EQ(type_of(Preset::q4_k_m, kLlama7B, TensorRole::ffn_down, 5, 11008), DType::q4_k);
  EXPECT_EQ(type_of(Preset::q4_k_m, kLlama7B, TensorRole::attn_qkv, 0, 4096), DType::q6_k);
  EXPECT_EQ(type_of(Preset::q4_k_m, kLlama7B, TensorRole::ffn_gate, 0, 4096), DType::q4_k);
  EXPECT_EQ(type_of(Preset::q4_k_m, kLlama7B, TensorRole::attn_q, 0, 4096), DType::q4_k);
  EXPECT_EQ(type_of(Preset::q4_k_m, kLlama7B, TensorRole::output, -1, 4096), DType::q6_k);
  EXPECT_EQ(type_of(Preset::q4_k_m, kLlama7B, TensorRole::token_embd, -1, 4096), DType::q4_k);
}

TEST(QuantPreset, TiedEmbeddingsTakeTheOutputType) {
  ModelShape tied = kLlama7B;
  tied.tied_embeddings = true;
  EXPECT_EQ(type_of(Preset::q4_k_m, tied, TensorRole::token_embd, -1, 4096), DType::q6_k);
  EXPECT_EQ(type_of(Preset::q8_0, tied, TensorRole::token_embd, -1, 4096), DType::q8_0);
  EXPECT_EQ(type_of(Preset::q2_k, tied, TensorRole::token_embd, -1, 4096), DType::q6_k);
}

TEST(QuantPreset, Q2KAttnVDependsOnGqa) {
  const ModelShape gqa8{32, 0, 32, 8, false, false};
  EXPECT_EQ(type_of(Preset::q2_k, gqa8, TensorRole::attn_v, 10, 4096), DType::q4_k);
  EXPECT_EQ(type_of(Preset::q2_k, kLlama7B, TensorRole::attn_v, 10, 4096), DType::q3_k);
  EXPECT_EQ(type_of(Preset::q2_k, gqa8, TensorRole::attn_output, 10, 4096), DType::q3_k);
}

TEST(QuantPreset, SeventyBRuleRaisesAttnV) {
  const ModelShape big{80, 0, 64, 8, false, true};
  EXPECT_EQ(type_of(Preset::q3_k_m, big, TensorRole::attn_v, 40, 8192), DType::q5_k);
  EXPECT_EQ(type_of(Preset::q4_k_m, big, TensorRole::attn_v, 11, 8192), DType::q5_k);  // not a use_more_bits layer
  EXPECT_EQ(type_of(Preset::q4_k_m, big, TensorRole::attn_v, 0, 8192), DType::q6_k);
}

// Mixtral 8x7B: exactly 8 experts bumps attn_v / attn_k to q8_0 and attn_output to q5_k.
TEST(QuantPreset, EightExpertAdjustments) {
  const ModelShape mixtral{32, 8, 32, 8, false, false};
  for (Preset p : {Preset::q2_k, Preset::q3_k_m, Preset::q4_k_m, Preset::q5_k_m, Preset::q6_k}) {
    EXPECT_EQ(type_of(p, mixtral, TensorRole::attn_v, 5, 4096), DType::q8_0) << to_string(p);
    EXPECT_EQ(type_of(p, mixtral, TensorRole::attn_k, 5, 4096), DType::q8_0) << to_string(p);
  }
  EXPECT_EQ(type_of(Preset::q4_k_m, mixtral, TensorRole::attn_output, 5, 4096), DType::q5_k);
  EXPECT_EQ(type_of(Preset::q3_k_m, mixtral, TensorRole::attn_output, 5, 4096), DType::q5_k);
  EXPECT_EQ(type_of(Preset::q2_k, mixtral, TensorRole::attn_output, 5, 4096), DType::q5_k);
  EXPECT_EQ(type_of(Preset::q5_k_m, mixtral, TensorRole::attn_output, 5, 4096), DType::q5_k);
  EXPECT_EQ(type_of(Preset::q6_k, mixtral, TensorRole::attn_output, 5, 4096), DType::q6_k);
  EXPECT_EQ(type_of(Preset::q4_k_m, mixtral, TensorRole::ffn_down, 0, 14336), DType::q6_k);
  EXPECT_EQ(type_of(Preset::q4_k_m, mixtral, TensorRole::ffn_down, 4, 14336), DType::q4_k);
  EXPECT_EQ(type_of(Preset::q4_k_m, mixtral, TensorRole::ffn_up, 0, 4096), DType::q4_k);
  EXPECT_EQ(type_of(Preset::q4_k_m, mixtral, TensorRole::ffn_gate_inp, 0, 4096), DType::f32);
  // Other expert counts (Qwen3-MoE: 128) get no bump.
  const ModelShape qwen3{48, 128, 32, 4, false, false};
  EXPECT_EQ(type_of(Preset::q4_k_m, qwen3, TensorRole::attn_k, 5, 2048), DType::q4_k);
  EXPECT_EQ(type_of(Preset::q4_k_m, qwen3, TensorRole::attn_output, 5, 4096), DType::q4_k);
}

TEST(QuantPreset, AlwaysF32Roles) {
  const ModelShape qwen2moe{24, 60, 16, 16, false, false};
  for (Preset p : all_presets()) {
    for (TensorRole r : {TensorRole::norm, TensorRole::attn_q_norm, TensorRole::attn_k_norm, TensorRole::bias,
                         TensorRole::ffn_gate_inp, TensorRole::ffn_gate_inp_shexp}) {
      EXPECT_EQ(type_of(p, qwen2moe, r, 3, 2048), DType::f32) << to_string(p) << " " << to_string(r);
    }
  }
}

// Qwen1.5-MoE-A2.7B: expert FFN width 1408 = 5.5 x 256, so ffn_down rows fit no k-quant.
TEST(QuantPreset, FallbackWhenRowsDoNotDivideIntoBlocks) {
  const ModelShape qwen2moe{24, 60, 16, 16, false, false};
  auto six = choose_type(Preset::q4_k_m, qwen2moe, {TensorRole::ffn_down, 0, 1408});
  ASSERT_TRUE(six.has_value());
  EXPECT_EQ(six->preset_type, DType::q6_k);
  EXPECT_EQ(six->type, DType::q8_0);
  EXPECT_TRUE(six->fallback);
  EXPECT_NE(six->reason.find("1408"), std::string::npos) << six->reason;
  EXPECT_NE(six->reason.find("256"), std::string::npos) << six->reason;
  auto four = choose_type(Preset::q4_k_m, qwen2moe, {TensorRole::ffn_down, 4, 1408});
  ASSERT_TRUE(four.has_value());
  EXPECT_EQ(four->preset_type, DType::q4_k);
  EXPECT_EQ(four->type, DType::q4_0);
  EXPECT_TRUE(four->fallback);
  EXPECT_EQ(type_of(Preset::q2_k, qwen2moe, TensorRole::ffn_down_shexp, 4, 1408), DType::q4_0);  // q3_k -> q4_0
  EXPECT_EQ(type_of(Preset::q5_k_m, qwen2moe, TensorRole::ffn_down, 4, 1408), DType::q4_0);      // q5_k -> q4_0
  // Not a multiple of 32 either: f16.
  auto odd = choose_type(Preset::q4_k_m, qwen2moe, {TensorRole::ffn_up, 4, 100});
  ASSERT_TRUE(odd.has_value());
  EXPECT_EQ(odd->type, DType::f16);
  EXPECT_TRUE(odd->fallback);
  EXPECT_EQ(type_of(Preset::q8_0, qwen2moe, TensorRole::attn_q, 1, 100), DType::f16);
  // Rows that fit need no fallback.
  auto fits = choose_type(Preset::q4_k_m, qwen2moe, {TensorRole::ffn_up, 4, 2048});
  ASSERT_TRUE(fits.has_value());
  EXPECT_FALSE(fits->fallback);
  EXPECT_TRUE(fits->reason.empty());
  // Float presets never fall back.
  EXPECT_FALSE(choose_type(Preset::bf16, qwen2moe, {TensorRole::ffn_down, 4, 1408})->fallback);
}

TEST(QuantPreset, OutputWithOddWidthUsesQ8_0) {
  const ModelShape m{24, 0, 16, 16, false, false};
  auto out = choose_type(Preset::q4_k_m, m, {TensorRole::output, -1, 2880});  // 2880 % 256 = 64
  ASSERT_TRUE(out.has_value());
  EXPECT_EQ(out->type, DType::q8_0);
  EXPECT_FALSE(out->fallback);                                                // the preset's own rule, as in llama.cpp
  auto odd = choose_type(Preset::q4_k_m, m, {TensorRole::output, -1, 1000});  // 1000 % 32 = 8
  ASSERT_TRUE(odd.has_value());
  EXPECT_EQ(odd->type, DType::f16);
  EXPECT_TRUE(odd->fallback);
}

TEST(QuantPreset, FlatCallFormAgrees) {
  const auto flat = choose_type(Preset::q2_k, TensorRole::attn_v, 3, 32, 0, 4096, 32, 8);
  ASSERT_TRUE(flat.has_value());
  EXPECT_EQ(flat->type, DType::q4_k);
  const auto moe = choose_type(Preset::q4_k_m, TensorRole::attn_k, 3, 32, 8, 4096);
  ASSERT_TRUE(moe.has_value());
  EXPECT_EQ(moe->type, DType::q8_0);
  EXPECT_FALSE(choose_type(Preset::q4_k_m, TensorRole::attn_k, 40, 32, 8, 4096).has_value());
}

TEST(QuantPreset, InvalidArguments) {
  EXPECT_FALSE(choose_type(Preset::q4_k_m, kLlama7B, {TensorRole::attn_v, 32, 4096}).has_value());
  EXPECT_FALSE(choose_type(Preset::q4_k_m, kLlama7B, {TensorRole::ffn_down, -1, 4096}).has_value());
  EXPECT_FALSE(choose_type(Preset::q4_k_m, kLlama7B, {TensorRole::attn_q, 0, 0}).has_value());
  const auto r = choose_type(Preset::q4_k_m, ModelShape{}, {TensorRole::output, -1, 4096});
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code(), sdk::StatusCode::invalid_argument);
  EXPECT_NE(r.error().message().find("layers"), std::string::npos);
}

TEST(QuantPreset, Names) {
  EXPECT_EQ(parse_preset("Q4_K_M"), Preset::q4_k_m);
  EXPECT_EQ(parse_preset("q2_k"), Preset::q2_k);
  EXPECT_EQ(parse_preset("bf16"), Preset::bf16);
  EXPECT_FALSE(parse_preset("q4_k_s").has_value());
  EXPECT_FALSE(parse_preset("").has_value());
  EXPECT_EQ(preset_names(), "f32, f16, bf16, q8_0, q6_k, q5_k_m, q4_k_m, q3_k_m, q2_k");
  for (Preset p : all_presets()) {
    EXPECT_EQ(parse_preset(to_string(p)), p);
    EXPECT_TRUE(is_supported(preset_base_type(p)));
  }
}

TEST(QuantPreset, RolesFromGgufNames) {
  int layer = 99;
  EXPECT_EQ(role_from_gguf_name("token_embd.weight", &layer), TensorRole::token_embd);
  EXPECT_EQ(layer, -1);
  EXPECT_EQ(role_from_gguf_name("output.weight"), TensorRole::output);
  EXPECT_EQ(role_from_gguf_name("output_norm.weight"), TensorRole::norm);
  EXPECT_EQ(role_from_gguf_name("blk.17.ffn_down_exps.weight", &layer), TensorRole::ffn_down);
  EXPECT_EQ(layer, 17);
  EXPECT_EQ(role_from_gguf_name("blk.3.ffn_gate.5.weight", &layer), TensorRole::ffn_gate);
  EXPECT_EQ(role_from_gguf_name("blk.0.ffn_gate_inp_shexp.weight"), TensorRole::ffn_gate_inp_shexp);
  EXPECT_EQ(role_from_gguf_name("blk.0.ffn_gate_inp.weight"), TensorRole::ffn_gate_inp);
  EXPECT_EQ(role_from_gguf_name("blk.0.ffn_down_shexp.weight"), TensorRole::ffn_down_shexp);
  EXPECT_EQ(role_from_gguf_name("blk.0.attn_k_norm.weight"), TensorRole::attn_k_norm);
  EXPECT_EQ(role_from_gguf_name("blk.0.attn_norm.weight"), TensorRole::norm);
  EXPECT_EQ(role_from_gguf_name("blk.0.attn_q.bias"), TensorRole::bias);
  EXPECT_EQ(role_from_gguf_name("blk.0.attn_qkv.weight"), TensorRole::attn_qkv);
  EXPECT_FALSE(role_from_gguf_name("blk.x.attn_q.weight").has_value());
  EXPECT_FALSE(role_from_gguf_name("rope_freqs.weight").has_value());
  EXPECT_FALSE(role_from_gguf_name("blk.1.mystery.weight").has_value());
}

}  // namespace
}  // namespace colibri::quant
