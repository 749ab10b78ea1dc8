// End to end: /metrics of fp4qd scraped over HTTP, with specific values after known traffic;
// and the per-device queue bound (RESOURCE_EXHAUSTED, counted).
#include <cmath>
#include <cstring>
#include <future>
#include <string>
#include <tuple>
#include <vector>

#include "absl/time/clock.h"
#include "e2e_util.h"
#include "fp4q/kernels/backend.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fp4q::server::testing {
namespace {

using ::testing::HasSubstr;

double Metric(const std::string& text, const std::string& name,
              const std::map<std::string, std::string>& labels = {}) {
  absl::StatusOr<double> v = MetricValue(text, name, labels);
  EXPECT_TRUE(v.ok()) << name << ": " << v.status();
  return v.value_or(-1);
}

// The quality figures of one quantization, computed here from the CPU backend's output.
struct Quality {
  double sqnr_db, clipped, underflow;
};
Quality Expected(const std::string& x, int64_t rows, int64_t cols) {
  const RefQuantize q = CpuQuantize(x, kernels::DType::kF32, rows, cols, {});
  auto dq = CpuDequantize(q.rowwise, {}, rows, cols, kernels::DType::kF32);
  EXPECT_TRUE(dq.ok());
  double signal = 0, noise = 0;
  int64_t clipped = 0, nonzero = 0, underflow = 0;
  for (int64_t i = 0; i < rows * cols; ++i) {
    float xv, dv;
    std::memcpy(&xv, x.data() + 4 * i, 4);
    std::memcpy(&dv, dq->data() + 4 * i, 4);
    const uint8_t byte = static_cast<uint8_t>(q.rowwise.codes[i / 2]);
    const int code = (i % 2 == 0) ? (byte & 0xF) : (byte >> 4);
    signal += double(xv) * xv;
    noise += (double(xv) - dv) * (double(xv) - dv);
    if (xv != 0) {
      ++nonzero;
      if (dv == 0) ++underflow;
    }
    if ((code & 7) == 7 && std::fabs(xv) > std::fabs(dv)) ++clipped;
  }
  return {10 * std::log10(signal / noise), double(clipped) / double(rows * cols),
          double(underflow) / double(nonzero)};
}

TEST(E2eMetricsTest, MetricsAfterKnownTraffic) {
  TempDir dir;
  auto server = ServerProcess::Start({"--quality_sample_every=1", "--max_queue_depth=8",
                                      "--state_budget_bytes=1000000", "--state_dir=" + dir.path()});
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string addr = (*server)->metrics_address();
  auto text = HttpGet(addr, "/metrics");
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(Metric(*text, "fp4q_ready"), 1);
  EXPECT_EQ(Metric(*text, "fp4q_build_info", {{"backend", "cpu"}, {"version", "0.1.0"}}), 1);
  EXPECT_EQ(Metric(*text, "fp4q_state_budget_bytes"), 1000000);
  EXPECT_EQ(Metric(*text, "fp4q_queue_capacity", {{"device", "cpu"}}), 8);
  EXPECT_EQ(Metric(*text, "fp4q_queue_depth", {{"device", "cpu"}}), 0);
  EXPECT_EQ(Metric(*text, "fp4q_sessions"), 0);
  EXPECT_EQ(Metric(*text, "fp4q_cuda_regions"), 0);
  EXPECT_EQ(Metric(*text, "fp4q_cuda_open_handles"), 0);
  EXPECT_EQ(Metric(*text, "fp4q_cuda_handle_opens_total"), 0);
  EXPECT_EQ(Metric(*text, "fp4q_state_tensors", {{"device", "cpu"}, {"kind", "weight"}}), 0);
  EXPECT_EQ(Metric(*text, "fp4q_kernel_duration_seconds_count", {{"op", "matmul"}}), 0);
  EXPECT_THAT(*text, ::testing::Not(HasSubstr("tensor_name")));

  auto stub = (*server)->Stub();
  // Quantize: 3 good requests of [4, 32] f32, 2 bad ones. The first input has a block so small
  // that its scale underflows E4M3 (its elements quantize to 0).
  std::string first = RandomF32(4 * 32, 1);
  for (int i = 0; i < 16; ++i) {
    const float tiny = 1e-30f * static_cast<float>(i + 1);
    std::memcpy(first.data() + 4 * i, &tiny, 4);
  }
  const Quality want = Expected(first, 4, 32);
  // At least the 16 tiny elements underflow (small elements of other blocks may round to 0 too).
  EXPECT_GE(want.underflow, 16.0 / 128.0);
  EXPECT_GT(want.clipped, 0.0) << "the tiny block's elements saturate to code 6 with scale 0";
  for (int i = 0; i < 3; ++i) {
    v1::QuantizeRequest q;
    *q.mutable_input() = InlineTensor(i == 0 ? first : RandomF32(4 * 32, 10 + i), 4, 32);
    v1::QuantizeReply rep;
    auto ctx = Context();
    ASSERT_TRUE(stub->Quantize(ctx.get(), q, &rep).ok());
    if (i == 0) {
      text = HttpGet(addr, "/metrics");
      ASSERT_TRUE(text.ok());
      EXPECT_EQ(Metric(*text, "fp4q_quant_sqnr_db_count"), 1);
      EXPECT_NEAR(Metric(*text, "fp4q_quant_sqnr_db_sum"), want.sqnr_db, 1e-9);
      EXPECT_NEAR(Metric(*text, "fp4q_quant_clipped_ratio_sum"), want.clipped, 1e-12);
      EXPECT_NEAR(Metric(*text, "fp4q_quant_underflow_ratio_sum"), want.underflow, 1e-12);
    }
  }
  for (int i = 0; i < 2; ++i) {
    v1::QuantizeRequest q;
    *q.mutable_input() = InlineTensor(RandomF32(4 * 40, 1), 4, 40);
    v1::QuantizeReply rep;
    auto ctx = Context();
    ASSERT_EQ(stub->Quantize(ctx.get(), q, &rep).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
  // State.
  uint64_t state_bytes = 0;
  for (const char* name : {"a", "b"}) {
    v1::CreateWeightRequest c;
    c.set_name(name);
    *c.mutable_initial() = InlineTensor(RandomF32(16 * 32, 2), 16, 32);
    c.mutable_options()->set_error_feedback(std::string(name) == "a");
    v1::CreateWeightReply rep;
    auto ctx = Context();
    ASSERT_TRUE(stub->CreateWeight(ctx.get(), c, &rep).ok());
    state_bytes += rep.weight().bytes();
  }
  for (int i = 0; i < 2; ++i) {  // step 1, then step 1 again (not applied)
    v1::UpdateWeightRequest u;
    u.set_name("a");
    u.set_step(1);
    *u.mutable_update() = InlineTensor(RandomF32(16 * 32, 3), 16, 32);
    v1::UpdateWeightReply rep;
    auto ctx = Context();
    ASSERT_TRUE(stub->UpdateWeight(ctx.get(), u, &rep).ok());
    EXPECT_EQ(rep.applied(), i == 0);
  }
  v1::OpenSessionReply session;
  {
    auto ctx = Context();
    ASSERT_TRUE(stub->OpenSession(ctx.get(), v1::OpenSessionRequest(), &session).ok());
  }
  const absl::Time before_checkpoint = absl::Now();
  v1::CheckpointReply ck;
  {
    auto ctx = Context();
    ASSERT_TRUE(stub->Checkpoint(ctx.get(), v1::CheckpointRequest(), &ck).ok());
  }

  text = HttpGet(addr, "/metrics");
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(Metric(*text, "fp4q_requests_total", {{"rpc", "Quantize"}, {"code", "OK"}}), 3);
  EXPECT_EQ(
      Metric(*text, "fp4q_requests_total", {{"rpc", "Quantize"}, {"code", "INVALID_ARGUMENT"}}), 2);
  EXPECT_EQ(Metric(*text, "fp4q_requests_total", {{"rpc", "CreateWeight"}, {"code", "OK"}}), 2);
  EXPECT_EQ(Metric(*text, "fp4q_requests_total", {{"rpc", "UpdateWeight"}, {"code", "OK"}}), 2);
  EXPECT_EQ(Metric(*text, "fp4q_request_duration_seconds_count", {{"rpc", "Quantize"}}), 5);
  // 3 x (512 input + 64 code + 8 scale bytes); 3 x 128 elements.
  EXPECT_EQ(Metric(*text, "fp4q_processed_bytes_total", {{"rpc", "Quantize"}}), 3 * 584);
  EXPECT_EQ(Metric(*text, "fp4q_processed_elements_total", {{"rpc", "Quantize"}}), 3 * 128);
  EXPECT_EQ(Metric(*text, "fp4q_kernel_duration_seconds_count", {{"op", "quantize"}}), 5)
      << "3 Quantize + 2 CreateWeight";
  // An UpdateWeight is a one-item step; its retry runs the step's check (the fingerprint).
  EXPECT_EQ(Metric(*text, "fp4q_kernel_duration_seconds_count", {{"op", "step"}}), 2);
  EXPECT_EQ(Metric(*text, "fp4q_kernel_duration_seconds_count", {{"op", "dequantize"}}), 0)
      << "the repeated step returned no dequantized tensor";
  // The per-device counters see every kernel op, whatever the op.
  double ops = 0;
  for (const char* op : {"amax", "quantize", "dequantize", "qdq", "matmul", "step"}) {
    ops += Metric(*text, "fp4q_kernel_duration_seconds_count", {{"op", op}});
  }
  EXPECT_EQ(Metric(*text, "fp4q_device_kernels_total", {{"device", "cpu"}}), ops);
  EXPECT_GT(Metric(*text, "fp4q_device_kernel_seconds_total", {{"device", "cpu"}}), 0);
  EXPECT_EQ(Metric(*text, "fp4q_quant_sqnr_db_count"), 3);
  EXPECT_EQ(Metric(*text, "fp4q_quant_clipped_ratio_count"), 3);
  EXPECT_EQ(Metric(*text, "fp4q_state_tensors", {{"device", "cpu"}, {"kind", "weight"}}), 2);
  EXPECT_EQ(Metric(*text, "fp4q_state_tensors", {{"device", "cpu"}, {"kind", "residual"}}), 0);
  EXPECT_EQ(Metric(*text, "fp4q_state_bytes", {{"device", "cpu"}}),
            static_cast<double>(state_bytes));
  EXPECT_EQ(Metric(*text, "fp4q_update_not_applied_total"), 1);
  EXPECT_EQ(Metric(*text, "fp4q_sessions"), 1);
  EXPECT_EQ(Metric(*text, "fp4q_checkpoint_duration_seconds_count"), 1);
  EXPECT_EQ(Metric(*text, "fp4q_checkpoint_failures_total"), 0);
  const double ts = Metric(*text, "fp4q_checkpoint_last_success_timestamp_seconds");
  EXPECT_GE(ts, absl::ToDoubleSeconds(before_checkpoint - absl::UnixEpoch()) - 1e-3);
  EXPECT_LE(ts, absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()));
  EXPECT_EQ(Metric(*text, "fp4q_requests_in_flight"), 0);

  {
    auto ctx = Context(session.session_id());
    v1::CloseSessionReply rep;
    ASSERT_TRUE(stub->CloseSession(ctx.get(), v1::CloseSessionRequest(), &rep).ok());
    EXPECT_EQ(rep.regions_released(), 0u);
  }
  text = HttpGet(addr, "/metrics");
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(Metric(*text, "fp4q_sessions"), 0);

  // A large request is sampled on a prefix of whole rows (about 1 Mi elements): [2048, 1024]
  // -> its first 1024 rows. Its largest element sits in the prefix, so quantizing the prefix
  // alone gives the same global scale and the same codes.
  const double sum_before = Metric(*text, "fp4q_quant_sqnr_db_sum");
  std::string big = RandomF32(2048 * 1024, 4);
  const float peak = 100.0f;
  std::memcpy(big.data(), &peak, 4);
  const Quality prefix = Expected(big.substr(0, size_t{1024} * 1024 * 4), 1024, 1024);
  v1::QuantizeRequest bq;
  *bq.mutable_input() = InlineTensor(big, 2048, 1024);
  v1::QuantizeReply brep;
  auto bctx = Context();
  ASSERT_TRUE(stub->Quantize(bctx.get(), bq, &brep).ok());
  text = HttpGet(addr, "/metrics");
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(Metric(*text, "fp4q_quant_sqnr_db_count"), 4);
  EXPECT_NEAR(Metric(*text, "fp4q_quant_sqnr_db_sum") - sum_before, prefix.sqnr_db, 1e-6);
}

// fp4q_step_one_pass_total: every outcome listed from the start; a step that ran in one pass,
// one whose item one pass does not take, a retry, and one without budget for the copy.
TEST(E2eMetricsTest, OnePassStepsCountedByOutcome) {
  auto server = ServerProcess::Start({"--state_budget_bytes=8000"});
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string addr = (*server)->metrics_address();
  auto text = HttpGet(addr, "/metrics");
  ASSERT_TRUE(text.ok()) << text.status();
  for (const char* outcome : {"one_pass", "items", "retry", "devices", "budget", "memory"}) {
    EXPECT_EQ(Metric(*text, "fp4q_step_one_pass_total", {{"outcome", outcome}}), 0) << outcome;
  }
  auto stub = (*server)->Stub();
  // "d": delayed, 16 x 16 with EF (128 + 16 + 8 + 32 + 1024 = 1208 bytes, its copy as much
  // again); "c": current scaling, 1208 bytes; "big": delayed, 16 x 48 (3544 bytes): 7168 of the
  // 8000 bytes with d's copy, so no room for big's.
  for (const auto& [name, cols, delayed] :
       std::vector<std::tuple<std::string, int, bool>>{{"d", 16, true}, {"c", 16, false},
                                                        {"big", 48, true}}) {
    v1::CreateWeightRequest c;
    c.set_name(name);
    *c.mutable_initial() = InlineTensor(RandomF32(16 * cols, 2), 16, cols);
    c.mutable_options()->set_error_feedback(true);
    if (delayed) c.mutable_options()->set_scaling(v1::SCALING_DELAYED);
    v1::CreateWeightReply rep;
    auto ctx = Context();
    ASSERT_TRUE(stub->CreateWeight(ctx.get(), c, &rep).ok()) << name;
  }
  auto step = [&](const std::string& name, int cols, int64_t n) {
    v1::StepRequest r;
    r.set_step(n);
    r.set_one_pass(true);
    r.add_groups()->set_lr(0.01f);
    v1::StepItem* it = r.add_items();
    it->set_name(name);
    *it->mutable_update() = InlineTensor(RandomF32(16 * cols, 3), 16, cols);
    v1::StepReply rep;
    auto ctx = Context();
    const grpc::Status s = stub->Step(ctx.get(), r, &rep);
    EXPECT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(rep.one_pass(), rep.one_pass_outcome() == "one_pass") << rep.one_pass_outcome();
    return rep.one_pass_outcome();
  };
  EXPECT_EQ(step("d", 16, 1), "one_pass");
  EXPECT_EQ(step("d", 16, 1), "retry");
  EXPECT_EQ(step("c", 16, 1), "items");
  EXPECT_EQ(step("big", 48, 1), "budget");
  text = HttpGet(addr, "/metrics");
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(Metric(*text, "fp4q_step_one_pass_total", {{"outcome", "one_pass"}}), 1);
  EXPECT_EQ(Metric(*text, "fp4q_step_one_pass_total", {{"outcome", "retry"}}), 1);
  EXPECT_EQ(Metric(*text, "fp4q_step_one_pass_total", {{"outcome", "items"}}), 1);
  EXPECT_EQ(Metric(*text, "fp4q_step_one_pass_total", {{"outcome", "budget"}}), 1);
  EXPECT_EQ(Metric(*text, "fp4q_step_one_pass_total", {{"outcome", "memory"}}), 0);
}

// A busy-polling worker (a fixed --worker_spin_us: the automatic spin never runs on the CPU
// backend) picks up the calls of a client that comes straight back, and counts them.
TEST(E2eMetricsTest, SpinPickupsCounted) {
  auto server = ServerProcess::Start({"--workers=1", "--worker_spin_us=200000"});
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = (*server)->Stub();
  constexpr int kCalls = 10;
  for (int i = 0; i < kCalls; ++i) {
    v1::QuantizeRequest q;
    *q.mutable_input() = InlineTensor(RandomF32(4 * 32, 40 + i), 4, 32);
    v1::QuantizeReply rep;
    auto ctx = Context();
    ASSERT_TRUE(stub->Quantize(ctx.get(), q, &rep).ok());
    // Long enough for the worker to be back in its spin (a call that arrives while the worker
    // is still finishing the last one is queued and taken without a spin: not counted).
    absl::SleepFor(absl::Milliseconds(5));
  }
  auto text = HttpGet((*server)->metrics_address(), "/metrics");
  ASSERT_TRUE(text.ok());
  // Each call arrives within the worker's 200 ms spin (the first too when it comes within 200
  // ms of fp4qd's start, as its idle worker spins from there).
  const double picked = Metric(*text, "fp4q_worker_spin_pickups_total", {{"device", "cpu"}});
  EXPECT_GE(picked, kCalls / 2);
  EXPECT_LE(picked, kCalls);
}

TEST(E2eMetricsTest, QueueBoundAnswersResourceExhausted) {
  auto server = ServerProcess::Start({"--workers=1", "--max_queue_depth=1"});
  ASSERT_TRUE(server.ok()) << server.status();
  const int64_t m = 384, n = 384, k = 1024;
  const RefQuantize qa = CpuQuantize(RandomF32(m * k, 1), kernels::DType::kF32, m, k, {});
  v1::MatmulRequest req;
  for (v1::QuantizedOperand* op : {req.mutable_a(), req.mutable_b()}) {
    v1::QuantizedTensor* t = op->mutable_tensor();
    t->add_shape(m);
    t->add_shape(k);
    t->set_global_amax(qa.rowwise.global[0]);
    t->set_s_enc(qa.rowwise.global[1]);
    t->set_codes(qa.rowwise.codes);
    t->set_scales(qa.rowwise.scales);
  }
  constexpr int kCalls = 6;
  std::vector<std::future<grpc::Status>> calls;
  for (int i = 0; i < kCalls; ++i) {
    calls.push_back(std::async(std::launch::async, [&] {
      auto stub = (*server)->Stub();
      v1::MatmulReply rep;
      auto ctx = Context();
      return stub->Matmul(ctx.get(), req, &rep);
    }));
  }
  int ok = 0, rejected = 0;
  for (auto& f : calls) {
    grpc::Status s = f.get();
    if (s.ok()) {
      ++ok;
    } else {
      EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
      EXPECT_THAT(s.error_message(), HasSubstr("device cpu: work queue is full (1 queued)"));
      ++rejected;
    }
  }
  // The first call always runs; with one worker and a queue of one, 6 calls at once cannot all
  // fit (each takes far longer than the calls take to arrive).
  EXPECT_GE(ok, 1);
  EXPECT_GE(rejected, 1);
  EXPECT_EQ(ok + rejected, kCalls);
  auto text = HttpGet((*server)->metrics_address(), "/metrics");
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(Metric(*text, "fp4q_queue_rejected_total", {{"device", "cpu"}}), rejected);
  EXPECT_EQ(
      Metric(*text, "fp4q_requests_total", {{"rpc", "Matmul"}, {"code", "RESOURCE_EXHAUSTED"}}),
      rejected);
  EXPECT_EQ(Metric(*text, "fp4q_requests_total", {{"rpc", "Matmul"}, {"code", "OK"}}), ok);
}

}  // namespace
}  // namespace fp4q::server::testing
