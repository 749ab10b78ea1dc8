// Engine: the trainer's step on the CPU backend. A batched step equals the same updates made one
// UpdateWeight at a time, bit for bit; a refused step changes nothing; retries; optimizer state;
// replica groups (a K-rank step equals a one-worker replay of the rank-order mean); namespaces.
#include <cmath>
#include <cstring>
#include <deque>
#include <mutex>
#include <limits>
#include <map>
#include <thread>
#include <vector>

#include "engine_test_util.h"
#include "fp4q/kernels/backend.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine.h"
#include "testing/status_matchers.h"

namespace fp4q::server {
namespace {

using ::fp4q::server::testing::Await;
using ::fp4q::server::testing::InlineF32;
using ::fp4q::server::testing::RandomF32;
using ::fp4q::testing::StatusIs;
using ::testing::HasSubstr;

// Everything a weight holds, as bytes: what "nothing changed" compares.
struct Snapshot {
  std::string codes, scales, residual, dq;
  float amax = 0;
  int64_t last_step = 0;
  int64_t optimizer_steps = 0;
  std::vector<std::string> moments;
  bool operator==(const Snapshot& o) const {
    return codes == o.codes && scales == o.scales && residual == o.residual && dq == o.dq &&
           amax == o.amax && last_step == o.last_step && optimizer_steps == o.optimizer_steps &&
           moments == o.moments;
  }
};

struct WeightSpec {
  bool ef = true;
  int block = 1;     // 1x16, 2: 16x16
  int rounding = 1;  // 1 RTN, 2 SR
  kernels::Scaling scaling = kernels::Scaling::kCurrent;
  OptimizerSpecIn optimizer;
  int64_t step = 0;
};
class EngineStepTest : public ::testing::Test {

 protected:
  void SetUp() override { engine_ = MakeEngine(uint64_t{1} << 30); }

  std::unique_ptr<Engine> MakeEngine(uint64_t budget, int max_items = 4096) {
    std::vector<std::unique_ptr<kernels::Backend>> b;
    b.push_back(kernels::CreateCpuBackend());
    EngineOptions o;
    o.state_budget_bytes = budget;
    o.cpu_workers = 2;
    o.max_step_items = max_items;
    auto e = Engine::Create(DeviceSet::FromBackends(std::move(b), true), o, nullptr, nullptr);
    EXPECT_TRUE(e.ok()) << e.status();
    return std::move(*e);
  }

  absl::Status Create(const std::string& name, int64_t rows, int64_t cols, uint32_t seed,
                      const WeightSpec& spec = {}, const RequestContext& ctx = {}) {
    CreateWeightRequest r;
    r.name = name;
    init_[name] = RandomF32(rows * cols, seed, 0.05f);
    r.initial = InlineF32(init_[name], rows, cols);
    r.options.error_feedback = spec.ef;
    r.options.block = spec.block;
    r.options.rounding = spec.rounding;
    r.options.seed = 99;
    r.options.scaling = spec.scaling;
    r.options.optimizer = spec.optimizer;
    r.step = spec.step;
    return Await<CreateWeightResult>([&](auto done) { engine_->CreateWeight(ctx, r, done); })
        .status();
  }

