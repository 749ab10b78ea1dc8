// End to end: named state through fp4qd (CPU backend): lifecycle, idempotent steps, concurrent
// clients, checkpoint and restart (SIGTERM, kill -9).
#include <signal.h>
#include <sys/stat.h>

#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "e2e_util.h"
#include "fp4q/kernels/backend.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fp4q::server::testing {
namespace {

using ::testing::HasSubstr;

// The CPU backend holding a weight the way the server does (the oracle for stored state).
class RefWeight {
 public:
  RefWeight(const std::string& init, int64_t rows, int64_t cols, bool ef)
      : rows_(rows), cols_(cols), cpu_(kernels::CreateCpuBackend()) {
    codes_.assign(rows * cols / 2, '\0');
    scales_.assign(rows * cols / 16, '\0');
    if (ef) residual_.assign(rows * cols, 0.0f);
    kernels::QuantizedTensor w = View();
    status_ = cpu_->Quantize({init.data(), kernels::DType::kF32, rows, cols}, {}, Residual(), &w,
                             nullptr, nullptr);
  }
  void Update(const std::string& grad, float lr, int64_t step) {
    kernels::QuantizeOptions o;
    o.step = static_cast<uint64_t>(step);
    kernels::QuantizedTensor w = View();
    status_.Update(cpu_->UpdateWeight(w, Residual(),
                                      {grad.data(), kernels::DType::kF32, rows_, cols_}, lr,
                                      kernels::UpdateKind::kGradient, o, nullptr, nullptr));
  }
  const std::string& codes() const { return codes_; }
  const std::string& scales() const { return scales_; }
  std::string residual() const {
    return std::string(reinterpret_cast<const char*>(residual_.data()), residual_.size() * 4);
  }
  const absl::Status& status() const { return status_; }

