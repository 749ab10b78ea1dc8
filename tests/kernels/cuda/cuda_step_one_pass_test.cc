// One-pass steps (step.h StepNext) on the CUDA backend against the CPU backend, bit for bit: the
// new state written beside the old one (which stays as it was), the outputs and the report, over
// several steps of every one-pass variant (RTN / SR, error feedback, f32 / bf16, with and
// without an output), alone and together in one step (two apply launches); a refused batch (a
// NaN or Inf in one item, found by the apply itself) keeps every item's state and leaves DQ(W)
// of the unchanged weight in every output; a cancelled step writes no new state; an item large
// enough to spread over many warps reports the first bad element. Device buffers start poisoned.
#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/cuda_step_util.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/step_test_util.h"

namespace fp4q::kernels {
namespace {

using cuda_testing::CudaTest;
using cuda_testing::DeviceBuffer;
using cuda_testing::DeviceState;
using cuda_testing::SameReport;
using step_testing::DequantizedBytes;
using step_testing::MakeItem;
using step_testing::MakeState;
using step_testing::MakeUpdates;
using step_testing::OnePassCase;
using step_testing::PoisonOutputs;
using step_testing::PoisonState;
using step_testing::RunOnePassStep;
using step_testing::SameState;
using step_testing::Set;
using step_testing::SetNext;
using step_testing::StepCase;
using step_testing::StepState;
using step_testing::Updates;

// One item of a one-pass step on both backends: its state (host, and on the device with its
// updates) and the buffers of its next state (host, and on the device, poisoned).
struct OnePassItemPair {
  StepCase c;
  StepState host, host_next;
  Updates u;
  std::unique_ptr<DeviceState> dev, dev_next;

