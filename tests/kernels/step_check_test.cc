// The step's check (NUMERICS 10.4) on the CPU backend: every refusal names what it found and
// leaves every byte of every item unchanged; a batch is applied whole or not at all; check-only
// items compare fingerprints (10.7, known answers); UpdateWeight is a one-item step.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "fp4q/kernels/backend.h"
#include "fp4q/kernels/step.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/step_test_util.h"
#include "kernels/test_util.h"
#include "testing/status_matchers.h"

namespace fp4q::kernels {
namespace {

using ::fp4q::testing::StatusIs;
using step_testing::Batch;
using step_testing::MakeBatch;
using step_testing::MakeItem;
using step_testing::MakeState;
using step_testing::MakeUpdates;
using step_testing::ReferenceFingerprint;
using step_testing::ReferenceStep;
using step_testing::RunStep;
using step_testing::SameState;
using step_testing::Set;
using step_testing::SetAll;
using step_testing::StepCase;
using step_testing::StepState;
using step_testing::Updates;
using ::testing::HasSubstr;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// One item's refusal: runs the step and checks that nothing changed.
StepItemReport Refused(const StepCase& c, StepState* st, const Updates& u) {
  auto cpu = CreateCpuBackend();
  const StepState before = *st;
  StepReport report;
  const absl::Status s = RunStep(*cpu, {MakeItem(c, st, u)}, &report);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_FALSE(report.ok);
  EXPECT_TRUE(SameState(*st, before));
  return report.items.empty() ? StepItemReport() : report.items[0];
}

class StepCheckTest : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> cpu_ = CreateCpuBackend();
};

TEST_F(StepCheckTest, NonFiniteUpdateNamesTheFirstRankAndIndex) {
  StepCase c;
  c.update_dtypes = {DType::kF32, DType::kBF16};
  c.residual = true;
  c.out_dtypes = {DType::kBF16};
  StepState st = MakeState(*cpu_, c, 1);
  Updates u = MakeUpdates(c, 2);
  Set(&u, c, 1, 5, kNaN);
  Set(&u, c, 1, 900, kInf);
  StepItemReport r = Refused(c, &st, u);
  EXPECT_EQ(r.outcome, StepOutcome::kNonFiniteUpdate);
  EXPECT_EQ(r.rank, 1);
  EXPECT_EQ(r.index, 5);
  EXPECT_TRUE(std::isnan(r.value));
  // Rank order first, then the smallest index within the rank.
  Set(&u, c, 0, 9, -kInf);
  Set(&u, c, 0, 30, kNaN);
  r = Refused(c, &st, u);
  EXPECT_EQ(r.outcome, StepOutcome::kNonFiniteUpdate);
  EXPECT_EQ(r.rank, 0);
  EXPECT_EQ(r.index, 9);
  EXPECT_EQ(r.value, -kInf);
}

TEST_F(StepCheckTest, OverflowingRankSumIsANonFiniteResult) {
  StepCase c;
  c.update_dtypes = {DType::kF32, DType::kF32};
  StepState st = MakeState(*cpu_, c, 3);
  Updates u = MakeUpdates(c, 4);
  Set(&u, c, 0, 7, 3e38f);
  Set(&u, c, 1, 7, 3e38f);
  Set(&u, c, 0, 8, -3e38f);
  Set(&u, c, 1, 8, -3e38f);
  const StepItemReport r = Refused(c, &st, u);
  EXPECT_EQ(r.outcome, StepOutcome::kNonFiniteResult);
  EXPECT_EQ(r.quantity, StepQuantity::kUpdateSum);
  EXPECT_EQ(r.index, 7);
  EXPECT_EQ(r.value, kInf);
}

TEST_F(StepCheckTest, CurrentScalingRefusesANonFiniteWeight) {
  StepCase c;
  c.hyper.lr = 1e30f;
  StepState st = MakeState(*cpu_, c, 5);
  Updates u = MakeUpdates(c, 6);
  Set(&u, c, 0, 12, 1e10f);
  Set(&u, c, 0, 40, -1e10f);
  const StepItemReport r = Refused(c, &st, u);
  EXPECT_EQ(r.outcome, StepOutcome::kNonFiniteResult);
  EXPECT_EQ(r.quantity, StepQuantity::kWeight);
  EXPECT_EQ(r.index, 12);
  EXPECT_EQ(r.value, -kInf);
}

TEST_F(StepCheckTest, CurrentScalingRefusesANonFiniteMomentBeforeTheWeight) {
  StepCase c;
  c.momentum = true;
  c.hyper.momentum = 0.9f;
  c.hyper.lr = 0.1f;
  c.hyper.t = 2;
  StepState st = MakeState(*cpu_, c, 7);
  st.m_f32[0][4] = 3e38f;
  st.m_f32[0][2] = -3e38f;
  Updates u = MakeUpdates(c, 8);
  Set(&u, c, 0, 4, 1e38f);   // 0.9 * 3e38 + 1e38 overflows: b and x are both Inf here
  Set(&u, c, 0, 2, -1e38f);  // the same, negative, at a smaller index
  StepItemReport r = Refused(c, &st, u);
  EXPECT_EQ(r.outcome, StepOutcome::kNonFiniteResult);
  EXPECT_EQ(r.quantity, StepQuantity::kMoment1);
  EXPECT_EQ(r.index, 2);
  EXPECT_EQ(r.value, -kInf);

  StepCase a;
  a.opt = OptimizerKind::kAdamW;
  a.amsgrad = true;
  a.dtype = StateDType::kBF16;
  StepState sa = MakeState(*cpu_, a, 9);
  Updates ua = MakeUpdates(a, 10);
  Set(&ua, a, 0, 20, 2e21f);  // (1 - 0.999) * g * g overflows
  r = Refused(a, &sa, ua);
  EXPECT_EQ(r.outcome, StepOutcome::kNonFiniteResult);
  EXPECT_EQ(r.quantity, StepQuantity::kMoment2);
  EXPECT_EQ(r.index, 20);
  EXPECT_EQ(r.value, kInf);
}

TEST_F(StepCheckTest, CurrentScalingRefusesADequantizedRangePast2To127) {
  StepCase c;
  c.kind = UpdateKind::kDelta;
  StepState st = MakeState(*cpu_, c, 11);
  Updates u = MakeUpdates(c, 12);
  Set(&u, c, 0, 33, 2e38f);
  StepItemReport r = Refused(c, &st, u);
  EXPECT_EQ(r.outcome, StepOutcome::kOutOfRange);
  EXPECT_EQ(r.quantity, StepQuantity::kWeight);
  EXPECT_GT(r.amax, 2e38f * 0.999f);
  const float s_enc = std::min(2688.0f / r.amax, std::numeric_limits<float>::max());
  EXPECT_DOUBLE_EQ(r.bound, 2688.0 * static_cast<double>(1.0f / s_enc));
  EXPECT_EQ(r.index, -1);

  // Below 2^127 itself, but the residual could reach twice that.
  c.residual = true;
  StepState se = MakeState(*cpu_, c, 13);
  Set(&u, c, 0, 33, 1e38f);
  r = Refused(c, &se, u);
  EXPECT_EQ(r.outcome, StepOutcome::kOutOfRange);
  EXPECT_EQ(r.quantity, StepQuantity::kResidual);
  EXPECT_GT(r.bound, 1.9e38);
}

TEST_F(StepCheckTest, DelayedScalingRefusesByBound) {
  StepCase c;
  c.scaling = Scaling::kDelayed;
  c.residual = true;
  StepState st = MakeState(*cpu_, c, 14);
  Updates u = MakeUpdates(c, 15);
  // G itself: a finite update of 2e38.
  Set(&u, c, 0, 3, 2e38f);
  StepItemReport r = Refused(c, &st, u);
  EXPECT_EQ(r.outcome, StepOutcome::kOutOfRange);
  EXPECT_EQ(r.quantity, StepQuantity::kUpdateSum);
  EXPECT_DOUBLE_EQ(r.bound, static_cast<double>(2e38f));

  // Xb = Dold + lr * G.
  u = MakeUpdates(c, 15);
  SetAll(&u, c, 0, 2.0f);
  c.hyper.lr = 1e38f;
  r = Refused(c, &st, u);
  EXPECT_EQ(r.outcome, StepOutcome::kOutOfRange);
  EXPECT_EQ(r.quantity, StepQuantity::kWeight);
  const double dold = 2688.0 * static_cast<double>(1.0f / st.weight.global[1]);
  EXPECT_DOUBLE_EQ(r.bound, dold + static_cast<double>(1e38f) * 2.0);

  // The recorded amax must be a usable amax.
  c.hyper.lr = 0.1f;
  st.stats[kStatNextAmax] = kNaN;
  r = Refused(c, &st, u);
  EXPECT_EQ(r.outcome, StepOutcome::kOutOfRange);
  EXPECT_EQ(r.quantity, StepQuantity::kWeight);
  EXPECT_TRUE(std::isnan(r.bound));

  // AdamW: M = b1 * MaxMoment1 + c1 * G.
  StepCase a;
  a.opt = OptimizerKind::kAdamW;
  a.scaling = Scaling::kDelayed;
  StepState sa = MakeState(*cpu_, a, 16);
  sa.stats[kStatMaxMoment1] = 3e38f;
  const Updates ua = MakeUpdates(a, 17);
  r = Refused(a, &sa, ua);
  EXPECT_EQ(r.outcome, StepOutcome::kOutOfRange);
  EXPECT_EQ(r.quantity, StepQuantity::kMoment1);
  EXPECT_GT(r.bound, 2.6e38);
}

TEST_F(StepCheckTest, CheckOnlyItemsCompareFingerprintsAndAreNeverWritten) {
  StepCase c;
  c.update_dtypes = {DType::kBF16, DType::kF32};
  StepState st = MakeState(*cpu_, c, 18);
  const Updates u = MakeUpdates(c, 19);
  StepItem item = MakeItem(c, &st, u);
  item.check_only = true;
  const uint64_t f0 = ReferenceFingerprint(u[0].data(), DType::kBF16, c.rows, c.cols);
  const uint64_t f1 = ReferenceFingerprint(u[1].data(), DType::kF32, c.rows, c.cols);
  item.expect_fingerprints = {f0, f1 ^ 1};
  const StepState before = st;
  StepReport report;
  FP4Q_ASSERT_OK(RunStep(*cpu_, {item}, &report));
  EXPECT_FALSE(report.ok);
  EXPECT_EQ(report.items[0].outcome, StepOutcome::kFingerprintMismatch);
  EXPECT_EQ(report.items[0].rank, 1);
  EXPECT_EQ(report.fingerprints[0], (std::vector<uint64_t>{f0, f1}));
  EXPECT_TRUE(SameState(st, before));

  // Matching fingerprints pass; nothing else is checked (a NaN is fine) and nothing written.
  Updates bad = u;
  Set(&bad, c, 0, 0, kNaN);
  item = MakeItem(c, &st, bad);
  item.check_only = true;
  item.expect_fingerprints = {ReferenceFingerprint(bad[0].data(), DType::kBF16, c.rows, c.cols),
                              f1};
  FP4Q_ASSERT_OK(RunStep(*cpu_, {item}, &report));
  EXPECT_TRUE(report.ok);
  EXPECT_EQ(report.items[0].outcome, StepOutcome::kOk);
  EXPECT_TRUE(SameState(st, before));
}

TEST_F(StepCheckTest, CancelWordHoldingItsTokenRefusesTheWholeBatch) {
  StepCase c;
  c.momentum = true;
  c.residual = true;
  c.hyper.momentum = 0.9f;
  c.update_dtypes = {DType::kBF16};
  c.out_dtypes = {DType::kBF16};
  StepState a = MakeState(*cpu_, c, 30), b = MakeState(*cpu_, c, 31);
  const Updates ua = MakeUpdates(c, 32), ub = MakeUpdates(c, 33);
  const StepState a0 = a, b0 = b;
  const std::vector<StepItem> items = {MakeItem(c, &a, ua), MakeItem(c, &b, ub)};
  const size_t bytes = StepWorkspaceBytes(items);
  std::vector<uint64_t> ws(bytes / 8 + 1);
  uint32_t word = 41;  // another step's token: no effect
  StepReport report;
  auto run = [&](uint32_t token) {
    FP4Q_ASSERT_OK(cpu_->StepCheck(items, ws.data(), bytes, nullptr, StepCancel{&word, token}));
    FP4Q_ASSERT_OK(cpu_->StepApply(items, ws.data(), nullptr));
    FP4Q_ASSERT_OK(cpu_->StepReadReport(items, ws.data(), &report, nullptr));
  };
  word = 41;
  run(7);
  EXPECT_TRUE(report.ok);
  EXPECT_FALSE(report.cancelled);
  StepState want_a = a0, want_b = b0;
  ReferenceStep(*cpu_, c, ua, &want_a);
  ReferenceStep(*cpu_, c, ub, &want_b);
  EXPECT_TRUE(SameState(a, want_a));
  EXPECT_TRUE(SameState(b, want_b));

  // The word holds this step's token: every item refused, nothing written, outputs untouched.
  a = a0;
  b = b0;
  word = 7;
  run(7);
  EXPECT_FALSE(report.ok);
  EXPECT_TRUE(report.cancelled);
  for (const StepItemReport& r : report.items) EXPECT_EQ(r.outcome, StepOutcome::kOk);
  EXPECT_TRUE(SameState(a, a0));
  EXPECT_TRUE(SameState(b, b0));
}

TEST_F(StepCheckTest, FingerprintKnownAnswers) {
  // Values computed from NUMERICS 10.7 by an independent script.
  std::vector<float> a(16);
  for (int i = 0; i < 16; ++i) a[i] = 0.5f * static_cast<float>(i);
  std::vector<uint16_t> b(32);
  for (int i = 0; i < 32; ++i) {
    b[i] = static_cast<uint16_t>(step_testing::Bits(0.25f * static_cast<float>(i - 16)) >> 16);
  }
  std::vector<float> z(16, 0.0f);
  EXPECT_EQ(ReferenceFingerprint(a.data(), DType::kF32, 1, 16), 0x9d7cb1b305e14183ull);
  EXPECT_EQ(ReferenceFingerprint(b.data(), DType::kBF16, 2, 16), 0xcd9db92cef49e8efull);
  EXPECT_EQ(ReferenceFingerprint(b.data(), DType::kBF16, 1, 32), 0xe82675666cbe6240ull);
  EXPECT_EQ(ReferenceFingerprint(z.data(), DType::kF32, 1, 16), 0x80a384b1aab06508ull);

  // The backend's report carries the same fingerprints, for every update of every item.
  StepCase c1;
  c1.rows = 1;
  c1.cols = 16;
  StepCase c2 = c1;
  c2.rows = 2;
  c2.update_dtypes = {DType::kBF16};
  StepCase c3 = c1;
  c3.cols = 32;
  c3.update_dtypes = {DType::kBF16, DType::kF32};
  StepState s1 = MakeState(*cpu_, c1, 20), s2 = MakeState(*cpu_, c2, 21),
            s3 = MakeState(*cpu_, c3, 22);
  auto raw = [](const void* p, size_t n) {
    return std::vector<uint8_t>(static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + n);
  };
  const Updates u1 = {raw(a.data(), 64)};
  const Updates u2 = {raw(b.data(), 64)};
  const Updates u3 = {raw(b.data(), 64), raw(std::vector<float>(32, 0.0f).data(), 128)};
  StepReport report;
  FP4Q_ASSERT_OK(RunStep(
      *cpu_, {MakeItem(c1, &s1, u1), MakeItem(c2, &s2, u2), MakeItem(c3, &s3, u3)}, &report));
  ASSERT_TRUE(report.ok);
  ASSERT_EQ(report.fingerprints.size(), 3u);
  EXPECT_EQ(report.fingerprints[0], std::vector<uint64_t>{0x9d7cb1b305e14183ull});
  EXPECT_EQ(report.fingerprints[1], std::vector<uint64_t>{0xcd9db92cef49e8efull});
  EXPECT_EQ(report.fingerprints[2][0], 0xe82675666cbe6240ull);
  EXPECT_EQ(report.fingerprints[2][1], ReferenceFingerprint(u3[1].data(), DType::kF32, 1, 32));
}

TEST_F(StepCheckTest, OneBadItemChangesNoItemOfTheBatch) {
  Batch b = MakeBatch(*cpu_);
  Set(&b.updates[3], b.cases[3], 0, 17, kNaN);
  const std::vector<StepState> before = b.states;
  StepReport report;
  FP4Q_ASSERT_OK(RunStep(*cpu_, b.Items(), &report));
  EXPECT_FALSE(report.ok);
  ASSERT_EQ(report.items.size(), 5u);
  for (int i = 0; i < 5; ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(report.items[i].outcome, i == 3 ? StepOutcome::kNonFiniteUpdate : StepOutcome::kOk);
    EXPECT_TRUE(SameState(b.states[i], before[i]));
  }
  EXPECT_EQ(report.items[3].index, 17);
  // The good items' amaxes are reported all the same.
  EXPECT_GT(report.items[0].amax, 0.0f);
  EXPECT_EQ(report.items[2].amax, before[2].stats[kStatNextAmax]);  // delayed

  // Without the NaN the whole batch is applied.
  b.updates[3] = MakeUpdates(b.cases[3], 43);
  FP4Q_ASSERT_OK(RunStep(*cpu_, b.Items(), &report));
  EXPECT_TRUE(report.ok);
  for (int i = 0; i < 5; ++i) EXPECT_NE(b.states[i].weight.codes, before[i].weight.codes) << i;
}

TEST_F(StepCheckTest, TheReportListsEveryItemsOwnOutcome) {
  Batch b = MakeBatch(*cpu_);
  Set(&b.updates[1], b.cases[1], 0, 2, kInf);
  std::vector<StepItem> items = b.Items();
  items[3].check_only = true;
  items[3].expect_fingerprints = {12345};
  const std::vector<StepState> before = b.states;
  StepReport report;
  FP4Q_ASSERT_OK(RunStep(*cpu_, items, &report));
  EXPECT_FALSE(report.ok);
  EXPECT_EQ(report.items[0].outcome, StepOutcome::kOk);
  EXPECT_EQ(report.items[1].outcome, StepOutcome::kNonFiniteUpdate);
  EXPECT_EQ(report.items[1].value, kInf);
  EXPECT_EQ(report.items[2].outcome, StepOutcome::kOk);
  EXPECT_EQ(report.items[3].outcome, StepOutcome::kFingerprintMismatch);
  EXPECT_EQ(report.items[3].rank, 0);
  EXPECT_EQ(report.items[4].outcome, StepOutcome::kOk);
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(SameState(b.states[i], before[i])) << i;
}

TEST_F(StepCheckTest, WorkspaceRules) {
  Batch b = MakeBatch(*cpu_);
  const std::vector<StepItem> items = b.Items();
  const size_t bytes = StepWorkspaceBytes(items);
  void* ws = cpu_->Allocate(bytes).value();
  EXPECT_THAT(cpu_->StepCheck(items, ws, bytes - 1, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr(absl::StrCat("workspace_bytes: ", bytes - 1,
                                              " is smaller than the ", bytes, " needed"))));
  EXPECT_THAT(cpu_->StepCheck(items, nullptr, bytes, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("workspace: null")));
  std::memset(ws, 0, bytes);
  const std::vector<StepState> before = b.states;
  EXPECT_THAT(cpu_->StepApply(items, ws, nullptr),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("no StepCheck")));
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(SameState(b.states[i], before[i])) << i;
  cpu_->Free(ws);
  EXPECT_EQ(StateBytesPerElement(StateDType::kF32), 4.0);
  EXPECT_EQ(StateBytesPerElement(StateDType::kBF16), 2.0);
  EXPECT_EQ(StateBytesPerElement(StateDType::kNvfp4), 0.5625);
}

