// One-pass steps (StepNext, step.h) on the CPU backend: the new state written beside the old one
// is byte for byte what the two-pass step writes in place, over several steps; the report is the
// same; a refused or cancelled batch leaves the state as it was and every output holding DQ(W)
// of the unchanged weight; the validation of StepNext names the field.
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "fp4q/kernels/backend.h"
#include "fp4q/kernels/step.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/step_test_util.h"
#include "testing/status_matchers.h"

namespace fp4q::kernels {
namespace {

using ::fp4q::testing::StatusIs;
using step_testing::DequantizedBytes;
using step_testing::MakeItem;
using step_testing::MakeState;
using step_testing::MakeUpdates;
using step_testing::OnePassCase;
using step_testing::PoisonOutputs;
using step_testing::PoisonState;
using step_testing::RunOnePassStep;
using step_testing::RunStep;
using step_testing::SameState;
using step_testing::Set;
using step_testing::SetNext;
using step_testing::StepCase;
using step_testing::StepState;
using step_testing::Updates;
using ::testing::HasSubstr;

// The state a one-pass step leaves: the weight, residual and statistics of `next` (what the
// caller commits), the outputs the step wrote.
StepState Committed(const StepState& old, const StepState& next) {
  StepState s = old;
  s.weight = next.weight;
  s.residual = next.residual;
  s.stats = next.stats;
  return s;
}

void ExpectSameReport(const StepReport& one, const StepReport& two) {
  EXPECT_EQ(one.ok, two.ok);
  EXPECT_EQ(one.cancelled, two.cancelled);
  ASSERT_EQ(one.items.size(), two.items.size());
  for (size_t i = 0; i < one.items.size(); ++i) {
    EXPECT_EQ(one.items[i].outcome, two.items[i].outcome) << "item " << i;
    EXPECT_EQ(one.items[i].quantity, two.items[i].quantity) << "item " << i;
    EXPECT_EQ(one.items[i].index, two.items[i].index) << "item " << i;
    EXPECT_EQ(one.items[i].amax, two.items[i].amax) << "item " << i;
  }
  EXPECT_EQ(one.fingerprints, two.fingerprints);
}

class StepOnePassTest : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> cpu_ = CreateCpuBackend();
};

TEST_F(StepOnePassTest, NextStateMatchesTheTwoPassStepOverSteps) {
  for (int i = 0; i < 16; ++i) {
    StepCase c = OnePassCase(i);
    SCOPED_TRACE(c.Name());
    StepState two = MakeState(*cpu_, c, 70 + i);
    StepState one = two;
    for (uint64_t step = 1; step <= 3; ++step) {
      c.step = step;
      c.hyper.t = static_cast<int64_t>(step);
      const Updates u = MakeUpdates(c, 100 * i + static_cast<uint32_t>(step), 0.3f);
      PoisonOutputs(&two);
      PoisonOutputs(&one);
      StepReport r2, r1;
      ASSERT_TRUE(RunStep(*cpu_, {MakeItem(c, &two, u)}, &r2).ok());
      ASSERT_TRUE(r2.ok);
      StepState next = one;
      PoisonState(&next);
      const StepState before = one;
      StepItem item = MakeItem(c, &one, u);
      ASSERT_TRUE(OnePassItem(item));
      SetNext(&item, &next);
      const absl::Status s = RunOnePassStep(*cpu_, {item}, &r1);
      ASSERT_TRUE(s.ok()) << s;
      ExpectSameReport(r1, r2);
      // The state in place is untouched; the committed one is the two-pass step's.
      StepState kept = one;
      kept.outs = before.outs;
      EXPECT_TRUE(SameState(kept, before));
      one = Committed(one, next);
      ASSERT_TRUE(SameState(one, two)) << "step " << step;
    }
  }
}

TEST_F(StepOnePassTest, RefusedBatchKeepsTheStateAndRestoresTheOutputs) {
  std::vector<StepCase> cases = {OnePassCase(1), OnePassCase(6), OnePassCase(3)};
  std::vector<StepState> st, next;
  std::vector<Updates> u;
  for (size_t i = 0; i < cases.size(); ++i) {
    st.push_back(MakeState(*cpu_, cases[i], 90 + static_cast<uint32_t>(i)));
    next.push_back(st.back());
    PoisonState(&next.back());
    PoisonOutputs(&st.back());
    u.push_back(MakeUpdates(cases[i], 95 + static_cast<uint32_t>(i)));
  }
  // Item 1 (7 x 48, bf16): a NaN at element 37; items 0 and 2 are fine.
  Set(&u[1], cases[1], 0, 37, std::numeric_limits<float>::quiet_NaN());
  std::vector<StepState> two = st;
  std::vector<StepItem> two_items, items;
  for (size_t i = 0; i < cases.size(); ++i) {
    two_items.push_back(MakeItem(cases[i], &two[i], u[i]));
    items.push_back(MakeItem(cases[i], &st[i], u[i]));
    SetNext(&items.back(), &next[i]);
  }
  const std::vector<StepState> before = st;
  StepReport r2, r1;
  ASSERT_TRUE(RunStep(*cpu_, two_items, &r2).ok());
  ASSERT_TRUE(RunOnePassStep(*cpu_, items, &r1).ok());
  ASSERT_FALSE(r1.ok);
  ExpectSameReport(r1, r2);
  EXPECT_EQ(r1.items[1].outcome, StepOutcome::kNonFiniteUpdate);
  EXPECT_EQ(r1.items[1].index, 37);
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(i);
    StepState kept = st[i];
    kept.outs = before[i].outs;
    EXPECT_TRUE(SameState(kept, before[i]));
    for (size_t k = 0; k < st[i].outs.size(); ++k) {
      EXPECT_EQ(st[i].outs[k], DequantizedBytes(*cpu_, cases[i], before[i], cases[i].out_dtypes[k]));
    }
  }
}

