// Engine: the trainer's step on the CPU backend. A batched step equals the same updates made one
// UpdateWeight at a time, bit for bit; a refused step changes nothing; retries; optimizer state;
// namespaces. Replica groups are engine_groups_test.cc.
#include <stdlib.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "engine_step_testing.h"
#include "fp4q/kernels/backend.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/checkpoint.h"
#include "server/engine.h"
#include "testing/status_matchers.h"

namespace fp4q::server {
namespace {

using ::fp4q::testing::StatusIs;
using ::testing::HasSubstr;

const Shape kShapes[] = {{16, 32}, {7, 48}, {32, 64}, {217, 256}};

// A batched step and one UpdateWeight per weight give the same bytes, for every option.
TEST_F(EngineStepTest, BatchedStepEqualsOneUpdateWeightAtATime) {
  for (int variant = 0; variant < 8; ++variant) {
    WeightSpec spec;
    spec.ef = (variant & 1) != 0;
    spec.rounding =
        (variant & 2) != 0 ? kernels::Rounding::kStochastic : kernels::Rounding::kNearest;
    spec.scaling = (variant & 4) != 0 ? kernels::Scaling::kDelayed : kernels::Scaling::kCurrent;
    SCOPED_TRACE(absl::StrCat("variant ", variant));
    std::vector<std::string> batched, single;
    for (int i = 0; i < 4; ++i) {
      const Shape s = kShapes[i];
      WeightSpec w = spec;
      w.block = (s.rows % 16 == 0 && i == 2) ? kernels::BlockShape::k16x16
                                             : kernels::BlockShape::k1x16;
      const std::string b = absl::StrCat("b", variant, "-", i);
      const std::string u = absl::StrCat("u", variant, "-", i);
      ASSERT_TRUE(Create(b, s.rows, s.cols, 10 + i, w).ok());
      ASSERT_TRUE(Create(u, s.rows, s.cols, 10 + i, w).ok());
      batched.push_back(b);
      single.push_back(u);
    }
    for (int64_t step = 1; step <= 3; ++step) {
      StepRequest req;
      req.step = step;
      req.groups = {Sgd(0.3f)};
      std::vector<std::string> grads;
      for (int i = 0; i < 4; ++i) {
        const Shape s = kShapes[i];
        grads.push_back(RandomF32(s.rows * s.cols, static_cast<uint32_t>(100 * step + i)));
        req.items.push_back(Item(batched[i], grads.back(), s.rows, s.cols));
      }
      absl::StatusOr<StepResult> r = Step(req);
      ASSERT_TRUE(r.ok()) << r.status();
      ASSERT_EQ(r->items.size(), 4u);
      for (int i = 0; i < 4; ++i) {
        const Shape s = kShapes[i];
        absl::StatusOr<UpdateWeightResult> u = Update(single[i], step, grads[i], s.rows, s.cols,
                                                      0.3f);
        ASSERT_TRUE(u.ok()) << u.status();
        EXPECT_TRUE(r->items[i].applied);
        EXPECT_EQ(r->items[i].name, batched[i]);
        EXPECT_EQ(r->items[i].last_step, step);
        EXPECT_EQ(r->items[i].global_amax, u->global_amax) << i;
        EXPECT_EQ(r->items[i].dequantized.inline_data, u->dequantized.inline_data) << i;
        EXPECT_TRUE(Take(batched[i]) == Take(single[i])) << "weight " << i << " step " << step;
      }
    }
  }
}

// A non-finite gradient in item 2 refuses the whole step: the message names the item, the
// weight and the element, and no weight of the step changes.
TEST_F(EngineStepTest, NonFiniteGradientRefusesTheWholeStep) {
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(Create(absl::StrCat("w", i), 16, 32, i).ok());
  std::vector<Snapshot> before;
  for (int i = 0; i < 3; ++i) before.push_back(Take(absl::StrCat("w", i)));
  for (float bad : {std::numeric_limits<float>::quiet_NaN(),
                    std::numeric_limits<float>::infinity()}) {
    StepRequest req;
    req.step = 1;
    req.groups = {Sgd(0.1f)};
    std::vector<std::string> grads;  // the request's views point into these
    for (int i = 0; i < 3; ++i) {
      grads.push_back(RandomF32(16 * 32, 50 + i));
      if (i == 2) std::memcpy(grads.back().data() + 4 * 77, &bad, 4);
    }
    for (int i = 0; i < 3; ++i) req.items.push_back(Item(absl::StrCat("w", i), grads[i], 16, 32));
    EXPECT_THAT(Step(req), StatusIs(absl::StatusCode::kInvalidArgument,
                                    HasSubstr(std::isnan(bad) ? "items[2].update: element 77 is NaN"
                                                              : "items[2].update: element 77 is "
                                                                "Inf (weight")));
    EXPECT_THAT(Step(req), StatusIs(absl::StatusCode::kInvalidArgument,
                                    HasSubstr("weight 'w2', step 1); nothing was applied")));
  }
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(Take(absl::StrCat("w", i)) == before[i]) << i;
}

// A finite gradient whose result overflows (lr 3e38) is refused, and nothing changes.
TEST_F(EngineStepTest, ResultsThatWouldOverflowAreRefused) {
  for (kernels::Scaling scaling : {kernels::Scaling::kCurrent, kernels::Scaling::kDelayed}) {
    WeightSpec spec;
    spec.scaling = scaling;
    const std::string name = scaling == kernels::Scaling::kCurrent ? "cur" : "del";
    ASSERT_TRUE(Create(name, 16, 32, 3, spec).ok());
    const Snapshot before = Take(name);
    StepRequest req;
    req.step = 1;
    req.groups = {Sgd(3e38f)};
    req.items.push_back(Item(name, RandomF32(16 * 32, 4), 16, 32));
    EXPECT_THAT(Step(req), StatusIs(absl::StatusCode::kInvalidArgument,
                                    HasSubstr("nothing was applied")));
    EXPECT_TRUE(Take(name) == before) << name;
    // Afterwards an ordinary step applies.
    req.groups = {Sgd(0.01f)};
    absl::StatusOr<StepResult> ok = Step(req);
    ASSERT_TRUE(ok.ok()) << ok.status();
    EXPECT_TRUE(ok->items[0].applied);
  }
}

TEST_F(EngineStepTest, BadStepsNameTheItemAndFieldAndChangeNothing) {
  ASSERT_TRUE(Create("a", 16, 32, 1).ok());
  ASSERT_TRUE(Create("b", 16, 32, 2).ok());
  const Snapshot a0 = Take("a");
  const Snapshot b0 = Take("b");
  const std::string g = RandomF32(16 * 32, 5);
  auto base = [&] {
    StepRequest r;
    r.step = 1;
    r.groups = {Sgd(0.1f)};
    r.items = {Item("a", g, 16, 32), Item("b", g, 16, 32)};
    return r;
  };
  {
    StepRequest r = base();
    r.items[1].name = "nope";
    EXPECT_THAT(Step(r), StatusIs(absl::StatusCode::kNotFound,
                                  HasSubstr("items[1].name: no weight 'nope'")));
  }
  {
    StepRequest r = base();
    r.items[1].name = "a";
    EXPECT_THAT(Step(r), StatusIs(absl::StatusCode::kInvalidArgument,
                                  HasSubstr("items[1].name: 'a' appears twice in one step")));
  }
  {
    StepRequest r = base();
    r.items[1].update = Tensor(RandomF32(16 * 16, 6), 16, 16);
    EXPECT_THAT(Step(r), StatusIs(absl::StatusCode::kInvalidArgument,
                                  HasSubstr("items[1].update.shape: [16, 16] does not match "
                                            "weight 'b' of shape [16, 32]")));
  }
  {
    StepRequest r = base();
    r.items[0].update.data.inline_data = absl::string_view(g).substr(0, 100);
    EXPECT_THAT(Step(r), StatusIs(absl::StatusCode::kInvalidArgument,
                                  HasSubstr("items[0].update.inline_data: 100 bytes; DTYPE_F32 [16, 32] needs 2048")));
  }
  {
    StepRequest r = base();
    r.items[1].group = 3;
    EXPECT_THAT(Step(r), StatusIs(absl::StatusCode::kInvalidArgument,
                                  HasSubstr("items[1].group: 3 but the step has 1 groups")));
  }
  {
    StepRequest r = base();
    r.groups[0].lr = -1.0f;
    EXPECT_THAT(Step(r), StatusIs(absl::StatusCode::kInvalidArgument,
                                  HasSubstr("groups[0].lr: -1 must be finite and >= 0")));
  }
  {
    StepRequest r = base();
    r.groups.clear();
    EXPECT_THAT(Step(r), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("groups: empty")));
  }
  {
    StepRequest r = base();
    r.items.clear();
    EXPECT_THAT(Step(r), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("items: empty")));
  }
  {
    StepRequest r = base();
    r.step = 0;  // the weights were created at step 0: not newer
    r.items[0].update = Tensor(RandomF32(16 * 32, 7), 16, 32);
    EXPECT_THAT(Step(r), StatusIs(absl::StatusCode::kFailedPrecondition,
                                  HasSubstr("step: 0 is not newer than the last step 0 of weight "
                                            "'a' (its creation or restored step)")));
  }
  {
    engine_ = nullptr;
    engine_ = MakeEngine(uint64_t{1} << 30, /*max_items=*/1);
    ASSERT_TRUE(Create("a", 16, 32, 1).ok());
    ASSERT_TRUE(Create("b", 16, 32, 2).ok());
    EXPECT_THAT(Step(base()), StatusIs(absl::StatusCode::kInvalidArgument,
                                       HasSubstr("items: 2 items, at most 1 (fp4qd "
                                                 "--max_step_items)")));
    EXPECT_TRUE(Take("a") == a0);
    EXPECT_TRUE(Take("b") == b0);
    return;
  }
}

