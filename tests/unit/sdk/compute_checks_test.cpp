// sdk::check_op_call: the host-side checks the device backends share, with errors naming the op, the tensor and
// the backend; and supports_every_op, the supports() of a backend that runs every op.
#include "colibri/sdk/compute_checks.hpp"

#include <gtest/gtest.h>

#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

namespace {

using namespace colibri::sdk;

Tensor tensor(DType type, std::array<std::int64_t, 4> ne) {
  Tensor t;
  t.type = type;
  t.ne = ne;
  return t;
}

// One call's tensors, kept alive for the spans of the OpCall.
struct Call {
  std::vector<Tensor> in, out;
  OpCall call;
  Call(Op op, std::initializer_list<Tensor> inputs, std::initializer_list<Tensor> outputs, OpParams params = {})
      : in(inputs), out(outputs) {
    call.op = op;
    call.inputs = in;
    call.outputs = out;
    call.params = params;
  }
  [[nodiscard]] Status check() const { return check_op_call(call, "testdev"); }
};

TEST(CheckOpCall, AcceptsWellFormedCalls) {
  EXPECT_TRUE(Call(Op::matmul, {tensor(DType::q4_k, {256, 8, 1, 1}), tensor(DType::f32, {256, 3, 1, 1})},
                   {tensor(DType::f32, {8, 3, 1, 1})})
                  .check());
  OpParams p;
  p.position = 2;
  EXPECT_TRUE(
      Call(Op::attention,
           {tensor(DType::f32, {64, 4, 3, 1}), tensor(DType::f16, {64, 2, 5, 1}), tensor(DType::f16, {64, 2, 5, 1})},
           {tensor(DType::f32, {64, 4, 3, 1})}, p)
          .check());
  OpParams k;
  k.top_k = 2;
  k.flags = kRoutingSoftmax | kRoutingRenormalize;
  EXPECT_TRUE(Call(Op::topk_routing, {tensor(DType::f32, {8, 4, 1, 1})},
                   {tensor(DType::i32, {2, 4, 1, 1}), tensor(DType::f32, {2, 4, 1, 1})}, k)
                  .check());
}

TEST(CheckOpCall, NamesTheOpAndTheTensor) {
  const Status count =
      Call(Op::rms_norm, {tensor(DType::f32, {8, 1, 1, 1})}, {tensor(DType::f32, {8, 1, 1, 1})}).check();
  EXPECT_EQ(count.code(), StatusCode::invalid_argument);
  EXPECT_EQ(count.message(), "rms_norm takes 2 inputs and 1 outputs; got 1 and 1");

  const Status type = Call(Op::matmul, {tensor(DType::f32, {16, 4, 1, 1}), tensor(DType::f16, {16, 1, 1, 1})},
                           {tensor(DType::f32, {4, 1, 1, 1})})
                          .check();
  EXPECT_EQ(type.message(), "matmul: X must be f32, got f16 {16, 1, 1, 1}");

  const Status shape = Call(Op::matmul, {tensor(DType::f32, {16, 4, 1, 1}), tensor(DType::f32, {8, 1, 1, 1})},
                            {tensor(DType::f32, {4, 1, 1, 1})})
                           .check();
  EXPECT_EQ(shape.message(), "matmul: X f32 {8, 1, 1, 1} does not match W f32 {16, 4, 1, 1} (ne[0] differs)");

  const Status bias =
      Call(Op::matmul,
           {tensor(DType::f32, {16, 4, 1, 1}), tensor(DType::f32, {16, 1, 1, 1}), tensor(DType::f32, {3, 1, 1, 1})},
           {tensor(DType::f32, {4, 1, 1, 1})})
          .check();
  EXPECT_EQ(bias.message(), "matmul: bias must have N = 4 elements");

  const Status rope =
      Call(Op::rope,
           {tensor(DType::f32, {8, 2, 3, 1}), tensor(DType::i32, {3, 1, 1, 1}), tensor(DType::f32, {4, 1, 1, 1})},
           {tensor(DType::f32, {8, 2, 3, 1})}, OpParams{.rope_dims = 10})
          .check();
  EXPECT_EQ(rope.message(), "rope: params.rope_dims 10 must be even and in 2..8");
}

TEST(CheckOpCall, UnsupportedTypesAndOpsNameTheBackend) {
  const Status weight = Call(Op::expert_ffn,
                             {tensor(DType::f32, {16, 8, 1, 1}), tensor(DType::q4_1, {16, 8, 1, 1}),
                              tensor(DType::f32, {8, 16, 1, 1}), tensor(DType::f32, {16, 1, 1, 1})},
                             {tensor(DType::f32, {16, 1, 1, 1})})
                            .check();
  EXPECT_EQ(weight.code(), StatusCode::unsupported);
  EXPECT_EQ(weight.message(), "expert_ffn: weight type q4_1 is not supported by testdev");

  const Status table = Call(Op::embedding, {tensor(DType::q8_k, {256, 10, 1, 1}), tensor(DType::i32, {2, 1, 1, 1})},
                            {tensor(DType::f32, {256, 2, 1, 1})})
                           .check();
  EXPECT_EQ(table.message(), "embedding: table type q8_k is not supported by testdev");

  const Status kv =
      Call(Op::attention,
           {tensor(DType::f32, {64, 2, 1, 1}), tensor(DType::f16, {64, 2, 4, 1}), tensor(DType::f32, {64, 2, 4, 1})},
           {tensor(DType::f32, {64, 2, 1, 1})})
          .check();
  EXPECT_EQ(kv.code(), StatusCode::unsupported);
  EXPECT_EQ(kv.message(),
            "attention: KV cache types f16 / f32 are not supported by testdev (f32, f16 or q8_0, both the same)");

  const Status op = Call(Op::count_, {}, {}).check();
  EXPECT_EQ(op.code(), StatusCode::unsupported);
  EXPECT_EQ(op.message(), "op " + std::to_string(static_cast<int>(Op::count_)) +
                              " is not in the op set this testdev backend was built with (a newer SDK's op?)");
}

TEST(CheckOpCall, StoreRowsTakesF32RowsIntoAKvTypeOfTheSameShape) {
  EXPECT_TRUE(Call(Op::store_rows, {tensor(DType::f32, {64, 3, 1, 1})}, {tensor(DType::q8_0, {64, 3, 1, 1})}).check());
  EXPECT_TRUE(Call(Op::store_rows, {tensor(DType::f32, {64, 3, 1, 1})}, {tensor(DType::f16, {64, 3, 1, 1})}).check());
  const Status q4 =
      Call(Op::store_rows, {tensor(DType::f32, {256, 1, 1, 1})}, {tensor(DType::q4_k, {256, 1, 1, 1})}).check();
  EXPECT_EQ(q4.code(), StatusCode::unsupported);
  EXPECT_NE(q4.message().find("q4_k is not a KV cache type"), std::string::npos) << q4.message();
  const Status block =
      Call(Op::store_rows, {tensor(DType::f32, {48, 1, 1, 1})}, {tensor(DType::q8_0, {48, 1, 1, 1})}).check();
  EXPECT_EQ(block.code(), StatusCode::invalid_argument);
  EXPECT_NE(block.message().find("multiple of the q8_0 block"), std::string::npos) << block.message();
  const Status shape =
      Call(Op::store_rows, {tensor(DType::f32, {64, 3, 1, 1})}, {tensor(DType::f16, {64, 2, 1, 1})}).check();
  EXPECT_EQ(shape.code(), StatusCode::invalid_argument);
  const Status x16 =
      Call(Op::store_rows, {tensor(DType::f16, {64, 3, 1, 1})}, {tensor(DType::f16, {64, 3, 1, 1})}).check();
  EXPECT_EQ(x16.code(), StatusCode::invalid_argument);
}

TEST(CheckOpCall, RefusesWhatDeviceKernelsCannotIndex) {
  const Status big =
      Call(Op::sigmoid, {tensor(DType::f32, {1 << 16, 1 << 15, 1, 1})}, {tensor(DType::f32, {1 << 16, 1 << 15, 1, 1})})
          .check();
  EXPECT_EQ(big.message(), "sigmoid: X has more than 2^31 elements; split the call");
  const Status head =
      Call(Op::attention,
           {tensor(DType::f32, {640, 1, 1, 1}), tensor(DType::f32, {640, 1, 4, 1}), tensor(DType::f32, {640, 1, 4, 1})},
           {tensor(DType::f32, {640, 1, 1, 1})})
          .check();
  EXPECT_EQ(head.message(), "attention: head_dim 640 exceeds 576");
  // No KV heads: an error, not a division by zero.
  const Status no_kv =
      Call(Op::attention,
           {tensor(DType::f32, {64, 2, 1, 1}), tensor(DType::f32, {64, 0, 4, 1}), tensor(DType::f32, {64, 0, 4, 1})},
           {tensor(DType::f32, {64, 2, 1, 1})})
          .check();
  EXPECT_EQ(no_kv.message(), "attention: 2 query heads are not a multiple of 0 KV heads");
}

TEST(CheckOpCall, ExpertFfnGroupChecksEveryExpertAndNamesIt) {
  const auto expert = [](std::int64_t f, std::int64_t t) {
    return std::vector<Tensor>{tensor(DType::q4_k, {256, f, 1, 1}), tensor(DType::q4_k, {256, f, 1, 1}),
                               tensor(DType::q6_k, {f, 256, 1, 1}), tensor(DType::f32, {256, t, 1, 1})};
  };
  Call ok(Op::expert_ffn_group, {}, {tensor(DType::f32, {256, 1, 1, 1}), tensor(DType::f32, {256, 3, 1, 1})});
  for (const auto& part : {expert(512, 1), expert(256, 3)}) ok.in.insert(ok.in.end(), part.begin(), part.end());
  ok.call.inputs = ok.in;
  EXPECT_TRUE(ok.check()) << ok.check().message();

  Call wrong_t = ok;
  wrong_t.in[7] = tensor(DType::f32, {256, 2, 1, 1});  // expert 1's X has 2 tokens, its Y 3
  wrong_t.call.inputs = wrong_t.in;
  wrong_t.call.outputs = wrong_t.out;
  EXPECT_EQ(wrong_t.check().message(), "expert_ffn_group: expert 1: Y f32 {256, 3, 1, 1} must match X");

  Call short_call = ok;
  short_call.in.pop_back();
  short_call.call.inputs = short_call.in;
  short_call.call.outputs = short_call.out;
  EXPECT_EQ(short_call.check().message(),
            "expert_ffn_group: takes 4 inputs (W_gate, W_up, W_down, X) and 1 output per expert; got 7 inputs and 2 "
            "outputs");
}

TEST(CheckOpCall, AttentionSinksTakeOneF32SinkPerQueryHead) {
  OpParams p;
  p.position = 2;
  const Tensor q = tensor(DType::f32, {64, 4, 3, 1}), kv = tensor(DType::f16, {64, 2, 5, 1}),
               o = tensor(DType::f32, {64, 4, 3, 1});
  const Call ok(Op::attention_sinks, {q, kv, kv, tensor(DType::f32, {4, 1, 1, 1})}, {o}, p);
  EXPECT_TRUE(ok.check()) << ok.check().message();

  const Status three = Call(Op::attention_sinks, {q, kv, kv}, {o}, p).check();
  EXPECT_EQ(three.code(), StatusCode::invalid_argument);
  EXPECT_EQ(three.message(), "attention_sinks takes 4 inputs and 1 outputs; got 3 and 1");
  EXPECT_EQ(Call(Op::attention, {q, kv, kv, tensor(DType::f32, {4, 1, 1, 1})}, {o}, p).check().message(),
            "attention takes 3 inputs and 1 outputs; got 4 and 1");

  EXPECT_EQ(Call(Op::attention_sinks, {q, kv, kv, tensor(DType::f16, {4, 1, 1, 1})}, {o}, p).check().message(),
            "attention_sinks: sinks must be f32, got f16 {4, 1, 1, 1}");
  EXPECT_EQ(Call(Op::attention_sinks, {q, kv, kv, tensor(DType::f32, {2, 1, 1, 1})}, {o}, p).check().message(),
            "attention_sinks: sinks f32 {2, 1, 1, 1} must have n_heads = 4 elements");
  EXPECT_EQ(Call(Op::attention_sinks, {q, kv, kv, tensor(DType::f32, {2, 2, 1, 1})}, {o}, p).check().message(),
            "attention_sinks: sinks f32 {2, 2, 1, 1} must have n_heads = 4 elements");

  // attention's own checks, under the op's name.
  const Status types =
      Call(Op::attention_sinks, {q, kv, tensor(DType::q8_0, {64, 2, 5, 1}), tensor(DType::f32, {4, 1, 1, 1})}, {o}, p)
          .check();
  EXPECT_EQ(types.code(), StatusCode::unsupported);
  EXPECT_EQ(
      types.message(),
      "attention_sinks: KV cache types f16 / q8_0 are not supported by testdev (f32, f16 or q8_0, both the same)");
  OpParams late = p;
  late.position = 3;
  EXPECT_EQ(Call(Op::attention_sinks, {q, kv, kv, tensor(DType::f32, {4, 1, 1, 1})}, {o}, late).check().message(),
            "attention_sinks: queries at positions 3..5 need 6 cached keys; the cache holds 5");
}

TEST(CheckOpCall, ExpertFfnClampedChecksBiasesAndClampParameters) {
  const auto call = [](std::initializer_list<Tensor> in, float alpha = 1.702f, float limit = 7.0f) {
    OpParams p;
    p.scale = alpha;
    p.eps = limit;
    return Call(Op::expert_ffn_clamped, in, {tensor(DType::f32, {256, 3, 1, 1})}, p);
  };
  const Tensor wg = tensor(DType::q4_k, {256, 512, 1, 1}), wd = tensor(DType::q6_k, {512, 256, 1, 1}),
               x = tensor(DType::f32, {256, 3, 1, 1}), bf = tensor(DType::f32, {512, 1, 1, 1}),
               bd = tensor(DType::f32, {256, 1, 1, 1});
  EXPECT_TRUE(call({wg, wg, wd, x, bf, bf, bd}).check()) << call({wg, wg, wd, x, bf, bf, bd}).check().message();
  EXPECT_TRUE(call({wg, wg, wd, x, bf, bf, bd}, -2.0f, 0.5f).check()) << "alpha may be any finite value";

  EXPECT_EQ(call({wg, wg, wd, x}).check().message(), "expert_ffn_clamped takes 7 inputs and 1 outputs; got 4 and 1");
  EXPECT_EQ(call({wg, wg, wd, x, bf, bf, bf}).check().message(),
            "expert_ffn_clamped: b_down f32 {512, 1, 1, 1} must have D = 256 elements");
  EXPECT_EQ(call({wg, wg, wd, x, bd, bf, bd}).check().message(),
            "expert_ffn_clamped: b_gate f32 {256, 1, 1, 1} must have F = 512 elements");
  EXPECT_EQ(call({wg, wg, wd, x, bf, tensor(DType::f16, {512, 1, 1, 1}), bd}).check().message(),
            "expert_ffn_clamped: b_up must be f32, got f16 {512, 1, 1, 1}");
  // expert_ffn's checks, under the op's name.
  const Status weight = call({wg, tensor(DType::q4_1, {256, 512, 1, 1}), wd, x, bf, bf, bd}).check();
  EXPECT_EQ(weight.code(), StatusCode::unsupported);
  EXPECT_EQ(weight.message(), "expert_ffn_clamped: weight type q4_1 is not supported by testdev");
  EXPECT_EQ(call({wg, wg, wd, tensor(DType::f32, {128, 3, 1, 1}), bf, bf, bd}).check().message(),
            "expert_ffn_clamped: X f32 {128, 3, 1, 1} must have ne[0] = 256");

  for (float limit : {0.0f, -1.0f, std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    const Status s = call({wg, wg, wd, x, bf, bf, bd}, 1.702f, limit).check();
    EXPECT_EQ(s.code(), StatusCode::invalid_argument) << limit;
    EXPECT_NE(s.message().find("expert_ffn_clamped: params.eps (the clamp limit) must be positive and finite"),
              std::string::npos)
        << s.message();
  }
  for (float alpha : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    const Status s = call({wg, wg, wd, x, bf, bf, bd}, alpha).check();
    EXPECT_EQ(s.code(), StatusCode::invalid_argument) << alpha;
    EXPECT_NE(s.message().find("expert_ffn_clamped: params.scale (alpha) must be finite"), std::string::npos)
        << s.message();
  }
  EXPECT_FALSE(Call(Op::expert_ffn_clamped, {wg, wg, wd, x, bf, bf, bd}, {tensor(DType::f32, {256, 3, 1, 1})}).check())
      << "the default params (limit 0) are not a clamp";
}

// The clamped group: seven inputs per expert, each expert's biases checked and named, one alpha and limit for all.
TEST(CheckOpCall, ExpertFfnClampedGroupChecksEveryExpertsBiasesAndNamesIt) {
  const auto expert = [](std::int64_t f, std::int64_t t) {
    return std::vector<Tensor>{tensor(DType::q4_k, {256, f, 1, 1}), tensor(DType::mxfp4, {256, f, 1, 1}),
                               tensor(DType::q6_k, {f, 256, 1, 1}), tensor(DType::f32, {256, t, 1, 1}),
                               tensor(DType::f32, {f, 1, 1, 1}),    tensor(DType::f32, {f, 1, 1, 1}),
                               tensor(DType::f32, {256, 1, 1, 1})};
  };
  OpParams p;
  p.scale = 1.702f;
  p.eps = 7.0f;
  Call ok(Op::expert_ffn_clamped_group, {}, {tensor(DType::f32, {256, 1, 1, 1}), tensor(DType::f32, {256, 3, 1, 1})},
          p);
  for (const auto& part : {expert(512, 1), expert(256, 3)}) ok.in.insert(ok.in.end(), part.begin(), part.end());
  ok.call.inputs = ok.in;
  EXPECT_TRUE(ok.check()) << ok.check().message();
  const auto with = [&](std::size_t i, Tensor t) {
    Call c = ok;
    c.in[i] = t;
    c.call.inputs = c.in;
    c.call.outputs = c.out;
    return c.check();
  };
  EXPECT_EQ(with(13, tensor(DType::f32, {512, 1, 1, 1})).message(),
            "expert_ffn_clamped_group: expert 1: b_down f32 {512, 1, 1, 1} must have D = 256 elements");
  EXPECT_EQ(with(11, tensor(DType::f32, {512, 1, 1, 1})).message(),
            "expert_ffn_clamped_group: expert 1: b_gate f32 {512, 1, 1, 1} must have F = 256 elements");
  EXPECT_EQ(with(5, tensor(DType::f16, {512, 1, 1, 1})).message(),
            "expert_ffn_clamped_group: expert 0: b_up must be f32, got f16 {512, 1, 1, 1}");
  EXPECT_EQ(with(10, tensor(DType::f32, {256, 2, 1, 1})).message(),
            "expert_ffn_clamped_group: expert 1: Y f32 {256, 3, 1, 1} must match X");
  const Status weight = with(8, tensor(DType::q4_1, {256, 256, 1, 1}));
  EXPECT_EQ(weight.code(), StatusCode::unsupported);
  EXPECT_EQ(weight.message(), "expert_ffn_clamped_group: expert 1: weight type q4_1 is not supported by testdev");

  Call four = ok;  // expert_ffn_group's layout
  four.in.resize(8);
  four.call.inputs = four.in;
  four.call.outputs = four.out;
  EXPECT_EQ(four.check().message(),
            "expert_ffn_clamped_group: takes 7 inputs (W_gate, W_up, W_down, X, b_gate, b_up, b_down) and 1 output "
            "per expert; got 8 inputs and 2 outputs");
  for (float limit : {0.0f, std::numeric_limits<float>::infinity()}) {
    Call c = ok;
    c.call.inputs = c.in;
    c.call.outputs = c.out;
    c.call.params.eps = limit;
    EXPECT_NE(c.check().message().find("expert_ffn_clamped_group: params.eps (the clamp limit) must be positive"),
              std::string::npos)
        << c.check().message();
  }
  Call nan_alpha = ok;
  nan_alpha.call.inputs = nan_alpha.in;
  nan_alpha.call.outputs = nan_alpha.out;
  nan_alpha.call.params.scale = std::numeric_limits<float>::quiet_NaN();
  EXPECT_NE(nan_alpha.check().message().find("expert_ffn_clamped_group: params.scale (alpha) must be finite"),
            std::string::npos);
  EXPECT_STREQ(op_name(Op::expert_ffn_clamped_group), "expert_ffn_clamped_group");
  EXPECT_FALSE(supports_every_op(Op::expert_ffn_clamped_group, DType::q4_k)) << "optional: a backend claims it itself";
}

// mxfp4 is an optional weight type: check_op_call lets it through for matmul and the expert ops (a backend's
// supports() decides), never for embedding, and supports_every_op never claims it.
TEST(CheckOpCall, OptionalWeightTypeMxfp4PassesForMatmulAndTheExpertOps) {
  EXPECT_TRUE(is_optional_weight_type(DType::mxfp4));
  EXPECT_FALSE(is_weight_type(DType::mxfp4)) << "every backend would have to run it";
  EXPECT_FALSE(is_optional_weight_type(DType::q4_0));
  EXPECT_FALSE(is_optional_weight_type(DType::q4_1));
  const Tensor mx = tensor(DType::mxfp4, {256, 64, 1, 1}), mxd = tensor(DType::mxfp4, {64, 256, 1, 1}),
               x = tensor(DType::f32, {256, 3, 1, 1}), y = tensor(DType::f32, {256, 3, 1, 1}),
               bf = tensor(DType::f32, {64, 1, 1, 1}), bd = tensor(DType::f32, {256, 1, 1, 1});
  const Status matmul = Call(Op::matmul, {mx, x, bf}, {tensor(DType::f32, {64, 3, 1, 1})}).check();
  EXPECT_TRUE(matmul) << matmul.message();
  const Status ffn = Call(Op::expert_ffn, {mx, mx, mxd, x}, {y}).check();
  EXPECT_TRUE(ffn) << ffn.message();
  const Tensor q4 = tensor(DType::q4_k, {256, 64, 1, 1});
  const Status group =
      Call(Op::expert_ffn_group, {q4, q4, tensor(DType::q6_k, {64, 256, 1, 1}), x, mx, mx, mxd, x}, {y, y}).check();
  EXPECT_TRUE(group) << group.message();
  OpParams p;
  p.scale = 1.702f;
  p.eps = 7.0f;
  const Status clamped = Call(Op::expert_ffn_clamped, {mx, mx, mxd, x, bf, bf, bd}, {y}, p).check();
  EXPECT_TRUE(clamped) << clamped.message();
  // The shape checks still apply to it.
  EXPECT_EQ(Call(Op::expert_ffn, {mx, mx, mx, x}, {y}).check().message(),
            "expert_ffn: W_down mxfp4 {256, 64, 1, 1} must be {64, 256}");
  const Status table = Call(Op::embedding, {tensor(DType::mxfp4, {256, 10, 1, 1}), tensor(DType::i32, {2, 1, 1, 1})},
                            {tensor(DType::f32, {256, 2, 1, 1})})
                           .check();
  EXPECT_EQ(table.code(), StatusCode::unsupported);
  EXPECT_EQ(table.message(), "embedding: table type mxfp4 is not supported by testdev");
  for (Op op : {Op::matmul, Op::expert_ffn, Op::embedding, Op::expert_ffn_group, Op::expert_ffn_clamped}) {
    EXPECT_FALSE(supports_every_op(op, DType::mxfp4)) << op_name(op) << ": optional, a backend claims it itself";
  }
}

TEST(SupportsEveryOp, WeightsKvAndF32Sets) {
  EXPECT_TRUE(supports_every_op(Op::matmul, DType::q6_k));
  EXPECT_TRUE(supports_every_op(Op::embedding, DType::bf16));
  EXPECT_FALSE(supports_every_op(Op::expert_ffn, DType::q4_1));
  EXPECT_TRUE(supports_every_op(Op::attention, DType::q8_0));
  EXPECT_FALSE(supports_every_op(Op::attention, DType::q4_k));
  EXPECT_TRUE(supports_every_op(Op::rms_norm, DType::f32));
  EXPECT_FALSE(supports_every_op(Op::rope, DType::f16));
  EXPECT_FALSE(supports_every_op(Op::count_, DType::f32));
  EXPECT_FALSE(supports_every_op(Op::expert_ffn_group, DType::q4_k)) << "optional: a backend claims it itself";
  EXPECT_FALSE(supports_every_op(Op::attention_sinks, DType::f16)) << "optional: a backend claims it itself";
  EXPECT_FALSE(supports_every_op(Op::expert_ffn_clamped, DType::q4_k)) << "optional: a backend claims it itself";
  EXPECT_EQ(shape_text(tensor(DType::q8_0, {32, 7, 1, 1})), "q8_0 {32, 7, 1, 1}");
}

}  // namespace

namespace {

struct SizedBuffer final : colibri::sdk::Buffer {
  std::size_t bytes;
  explicit SizedBuffer(std::size_t n) : bytes(n) {}
  [[nodiscard]] std::size_t size() const noexcept override { return bytes; }
  [[nodiscard]] void* host_pointer() noexcept override { return nullptr; }
};

TEST(CheckedBytes, WholeBlocksOfPositiveDims) {
  auto q = checked_bytes(tensor(DType::q4_k, {512, 3, 1, 1}), "matmul", "W");
  ASSERT_TRUE(q);
  EXPECT_EQ(*q, 3u * 2 * 144);
  EXPECT_EQ(checked_bytes(tensor(DType::f32, {4, 0, 1, 1}), "add", "A").error().message(),
            "add: A has a non-positive dimension: f32 {4, 0, 1, 1}");
  EXPECT_EQ(checked_bytes(tensor(DType::q8_0, {40, 1, 1, 1}), "matmul", "W").error().message(),
            "matmul: W rows of 40 elements are not whole q8_0 blocks of 32");
  EXPECT_EQ(checked_bytes(tensor(static_cast<DType>(77), {1, 1, 1, 1}), "matmul", "W").error().message(),
            "matmul: W has an unknown type id 77");
}

TEST(CheckBufferRange, TheTensorMustLieInsideItsBufferWhereItsTypeCanStart) {
  SizedBuffer buffer(64);
  Tensor t = tensor(DType::f32, {8, 1, 1, 1});
  t.buffer = &buffer;
  t.offset = 32;
  EXPECT_TRUE(check_buffer_range(t, 32, "add", "A"));
  t.offset = 40;
  EXPECT_EQ(check_buffer_range(t, 32, "add", "A").message(),
            "add: A f32 {8, 1, 1, 1} needs 32 bytes at offset 40 but its buffer holds 64");
  t.offset = 30;
  EXPECT_EQ(check_buffer_range(t, 32, "add", "A").message(),
            "add: A f32 {8, 1, 1, 1} starts at offset 30, not a multiple of 4 as f32 data needs");
  Tensor q = tensor(DType::q8_0, {32, 1, 1, 1});
  q.buffer = &buffer;
  q.offset = 30;  // two-byte fields: any even offset
  EXPECT_TRUE(check_buffer_range(q, 34, "matmul", "W"));
  q.offset = 29;
  EXPECT_FALSE(check_buffer_range(q, 34, "matmul", "W"));
  Tensor fp4 = tensor(DType::mxfp4, {32, 1, 1, 1});
  fp4.buffer = &buffer;
  fp4.offset = 29;  // bytes only
  EXPECT_TRUE(check_buffer_range(fp4, 17, "matmul", "W"));
}

}  // namespace