// ---------------------------------------------------------------- UpdateWeight

struct UpdateCase {
  BlockShape block;
  Rounding rounding;
  UpdateKind kind;
  bool residual;
  DType update_dtype;
  DType out_dtype;
};

class UpdateWeightIsAStepTest : public ::testing::TestWithParam<UpdateCase> {};

TEST_P(UpdateWeightIsAStepTest, SameBytesAsTheOneItemStep) {
  const UpdateCase p = GetParam();
  auto cpu = CreateCpuBackend();
  StepCase c;
  c.rows = 32;
  c.cols = 80;
  c.block = p.block;
  c.rounding = p.rounding;
  c.kind = p.kind;
  c.residual = p.residual;
  c.update_dtypes = {p.update_dtype};
  c.out_dtypes = {p.out_dtype};
  c.hyper.lr = p.kind == UpdateKind::kGradient ? 0.03f : 0.0f;
  c.seed = 77;
  c.step = 9;
  StepState via_step = MakeState(*cpu, c, 50);
  StepState via_update = via_step;
  const Updates u = MakeUpdates(c, 51);
  StepItem item = MakeItem(c, &via_step, u);
  item.stats = nullptr;
  StepReport report;
  FP4Q_ASSERT_OK(RunStep(*cpu, {item}, &report));
  ASSERT_TRUE(report.ok);

  StepItem w = MakeItem(c, &via_update, u);
  QuantizeOptions o;
  o.block = p.block;
  o.rounding = p.rounding;
  o.seed = 77;
  o.step = 9;
  FP4Q_ASSERT_OK(cpu->UpdateWeight(w.weight, w.residual, w.updates[0], 0.03f, p.kind, o,
                                   &w.dequantized_out[0], nullptr));
  EXPECT_TRUE(SameState(via_update, via_step));
}

