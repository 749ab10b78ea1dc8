// The edge (proto_convert.cc): every proto enum becomes the kernels' type once, with the proto's
// defaults for 0 / UNSPECIFIED, and an unknown value is INVALID_ARGUMENT naming the field path.
// Both transports reach the engine only through these conversions (op_table.cc).
#include "server/proto_convert.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace fp4q::server {
namespace {

using ::fp4q::testing::StatusIs;
using ::testing::Eq;

constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;

template <typename E>
E Bad(int v) {
  return static_cast<E>(v);
}

v1::QuantizeRequest Quantize() {
  v1::QuantizeRequest m;
  m.mutable_input()->set_dtype(v1::DTYPE_F32);
  return m;
}

TEST(ProtoConvertTest, QuantOptionsDefaultsAreTheKernelsDefaults) {
  absl::StatusOr<QuantizeRequest> r = FromProto(Quantize());
  ASSERT_TRUE(r.ok()) << r.status();
  const kernels::QuantizeOptions& o = r->options.quant;
  EXPECT_EQ(o.format, kernels::Format::kNvfp4);
  EXPECT_EQ(o.block, kernels::BlockShape::k1x16);
  EXPECT_EQ(o.rounding, kernels::Rounding::kNearest);
  EXPECT_EQ(o.rht, kernels::RhtMode::kOff);
  EXPECT_EQ(o.scale_selection, kernels::ScaleSelection::kMapTo6);
  EXPECT_EQ(o.four_over_six_emax, 256.0f);
  EXPECT_EQ(o.scale_layout, kernels::ScaleLayout::kPlain);
  EXPECT_EQ(o.mx_rule, kernels::MxScaleRule::kRceil);
  EXPECT_TRUE(o.rowwise);
  EXPECT_FALSE(o.columnwise);
  EXPECT_EQ(r->input.dtype, kernels::DType::kF32);
}

TEST(ProtoConvertTest, QuantOptionsValuesConvert) {
  v1::QuantizeRequest m = Quantize();
  m.mutable_input()->set_dtype(v1::DTYPE_BF16);
  v1::QuantOptions* o = m.mutable_options();
  o->set_format(v1::FORMAT_MXFP4);
  o->set_rounding(v1::ROUNDING_STOCHASTIC);
  o->set_rht(v1::RHT_MODE_SEEDED);
  o->set_scale_selection(v1::SCALE_SELECTION_FOUR_OVER_SIX_MSE);
  o->set_four_over_six_emax(448.0f);
  o->set_scale_layout(v1::SCALE_LAYOUT_SWIZZLED);
  o->set_mx_scale_rule(v1::MX_SCALE_RULE_FLOOR);
  o->set_outputs(v1::OUTPUTS_COLUMNWISE);
  o->set_seed(7);
  o->set_step(8);
  o->set_rht_seed(9);
  o->set_amax(2.5f);
  o->set_residual_key("r");
  absl::StatusOr<QuantizeRequest> r = FromProto(m);
  ASSERT_TRUE(r.ok()) << r.status();
  const kernels::QuantizeOptions& k = r->options.quant;
  EXPECT_EQ(r->input.dtype, kernels::DType::kBF16);
  EXPECT_EQ(k.format, kernels::Format::kMxfp4);
  EXPECT_EQ(k.block, kernels::BlockShape::k1x32);  // UNSPECIFIED under MXFP4
  EXPECT_EQ(k.rounding, kernels::Rounding::kStochastic);
  EXPECT_EQ(k.rht, kernels::RhtMode::kSeeded);
  EXPECT_EQ(k.scale_selection, kernels::ScaleSelection::kFourOverSixMse);
  EXPECT_EQ(k.four_over_six_emax, 448.0f);
  EXPECT_EQ(k.scale_layout, kernels::ScaleLayout::kSwizzled);
  EXPECT_EQ(k.mx_rule, kernels::MxScaleRule::kFloor);
  EXPECT_FALSE(k.rowwise);
  EXPECT_TRUE(k.columnwise);
  EXPECT_EQ(k.seed, 7u);
  EXPECT_EQ(k.step, 8u);
  EXPECT_EQ(k.rht_seed, 9u);
  EXPECT_TRUE(k.has_amax);
  EXPECT_EQ(k.amax, 2.5f);
  EXPECT_EQ(r->options.residual_key, "r");

  o->set_block(v1::BLOCK_SHAPE_16X16);
  o->set_rht(v1::RHT_MODE_DEFAULT_SIGNS);
  o->set_scale_selection(v1::SCALE_SELECTION_FOUR_OVER_SIX_MAE);
  o->set_outputs(v1::OUTPUTS_BOTH);
  r = FromProto(m);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->options.quant.block, kernels::BlockShape::k16x16);  // converted, not checked
  EXPECT_EQ(r->options.quant.rht, kernels::RhtMode::kDefaultSigns);
  EXPECT_EQ(r->options.quant.scale_selection, kernels::ScaleSelection::kFourOverSixMae);
  EXPECT_TRUE(r->options.quant.rowwise);
  EXPECT_TRUE(r->options.quant.columnwise);
}

