// Engine: one-pass steps (fp4q.v1.StepRequest.one_pass) on the CPU backend. A one-pass step
// leaves every weight byte for byte as the two-pass step does, step after step; steps it cannot
// take run in two passes and say so; a refused one changes nothing; retries; the second copy is
// allocated once, counted in the budget, released with the weight, and a budget without room
// for it runs the step in two passes.
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "engine_step_testing.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine.h"
#include "testing/status_matchers.h"

namespace fp4q::server {
namespace {

using ::fp4q::testing::StatusIs;
using ::testing::HasSubstr;

// One-pass items take 1x16 blocks, so rows need not be a multiple of 16.
const Shape kShapes[] = {{1, 16}, {7, 48}, {32, 64}, {217, 256}};

WeightSpec Delayed(bool ef, bool sr) {
  WeightSpec w;
  w.ef = ef;
  w.rounding = sr ? kernels::Rounding::kStochastic : kernels::Rounding::kNearest;
  w.scaling = kernels::Scaling::kDelayed;
  return w;
}

class EngineOnePassTest : public EngineStepTest {
 protected:
  // One step of `names` (kShapes' shapes in order) with gradients from `seed`.
  absl::StatusOr<StepResult> StepOf(const std::vector<std::string>& names, int64_t step,
                                    uint32_t seed, bool one_pass) {
    StepRequest req;
    req.step = step;
    req.groups = {Sgd(0.2f)};
    req.one_pass = one_pass;
    for (size_t i = 0; i < names.size(); ++i) {
      const Shape s = kShapes[i % 4];
      req.items.push_back(
          Item(names[i], RandomF32(s.rows * s.cols, seed + static_cast<uint32_t>(i)), s.rows,
               s.cols));
    }
    return Step(req);
  }