INSTANTIATE_TEST_SUITE_P(
    Cases, UpdateWeightIsAStepTest,
    ::testing::Values(UpdateCase{BlockShape::k1x16, Rounding::kNearest, UpdateKind::kGradient,
                                 false, DType::kF32, DType::kF32},
                      UpdateCase{BlockShape::k1x16, Rounding::kStochastic, UpdateKind::kGradient,
                                 true, DType::kBF16, DType::kBF16},
                      UpdateCase{BlockShape::k16x16, Rounding::kNearest, UpdateKind::kDelta, true,
                                 DType::kF32, DType::kBF16},
                      UpdateCase{BlockShape::k16x16, Rounding::kStochastic, UpdateKind::kDelta,
                                 false, DType::kBF16, DType::kF32}));

TEST_F(StepCheckTest, UpdateWeightRefusesANonFiniteUpdateAndChangesNothing) {
  StepCase c;
  c.residual = true;
  StepState st = MakeState(*cpu_, c, 60);
  Updates u = MakeUpdates(c, 61);
  Set(&u, c, 0, 5, kNaN);
  StepItem w = MakeItem(c, &st, u);
  const StepState before = st;
  EXPECT_THAT(cpu_->UpdateWeight(w.weight, w.residual, w.updates[0], 0.1f, UpdateKind::kGradient,
                                 QuantizeOptions(), &w.dequantized_out[0], nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("update: element 5 is NaN")));
  EXPECT_TRUE(SameState(st, before));
  u = MakeUpdates(c, 61);
  Set(&u, c, 0, 7, 1e38f);
  w = MakeItem(c, &st, u);
  EXPECT_THAT(cpu_->UpdateWeight(w.weight, w.residual, w.updates[0], -4.0f, UpdateKind::kGradient,
                                 QuantizeOptions(), nullptr, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("update: element 7 makes the new weight value +Inf")));
  EXPECT_TRUE(SameState(st, before));
}