TEST(ProtoConvertTest, UnknownQuantOptionValuesNameTheirField) {
  struct Case {
    void (*set)(v1::QuantOptions*);
    std::string message;
  };
  const Case cases[] = {
      {[](v1::QuantOptions* o) { o->set_format(Bad<v1::Format>(7)); },
       "options.format: unknown value 7"},
      {[](v1::QuantOptions* o) { o->set_block(Bad<v1::BlockShape>(4)); },
       "options.block: unknown value 4"},
      {[](v1::QuantOptions* o) { o->set_rounding(Bad<v1::Rounding>(7)); },
       "options.rounding: unknown value 7"},
      {[](v1::QuantOptions* o) { o->set_rht(Bad<v1::RhtMode>(-1)); },
       "options.rht: unknown value -1"},
      {[](v1::QuantOptions* o) { o->set_scale_selection(Bad<v1::ScaleSelection>(4)); },
       "options.scale_selection: unknown value 4"},
      {[](v1::QuantOptions* o) { o->set_scale_layout(Bad<v1::ScaleLayout>(3)); },
       "options.scale_layout: unknown value 3"},
      {[](v1::QuantOptions* o) { o->set_mx_scale_rule(Bad<v1::MxScaleRule>(3)); },
       "options.mx_scale_rule: unknown value 3"},
      {[](v1::QuantOptions* o) { o->set_outputs(Bad<v1::Outputs>(4)); },
       "options.outputs: unknown value 4"},
  };
  for (const Case& c : cases) {
    v1::QuantizeRequest m = Quantize();
    c.set(m.mutable_options());
    EXPECT_THAT(FromProto(m).status(), StatusIs(kInvalid, Eq(c.message)));
    v1::QdqRequest q;
    *q.mutable_input() = m.input();
    *q.mutable_options() = m.options();
    EXPECT_THAT(FromProto(q).status(), StatusIs(kInvalid, Eq(c.message)));
  }
}

TEST(ProtoConvertTest, TensorDTypesAreDenseOnly) {
  v1::QuantizeRequest m = Quantize();
  m.mutable_input()->set_dtype(v1::DTYPE_U8);
  EXPECT_THAT(FromProto(m).status(),
              StatusIs(kInvalid, Eq("input.dtype: DTYPE_U8; expected DTYPE_F32 or DTYPE_BF16")));
  m.mutable_input()->set_dtype(v1::DTYPE_UNSPECIFIED);
  EXPECT_THAT(
      FromProto(m).status(),
      StatusIs(kInvalid, Eq("input.dtype: DTYPE_UNSPECIFIED; expected DTYPE_F32 or DTYPE_BF16")));
  m.mutable_input()->set_dtype(Bad<v1::DType>(9));
  EXPECT_THAT(
      FromProto(m).status(),
      StatusIs(kInvalid, Eq("input.dtype: unknown value 9; expected DTYPE_F32 or DTYPE_BF16")));

  v1::StepRequest s;
  s.add_items()->mutable_update()->set_dtype(v1::DTYPE_F32);
  s.add_items()->mutable_update()->set_dtype(v1::DTYPE_F8_E4M3);
  EXPECT_THAT(
      FromProto(s).status(),
      StatusIs(kInvalid,
               Eq("items[1].update.dtype: DTYPE_F8_E4M3; expected DTYPE_F32 or DTYPE_BF16")));
  s.mutable_items(1)->mutable_update()->set_dtype(v1::DTYPE_BF16);
  absl::StatusOr<StepRequest> step = FromProto(s);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(step->items[1].update.dtype, kernels::DType::kBF16);
  EXPECT_FALSE(step->one_pass);
  s.set_one_pass(true);
  step = FromProto(s);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_TRUE(step->one_pass);

  v1::CreateWeightRequest c;
  c.mutable_initial()->set_dtype(v1::DTYPE_U8);
  EXPECT_THAT(
      FromProto(c).status(),
      StatusIs(kInvalid, Eq("initial.dtype: DTYPE_U8; expected DTYPE_F32 or DTYPE_BF16")));
  v1::UpdateWeightRequest u;
  EXPECT_THAT(
      FromProto(u).status(),
      StatusIs(kInvalid, Eq("update.dtype: DTYPE_UNSPECIFIED; expected DTYPE_F32 or DTYPE_BF16")));
}

