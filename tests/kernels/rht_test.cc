// The random Hadamard transform (NUMERICS 6): hand-computed transforms with the default signs,
// the inverse, bf16 rounding, and its effect on quantization error.
#include <cmath>
#include <cstdint>
#include <vector>

#include "cpu/formats.h"
#include "fp4q/kernels/backend.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/test_util.h"

namespace fp4q::kernels {
namespace {

using testing::F32Out;
using testing::F32View;

std::vector<float> Transform(const std::vector<float>& in, int64_t rows, int64_t cols, RhtMode mode,
                             bool inverse, uint64_t seed = 0) {
  auto backend = CreateCpuBackend();
  std::vector<float> out(in.size(), std::nanf(""));
  const absl::Status s =
      backend->Rht(F32View(in, rows, cols), mode, seed, inverse, F32Out(&out, rows, cols), nullptr);
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

// Default signs s = + + + - + - - - - - - + - + - - (bit i set where s_i = -1: 0xD7E8).
// Computed by hand: v'_j = 0.25 * sum_i s_i H[i][j] v_i, H[i][j] = (-1)^popcount(i & j).
TEST(RhtTest, DefaultSignsOnHandComputedVectors) {
  // v = e_3: s_3 = -1, so v'_j = -0.25 * (-1)^popcount(3 & j): -, +, +, - repeating.
  std::vector<float> e3(16, 0.0f);
  e3[3] = 1.0f;
  const std::vector<float> want_e3 = {-0.25f, 0.25f, 0.25f, -0.25f, -0.25f, 0.25f, 0.25f, -0.25f,
                                      -0.25f, 0.25f, 0.25f, -0.25f, -0.25f, 0.25f, 0.25f, -0.25f};
  EXPECT_EQ(Transform(e3, 1, 16, RhtMode::kDefaultSigns, false), want_e3);

  // v = 2 e_0 + 4 e_5: s_0 = +1, s_5 = -1, so v'_j = 0.5 - (-1)^popcount(5 & j).
  std::vector<float> two(16, 0.0f);
  two[0] = 2.0f;
  two[5] = 4.0f;
  const std::vector<float> half = {-0.5f, 1.5f, -0.5f, 1.5f, 1.5f, -0.5f, 1.5f, -0.5f};
  std::vector<float> want_two = half;
  want_two.insert(want_two.end(), half.begin(), half.end());
  EXPECT_EQ(Transform(two, 1, 16, RhtMode::kDefaultSigns, false), want_two);

  // v = all ones: v'_j = 0.25 * sum_i s_i H[i][j]. j = 0: (6 - 10) / 4 = -1. j = 1: even i sum
  // to 3 - 5 = -2, odd i to 3 - 5 = -2, so (-2 - (-2)) / 4 = 0. j = 8: i < 8 sum to 0, i >= 8
  // to 2 - 6 = -4, so (0 - (-4)) / 4 = 1. The transform keeps the norm: sum v'^2 = 16.
  const std::vector<float> ones(16, 1.0f);
  const std::vector<float> t = Transform(ones, 1, 16, RhtMode::kDefaultSigns, false);
  EXPECT_EQ(t[0], -1.0f);
  EXPECT_EQ(t[1], 0.0f);
  EXPECT_EQ(t[8], 1.0f);
  double norm = 0;
  for (float v : t) norm += v * v;
  EXPECT_EQ(norm, 16.0);

  // Groups are independent and aligned: [e_3 | 2 e_0 + 4 e_5] in one row of 32.
  std::vector<float> row = e3;
  row.insert(row.end(), two.begin(), two.end());
  std::vector<float> want_row = want_e3;
  want_row.insert(want_row.end(), want_two.begin(), want_two.end());
  EXPECT_EQ(Transform(row, 1, 32, RhtMode::kDefaultSigns, false), want_row);
}

TEST(RhtTest, InverseRestoresTheInputWithinF32Rounding) {
  const int64_t rows = 7, cols = 48;
  const std::vector<float> x = testing::Normal(rows * cols, 11, 3.0f);
  for (RhtMode mode : {RhtMode::kDefaultSigns, RhtMode::kSeeded}) {
    const std::vector<float> y = Transform(x, rows, cols, mode, false, 77);
    EXPECT_NE(y, x);
    const std::vector<float> back = Transform(y, rows, cols, mode, true, 77);
    for (size_t i = 0; i < x.size(); ++i) {
      // Each output is a sum of 16 terms; 8 roundings of relative 2^-24 on values of the
      // group's scale (|x| up to ~12 here).
      EXPECT_NEAR(back[i], x[i], 2e-5f) << "element " << i;
    }
    // The seeded signs differ from the default ones.
    if (mode == RhtMode::kSeeded) {
      EXPECT_NE(y, Transform(x, rows, cols, RhtMode::kDefaultSigns, false));
    }
  }
}

TEST(RhtTest, Bf16OutputIsTheRoundedF32Transform) {
  // bf16 inputs near 0.3, 0.6, ..., 4.8: the f32 transform, then RN to bf16.
  std::vector<float> x(16);
  std::vector<uint16_t> xb(16);
  for (int i = 0; i < 16; ++i) {
    xb[i] = cpu::FloatToBf16(static_cast<float>(i + 1) * 0.3f);
    x[i] = cpu::Bf16ToFloat(xb[i]);  // the f32 value of each bf16 input
  }
  const std::vector<float> f32 = Transform(x, 1, 16, RhtMode::kDefaultSigns, false);
  auto backend = CreateCpuBackend();
  std::vector<uint16_t> out(16, 0xFFFF);
  MutTensor out_view{out.data(), DType::kBF16, 1, 16, out.size() * 2};
  ASSERT_TRUE(
      backend
          ->Rht(testing::Bf16View(xb, 1, 16), RhtMode::kDefaultSigns, 0, false, out_view, nullptr)
          .ok());
  int inexact = 0;
  for (int i = 0; i < 16; ++i) {
    EXPECT_EQ(out[i], cpu::FloatToBf16(f32[i])) << i;
    if (cpu::Bf16ToFloat(out[i]) != f32[i]) ++inexact;
  }
  EXPECT_GT(inexact, 0) << "the case should exercise bf16 rounding";
}

// Quantization MSE of x in the original domain, with and without RHT.
double QuantMse(const std::vector<float>& x, int64_t rows, int64_t cols, bool rht) {
  auto backend = CreateCpuBackend();
  QuantizeOptions o;
  o.rht = rht ? RhtMode::kDefaultSigns : RhtMode::kOff;
  testing::OwnedQuantized q(Format::kNvfp4, BlockShape::k1x16, ScaleLayout::kPlain, rows, cols);
  EXPECT_TRUE(testing::QuantizeInto(*backend, F32View(x, rows, cols), o, &q).ok());
  std::vector<float> dq(x.size());
  EXPECT_TRUE(backend->Dequantize(q.cview(), F32Out(&dq, rows, cols), nullptr).ok());
  if (rht) dq = Transform(dq, rows, cols, RhtMode::kDefaultSigns, /*inverse=*/true);
  double se = 0;
  for (size_t i = 0; i < x.size(); ++i) se += (double(dq[i]) - x[i]) * (double(dq[i]) - x[i]);
  return se / x.size();
}

TEST(RhtTest, LowersQuantizationErrorOnDataWithOutliers) {
  // Normal data with two extreme outliers (2^20 and -2^19). The outlier sets the global amax,
  // so without the transform the ordinary blocks' scales u = 448 * bamax / amax fall below
  // E4M3's smallest step and those blocks dequantize to 0. The transform spreads each outlier
  // over its group of 16, dividing the amax by 4, and the ordinary blocks keep their scales.
  // (Measured: plain MSE 0.60, with RHT 0.016. With moderate outliers, up to ~100x, the
  // 16-point transform does not lower the element-wise MSE: its groups are the blocks.)
  const int64_t rows = 256, cols = 256;
  std::vector<float> x = testing::Normal(rows * cols, 5);
  x[1000] = 1048576.0f;
  x[40000] = -524288.0f;
  const double plain = QuantMse(x, rows, cols, false);
  const double with_rht = QuantMse(x, rows, cols, true);
  EXPECT_GT(plain, 0.3);
  EXPECT_LT(with_rht, 0.1 * plain) << "plain " << plain << " rht " << with_rht;
}

}  // namespace
}  // namespace fp4q::kernels