TEST_F(StepCheckTest, UpdateWeightStagesUnalignedBuffers) {
  StepCase c;
  c.rows = 16;
  c.cols = 32;
  c.residual = true;
  StepState st = MakeState(*cpu_, c, 62);
  StepState want = st;
  const Updates u = MakeUpdates(c, 63);
  StepItem item = MakeItem(c, &want, u);
  item.stats = nullptr;
  StepReport report;
  FP4Q_ASSERT_OK(RunStep(*cpu_, {item}, &report));
  // The same step with the residual and the update 4 bytes off a 16-byte boundary.
  std::vector<float> r(c.n() + 4);
  std::memcpy(r.data() + 1, st.residual.data(), c.n() * 4);
  std::vector<uint8_t> g(c.n() * 4 + 16);
  std::memcpy(g.data() + 4, u[0].data(), c.n() * 4);
  StepItem w = MakeItem(c, &st, u);
  FP4Q_ASSERT_OK(cpu_->UpdateWeight(
      w.weight, r.data() + 1, ConstTensor{g.data() + 4, DType::kF32, c.rows, c.cols}, c.hyper.lr,
      UpdateKind::kGradient, QuantizeOptions(), &w.dequantized_out[0], nullptr));
  std::memcpy(st.residual.data(), r.data() + 1, c.n() * 4);
  EXPECT_TRUE(SameState(st, want));
}

