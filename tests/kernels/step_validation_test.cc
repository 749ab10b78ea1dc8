// A step's items validated (ValidateStepItems, ValidatedStep::Check) on the CPU backend: each
// refusal names the item and the field; a validated batch steps as the validating calls do.
#include <cstdint>
#include <limits>
#include <memory>
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
using step_testing::RunStep;
using step_testing::SameState;
using step_testing::Set;
using step_testing::StepCase;
using step_testing::StepState;
using step_testing::Updates;
using ::testing::HasSubstr;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

class StepValidationTest : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> cpu_ = CreateCpuBackend();
};

TEST_F(StepValidationTest, ValidationNamesTheItemAndField) {
  std::vector<uint64_t> ws(1 << 17);
  auto check = [&](StepCase c, auto mutate) {
    StepState st = MakeState(*cpu_, c, 80);
    const Updates u = MakeUpdates(c, 81);
    StepItem item = MakeItem(c, &st, u);
    mutate(&item);
    StepCase ok;
    StepState st0 = MakeState(*cpu_, ok, 82);
    const Updates u0 = MakeUpdates(ok, 83);
    std::vector<StepItem> items = {MakeItem(ok, &st0, u0), item};
    return cpu_->StepCheck(items, ws.data(), ws.size() * 8, nullptr);
  };
  StepCase c;
  EXPECT_THAT(check(c, [](StepItem* i) { i->updates[0].rows = 8; }),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("items[1].updates[0].rows: 8 does not match weight 32")));
  EXPECT_THAT(check(c, [](StepItem* i) { i->hyper.lr = -1.0f; }),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("items[1].hyper.lr: -1 is not finite and >= 0")));
  EXPECT_THAT(check(c, [](StepItem* i) { i->hyper.t = 0; }),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("items[1].hyper.t: 0")));
  EXPECT_THAT(check(c, [](StepItem* i) { i->hyper.momentum = 0.9f; }),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("items[1].hyper.momentum: 0.9 needs a momentum buffer")));
  EXPECT_THAT(check(c, [](StepItem* i) { i->updates.clear(); }),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("items[1].updates: empty")));
  EXPECT_THAT(check(c,
                    [](StepItem* i) {
                      i->scaling = Scaling::kDelayed;
                      i->stats = nullptr;
                    }),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("items[1].stats: null")));
  EXPECT_THAT(check(c, [](StepItem* i) { i->check_only = true; }),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("items[1].expect_fingerprints: 0 fingerprints for 1 updates")));
  EXPECT_THAT(check(c,
                    [](StepItem* i) {
                      i->updates[0].data = static_cast<const uint8_t*>(i->updates[0].data) + 4;
                    }),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("is not 16-byte aligned")));
  EXPECT_THAT(check(c,
                    [](StepItem* i) {
                      i->kind = UpdateKind::kDelta;
                      i->hyper.weight_decay = 0.1f;
                    }),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("items[1].kind: delta needs plain SGD")));
  StepCase a;
  a.opt = OptimizerKind::kAdamW;
  EXPECT_THAT(check(a, [](StepItem* i) { i->hyper.beta2 = 1.0f; }),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("items[1].hyper.beta2: 1 is not in [0, 1)")));
  EXPECT_THAT(check(a, [](StepItem* i) { i->hyper.eps = 0.0f; }),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("items[1].hyper.eps: 0 is not finite and > 0")));
  EXPECT_THAT(check(a, [](StepItem* i) { i->state.moment2 = MomentTensor(); }),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("items[1].state.moment2.dense: null")));
  EXPECT_THAT(check(a, [](StepItem* i) { i->state.max_moment2 = i->state.moment2; }),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("items[1].state.max_moment2: set, but only AdamW with amsgrad")));
  a.dtype = StateDType::kNvfp4;
  EXPECT_THAT(check(a, [](StepItem* i) { i->state.moment1.quantized.block = BlockShape::k16x16; }),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("items[1].state.moment1.quantized.block: 16x16, but nvfp4 "
                                 "moments use 1x16 blocks")));
  // The same weight written twice.
  StepState st = MakeState(*cpu_, c, 84);
  const Updates u = MakeUpdates(c, 85);
  EXPECT_THAT(cpu_->StepCheck({MakeItem(c, &st, u), MakeItem(c, &st, u)}, ws.data(), ws.size() * 8,
                              nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("items[1].weight: the same stored weight as items[0]")));
}