 private:
  float* Residual() { return residual_.empty() ? nullptr : residual_.data(); }
  kernels::QuantizedTensor View() {
    return kernels::QuantizedTensor{kernels::Format::kNvfp4,
                                    kernels::BlockShape::k1x16,
                                    kernels::ScaleLayout::kPlain,
                                    rows_,
                                    cols_,
                                    reinterpret_cast<uint8_t*>(codes_.data()),
                                    codes_.size(),
                                    reinterpret_cast<uint8_t*>(scales_.data()),
                                    scales_.size(),
                                    global_};
  }
  int64_t rows_, cols_;
  std::unique_ptr<kernels::Backend> cpu_;
  std::string codes_, scales_;
  std::vector<float> residual_;
  float global_[2] = {0, 0};
  absl::Status status_;
};

grpc::Status CreateW(v1::Fp4q::Stub& stub, const std::string& name, const std::string& init,
                     int64_t rows, int64_t cols, bool ef, v1::CreateWeightReply* rep = nullptr) {
  v1::CreateWeightRequest req;
  req.set_name(name);
  *req.mutable_initial() = InlineTensor(init, rows, cols);
  req.mutable_options()->set_error_feedback(ef);
  v1::CreateWeightReply local;
  auto ctx = Context();
  return stub.CreateWeight(ctx.get(), req, rep ? rep : &local);
}

grpc::Status UpdateW(v1::Fp4q::Stub& stub, const std::string& name, int64_t step,
                     const std::string& grad, int64_t rows, int64_t cols, float lr,
                     v1::UpdateWeightReply* rep) {
  v1::UpdateWeightRequest req;
  req.set_name(name);
  req.set_step(step);
  *req.mutable_update() = InlineTensor(grad, rows, cols);
  req.set_lr(lr);
  auto ctx = Context();
  return stub.UpdateWeight(ctx.get(), req, rep);
}

v1::GetWeightReply GetW(v1::Fp4q::Stub& stub, const std::string& name, bool residual,
                        grpc::Status* status = nullptr) {
  v1::GetWeightRequest req;
  req.set_name(name);
  req.set_quantized(true);
  req.set_residual(residual);
  v1::GetWeightReply rep;
  auto ctx = Context();
  grpc::Status s = stub.GetWeight(ctx.get(), req, &rep);
  if (status != nullptr) *status = s;
  return rep;
}

v1::ListTensorsReply List(v1::Fp4q::Stub& stub) {
  v1::ListTensorsReply rep;
  auto ctx = Context();
  EXPECT_TRUE(stub.ListTensors(ctx.get(), v1::ListTensorsRequest(), &rep).ok());
  return rep;
}

TEST(E2eStateTest, LifecycleOfWeightsAndResiduals) {
  auto server = ServerProcess::Start({});
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = (*server)->Stub();
  const int64_t rows = 32, cols = 64;
  const std::string init = RandomF32(rows * cols, 1);
  RefWeight ref(init, rows, cols, /*ef=*/true);
  ASSERT_TRUE(ref.status().ok()) << ref.status();

  v1::CreateWeightReply created;
  ASSERT_TRUE(CreateW(*stub, "model/w0", init, rows, cols, true, &created).ok());
  EXPECT_EQ(created.weight().name(), "model/w0");
  EXPECT_THAT(created.weight().shape(), ::testing::ElementsAre(rows, cols));
  EXPECT_EQ(created.weight().last_step(), 0);
  EXPECT_EQ(created.weight().device_uuid(), "cpu");
  EXPECT_TRUE(created.weight().options().error_feedback());
  EXPECT_EQ(created.weight().options().block(), v1::BLOCK_SHAPE_1X16);
  EXPECT_EQ(created.weight().options().dtype(), v1::DTYPE_F32);
  // Codes, scales, the global record, the step statistics (8 floats) and the residual.
  EXPECT_EQ(created.weight().bytes(),
            uint64_t(rows * cols / 2 + rows * cols / 16 + 8 + 32 + rows * cols * 4));

  v1::GetWeightReply got = GetW(*stub, "model/w0", true);
  EXPECT_EQ(got.quantized().codes(), ref.codes());
  EXPECT_EQ(got.quantized().scales(), ref.scales());
  EXPECT_EQ(got.residual().inline_data(), ref.residual());
  EXPECT_EQ(got.residual().dtype(), v1::DTYPE_F32);

  const std::string grad = RandomF32(rows * cols, 2, 0.2f);
  v1::UpdateWeightReply up;
  ASSERT_TRUE(UpdateW(*stub, "model/w0", 1, grad, rows, cols, 0.5f, &up).ok());
  EXPECT_TRUE(up.applied());
  EXPECT_EQ(up.last_step(), 1);
  ref.Update(grad, 0.5f, 1);
  got = GetW(*stub, "model/w0", true);
  EXPECT_EQ(got.quantized().codes(), ref.codes());
  EXPECT_EQ(got.residual().inline_data(), ref.residual());
  EXPECT_EQ(got.weight().last_step(), 1);

  // A residual key through QDQ, then the listing.
  v1::QdqRequest qdq;
  *qdq.mutable_input() = InlineTensor(RandomF32(4 * 32, 3), 4, 32);
  qdq.mutable_options()->set_residual_key("model/ef0");
  qdq.mutable_options()->set_step(5);
  v1::QdqReply qrep;
  auto qctx = Context();
  ASSERT_TRUE(stub->Qdq(qctx.get(), qdq, &qrep).ok());
  v1::ListTensorsReply list = List(*stub);
  ASSERT_EQ(list.tensors_size(), 2);
  EXPECT_EQ(list.tensors(0).name(), "model/ef0");
  EXPECT_EQ(list.tensors(0).kind(), v1::TENSOR_KIND_RESIDUAL);
  EXPECT_EQ(list.tensors(0).dtype(), v1::DTYPE_F32);
  EXPECT_EQ(list.tensors(0).last_step(), 5);
  EXPECT_EQ(list.tensors(0).bytes(), 4u * 32 * 4);
  EXPECT_EQ(list.tensors(1).name(), "model/w0");
  EXPECT_EQ(list.tensors(1).kind(), v1::TENSOR_KIND_WEIGHT);
  EXPECT_EQ(list.tensors(1).dtype(), v1::DTYPE_U8);
  EXPECT_EQ(list.tensors(1).last_step(), 1);
  EXPECT_EQ(list.tensors(1).device_uuid(), "cpu");

  // ResetResidual zeroes the weight's residual.
  v1::ResetResidualRequest rr;
  rr.set_name("model/w0");
  v1::ResetResidualReply rrep;
  auto rctx = Context();
  ASSERT_TRUE(stub->ResetResidual(rctx.get(), rr, &rrep).ok());
  EXPECT_NE(rrep.header().server_epoch(), 0u);
  got = GetW(*stub, "model/w0", true);
  EXPECT_EQ(got.residual().inline_data(), std::string(rows * cols * 4, '\0'));
  EXPECT_EQ(got.quantized().codes(), ref.codes()) << "reset touches only the residual";

  for (const char* name : {"model/w0", "model/ef0"}) {
    v1::DeleteWeightRequest d;
    d.set_name(name);
    v1::DeleteWeightReply drep;
    auto dctx = Context();
    EXPECT_TRUE(stub->DeleteWeight(dctx.get(), d, &drep).ok()) << name;
  }
  grpc::Status s;
  GetW(*stub, "model/w0", false, &s);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(s.error_message(), HasSubstr("name: no weight 'model/w0'"));
  EXPECT_EQ(List(*stub).tensors_size(), 0);
}

TEST(E2eStateTest, RepeatedStepIsNotAppliedOlderStepIsRefused) {
  auto server = ServerProcess::Start({});
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = (*server)->Stub();
  ASSERT_TRUE(CreateW(*stub, "w", RandomF32(16 * 32, 4), 16, 32, true).ok());
  const std::string g = RandomF32(16 * 32, 5, 0.1f);
  v1::UpdateWeightReply a, b;
  ASSERT_TRUE(UpdateW(*stub, "w", 3, g, 16, 32, 1.0f, &a).ok());
  const v1::GetWeightReply before = GetW(*stub, "w", true);
  // Another update for the applied step is refused, never dropped silently.
  grpc::Status changed = UpdateW(*stub, "w", 3, RandomF32(16 * 32, 6, 9.0f), 16, 32, 1.0f, &b);
  EXPECT_EQ(changed.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(changed.error_message(), HasSubstr("already applied step 3 with a different update"));
  // The same update again (a retry) is answered applied=false.
  ASSERT_TRUE(UpdateW(*stub, "w", 3, g, 16, 32, 1.0f, &b).ok());
  EXPECT_TRUE(a.applied());
  EXPECT_FALSE(b.applied());
  EXPECT_EQ(b.last_step(), 3);
  const v1::GetWeightReply after = GetW(*stub, "w", true);
  EXPECT_EQ(after.quantized().codes(), before.quantized().codes());
  EXPECT_EQ(after.residual().inline_data(), before.residual().inline_data());
  v1::UpdateWeightReply c;
  grpc::Status s = UpdateW(*stub, "w", 2, g, 16, 32, 1.0f, &c);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("step: 2 is older than the last step 3 of weight 'w'"));
}

// A reusable barrier (C++17 has none).
class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  void Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    const int gen = gen_;
    if (++count_ == n_) {
      count_ = 0;
      ++gen_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return gen != gen_; });
    }
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int n_, count_ = 0, gen_ = 0;
};