  OnePassItemPair(Backend& gpu, Backend& cpu, const StepCase& sc, uint32_t seed) : c(sc) {
    host = MakeState(cpu, c, seed);
    PoisonOutputs(&host);
    host_next = host;
    PoisonState(&host_next);
    u = MakeUpdates(c, seed + 1, 0.3f);
    dev = std::make_unique<DeviceState>(gpu, host, u);
    dev_next = std::make_unique<DeviceState>(gpu, host_next, Updates{});
  }
  StepItem HostItem() {
    StepItem it = MakeItem(c, &host, u);
    SetNext(&it, &host_next);
    return it;
  }
  StepItem DeviceItem() {
    StepItem it = dev->Item(c, &host, u);
    StepItem next_view = dev_next->Item(c, &host_next, Updates{});
    it.next.codes = next_view.weight.codes;
    it.next.scales = next_view.weight.scales;
    it.next.global = next_view.weight.global;
    it.next.stats = next_view.stats;
    it.next.residual = it.residual != nullptr ? next_view.residual : nullptr;
    return it;
  }
  // Applied: the host commits its next state, and the device pair swaps its buffers.
  void Commit() {
    host.weight = host_next.weight;
    host.residual = host_next.residual;
    host.stats = host_next.stats;
    std::swap(dev->weight, dev_next->weight);
    std::swap(dev->residual, dev_next->residual);
    std::swap(dev->stats, dev_next->stats);
  }
};

class CudaStepOnePassTest : public CudaTest {};

TEST_F(CudaStepOnePassTest, MatchesTheCpuOverStepsAndLeavesTheOldState) {
  for (int i = 0; i < 16; ++i) {
    StepCase c = OnePassCase(i);
    SCOPED_TRACE(c.Name());
    OnePassItemPair p(gpu(), cpu(), c, 300 + static_cast<uint32_t>(i));
    for (uint64_t step = 1; step <= 3; ++step) {
      p.c.step = step;
      p.u = MakeUpdates(p.c, 1000 * i + static_cast<uint32_t>(step), 0.3f);
      p.dev->updates.clear();
      for (const auto& x : p.u) p.dev->updates.push_back(cuda_testing::Up(gpu(), x));
      const StepState before = p.dev->Download(p.host);
      StepReport rc, rg;
      ASSERT_TRUE(RunOnePassStep(cpu(), {p.HostItem()}, &rc).ok());
      ASSERT_TRUE(rc.ok);
      const absl::Status s = RunOnePassStep(gpu(), {p.DeviceItem()}, &rg);
      ASSERT_TRUE(s.ok()) << s;
      EXPECT_TRUE(SameReport(rg, rc)) << "step " << step;
      // The device's state in place is untouched; its next state is the CPU's, and so are the
      // outputs.
      StepState now = p.dev->Download(p.host);
      const std::vector<std::vector<uint8_t>> outs = now.outs;
      now.outs = before.outs;
      EXPECT_TRUE(SameState(now, before)) << "step " << step;
      StepState next = p.dev_next->Download(p.host_next);
      next.outs = p.host_next.outs;  // the outputs are compared apart
      ASSERT_TRUE(SameState(next, p.host_next)) << "step " << step;
      EXPECT_EQ(outs, p.host.outs) << "step " << step;
      p.Commit();
    }
  }
}

// Items of both roundings in one step: two apply launches, the second of which decides in its
// last CTA; the large items spread each launch over every SM, so many CTAs arrive.
TEST_F(CudaStepOnePassTest, ItemsOfBothRoundingsInOneStepMatchTheCpuOverSteps) {
  std::vector<std::unique_ptr<OnePassItemPair>> pairs;
  for (int i : {0, 1, 5, 6, 10, 15}) {
    StepCase c = OnePassCase(i);
    if (i == 0 || i == 5) {
      c.rows = 1024;
      c.cols = 1536;
    }
    pairs.push_back(
        std::make_unique<OnePassItemPair>(gpu(), cpu(), c, 1300 + static_cast<uint32_t>(i)));
  }
  for (uint64_t step = 1; step <= 3; ++step) {
    SCOPED_TRACE(step);
    std::vector<StepItem> host_items, dev_items;
    for (size_t i = 0; i < pairs.size(); ++i) {
      OnePassItemPair& p = *pairs[i];
      p.c.step = step;
      p.u = MakeUpdates(p.c, 7000 + 100 * static_cast<uint32_t>(i) + static_cast<uint32_t>(step),
                        0.3f);
      p.dev->updates.clear();
      for (const auto& x : p.u) p.dev->updates.push_back(cuda_testing::Up(gpu(), x));
      PoisonState(&p.host_next);
      host_items.push_back(p.HostItem());
      dev_items.push_back(p.DeviceItem());
    }
    StepReport rc, rg;
    ASSERT_TRUE(RunOnePassStep(cpu(), host_items, &rc).ok());
    ASSERT_TRUE(rc.ok);
    const absl::Status s = RunOnePassStep(gpu(), dev_items, &rg);
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_TRUE(rg.ok);
    EXPECT_TRUE(SameReport(rg, rc));
    for (size_t i = 0; i < pairs.size(); ++i) {
      SCOPED_TRACE(pairs[i]->c.Name());
      OnePassItemPair& p = *pairs[i];
      StepState next = p.dev_next->Download(p.host_next);
      next.outs = p.host_next.outs;  // the outputs are compared apart
      ASSERT_TRUE(SameState(next, p.host_next));
      EXPECT_EQ(p.dev->Download(p.host).outs, p.host.outs);
      p.Commit();
    }
  }
}

TEST_F(CudaStepOnePassTest, RefusedBatchRestoresTheOutputs) {
  const float kNaN = std::numeric_limits<float>::quiet_NaN();
  const float kInf = std::numeric_limits<float>::infinity();
  std::vector<std::unique_ptr<OnePassItemPair>> pairs;
  for (int i : {1, 6, 3, 12}) {
    pairs.push_back(std::make_unique<OnePassItemPair>(gpu(), cpu(), OnePassCase(i),
                                                      500 + static_cast<uint32_t>(i)));
  }
  // Item 1 (OnePassCase(6): 33 x 80, bf16, no residual, RTN): an Inf at 200 and a NaN at 37:
  // the NaN is reported. The others are fine. Items of both roundings: two apply launches, the
  // refusal decided by the last CTA of the last, both launches' outputs restored.
  OnePassItemPair& bad = *pairs[1];
  Set(&bad.u, bad.c, 0, 200, kInf);
  Set(&bad.u, bad.c, 0, 37, kNaN);
  bad.dev->updates[0]->Upload(bad.u[0].data(), bad.u[0].size());
  std::vector<StepItem> host_items, dev_items;
  std::vector<StepState> before;
  for (auto& p : pairs) {
    host_items.push_back(p->HostItem());
    dev_items.push_back(p->DeviceItem());
    before.push_back(p->dev->Download(p->host));
  }
  StepReport rc, rg;
  ASSERT_TRUE(RunOnePassStep(cpu(), host_items, &rc).ok());
  ASSERT_TRUE(RunOnePassStep(gpu(), dev_items, &rg).ok());
  EXPECT_FALSE(rg.ok);
  EXPECT_TRUE(SameReport(rg, rc));
  EXPECT_EQ(rg.items[1].outcome, StepOutcome::kNonFiniteUpdate);
  EXPECT_EQ(rg.items[1].index, 37);
  for (size_t i = 0; i < pairs.size(); ++i) {
    SCOPED_TRACE(i);
    OnePassItemPair& p = *pairs[i];
    StepState now = p.dev->Download(p.host);
    for (size_t k = 0; k < now.outs.size(); ++k) {
      EXPECT_EQ(now.outs[k], DequantizedBytes(cpu(), p.c, before[i], p.c.out_dtypes[k]));
      EXPECT_EQ(now.outs[k], p.host.outs[k]);  // the CPU backend's restored outputs
    }
    now.outs = before[i].outs;
    EXPECT_TRUE(SameState(now, before[i]));
  }
}

// lr 3e38: every gradient finite, the result's bound past 2^127 (NUMERICS 10.6, from the max
// |g| the one pass accumulates): refused on both backends with the same report and bound.
TEST_F(CudaStepOnePassTest, OverflowBoundFromTheOnePassMaxMatchesTheCpu) {
  StepCase c = OnePassCase(2);
  c.rows = 64;
  c.cols = 512;
  c.hyper.lr = 3e38f;
  OnePassItemPair p(gpu(), cpu(), c, 800);
  const StepState before = p.dev->Download(p.host);
  StepReport rc, rg;
  ASSERT_TRUE(RunOnePassStep(cpu(), {p.HostItem()}, &rc).ok());
  ASSERT_TRUE(RunOnePassStep(gpu(), {p.DeviceItem()}, &rg).ok());
  EXPECT_FALSE(rg.ok);
  EXPECT_EQ(rg.items[0].outcome, StepOutcome::kOutOfRange);
  EXPECT_TRUE(SameReport(rg, rc));
  StepState now = p.dev->Download(p.host);
  EXPECT_EQ(now.outs[0], DequantizedBytes(cpu(), p.c, before, p.c.out_dtypes[0]));
  now.outs = before.outs;
  EXPECT_TRUE(SameState(now, before));
}

// Two items, one of each rounding: two apply launches, both cancelled, the second deciding.
TEST_F(CudaStepOnePassTest, CancelledStepWritesNoNewState) {
  OnePassItemPair p(gpu(), cpu(), OnePassCase(5), 700);
  OnePassItemPair q(gpu(), cpu(), OnePassCase(0), 701);
  const StepState before = p.dev->Download(p.host);
  const StepState next_before = p.dev_next->Download(p.host_next);
  const StepState q_before = q.dev->Download(q.host);
  const StepState q_next_before = q.dev_next->Download(q.host_next);
  DeviceBuffer word(gpu(), 4);
  const uint32_t token = 0x2345;
  word.Upload(&token, 4);
  StepReport rg;
  ASSERT_TRUE(RunOnePassStep(gpu(), {p.DeviceItem(), q.DeviceItem()}, &rg,
                             StepCancel{static_cast<const uint32_t*>(word.get()), token})
                  .ok());
  EXPECT_FALSE(rg.ok);
  EXPECT_TRUE(rg.cancelled);
  // The applies returned before writing, so the restore did not run: the outputs hold what
  // they held, and the next state is still the poison it started as.
  EXPECT_TRUE(SameState(p.dev->Download(p.host), before));
  EXPECT_TRUE(SameState(p.dev_next->Download(p.host_next), next_before));
  EXPECT_TRUE(SameState(q.dev->Download(q.host), q_before));
  EXPECT_TRUE(SameState(q.dev_next->Download(q.host_next), q_next_before));
}

TEST_F(CudaStepOnePassTest, LargeItemReportsTheFirstBadElementAndMatches) {
  // OnePassCase: 0 f32 RTN and 5 bf16 SR, each with error feedback and an output; 11 f32 SR
  // and 14 bf16 RTN, without either.
  for (int i : {0, 5, 11, 14}) {
    StepCase c = OnePassCase(i);
    c.rows = 1024;
    c.cols = 2048;
    SCOPED_TRACE(c.Name());
    OnePassItemPair p(gpu(), cpu(), c, 900 + static_cast<uint32_t>(i));
    StepReport rc, rg;
    ASSERT_TRUE(RunOnePassStep(cpu(), {p.HostItem()}, &rc).ok());
    ASSERT_TRUE(RunOnePassStep(gpu(), {p.DeviceItem()}, &rg).ok());
    ASSERT_TRUE(rc.ok);
    EXPECT_TRUE(SameReport(rg, rc));
    StepState next = p.dev_next->Download(p.host_next);
    next.outs = p.host_next.outs;  // the outputs are compared apart
    EXPECT_TRUE(SameState(next, p.host_next));
    EXPECT_EQ(p.dev->Download(p.host).outs, p.host.outs);
    // Non-finite values far apart (other warps, other CTAs): the smallest index is reported.
    for (size_t at : {size_t{1500000}, size_t{777777}, size_t{1999999}}) {
      Set(&p.u, p.c, 0, at, std::numeric_limits<float>::infinity());
    }
    p.dev->updates[0]->Upload(p.u[0].data(), p.u[0].size());
    PoisonState(&p.host_next);
    ASSERT_TRUE(RunOnePassStep(cpu(), {p.HostItem()}, &rc).ok());
    ASSERT_TRUE(RunOnePassStep(gpu(), {p.DeviceItem()}, &rg).ok());
    EXPECT_FALSE(rg.ok);
    EXPECT_EQ(rg.items[0].index, 777777);
    EXPECT_TRUE(SameReport(rg, rc));
  }
}

}  // namespace
}  // namespace fp4q::kernels