  Snapshot Take(const std::string& name, const RequestContext& ctx = {}) {
    GetWeightRequest r;
    r.name = name;
    r.dequantized = true;
    r.quantized = true;
    absl::StatusOr<GetWeightResult> info =
        Await<GetWeightResult>([&](auto done) { engine_->GetWeight(ctx, r, done); });
    EXPECT_TRUE(info.ok()) << info.status();
    Snapshot s;
    if (!info.ok()) return s;
    if (info->weight.options.error_feedback) {
      r.residual = true;
      r.dequantized = false;
      r.quantized = false;
      info = Await<GetWeightResult>([&](auto done) { engine_->GetWeight(ctx, r, done); });
      s.residual = info->residual.inline_data;
      r.residual = false;
      r.dequantized = true;
      r.quantized = true;
    }
    if (info->weight.options.optimizer.kind == kernels::OptimizerKind::kAdamW ||
        info->weight.options.optimizer.momentum) {
      r.optimizer_state = true;
    }
    info = Await<GetWeightResult>([&](auto done) { engine_->GetWeight(ctx, r, done); });
    EXPECT_TRUE(info.ok()) << info.status();
    s.codes = info->quantized.codes.inline_data;
    s.scales = info->quantized.scales.inline_data;
    s.dq = info->dequantized.inline_data;
    s.amax = info->quantized.global_amax;
    s.last_step = info->weight.last_step;
    s.optimizer_steps = info->weight.optimizer_steps;
    for (const MomentResult& m : info->moments) {
      s.moments.push_back(m.dense.inline_data + m.quantized.codes.inline_data +
                          m.quantized.scales.inline_data);
    }
    return s;
  }

  // Requests view their tensors' bytes: the fixture keeps every one alive.
  const std::string& Keep(std::string bytes) {
    std::lock_guard<std::mutex> lock(kept_mu_);
    kept_.push_back(std::move(bytes));
    return kept_.back();
  }
  TensorIn Tensor(std::string bytes, int64_t rows, int64_t cols) {
    return InlineF32(Keep(std::move(bytes)), rows, cols);
  }
  StepItemIn Item(const std::string& name, std::string grad, int64_t rows, int64_t cols,
                  uint32_t group = 0) {
    StepItemIn it;
    it.name = name;
    it.update = Tensor(std::move(grad), rows, cols);
    it.return_dequantized = true;
    it.group = group;
    return it;
  }

  absl::StatusOr<StepResult> Step(StepRequest req, const RequestContext& ctx = {}) {
    return Await<StepResult>([&](auto done) { engine_->Step(ctx, std::move(req), done); });
  }

  absl::StatusOr<UpdateWeightResult> Update(const std::string& name, int64_t step,
                                            const std::string& grad, int64_t rows, int64_t cols,
                                            float lr) {
    UpdateWeightRequest r;
    r.name = name;
    r.step = step;
    r.update = InlineF32(grad, rows, cols);
    r.lr = lr;
    r.return_dequantized = true;
    return Await<UpdateWeightResult>([&](auto done) { engine_->UpdateWeight({}, r, done); });
  }

  static HyperIn Sgd(float lr) {
    HyperIn h;
    h.lr = lr;
    return h;
  }
  static HyperIn AdamW(float lr, float wd = 0.01f) {
    HyperIn h;
    h.lr = lr;
    h.optimizer = kernels::OptimizerKind::kAdamW;
    h.beta1 = 0.9f;
    h.beta2 = 0.999f;
    h.eps = 1e-8f;
    h.weight_decay = wd;
    return h;
  }