TEST(E2eStateTest, ConcurrentClientsOnDistinctNamesAndOnOneName) {
  auto server = ServerProcess::Start({"--workers=2"});
  ASSERT_TRUE(server.ok()) << server.status();
  constexpr int kClients = 4, kSteps = 8;
  const int64_t rows = 16, cols = 64;
  auto grad = [&](int step) { return RandomF32(rows * cols, 1000 + step, 0.3f); };

  // Distinct names: each client its own weight, in parallel.
  {
    std::vector<std::thread> threads;
    std::vector<std::string> errors(kClients);
    for (int c = 0; c < kClients; ++c) {
      threads.emplace_back([&, c] {
        auto stub = (*server)->Stub();  // a channel per client
        const std::string name = absl::StrCat("client", c);
        grpc::Status s = CreateW(*stub, name, RandomF32(rows * cols, 50 + c), rows, cols, true);
        for (int step = 1; s.ok() && step <= kSteps; ++step) {
          v1::UpdateWeightReply r;
          s = UpdateW(*stub, name, step, grad(step), rows, cols, 0.1f, &r);
          if (s.ok() && !r.applied()) errors[c] = "step not applied";
        }
        if (!s.ok()) errors[c] = s.error_message();
      });
    }
    for (auto& t : threads) t.join();
    auto stub = (*server)->Stub();
    for (int c = 0; c < kClients; ++c) {
      EXPECT_EQ(errors[c], "") << "client " << c;
      RefWeight ref(RandomF32(rows * cols, 50 + c), rows, cols, true);
      for (int step = 1; step <= kSteps; ++step) ref.Update(grad(step), 0.1f, step);
      const v1::GetWeightReply got = GetW(*stub, absl::StrCat("client", c), true);
      EXPECT_EQ(got.quantized().codes(), ref.codes()) << "client " << c;
      EXPECT_EQ(got.residual().inline_data(), ref.residual()) << "client " << c;
      EXPECT_EQ(got.weight().last_step(), kSteps);
    }
  }

  // One name: every client sends every step (data-parallel workers); each step applies once.
  {
    auto stub = (*server)->Stub();
    const std::string init = RandomF32(rows * cols, 77);
    ASSERT_TRUE(CreateW(*stub, "shared", init, rows, cols, true).ok());
    Barrier barrier(kClients);
    std::vector<int> applied(kSteps + 1, 0), not_applied(kSteps + 1, 0);
    std::mutex mu;
    std::vector<std::string> errors;
    std::vector<std::thread> threads;
    for (int c = 0; c < kClients; ++c) {
      threads.emplace_back([&] {
        auto my = (*server)->Stub();
        for (int step = 1; step <= kSteps; ++step) {
          barrier.Wait();
          v1::UpdateWeightReply r;
          grpc::Status s = UpdateW(*my, "shared", step, grad(step), rows, cols, 0.1f, &r);
          std::lock_guard<std::mutex> lock(mu);
          if (!s.ok()) errors.push_back(s.error_message());
          (r.applied() ? applied : not_applied)[step]++;
        }
      });
    }
    for (auto& t : threads) t.join();
    EXPECT_THAT(errors, ::testing::IsEmpty());
    for (int step = 1; step <= kSteps; ++step) {
      EXPECT_EQ(applied[step], 1) << "step " << step;
      EXPECT_EQ(not_applied[step], kClients - 1) << "step " << step;
    }
    RefWeight ref(init, rows, cols, true);
    for (int step = 1; step <= kSteps; ++step) ref.Update(grad(step), 0.1f, step);
    const v1::GetWeightReply got = GetW(*stub, "shared", true);
    EXPECT_EQ(got.quantized().codes(), ref.codes());
    EXPECT_EQ(got.residual().inline_data(), ref.residual());
  }
}

