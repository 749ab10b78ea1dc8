// Every bad input of the Backend entry points gives INVALID_ARGUMENT naming the field and the
// value, and changes nothing.
#include "fp4q/kernels/validate.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "fp4q/kernels/backend.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/test_util.h"
#include "testing/status_matchers.h"

namespace fp4q::kernels {
namespace {

using ::fp4q::testing::StatusIs;
using testing::F32Out;
using testing::F32View;
using ::testing::Eq;
using ::testing::HasSubstr;
using testing::OwnedQuantized;

constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;

class ValidateTest : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> backend_ = CreateCpuBackend();
  std::vector<float> x_ = testing::Normal(32 * 64, 71);

  absl::Status QuantizeWith(const ConstTensor& x, const QuantizeOptions& o) {
    // Buffers for a valid [32, 64] output, relabelled with the options and x's shape.
    OwnedQuantized row(Format::kNvfp4, BlockShape::k1x16, ScaleLayout::kPlain, 32, 64);
    row.view.format = o.format;
    row.view.block = o.block;
    row.view.scale_layout = o.scale_layout;
    row.view.rows = x.rows;
    row.view.cols = x.cols;
    return backend_->Quantize(x, o, nullptr, &row.view, nullptr, nullptr);
  }
  absl::Status QuantizeOptionsOnly(const QuantizeOptions& o) {
    return QuantizeWith(F32View(x_, 32, 64), o);
  }
};

TEST_F(ValidateTest, ColsNotAMultipleOfTheBlock) {
  std::vector<float> x(4 * 40);
  EXPECT_THAT(QuantizeWith(F32View(x, 4, 40), QuantizeOptions()),
              StatusIs(kInvalid, HasSubstr("x.cols: 40 is not a multiple of the block size 16")));
  QuantizeOptions mx;
  mx.format = Format::kMxfp4;
  mx.block = BlockShape::k1x32;
  std::vector<float> y(4 * 48);
  EXPECT_THAT(QuantizeWith(F32View(y, 4, 48), mx),
              StatusIs(kInvalid, HasSubstr("x.cols: 48 is not a multiple of the block size 32")));
}

TEST_F(ValidateTest, RowsNotAMultipleOf16) {
  std::vector<float> x(20 * 32);
  QuantizeOptions tile;
  tile.block = BlockShape::k16x16;
  EXPECT_THAT(QuantizeWith(F32View(x, 20, 32), tile),
              StatusIs(kInvalid, HasSubstr("x.rows: 20 is not a multiple of 16 (16x16 blocks)")));
  QuantizeOptions col;
  col.columnwise = true;
  EXPECT_THAT(QuantizeWith(F32View(x, 20, 32), col),
              StatusIs(kInvalid, HasSubstr("x.rows: 20 is not a multiple of the block size 16 "
                                           "(column-wise output)")));
}

TEST_F(ValidateTest, EmptyAndNegativeShapes) {
  EXPECT_THAT(QuantizeWith(F32View(x_, 0, 64), QuantizeOptions()),
              StatusIs(kInvalid, HasSubstr("x.rows: 0 must be >= 1")));
  EXPECT_THAT(QuantizeWith(F32View(x_, 4, 0), QuantizeOptions()),
              StatusIs(kInvalid, HasSubstr("x.cols: 0 must be >= 1")));
  EXPECT_THAT(QuantizeWith(F32View(x_, -3, 16), QuantizeOptions()),
              StatusIs(kInvalid, HasSubstr("x.rows: -3 must be >= 1")));
  float amax;
  EXPECT_THAT(backend_->Amax(F32View(x_, 0, 16), &amax, nullptr),
              StatusIs(kInvalid, HasSubstr("x.rows: 0 must be >= 1")));
  EXPECT_THAT(backend_->Amax(F32View(x_, 2, 16), nullptr, nullptr),
              StatusIs(kInvalid, HasSubstr("amax: null")));
  EXPECT_THAT(backend_->Amax(ConstTensor{nullptr, DType::kF32, 2, 16}, &amax, nullptr),
              StatusIs(kInvalid, HasSubstr("x.data: null")));
}

TEST_F(ValidateTest, SizeProductsThatOverflow) {
  const int64_t big = int64_t{1} << 40;
  EXPECT_THAT(
      QuantizeWith(ConstTensor{x_.data(), DType::kF32, big, big}, QuantizeOptions()),
      StatusIs(kInvalid, HasSubstr("x: f32 bytes of [1099511627776, 1099511627776] exceed the "
                                   "limit of 2^62 bytes")));
  EXPECT_THAT(DenseBytes(INT64_MAX, INT64_MAX, DType::kBF16, "x"),
              StatusIs(kInvalid, HasSubstr("exceed the limit of 2^62 bytes")));
  EXPECT_THAT(CodeBytes(big * 16, big, "w"),
              StatusIs(kInvalid, HasSubstr("w: code bytes of [17592186044416, 1099511627776]")));
  EXPECT_THAT(ScaleBytes(INT64_MAX, 16 * big, Format::kNvfp4, ScaleLayout::kSwizzled, "s"),
              StatusIs(kInvalid, HasSubstr("s: scale bytes of")));
  // Just under the limit is fine: 2^31 x 2^29 f32 = 2^62 bytes.
  EXPECT_EQ(DenseBytes(int64_t{1} << 31, int64_t{1} << 29, DType::kF32, "x").value(),
            size_t{1} << 62);
}

TEST_F(ValidateTest, UnknownEnumValues) {
  QuantizeOptions o;
  o.format = static_cast<Format>(7);
  EXPECT_THAT(QuantizeOptionsOnly(o),
              StatusIs(kInvalid, HasSubstr("options.format: 7 is not a valid format")));
  o = QuantizeOptions();
  o.block = static_cast<BlockShape>(9);
  EXPECT_THAT(ValidateQuantizeOptions(o),
              StatusIs(kInvalid, HasSubstr("options.block: 9 is not a valid block shape")));
  o = QuantizeOptions();
  o.rounding = static_cast<Rounding>(0);
  EXPECT_THAT(QuantizeOptionsOnly(o),
              StatusIs(kInvalid, HasSubstr("options.rounding: 0 is not a valid rounding")));
  o = QuantizeOptions();
  o.rht = static_cast<RhtMode>(5);
  EXPECT_THAT(QuantizeOptionsOnly(o),
              StatusIs(kInvalid, HasSubstr("options.rht: 5 is not a valid RHT mode")));
  o = QuantizeOptions();
  o.scale_selection = static_cast<ScaleSelection>(-1);
  EXPECT_THAT(
      QuantizeOptionsOnly(o),
      StatusIs(kInvalid, HasSubstr("options.scale_selection: -1 is not a valid scale selection")));
  o = QuantizeOptions();
  o.scale_layout = static_cast<ScaleLayout>(3);
  EXPECT_THAT(ValidateQuantizeOptions(o),
              StatusIs(kInvalid, HasSubstr("options.scale_layout: 3 is not a valid scale layout")));
  o = QuantizeOptions();
  o.mx_rule = static_cast<MxScaleRule>(4);
  EXPECT_THAT(QuantizeOptionsOnly(o),
              StatusIs(kInvalid, HasSubstr("options.mx_rule: 4 is not a valid MX scale rule")));
  EXPECT_THAT(
      QuantizeWith(ConstTensor{x_.data(), static_cast<DType>(3), 32, 64}, QuantizeOptions()),
      StatusIs(kInvalid, HasSubstr("x.dtype: 3 is not a valid dtype")));
}

TEST_F(ValidateTest, OptionCombinations) {
  QuantizeOptions o;
  o.block = BlockShape::k1x32;
  EXPECT_THAT(QuantizeOptionsOnly(o),
              StatusIs(kInvalid, HasSubstr("options.block: 1x32 is not an NVFP4 block")));
  o = QuantizeOptions();
  o.format = Format::kMxfp4;
  EXPECT_THAT(QuantizeOptionsOnly(o),
              StatusIs(kInvalid, HasSubstr("options.block: 1x16 is not an MXFP4 block (1x32)")));
  o = QuantizeOptions();
  o.rowwise = false;
  EXPECT_THAT(QuantizeOptionsOnly(o),
              StatusIs(kInvalid, HasSubstr("options.rowwise: false and options.columnwise false")));
  for (float bad : {std::nanf(""), -1.0f, std::numeric_limits<float>::infinity()}) {
    o = QuantizeOptions();
    o.has_amax = true;
    o.amax = bad;
    EXPECT_THAT(QuantizeOptionsOnly(o),
                StatusIs(kInvalid, HasSubstr("options.amax: " + absl::StrCat(bad) +
                                             " is not finite and >= 0")));
  }
  o = QuantizeOptions();
  o.format = Format::kMxfp4;
  o.block = BlockShape::k1x32;
  o.has_amax = true;
  o.amax = 3.0f;
  EXPECT_THAT(
      QuantizeOptionsOnly(o),
      StatusIs(kInvalid, HasSubstr("options.amax: 3 given, but MXFP4 has no global scale")));
  o = QuantizeOptions();
  o.scale_selection = ScaleSelection::kFourOverSixMae;
  o.rounding = Rounding::kStochastic;
  EXPECT_THAT(QuantizeOptionsOnly(o),
              StatusIs(kInvalid, HasSubstr("options.scale_selection: four_over_six_mae needs "
                                           "options.rounding nearest, not stochastic")));
  o.rounding = Rounding::kNearest;
  o.rht = RhtMode::kDefaultSigns;
  EXPECT_THAT(QuantizeOptionsOnly(o),
              StatusIs(kInvalid, HasSubstr("four_over_six_mae is not combined with options.rht "
                                           "default_signs")));
  o.rht = RhtMode::kOff;
  o.four_over_six_emax = 300.0f;
  EXPECT_THAT(QuantizeOptionsOnly(o),
              StatusIs(kInvalid, HasSubstr("options.four_over_six_emax: 300 is not 256 or 448")));
  o = QuantizeOptions();
  o.format = Format::kMxfp4;
  o.block = BlockShape::k1x32;
  o.scale_selection = ScaleSelection::kFourOverSixMse;
  EXPECT_THAT(QuantizeOptionsOnly(o),
              StatusIs(kInvalid, HasSubstr("options.scale_selection: four_over_six_mse is NVFP4 "
                                           "only (format mxfp4)")));
}

TEST_F(ValidateTest, OutputBuffersTooSmallOrMismatched) {
  const ConstTensor x = F32View(x_, 32, 64);
  QuantizeOptions o;
  OwnedQuantized row(Format::kNvfp4, BlockShape::k1x16, ScaleLayout::kPlain, 32, 64);
  row.view.codes_capacity = 1023;
  EXPECT_THAT(backend_->Quantize(x, o, nullptr, &row.view, nullptr, nullptr),
              StatusIs(kInvalid, HasSubstr("rowwise.codes_capacity: 1023 bytes is smaller than "
                                           "the 1024 needed")));
  row.view.codes_capacity = 1024;
  row.view.scales_capacity = 127;
  EXPECT_THAT(backend_->Quantize(x, o, nullptr, &row.view, nullptr, nullptr),
              StatusIs(kInvalid, HasSubstr("rowwise.scales_capacity: 127 bytes is smaller than "
                                           "the 128 needed")));
  row.view.scales_capacity = 128;
  row.view.global = nullptr;
  EXPECT_THAT(backend_->Quantize(x, o, nullptr, &row.view, nullptr, nullptr),
              StatusIs(kInvalid, HasSubstr("rowwise.global: null")));
  row.view.global = row.global.data();
  row.view.codes = nullptr;
  EXPECT_THAT(backend_->Quantize(x, o, nullptr, &row.view, nullptr, nullptr),
              StatusIs(kInvalid, HasSubstr("rowwise.codes: null")));
  row.view.codes = row.codes.data();
  // Swizzled needs padding to 128 rows: 128 * 4 = 512 bytes.
  o.scale_layout = ScaleLayout::kSwizzled;
  row.view.scale_layout = ScaleLayout::kSwizzled;
  EXPECT_THAT(backend_->Quantize(x, o, nullptr, &row.view, nullptr, nullptr),
              StatusIs(kInvalid, HasSubstr("rowwise.scales_capacity: 128 bytes is smaller than "
                                           "the 512 needed")));
  o.scale_layout = ScaleLayout::kPlain;
  row.view.scale_layout = ScaleLayout::kPlain;
  row.view.rows = 16;
  EXPECT_THAT(backend_->Quantize(x, o, nullptr, &row.view, nullptr, nullptr),
              StatusIs(kInvalid, HasSubstr("rowwise.rows: 16 does not match the expected 32")));
  row.view.rows = 32;
  row.view.block = BlockShape::k16x16;
  EXPECT_THAT(backend_->Quantize(x, o, nullptr, &row.view, nullptr, nullptr),
              StatusIs(kInvalid, HasSubstr("rowwise.block: 16x16 does not match options.block "
                                           "1x16")));
  row.view.block = BlockShape::k1x16;
  row.view.format = Format::kMxfp4;
  EXPECT_THAT(backend_->Quantize(x, o, nullptr, &row.view, nullptr, nullptr),
              StatusIs(kInvalid, HasSubstr("rowwise.format: mxfp4 does not match options.format "
                                           "nvfp4")));
  row.view.format = Format::kNvfp4;
  EXPECT_THAT(backend_->Quantize(x, o, nullptr, nullptr, nullptr, nullptr),
              StatusIs(kInvalid, HasSubstr("rowwise: null but options.rowwise is true")));
  // The column-wise output has the transposed shape [64, 32].
  o.columnwise = true;
  OwnedQuantized col(Format::kNvfp4, BlockShape::k1x16, ScaleLayout::kPlain, 32, 64);
  EXPECT_THAT(backend_->Quantize(x, o, nullptr, &row.view, &col.view, nullptr),
              StatusIs(kInvalid, HasSubstr("columnwise.rows: 32 does not match the expected 64")));
  // Dense outputs.
  std::vector<float> out(32 * 64);
  MutTensor small{out.data(), DType::kF32, 32, 64, out.size() * 4 - 1};
  EXPECT_THAT(backend_->Qdq(x, QuantizeOptions(), nullptr, small, nullptr),
              StatusIs(kInvalid, HasSubstr("out.capacity: 8191 bytes is smaller than the 8192 "
                                           "bytes of [32, 64] f32")));
  EXPECT_THAT(backend_->Qdq(x, QuantizeOptions(), nullptr, F32Out(&out, 64, 32), nullptr),
              StatusIs(kInvalid, HasSubstr("out.rows: 64 does not match x 32")));
  EXPECT_THAT(backend_->Dequantize(row.cview(), F32Out(&out, 16, 128), nullptr),
              StatusIs(kInvalid, HasSubstr("out.rows: 16 does not match q.rows 32")));
}

TEST_F(ValidateTest, ResidualRules) {
  const ConstTensor x = F32View(x_, 32, 64);
  std::vector<float> r(32 * 64, 0.25f);
  const std::vector<float> r_before = r;
  QuantizeOptions o;
  o.columnwise = true;
  OwnedQuantized row(Format::kNvfp4, BlockShape::k1x16, ScaleLayout::kPlain, 32, 64);
  OwnedQuantized col(Format::kNvfp4, BlockShape::k1x16, ScaleLayout::kPlain, 64, 32);
  EXPECT_THAT(backend_->Quantize(x, o, r.data(), &row.view, &col.view, nullptr),
              StatusIs(kInvalid, HasSubstr("residual: error feedback is row-wise only "
                                           "(options.columnwise is true)")));
  o = QuantizeOptions();
  o.rht = RhtMode::kSeeded;
  EXPECT_THAT(backend_->Quantize(x, o, r.data(), &row.view, nullptr, nullptr),
              StatusIs(kInvalid, HasSubstr("residual: error feedback is not combined with "
                                           "options.rht seeded")));
  EXPECT_THAT(ValidateResidualShape(8, 64, x),
              StatusIs(kInvalid, HasSubstr("residual.rows: 8 does not match x 32")));
  EXPECT_THAT(ValidateResidualShape(32, 16, x),
              StatusIs(kInvalid, HasSubstr("residual.cols: 16 does not match x 64")));
  EXPECT_TRUE(ValidateResidualShape(32, 64, x).ok());
  // Nothing was written on error.
  EXPECT_EQ(r, r_before);
  EXPECT_EQ(row.codes, std::vector<uint8_t>(row.codes.size(), testing::kPoison));
  EXPECT_EQ(row.scales, std::vector<uint8_t>(row.scales.size(), testing::kPoison));
  EXPECT_EQ(row.global[0], -12345.0f);
}

TEST_F(ValidateTest, QdqIsRowwiseOnlyWithoutRht) {
  const ConstTensor x = F32View(x_, 32, 64);
  std::vector<float> out(32 * 64, 3.0f);
  QuantizeOptions o;
  o.columnwise = true;
  EXPECT_THAT(backend_->Qdq(x, o, nullptr, F32Out(&out, 32, 64), nullptr),
              StatusIs(kInvalid, HasSubstr("options.columnwise: true, but QDQ is row-wise only")));
  o = QuantizeOptions();
  o.rht = RhtMode::kDefaultSigns;
  EXPECT_THAT(backend_->Qdq(x, o, nullptr, F32Out(&out, 32, 64), nullptr),
              StatusIs(kInvalid, HasSubstr("options.rht: default_signs is not supported by QDQ")));
  EXPECT_EQ(out, std::vector<float>(out.size(), 3.0f));
}

TEST_F(ValidateTest, MatmulArguments) {
  OwnedQuantized a(Format::kNvfp4, BlockShape::k1x16, ScaleLayout::kPlain, 4, 64);
  OwnedQuantized b(Format::kNvfp4, BlockShape::k1x16, ScaleLayout::kPlain, 3, 32);
  OwnedQuantized m(Format::kMxfp4, BlockShape::k1x32, ScaleLayout::kPlain, 3, 64);
  std::vector<float> c(12, 5.0f);
  EXPECT_THAT(backend_->Matmul(a.cview(), b.cview(), F32Out(&c, 4, 3), nullptr),
              StatusIs(kInvalid, HasSubstr("b.cols: 32 does not match a.cols 64 (K)")));
  EXPECT_THAT(backend_->Matmul(a.cview(), m.cview(), F32Out(&c, 4, 3), nullptr),
              StatusIs(kInvalid, HasSubstr("b.format: mxfp4 does not match a.format nvfp4")));
  OwnedQuantized b2(Format::kNvfp4, BlockShape::k1x16, ScaleLayout::kPlain, 3, 64);
  EXPECT_THAT(backend_->Matmul(a.cview(), b2.cview(), F32Out(&c, 3, 4), nullptr),
              StatusIs(kInvalid, HasSubstr("c.rows: 3 does not match a.rows 4 (M)")));
  ConstQuantizedTensor bad = a.cview();
  bad.block = BlockShape::k16x16;
  EXPECT_THAT(backend_->Matmul(bad, b2.cview(), F32Out(&c, 4, 3), nullptr),
              StatusIs(kInvalid, HasSubstr("a.rows: 4 is not a multiple of 16 (16x16 blocks)")));
  bad = a.cview();
  bad.scales_capacity = 3;
  EXPECT_THAT(backend_->Matmul(bad, b2.cview(), F32Out(&c, 4, 3), nullptr),
              StatusIs(kInvalid, HasSubstr("a.scales_capacity: 3 bytes is smaller than the 16 "
                                           "needed")));
  bad = a.cview();
  bad.format = static_cast<Format>(0);
  EXPECT_THAT(backend_->Matmul(bad, b2.cview(), F32Out(&c, 4, 3), nullptr),
              StatusIs(kInvalid, HasSubstr("a.format: 0 is not a valid format")));
  EXPECT_EQ(c, std::vector<float>(12, 5.0f));
}

TEST_F(ValidateTest, UpdateWeightArguments) {
  OwnedQuantized w(Format::kNvfp4, BlockShape::k1x16, ScaleLayout::kPlain, 32, 64);
  ASSERT_TRUE(testing::QuantizeInto(*backend_, F32View(x_, 32, 64), QuantizeOptions(), &w).ok());
  const std::vector<uint8_t> codes_before = w.codes;
  const ConstTensor g = F32View(x_, 32, 64);
  EXPECT_THAT(backend_->UpdateWeight(w.view, nullptr, F32View(x_, 16, 64), 0.1f,
                                     UpdateKind::kGradient, QuantizeOptions(), nullptr, nullptr),
              StatusIs(kInvalid, HasSubstr("update.rows: 16 does not match weight 32")));
  EXPECT_THAT(backend_->UpdateWeight(w.view, nullptr, g, std::nanf(""), UpdateKind::kGradient,
                                     QuantizeOptions(), nullptr, nullptr),
              StatusIs(kInvalid, HasSubstr("lr: nan is not finite")));
  EXPECT_THAT(backend_->UpdateWeight(w.view, nullptr, g, 0.1f, static_cast<UpdateKind>(0),
                                     QuantizeOptions(), nullptr, nullptr),
              StatusIs(kInvalid, HasSubstr("kind: 0 is not a valid update kind")));
  QuantizeOptions o;
  o.block = BlockShape::k16x16;
  EXPECT_THAT(
      backend_->UpdateWeight(w.view, nullptr, g, 0.1f, UpdateKind::kGradient, o, nullptr, nullptr),
      StatusIs(kInvalid, HasSubstr("options.block: 16x16 does not match weight.block "
                                   "1x16")));
  o = QuantizeOptions();
  o.scale_selection = ScaleSelection::kFourOverSixMse;
  EXPECT_THAT(
      backend_->UpdateWeight(w.view, nullptr, g, 0.1f, UpdateKind::kGradient, o, nullptr, nullptr),
      StatusIs(kInvalid, HasSubstr("options.scale_selection: four_over_six_mse is not "
                                   "supported by UpdateWeight")));
  o = QuantizeOptions();
  o.has_amax = true;
  o.amax = 1.0f;
  EXPECT_THAT(
      backend_->UpdateWeight(w.view, nullptr, g, 0.1f, UpdateKind::kGradient, o, nullptr, nullptr),
      StatusIs(kInvalid, HasSubstr("options.amax: 1 given, but UpdateWeight takes the "
                                   "amax of the new value")));
  OwnedQuantized mx(Format::kMxfp4, BlockShape::k1x32, ScaleLayout::kPlain, 32, 64);
  EXPECT_THAT(backend_->UpdateWeight(mx.view, nullptr, g, 0.1f, UpdateKind::kGradient,
                                     QuantizeOptions(), nullptr, nullptr),
              StatusIs(kInvalid, HasSubstr("weight.format: mxfp4, but stored weights are NVFP4")));
  std::vector<float> out(10);
  MutTensor small = F32Out(&out, 32, 64);
  EXPECT_THAT(backend_->UpdateWeight(w.view, nullptr, g, 0.1f, UpdateKind::kGradient,
                                     QuantizeOptions(), &small, nullptr),
              StatusIs(kInvalid, HasSubstr("dequantized_out.capacity: 40 bytes is smaller")));
  EXPECT_EQ(w.codes, codes_before);
}

TEST_F(ValidateTest, RhtArguments) {
  std::vector<float> out(32 * 64);
  EXPECT_THAT(
      backend_->Rht(F32View(x_, 32, 64), RhtMode::kOff, 0, false, F32Out(&out, 32, 64), nullptr),
      StatusIs(kInvalid, HasSubstr("mode: off is not a transform")));
  EXPECT_THAT(backend_->Rht(F32View(x_, 32, 64), static_cast<RhtMode>(7), 0, false,
                            F32Out(&out, 32, 64), nullptr),
              StatusIs(kInvalid, HasSubstr("mode: 7 is not a valid RHT mode")));
  EXPECT_THAT(backend_->Rht(F32View(x_, 64, 24), RhtMode::kDefaultSigns, 0, false,
                            F32Out(&out, 64, 24), nullptr),
              StatusIs(kInvalid, HasSubstr("in.cols: 24 is not a multiple of 16")));
  MutTensor bf{out.data(), DType::kBF16, 32, 64, out.size() * 4};
  EXPECT_THAT(backend_->Rht(F32View(x_, 32, 64), RhtMode::kDefaultSigns, 0, false, bf, nullptr),
              StatusIs(kInvalid, HasSubstr("out.dtype: bf16 does not match in.dtype f32")));
}

// Callers name the arguments: messages carry the given field paths, dimensions included, so a
// server quotes its request's fields without rewriting the message.
TEST(FieldPathTest, ShapeChecksNameTheGivenPath) {
  QuantizeOptions o;
  o.block = BlockShape::k16x16;
  const FieldPath input_root("input");
  const FieldPath input = input_root.Shaped();
  EXPECT_THAT(ValidateQuantizeShape(16, 40, o, input),
              StatusIs(kInvalid, Eq("input.shape[1]: 40 is not a multiple of the block size 16")));
  EXPECT_THAT(ValidateQuantizeShape(8, 32, o, input),
              StatusIs(kInvalid, Eq("input.shape[0]: 8 is not a multiple of 16 (16x16 blocks)")));
  EXPECT_THAT(ValidateQuantizeShape(0, 32, o, input),
              StatusIs(kInvalid, Eq("input.shape[0]: 0 must be >= 1")));
  o = QuantizeOptions();
  o.columnwise = true;
  EXPECT_THAT(ValidateQuantizeShape(8, 32, o, "items[2].x"),
              StatusIs(kInvalid, Eq("items[2].x.rows: 8 is not a multiple of the block size 16 "
                                    "(column-wise output)")));
  EXPECT_TRUE(ValidateQuantizeShape(16, 32, o, input).ok());
}

TEST(FieldPathTest, OptionMessagesUseThePrefix) {
  QuantizeOptions o;
  o.scale_selection = ScaleSelection::kFourOverSixMae;
  o.rounding = Rounding::kStochastic;
  EXPECT_THAT(ValidateQuantizeOptions(o, "req.options"),
              StatusIs(kInvalid, Eq("req.options.scale_selection: four_over_six_mae needs "
                                    "req.options.rounding nearest, not stochastic")));
  o = QuantizeOptions();
  o.rht = RhtMode::kSeeded;
  EXPECT_THAT(ValidateErrorFeedback(o, "options.residual_key", "options"),
              StatusIs(kInvalid, Eq("options.residual_key: error feedback is not combined with "
                                    "options.rht seeded")));
  EXPECT_THAT(ValidateQdqOptions(o, "qdq"),
              StatusIs(kInvalid, Eq("qdq.rht: seeded is not supported by QDQ")));
  o = QuantizeOptions();
  o.columnwise = true;
  EXPECT_THAT(ValidateErrorFeedback(o),
              StatusIs(kInvalid, Eq("residual: error feedback is row-wise only "
                                    "(options.columnwise is true)")));
  EXPECT_TRUE(ValidateErrorFeedback(QuantizeOptions(), "options.residual_key", "options").ok());
}

TEST(FieldPathTest, QuantizedShapeAndMatmulNameTheirOperands) {
  const FieldPath a_root("a.tensor");
  const FieldPath a = a_root.Shaped();
  EXPECT_THAT(
      ValidateQuantizedShape(Format::kNvfp4, BlockShape::k1x32, ScaleLayout::kPlain, 4, 32, a),
      StatusIs(kInvalid, Eq("a.tensor.block: 1x32 is not an NVFP4 block (1x16 or 16x16)")));
  EXPECT_THAT(
      ValidateQuantizedShape(Format::kMxfp4, BlockShape::k1x32, ScaleLayout::kPlain, 4, 48, a),
      StatusIs(kInvalid, Eq("a.tensor.shape[1]: 48 is not a multiple of the block size 32")));
  EXPECT_THAT(ValidateQuantizedShape(Format::kNvfp4, BlockShape::k1x16,
                                     static_cast<ScaleLayout>(7), 4, 32, a),
              StatusIs(kInvalid, Eq("a.tensor.scale_layout: 7 is not a valid scale layout")));
  EXPECT_TRUE(
      ValidateQuantizedShape(Format::kNvfp4, BlockShape::k16x16, ScaleLayout::kSwizzled, 16, 32, a)
          .ok());

  OwnedQuantized qa(Format::kNvfp4, BlockShape::k1x16, ScaleLayout::kPlain, 4, 64);
  OwnedQuantized qb(Format::kNvfp4, BlockShape::k1x16, ScaleLayout::kPlain, 3, 32);
  std::vector<float> c(12, 0.0f);
  const FieldPath b_root("b.weight_name");
  const FieldPath stored = b_root.Dims(" (the weight's rows)", " (the weight's columns)");
  EXPECT_THAT(ValidateMatmulArgs(qa.cview(), qb.cview(), F32Out(&c, 4, 3), a, stored, "out"),
              StatusIs(kInvalid, Eq("b.weight_name (the weight's columns): 32 does not match "
                                    "a.tensor.shape[1] 64 (K)")));
  OwnedQuantized qb2(Format::kNvfp4, BlockShape::k1x16, ScaleLayout::kPlain, 3, 64);
  EXPECT_THAT(ValidateMatmulArgs(qa.cview(), qb2.cview(), F32Out(&c, 3, 4), a, stored, "out"),
              StatusIs(kInvalid, Eq("out.rows: 3 does not match a.tensor.shape[0] 4 (M)")));
  ConstQuantizedTensor no_scales = qa.cview();
  no_scales.scales = nullptr;
  EXPECT_THAT(ValidateQuantizedInput(no_scales, a),
              StatusIs(kInvalid, Eq("a.tensor.scales: null")));
}

}  // namespace
}  // namespace fp4q::kernels