// A retry of an applied step with the same update: applied=false, nothing changes. With another
// update: FAILED_PRECONDITION naming the weight and the step, nothing changes.
TEST_F(EngineStepTest, RetriesAreIdempotentAndChangedRetriesAreRefused) {
  ASSERT_TRUE(Create("w", 16, 32, 1).ok());
  const std::string g = RandomF32(16 * 32, 9);
  StepRequest req;
  req.step = 4;
  req.groups = {Sgd(0.2f)};
  req.items = {Item("w", g, 16, 32)};
  absl::StatusOr<StepResult> first = Step(req);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(first->items[0].applied);
  const Snapshot after = Take("w");
  absl::StatusOr<StepResult> again = Step(req);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(again->items[0].applied);
  EXPECT_EQ(again->items[0].last_step, 4);
  EXPECT_EQ(again->items[0].dequantized.inline_data, first->items[0].dequantized.inline_data);
  EXPECT_EQ(again->items[0].global_amax, first->items[0].global_amax);
  EXPECT_TRUE(Take("w") == after);
  req.items[0].update = Tensor(RandomF32(16 * 32, 10), 16, 32);
  EXPECT_THAT(Step(req),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("update: weight 'w' already applied step 4 with a different "
                                 "update")));
  req.items[0].update = InlineF32(g, 16, 32);
  req.groups[0].lr = 0.3f;
  EXPECT_THAT(Step(req), StatusIs(absl::StatusCode::kFailedPrecondition,
                                  HasSubstr("with other hyperparameters")));
  req.step = 3;
  EXPECT_THAT(Step(req), StatusIs(absl::StatusCode::kFailedPrecondition,
                                  HasSubstr("step: 3 is older than the last step 4")));
  EXPECT_TRUE(Take("w") == after);
  // UpdateWeight follows the same rule.
  EXPECT_THAT(Update("w", 4, RandomF32(16 * 32, 11), 16, 32, 0.2f),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("different update")));
  absl::StatusOr<UpdateWeightResult> same = Update("w", 4, g, 16, 32, 0.2f);
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_FALSE(same->applied);
  EXPECT_TRUE(Take("w") == after);
}