TEST_F(StepOnePassTest, CancelledBatchChangesNothing) {
  const StepCase c = OnePassCase(4);
  StepState st = MakeState(*cpu_, c, 11);
  PoisonOutputs(&st);
  StepState next = st;
  PoisonState(&next);
  const Updates u = MakeUpdates(c, 12);
  const StepState before = st;
  StepItem item = MakeItem(c, &st, u);
  SetNext(&item, &next);
  const uint32_t word = 77;
  StepReport r;
  ASSERT_TRUE(RunOnePassStep(*cpu_, {item}, &r, StepCancel{&word, 77}).ok());
  EXPECT_FALSE(r.ok);
  EXPECT_TRUE(r.cancelled);
  EXPECT_TRUE(SameState(st, before));  // the outputs too: still the poison they held
}

TEST_F(StepOnePassTest, ValidationNamesTheField) {
  StepCase c = OnePassCase(0);  // error feedback, f32
  StepState st = MakeState(*cpu_, c, 5), next = st;
  const Updates u = MakeUpdates(c, 6);
  const auto refused = [&](const std::vector<StepItem>& items) {
    return ValidatedStep::Check(items).status();
  };
  StepItem item = MakeItem(c, &st, u);
  SetNext(&item, &next);
  ASSERT_TRUE(refused({item}).ok());

  StepItem no_residual = item;
  no_residual.next.residual = nullptr;
  EXPECT_THAT(refused({no_residual}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("items[0].next.residual: null, but the item keeps a residual")));
  StepItem no_stats = item;
  no_stats.next.stats = nullptr;
  EXPECT_THAT(refused({no_stats}), StatusIs(absl::StatusCode::kInvalidArgument,
                                            HasSubstr("items[0].next.stats: null")));
  // Any next buffer on (or overlapping) any of the item's own: a refused step would write it.
  const auto overlapping = [&](auto set, const char* message) {
    SCOPED_TRACE(message);
    StepItem in_place = item;
    set(&in_place);
    EXPECT_THAT(refused({in_place}), StatusIs(absl::StatusCode::kInvalidArgument,
                                              HasSubstr(message)));
  };
  overlapping([](StepItem* i) { i->next.codes = i->weight.codes; },
              "items[0].next.codes: overlaps the item's weight.codes: the next state is written "
              "beside it");
  overlapping([](StepItem* i) { i->next.scales = i->weight.scales; },
              "items[0].next.scales: overlaps the item's weight.scales");
  overlapping([](StepItem* i) { i->next.global = i->weight.global; },
              "items[0].next.global: overlaps the item's weight.global");
  overlapping([](StepItem* i) { i->next.stats = i->stats + 4; },
              "items[0].next.stats: overlaps the item's stats");
  overlapping([](StepItem* i) { i->next.residual = i->residual; },
              "items[0].next.residual: overlaps the item's residual");
  overlapping([](StepItem* i) { i->next.scales = i->weight.codes + 1; },
              "items[0].next.scales: overlaps the item's weight.codes");
  StepItem half = item;
  half.next.codes = nullptr;
  EXPECT_THAT(refused({half}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("items[0].next.codes: null, but other buffers")));

  // Not a one-pass item: momentum, current scaling, two outputs.
  StepCase cm = c;
  cm.momentum = true;
  cm.hyper.momentum = 0.9f;
  StepState sm = MakeState(*cpu_, cm, 7), nm = sm;
  StepItem mom = MakeItem(cm, &sm, u);
  EXPECT_FALSE(OnePassItem(mom));
  SetNext(&mom, &nm);
  EXPECT_THAT(refused({mom}), StatusIs(absl::StatusCode::kInvalidArgument,
                                       HasSubstr("items[0].next: set, but only plain SGD")));
  StepItem current = item;
  current.scaling = Scaling::kCurrent;
  EXPECT_FALSE(OnePassItem(current));
  StepItem two_outs = MakeItem(c, &st, u);
  two_outs.dequantized_out.push_back(two_outs.dequantized_out[0]);
  EXPECT_FALSE(OnePassItem(two_outs));

  // Every item or none.
  StepCase c2 = OnePassCase(5);
  StepState s2 = MakeState(*cpu_, c2, 8);
  const Updates u2 = MakeUpdates(c2, 9);
  EXPECT_THAT(refused({item, MakeItem(c2, &s2, u2)}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("items[1].next: not set, but items[0]'s is")));

  // StepCheck / StepApply take no one-pass items.
  const std::vector<StepItem> items = {item};
  absl::StatusOr<ValidatedStep> step = ValidatedStep::Check(items);
  ASSERT_TRUE(step.ok());
  const size_t bytes = StepWorkspaceBytes(items);
  std::vector<uint8_t> ws(bytes + 16);
  void* aligned = ws.data() + (16 - reinterpret_cast<uintptr_t>(ws.data()) % 16) % 16;
  EXPECT_THAT(cpu_->StepCheck(*step, aligned, bytes, nullptr),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("runs with StepCheckAndApply")));
  EXPECT_THAT(cpu_->StepApply(*step, aligned, nullptr),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("runs with StepCheckAndApply")));
}

}  // namespace
}  // namespace fp4q::kernels