// ---------------------------------------------------------------- guards and amax

TEST_F(StepCheckTest, GuardedQuantizeRefusesAndWritesNothing) {
  const int64_t rows = 4, cols = 32;
  std::vector<float> x = testing::Normal(rows * cols, 70);
  std::vector<float> r(rows * cols, 0.001f);
  QuantizeOptions o;
  testing::OwnedQuantized q(Format::kNvfp4, BlockShape::k1x16, ScaleLayout::kPlain, rows, cols);
  FiniteGuard g;
  auto run = [&](const std::vector<float>& in) {
    const std::vector<float> r0 = r;
    const std::vector<uint8_t> codes0 = q.codes;
    FP4Q_EXPECT_OK(cpu_->Quantize(testing::F32View(in, rows, cols), o, r.data(), &q.view, nullptr,
                                  nullptr, &g));
    EXPECT_EQ(r, r0);
    EXPECT_EQ(q.codes, codes0);
  };
  std::vector<float> bad = x;
  bad[70] = kNaN;
  bad[90] = kInf;
  run(bad);
  EXPECT_EQ(g.outcome, StepOutcome::kNonFiniteUpdate);
  EXPECT_EQ(g.quantity, StepQuantity::kUpdateSum);
  EXPECT_EQ(g.index, 70);
  EXPECT_TRUE(std::isnan(g.value));
  bad = x;
  bad[3] = 3e38f;
  r[3] = 3e38f;
  run(bad);
  EXPECT_EQ(g.outcome, StepOutcome::kNonFiniteResult);
  EXPECT_EQ(g.quantity, StepQuantity::kWeight);
  EXPECT_EQ(g.index, 3);
  EXPECT_EQ(g.value, kInf);
  r[3] = 0.001f;
  run(bad);  // max |v| = 3e38: DQ could reach 2688 * S_dec > 2^127
  EXPECT_EQ(g.outcome, StepOutcome::kOutOfRange);
  EXPECT_EQ(g.quantity, StepQuantity::kDequantized);
  EXPECT_GT(g.bound, 1.7e38);
  EXPECT_EQ(g.amax, 3e38f);

  // A finite request: the guard passes and the result equals the unguarded call's.
  std::vector<float> r_plain = r;
  testing::OwnedQuantized plain(Format::kNvfp4, BlockShape::k1x16, ScaleLayout::kPlain, rows, cols);
  FP4Q_ASSERT_OK(cpu_->Quantize(testing::F32View(x, rows, cols), o, r_plain.data(), &plain.view,
                                nullptr, nullptr));
  FP4Q_ASSERT_OK(
      cpu_->Quantize(testing::F32View(x, rows, cols), o, r.data(), &q.view, nullptr, nullptr, &g));
  EXPECT_EQ(g.outcome, StepOutcome::kOk);
  EXPECT_EQ(g.index, -1);
  EXPECT_EQ(g.amax, plain.global[0]);
  EXPECT_EQ(q.codes, plain.codes);
  EXPECT_EQ(r, r_plain);

  // A guard needs a residual.
  EXPECT_THAT(
      cpu_->Quantize(testing::F32View(x, rows, cols), o, nullptr, &q.view, nullptr, nullptr, &g),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("guard: set without residual")));
}

