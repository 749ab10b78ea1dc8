// Engine: stored weights and residual keys (lifecycle, steps, budget, persistence), on the CPU
// backend, checked against the CPU backend called directly.
#include <unistd.h>

#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <mutex>
#include <sstream>

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
using ::fp4q::server::testing::RefQuantize;
using ::fp4q::testing::StatusIs;
using ::testing::HasSubstr;

std::string TempDir() {
  char tmpl[] = "/tmp/fp4q_engine_test_XXXXXX";
  const char* d = mkdtemp(tmpl);
  return d == nullptr ? std::string() : std::string(d);
}

class EngineStateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TempDir();
    ASSERT_FALSE(dir_.empty());
    engine_ = MakeEngine(uint64_t{1} << 30);
  }
  void TearDown() override {
    engine_.reset();
    std::remove((dir_ + "/fp4q-state.ckpt").c_str());
    ::rmdir(dir_.c_str());
  }
  std::unique_ptr<Engine> MakeEngine(uint64_t budget) {
    return ::fp4q::server::testing::TestCpuEngine(budget, dir_);
  }

  absl::StatusOr<CreateWeightResult> Create(const std::string& name, const std::string& init,
                                            int64_t rows, int64_t cols, bool ef = false,
                                            int64_t step = 0) {
    CreateWeightRequest r;
    r.name = name;
    r.initial = InlineF32(init, rows, cols);
    r.options.error_feedback = ef;
    r.step = step;
    return Await<CreateWeightResult>([&](auto done) { engine_->CreateWeight({}, r, done); });
  }
  absl::StatusOr<UpdateWeightResult> Update(const std::string& name, int64_t step,
                                            const std::string& grad, int64_t rows, int64_t cols,
                                            float lr = 0.5f) {
    UpdateWeightRequest r;
    r.name = name;
    r.step = step;
    r.update = InlineF32(grad, rows, cols);
    r.lr = lr;
    r.return_dequantized = true;
    return Await<UpdateWeightResult>([&](auto done) { engine_->UpdateWeight({}, r, done); });
  }
  absl::StatusOr<GetWeightResult> Get(const std::string& name, bool residual = false) {
    GetWeightRequest r;
    r.name = name;
    r.quantized = true;
    r.dequantized = true;
    r.residual = residual;
    return Await<GetWeightResult>([&](auto done) { engine_->GetWeight({}, r, done); });
  }

  std::string dir_;
  std::unique_ptr<Engine> engine_;
};

TEST_F(EngineStateTest, CreateStoresTheCpuBackendsQuantization) {
  const std::string x = RandomF32(16 * 64, 1);
  auto c = Create("w", x, 16, 64, /*ef=*/false, /*step=*/5);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->weight.name, "w");
  EXPECT_EQ(c->weight.last_step, 5);
  EXPECT_EQ(c->weight.device_uuid, "cpu");
  // Codes, scales, the global record and the step statistics (kStepStatFloats floats).
  EXPECT_EQ(c->weight.bytes, 16u * 32 + 16 * 4 + 8 + 32);
  auto g = Get("w");
  ASSERT_TRUE(g.ok()) << g.status();
  const auto ref = RefQuantize(x, 16, 64);
  EXPECT_EQ(g->quantized.codes.inline_data, ref.codes);
  EXPECT_EQ(g->quantized.scales.inline_data, ref.scales);
  EXPECT_EQ(g->quantized.global_amax, ref.global[0]);
  EXPECT_EQ(g->quantized.s_enc, ref.global[1]);
  EXPECT_EQ(g->dequantized.inline_data.size(), 16u * 64 * 4);
}

