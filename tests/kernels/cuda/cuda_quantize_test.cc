// The CUDA backend's Quantize against the CPU reference, bit for bit: every format, block,
// rounding, RHT mode, scale selection, MXFP4 rule, scale layout, output set (row-wise,
// column-wise, both), amax source and input dtype, on fresh random data of awkward shapes and
// five value distributions (NaN/Inf/subnormal/huge included). Codes, scales (padding included)
// and the global record must be byte-identical; outputs start with different poison on the two
// sides. Some views are deliberately unaligned.
#include <algorithm>
#include <cmath>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"

namespace fp4q::kernels {
namespace {

using cuda_testing::CudaParamTest;
using cuda_testing::DenseInput;
using cuda_testing::Dist;
using cuda_testing::QuantPair;

struct QCase {
  QuantizeOptions o;
  DType dtype = DType::kBF16;
  int64_t rows = 0, cols = 0;
  Dist dist = Dist::kNormal;
  size_t offset = 0;
  float amax_factor = 1.0f;  // caller amax = factor * max|x| (0: exactly 0)
  int id = 0;
};

std::string Describe(const QCase& c) {
  return absl::StrCat(c.id, "_", cuda_testing::OptionsName(c.o), "_",
                      c.dtype == DType::kF32 ? "f32" : "bf16", "_", c.rows, "x", c.cols, "_",
                      cuda_testing::DistName(c.dist), c.offset ? "_unaligned" : "");
}

std::string CaseName(const ::testing::TestParamInfo<QCase>& info) { return Describe(info.param); }

// GoogleTest prints the parameter in listings (and ctest's test names): the case's name, not
// its 128 raw bytes.
void PrintTo(const QCase& c, std::ostream* os) { *os << Describe(c); }

// Shapes by constraint: rows a multiple of `row_mult`, cols of `col_mult`.
struct Shape {
  int64_t rows, cols;
};
const std::vector<Shape>& ShapesFor(int row_mult, int col_mult) {
  // Row lengths that are multiples of 64 take the lane kernel (quantize_lanes.cu) for 1x16 and
  // MXFP4 row-wise output without four-over-six; the others quantize_rows.cu. With the
  // column-wise output, bf16 NVFP4 1x16 on row counts that are multiples of 64 and column
  // counts of 256 takes the lane tiles (quantize_tile.cu), the rest its shared tiles.
  static const std::vector<Shape> nv_any = {{1, 16},    {7, 48},   {3, 400},   {217, 256},
                                            {33, 144},  {130, 528}, {5, 4096}, {64, 80},
                                            {1, 64},    {3, 192},  {130, 320}, {9, 1088},
                                            {2, 65536}};
  static const std::vector<Shape> nv16 = {{16, 16},  {16, 48},   {48, 208},  {80, 272},
                                          {144, 96}, {64, 1040}, {208, 144}, {16, 2064},
                                          {32, 64},  {64, 256}, {192, 512}};
  static const std::vector<Shape> mx_any = {{1, 32},   {7, 64},   {5, 416},
                                            {130, 96}, {33, 288}, {3, 2080}};
  static const std::vector<Shape> mx32 = {{32, 32},  {32, 96},  {96, 160},
                                          {64, 416}, {160, 64}, {32, 2080}};
  if (col_mult == 32) return row_mult == 32 ? mx32 : mx_any;
  return row_mult == 16 ? nv16 : nv_any;
}

std::vector<QCase> AllCases() {
  std::vector<QCase> cases;
  const Dist dists[] = {Dist::kNormal, Dist::kSpecial, Dist::kHeavyTail, Dist::kOutliers,
                        Dist::kMidpoints};
  int id = 0;
  auto add = [&](QuantizeOptions o, DType dtype) {
    const bool mx = o.format == Format::kMxfp4;
    const int col_mult = mx ? 32 : 16;
    const int row_mult = (o.columnwise || o.block == BlockShape::k16x16) ? col_mult : 1;
    const auto& shapes = ShapesFor(row_mult, col_mult);
    QCase c;
    c.o = o;
    c.dtype = dtype;
    c.rows = shapes[id % shapes.size()].rows;
    c.cols = shapes[id % shapes.size()].cols;
    c.dist = dists[(id / 3) % 5];
    c.offset = (id % 7 == 3) ? 4 : 0;
    c.amax_factor = (id % 11 == 5) ? 0.0f : (id % 2 ? 0.5f : 1.0f);
    c.id = id++;
    cases.push_back(c);
  };
  for (DType dtype : {DType::kBF16, DType::kF32}) {
    for (ScaleLayout layout : {ScaleLayout::kPlain, ScaleLayout::kSwizzled}) {
      for (int outputs = 1; outputs <= 3; ++outputs) {
        QuantizeOptions base;
        base.scale_layout = layout;
        base.rowwise = outputs & 1;
        base.columnwise = outputs & 2;
        // NVFP4
        for (BlockShape block : {BlockShape::k1x16, BlockShape::k16x16}) {
          for (bool has_amax : {false, true}) {
            QuantizeOptions o = base;
            o.block = block;
            o.has_amax = has_amax;
            for (Rounding r : {Rounding::kNearest, Rounding::kStochastic}) {
              for (RhtMode rht : {RhtMode::kOff, RhtMode::kDefaultSigns, RhtMode::kSeeded}) {
                o.rounding = r;
                o.rht = rht;
                o.scale_selection = ScaleSelection::kMapTo6;
                add(o, dtype);
              }
            }
            o.rounding = Rounding::kNearest;
            o.rht = RhtMode::kOff;
            for (ScaleSelection sel :
                 {ScaleSelection::kFourOverSixMae, ScaleSelection::kFourOverSixMse}) {
              for (float emax : {256.0f, 448.0f}) {
                o.scale_selection = sel;
                o.four_over_six_emax = emax;
                add(o, dtype);
              }
            }
          }
        }
        // MXFP4
        QuantizeOptions o = base;
        o.format = Format::kMxfp4;
        o.block = BlockShape::k1x32;
        for (MxScaleRule rule : {MxScaleRule::kRceil, MxScaleRule::kFloor}) {
          for (Rounding r : {Rounding::kNearest, Rounding::kStochastic}) {
            for (RhtMode rht : {RhtMode::kOff, RhtMode::kDefaultSigns, RhtMode::kSeeded}) {
              o.mx_rule = rule;
              o.rounding = r;
              o.rht = rht;
              add(o, dtype);
            }
          }
        }
      }
    }
  }
  return cases;
}

using QuantizeTest = CudaParamTest<QCase>;

TEST_P(QuantizeTest, MatchesCpuBitForBit) {
  const QCase& c = GetParam();
  auto rng = Rng(static_cast<uint32_t>(c.id));
  DenseInput x = cuda_testing::MakeInput(gpu(), c.dtype, c.rows, c.cols, c.dist, rng, c.offset);
  QuantizeOptions o = c.o;
  o.seed = (static_cast<uint64_t>(rng()) << 32) | rng();
  o.step = (static_cast<uint64_t>(rng()) << 32) | rng();
  o.rht_seed = (static_cast<uint64_t>(rng()) << 32) | rng();
  if (o.has_amax) {
    float amax = 0.0f;
    for (float v : x.f32) {
      if (std::isfinite(v)) amax = std::max(amax, std::fabs(v));
    }
    o.amax = c.amax_factor * amax;
  }
  SCOPED_TRACE(absl::StrCat("seed ", cuda_testing::Env().seed, ", options ",
                            cuda_testing::OptionsName(o)));
  QuantPair row(gpu(), o.format, o.block, o.scale_layout, c.rows, c.cols, c.offset);
  // x^T's shape is a valid quantized shape only when the column-wise output is possible.
  std::unique_ptr<QuantPair> col;
  if (o.columnwise) {
    col = std::make_unique<QuantPair>(gpu(), o.format, o.block, o.scale_layout, c.cols, c.rows,
                                      c.offset);
  }
  ASSERT_TRUE(cpu().Quantize(x.host_view(), o, nullptr, &row.host, col ? &col->host : nullptr,
                             nullptr)
                  .ok());
  const absl::Status s =
      gpu().Quantize(x.dev_view(), o, nullptr, &row.dev, col ? &col->dev : nullptr, nullptr);
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_TRUE(gpu().Synchronize(nullptr).ok());
  if (o.rowwise) EXPECT_TRUE(row.Matches("rowwise"));
  if (o.columnwise) EXPECT_TRUE(col->Matches("columnwise"));
  if (!o.rowwise) {
    // Not requested: untouched.
    for (uint8_t b : row.d_codes->Download()) {
      ASSERT_EQ(b, cuda_testing::kDevicePoison) << "row-wise codes written though not requested";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllModes, QuantizeTest, ::testing::ValuesIn(AllCases()), CaseName);

// Tensors large enough that every warp of the row kernels' grid-stride loops runs several
// iterations (and the register prefetch of the next one), for each mode of the lane kernel and
// once through quantize_rows.cu (a row length that is not a multiple of 64).
class LargeQuantizeTest : public cuda_testing::CudaTest {
 protected:
  // Quantizes a rows x cols tensor of `dtype` drawn from `dist` with `o` (its seeds drawn from
  // rng) on both backends; the row-wise outputs must match bit for bit.
  void ExpectRowwiseMatch(QuantizeOptions o, DType dtype, int64_t rows, int64_t cols, Dist dist,
                          std::mt19937& rng, const std::string& what) {
    o.seed = (static_cast<uint64_t>(rng()) << 32) | rng();
    o.step = rng();
    o.rht_seed = rng();
    DenseInput x = cuda_testing::MakeInput(gpu(), dtype, rows, cols, dist, rng);
    SCOPED_TRACE(absl::StrCat(what, ": ", rows, "x", cols, " ", cuda_testing::OptionsName(o),
                              dtype == DType::kF32 ? " f32" : " bf16"));
    QuantPair q(gpu(), o.format, o.block, o.scale_layout, rows, cols);
    ASSERT_TRUE(cpu().Quantize(x.host_view(), o, nullptr, &q.host, nullptr, nullptr).ok());
    const absl::Status s = gpu().Quantize(x.dev_view(), o, nullptr, &q.dev, nullptr, nullptr);
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_TRUE(q.Matches(what));
  }
};

// A global amax computed in the quantize launch itself, both forms: up to 2^16 bf16 elements
// every CTA reduces the whole tensor (CtaAmaxFits), above that one cooperative launch; each
// NVFP4 block shape, rounding and RHT, with NaN, infinities and heavy tails among the inputs.
TEST_F(LargeQuantizeTest, AmaxComputedInTheLaunchMatchesCpuInBothForms) {
  auto rng = Rng(7100);
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {16, 64}, {48, 192}, {16, 4096}, {32, 2048}, {64, 2048}, {48, 4096}};
  int i = 0;
  for (BlockShape block : {BlockShape::k1x16, BlockShape::k16x16}) {
    for (Rounding rounding : {Rounding::kNearest, Rounding::kStochastic}) {
      for (RhtMode rht : {RhtMode::kOff, RhtMode::kDefaultSigns}) {
        for (auto [rows, cols] : shapes) {
          QuantizeOptions o;
          o.block = block;
          o.rounding = rounding;
          o.rht = rht;
          o.scale_layout = ++i % 2 ? ScaleLayout::kPlain : ScaleLayout::kSwizzled;
          const Dist dist = i % 3 == 0 ? Dist::kSpecial : (i % 3 == 1 ? Dist::kNormal
                                                                      : Dist::kHeavyTail);
          ExpectRowwiseMatch(o, DType::kBF16, rows, cols, dist, rng,
                             rows * cols <= 65536 ? "every CTA's amax" : "cooperative amax");
        }
      }
    }
  }
}

TEST_F(LargeQuantizeTest, GridStrideLoopsMatchCpuBitForBit) {
  struct Big {
    DType dtype;
    int64_t rows, cols;
    Rounding rounding;
    RhtMode rht;
    bool has_amax;
    bool feedback;
    ScaleLayout layout;
  };
  const Big cases[] = {
      {DType::kBF16, 2048, 4096, Rounding::kNearest, RhtMode::kOff, true, false,
       ScaleLayout::kPlain},
      {DType::kBF16, 2048, 4096, Rounding::kStochastic, RhtMode::kOff, false, false,
       ScaleLayout::kSwizzled},
      {DType::kBF16, 1024, 8192, Rounding::kStochastic, RhtMode::kDefaultSigns, true, false,
       ScaleLayout::kSwizzled},
      {DType::kBF16, 1536, 2560, Rounding::kNearest, RhtMode::kSeeded, false, false,
       ScaleLayout::kPlain},
      {DType::kBF16, 2048, 4096, Rounding::kNearest, RhtMode::kOff, true, true,
       ScaleLayout::kPlain},
      {DType::kF32, 1024, 4096, Rounding::kStochastic, RhtMode::kOff, false, true,
       ScaleLayout::kSwizzled},
      {DType::kF32, 1024, 4160, Rounding::kStochastic, RhtMode::kDefaultSigns, false, false,
       ScaleLayout::kPlain},
      {DType::kBF16, 1000, 4112, Rounding::kStochastic, RhtMode::kOff, true, true,
       ScaleLayout::kSwizzled},
  };
  int i = 0;
  for (const Big& b : cases) {
    ++i;
    auto rng = Rng(9100 + i);
    QuantizeOptions o;
    o.rounding = b.rounding;
    o.rht = b.rht;
    o.scale_layout = b.layout;
    o.seed = (static_cast<uint64_t>(rng()) << 32) | rng();
    o.step = rng();
    o.rht_seed = rng();
    const Dist dist = i % 2 ? Dist::kNormal : Dist::kOutliers;
    DenseInput x = cuda_testing::MakeInput(gpu(), b.dtype, b.rows, b.cols, dist, rng);
    if (b.has_amax) {
      o.has_amax = true;
      o.amax = 3.0f;
    }
    SCOPED_TRACE(absl::StrCat(i, ": ", b.rows, "x", b.cols, " ", cuda_testing::OptionsName(o),
                              b.feedback ? " feedback" : ""));
    const size_t n = static_cast<size_t>(b.rows * b.cols);
    std::vector<float> r;
    std::unique_ptr<cuda_testing::DeviceBuffer> dr;
    if (b.feedback) {
      std::normal_distribution<float> d(0.0f, 0.05f);
      r.resize(n);
      for (float& v : r) v = d(rng);
      dr = std::make_unique<cuda_testing::DeviceBuffer>(gpu(), n * 4);
      dr->Upload(r.data(), n * 4);
    }
    QuantPair q(gpu(), Format::kNvfp4, BlockShape::k1x16, b.layout, b.rows, b.cols);
    ASSERT_TRUE(cpu().Quantize(x.host_view(), o, b.feedback ? r.data() : nullptr, &q.host,
                               nullptr, nullptr)
                    .ok());
    const absl::Status s = gpu().Quantize(
        x.dev_view(), o, b.feedback ? static_cast<float*>(dr->get()) : nullptr, &q.dev, nullptr,
        nullptr);
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_TRUE(q.Matches("large"));
    if (b.feedback) EXPECT_TRUE(cuda_testing::SameDense(dr->DownloadAs<float>(), r, "residual"));
  }
}

// MXFP4 on rows whose length is a multiple of 64 (the one-block-a-lane kernel, a lane pair per
// 32-element block): every dtype, scale layout, scale rule, rounding and RHT mode, on a small
// tensor with special values and on one large enough for several grid steps a warp; the global
// amax record and the codes and scales bit for bit against the CPU.
TEST_F(LargeQuantizeTest, MxfpFourOnTheBlockLanesMatchesCpuBitForBit) {
  int i = 0;
  for (DType dtype : {DType::kBF16, DType::kF32}) {
    for (ScaleLayout layout : {ScaleLayout::kPlain, ScaleLayout::kSwizzled}) {
      for (MxScaleRule rule : {MxScaleRule::kRceil, MxScaleRule::kFloor}) {
        for (Rounding rounding : {Rounding::kNearest, Rounding::kStochastic}) {
          for (RhtMode rht : {RhtMode::kOff, RhtMode::kDefaultSigns, RhtMode::kSeeded}) {
            ++i;
            const bool big = i % 3 == 0;
            auto rng = Rng(9500 + i);
            QuantizeOptions o;
            o.format = Format::kMxfp4;
            o.block = BlockShape::k1x32;
            o.scale_layout = layout;
            o.mx_rule = rule;
            o.rounding = rounding;
            o.rht = rht;
            const Dist dist = big ? Dist::kOutliers : (i % 2 ? Dist::kSpecial : Dist::kNormal);
            ExpectRowwiseMatch(o, dtype, big ? 1536 : 37, big ? 4096 : 192, dist, rng,
                               absl::StrCat("mxfp4 ", i));
          }
        }
      }
    }
  }
}

// NVFP4 16x16 tiles (quantize_rows.cu) on rows a multiple of 64 long: every dtype, scale layout,
// rounding and RHT mode, with the amax given or computed, on small tensors with special values
// and on one large enough for several grid steps a warp; bit for bit against the CPU.
TEST_F(LargeQuantizeTest, SixteenBySixteenTilesMatchCpuBitForBit) {
  int i = 0;
  for (DType dtype : {DType::kBF16, DType::kF32}) {
    for (ScaleLayout layout : {ScaleLayout::kPlain, ScaleLayout::kSwizzled}) {
      for (Rounding rounding : {Rounding::kNearest, Rounding::kStochastic}) {
        for (RhtMode rht : {RhtMode::kOff, RhtMode::kDefaultSigns, RhtMode::kSeeded}) {
          for (bool has_amax : {false, true}) {
            ++i;
            const bool big = i % 4 == 0;
            auto rng = Rng(9700 + i);
            QuantizeOptions o;
            o.block = BlockShape::k16x16;
            o.scale_layout = layout;
            o.rounding = rounding;
            o.rht = rht;
            if (has_amax) {
              o.has_amax = true;
              o.amax = 4.0f;
            }
            const Dist dist = big ? Dist::kOutliers : (i % 3 ? Dist::kSpecial : Dist::kNormal);
            ExpectRowwiseMatch(o, dtype, big ? 1024 : (i % 2 ? 48 : 16), big ? 4096 : 320, dist,
                               rng, absl::StrCat("16x16 ", i));
          }
        }
      }
    }
  }
}

// Row-wise and column-wise output from one read of bf16 x on the lane tiles (quantize_tile.cu,
// LaneTilesCover: rows a multiple of 64, columns of 256): every scale layout, rounding and RHT
// mode, the amax given or computed (with the RHT, each output's own amax from the lane tiles'
// amax pass), both outputs and the column-wise one alone, on small tensors with special values
// and on one large enough for several tasks a warp; bit for bit against the CPU, the global
// records included.
TEST_F(LargeQuantizeTest, LaneTilesMatchCpuBitForBitInBothOutputs) {
  int i = 0;
  for (ScaleLayout layout : {ScaleLayout::kPlain, ScaleLayout::kSwizzled}) {
    for (Rounding rounding : {Rounding::kNearest, Rounding::kStochastic}) {
      for (RhtMode rht : {RhtMode::kOff, RhtMode::kDefaultSigns, RhtMode::kSeeded}) {
        for (bool has_amax : {false, true}) {
          for (bool rowwise : {true, false}) {
            ++i;
            const bool big = i % 6 == 0;
            const int64_t rows = big ? 2048 : (i % 2 ? 64 : 192);
            const int64_t cols = big ? 2048 : (i % 3 ? 256 : 768);
            auto rng = Rng(9900 + i);
            QuantizeOptions o;
            o.scale_layout = layout;
            o.rounding = rounding;
            o.rht = rht;
            o.rowwise = rowwise;
            o.columnwise = true;
            o.seed = (static_cast<uint64_t>(rng()) << 32) | rng();
            o.step = rng();
            o.rht_seed = rng();
            if (has_amax) {
              o.has_amax = true;
              o.amax = 5.0f;
            }
            const Dist dist = big ? Dist::kOutliers : (i % 3 ? Dist::kSpecial : Dist::kNormal);
            DenseInput x = cuda_testing::MakeInput(gpu(), DType::kBF16, rows, cols, dist, rng);
            SCOPED_TRACE(absl::StrCat("lane tiles ", i, ": ", rows, "x", cols, " ",
                                      cuda_testing::OptionsName(o)));
            QuantPair row(gpu(), o.format, o.block, layout, rows, cols);
            QuantPair col(gpu(), o.format, o.block, layout, cols, rows);
            ASSERT_TRUE(cpu().Quantize(x.host_view(), o, nullptr, rowwise ? &row.host : nullptr,
                                       &col.host, nullptr)
                            .ok());
            const absl::Status s = gpu().Quantize(x.dev_view(), o, nullptr,
                                                  rowwise ? &row.dev : nullptr, &col.dev, nullptr);
            ASSERT_TRUE(s.ok()) << s;
            ASSERT_TRUE(gpu().Synchronize(nullptr).ok());
            if (rowwise) EXPECT_TRUE(row.Matches("rowwise"));
            EXPECT_TRUE(col.Matches("columnwise"));
          }
        }
      }
    }
  }
}

// Stochastic rounding where it turns: values k/65536 of the way through each grid cell (and one
// ulp either side), subnormals and grid values, with y = x exactly; Philox's 16 bits land on
// or next to an element's threshold k about once in 20,000 elements, so 4M elements meet it
// a few hundred times. Both SR kernels (one block a lane; lane pairs with error feedback, whose
// residual starts at zero) against the CPU, bit for bit.
TEST_F(LargeQuantizeTest, StochasticRoundingAtItsThresholdsMatchesCpu) {
  constexpr int64_t kRows = 1024, kCols = 4096;
  const size_t n = static_cast<size_t>(kRows * kCols);
  auto rng = Rng(9300);
  DenseInput x =
      cuda_testing::MakeInput(gpu(), DType::kF32, kRows, kCols, Dist::kSrThresholds, rng);
  for (bool feedback : {false, true}) {
    SCOPED_TRACE(feedback ? "error feedback" : "quantize");
    QuantizeOptions o;
    o.rounding = Rounding::kStochastic;
    o.has_amax = true;
    o.amax = 2688.0f;
    o.seed = 0x9E3779B97F4A7C15ull;
    o.step = 77;
    std::vector<float> r(feedback ? n : 0, 0.0f);
    std::unique_ptr<cuda_testing::DeviceBuffer> dr;
    if (feedback) {
      dr = std::make_unique<cuda_testing::DeviceBuffer>(gpu(), n * 4);
      dr->Upload(r.data(), n * 4);
    }
    QuantPair q(gpu(), Format::kNvfp4, BlockShape::k1x16, ScaleLayout::kPlain, kRows, kCols);
    ASSERT_TRUE(cpu().Quantize(x.host_view(), o, feedback ? r.data() : nullptr, &q.host,
                               nullptr, nullptr)
                    .ok());
    const absl::Status s =
        gpu().Quantize(x.dev_view(), o, feedback ? static_cast<float*>(dr->get()) : nullptr,
                       &q.dev, nullptr, nullptr);
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_TRUE(q.Matches("sr thresholds"));
    // Every block scale is 1 (E4M3 0x38): y = x held.
    EXPECT_EQ(std::count(q.scales.begin(), q.scales.end(), uint8_t{0x38}),
              static_cast<std::ptrdiff_t>(n / 16));
    if (feedback) EXPECT_TRUE(cuda_testing::SameDense(dr->DownloadAs<float>(), r, "residual"));
  }
}

}  // namespace
}  // namespace fp4q::kernels
