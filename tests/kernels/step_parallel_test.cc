// The CPU backend runs a step's items on the host's threads (cpu/parallel.h): the same bytes as
// each item stepped alone, whichever thread ran it.
#include <atomic>
#include <vector>

#include "cpu/parallel.h"
#include "gtest/gtest.h"
#include "kernels/step_test_util.h"

namespace fp4q::kernels {
namespace {

using cpu::ForEachPiece;
using step_testing::MakeItem;
using step_testing::MakeState;
using step_testing::MakeUpdates;
using step_testing::RunStep;
using step_testing::SameState;
using step_testing::StepCase;
using step_testing::StepState;
using step_testing::Updates;

TEST(ForEachPieceTest, CallsEveryPieceOnceLargestFirstOnOneThreadWhenSmall) {
  const std::vector<int64_t> sizes = {5, 900, 40, 900, 7};
  std::vector<size_t> order;
  ForEachPiece(sizes, [&](size_t i) { order.push_back(i); });  // 1852 elements: one thread
  EXPECT_EQ(order, (std::vector<size_t>{0, 1, 2, 3, 4}));  // in order, on the calling thread

  const std::vector<int64_t> big(37, cpu::kParallelMinElements / 8);
  std::vector<std::atomic<int>> calls(big.size());
  ForEachPiece(big, [&](size_t i) { calls[i].fetch_add(1); });
  for (size_t i = 0; i < calls.size(); ++i) EXPECT_EQ(calls[i].load(), 1) << "piece " << i;
  EXPECT_GE(cpu::CpuThreads(), 1);
}

// Items of several kinds whose batch (2^20 elements and more) runs on the host's threads, each
// under 2^20 so that stepped alone it runs on one.
std::vector<StepCase> ParallelCases() {
  std::vector<StepCase> cases;
  for (int i = 0; i < 6; ++i) {
    StepCase c;
    c.rows = 240 + 16 * i;
    c.cols = 1024;
    c.scaling = i % 2 ? Scaling::kDelayed : Scaling::kCurrent;
    c.rounding = i % 3 == 1 ? Rounding::kStochastic : Rounding::kNearest;
    c.residual = i != 3;
    c.update_dtypes = {i % 2 ? DType::kBF16 : DType::kF32};
    c.out_dtypes = {c.update_dtypes[0]};
    if (i == 2) {
      c.opt = OptimizerKind::kAdamW;
      c.hyper.lr = 1e-3f;
    } else {
      c.hyper.lr = 0.05f;
    }
    if (i == 4) {
      c.momentum = true;
      c.hyper.momentum = 0.9f;
      c.block = BlockShape::k16x16;
    }
    c.seed = 0xBEEF + static_cast<uint64_t>(i);
    cases.push_back(c);
  }
  return cases;
}

TEST(StepParallelTest, BatchOnThreadsEqualsEachItemAlone) {
  std::unique_ptr<Backend> cpu = CreateCpuBackend();
  const std::vector<StepCase> cases = ParallelCases();
  int64_t total = 0;
  std::vector<StepState> together, alone;
  std::vector<Updates> updates;
  for (size_t i = 0; i < cases.size(); ++i) {
    ASSERT_LT(static_cast<int64_t>(cases[i].n()), cpu::kParallelMinElements);
    total += static_cast<int64_t>(cases[i].n());
    together.push_back(MakeState(*cpu, cases[i], 70 + static_cast<uint32_t>(i)));
    alone.push_back(together.back());
    updates.push_back(MakeUpdates(cases[i], 90 + static_cast<uint32_t>(i), 0.05f));
  }
  ASSERT_GE(total, cpu::kParallelMinElements);
  for (int step = 1; step <= 2; ++step) {
    std::vector<StepItem> items;
    for (size_t i = 0; i < cases.size(); ++i) {
      StepCase c = cases[i];
      c.step = static_cast<uint64_t>(step);
      items.push_back(MakeItem(c, &together[i], updates[i]));
    }
    StepReport batch;
    ASSERT_TRUE(RunStep(*cpu, items, &batch).ok());
    ASSERT_TRUE(batch.ok) << "step " << step;
    for (size_t i = 0; i < cases.size(); ++i) {
      SCOPED_TRACE(cases[i].Name());
      StepCase c = cases[i];
      c.step = static_cast<uint64_t>(step);
      StepReport one;
      ASSERT_TRUE(RunStep(*cpu, {MakeItem(c, &alone[i], updates[i])}, &one).ok());
      ASSERT_TRUE(one.ok);
      EXPECT_EQ(one.fingerprints[0], batch.fingerprints[i]);
      EXPECT_EQ(one.items[0].amax, batch.items[i].amax);
      EXPECT_TRUE(SameState(together[i], alone[i])) << "step " << step;
    }
  }
}

}  // namespace
}  // namespace fp4q::kernels