// UpdateWeight calls of one name sent back to back (without waiting for replies) run one at a
// time in arrival order, although the device has several workers: every step applies, none is
// refused as older than one that overtook it.
TEST_F(EngineStateTest, PipelinedUpdatesOfOneNameApplyInArrivalOrder) {
  ASSERT_TRUE(Create("w", RandomF32(16 * 64, 1), 16, 64, /*ef=*/true).ok());
  ASSERT_TRUE(Create("v", RandomF32(16 * 64, 2), 16, 64).ok());
  constexpr int kSteps = 25;  // 50 requests: under the queue bound (64)
  std::mutex mu;
  std::condition_variable cv;
  int done = 0;
  std::vector<absl::Status> results(2 * kSteps);
  std::vector<int> applied_order;
  std::vector<std::string> updates;  // inline bytes are views: keep them until the replies
  for (int i = 0; i < kSteps; ++i) updates.push_back(RandomF32(16 * 64, 100 + i));
  for (int i = 0; i < kSteps; ++i) {
    for (const char* name : {"w", "v"}) {
      UpdateWeightRequest r;
      r.name = name;
      r.step = i + 1;
      r.update = InlineF32(updates[i], 16, 64);
      r.lr = 0.01f;
      const int slot = 2 * i + (name[0] == 'v');
      engine_->UpdateWeight({}, r, [&, slot, name, i](absl::StatusOr<UpdateWeightResult> res) {
        std::lock_guard<std::mutex> l(mu);
        results[slot] = res.status();
        if (res.ok() && name[0] == 'w') {
          EXPECT_TRUE(res->applied);
          applied_order.push_back(i + 1);
        }
        ++done;
        cv.notify_all();
      });
    }
  }
  std::unique_lock<std::mutex> l(mu);
  ASSERT_TRUE(cv.wait_for(l, std::chrono::seconds(60), [&] { return done == 2 * kSteps; }));
  for (const absl::Status& s : results) EXPECT_TRUE(s.ok()) << s;
  ASSERT_EQ(applied_order.size(), static_cast<size_t>(kSteps));
  for (int i = 0; i < kSteps; ++i) EXPECT_EQ(applied_order[i], i + 1);
}

TEST_F(EngineStateTest, StepsAreIdempotentAndStrictlyIncreasing) {
  ASSERT_TRUE(Create("w", RandomF32(16 * 32, 2), 16, 32, /*ef=*/true, 3).ok());
  const std::string g1 = RandomF32(16 * 32, 3, 0.1f);
  auto u1 = Update("w", 4, g1, 16, 32);
  ASSERT_TRUE(u1.ok()) << u1.status();
  EXPECT_TRUE(u1->applied);
  EXPECT_EQ(u1->last_step, 4);
  auto before = Get("w", /*residual=*/true);
  ASSERT_TRUE(before.ok());
  // The same step with another update: refused, never silently dropped (replica groups combine
  // data-parallel workers' updates; a lone retry must resend its own).
  EXPECT_THAT(Update("w", 4, RandomF32(16 * 32, 99, 5.0f), 16, 32),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("update: weight 'w' already applied step 4 with a different "
                                 "update")));
  // The same step again (a retry): not applied, nothing changes.
  auto u1b = Update("w", 4, g1, 16, 32);
  ASSERT_TRUE(u1b.ok()) << u1b.status();
  EXPECT_FALSE(u1b->applied);
  EXPECT_EQ(u1b->last_step, 4);
  EXPECT_EQ(u1b->dequantized.inline_data, u1->dequantized.inline_data);
  auto after = Get("w", true);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->quantized.codes.inline_data, before->quantized.codes.inline_data);
  EXPECT_EQ(after->residual.inline_data, before->residual.inline_data);
  // Older: refused.
  EXPECT_THAT(Update("w", 3, g1, 16, 32),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("step: 3 is older than the last step 4 of weight 'w'")));
  auto u2 = Update("w", 10, g1, 16, 32);
  ASSERT_TRUE(u2.ok());
  EXPECT_TRUE(u2->applied);
  EXPECT_NE(u2->dequantized.inline_data, u1->dequantized.inline_data);
  auto list = engine_->ListTensors();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].last_step, 10);
  EXPECT_EQ((*list)[0].kind, TensorKind::kWeight);
}