TEST(ProtoConvertTest, OutDTypeDefaults) {
  v1::DequantizeRequest d;
  absl::StatusOr<DequantizeRequest> dr = FromProto(d);
  ASSERT_TRUE(dr.ok()) << dr.status();
  EXPECT_EQ(dr->out_dtype, kernels::DType::kF32);  // UNSPECIFIED: F32
  d.set_out_dtype(v1::DTYPE_BF16);
  dr = FromProto(d);
  ASSERT_TRUE(dr.ok()) << dr.status();
  EXPECT_EQ(dr->out_dtype, kernels::DType::kBF16);
  d.set_out_dtype(v1::DTYPE_F8_E8M0);
  EXPECT_THAT(
      FromProto(d).status(),
      StatusIs(kInvalid, Eq("out_dtype: DTYPE_F8_E8M0; expected DTYPE_F32 or DTYPE_BF16")));

  v1::MatmulRequest mm;
  mm.set_out_dtype(Bad<v1::DType>(6));
  EXPECT_THAT(
      FromProto(mm).status(),
      StatusIs(kInvalid, Eq("out_dtype: unknown value 6; expected DTYPE_F32 or DTYPE_BF16")));

  v1::QdqRequest q;
  q.mutable_input()->set_dtype(v1::DTYPE_BF16);
  absl::StatusOr<QdqRequest> qr = FromProto(q);
  ASSERT_TRUE(qr.ok()) << qr.status();
  EXPECT_FALSE(qr->out_dtype.has_value());  // UNSPECIFIED: the input's, decided by the engine
  q.set_out_dtype(v1::DTYPE_F32);
  qr = FromProto(q);
  ASSERT_TRUE(qr.ok()) << qr.status();
  EXPECT_EQ(qr->out_dtype, kernels::DType::kF32);

  v1::GetWeightRequest g;
  absl::StatusOr<GetWeightRequest> gr = FromProto(g);
  ASSERT_TRUE(gr.ok()) << gr.status();
  EXPECT_FALSE(gr->out_dtype.has_value());
  g.set_out_dtype(v1::DTYPE_U8);
  EXPECT_THAT(FromProto(g).status(),
              StatusIs(kInvalid, Eq("out_dtype: DTYPE_U8; expected DTYPE_F32 or DTYPE_BF16")));
}

