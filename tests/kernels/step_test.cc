// The CPU reference of the optimizer step (NUMERICS 10) against the independent reference of
// step_test_util.h over optimizers x state dtypes x scaling x rounding x blocks x error
// feedback x ranks, three steps each; and hand-computed values of the optimizers' moments and
// the statistics.
#include "fp4q/kernels/step.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "fp4q/kernels/backend.h"
#include "gtest/gtest.h"
#include "kernels/step_test_util.h"
#include "testing/status_matchers.h"

namespace fp4q::kernels {
namespace {

using step_testing::MakeItem;
using step_testing::MakeState;
using step_testing::MakeUpdates;
using step_testing::ReferenceStep;
using step_testing::RunStep;
using step_testing::SameState;
using step_testing::kSweepOptimizers;
using step_testing::StepCase;
using step_testing::SweepHyper;
using step_testing::SweepOptimizer;
using step_testing::StepState;
using step_testing::Updates;

// Every combination the kernels template over, and the cheap choices spread over them.
std::vector<StepCase> SweepCases() {
  std::vector<StepCase> out;
  int id = 0;
  for (const SweepOptimizer& opt : kSweepOptimizers) {
    for (StateDType dtype : {StateDType::kF32, StateDType::kBF16, StateDType::kNvfp4}) {
      const bool stateless = opt.kind == OptimizerKind::kSgd && !opt.momentum;
      if (stateless && dtype != StateDType::kF32) continue;
      for (Scaling scaling : {Scaling::kCurrent, Scaling::kDelayed}) {
        for (BlockShape block : {BlockShape::k1x16, BlockShape::k16x16}) {
          for (Rounding rounding : {Rounding::kNearest, Rounding::kStochastic}) {
            for (bool ef : {false, true}) {
              ++id;
              StepCase c;
              c.opt = opt.kind;
              c.momentum = opt.momentum;
              c.amsgrad = opt.amsgrad;
              c.dtype = dtype;
              c.scaling = scaling;
              c.block = block;
              c.rounding = rounding;
              c.residual = ef;
              c.kind = opt.delta ? UpdateKind::kDelta : UpdateKind::kGradient;
              // Shapes: 16x16 needs rows % 16 == 0; 1x16 also runs odd ones.
              if (block == BlockShape::k1x16) {
                c.rows = id % 3 == 0 ? 1 : (id % 3 == 1 ? 7 : 32);
                c.cols = id % 3 == 0 ? 16 : 48;
              } else {
                c.rows = id % 2 ? 16 : 32;
                c.cols = id % 2 ? 48 : 64;
              }
              c.layout = id % 5 == 4 ? ScaleLayout::kSwizzled : ScaleLayout::kPlain;
              const int ranks = 1 + id % 3;
              c.update_dtypes.clear();
              for (int k = 0; k < ranks; ++k) {
                c.update_dtypes.push_back((id + k) % 2 ? DType::kBF16 : DType::kF32);
              }
              c.out_dtypes = id % 4 == 0   ? std::vector<DType>{}
                             : id % 4 == 1 ? std::vector<DType>{DType::kF32}
                             : id % 4 == 2 ? std::vector<DType>{DType::kBF16}
                                           : std::vector<DType>{DType::kF32, DType::kBF16};
              c.hyper = SweepHyper(opt, id);
              c.seed = 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(id);
              out.push_back(c);
            }
          }
        }
      }
    }
  }
  return out;
}

class StepSweepTest : public ::testing::TestWithParam<StepCase> {};

TEST_P(StepSweepTest, MatchesTheReferenceOverThreeSteps) {
  StepCase c = GetParam();
  auto cpu = CreateCpuBackend();
  StepState st = MakeState(*cpu, c, 17);
  for (int t = 1; t <= 3; ++t) {
    SCOPED_TRACE(absl::StrCat("step ", t));
    c.hyper.t = t;
    c.step = 100 + static_cast<uint64_t>(t);
    const Updates u = MakeUpdates(c, 1000 + t);
    StepState want = st;
    ReferenceStep(*cpu, c, u, &want);
    step_testing::PoisonOutputs(&st);
    StepReport report;
    FP4Q_ASSERT_OK(RunStep(*cpu, {MakeItem(c, &st, u)}, &report));
    ASSERT_TRUE(report.ok);
    EXPECT_EQ(report.items[0].outcome, StepOutcome::kOk);
    EXPECT_EQ(report.items[0].amax, want.weight.global[0]);
    EXPECT_TRUE(SameState(st, want));
  }
  // The weight moved.
  EXPECT_NE(st.weight.codes, MakeState(*cpu, c, 17).weight.codes);
}

INSTANTIATE_TEST_SUITE_P(Cases, StepSweepTest, ::testing::ValuesIn(SweepCases()),
                         [](const ::testing::TestParamInfo<StepCase>& info) {
                           return absl::StrCat(info.index, "_", info.param.Name());
                         });

// ---------------------------------------------------------------- hand-computed values

// A 1x16 item of f32 state with the given optimizer, one f32 update of all `g`.
struct Single {
  StepCase c;
  StepState st;
  std::unique_ptr<Backend> cpu = CreateCpuBackend();
  explicit Single(StepCase in) : c(std::move(in)) {
    c.rows = 1;
    c.cols = 16;
    c.out_dtypes = {DType::kF32};
    st = MakeState(*cpu, c, 3);
  }
  // One step with every update element `g`; returns DQ(W) before the step.
  std::vector<float> Step(float g, int64_t t) {
    c.hyper.t = t;
    std::vector<float> before(16);
    QuantizedTensor w = MakeItem(c, &st, {}).weight;
    EXPECT_TRUE(
        cpu->Dequantize(AsConst(w), MutTensor{before.data(), DType::kF32, 1, 16, 64}, nullptr)
            .ok());
    Updates u(1, std::vector<uint8_t>(64));
    for (int i = 0; i < 16; ++i) std::memcpy(u[0].data() + 4 * i, &g, 4);
    StepReport report;
    const absl::Status s = RunStep(*cpu, {MakeItem(c, &st, u)}, &report);
    EXPECT_TRUE(s.ok()) << s;
    EXPECT_TRUE(report.ok);
    return before;
  }
  float out(int i) const {
    float f;
    std::memcpy(&f, st.outs[0].data() + 4 * i, 4);
    return f;
  }
  // The stored weight is the quantization of `v` (current scaling: amax max |v|), and the
  // statistics record max |v|.
  void ExpectWeightOf(const std::vector<float>& v) {
    float amax = 0.0f;
    for (float x : v) amax = std::fmax(amax, std::fabs(x));
    StepState want = st;
    QuantizedTensor w = MakeItem(c, &want, {}).weight;
    QuantizeOptions o;
    o.has_amax = true;
    o.amax = amax;
    ASSERT_TRUE(
        cpu->Quantize(ConstTensor{v.data(), DType::kF32, 1, 16}, o, nullptr, &w, nullptr, nullptr)
            .ok());
    EXPECT_EQ(st.weight.codes, want.weight.codes);
    EXPECT_EQ(st.weight.scales, want.weight.scales);
    EXPECT_EQ(st.weight.global, want.weight.global);
    EXPECT_EQ(st.stats[kStatNextAmax], amax);
  }
};

TEST(StepValuesTest, PlainSgdMovesByLrTimesG) {
  // x = RN(d - RN(0.25 * 2)) = d - 0.5 exactly for these d; with EF v = x + r.
  StepCase c;
  c.hyper.lr = 0.25f;
  c.residual = true;
  Single s(c);
  const std::vector<float> r0 = s.st.residual;
  const std::vector<float> d = s.Step(2.0f, 1);
  std::vector<float> v(16);
  for (int i = 0; i < 16; ++i) v[i] = (d[i] - 0.5f) + r0[i];
  s.ExpectWeightOf(v);
  // The residual is what the new weight leaves of v, and its max is recorded.
  float rmax = 0.0f;
  for (int i = 0; i < 16; ++i) {
    EXPECT_EQ(s.st.residual[i], v[i] - s.out(i)) << i;
    rmax = std::fmax(rmax, std::fabs(s.st.residual[i]));
  }
  EXPECT_EQ(s.st.stats[kStatMaxResidual], rmax);
  EXPECT_EQ(s.st.stats[kStatMaxMoment1], 0.0f);  // no state: untouched
}

TEST(StepValuesTest, SgdMomentumBufferAndDampening) {
  StepCase c;
  c.momentum = true;
  c.hyper.lr = 0.0f;  // the weight stays put; the buffer is what we look at
  c.hyper.momentum = 0.5f;
  c.hyper.dampening = 0.5f;
  Single s(c);
  s.Step(2.0f, 1);
  EXPECT_EQ(s.st.m_f32[0][0], 2.0f);  // t = 1: b = g
  s.Step(4.0f, 2);
  EXPECT_EQ(s.st.m_f32[0][5], 3.0f);  // 0.5 * 2 + (1 - 0.5) * 4
  s.Step(-8.0f, 3);
  EXPECT_EQ(s.st.m_f32[0][15], -2.5f);  // 0.5 * 3 + 0.5 * -8
  EXPECT_EQ(s.st.stats[kStatMaxMoment1], 2.5f);
}

TEST(StepValuesTest, SgdNesterovAndWeightDecayMoveTheWeightByTheDocumentedAmount) {
  StepCase c;
  c.momentum = true;
  c.hyper.lr = 0.125f;
  c.hyper.momentum = 0.5f;
  c.hyper.nesterov = true;
  c.hyper.weight_decay = 0.25f;
  c.residual = true;
  Single s(c);
  std::vector<float> r0 = s.st.residual;
  const std::vector<float> d = s.Step(1.0f, 1);
  std::vector<float> v(16);
  for (int i = 0; i < 16; ++i) {
    // g' = g + wd * (d + r); b = g'; step = g' + mu * b; v = (d - lr * step) + r.
    const float p = d[i] + r0[i];
    const float gp = 1.0f + 0.25f * p;
    EXPECT_EQ(s.st.m_f32[0][i], gp) << i;
    v[i] = (d[i] - 0.125f * (gp + 0.5f * gp)) + r0[i];
  }
  s.ExpectWeightOf(v);
}

TEST(StepValuesTest, AdamWFirstStepMovesByLr) {
  // b1 = 0.5, b2 = 0.75, g = 2 at t = 1: m = 1, v = 1, sqrt(1 - b2) = 0.5, den = 2 + eps = 2
  // (eps below half an ulp of 2), m / den = 0.5, alpha = lr / (1 - b1) = 0.5: x = d - 0.25.
  StepCase c;
  c.opt = OptimizerKind::kAdamW;
  c.hyper.lr = 0.25f;
  c.hyper.beta1 = 0.5f;
  c.hyper.beta2 = 0.75f;
  c.hyper.eps = 1e-8f;
  c.residual = true;
  Single s(c);
  const std::vector<float> r0 = s.st.residual;
  const std::vector<float> d = s.Step(2.0f, 1);
  std::vector<float> v(16);
  for (int i = 0; i < 16; ++i) {
    EXPECT_EQ(s.st.m_f32[0][i], 1.0f);
    EXPECT_EQ(s.st.m_f32[1][i], 1.0f);
    v[i] = (d[i] - 0.25f) + r0[i];
  }
  s.ExpectWeightOf(v);
  EXPECT_EQ(s.st.stats[kStatMaxMoment1], 1.0f);
  EXPECT_EQ(s.st.stats[kStatMaxSqrtMoment2], 1.0f);
}

TEST(StepValuesTest, AdamWAmsgradKeepsTheLargestSecondMoment) {
  StepCase c;
  c.opt = OptimizerKind::kAdamW;
  c.amsgrad = true;
  c.hyper.lr = 0.0f;
  c.hyper.beta1 = 0.5f;
  c.hyper.beta2 = 0.5f;
  Single s(c);
  s.Step(4.0f, 1);  // v = 0.5 * 16 = 8
  EXPECT_EQ(s.st.m_f32[1][0], 8.0f);
  EXPECT_EQ(s.st.m_f32[2][0], 8.0f);
  s.Step(0.0f, 2);  // v = 4, max v stays 8
  EXPECT_EQ(s.st.m_f32[1][3], 4.0f);
  EXPECT_EQ(s.st.m_f32[2][3], 8.0f);
  EXPECT_EQ(s.st.stats[kStatMaxSqrtMoment2], 2.0f);
  EXPECT_EQ(s.st.stats[kStatMaxSqrtMaxMoment2], std::sqrt(8.0f));
}

TEST(StepValuesTest, AdamWDecoupledWeightDecay) {
  // As AdamWFirstStepMovesByLr plus lr * wd * d: x = d - RN(RN(0.25 * 0.5 * d) + 0.25).
  StepCase c;
  c.opt = OptimizerKind::kAdamW;
  c.hyper.lr = 0.25f;
  c.hyper.beta1 = 0.5f;
  c.hyper.beta2 = 0.75f;
  c.hyper.weight_decay = 0.5f;
  c.residual = true;
  Single s(c);
  const std::vector<float> r0 = s.st.residual;
  const std::vector<float> d = s.Step(2.0f, 1);
  std::vector<float> v(16);
  for (int i = 0; i < 16; ++i) {
    const float decay = 0.125f * (d[i] + r0[i]);
    v[i] = (d[i] - (decay + 0.25f)) + r0[i];
  }
  s.ExpectWeightOf(v);
}

TEST(StepValuesTest, RankMeanDividesTheSumInOrder) {
  // Three ranks 1e8, 1, -1e8 (a delta): in rank order (1e8 + 1) rounds to 1e8, so the sum is 0
  // and the weight is re-quantized from v = DQ(W) + 0 + r.
  StepCase c;
  c.kind = UpdateKind::kDelta;
  c.update_dtypes = {DType::kF32, DType::kF32, DType::kF32};
  c.residual = true;
  Single s(c);
  const std::vector<float> r0 = s.st.residual;
  s.c.hyper.t = 1;
  std::vector<float> d(16);
  ASSERT_TRUE(s.cpu
                  ->Dequantize(AsConst(MakeItem(s.c, &s.st, {}).weight),
                               MutTensor{d.data(), DType::kF32, 1, 16, 64}, nullptr)
                  .ok());
  Updates u(3, std::vector<uint8_t>(64));
  const float vals[3] = {1e8f, 1.0f, -1e8f};
  for (int k = 0; k < 3; ++k) {
    for (int i = 0; i < 16; ++i) std::memcpy(u[k].data() + 4 * i, &vals[k], 4);
  }
  StepReport report;
  FP4Q_ASSERT_OK(RunStep(*s.cpu, {MakeItem(s.c, &s.st, u)}, &report));
  ASSERT_TRUE(report.ok);
  EXPECT_EQ(report.fingerprints[0].size(), 3u);
  std::vector<float> v(16);
  for (int i = 0; i < 16; ++i) v[i] = (d[i] + 0.0f) + r0[i];
  s.ExpectWeightOf(v);
}

TEST(StepValuesTest, DelayedScalingUsesTheRecordedAmaxAndSaturates) {
  // The recorded amax 1 is far below this step's values (about 4): they saturate at the
  // largest code, the residual keeps the excess, and NextAmax records the true max |v|.
  StepCase c;
  c.rows = 1;
  c.cols = 16;
  c.kind = UpdateKind::kDelta;
  c.scaling = Scaling::kDelayed;
  c.residual = true;
  auto cpu = CreateCpuBackend();
  StepState st = MakeState(*cpu, c, 8);
  st.stats[kStatNextAmax] = 1.0f;
  std::fill(st.residual.begin(), st.residual.end(), 0.0f);
  st.stats[kStatMaxResidual] = 0.0f;
  Updates u(1, std::vector<uint8_t>(64));
  for (int i = 0; i < 16; ++i) {
    const float x = 4.0f;
    std::memcpy(u[0].data() + 4 * i, &x, 4);
  }
  StepReport report;
  FP4Q_ASSERT_OK(RunStep(*cpu, {MakeItem(c, &st, u)}, &report));
  ASSERT_TRUE(report.ok);
  EXPECT_EQ(report.items[0].amax, 1.0f);
  EXPECT_EQ(st.weight.global[0], 1.0f);
  EXPECT_EQ(st.weight.global[1], 2688.0f);
  float vmax = 0.0f;
  for (int i = 0; i < 16; ++i) {
    float out;
    std::memcpy(&out, st.outs[0].data() + 4 * i, 4);
    EXPECT_LE(std::fabs(out), 1.0001f) << i;  // saturated: DQ never passes the recorded amax
    EXPECT_GT(st.residual[i], 1.0f) << i;     // the excess waits in the residual
    vmax = std::fmax(vmax, std::fabs(out + st.residual[i]));
  }
  EXPECT_NEAR(st.stats[kStatNextAmax], vmax, vmax * 1e-6f);
  EXPECT_GT(st.stats[kStatNextAmax], 3.0f);
}

TEST(StepValuesTest, NullStatsUnderCurrentScalingRecordNothing) {
  StepCase c;
  auto cpu = CreateCpuBackend();
  StepState st = MakeState(*cpu, c, 9);
  const Updates u = MakeUpdates(c, 10);
  StepState want = st;
  ReferenceStep(*cpu, c, u, &want);
  StepItem item = MakeItem(c, &st, u);
  item.stats = nullptr;
  StepReport report;
  FP4Q_ASSERT_OK(RunStep(*cpu, {item}, &report));
  ASSERT_TRUE(report.ok);
  want.stats = st.stats;  // untouched (not passed)
  EXPECT_TRUE(SameState(st, want));
}

TEST(StepValuesTest, Nvfp4SecondMomentNeverRoundsToZero) {
  // One large gradient element fixes the roots' scale; the others' tiny roots would round to
  // code 0 and are stored as code 1 instead (zero-free rounding).
  StepCase c;
  c.opt = OptimizerKind::kAdamW;
  c.dtype = StateDType::kNvfp4;
  c.rows = 1;
  c.cols = 16;
  c.hyper.lr = 0.0f;
  auto cpu = CreateCpuBackend();
  StepState st = MakeState(*cpu, c, 11);
  Updates u(1, std::vector<uint8_t>(64));
  for (int i = 0; i < 16; ++i) {
    const float x = i == 0 ? 1000.0f : 1e-3f;
    std::memcpy(u[0].data() + 4 * i, &x, 4);
  }
  StepReport report;
  FP4Q_ASSERT_OK(RunStep(*cpu, {MakeItem(c, &st, u)}, &report));
  ASSERT_TRUE(report.ok);
  const std::vector<uint8_t>& codes = st.m_q[1].codes;
  EXPECT_EQ(codes[0] & 0xF, 7);  // the largest root: code 6.0
  for (int i = 1; i < 16; ++i) EXPECT_EQ((codes[i / 2] >> (4 * (i % 2))) & 0xF, 1) << i;
  // The first moment has no such rule: its tiny values are 0.
  EXPECT_EQ(st.m_q[0].codes[1], 0);
}

}  // namespace
}  // namespace fp4q::kernels