TEST_F(EngineStateTest, UpdateMatchesTheCpuBackendBitForBit) {
  const std::string x = RandomF32(32 * 32, 4);
  ASSERT_TRUE(Create("w", x, 32, 32, /*ef=*/true, 0).ok());
  const std::string g = RandomF32(32 * 32, 5, 0.3f);
  auto u = Update("w", 1, g, 32, 32, 0.25f);
  ASSERT_TRUE(u.ok()) << u.status();
  // Reference: create + update on the CPU backend directly.
  auto cpu = kernels::CreateCpuBackend();
  std::string codes(32 * 16, '\0'), scales(32 * 2, '\0');
  std::vector<float> residual(32 * 32, 0.0f), dq(32 * 32);
  float global[2];
  kernels::QuantizedTensor w{kernels::Format::kNvfp4,
                             kernels::BlockShape::k1x16,
                             kernels::ScaleLayout::kPlain,
                             32,
                             32,
                             reinterpret_cast<uint8_t*>(codes.data()),
                             codes.size(),
                             reinterpret_cast<uint8_t*>(scales.data()),
                             scales.size(),
                             global};
  kernels::QuantizeOptions o;
  ASSERT_TRUE(cpu->Quantize({x.data(), kernels::DType::kF32, 32, 32}, o, residual.data(), &w,
                            nullptr, nullptr)
                  .ok());
  o.step = 1;
  kernels::MutTensor out{dq.data(), kernels::DType::kF32, 32, 32, dq.size() * 4};
  ASSERT_TRUE(cpu->UpdateWeight(w, residual.data(), {g.data(), kernels::DType::kF32, 32, 32}, 0.25f,
                                kernels::UpdateKind::kGradient, o, &out, nullptr)
                  .ok());
  EXPECT_EQ(u->dequantized.inline_data,
            std::string(reinterpret_cast<char*>(dq.data()), 32 * 32 * 4));
  EXPECT_EQ(u->global_amax, global[0]);
  auto got = Get("w", true);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->quantized.codes.inline_data, codes);
  EXPECT_EQ(got->quantized.scales.inline_data, scales);
  EXPECT_EQ(got->residual.inline_data,
            std::string(reinterpret_cast<char*>(residual.data()), 32 * 32 * 4));
}

TEST_F(EngineStateTest, BadInputsChangeNothing) {
  const std::string x = RandomF32(16 * 32, 6);
  ASSERT_TRUE(Create("w", x, 16, 32, true, 1).ok());
  auto before = Get("w", true);
  ASSERT_TRUE(before.ok());
  std::string nan_grad = RandomF32(16 * 32, 7);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(nan_grad.data() + 4 * 37, &nan, 4);
  EXPECT_THAT(Update("w", 2, nan_grad, 16, 32),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("update: element 37 is NaN")));
  EXPECT_THAT(Update("w", 2, RandomF32(8 * 32, 8), 8, 32),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("update.shape: [8, 32] does not match weight 'w' of shape "
                                 "[16, 32]")));
  EXPECT_THAT(Update("nope", 2, x, 16, 32),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("name: no weight 'nope'")));
  EXPECT_THAT(Update("w", 2, x, 16, 32, std::numeric_limits<float>::infinity()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("lr: inf is not finite")));
  EXPECT_THAT(Create("w", x, 16, 32),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("name: 'w' already exists")));
  EXPECT_THAT(Create("bad name", x, 16, 32),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("name: byte 3 (0x20)")));
  EXPECT_THAT(Create("w2", RandomF32(16 * 40, 9), 16, 40),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("initial.shape[1]: 40 is not a multiple of the block size 16")));
  auto after = Get("w", true);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->weight.last_step, 1);
  EXPECT_EQ(after->quantized.codes.inline_data, before->quantized.codes.inline_data);
  EXPECT_EQ(after->residual.inline_data, before->residual.inline_data);
  EXPECT_EQ(engine_->ListTensors()->size(), 1u);
}

TEST_F(EngineStateTest, BudgetIsEnforcedWithoutSideEffects) {
  engine_ = MakeEngine(/*budget=*/1100);
  // 16x32 weight: 256 codes + 32 scales + 8 global + 32 statistics = 328 bytes.
  ASSERT_TRUE(Create("a", RandomF32(16 * 32, 1), 16, 32).ok());
  ASSERT_TRUE(Create("b", RandomF32(16 * 32, 2), 16, 32).ok());
  ASSERT_TRUE(Create("c", RandomF32(16 * 32, 3), 16, 32).ok());
  EXPECT_THAT(Create("d", RandomF32(16 * 32, 4), 16, 32),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("name: 'd' needs 328 bytes of state; 116 of the 1100-byte state "
                                 "budget are free")));
  EXPECT_EQ(engine_->store().used_bytes(), 984u);
  EXPECT_EQ(engine_->ListTensors()->size(), 3u);
  auto del = Await<EmptyResult>([&](auto done) { engine_->DeleteWeight({}, {"b"}, done); });
  ASSERT_TRUE(del.ok());
  EXPECT_TRUE(Create("d", RandomF32(16 * 32, 4), 16, 32).ok());
  EXPECT_THAT(Get("b"), StatusIs(absl::StatusCode::kNotFound, HasSubstr("name: no weight 'b'")));
}