TEST(ProtoConvertTest, QuantizedOperands) {
  v1::MatmulRequest m;
  v1::QuantizedTensor* a = m.mutable_a()->mutable_tensor();
  a->set_format(v1::FORMAT_MXFP4);
  a->set_scale_layout(v1::SCALE_LAYOUT_SWIZZLED);
  a->set_codes("cc");
  m.mutable_b()->set_weight_name("w");
  absl::StatusOr<MatmulRequest> r = FromProto(m);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->a.tensor.format, kernels::Format::kMxfp4);
  EXPECT_EQ(r->a.tensor.block, kernels::BlockShape::k1x32);
  EXPECT_EQ(r->a.tensor.scale_layout, kernels::ScaleLayout::kSwizzled);
  EXPECT_EQ(r->a.tensor.codes.source, Source::kInline);
  EXPECT_EQ(r->a.tensor.codes.inline_data, "cc");
  EXPECT_EQ(r->a.tensor.scales.source, Source::kNone);
  EXPECT_TRUE(r->b.is_weight);
  EXPECT_EQ(r->b.weight_name, "w");

  a->set_format(v1::FORMAT_NVFP4);
  a->set_block(v1::BLOCK_SHAPE_16X16);
  r = FromProto(m);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->a.tensor.block, kernels::BlockShape::k16x16);

  a->set_format(Bad<v1::Format>(3));
  EXPECT_THAT(FromProto(m).status(), StatusIs(kInvalid, Eq("a.tensor.format: unknown value 3")));
  a->set_format(v1::FORMAT_NVFP4);
  a->set_block(Bad<v1::BlockShape>(8));
  EXPECT_THAT(FromProto(m).status(), StatusIs(kInvalid, Eq("a.tensor.block: unknown value 8")));

  v1::DequantizeRequest d;
  d.mutable_input()->mutable_tensor()->set_scale_layout(Bad<v1::ScaleLayout>(9));
  EXPECT_THAT(FromProto(d).status(),
              StatusIs(kInvalid, Eq("input.tensor.scale_layout: unknown value 9")));
}

TEST(ProtoConvertTest, WeightOptionsAndUpdateKinds) {
  v1::CreateWeightRequest c;
  c.mutable_initial()->set_dtype(v1::DTYPE_F32);
  absl::StatusOr<CreateWeightRequest> r = FromProto(c);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->options.block, kernels::BlockShape::k1x16);
  EXPECT_EQ(r->options.rounding, kernels::Rounding::kNearest);
  EXPECT_EQ(r->options.dtype, kernels::DType::kF32);
  EXPECT_EQ(r->options.scaling, kernels::Scaling::kCurrent);

  v1::WeightOptions* o = c.mutable_options();
  o->set_block(v1::BLOCK_SHAPE_16X16);
  o->set_rounding(v1::ROUNDING_STOCHASTIC);
  o->set_dtype(v1::DTYPE_BF16);
  o->set_scaling(v1::SCALING_DELAYED);
  r = FromProto(c);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->options.block, kernels::BlockShape::k16x16);
  EXPECT_EQ(r->options.rounding, kernels::Rounding::kStochastic);
  EXPECT_EQ(r->options.dtype, kernels::DType::kBF16);
  EXPECT_EQ(r->options.scaling, kernels::Scaling::kDelayed);
  o->set_block(v1::BLOCK_SHAPE_1X32);  // converted; the engine refuses it for stored weights
  r = FromProto(c);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->options.block, kernels::BlockShape::k1x32);

  o->set_block(Bad<v1::BlockShape>(12));
  EXPECT_THAT(FromProto(c).status(), StatusIs(kInvalid, Eq("options.block: unknown value 12")));
  o->set_block(v1::BLOCK_SHAPE_1X16);
  o->set_rounding(Bad<v1::Rounding>(5));
  EXPECT_THAT(FromProto(c).status(), StatusIs(kInvalid, Eq("options.rounding: unknown value 5")));
  o->set_rounding(v1::ROUNDING_NEAREST);
  o->set_dtype(v1::DTYPE_U8);
  EXPECT_THAT(
      FromProto(c).status(),
      StatusIs(kInvalid, Eq("options.dtype: DTYPE_U8; expected DTYPE_F32 or DTYPE_BF16")));
  o->set_dtype(v1::DTYPE_F32);
  o->set_scaling(Bad<v1::Scaling>(3));
  EXPECT_THAT(FromProto(c).status(), StatusIs(kInvalid, Eq("options.scaling: unknown value 3")));

  v1::UpdateWeightRequest u;
  u.mutable_update()->set_dtype(v1::DTYPE_F32);
  absl::StatusOr<UpdateWeightRequest> ur = FromProto(u);
  ASSERT_TRUE(ur.ok()) << ur.status();
  EXPECT_EQ(ur->kind, kernels::UpdateKind::kGradient);
  u.set_kind(v1::UPDATE_KIND_DELTA);
  ur = FromProto(u);
  ASSERT_TRUE(ur.ok()) << ur.status();
  EXPECT_EQ(ur->kind, kernels::UpdateKind::kDelta);
  u.set_kind(Bad<v1::UpdateKind>(9));
  EXPECT_THAT(FromProto(u).status(), StatusIs(kInvalid, Eq("kind: unknown value 9")));

  v1::StepRequest s;
  s.set_kind(v1::UPDATE_KIND_DELTA);
  absl::StatusOr<StepRequest> sr = FromProto(s);
  ASSERT_TRUE(sr.ok()) << sr.status();
  EXPECT_EQ(sr->kind, kernels::UpdateKind::kDelta);
  s.set_kind(Bad<v1::UpdateKind>(4));
  EXPECT_THAT(FromProto(s).status(), StatusIs(kInvalid, Eq("kind: unknown value 4")));
}