TEST_F(StepCheckTest, GuardedQdqLeavesOutputAndResidualAlone) {
  const int64_t rows = 2, cols = 64;
  std::vector<float> x = testing::Normal(rows * cols, 71);
  x[100] = -kInf;
  std::vector<float> r(rows * cols, -0.002f);
  const std::vector<float> r0 = r;
  std::vector<float> out(rows * cols, 42.0f);
  QuantizeOptions o;
  o.format = Format::kMxfp4;
  o.block = BlockShape::k1x32;
  FiniteGuard g;
  FP4Q_ASSERT_OK(cpu_->Qdq(testing::F32View(x, rows, cols), o, r.data(),
                           testing::F32Out(&out, rows, cols), nullptr, &g));
  EXPECT_EQ(g.outcome, StepOutcome::kNonFiniteUpdate);
  EXPECT_EQ(g.index, 100);
  EXPECT_EQ(g.value, -kInf);
  EXPECT_EQ(r, r0);
  EXPECT_EQ(out, std::vector<float>(rows * cols, 42.0f));
  // MXFP4 near the top of the range: 6 * 2^(b - 127) passes 2^127.
  x[100] = 3e38f;
  FP4Q_ASSERT_OK(cpu_->Qdq(testing::F32View(x, rows, cols), o, r.data(),
                           testing::F32Out(&out, rows, cols), nullptr, &g));
  EXPECT_EQ(g.outcome, StepOutcome::kOutOfRange);
  EXPECT_DOUBLE_EQ(g.bound, 6.0 * std::ldexp(1.0, 126));
  EXPECT_EQ(r, r0);
}

TEST_F(StepCheckTest, AmaxReportsTheFirstNonFiniteIndex) {
  std::vector<float> x = testing::Normal(7 * 33, 72);
  float amax = -1.0f;
  int64_t first = 99;
  FP4Q_ASSERT_OK(cpu_->Amax(testing::F32View(x, 7, 33), &amax, nullptr, &first));
  EXPECT_EQ(first, -1);
  float want = 0.0f;
  for (float v : x) want = std::fmax(want, std::fabs(v));
  EXPECT_EQ(amax, want);
  x[200] = kNaN;
  x[150] = -kInf;
  x[10] = 5.0f;
  FP4Q_ASSERT_OK(cpu_->Amax(testing::F32View(x, 7, 33), &amax, nullptr, &first));
  EXPECT_EQ(first, 150);
  EXPECT_EQ(amax, kInf);  // Inf counts, NaN does not
}

}  // namespace
}  // namespace fp4q::kernels