TEST(E2eStateTest, CheckpointRestartRestoresStateAndSteps) {
  TempDir dir;
  const std::vector<std::string> flags = {"--state_dir=" + dir.path()};
  auto server = ServerProcess::Start(flags);
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = (*server)->Stub();
  const int64_t rows = 16, cols = 32;
  ASSERT_TRUE(CreateW(*stub, "w", RandomF32(rows * cols, 8), rows, cols, true).ok());
  v1::UpdateWeightReply up;
  for (int step = 1; step <= 5; ++step) {
    ASSERT_TRUE(
        UpdateW(*stub, "w", step, RandomF32(rows * cols, 80 + step), rows, cols, 0.2f, &up).ok());
  }
  v1::QdqRequest qdq;
  *qdq.mutable_input() = InlineTensor(RandomF32(2 * 16, 9), 2, 16);
  qdq.mutable_options()->set_residual_key("r");
  qdq.mutable_options()->set_step(3);
  v1::QdqReply qrep;
  auto qctx = Context();
  ASSERT_TRUE(stub->Qdq(qctx.get(), qdq, &qrep).ok());
  const uint64_t epoch1 = qrep.header().server_epoch();

  v1::CheckpointReply ck;
  auto cctx = Context();
  ASSERT_TRUE(stub->Checkpoint(cctx.get(), v1::CheckpointRequest(), &ck).ok());
  EXPECT_EQ(ck.path(), "fp4q-state.ckpt");
  EXPECT_EQ(ck.tensors(), 2u);
  struct stat st;
  ASSERT_EQ(stat(dir.File("fp4q-state.ckpt").c_str(), &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), ck.bytes());

  // One more step after the explicit checkpoint: SIGTERM's checkpoint must include it.
  ASSERT_TRUE(UpdateW(*stub, "w", 6, RandomF32(rows * cols, 86), rows, cols, 0.2f, &up).ok());
  const v1::GetWeightReply before = GetW(*stub, "w", true);
  (*server)->Signal(SIGTERM);
  EXPECT_EQ((*server)->Wait(), 0) << (*server)->Log();

  auto again = ServerProcess::Start(flags);
  ASSERT_TRUE(again.ok()) << again.status();
  auto stub2 = (*again)->Stub();
  v1::ListTensorsReply list = List(*stub2);
  ASSERT_EQ(list.tensors_size(), 2);
  EXPECT_EQ(list.tensors(0).name(), "r");
  EXPECT_EQ(list.tensors(0).last_step(), 3);
  EXPECT_EQ(list.tensors(1).name(), "w");
  EXPECT_EQ(list.tensors(1).last_step(), 6);
  EXPECT_NE(list.header().server_epoch(), epoch1) << "a restart changes the epoch";
  const v1::GetWeightReply after = GetW(*stub2, "w", true);
  EXPECT_EQ(after.quantized().codes(), before.quantized().codes());
  EXPECT_EQ(after.quantized().scales(), before.quantized().scales());
  EXPECT_EQ(after.quantized().global_amax(), before.quantized().global_amax());
  EXPECT_EQ(after.residual().inline_data(), before.residual().inline_data());
  v1::UpdateWeightReply dup;
  ASSERT_TRUE(UpdateW(*stub2, "w", 6, RandomF32(rows * cols, 86), rows, cols, 0.2f, &dup).ok());
  EXPECT_FALSE(dup.applied()) << "steps survive the restart";

  // kill -9 after an unsaved step: the restart shows the last completed checkpoint.
  ASSERT_TRUE(UpdateW(*stub2, "w", 7, RandomF32(rows * cols, 87), rows, cols, 0.2f, &up).ok());
  ASSERT_TRUE(up.applied());
  (*again)->Signal(SIGKILL);
  EXPECT_EQ((*again)->Wait(), 128 + SIGKILL);
  auto third = ServerProcess::Start(flags);
  ASSERT_TRUE(third.ok()) << third.status();
  auto stub3 = (*third)->Stub();
  const v1::GetWeightReply killed = GetW(*stub3, "w", true);
  EXPECT_EQ(killed.weight().last_step(), 6);
  EXPECT_EQ(killed.quantized().codes(), before.quantized().codes());
  EXPECT_EQ(killed.residual().inline_data(), before.residual().inline_data());
}