  // Weights `prefix`0..3 of kShapes' shapes.
  std::vector<std::string> CreateSet(const std::string& prefix, const WeightSpec& spec) {
    std::vector<std::string> names;
    for (int i = 0; i < 4; ++i) {
      names.push_back(absl::StrCat(prefix, i));
      EXPECT_TRUE(Create(names.back(), kShapes[i].rows, kShapes[i].cols, 20 + i, spec).ok());
    }
    return names;
  }
};

TEST_F(EngineOnePassTest, EqualsTheTwoPassStepStepByStep) {
  for (int v = 0; v < 4; ++v) {
    const WeightSpec spec = Delayed(v & 1, v & 2);
    SCOPED_TRACE(absl::StrCat("variant ", v));
    const std::vector<std::string> one = CreateSet(absl::StrCat("one", v, "-"), spec);
    const std::vector<std::string> two = CreateSet(absl::StrCat("two", v, "-"), spec);
    for (int64_t step = 1; step <= 4; ++step) {
      absl::StatusOr<StepResult> r1 = StepOf(one, step, 100 * step, true);
      absl::StatusOr<StepResult> r2 = StepOf(two, step, 100 * step, false);
      ASSERT_TRUE(r1.ok()) << r1.status();
      ASSERT_TRUE(r2.ok()) << r2.status();
      EXPECT_TRUE(r1->one_pass);
      EXPECT_FALSE(r2->one_pass);
      for (size_t i = 0; i < one.size(); ++i) {
        EXPECT_TRUE(r1->items[i].applied);
        EXPECT_EQ(r1->items[i].global_amax, r2->items[i].global_amax) << i;
        EXPECT_EQ(r1->items[i].dequantized.inline_data, r2->items[i].dequantized.inline_data);
        EXPECT_TRUE(Take(one[i]) == Take(two[i])) << "weight " << i << " step " << step;
      }
    }
  }
}

TEST_F(EngineOnePassTest, StepsItCannotTakeRunInTwoPasses) {
  WeightSpec current = Delayed(true, false);
  current.scaling = kernels::Scaling::kCurrent;
  WeightSpec momentum = Delayed(true, false);
  momentum.optimizer.set = true;
  momentum.optimizer.momentum = true;
  WeightSpec tile = Delayed(true, false);
  tile.block = kernels::BlockShape::k16x16;
  ASSERT_TRUE(Create("cur", 32, 64, 1, current).ok());
  ASSERT_TRUE(Create("mom", 32, 64, 2, momentum).ok());
  ASSERT_TRUE(Create("tile", 32, 64, 3, tile).ok());
  ASSERT_TRUE(Create("plain", 32, 64, 4, Delayed(true, false)).ok());
  ASSERT_TRUE(Create("twin", 32, 64, 1, current).ok());
  const uint64_t used = engine_->store().used_bytes();
  for (const std::vector<std::string>& names :
       std::vector<std::vector<std::string>>{{"cur"}, {"mom"}, {"tile"}, {"plain", "cur"}}) {
    StepRequest req;
    req.step = 1;
    req.groups = {Sgd(0.1f)};
    if (names[0] == "mom") req.groups[0].momentum = 0.9f;  // with momentum 0 it is plain SGD
    req.one_pass = true;
    for (const std::string& n : names) req.items.push_back(Item(n, RandomF32(32 * 64, 7), 32, 64));
    absl::StatusOr<StepResult> r = Step(req);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_FALSE(r->one_pass) << names[0];
    EXPECT_TRUE(r->items[0].applied);
  }
  // No second copy was made for them, and the results are the two-pass step's.
  EXPECT_EQ(engine_->store().used_bytes(), used);
  StepRequest req;
  req.step = 1;
  req.groups = {Sgd(0.1f)};
  req.items.push_back(Item("twin", RandomF32(32 * 64, 7), 32, 64));
  ASSERT_TRUE(Step(req).ok());
  Snapshot a = Take("cur"), b = Take("twin");
  EXPECT_TRUE(a == b);
}

TEST_F(EngineOnePassTest, RefusedStepChangesNothingThenAppliesInOnePass) {
  const std::vector<std::string> names = CreateSet("w", Delayed(true, true));
  ASSERT_TRUE(StepOf(names, 1, 5, true).ok());
  std::vector<Snapshot> before;
  for (const std::string& n : names) before.push_back(Take(n));
  for (float bad : {std::numeric_limits<float>::quiet_NaN(),
                    -std::numeric_limits<float>::infinity()}) {
    StepRequest req;
    req.step = 2;
    req.groups = {Sgd(0.2f)};
    req.one_pass = true;
    std::vector<std::string> grads;
    for (size_t i = 0; i < names.size(); ++i) {
      const Shape s = kShapes[i];
      grads.push_back(RandomF32(s.rows * s.cols, 60 + static_cast<uint32_t>(i)));
      if (i == 2) std::memcpy(grads.back().data() + 4 * 41, &bad, 4);
      req.items.push_back(Item(names[i], grads.back(), s.rows, s.cols));
    }
    EXPECT_THAT(Step(req),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr(absl::StrCat("items[2].update: element 41 is ",
                                                std::isnan(bad) ? "NaN" : "-Inf", " (weight 'w2', "
                                                "step 2); nothing was applied"))));
    for (size_t i = 0; i < names.size(); ++i) EXPECT_TRUE(Take(names[i]) == before[i]) << i;
  }
  absl::StatusOr<StepResult> r = StepOf(names, 2, 60, true);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->one_pass);
  EXPECT_EQ(r->items[3].last_step, 2);
}

// A finite gradient whose result could overflow (lr 3e38) is refused by the bound the one pass
// computes from the gradients it read (NUMERICS 10.6), and nothing changes.
TEST_F(EngineOnePassTest, ResultsThatCouldOverflowAreRefused) {
  const std::vector<std::string> names = CreateSet("o", Delayed(true, false));
  std::vector<Snapshot> before;
  for (const std::string& n : names) before.push_back(Take(n));
  StepRequest req;
  req.step = 1;
  req.groups = {Sgd(3e38f)};
  req.one_pass = true;
  for (size_t i = 0; i < names.size(); ++i) {
    const Shape s = kShapes[i];
    req.items.push_back(Item(names[i], RandomF32(s.rows * s.cols, 30 + static_cast<uint32_t>(i)),
                             s.rows, s.cols));
  }
  EXPECT_THAT(Step(req), StatusIs(absl::StatusCode::kInvalidArgument,
                                  HasSubstr("could pass the f32 range")));
  for (size_t i = 0; i < names.size(); ++i) EXPECT_TRUE(Take(names[i]) == before[i]) << i;
  absl::StatusOr<StepResult> r = StepOf(names, 1, 40, true);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->one_pass);
}

