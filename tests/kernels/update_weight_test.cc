// UpdateWeight (DESIGN "Numerics decisions"): the documented operation order, with and without
// a residual, gradient and delta, RTN and SR, 1x16 and 16x16.
#include <cstdint>
#include <vector>

#include "fp4q/kernels/backend.h"
#include "gtest/gtest.h"
#include "kernels/test_util.h"

namespace fp4q::kernels {
namespace {

using testing::F32Out;
using testing::F32View;
using testing::OwnedQuantized;

struct UpdateCase {
  BlockShape block;
  Rounding rounding;
  UpdateKind kind;
  bool residual;
  ScaleLayout layout;
};

class UpdateWeightTest : public ::testing::TestWithParam<UpdateCase> {};

TEST_P(UpdateWeightTest, FollowsTheDocumentedOrder) {
  const UpdateCase p = GetParam();
  auto backend = CreateCpuBackend();
  const int64_t rows = 32, cols = 48;
  const std::vector<float> w0 = testing::Normal(rows * cols, 61, 0.5f);
  const std::vector<float> g = testing::Normal(rows * cols, 62, 2.0f);
  const float lr = 0.01f;
  QuantizeOptions o;
  o.block = p.block;
  o.rounding = p.rounding;
  o.seed = 99;
  o.step = 7;
  o.scale_layout = p.layout;
  OwnedQuantized w(Format::kNvfp4, p.block, p.layout, rows, cols);
  ASSERT_TRUE(testing::QuantizeInto(*backend, F32View(w0, rows, cols), o, &w).ok());
  std::vector<float> r(rows * cols);
  for (size_t i = 0; i < r.size(); ++i) r[i] = 0.001f * static_cast<float>(i % 7) - 0.003f;

  // Expected, step by step through the public API:
  // d = DQ(W); x = RN(d - RN(lr * g)) or RN(d + g); v = RN(x + r) or x; W' = Q(v); r' = RN(v -
  // DQ(W')).
  std::vector<float> d(rows * cols);
  ASSERT_TRUE(backend->Dequantize(w.cview(), F32Out(&d, rows, cols), nullptr).ok());
  std::vector<float> v(rows * cols);
  for (size_t i = 0; i < v.size(); ++i) {
    float x;
    if (p.kind == UpdateKind::kGradient) {
      const float step = lr * g[i];
      x = d[i] - step;
    } else {
      x = d[i] + g[i];
    }
    v[i] = p.residual ? x + r[i] : x;
  }
  OwnedQuantized want(Format::kNvfp4, p.block, p.layout, rows, cols);
  ASSERT_TRUE(testing::QuantizeInto(*backend, F32View(v, rows, cols), o, &want).ok());
  std::vector<float> want_dq(rows * cols);
  ASSERT_TRUE(backend->Dequantize(want.cview(), F32Out(&want_dq, rows, cols), nullptr).ok());

  std::vector<float> got_r = r;
  std::vector<float> got_dq(rows * cols, std::nanf(""));
  MutTensor dq_out = F32Out(&got_dq, rows, cols);
  ASSERT_TRUE(backend
                  ->UpdateWeight(w.view, p.residual ? got_r.data() : nullptr,
                                 F32View(g, rows, cols), lr, p.kind, o, &dq_out, nullptr)
                  .ok());
  EXPECT_EQ(w.codes, want.codes);
  EXPECT_EQ(w.scales, want.scales);
  EXPECT_EQ(w.global, want.global);
  EXPECT_EQ(got_dq, want_dq);
  if (p.residual) {
    for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(got_r[i], v[i] - want_dq[i]) << i;
  }
  // The update moved the weight.
  EXPECT_NE(want_dq, d);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, UpdateWeightTest,
    ::testing::Values(UpdateCase{BlockShape::k1x16, Rounding::kNearest, UpdateKind::kGradient,
                                 false, ScaleLayout::kPlain},
                      UpdateCase{BlockShape::k1x16, Rounding::kNearest, UpdateKind::kGradient, true,
                                 ScaleLayout::kPlain},
                      UpdateCase{BlockShape::k16x16, Rounding::kStochastic, UpdateKind::kGradient,
                                 true, ScaleLayout::kSwizzled},
                      UpdateCase{BlockShape::k1x16, Rounding::kStochastic, UpdateKind::kDelta,
                                 false, ScaleLayout::kPlain},
                      UpdateCase{BlockShape::k16x16, Rounding::kNearest, UpdateKind::kDelta, true,
                                 ScaleLayout::kPlain}));

TEST(UpdateWeightTest, SmallStepsAccumulateThroughTheResidual) {
  // A weight of 2.0 (exact) updated by +0.03 per step: without a residual RTN never moves it
  // (0.03 is far below half a grid step); with one it climbs, 10 steps giving about 2.3.
  auto backend = CreateCpuBackend();
  std::vector<float> w0(16, 0.0f);
  w0[0] = 2.0f;
  w0[1] = 6.0f;  // fixes the block scale at 1 (with amax 6: S_enc 448)
  std::vector<float> u(16, 0.0f);
  u[0] = 0.03f;
  for (bool with_residual : {false, true}) {
    OwnedQuantized w(Format::kNvfp4, BlockShape::k1x16, ScaleLayout::kPlain, 1, 16);
    ASSERT_TRUE(testing::QuantizeInto(*backend, F32View(w0, 1, 16), QuantizeOptions(), &w).ok());
    std::vector<float> r(16, 0.0f);
    std::vector<float> dq(16);
    MutTensor out = F32Out(&dq, 1, 16);
    for (int step = 0; step < 10; ++step) {
      ASSERT_TRUE(backend
                      ->UpdateWeight(w.view, with_residual ? r.data() : nullptr, F32View(u, 1, 16),
                                     0.0f, UpdateKind::kDelta, QuantizeOptions(), &out, nullptr)
                      .ok());
    }
    if (with_residual) {
      // DQ(W) + r tracks the exact value 2 + 0.03 * steps.
      EXPECT_NEAR(dq[0] + r[0], 2.3f, 1e-5f);
    } else {
      EXPECT_NEAR(dq[0], 2.0f, 1e-6f);
    }
  }
}

}  // namespace
}  // namespace fp4q::kernels
