// Stochastic rounding (NUMERICS 4) and error feedback (NUMERICS 5) through the CPU backend.
#include <cmath>
#include <cstdint>
#include <vector>

#include "cpu/formats.h"
#include "cpu/philox.h"
#include "fp4q/kernels/backend.h"
#include "gtest/gtest.h"
#include "kernels/test_util.h"

namespace fp4q::kernels {
namespace {

using testing::F32Out;
using testing::F32View;
using testing::OwnedQuantized;

// One block [2.3, 6, 0 x 14]. With the caller amax 2688 the global scale is exactly 1 and the
// block scale E4M3(RN(6 * RN(1 * c6))) = E4M3(1.0) = 1, so y = x exactly and DQ is exact:
// 2.3 lies between the grid values 2 and 3.
std::vector<float> Block23() {
  std::vector<float> x(16, 0.0f);
  x[0] = 2.3f;
  x[1] = 6.0f;
  return x;
}

QuantizeOptions ExactScaleOptions() {
  QuantizeOptions o;
  o.has_amax = true;
  o.amax = 2688.0f;
  return o;
}

TEST(StochasticTest, RoundToNearestGivesTwo) {
  auto backend = CreateCpuBackend();
  const std::vector<float> x = Block23();
  for (bool given_amax : {true, false}) {
    QuantizeOptions o = given_amax ? ExactScaleOptions() : QuantizeOptions();
    OwnedQuantized q(Format::kNvfp4, BlockShape::k1x16, ScaleLayout::kPlain, 1, 16);
    ASSERT_TRUE(testing::QuantizeInto(*backend, F32View(x, 1, 16), o, &q).ok());
    EXPECT_EQ(q.code(0, 0), 0x4);  // 2.0
    EXPECT_EQ(q.code(0, 1), 0x7);  // 6.0
    std::vector<float> dq(16, -1.0f);
    ASSERT_TRUE(backend->Dequantize(q.cview(), F32Out(&dq, 1, 16), nullptr).ok());
    if (given_amax) {
      EXPECT_EQ(q.scale(0, 0), 0x38);  // E4M3 1.0
      EXPECT_EQ(dq[0], 2.0f);
    } else {
      EXPECT_NEAR(dq[0], 2.0f, 1e-6f);
    }
  }
}

TEST(StochasticTest, BitsComeFromPhiloxAtTheElementIndex) {
  auto backend = CreateCpuBackend();
  // x [16, 16] with 2.3 at (1, 0) and 6 at (1, 1) and (0, 0), so row 1 of x and row 0 of x^T
  // (column 0 of x) both have block amax 6. The 2.3 has row-wise index 16; in x^T it is at
  // (0, 1), index 1.
  std::vector<float> x(256, 0.0f);
  x[0] = 6.0f;
  x[16] = 2.3f;
  x[17] = 6.0f;
  // 2.3 rounds up iff r < 19660.796875 (see formats_test).
  int up_rowwise = 0, up_columnwise = 0;
  for (uint64_t step = 0; step < 64; ++step) {
    QuantizeOptions o = ExactScaleOptions();
    o.rounding = Rounding::kStochastic;
    o.seed = 0xC0FFEE;
    o.step = step;
    o.columnwise = true;
    OwnedQuantized row(Format::kNvfp4, BlockShape::k1x16, ScaleLayout::kPlain, 16, 16);
    OwnedQuantized col(Format::kNvfp4, BlockShape::k1x16, ScaleLayout::kPlain, 16, 16);
    ASSERT_TRUE(testing::QuantizeInto(*backend, F32View(x, 16, 16), o, &row, &col).ok());
    const bool want_row_up = cpu::StochasticBits(0xC0FFEE, step, 16) < 19660.796875;
    const bool want_col_up = cpu::StochasticBits(0xC0FFEE, step, 1) < 19660.796875;
    EXPECT_EQ(row.code(1, 0), want_row_up ? 0x5 : 0x4) << "step " << step;
    EXPECT_EQ(col.code(0, 1), want_col_up ? 0x5 : 0x4) << "step " << step;
    up_rowwise += want_row_up;
    up_columnwise += want_col_up;
  }
  // Both outcomes occur over 64 steps, so the check above exercised both branches.
  EXPECT_GT(up_rowwise, 0);
  EXPECT_LT(up_rowwise, 64);
  EXPECT_GT(up_columnwise, 0);
  EXPECT_LT(up_columnwise, 64);
}

TEST(StochasticTest, MeanOfTenThousandDrawsIsUnbiased) {
  auto backend = CreateCpuBackend();
  const std::vector<float> x = Block23();
  double sum = 0;
  int ups = 0;
  for (uint64_t step = 0; step < 10000; ++step) {
    QuantizeOptions o = ExactScaleOptions();
    o.rounding = Rounding::kStochastic;
    o.seed = 42;
    o.step = step;
    std::vector<float> dq(16, -1.0f);
    ASSERT_TRUE(backend->Qdq(F32View(x, 1, 16), o, nullptr, F32Out(&dq, 1, 16), nullptr).ok());
    ASSERT_TRUE(dq[0] == 2.0f || dq[0] == 3.0f) << dq[0];
    ASSERT_EQ(dq[1], 6.0f);  // on the grid: never moves
    sum += dq[0];
    ups += dq[0] == 3.0f;
  }
  EXPECT_NEAR(sum / 10000, 2.3, 0.01);
  EXPECT_GT(ups, 0);
}

TEST(StochasticTest, RoundToNearestWithErrorFeedbackAveragesToTheInput) {
  auto backend = CreateCpuBackend();
  const std::vector<float> x = Block23();
  std::vector<float> residual(16, 0.0f);
  double sum = 0;
  int threes = 0;
  for (int step = 0; step < 1000; ++step) {
    std::vector<float> dq(16, -1.0f);
    ASSERT_TRUE(backend
                    ->Qdq(F32View(x, 1, 16), QuantizeOptions(), residual.data(), F32Out(&dq, 1, 16),
                          nullptr)
                    .ok());
    sum += dq[0];
    threes += dq[0] > 2.5f;
  }
  EXPECT_NEAR(sum / 1000, 2.3, 0.01);
  // Without feedback RTN always gives 2; with it about 30% of the steps give 3.
  EXPECT_NEAR(threes, 300, 15);
  EXPECT_LE(std::fabs(residual[0]), 0.51f);
}

TEST(StochasticTest, FeedbackThroughQuantizeMatchesQdq) {
  auto backend = CreateCpuBackend();
  const std::vector<float> x = testing::Normal(7 * 48, 3);
  std::vector<float> r1(x.size(), 0.0f), r2(x.size(), 0.0f);
  for (int step = 0; step < 5; ++step) {
    const std::vector<float> r_previous = r1;
    OwnedQuantized q(Format::kNvfp4, BlockShape::k1x16, ScaleLayout::kPlain, 7, 48);
    ASSERT_TRUE(testing::QuantizeInto(*backend, F32View(x, 7, 48), QuantizeOptions(), &q, nullptr,
                                      r1.data())
                    .ok());
    std::vector<float> dq1(x.size()), dq2(x.size());
    ASSERT_TRUE(backend->Dequantize(q.cview(), F32Out(&dq1, 7, 48), nullptr).ok());
    ASSERT_TRUE(
        backend->Qdq(F32View(x, 7, 48), QuantizeOptions(), r2.data(), F32Out(&dq2, 7, 48), nullptr)
            .ok());
    EXPECT_EQ(dq1, dq2);
    EXPECT_EQ(r1, r2);
    // r = RN(v - DQ) with v = RN(x + r_previous), element by element.
    for (size_t i = 0; i < x.size(); ++i) {
      const float v = x[i] + r_previous[i];
      ASSERT_EQ(r1[i], v - dq1[i]) << "step " << step << " element " << i;
    }
  }
  EXPECT_NE(r1, std::vector<float>(x.size(), 0.0f));
}

// Per-element mean of DQ - x over `draws` SR draws (steps 0..draws-1).
std::vector<double> MeanSignedError(const std::vector<float>& x, int64_t rows, int64_t cols,
                                    int draws) {
  auto backend = CreateCpuBackend();
  std::vector<double> sum(x.size(), 0.0);
  std::vector<float> dq(x.size());
  for (int step = 0; step < draws; ++step) {
    QuantizeOptions o;
    o.rounding = Rounding::kStochastic;
    o.seed = 7;
    o.step = static_cast<uint64_t>(step);
    EXPECT_TRUE(
        backend->Qdq(F32View(x, rows, cols), o, nullptr, F32Out(&dq, rows, cols), nullptr).ok());
    for (size_t i = 0; i < x.size(); ++i) sum[i] += static_cast<double>(dq[i]) - x[i];
  }
  for (double& s : sum) s /= draws;
  return sum;
}

TEST(StochasticTest, MeanSignedErrorShrinksLikeInverseSqrtOfDraws) {
  const int64_t rows = 32, cols = 64;
  const std::vector<float> x = testing::Normal(rows * cols, 21);
  // The block scales are round-to-nearest (the same in every draw). Where E4M3 rounded a
  // block's scale down, its largest elements map above 6 and saturate: a deterministic
  // clipping error that no number of draws removes. Those elements are checked separately.
  auto backend = CreateCpuBackend();
  OwnedQuantized q(Format::kNvfp4, BlockShape::k1x16, ScaleLayout::kPlain, rows, cols);
  ASSERT_TRUE(testing::QuantizeInto(*backend, F32View(x, rows, cols), QuantizeOptions(), &q).ok());
  const double s_dec = 1.0 / q.global[1];
  std::vector<bool> clipped(x.size());
  int n_clipped = 0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const double limit = 6.0 * cpu::E4m3ToFloat(q.scale(r, c / 16)) * s_dec;
      const size_t i = static_cast<size_t>(r * cols + c);
      clipped[i] = std::fabs(x[i]) > limit * (1 - 1e-6);
      n_clipped += clipped[i];
    }
  }
  ASSERT_GT(n_clipped, 0);
  ASSERT_LT(n_clipped, 200);

  const int draws[] = {16, 64, 256, 1024};
  double rms[4];
  for (int d = 0; d < 4; ++d) {
    const std::vector<double> mean = MeanSignedError(x, rows, cols, draws[d]);
    double sq = 0;
    int n = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      if (clipped[i]) {
        // Saturated in every draw: the error is the same each time, below the 6.25% of E4M3's
        // scale rounding.
        EXPECT_LT(std::fabs(mean[i]), 0.0625 * std::fabs(x[i])) << "element " << i;
        continue;
      }
      sq += mean[i] * mean[i];
      ++n;
    }
    rms[d] = std::sqrt(sq / n);
  }
  for (int d = 1; d < 4; ++d) {
    // 4x the draws: 2x smaller, within sampling noise over ~2000 elements.
    const double ratio = rms[d - 1] / rms[d];
    EXPECT_GT(ratio, 1.8) << draws[d - 1] << " -> " << draws[d] << ": " << rms[d - 1] << " "
                          << rms[d];
    EXPECT_LT(ratio, 2.2) << draws[d - 1] << " -> " << draws[d] << ": " << rms[d - 1] << " "
                          << rms[d];
  }
}

}  // namespace
}  // namespace fp4q::kernels