TEST_F(EngineOnePassTest, RetriesAnswerAppliedFalseAndChangedRetriesAreRefused) {
  const std::vector<std::string> names = CreateSet("r", Delayed(true, false));
  absl::StatusOr<StepResult> r = StepOf(names, 1, 9, true);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->one_pass);
  std::vector<Snapshot> after;
  for (const std::string& n : names) after.push_back(Take(n));
  // The same step again: every item a retry (checked by the fingerprints the one pass kept).
  absl::StatusOr<StepResult> again = StepOf(names, 1, 9, true);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(again->one_pass);
  for (const StepItemResult& it : again->items) EXPECT_FALSE(it.applied);
  EXPECT_THAT(StepOf(names, 1, 10, true),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("already applied step 1 with a different update")));
  for (size_t i = 0; i < names.size(); ++i) EXPECT_TRUE(Take(names[i]) == after[i]) << i;
}

TEST_F(EngineOnePassTest, TheCopyIsMadeOnceCountedAndReleased) {
  const std::vector<std::string> names = CreateSet("m", Delayed(true, false));
  const uint64_t base = engine_->store().used_bytes();
  uint64_t copy = 0;  // codes, scales, record (8 bytes), statistics (32) and residual
  for (const Shape& s : kShapes) {
    const uint64_t n = static_cast<uint64_t>(s.rows * s.cols);
    copy += n / 2 + n / 16 + 8 + 32 + 4 * n;
  }
  for (int64_t step = 1; step <= 20; ++step) {
    absl::StatusOr<StepResult> r = StepOf(names, step, 300 + static_cast<uint32_t>(step), true);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE(r->one_pass);
    EXPECT_EQ(engine_->store().used_bytes(), base + copy) << "step " << step;
  }
  // Two-pass steps keep using the weights as they are.
  ASSERT_TRUE(StepOf(names, 21, 400, false).ok());
  EXPECT_EQ(engine_->store().used_bytes(), base + copy);
  for (const std::string& n : names) {
    NameRequest d;
    d.name = n;
    const absl::Status deleted =
        Await<EmptyResult>([&](auto done) { engine_->DeleteWeight({}, d, done); }).status();
    ASSERT_TRUE(deleted.ok()) << deleted;
  }
  EXPECT_EQ(engine_->store().used_bytes(), 0u);
}

TEST_F(EngineOnePassTest, NoRoomForTheCopyRunsTheStepInTwoPasses) {
  engine_ = nullptr;
  // Room for the weight (16 x 32 with its residual: 256 + 32 + 8 + 32 + 2048 bytes), not twice.
  engine_ = MakeEngine(4000);
  ASSERT_TRUE(Create("small", 16, 32, 1, Delayed(true, false)).ok());
  StepRequest req;
  req.step = 1;
  req.groups = {Sgd(0.1f)};
  req.one_pass = true;
  req.items.push_back(Item("small", RandomF32(16 * 32, 3), 16, 32));
  absl::StatusOr<StepResult> r = Step(req);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->one_pass);
  EXPECT_TRUE(r->items[0].applied);
  EXPECT_EQ(engine_->store().used_bytes(), 256u + 32 + 8 + 32 + 2048);
  // Two weights, room for one copy: the first gets it, the second does not, and the step runs
  // in two passes (the first weight keeps its copy for later steps).
  engine_ = nullptr;
  engine_ = MakeEngine(3 * 2376 + 100);
  ASSERT_TRUE(Create("x", 16, 32, 2, Delayed(true, false)).ok());
  ASSERT_TRUE(Create("y", 16, 32, 3, Delayed(true, false)).ok());
  req.items = {Item("x", RandomF32(16 * 32, 4), 16, 32), Item("y", RandomF32(16 * 32, 5), 16, 32)};
  r = Step(req);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->one_pass);
  EXPECT_TRUE(r->items[1].applied);
  EXPECT_EQ(engine_->store().used_bytes(), 3u * 2376);
}

}  // namespace
}  // namespace fp4q::server