TEST_F(EngineStepTest, OptimizerStateLivesWithTheWeight) {
  WeightSpec adam;
  adam.optimizer.set = true;
  adam.optimizer.kind = kernels::OptimizerKind::kAdamW;
  ASSERT_TRUE(Create("adam", 16, 32, 1, adam).ok());
  ASSERT_TRUE(Create("plain", 16, 32, 2).ok());
  // State bytes are counted: f32 m and v are 2 x 2048 bytes beyond the weight.
  absl::StatusOr<std::vector<TensorListing>> list = engine_->ListTensors();
  ASSERT_TRUE(list.ok());
  uint64_t adam_bytes = 0, plain_bytes = 0;
  for (const TensorListing& t : *list) {
    (t.name == "adam" ? adam_bytes : plain_bytes) = t.bytes;
  }
  EXPECT_EQ(adam_bytes - plain_bytes, 2u * 16 * 32 * 4);
  const std::string g = RandomF32(16 * 32, 3);
  StepRequest req;
  req.step = 1;
  req.groups = {AdamW(1e-3f)};
  req.items = {Item("adam", g, 16, 32)};
  absl::StatusOr<StepResult> r = Step(req);
  ASSERT_TRUE(r.ok()) << r.status();
  const Snapshot s = Take("adam");
  ASSERT_EQ(s.moments.size(), 2u);
  EXPECT_EQ(s.optimizer_steps, 1);
  EXPECT_NE(s.moments[0], std::string(16 * 32 * 4, '\0'));  // m moved
  // SGD hyperparameters for an AdamW weight: refused until ResetOptimizer.
  req.step = 2;
  req.groups = {Sgd(0.1f)};
  EXPECT_THAT(Step(req), StatusIs(absl::StatusCode::kFailedPrecondition,
                                  HasSubstr("keeps AdamW (F32 moments) state, but groups[0] sends "
                                            "SGD hyperparameters; switch optimizers with "
                                            "ResetOptimizer")));
  EXPECT_TRUE(Take("adam") == s);
  // Out-of-range hyperparameters name the field.
  req.groups = {AdamW(1e-3f)};
  req.groups[0].beta2 = 1.0f;
  EXPECT_THAT(Step(req), StatusIs(absl::StatusCode::kInvalidArgument,
                                  HasSubstr("groups[0].adamw.beta2: 1 must be in [0, 1)")));
  req.groups = {AdamW(1e-3f)};
  req.groups[0].eps = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THAT(Step(req), StatusIs(absl::StatusCode::kInvalidArgument,
                                  HasSubstr("groups[0].adamw.eps: nan must be finite and > 0")));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const struct {
    void (*set)(HyperIn&, float);
    float value;
    const char* message;
  } bad_hyper[] = {
      {[](HyperIn& g, float v) { g.lr = v; }, nan, "groups[0].lr: nan must be finite and >= 0"},
      {[](HyperIn& g, float v) { g.lr = v; }, -1e-3f,
       "groups[0].lr: -0.001 must be finite and >= 0"},
      {[](HyperIn& g, float v) { g.beta1 = v; }, -0.5f,
       "groups[0].adamw.beta1: -0.5 must be in [0, 1)"},
      {[](HyperIn& g, float v) { g.beta1 = v; }, nan, "groups[0].adamw.beta1: nan must be in [0, 1)"},
      {[](HyperIn& g, float v) { g.beta1 = v; }, 1.5f,
       "groups[0].adamw.beta1: 1.5 must be in [0, 1)"},
      {[](HyperIn& g, float v) { g.beta2 = v; }, nan, "groups[0].adamw.beta2: nan must be in [0, 1)"},
      {[](HyperIn& g, float v) { g.eps = v; }, -1.0f,
       "groups[0].adamw.eps: -1 must be finite and > 0"},
  };
  for (const auto& b : bad_hyper) {
    SCOPED_TRACE(b.message);
    req.groups = {AdamW(1e-3f)};
    b.set(req.groups[0], b.value);
    EXPECT_THAT(Step(req), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(b.message)));
  }
  EXPECT_TRUE(Take("adam") == s);  // none of the refused steps changed the weight or its state
  // No state on a plain weight.
  GetWeightRequest get;
  get.name = "plain";
  get.optimizer_state = true;
  EXPECT_THAT(Await<GetWeightResult>([&](auto done) { engine_->GetWeight({}, get, done); }),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("optimizer_state: weight 'plain' keeps no optimizer state")));
  // ResetOptimizer switches to SGD with momentum: zeroed buffer, step count 0.
  ResetOptimizerRequest reset;
  reset.name = "adam";
  reset.optimizer.set = true;
  reset.optimizer.kind = kernels::OptimizerKind::kSgd;
  reset.optimizer.momentum = true;
  absl::StatusOr<ResetOptimizerResult> rr = Await<ResetOptimizerResult>(
      [&](auto done) { engine_->ResetOptimizer({}, reset, done); });
  ASSERT_TRUE(rr.ok()) << rr.status();
  EXPECT_EQ(rr->weight.optimizer_steps, 0);
  EXPECT_TRUE(rr->weight.options.optimizer.momentum);
  const Snapshot z = Take("adam");
  ASSERT_EQ(z.moments.size(), 1u);
  EXPECT_EQ(z.moments[0], std::string(16 * 32 * 4, '\0'));
  req.groups = {Sgd(0.1f)};
  req.groups[0].momentum = 0.9f;
  absl::StatusOr<StepResult> sgd = Step(req);
  ASSERT_TRUE(sgd.ok()) << sgd.status();
  // Momentum on a weight without a buffer is refused.
  req.items = {Item("plain", g, 16, 32)};
  EXPECT_THAT(Step(req), StatusIs(absl::StatusCode::kFailedPrecondition,
                                  HasSubstr("groups[0].sgd.momentum: 0.9 but weight 'plain' keeps "
                                            "no momentum buffer")));
}