TEST(E2eStateTest, PeriodicCheckpointSurvivesKillNine) {
  TempDir dir;
  const std::vector<std::string> flags = {"--state_dir=" + dir.path(), "--checkpoint_interval_s=1"};
  auto server = ServerProcess::Start(flags);
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = (*server)->Stub();
  ASSERT_TRUE(CreateW(*stub, "periodic", RandomF32(16 * 32, 21), 16, 32, false).ok());
  const v1::GetWeightReply before = GetW(*stub, "periodic", false);
  // Wait for a periodic checkpoint that holds the weight (the log says so), then kill -9.
  bool written = false;
  for (int i = 0; i < 60 && !written; ++i) {
    absl::SleepFor(absl::Milliseconds(100));
    written = (*server)->Log().find("\"tensors\":\"1\"") != std::string::npos;
  }
  ASSERT_TRUE(written) << (*server)->Log();
  (*server)->Signal(SIGKILL);
  EXPECT_EQ((*server)->Wait(), 128 + SIGKILL);
  auto again = ServerProcess::Start(flags);
  ASSERT_TRUE(again.ok()) << again.status();
  auto stub2 = (*again)->Stub();
  grpc::Status s;
  const v1::GetWeightReply after = GetW(*stub2, "periodic", false, &s);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(after.quantized().codes(), before.quantized().codes());
  EXPECT_EQ(after.quantized().scales(), before.quantized().scales());
}

}  // namespace
}  // namespace fp4q::server::testing