TEST_F(EngineStateTest, ResidualKeysFollowStepsAndShape) {
  const std::string x = RandomF32(4 * 32, 11);
  auto qdq = [&](uint64_t step, const std::string& data, int64_t rows) {
    QdqRequest r;
    r.input = InlineF32(data, rows, 32);
    r.options.residual_key = "ef/x";
    r.options.quant.step = step;
    return Await<QdqResult>([&](auto done) { engine_->Qdq({}, r, done); });
  };
  auto a = qdq(1, x, 4);
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = qdq(2, x, 4);
  ASSERT_TRUE(b.ok()) << b.status();
  // Error feedback: the second QDQ of the same x differs from the first (the residual moved).
  EXPECT_NE(a->output.inline_data, b->output.inline_data);
  EXPECT_THAT(qdq(2, x, 4), StatusIs(absl::StatusCode::kAlreadyExists,
                                     HasSubstr("options.step: 2 was already applied")));
  EXPECT_THAT(
      qdq(1, x, 4),
      StatusIs(absl::StatusCode::kFailedPrecondition,
               HasSubstr("options.step: 1 is older than the last step 2 of residual 'ef/x'")));
  EXPECT_THAT(qdq(3, RandomF32(8 * 32, 1), 8),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("input.shape: [8, 32] does not match residual 'ef/x' of shape "
                                 "[4, 32]")));
  auto list = engine_->ListTensors();
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].kind, TensorKind::kResidual);
  EXPECT_EQ((*list)[0].last_step, 2);
  EXPECT_EQ((*list)[0].bytes, 4u * 32 * 4);
  // Reset zeroes it: the next QDQ equals the first one.
  ASSERT_TRUE(
      Await<EmptyResult>([&](auto done) { engine_->ResetResidual({}, {"ef/x"}, done); }).ok());
  auto c = qdq(3, x, 4);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->output.inline_data, a->output.inline_data);
}

TEST_F(EngineStateTest, ErrorFeedbackMatchesTheCpuBackendsResidualSteps) {
  // QDQ and Quantize with a residual key against the CPU backend holding the residual itself.
  auto cpu = kernels::CreateCpuBackend();
  std::vector<float> qdq_r(8 * 32, 0.0f), q_r(8 * 32, 0.0f);
  for (uint64_t step = 1; step <= 3; ++step) {
    const std::string x = RandomF32(8 * 32, 40 + static_cast<uint32_t>(step));
    kernels::QuantizeOptions o;
    o.rounding = kernels::Rounding::kStochastic;
    o.seed = 9;
    o.step = step;
    QdqRequest r;
    r.input = InlineF32(x, 8, 32);
    r.options.quant = o;
    r.options.residual_key = "ef/qdq";
    auto got = Await<QdqResult>([&](auto done) { engine_->Qdq({}, r, done); });
    ASSERT_TRUE(got.ok()) << got.status();
    std::string want(8 * 32 * 4, '\0');
    ASSERT_TRUE(cpu->Qdq({x.data(), kernels::DType::kF32, 8, 32}, o, qdq_r.data(),
                         {want.data(), kernels::DType::kF32, 8, 32, want.size()}, nullptr)
                    .ok());
    EXPECT_EQ(got->output.inline_data, want) << "step " << step;

    QuantizeRequest q;
    q.input = InlineF32(x, 8, 32);
    q.options = r.options;
    q.options.residual_key = "ef/quantize";
    auto gq = Await<QuantizeResult>([&](auto done) { engine_->Quantize({}, q, done); });
    ASSERT_TRUE(gq.ok()) << gq.status();
    testing::RefQuantized ref;
    ref.codes.assign(8 * 16, '\0');
    ref.scales.assign(8 * 2, '\0');
    kernels::QuantizedTensor qt{kernels::Format::kNvfp4,
                                kernels::BlockShape::k1x16,
                                kernels::ScaleLayout::kPlain,
                                8,
                                32,
                                reinterpret_cast<uint8_t*>(ref.codes.data()),
                                ref.codes.size(),
                                reinterpret_cast<uint8_t*>(ref.scales.data()),
                                ref.scales.size(),
                                ref.global};
    ASSERT_TRUE(
        cpu->Quantize({x.data(), kernels::DType::kF32, 8, 32}, o, q_r.data(), &qt, nullptr, nullptr)
            .ok());
    EXPECT_EQ(gq->rowwise.codes.inline_data, ref.codes) << "step " << step;
    EXPECT_EQ(gq->rowwise.scales.inline_data, ref.scales) << "step " << step;
    EXPECT_EQ(gq->rowwise.global_amax, ref.global[0]) << "step " << step;
  }
}