// Replies carry the proto's numbers for the kernels' values.
TEST(ProtoConvertTest, RepliesMapBack) {
  QuantizeResult q;
  q.has_rowwise = true;
  q.rowwise.format = kernels::Format::kMxfp4;
  q.rowwise.block = kernels::BlockShape::k1x32;
  q.rowwise.scale_layout = kernels::ScaleLayout::kSwizzled;
  v1::QuantizeReply qm;
  ToProto(std::move(q), &qm);
  EXPECT_EQ(qm.rowwise().format(), v1::FORMAT_MXFP4);
  EXPECT_EQ(qm.rowwise().block(), v1::BLOCK_SHAPE_1X32);
  EXPECT_EQ(qm.rowwise().scale_layout(), v1::SCALE_LAYOUT_SWIZZLED);
  EXPECT_FALSE(qm.has_columnwise());

  DequantizeResult d;
  d.output.dtype = kernels::DType::kBF16;
  v1::DequantizeReply dm;
  ToProto(std::move(d), &dm);
  EXPECT_EQ(dm.output().dtype(), v1::DTYPE_BF16);

  CreateWeightResult c;
  c.weight.options.block = kernels::BlockShape::k16x16;
  c.weight.options.rounding = kernels::Rounding::kStochastic;
  c.weight.options.dtype = kernels::DType::kBF16;
  v1::CreateWeightReply cm;
  ToProto(std::move(c), &cm);
  EXPECT_EQ(cm.weight().options().block(), v1::BLOCK_SHAPE_16X16);
  EXPECT_EQ(cm.weight().options().rounding(), v1::ROUNDING_STOCHASTIC);
  EXPECT_EQ(cm.weight().options().dtype(), v1::DTYPE_BF16);

  std::vector<TensorListing> list(2);
  list[0].kind = TensorKind::kWeight;
  list[1].kind = TensorKind::kResidual;
  v1::ListTensorsReply lm;
  ToProto(std::move(list), &lm);
  ASSERT_EQ(lm.tensors_size(), 2);
  EXPECT_EQ(lm.tensors(0).kind(), v1::TENSOR_KIND_WEIGHT);
  EXPECT_EQ(lm.tensors(0).dtype(), v1::DTYPE_U8);
  EXPECT_EQ(lm.tensors(1).kind(), v1::TENSOR_KIND_RESIDUAL);
  EXPECT_EQ(lm.tensors(1).dtype(), v1::DTYPE_F32);

  StepResult st;
  st.one_pass = true;
  st.one_pass_outcome = "one_pass";
  st.brief = true;
  v1::StepReply sm;
  ToProto(std::move(st), &sm);
  EXPECT_TRUE(sm.one_pass());
  EXPECT_EQ(sm.one_pass_outcome(), "one_pass");
  StepResult two;
  two.one_pass_outcome = "memory";
  v1::StepReply tm;
  ToProto(std::move(two), &tm);
  EXPECT_FALSE(tm.one_pass());
  EXPECT_EQ(tm.one_pass_outcome(), "memory");
}

}  // namespace
}  // namespace fp4q::server