// ValidatedStep::Check refuses what ValidateStepItems refuses, with its message; the Backend's
// step calls given the validated batch (StepCheck and StepApply, or StepCheckAndApply) write
// the same bytes as the calls that validate.
TEST_F(StepValidationTest, ValidatedStepRefusesAsTheCallsDoAndStepsTheSame) {
  Batch b = MakeBatch(*cpu_);
  std::vector<StepItem> bad = b.Items();
  bad[2].hyper.lr = -1.0f;
  EXPECT_THAT(ValidatedStep::Check(bad).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("items[2].hyper.lr: -1 is not finite and >= 0")));
  bad = b.Items();
  bad[4] = bad[0];
  EXPECT_THAT(ValidatedStep::Check(bad).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("items[4].weight: the same stored weight as items[0]")));
  EXPECT_THAT(ValidatedStep::Check({}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("items: empty")));

  Batch twin = MakeBatch(*cpu_);  // the same states and updates (same seeds)
  const std::vector<StepItem> items = b.Items();
  absl::StatusOr<ValidatedStep> step = ValidatedStep::Check(items);
  FP4Q_ASSERT_OK(step.status());
  EXPECT_EQ(&step->items(), &items);
  const size_t bytes = StepWorkspaceBytes(items);
  void* ws = cpu_->Allocate(bytes).value();
  EXPECT_THAT(cpu_->StepCheck(*step, ws, bytes - 16, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("workspace_bytes: ")));
  EXPECT_THAT(cpu_->StepApply(*step, nullptr, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("workspace: null")));
  StepReport report;
  FP4Q_ASSERT_OK(cpu_->StepCheck(*step, ws, bytes, nullptr));
  FP4Q_ASSERT_OK(cpu_->StepApply(*step, ws, nullptr));
  FP4Q_ASSERT_OK(cpu_->StepReadReport(items, ws, &report, nullptr));
  cpu_->Free(ws);
  ASSERT_TRUE(report.ok);
  StepReport twin_report;
  FP4Q_ASSERT_OK(RunStep(*cpu_, twin.Items(), &twin_report));
  ASSERT_TRUE(twin_report.ok);
  for (int i = 0; i < 5; ++i) {
    SCOPED_TRACE(i);
    EXPECT_TRUE(SameState(b.states[i], twin.states[i]));
    EXPECT_NE(b.states[i].weight.codes, MakeBatch(*cpu_).states[i].weight.codes);  // it stepped
  }
  EXPECT_EQ(report.fingerprints, twin_report.fingerprints);

  // StepCheckAndApply: the same bytes again, and a refused batch writes nothing.
  Batch third = MakeBatch(*cpu_);
  const std::vector<StepItem> third_items = third.Items();
  absl::StatusOr<ValidatedStep> both = ValidatedStep::Check(third_items);
  FP4Q_ASSERT_OK(both.status());
  ws = cpu_->Allocate(bytes).value();
  EXPECT_THAT(cpu_->StepCheckAndApply(*both, ws, bytes - 16, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("workspace_bytes: ")));
  FP4Q_ASSERT_OK(cpu_->StepCheckAndApply(*both, ws, bytes, nullptr));
  StepReport third_report;
  FP4Q_ASSERT_OK(cpu_->StepReadReport(third_items, ws, &third_report, nullptr));
  ASSERT_TRUE(third_report.ok);
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(SameState(third.states[i], twin.states[i])) << i;
  Batch bad_batch = MakeBatch(*cpu_);
  Set(&bad_batch.updates[1], bad_batch.cases[1], 0, 3, kNaN);
  const std::vector<StepState> before = bad_batch.states;
  const std::vector<StepItem> bad_items = bad_batch.Items();
  absl::StatusOr<ValidatedStep> refused = ValidatedStep::Check(bad_items);
  FP4Q_ASSERT_OK(refused.status());
  FP4Q_ASSERT_OK(cpu_->StepCheckAndApply(*refused, ws, bytes, nullptr));
  FP4Q_ASSERT_OK(cpu_->StepReadReport(bad_items, ws, &third_report, nullptr));
  cpu_->Free(ws);
  EXPECT_FALSE(third_report.ok);
  EXPECT_EQ(third_report.items[1].outcome, StepOutcome::kNonFiniteUpdate);
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(SameState(bad_batch.states[i], before[i])) << i;
}

}  // namespace
}  // namespace fp4q::kernels
