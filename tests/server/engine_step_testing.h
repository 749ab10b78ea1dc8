// The fixture of the engine's step tests (engine_step_test.cc, engine_groups_test.cc): a CPU
// engine, weights created from seeded values, snapshots of everything a weight holds, step and
// UpdateWeight calls, the hyperparameters, replica-group sessions.
#ifndef FP4Q_TESTS_SERVER_ENGINE_STEP_TESTING_H_
#define FP4Q_TESTS_SERVER_ENGINE_STEP_TESTING_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine_test_util.h"
#include "fp4q/kernels/backend.h"
#include "gtest/gtest.h"
#include "server/engine.h"

namespace fp4q::server {

using ::fp4q::server::testing::Await;
using ::fp4q::server::testing::InlineF32;
using ::fp4q::server::testing::RandomF32;

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

// A weight's shape, for the tests' tables of shapes.
struct Shape {
  int64_t rows, cols;
};

struct WeightSpec {
  bool ef = true;
  kernels::BlockShape block = kernels::BlockShape::k1x16;
  kernels::Rounding rounding = kernels::Rounding::kNearest;
  kernels::Scaling scaling = kernels::Scaling::kCurrent;
  OptimizerSpecIn optimizer;
  int64_t step = 0;
};
class EngineStepTest : public ::testing::Test {
 protected:
  void SetUp() override { engine_ = MakeEngine(uint64_t{1} << 30); }

  std::unique_ptr<Engine> MakeEngine(uint64_t budget, int max_items = 4096) {
    return ::fp4q::server::testing::TestCpuEngine(budget, "", max_items);
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

  // Sessions "rank0" .. joined to replica group "dp" of `ranks` ranks: their contexts.
  std::vector<RequestContext> JoinRanks(int ranks, uint32_t deadline_ms = 0) {
    std::vector<RequestContext> ctx(ranks);
    for (int r = 0; r < ranks; ++r) {
      absl::StatusOr<OpenSessionResult> s = engine_->OpenSession(absl::StrCat("rank", r));
      EXPECT_TRUE(s.ok()) << s.status();
      if (!s.ok()) continue;
      ctx[r].session_id = s->session_id;
      JoinGroupRequest j;
      j.group = "dp";
      j.world_size = static_cast<uint32_t>(ranks);
      j.rank = static_cast<uint32_t>(r);
      j.deadline_ms = deadline_ms;
      EXPECT_TRUE(Await<JoinGroupResult>([&](auto d) { engine_->JoinGroup(ctx[r], j, d); }).ok());
    }
    return ctx;
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

}  // namespace fp4q::server

#endif  // FP4Q_TESTS_SERVER_ENGINE_STEP_TESTING_H_