// A checkpoint keeps every optimizer state exactly (moments in their dtype, amsgrad's maximum,
// the step counts that drive bias correction): restored into a fresh engine, each weight reads
// back the same bytes, and the next step from the restored state equals the next step from the
// original, bit for bit.
TEST_F(EngineStepTest, OptimizerStateSurvivesACheckpointBitForBit) {
  char tmpl[] = "/tmp/fp4q_step_ckpt_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  auto engine_at = [&]() {
    return ::fp4q::server::testing::TestCpuEngine(uint64_t{1} << 30, dir);
  };
  engine_ = engine_at();
  struct W {
    const char* name;
    kernels::OptimizerKind kind;
    bool momentum, amsgrad;
    kernels::StateDType dtype;
  };
  const W weights[] = {
      {"adam-f32", kernels::OptimizerKind::kAdamW, false, false, kernels::StateDType::kF32},
      {"adam-bf16-amsgrad", kernels::OptimizerKind::kAdamW, false, true,
       kernels::StateDType::kBF16},
      {"adam-nvfp4", kernels::OptimizerKind::kAdamW, false, false, kernels::StateDType::kNvfp4},
      {"sgd-momentum", kernels::OptimizerKind::kSgd, true, false, kernels::StateDType::kF32},
  };
  for (size_t i = 0; i < std::size(weights); ++i) {
    WeightSpec spec;
    spec.optimizer.set = true;
    spec.optimizer.kind = weights[i].kind;
    spec.optimizer.momentum = weights[i].momentum;
    spec.optimizer.amsgrad = weights[i].amsgrad;
    spec.optimizer.dtype = weights[i].dtype;
    ASSERT_TRUE(Create(weights[i].name, 16, 32, 40 + static_cast<uint32_t>(i), spec).ok());
  }
  // One step request per optimizer: AdamW's weights in group 0, SGD's in its own request.
  auto step = [&](int64_t t) {
    StepRequest adam, sgd;
    adam.step = sgd.step = t;
    adam.groups = {AdamW(1e-2f)};
    sgd.groups = {Sgd(0.05f)};
    sgd.groups[0].momentum = 0.9f;
    for (size_t i = 0; i < std::size(weights); ++i) {
      StepItemIn it = Item(weights[i].name, RandomF32(16 * 32, static_cast<uint32_t>(500 + 10 * t + i)), 16, 32);
      (weights[i].kind == kernels::OptimizerKind::kAdamW ? adam : sgd).items.push_back(it);
    }
    absl::StatusOr<StepResult> a = Step(adam);
    absl::StatusOr<StepResult> b = Step(sgd);
    EXPECT_TRUE(a.ok()) << a.status();
    EXPECT_TRUE(b.ok()) << b.status();
  };
  step(1);
  step(2);
  std::vector<Snapshot> saved, next;
  for (const W& w : weights) saved.push_back(Take(w.name));
  ASSERT_TRUE(engine_->CheckpointNow().ok());
  step(3);
  for (const W& w : weights) next.push_back(Take(w.name));

  engine_ = engine_at();
  ASSERT_TRUE(engine_->Restore().ok());
  for (size_t i = 0; i < std::size(weights); ++i) {
    SCOPED_TRACE(weights[i].name);
    const Snapshot got = Take(weights[i].name);
    EXPECT_EQ(got.optimizer_steps, 2);
    EXPECT_EQ(got.moments.size(), weights[i].amsgrad ? 3u : weights[i].momentum ? 1u : 2u);
    EXPECT_TRUE(got == saved[i]);
    EXPECT_FALSE(got == next[i]);  // step 3 changed it, so the comparison below can fail
  }
  step(3);
  for (size_t i = 0; i < std::size(weights); ++i) {
    SCOPED_TRACE(weights[i].name);
    EXPECT_TRUE(Take(weights[i].name) == next[i]);
  }
  engine_ = MakeEngine(uint64_t{1} << 30);
  std::remove((dir + "/" + kCheckpointFileName).c_str());
  ::rmdir(dir.c_str());
}

