// Awkward shapes x value ranges x dtypes (the project's test style): every output byte is
// written, the global record, each block scale and each code follow NUMERICS 2/8 as
// re-derived here from the hand-tested format conversions, and the decode error stays within
// half a grid step where the block scale is a normal E4M3 (or unclamped E8M0) value.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "cpu/formats.h"
#include "cpu/mxfp4.h"
#include "fp4q/kernels/backend.h"
#include "gtest/gtest.h"
#include "kernels/test_util.h"

namespace fp4q::kernels {
namespace {

using testing::OwnedQuantized;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kFltMax = std::numeric_limits<float>::max();

enum class Range {
  kZeros,
  kSubnormals,
  kNearMax,              // magnitudes at and around 448 and 6 (E4M3 and E2M1 maxima)
  kBeyondMax,            // magnitudes up to 3e38, far beyond both maxima
  kCallerAmaxBelowData,  // caller amax 1 on data up to 1000: scales saturate at 448
  kNanInf,
  kHeavyTails,
  kNormal,
};

const char* RangeName(Range r) {
  switch (r) {
    case Range::kZeros:
      return "Zeros";
    case Range::kSubnormals:
      return "Subnormals";
    case Range::kNearMax:
      return "NearMax";
    case Range::kBeyondMax:
      return "BeyondMax";
    case Range::kCallerAmaxBelowData:
      return "CallerAmaxBelowData";
    case Range::kNanInf:
      return "NanInf";
    case Range::kHeavyTails:
      return "HeavyTails";
    case Range::kNormal:
      return "Normal";
  }
  return "";
}

std::vector<float> Generate(Range range, size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> unit(1.0f, 2.0f);
  std::uniform_int_distribution<int> pick(0, 99);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::student_t_distribution<float> cauchy(1.0f);
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) {
    const float sign = pick(gen) % 2 ? -1.0f : 1.0f;
    switch (range) {
      case Range::kZeros:
        x[i] = pick(gen) < 10 ? -0.0f : 0.0f;
        break;
      case Range::kSubnormals:
        x[i] = sign * std::ldexp(unit(gen), -128 - pick(gen) % 20);
        break;
      case Range::kNearMax: {
        const float base[] = {448.0f, 6.0f, 449.0f, 5.99f, 464.0f, 6.5f, 447.9f, 4.0f};
        x[i] = sign * base[pick(gen) % 8] * (pick(gen) < 50 ? 1.0f : 1.0001f);
        break;
      }
      case Range::kBeyondMax:
        x[i] = sign * std::ldexp(unit(gen), 100 + pick(gen) % 27);  // up to ~3e38
        break;
      case Range::kCallerAmaxBelowData:
        x[i] = sign * unit(gen) * static_cast<float>(1 + pick(gen) * 5);
        break;
      case Range::kNanInf: {
        const int p = pick(gen);
        x[i] = p < 5 ? std::nanf("") : p < 8 ? sign * kInf : normal(gen);
        break;
      }
      case Range::kHeavyTails:
        x[i] = 10.0f * cauchy(gen);
        break;
      case Range::kNormal:
        x[i] = normal(gen);
        break;
    }
  }
  return x;
}

struct ShapeCase {
  DType dtype;
  int64_t rows, cols;
  Format format;
  BlockShape block;
  Range range;
};

void PrintTo(const ShapeCase& p, std::ostream* os) {
  *os << DTypeName(p.dtype) << " " << p.rows << "x" << p.cols << " " << FormatName(p.format) << " "
      << BlockShapeName(p.block) << " " << RangeName(p.range);
}

std::string CaseName(const ::testing::TestParamInfo<ShapeCase>& info) {
  const ShapeCase& p = info.param;
  return std::string(DTypeName(p.dtype)) + "_" + std::to_string(p.rows) + "x" +
         std::to_string(p.cols) + "_" + FormatName(p.format) + "_" +
         (p.block == BlockShape::k16x16 ? "tile_" : "") + RangeName(p.range);
}

// Half the grid spacing around |y| (the RTN error bound), or the clipped amount beyond 6.
double GridHalfStep(double a) {
  if (a <= 2) return 0.25;
  if (a <= 4) return 0.5;
  if (a <= 6) return 1.0;
  return a - 6.0;
}

void CheckQuantization(const ShapeCase& p, const std::vector<float>& x_in) {
  auto backend = CreateCpuBackend();
  const int64_t rows = p.rows, cols = p.cols;
  // The input as given (f32 or bf16) and its exact f32 values.
  std::vector<float> x = x_in;
  std::vector<uint16_t> x16;
  ConstTensor view = testing::F32View(x, rows, cols);
  if (p.dtype == DType::kBF16) {
    for (float v : x_in) x16.push_back(cpu::FloatToBf16(v));
    for (size_t i = 0; i < x.size(); ++i) x[i] = cpu::Bf16ToFloat(x16[i]);
    view = testing::Bf16View(x16, rows, cols);
  }
  QuantizeOptions o;
  o.format = p.format;
  o.block = p.block;
  if (p.range == Range::kCallerAmaxBelowData) {
    o.has_amax = true;
    o.amax = 1.0f;
  }
  // Every byte written: two runs over differently poisoned buffers agree.
  OwnedQuantized q(p.format, p.block, ScaleLayout::kPlain, rows, cols);
  OwnedQuantized q2(p.format, p.block, ScaleLayout::kPlain, rows, cols);
  std::fill(q2.codes.begin(), q2.codes.end(), 0x5A);
  std::fill(q2.scales.begin(), q2.scales.end(), 0x5A);
  ASSERT_TRUE(testing::QuantizeInto(*backend, view, o, &q).ok());
  ASSERT_TRUE(testing::QuantizeInto(*backend, view, o, &q2).ok());
  ASSERT_EQ(q.codes, q2.codes);
  ASSERT_EQ(q.scales, q2.scales);

  // Global record.
  float amax = 0.0f;
  for (float v : x) {
    if (!std::isnan(v)) amax = std::max(amax, std::fabs(v));
  }
  if (o.has_amax) amax = o.amax;
  ASSERT_EQ(q.global[0], amax);
  float s_enc = 1.0f;
  if (p.format == Format::kNvfp4 && amax != 0.0f && !std::isinf(amax)) {
    s_enc = std::min(2688.0f / amax, kFltMax);
    if (s_enc == 0.0f) s_enc = 1.0f;
  }
  ASSERT_EQ(q.global[1], s_enc);
  const float s_dec = 1.0f / s_enc;

  std::vector<float> dq(x.size(), std::nanf(""));
  ASSERT_TRUE(backend->Dequantize(q.cview(), testing::F32Out(&dq, rows, cols), nullptr).ok());

  const int64_t width = BlockElems(p.format);
  const int64_t height = p.block == BlockShape::k16x16 ? 16 : 1;
  int64_t bounded = 0;
  for (int64_t r0 = 0; r0 < rows; r0 += height) {
    for (int64_t c0 = 0; c0 < cols; c0 += width) {
      float bamax = 0.0f;
      for (int64_t r = r0; r < r0 + height; ++r)
        for (int64_t c = c0; c < c0 + width; ++c)
          if (!std::isnan(x[r * cols + c])) bamax = std::max(bamax, std::fabs(x[r * cols + c]));
      float inv;
      bool normal_scale;
      uint8_t want_scale;
      if (p.format == Format::kNvfp4) {
        const float u = bamax * (s_enc * cpu::C6());
        want_scale = cpu::E4m3FromFloat(u);
        const float sf = cpu::E4m3ToFloat(want_scale);
        const float q_inv = 1.0f / (sf * s_dec);
        inv = std::min(q_inv, kFltMax);
        // A normal E4M3 scale that did not saturate (u >= 464 rounds beyond 448) and whose
        // inverse did not overflow.
        normal_scale = want_scale >= 0x08 && u < 464.0f && q_inv <= kFltMax;
      } else {
        want_scale = cpu::MxScaleByte(bamax, MxScaleRule::kRceil);
        inv = std::ldexp(1.0f, 127 - want_scale);
        normal_scale = want_scale > 0 && want_scale < 254 && bamax > 0;
      }
      for (int64_t r = r0; r < r0 + height; ++r) {
        ASSERT_EQ(q.scale(r, c0 / width), want_scale) << "block at " << r << ", " << c0;
        for (int64_t c = c0; c < c0 + width; ++c) {
          const float xv = x[r * cols + c];
          const uint8_t code = q.code(r, c);
          const float y = xv * inv;
          ASSERT_EQ(code, std::isnan(xv) ? 0x7 : cpu::E2m1FromFloat(y)) << r << ", " << c;
          if (bamax == 0.0f) {
            ASSERT_EQ(want_scale, 0);
            ASSERT_EQ(code & 0x7, 0);
          }
          if (!std::isfinite(xv)) continue;
          const float d = dq[r * cols + c];
          if (p.format == Format::kNvfp4 && want_scale == 0x00) {
            ASSERT_EQ(d, 0.0f) << "scale 0 dequantizes to 0 at " << r << ", " << c;
            continue;
          }
          if (!normal_scale) continue;
          // Saturation is bounded by the scale's rounding: E4M3 1/16, RCEIL none.
          ASSERT_LE(std::fabs(y), 6.0 * (p.format == Format::kNvfp4 ? 1.0625 : 1.0) * (1 + 1e-6))
              << r << ", " << c;
          const double bound =
              GridHalfStep(std::fabs(y)) / inv * (1 + 1e-6) + std::fabs(double(d)) * 1e-6;
          ASSERT_LE(std::fabs(double(d) - xv), bound) << r << ", " << c << " x " << xv;
          ++bounded;
        }
      }
    }
  }
  // Non-vacuity per range.
  switch (p.range) {
    case Range::kZeros:
      EXPECT_EQ(q.scales, std::vector<uint8_t>(q.scales.size(), 0));
      break;
    case Range::kNormal:
    case Range::kHeavyTails:
    case Range::kNearMax:
      EXPECT_GT(bounded, rows * cols / 2);
      break;
    case Range::kCallerAmaxBelowData:
      if (p.format == Format::kNvfp4) {
        // Every scale saturates at 448 and every element beyond the given amax is +-6.
        EXPECT_EQ(q.scales, std::vector<uint8_t>(q.scales.size(), 0x7E));
        for (int64_t i = 0; i < rows * cols; ++i)
          if (std::fabs(x[i]) > 1.0f) ASSERT_EQ(q.code(i / cols, i % cols) & 0x7, 0x7);
      }
      break;
    default:
      break;
  }
}

class ShapesTest : public ::testing::TestWithParam<ShapeCase> {};

TEST_P(ShapesTest, FollowsTheRecipe) {
  const ShapeCase& p = GetParam();
  CheckQuantization(p, Generate(p.range, static_cast<size_t>(p.rows * p.cols),
                                static_cast<uint32_t>(p.rows * 131 + p.cols)));
}

std::vector<ShapeCase> AllCases() {
  std::vector<ShapeCase> cases;
  const Range ranges[] = {Range::kZeros,
                          Range::kSubnormals,
                          Range::kNearMax,
                          Range::kBeyondMax,
                          Range::kCallerAmaxBelowData,
                          Range::kNanInf,
                          Range::kHeavyTails,
                          Range::kNormal};
  struct Shape {
    int64_t rows, cols;
    Format format;
    BlockShape block;
  };
  const Shape shapes[] = {{1, 16, Format::kNvfp4, BlockShape::k1x16},
                          {7, 48, Format::kNvfp4, BlockShape::k1x16},
                          {217, 256, Format::kNvfp4, BlockShape::k1x16},
                          {48, 64, Format::kNvfp4, BlockShape::k16x16},
                          {217, 256, Format::kMxfp4, BlockShape::k1x32}};
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (const Shape& s : shapes) {
      for (Range r : ranges) {
        if (s.format == Format::kMxfp4 && r == Range::kCallerAmaxBelowData) continue;
        cases.push_back({dtype, s.rows, s.cols, s.format, s.block, r});
      }
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Awkward, ShapesTest, ::testing::ValuesIn(AllCases()), CaseName);

TEST(LargeShapeTest, Rows4096Cols4096Once) {
  const int64_t n = 4096;
  std::vector<float> x = testing::Normal(static_cast<size_t>(n * n), 91);
  x[12345] = 50.0f;
  x[777777] = std::nanf("");
  x[n * n - 1] = -kInf * 0.0f;  // NaN as well (-inf * 0)
  CheckQuantization(ShapeCase{DType::kF32, n, n, Format::kNvfp4, BlockShape::k1x16, Range::kNormal},
                    x);
}

}  // namespace
}  // namespace fp4q::kernels