  std::unique_ptr<Engine> engine_;
  std::map<std::string, std::string> init_;
  std::mutex kept_mu_;
  std::deque<std::string> kept_;
};

struct Shape {
  int64_t rows, cols;
};
const Shape kShapes[] = {{16, 32}, {7, 48}, {32, 64}, {217, 256}};

// A batched step and one UpdateWeight per weight give the same bytes, for every option.
TEST_F(EngineStepTest, BatchedStepEqualsOneUpdateWeightAtATime) {
  for (int variant = 0; variant < 8; ++variant) {
    WeightSpec spec;
    spec.ef = (variant & 1) != 0;
    spec.rounding = (variant & 2) != 0 ? 2 : 1;
    spec.scaling = (variant & 4) != 0 ? kernels::Scaling::kDelayed : kernels::Scaling::kCurrent;
    SCOPED_TRACE(absl::StrCat("variant ", variant));
    std::vector<std::string> batched, single;
    for (int i = 0; i < 4; ++i) {
      const Shape s = kShapes[i];
      WeightSpec w = spec;
      w.block = (s.rows % 16 == 0 && i == 2) ? 2 : 1;
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
    r.items[0].update.dtype = kWireU8;
    EXPECT_THAT(Step(r), StatusIs(absl::StatusCode::kInvalidArgument,
                                  HasSubstr("items[0].update.dtype")));
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
TEST_F(EngineStepTest, ReplicaGroupEqualsARankOrderReplay) {
  constexpr int kRanks = 3;
  ASSERT_TRUE(Create("g", 16, 32, 1).ok());
  ASSERT_TRUE(Create("replay", 16, 32, 1).ok());
  std::vector<RequestContext> ctx(kRanks);
  for (int r = 0; r < kRanks; ++r) {
    absl::StatusOr<OpenSessionResult> s = engine_->OpenSession(absl::StrCat("rank", r));
    ASSERT_TRUE(s.ok());
    ctx[r].session_id = s->session_id;
    JoinGroupRequest j;
    j.group = "dp";
    j.world_size = kRanks;
    j.rank = static_cast<uint32_t>(r);
    ASSERT_TRUE(Await<JoinGroupResult>([&](auto d) { engine_->JoinGroup(ctx[r], j, d); }).ok());
  }
  for (int64_t step = 1; step <= 3; ++step) {
    std::vector<std::string> grads;
    for (int r = 0; r < kRanks; ++r) {
      grads.push_back(RandomF32(16 * 32, static_cast<uint32_t>(1000 * step + r)));
    }
    std::vector<absl::StatusOr<StepResult>> results(kRanks, absl::UnknownError("unset"));
    std::vector<std::thread> threads;
    for (int r = 0; r < kRanks; ++r) {
      threads.emplace_back([&, r] {
        StepRequest req;
        req.step = step;
        req.groups = {Sgd(0.25f)};
        req.items = {Item("g", grads[r], 16, 32)};
        req.has_replica = true;
        req.replica_group = "dp";
        req.rank = static_cast<uint32_t>(r);
        results[r] = Step(req, ctx[r]);
      });
    }
    for (auto& t : threads) t.join();
    // The replay: f32 adds in rank order, then / K.
    std::vector<float> sum(16 * 32);
    for (int r = 0; r < kRanks; ++r) {
      const std::vector<float> g = testing::AsFloats(grads[r]);
      for (size_t i = 0; i < sum.size(); ++i) sum[i] = r == 0 ? g[i] : sum[i] + g[i];
    }
    for (float& v : sum) v = v / static_cast<float>(kRanks);
    std::string mean(sum.size() * 4, '\0');
    std::memcpy(mean.data(), sum.data(), mean.size());
    StepRequest one;
    one.step = step;
    one.groups = {Sgd(0.25f)};
    one.items = {Item("replay", mean, 16, 32)};
    absl::StatusOr<StepResult> replay = Step(one);
    ASSERT_TRUE(replay.ok()) << replay.status();
    for (int r = 0; r < kRanks; ++r) {
      ASSERT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r].status();
      EXPECT_EQ(results[r]->world_size, 3u);
      EXPECT_TRUE(results[r]->items[0].applied);
      EXPECT_EQ(results[r]->items[0].dequantized.inline_data,
                replay->items[0].dequantized.inline_data);
    }
    Snapshot a = Take("g"), b = Take("replay");
    EXPECT_EQ(a.codes, b.codes);
    EXPECT_EQ(a.residual, b.residual);
  }
  // A rank retrying the applied step alone with the same update: applied=false; with another:
  // refused.
  StepRequest retry;
  retry.step = 3;
  retry.groups = {Sgd(0.25f)};
  retry.items = {Item("g", RandomF32(16 * 32, 3001), 16, 32)};
  retry.has_replica = true;
  retry.replica_group = "dp";
  retry.rank = 1;
  absl::StatusOr<StepResult> same = Step(retry, ctx[1]);
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_FALSE(same->items[0].applied);
  retry.items = {Item("g", RandomF32(16 * 32, 4242), 16, 32)};
  EXPECT_THAT(Step(retry, ctx[1]),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("rank 1's items[0].update: weight 'g' already applied step 3 with a "
                                 "different update")));
}

// A group's weights spread over the devices that serve it: each new weight goes to the device
// holding the fewest state bytes unless the caller names one; the group's step updates every
// weight on its holder, and the result equals a one-device engine's, bit for bit.
TEST_F(EngineStepTest, AGroupsWeightsSpreadOverTheDevicesAndStepWhereTheyLive) {
  std::unique_ptr<Engine> single = std::move(engine_);
  {
    std::vector<std::unique_ptr<kernels::Backend>> b;
    b.push_back(std::make_unique<testing::FakeIpcBackend>("GPU-fake-0"));
    b.push_back(std::make_unique<testing::FakeIpcBackend>("GPU-fake-1"));
    EngineOptions o;
    o.state_budget_bytes = uint64_t{1} << 30;
    auto e = Engine::Create(DeviceSet::FromBackends(std::move(b), true), o, nullptr, nullptr);
    ASSERT_TRUE(e.ok()) << e.status();
    engine_ = std::move(*e);
  }
  struct Shape {
    const char* name;
    int64_t rows, cols;
  };
  const std::vector<Shape> shapes = {{"a", 16, 32}, {"b", 32, 32}, {"c", 16, 64}, {"d", 16, 32}};
  std::map<std::string, std::string> placed;
  for (size_t i = 0; i < shapes.size(); ++i) {
    CreateWeightRequest r;
    r.name = shapes[i].name;
    init_[r.name] = RandomF32(shapes[i].rows * shapes[i].cols, 10 + i, 0.05f);
    r.initial = InlineF32(init_[r.name], shapes[i].rows, shapes[i].cols);
    r.options.error_feedback = true;
    r.options.seed = 99;
    if (i == 3) r.device_uuid = "GPU-fake-0";  // the caller's placement
    absl::StatusOr<CreateWeightResult> c =
        Await<CreateWeightResult>([&](auto d) { engine_->CreateWeight({}, r, d); });
    ASSERT_TRUE(c.ok()) << c.status();
    placed[r.name] = c->weight.device_uuid;
  }
  // By state bytes: a (0 vs 0 bytes) on the first, b on the other, c beside the smaller a;
  // d where it was asked for.
  EXPECT_EQ(placed, (std::map<std::string, std::string>{
                        {"a", "GPU-fake-0"}, {"b", "GPU-fake-1"}, {"c", "GPU-fake-0"},
                        {"d", "GPU-fake-0"}}));
  std::vector<RequestContext> ctx(2);
  for (int r = 0; r < 2; ++r) {
    ctx[r].session_id = engine_->OpenSession(absl::StrCat("rank", r))->session_id;
    JoinGroupRequest j;
    j.group = "dp";
    j.world_size = 2;
    j.rank = static_cast<uint32_t>(r);
    ASSERT_TRUE(Await<JoinGroupResult>([&](auto d) { engine_->JoinGroup(ctx[r], j, d); }).ok());
  }
  std::vector<std::vector<std::string>> grads;  // [step][rank * 4 + weight]
  for (int64_t step = 1; step <= 2; ++step) {
    grads.emplace_back();
    for (int r = 0; r < 2; ++r) {
      for (size_t i = 0; i < shapes.size(); ++i) {
        grads.back().push_back(RandomF32(shapes[i].rows * shapes[i].cols,
                                         static_cast<uint32_t>(100 * step + 10 * r + i)));
      }
    }
    std::vector<absl::StatusOr<StepResult>> results(2, absl::UnknownError("unset"));
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r) {
      threads.emplace_back([&, r] {
        StepRequest req;
        req.step = step;
        req.groups = {Sgd(0.25f)};
        for (size_t i = 0; i < shapes.size(); ++i) {
          req.items.push_back(Item(shapes[i].name, grads.back()[r * shapes.size() + i],
                                   shapes[i].rows, shapes[i].cols));
        }
        req.has_replica = true;
        req.replica_group = "dp";
        req.rank = static_cast<uint32_t>(r);
        results[r] = Step(req, ctx[r]);
      });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < 2; ++r) ASSERT_TRUE(results[r].ok()) << results[r].status();
  }
  std::map<std::string, Snapshot> spread;
  for (const Shape& w : shapes) spread[w.name] = Take(w.name);
  // The replay on one device: the same weights, each step's two gradients summed in rank
  // order and halved.
  engine_ = std::move(single);
  for (size_t i = 0; i < shapes.size(); ++i) {
    CreateWeightRequest r;
    r.name = shapes[i].name;
    r.initial = InlineF32(init_[r.name], shapes[i].rows, shapes[i].cols);
    r.options.error_feedback = true;
    r.options.seed = 99;
    ASSERT_TRUE(
        Await<CreateWeightResult>([&](auto d) { engine_->CreateWeight({}, r, d); }).ok());
  }
  for (int64_t step = 1; step <= 2; ++step) {
    StepRequest one;
    one.step = step;
    one.groups = {Sgd(0.25f)};
    for (size_t i = 0; i < shapes.size(); ++i) {
      const std::vector<float> g0 = testing::AsFloats(grads[step - 1][i]);
      const std::vector<float> g1 = testing::AsFloats(grads[step - 1][shapes.size() + i]);
      std::string mean(g0.size() * 4, '\0');
      for (size_t k = 0; k < g0.size(); ++k) {
        const float v = (g0[k] + g1[k]) / 2.0f;
        std::memcpy(mean.data() + 4 * k, &v, 4);
      }
      one.items.push_back(Item(shapes[i].name, mean, shapes[i].rows, shapes[i].cols));
    }
    ASSERT_TRUE(Step(one).ok());
  }
  for (const Shape& w : shapes) {
    const Snapshot replay = Take(w.name);
    EXPECT_EQ(spread[w.name].codes, replay.codes) << w.name;
    EXPECT_EQ(spread[w.name].residual, replay.residual) << w.name;
    EXPECT_EQ(spread[w.name].last_step, 2) << w.name;
  }
}

TEST_F(EngineStepTest, ReplicaGroupFailuresApplyNothing) {
  ASSERT_TRUE(Create("g", 16, 32, 1).ok());
  const Snapshot before = Take("g");
  std::vector<RequestContext> ctx(2);
  for (int r = 0; r < 2; ++r) {
    ctx[r].session_id = engine_->OpenSession(absl::StrCat("rank", r))->session_id;
    JoinGroupRequest j;
    j.group = "dp";
    j.world_size = 2;
    j.rank = static_cast<uint32_t>(r);
    j.deadline_ms = 200;
    ASSERT_TRUE(Await<JoinGroupResult>([&](auto d) { engine_->JoinGroup(ctx[r], j, d); }).ok());
  }
  auto req = [&](int rank, const std::string& name, int64_t step) {
    StepRequest s;
    s.step = step;
    s.groups = {Sgd(0.1f)};
    s.items = {Item(name, RandomF32(16 * 32, static_cast<uint32_t>(rank)), 16, 32)};
    s.has_replica = true;
    s.replica_group = "dp";
    s.rank = static_cast<uint32_t>(rank);
    return s;
  };
  // A missing rank: the deadline names it.
  EXPECT_THAT(Step(req(0, "g", 1), ctx[0]),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       HasSubstr("replica: ranks [1] of group 'dp' did not send step 1 within "
                                 "200 ms; nothing was applied")));
  EXPECT_TRUE(Take("g") == before);
  // Ranks disagreeing on the names.
  ASSERT_TRUE(Create("h", 16, 32, 2).ok());
  absl::StatusOr<StepResult> first = absl::UnknownError("unset");
  std::thread t([&] { first = Step(req(0, "g", 1), ctx[0]); });
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_THAT(Step(req(1, "h", 1), ctx[1]),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("replica: rank 1's items[0].name ('h' vs 'g') differs from "
                                 "rank 0's")));
  t.join();
  EXPECT_THAT(first, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("differs")));
  EXPECT_TRUE(Take("g") == before);
  // Ranks disagreeing on the step number, a shape or the hyperparameters: rank 1's contribution
  // is refused naming the field, rank 0's fails with it, and nothing is applied.
  auto disagree = [&](StepRequest second, const std::string& message) {
    absl::StatusOr<StepResult> rank0 = absl::UnknownError("unset");
    std::thread r0([&] { rank0 = Step(req(0, "g", 1), ctx[0]); });
    absl::SleepFor(absl::Milliseconds(50));
    EXPECT_THAT(Step(second, ctx[1]),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(message)));
    r0.join();
    EXPECT_THAT(rank0, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(message)));
    EXPECT_TRUE(Take("g") == before) << message;
  };
  disagree(req(1, "g", 2),
           "replica: rank 1 sent step 2 while group 'dp' collects step 1 (ranks must step "
           "together); nothing was applied");
  StepRequest transposed = req(1, "g", 1);
  transposed.items = {Item("g", RandomF32(16 * 32, 1), 32, 16)};
  disagree(transposed,
           "replica: rank 1's items[0].update.shape ([32, 16] vs [16, 32]) differs from rank "
           "0's; nothing was applied");
  StepRequest faster = req(1, "g", 1);
  faster.groups = {Sgd(0.2f)};
  disagree(faster,
           "replica: rank 1's groups[0] hyperparameters differs from rank 0's; nothing was "
           "applied");
  // A session of another namespace cannot reach this namespace's group, and may not name it.
  RequestContext stranger;
  stranger.session_id = engine_->OpenSession(RequestContext{}, "stranger", "job-x")->session_id;
  EXPECT_THAT(Step(req(0, "g", 1), stranger),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("replica.group: no group 'dp' (JoinGroup first)")));
  EXPECT_TRUE(Take("g") == before);
  // A rank whose session ends during the step: named, nothing applied, the rank is free.
  std::thread u([&] { first = Step(req(0, "g", 1), ctx[0]); });
  absl::SleepFor(absl::Milliseconds(50));
  ASSERT_TRUE(Await<uint32_t>([&](auto d) { engine_->CloseSession(ctx[1], d); }).ok());
  u.join();
  EXPECT_THAT(first, StatusIs(absl::StatusCode::kUnavailable,
                              HasSubstr("rank 1 of group 'dp' lost its session")));
  EXPECT_TRUE(Take("g") == before);
  // Bad joins.
  RequestContext other;
  other.session_id = engine_->OpenSession("late")->session_id;
  JoinGroupRequest j;
  j.group = "dp";
  j.world_size = 3;
  j.rank = 1;
  EXPECT_THAT(Await<JoinGroupResult>([&](auto d) { engine_->JoinGroup(other, j, d); }),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("world_size: 3 but group 'dp' has 2 ranks")));
  j.world_size = 2;
  j.rank = 0;
  EXPECT_THAT(Await<JoinGroupResult>([&](auto d) { engine_->JoinGroup(other, j, d); }),
              StatusIs(absl::StatusCode::kAlreadyExists,
                       HasSubstr("rank: 0 of group 'dp' is held by another session")));
  j.rank = 2;
  EXPECT_THAT(Await<JoinGroupResult>([&](auto d) { engine_->JoinGroup(other, j, d); }),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rank: 2 is not in [0, 2)")));
  j.world_size = 0;
  EXPECT_THAT(Await<JoinGroupResult>([&](auto d) { engine_->JoinGroup(other, j, d); }),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("world_size: 0 is not in [1, 64]")));
  j.group = "big";
  j.world_size = 65;  // over --max_world_size (64)
  j.rank = 0;
  EXPECT_THAT(Await<JoinGroupResult>([&](auto d) { engine_->JoinGroup(other, j, d); }),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("world_size: 65 is not in [1, 64]")));
  j.group = "dp";
  j.world_size = 2;
  j.rank = 1;  // freed by the closed session
  EXPECT_TRUE(Await<JoinGroupResult>([&](auto d) { engine_->JoinGroup(other, j, d); }).ok());
}

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