TEST_F(EngineStepTest, OptimizerStateCountsAgainstTheBudget) {
  engine_ = nullptr;
  // Room for the weight with its residual (16*32*4.5 + 40 bytes) but not for f32 moments.
  engine_ = MakeEngine(4000);
  WeightSpec adam;
  adam.optimizer.set = true;
  adam.optimizer.kind = kernels::OptimizerKind::kAdamW;
  EXPECT_THAT(Create("adam", 16, 32, 1, adam),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("state budget")));
  EXPECT_TRUE(engine_->ListTensors()->empty());
  adam.optimizer.dtype = kernels::StateDType::kNvfp4;  // 2 x (256 + 32 + 8) bytes fit
  EXPECT_TRUE(Create("adam", 16, 32, 1, adam).ok());
}

// K ranks' contributions are summed in rank order and divided by K: the stored weight equals
// one worker's step with that gradient, bit for bit.
TEST_F(EngineStepTest, NamespacesKeepJobsApart) {
  RequestContext a, b, bound;
  a.session_id = engine_->OpenSession(RequestContext{}, "job-a", "job-a")->session_id;
  b.session_id = engine_->OpenSession(RequestContext{}, "job-b", "job-b")->session_id;
  ASSERT_TRUE(Create("layer0.weight", 16, 32, 1, {}, a).ok());
  ASSERT_TRUE(Create("layer0.weight", 16, 32, 2, {}, b).ok());
  ASSERT_TRUE(Create("layer1.weight", 16, 32, 3, {}, b).ok());
  EXPECT_EQ(engine_->ListTensors(a)->size(), 1u);
  EXPECT_EQ(engine_->ListTensors(b)->size(), 2u);
  EXPECT_TRUE(engine_->ListTensors()->empty());
  EXPECT_EQ((*engine_->ListTensors(a))[0].name, "layer0.weight");
  EXPECT_NE(Take("layer0.weight", a).codes, Take("layer0.weight", b).codes);
  // A token bound to job-a cannot open job-b's sessions nor use one.
  bound.namespace_bound = true;
  bound.bound_namespace = "job-a";
  EXPECT_THAT(engine_->OpenSession(bound, "x", "job-b"),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("namespace: 'job-b' is not the namespace this caller's token is "
                                 "bound to ('job-a')")));
  bound.session_id = b.session_id;
  EXPECT_THAT(engine_->ListTensors(bound), StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("bound to ('job-a')")));
  EXPECT_THAT(engine_->OpenSession(RequestContext{}, "x", "bad|name"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("namespace: byte 3")));
  // Deleting job-b's namespace leaves job-a alone.
  absl::StatusOr<DeleteNamespaceResult> del =
      Await<DeleteNamespaceResult>([&](auto d) { engine_->DeleteNamespace(b, d); });
  ASSERT_TRUE(del.ok()) << del.status();
  EXPECT_EQ(del->deleted, 2u);
  EXPECT_TRUE(engine_->ListTensors(b)->empty());
  EXPECT_EQ(engine_->ListTensors(a)->size(), 1u);
  // An unknown session is not the default namespace.
  RequestContext gone;
  gone.session_id = "0123456789abcdef0123456789abcdef";
  EXPECT_THAT(engine_->ListTensors(gone),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("unknown or expired session")));
}

}  // namespace
}  // namespace fp4q::server