TEST_F(EngineStateTest, CheckpointRestoresStateAndSteps) {
  ASSERT_TRUE(Create("w", RandomF32(16 * 32, 1), 16, 32, true, 7).ok());
  ASSERT_TRUE(Update("w", 9, RandomF32(16 * 32, 2, 0.1f), 16, 32).ok());
  QdqRequest q;
  const std::string x = RandomF32(2 * 16, 3);
  q.input = InlineF32(x, 2, 16);
  q.options.residual_key = "r";
  q.options.quant.step = 12;
  ASSERT_TRUE(Await<QdqResult>([&](auto done) { engine_->Qdq({}, q, done); }).ok());
  auto before = Get("w", true);
  ASSERT_TRUE(before.ok());
  auto stats = engine_->CheckpointNow();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->records, 2u);

  engine_ = MakeEngine(uint64_t{1} << 30);
  EXPECT_EQ(engine_->ListTensors()->size(), 0u);
  ASSERT_TRUE(engine_->Restore().ok());
  auto list = engine_->ListTensors();
  ASSERT_EQ(list->size(), 2u);
  EXPECT_EQ((*list)[0].name, "r");
  EXPECT_EQ((*list)[0].last_step, 12);
  EXPECT_EQ((*list)[1].name, "w");
  EXPECT_EQ((*list)[1].last_step, 9);
  auto after = Get("w", true);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->quantized.codes.inline_data, before->quantized.codes.inline_data);
  EXPECT_EQ(after->quantized.scales.inline_data, before->quantized.scales.inline_data);
  EXPECT_EQ(after->quantized.global_amax, before->quantized.global_amax);
  EXPECT_EQ(after->residual.inline_data, before->residual.inline_data);
  EXPECT_TRUE(after->weight.options.error_feedback);
  // Steps survive: 9 again is a duplicate.
  auto dup = Update("w", 9, RandomF32(16 * 32, 2, 0.1f), 16, 32);
  ASSERT_TRUE(dup.ok());
  EXPECT_FALSE(dup->applied);
}

TEST_F(EngineStateTest, CorruptCheckpointIsReportedAndNothingIsLoaded) {
  ASSERT_TRUE(Create("w", RandomF32(16 * 32, 1), 16, 32).ok());
  ASSERT_TRUE(Create("v", RandomF32(16 * 32, 2), 16, 32).ok());
  ASSERT_TRUE(engine_->CheckpointNow().ok());
  const std::string path = dir_ + "/fp4q-state.ckpt";
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    bytes = ss.str();
  }
  bytes[bytes.size() - 40] ^= 0x01;  // inside the last record's payload
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << bytes;
  }
  engine_ = MakeEngine(uint64_t{1} << 30);
  EXPECT_THAT(engine_->Restore(), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("corrupt")));
  EXPECT_EQ(engine_->ListTensors()->size(), 0u);
  EXPECT_EQ(engine_->store().used_bytes(), 0u);
  // Truncated.
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << bytes.substr(0, bytes.size() / 2);
  }
  engine_ = MakeEngine(uint64_t{1} << 30);
  EXPECT_THAT(engine_->Restore(), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("truncated")));
  EXPECT_EQ(engine_->ListTensors()->size(), 0u);
}

TEST_F(EngineStateTest, RestoreOverBudgetLoadsNothing) {
  ASSERT_TRUE(Create("a", RandomF32(16 * 32, 1), 16, 32).ok());
  ASSERT_TRUE(Create("b", RandomF32(16 * 32, 2), 16, 32).ok());
  ASSERT_TRUE(engine_->CheckpointNow().ok());
  engine_ = MakeEngine(/*budget=*/400);
  EXPECT_THAT(engine_->Restore(),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("state budget")));
  EXPECT_EQ(engine_->ListTensors()->size(), 0u);
  EXPECT_EQ(engine_->store().used_bytes(), 0u);
}

TEST_F(EngineStateTest, DrainingRefusesNewWork) {
  engine_->BeginDrain();
  EXPECT_THAT(Create("a", RandomF32(16 * 32, 1), 16, 32),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("draining")));
  EXPECT_TRUE(engine_->WaitIdle(absl::Seconds(1)));
}

}  // namespace
}  // namespace fp4q::server
