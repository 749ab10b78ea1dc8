// Scale layouts (NUMERICS 3) and column-wise (transposed) quantization (DESIGN "Numerics
// decisions").
#include <cstdint>
#include <string>
#include <vector>

#include "cpu/formats.h"
#include "fp4q/kernels/backend.h"
#include "gtest/gtest.h"
#include "kernels/test_util.h"

namespace fp4q::kernels {
namespace {

using testing::F32Out;
using testing::F32View;
using testing::OwnedQuantized;

TEST(SwizzleTest, OffsetFormulaAtHandPickedPositions) {
  // ((r / 128) * (C' / 4) + c / 4) * 512 + (r % 32) * 16 + ((r / 32) % 4) * 4 + c % 4
  // with 8 scale columns (C' = 8):
  EXPECT_EQ(SwizzledScaleOffset(0, 0, 8), 0u);
  EXPECT_EQ(SwizzledScaleOffset(0, 3, 8), 3u);
  EXPECT_EQ(SwizzledScaleOffset(0, 4, 8), 512u);
  EXPECT_EQ(SwizzledScaleOffset(1, 0, 8), 16u);
  EXPECT_EQ(SwizzledScaleOffset(31, 0, 8), 496u);
  EXPECT_EQ(SwizzledScaleOffset(32, 0, 8), 4u);
  EXPECT_EQ(SwizzledScaleOffset(33, 1, 8), 21u);
  EXPECT_EQ(SwizzledScaleOffset(127, 3, 8), 511u);
  EXPECT_EQ(SwizzledScaleOffset(128, 0, 8), 1024u);
  EXPECT_EQ(SwizzledScaleOffset(130, 5, 8), 1569u);  // (1 * 2 + 1) * 512 + 2 * 16 + 1
  // 3 scale columns pad to C' = 4.
  EXPECT_EQ(SwizzledScaleOffset(0, 2, 3), 2u);
  EXPECT_EQ(SwizzledScaleOffset(128, 1, 3), 513u);
  EXPECT_EQ(SwizzledScaleOffset(200, 2, 3), 512u + 8 * 16 + 2 * 4 + 2);
}

TEST(SwizzleTest, ScaleBytesPad) {
  EXPECT_EQ(ScaleBytes(1, 16, Format::kNvfp4, ScaleLayout::kSwizzled, "t").value(), 512u);
  EXPECT_EQ(ScaleBytes(1, 16, Format::kNvfp4, ScaleLayout::kPlain, "t").value(), 1u);
  EXPECT_EQ(ScaleBytes(217, 256, Format::kNvfp4, ScaleLayout::kSwizzled, "t").value(), 4096u);
  EXPECT_EQ(ScaleBytes(217, 256, Format::kNvfp4, ScaleLayout::kPlain, "t").value(), 3472u);
  EXPECT_EQ(ScaleBytes(129, 96, Format::kMxfp4, ScaleLayout::kSwizzled, "t").value(), 1024u);
}

struct LayoutCase {
  Format format;
  BlockShape block;
  int64_t rows, cols;
};

class SwizzleRoundTripTest : public ::testing::TestWithParam<LayoutCase> {};

TEST_P(SwizzleRoundTripTest, SwizzledHoldsThePlainScalesAndZeroPadding) {
  const LayoutCase p = GetParam();
  auto backend = CreateCpuBackend();
  const std::vector<float> x = testing::Normal(p.rows * p.cols, 31, 2.0f);
  QuantizeOptions o;
  o.format = p.format;
  o.block = p.block;
  OwnedQuantized plain(p.format, p.block, ScaleLayout::kPlain, p.rows, p.cols);
  ASSERT_TRUE(testing::QuantizeInto(*backend, F32View(x, p.rows, p.cols), o, &plain).ok());
  o.scale_layout = ScaleLayout::kSwizzled;
  OwnedQuantized sw(p.format, p.block, ScaleLayout::kSwizzled, p.rows, p.cols);
  ASSERT_TRUE(testing::QuantizeInto(*backend, F32View(x, p.rows, p.cols), o, &sw).ok());
  EXPECT_EQ(sw.codes, plain.codes);
  EXPECT_EQ(sw.global, plain.global);
  const int64_t scale_cols = p.cols / BlockElems(p.format);
  std::vector<bool> used(sw.scales.size(), false);
  for (int64_t r = 0; r < p.rows; ++r) {
    for (int64_t c = 0; c < scale_cols; ++c) {
      const size_t at = SwizzledScaleOffset(r, c, scale_cols);
      ASSERT_LT(at, sw.scales.size());
      EXPECT_EQ(sw.scales[at], plain.scale(r, c)) << r << ", " << c;
      EXPECT_FALSE(used[at]);
      used[at] = true;
    }
  }
  for (size_t i = 0; i < used.size(); ++i) {
    if (!used[i]) EXPECT_EQ(sw.scales[i], 0) << "padding byte " << i;
  }
  // Reading back: dequantization and matmul from either layout agree.
  std::vector<float> a(x.size(), 1.0f), b(x.size(), 2.0f);
  ASSERT_TRUE(backend->Dequantize(plain.cview(), F32Out(&a, p.rows, p.cols), nullptr).ok());
  ASSERT_TRUE(backend->Dequantize(sw.cview(), F32Out(&b, p.rows, p.cols), nullptr).ok());
  EXPECT_EQ(a, b);
  std::vector<float> c1(p.rows * p.rows, 1.0f), c2(p.rows * p.rows, 2.0f);
  ASSERT_TRUE(
      backend->Matmul(plain.cview(), plain.cview(), F32Out(&c1, p.rows, p.rows), nullptr).ok());
  ASSERT_TRUE(
      backend->Matmul(sw.cview(), plain.cview(), F32Out(&c2, p.rows, p.rows), nullptr).ok());
  EXPECT_EQ(c1, c2);
}

INSTANTIATE_TEST_SUITE_P(Shapes, SwizzleRoundTripTest,
                         ::testing::Values(LayoutCase{Format::kNvfp4, BlockShape::k1x16, 1, 16},
                                           LayoutCase{Format::kNvfp4, BlockShape::k1x16, 7, 48},
                                           LayoutCase{Format::kNvfp4, BlockShape::k16x16, 144, 80},
                                           LayoutCase{Format::kNvfp4, BlockShape::k1x16, 217, 256},
                                           LayoutCase{Format::kMxfp4, BlockShape::k1x32, 129, 96}));

std::vector<float> TransposeOf(const std::vector<float>& x, int64_t rows, int64_t cols) {
  std::vector<float> t(x.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[c * rows + r] = x[r * cols + c];
  return t;
}

struct TransposeCase {
  std::string name;
  QuantizeOptions options;
  int64_t rows, cols;
};

class ColumnwiseTest : public ::testing::TestWithParam<TransposeCase> {};

TEST_P(ColumnwiseTest, EqualsQuantizationOfTheExplicitTranspose) {
  const TransposeCase p = GetParam();
  auto backend = CreateCpuBackend();
  std::vector<float> x = testing::Normal(p.rows * p.cols, 41, 1.5f);
  x[5] = 40.0f;  // an outlier
  QuantizeOptions both = p.options;
  both.rowwise = true;
  both.columnwise = true;
  const Format f = p.options.format;
  const BlockShape b = p.options.block;
  const ScaleLayout l = p.options.scale_layout;
  OwnedQuantized row(f, b, l, p.rows, p.cols), col(f, b, l, p.cols, p.rows);
  ASSERT_TRUE(testing::QuantizeInto(*backend, F32View(x, p.rows, p.cols), both, &row, &col).ok());

  const std::vector<float> xt = TransposeOf(x, p.rows, p.cols);
  OwnedQuantized want(f, b, l, p.cols, p.rows);
  ASSERT_TRUE(testing::QuantizeInto(*backend, F32View(xt, p.cols, p.rows), p.options, &want).ok());
  EXPECT_EQ(col.codes, want.codes);
  EXPECT_EQ(col.scales, want.scales);
  EXPECT_EQ(col.global, want.global);

  OwnedQuantized row_only(f, b, l, p.rows, p.cols);
  ASSERT_TRUE(
      testing::QuantizeInto(*backend, F32View(x, p.rows, p.cols), p.options, &row_only).ok());
  EXPECT_EQ(row.codes, row_only.codes);
  EXPECT_EQ(row.scales, row_only.scales);
}

QuantizeOptions Opts(Format f, BlockShape b, Rounding r, RhtMode rht, ScaleSelection s) {
  QuantizeOptions o;
  o.format = f;
  o.block = b;
  o.rounding = r;
  o.seed = 5;
  o.step = 9;
  o.rht = rht;
  o.scale_selection = s;
  return o;
}

INSTANTIATE_TEST_SUITE_P(
    Options, ColumnwiseTest,
    ::testing::Values(TransposeCase{"Nvfp4Rtn",
                                    Opts(Format::kNvfp4, BlockShape::k1x16, Rounding::kNearest,
                                         RhtMode::kOff, ScaleSelection::kMapTo6),
                                    48, 32},
                      TransposeCase{"Nvfp4Sr",
                                    Opts(Format::kNvfp4, BlockShape::k1x16, Rounding::kStochastic,
                                         RhtMode::kOff, ScaleSelection::kMapTo6),
                                    32, 80},
                      TransposeCase{"Nvfp4Rht",
                                    Opts(Format::kNvfp4, BlockShape::k1x16, Rounding::kStochastic,
                                         RhtMode::kDefaultSigns, ScaleSelection::kMapTo6),
                                    64, 48},
                      TransposeCase{"Nvfp4FourOverSix",
                                    Opts(Format::kNvfp4, BlockShape::k1x16, Rounding::kNearest,
                                         RhtMode::kOff, ScaleSelection::kFourOverSixMae),
                                    16, 64},
                      TransposeCase{"Nvfp4Tile",
                                    Opts(Format::kNvfp4, BlockShape::k16x16, Rounding::kNearest,
                                         RhtMode::kSeeded, ScaleSelection::kMapTo6),
                                    32, 48},
                      TransposeCase{"Mxfp4",
                                    Opts(Format::kMxfp4, BlockShape::k1x32, Rounding::kStochastic,
                                         RhtMode::kOff, ScaleSelection::kMapTo6),
                                    64, 96}),
    [](const ::testing::TestParamInfo<TransposeCase>& info) { return info.param.name; });

TEST(ColumnwiseTest, TileColumnwiseIsTheTransposeOfRowwise) {
  auto backend = CreateCpuBackend();
  const int64_t rows = 48, cols = 80;
  const std::vector<float> x = testing::Normal(rows * cols, 43, 4.0f);
  QuantizeOptions o;
  o.block = BlockShape::k16x16;
  o.columnwise = true;
  OwnedQuantized row(Format::kNvfp4, BlockShape::k16x16, ScaleLayout::kPlain, rows, cols);
  OwnedQuantized col(Format::kNvfp4, BlockShape::k16x16, ScaleLayout::kPlain, cols, rows);
  ASSERT_TRUE(testing::QuantizeInto(*backend, F32View(x, rows, cols), o, &row, &col).ok());
  EXPECT_EQ(row.global, col.global);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      ASSERT_EQ(col.code(c, r), row.code(r, c)) << r << ", " << c;
      ASSERT_EQ(col.scale(c, r / 16), row.scale(r, c / 16)) << r << ", " << c;
    }
  }
  // Each tile's scale repeats on its 16 rows.
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols / 16; ++j) EXPECT_EQ(row.scale(r, j), row.scale(r / 16 * 16, j));
}

}  // namespace
}  // namespace fp4q::kernels
