// End to end against a CPU fp4qd, over gRPC and the fast socket: state-changing calls whose
// results would be non-finite are refused and change nothing; a state-changing call is either
// applied and answered or refused before it runs (the reply limit); undecodable requests are
// INVALID_ARGUMENT with a message; long CPU work stops at its deadline and costly requests are
// refused up front; the trainer's Step over both transports.
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "e2e_util.h"
#include "fp4q/client/fast_socket.h"
#include "gmock/gmock.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"

namespace fp4q::server::testing {
namespace {

using ::testing::HasSubstr;
using client::FastSocket;
using client::FastSocketOptions;

v1::CreateWeightRequest Weight(const std::string& name, const std::string& init, int64_t rows,
                               int64_t cols, bool ef) {
  v1::CreateWeightRequest c;
  c.set_name(name);
  *c.mutable_initial() = InlineTensor(init, rows, cols);
  c.mutable_options()->set_error_feedback(ef);
  return c;
}

std::string Filled(int64_t n, float v) {
  std::string s(static_cast<size_t>(n) * 4, '\0');
  for (int64_t i = 0; i < n; ++i) std::memcpy(s.data() + 4 * i, &v, 4);
  return s;
}

// The weight's codes, residual and last step: what "nothing changed" compares.
std::string StateOf(v1::Fp4q::Stub& stub, const std::string& name, bool ef) {
  v1::GetWeightRequest g;
  g.set_name(name);
  g.set_quantized(true);
  g.set_residual(ef);
  v1::GetWeightReply rep;
  auto ctx = Context();
  grpc::Status s = stub.GetWeight(ctx.get(), g, &rep);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return absl::StrCat(rep.quantized().codes(), rep.quantized().scales(), rep.residual().inline_data(),
                      "|", rep.weight().last_step(), "|", rep.quantized().global_amax());
}

// The same call over gRPC or the fast socket, as one code and message.
struct Transport {
  v1::Fp4q::Stub* stub = nullptr;
  FastSocket* fast = nullptr;
  std::string name() const { return fast != nullptr ? "fast socket" : "gRPC"; }
  grpc::Status Invoke(const std::string& method, const google::protobuf::Message& req,
                      google::protobuf::Message* rep) const {
    if (fast != nullptr) {
      absl::Status s = fast->Invoke(method, req, rep);
      return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
    }
    auto ctx = Context();
    if (method == "UpdateWeight") {
      return stub->UpdateWeight(ctx.get(), static_cast<const v1::UpdateWeightRequest&>(req),
                                static_cast<v1::UpdateWeightReply*>(rep));
    }
    if (method == "Qdq") {
      return stub->Qdq(ctx.get(), static_cast<const v1::QdqRequest&>(req),
                       static_cast<v1::QdqReply*>(rep));
    }
    if (method == "Step") {
      return stub->Step(ctx.get(), static_cast<const v1::StepRequest&>(req),
                        static_cast<v1::StepReply*>(rep));
    }
    return grpc::Status(grpc::StatusCode::INTERNAL, "test: no such method " + method);
  }
};

// fp4qd's resident memory in KiB (VmRSS of /proc/PID/status), -1 if unreadable.
int64_t RssKib(pid_t pid) {
  std::FILE* f = std::fopen(absl::StrCat("/proc/", pid, "/status").c_str(), "r");
  if (f == nullptr) return -1;
  char line[256];
  int64_t kib = -1;
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    long long v = 0;
    if (std::sscanf(line, "VmRSS: %lld kB", &v) == 1) kib = v;
  }
  std::fclose(f);
  return kib;
}

class E2eResultsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    sock_ = dir_.File("fast.sock");
    auto server = ServerProcess::Start({"--fast_socket=" + sock_, "--workers=1"});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    stub_ = server_->Stub();
    session_ = OpenSession(*stub_, "results");
    FastSocketOptions o;
    o.path = sock_;
    absl::StatusOr<std::unique_ptr<FastSocket>> f = FastSocket::Connect(o, session_);
    ASSERT_TRUE(f.ok()) << f.status();
    fast_ = *std::move(f);
  }
  std::vector<Transport> Both() { return {{stub_.get(), nullptr}, {stub_.get(), fast_.get()}}; }

  void Create(const v1::CreateWeightRequest& c) {
    v1::CreateWeightReply rep;
    auto ctx = Context();
    grpc::Status s = stub_->CreateWeight(ctx.get(), c, &rep);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }

  // Sends `step` 10,000 times over the fast socket, every 4th time with `bad` as the update of
  // item `poisoned` (refused), each with the step number after the applied ones; `applied`
  // checks each applied reply. Expects fp4qd's resident memory to grow by at most 1 MiB from
  // step 1,000 to step 10,000 (printed, with `what`) and returns how many steps applied.
  int64_t StepTenThousandTimes(v1::StepRequest step, int poisoned, const std::string& good,
                               const std::string& bad, const char* what,
                               const std::function<void(const v1::StepReply&)>& applied) {
    int64_t n = 0;
    int64_t rss_after_1000 = -1;
    for (int i = 1; i <= 10000; ++i) {
      const bool refuse = i % 4 == 0;
      step.set_step(n + 1);
      *step.mutable_items(poisoned)->mutable_update()->mutable_inline_data() = refuse ? bad : good;
      v1::StepReply rep;
      const absl::Status s = fast_->Invoke("Step", step, &rep);
      if (refuse) {
        EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << "step " << i << ": " << s;
      } else {
        EXPECT_TRUE(s.ok()) << "step " << i << ": " << s;
        applied(rep);
        ++n;
      }
      if (::testing::Test::HasFailure()) return n;
      if (i == 1000) rss_after_1000 = RssKib(server_->pid());
    }
    const int64_t rss_end = RssKib(server_->pid());
    EXPECT_GT(rss_after_1000, 0);
    std::printf("fp4qd VmRSS: %lld kB after 1,000 %s, %lld kB after 10,000\n",
                static_cast<long long>(rss_after_1000), what, static_cast<long long>(rss_end));
    EXPECT_LE(rss_end - rss_after_1000, 1024) << "VmRSS " << rss_after_1000 << " kB after 1,000 "
                                              << what << ", " << rss_end << " kB after 10,000";
    return n;
  }

  TempDir dir_;
  std::string sock_;
  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<v1::Fp4q::Stub> stub_;
  std::string session_;
  std::unique_ptr<FastSocket> fast_;
};

TEST_F(E2eResultsTest, NonFiniteResultsFromFiniteInputsAreRefusedAndChangeNothing) {
  for (const Transport& t : Both()) {
    SCOPED_TRACE(t.name());
    const std::string w = absl::StrCat("w-", t.fast != nullptr);
    Create(Weight(w, RandomF32(16 * 32, 1, 0.05f), 16, 32, /*ef=*/true));
    const std::string before = StateOf(*stub_, w, true);
    // lr = 3e38 with a finite gradient: x = DQ(W) - lr * g overflows.
    v1::UpdateWeightRequest u;
    u.set_name(w);
    u.set_step(1);
    *u.mutable_update() = InlineTensor(RandomF32(16 * 32, 2), 16, 32);
    u.set_lr(3e38f);
    v1::UpdateWeightReply rep;
    grpc::Status s = t.Invoke("UpdateWeight", u, &rep);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr("nothing was applied"));
    EXPECT_EQ(StateOf(*stub_, w, true), before);
    // A delta of 3e38 onto a weight of 3e38 (no error feedback).
    const std::string big = absl::StrCat("big-", t.fast != nullptr);
    Create(Weight(big, Filled(16 * 32, 3e38f), 16, 32, /*ef=*/false));
    const std::string big_before = StateOf(*stub_, big, false);
    v1::UpdateWeightRequest d;
    d.set_name(big);
    d.set_step(1);
    d.set_kind(v1::UPDATE_KIND_DELTA);
    *d.mutable_update() = InlineTensor(Filled(16 * 32, 3e38f), 16, 32);
    s = t.Invoke("UpdateWeight", d, &rep);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
    EXPECT_EQ(StateOf(*stub_, big, false), big_before);
    // A Qdq residual key over two steps: 3e38, then 3e38 again (x + r overflows).
    const std::string key = absl::StrCat("r-", t.fast != nullptr);
    v1::QdqRequest q;
    *q.mutable_input() = InlineTensor(Filled(16 * 32, 3e38f), 16, 32);
    q.mutable_options()->set_residual_key(key);
    q.mutable_options()->set_step(1);
    v1::QdqReply qr;
    s = t.Invoke("Qdq", q, &qr);
    if (s.ok()) {
      q.mutable_options()->set_step(2);
      s = t.Invoke("Qdq", q, &qr);
      EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
      EXPECT_THAT(s.error_message(), HasSubstr("the residual is unchanged"));
    } else {
      EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
    }
    // The weights and the key are usable afterwards.
    u.set_lr(0.01f);
    s = t.Invoke("UpdateWeight", u, &rep);
    EXPECT_TRUE(s.ok()) << s.error_message();
    EXPECT_TRUE(rep.applied());
  }
}

TEST_F(E2eResultsTest, StepsOverBothTransportsAreAppliedAsAUnit) {
  for (const Transport& t : Both()) {
    SCOPED_TRACE(t.name());
    const std::string a = absl::StrCat("sa-", t.fast != nullptr);
    const std::string b = absl::StrCat("sb-", t.fast != nullptr);
    Create(Weight(a, RandomF32(16 * 32, 3, 0.05f), 16, 32, true));
    Create(Weight(b, RandomF32(32 * 64, 4, 0.05f), 32, 64, true));
    v1::StepRequest step;
    step.set_step(1);
    step.add_groups()->set_lr(0.1f);
    v1::StepItem* ia = step.add_items();
    ia->set_name(a);
    *ia->mutable_update() = InlineTensor(RandomF32(16 * 32, 5), 16, 32);
    ia->set_return_dequantized(true);
    v1::StepItem* ib = step.add_items();
    ib->set_name(b);
    *ib->mutable_update() = InlineTensor(RandomF32(32 * 64, 6), 32, 64);
    v1::StepReply rep;
    grpc::Status s = t.Invoke("Step", step, &rep);
    ASSERT_TRUE(s.ok()) << s.error_message();
    ASSERT_EQ(rep.items_size(), 2);
    EXPECT_TRUE(rep.items(0).applied());
    EXPECT_EQ(rep.items(0).dequantized().inline_data().size(), 16u * 32 * 4);
    EXPECT_EQ(rep.items(1).last_step(), 1);
    EXPECT_GT(rep.header().kernel_micros(), 0.0);
    // A NaN in the second item: refused whole, naming it.
    const std::string sa = StateOf(*stub_, a, true);
    step.set_step(2);
    std::string bad = RandomF32(32 * 64, 7);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::memcpy(bad.data() + 4 * 300, &nan, 4);
    *step.mutable_items(1)->mutable_update() = InlineTensor(bad, 32, 64);
    s = t.Invoke("Step", step, &rep);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("items[1].update: element 300 is NaN"));
    EXPECT_EQ(StateOf(*stub_, a, true), sa);
  }
}

TEST_F(E2eResultsTest, BriefStepRepliesCountTheItemsInsteadOfListingThem) {
  for (const Transport& t : Both()) {
    SCOPED_TRACE(t.name());
    const std::string a = absl::StrCat("ba-", t.fast != nullptr);
    const std::string b = absl::StrCat("bb-", t.fast != nullptr);
    Create(Weight(a, RandomF32(16 * 32, 13, 0.05f), 16, 32, true));
    Create(Weight(b, RandomF32(16 * 32, 14, 0.05f), 16, 32, true));
    v1::StepRequest step;
    step.set_step(1);
    step.set_brief_reply(true);
    step.add_groups()->set_lr(0.1f);
    for (const std::string& name : {a, b}) {
      v1::StepItem* it = step.add_items();
      it->set_name(name);
      *it->mutable_update() = InlineTensor(RandomF32(16 * 32, 15), 16, 32);
    }
    // An item that wants its DQ(W) inline cannot be answered briefly: refused, nothing changes.
    step.mutable_items(1)->set_return_dequantized(true);
    const std::string sa = StateOf(*stub_, a, true);
    v1::StepReply rep;
    grpc::Status s = t.Invoke("Step", step, &rep);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_EQ(s.error_message(),
              "items[1].return_dequantized: true, but brief_reply leaves the items out of the "
              "reply (give dequantized_out a region, or send brief_reply false)");
    EXPECT_EQ(StateOf(*stub_, a, true), sa);
    step.mutable_items(1)->set_return_dequantized(false);
    s = t.Invoke("Step", step, &rep);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(rep.items_size(), 0);
    EXPECT_EQ(rep.applied_items(), 2u);
    EXPECT_EQ(rep.world_size(), 1u);
    EXPECT_NE(StateOf(*stub_, a, true), sa);
    // The same step again is a retry: nothing applied, and the count says so.
    rep.Clear();
    s = t.Invoke("Step", step, &rep);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(rep.items_size(), 0);
    EXPECT_EQ(rep.applied_items(), 0u);
    // Without brief_reply the items are listed and counted.
    step.set_step(2);
    step.set_brief_reply(false);
    s = t.Invoke("Step", step, &rep);
    ASSERT_TRUE(s.ok()) << s.error_message();
    ASSERT_EQ(rep.items_size(), 2);
    EXPECT_EQ(rep.applied_items(), 2u);
    EXPECT_EQ(rep.items(1).name(), b);
  }
}

// StepRequest.done_signal and ready_signal cross both transports: on the CPU backend no region
// exists, so each is refused naming the field, and the step changes nothing; the server lists
// neither step_done_signal nor step_ready_signal there.
TEST_F(E2eResultsTest, DoneAndReadySignalsAreParsedOnBothTransportsAndChecked) {
  Create(Weight("signalled", RandomF32(16 * 32, 21, 0.05f), 16, 32, true));
  v1::StepRequest step;
  step.set_step(1);
  step.add_groups()->set_lr(0.01f);
  v1::StepItem* it = step.add_items();
  it->set_name("signalled");
  *it->mutable_update() = InlineTensor(RandomF32(16 * 32, 22, 0.01f), 16, 32);
  step.mutable_done_signal()->mutable_region()->set_region_id("x");
  step.mutable_done_signal()->set_value(3);
  v1::StepReply rep;
  absl::Status fast = fast_->Invoke("Step", step, &rep);
  EXPECT_EQ(fast.code(), absl::StatusCode::kNotFound) << fast;
  EXPECT_THAT(std::string(fast.message()),
              HasSubstr("done_signal.region.region_id: no region 'x'"));
  auto ctx = Context();
  grpc::Status g = stub_->Step(ctx.get(), step, &rep);
  EXPECT_EQ(g.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(g.error_message(), HasSubstr("done_signal.region.region_id: no region 'x'"));
  v1::ServerInfoReply info;
  auto ictx = Context();
  ASSERT_TRUE(stub_->ServerInfo(ictx.get(), v1::ServerInfoRequest(), &info).ok());
  EXPECT_THAT(info.supported_modes(), ::testing::Not(::testing::Contains("step_done_signal")));
  EXPECT_THAT(info.supported_modes(), ::testing::Not(::testing::Contains("step_ready_signal")));
  step.clear_done_signal();
  // The ready signal likewise, its timeout checked against the server's most first.
  step.mutable_ready_signal()->mutable_region()->set_region_id("y");
  step.mutable_ready_signal()->set_value(4);
  for (uint32_t timeout_ms : {0u, 5001u}) {
    step.mutable_ready_signal()->set_timeout_ms(timeout_ms);
    const std::string want = timeout_ms == 0
        ? "ready_signal.region.region_id: no region 'y'"
        : "ready_signal.timeout_ms: 5001 is over this server's most, 5000 "
          "(--step_ready_timeout_ms)";
    fast = fast_->Invoke("Step", step, &rep);
    EXPECT_EQ(fast.code(), timeout_ms == 0 ? absl::StatusCode::kNotFound
                                           : absl::StatusCode::kInvalidArgument) << fast;
    EXPECT_THAT(std::string(fast.message()), HasSubstr(want));
    auto rctx = Context();
    g = stub_->Step(rctx.get(), step, &rep);
    EXPECT_THAT(g.error_message(), HasSubstr(want));
  }
  step.clear_ready_signal();
  ASSERT_TRUE(fast_->Invoke("Step", step, &rep).ok());
  ASSERT_EQ(rep.items_size(), 1);
  EXPECT_TRUE(rep.items(0).applied()) << "a refused step changed the weight";
}

// Memory flat over 10,000 steps (docs/RELIABILITY.md C4): SGD with momentum and error feedback and AdamW
// weights stepped 10,000 times over the fast socket, every 4th step a refused one (a NaN).
TEST_F(E2eResultsTest, TenThousandStepsKeepTheServersMemoryFlat) {
  v1::CreateWeightRequest sgd = Weight("flat-sgd", RandomF32(32 * 64, 11, 0.05f), 32, 64, true);
  sgd.mutable_options()->mutable_optimizer()->set_kind(v1::OPTIMIZER_KIND_SGD);
  sgd.mutable_options()->mutable_optimizer()->set_momentum(true);
  Create(sgd);
  v1::CreateWeightRequest adam = Weight("flat-adamw", RandomF32(32 * 64, 12, 0.05f), 32, 64, true);
  adam.mutable_options()->mutable_optimizer()->set_kind(v1::OPTIMIZER_KIND_ADAMW);
  Create(adam);
  const std::string good = RandomF32(32 * 64, 13, 0.01f);
  std::string bad = good;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(bad.data() + 4 * 5, &nan, 4);
  v1::StepRequest step;
  v1::Hyperparameters* hs = step.add_groups();
  hs->set_lr(0.01f);
  hs->mutable_sgd()->set_momentum(0.9f);
  v1::Hyperparameters* ha = step.add_groups();
  ha->set_lr(1e-3f);
  ha->mutable_adamw()->set_beta1(0.9f);
  ha->mutable_adamw()->set_beta2(0.999f);
  ha->mutable_adamw()->set_eps(1e-8f);
  for (int g = 0; g < 2; ++g) {
    v1::StepItem* it = step.add_items();
    it->set_name(g == 0 ? "flat-sgd" : "flat-adamw");
    it->set_group(g);
    *it->mutable_update() = InlineTensor(good, 32, 64);
  }
  const int64_t applied =
      StepTenThousandTimes(step, 1, good, bad, "steps", [](const v1::StepReply&) {});
  v1::GetWeightRequest g;
  g.set_name("flat-adamw");
  v1::GetWeightReply rep;
  auto ctx = Context();
  ASSERT_TRUE(stub_->GetWeight(ctx.get(), g, &rep).ok());
  EXPECT_EQ(rep.weight().last_step(), applied);
  EXPECT_EQ(applied, 7500);
}

// The same for one-pass steps (StepRequest.one_pass), whose weight keeps a second copy of its
// state: every applied step ran in one pass, and the copies stay two.
TEST_F(E2eResultsTest, TenThousandOnePassStepsKeepTheServersMemoryFlat) {
  v1::CreateWeightRequest w = Weight("flat-one-pass", RandomF32(32 * 64, 14, 0.05f), 32, 64, true);
  w.mutable_options()->set_scaling(v1::SCALING_DELAYED);
  Create(w);
  const std::string good = RandomF32(32 * 64, 15, 0.01f);
  std::string bad = good;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(bad.data() + 4 * 7, &nan, 4);
  v1::StepRequest step;
  step.set_one_pass(true);
  step.add_groups()->set_lr(0.01f);
  v1::StepItem* it = step.add_items();
  it->set_name("flat-one-pass");
  *it->mutable_update() = InlineTensor(good, 32, 64);
  const int64_t applied =
      StepTenThousandTimes(step, 0, good, bad, "one-pass steps",
                           [](const v1::StepReply& rep) { EXPECT_TRUE(rep.one_pass()); });
  v1::GetWeightRequest g;
  g.set_name("flat-one-pass");
  v1::GetWeightReply rep;
  auto ctx = Context();
  ASSERT_TRUE(stub_->GetWeight(ctx.get(), g, &rep).ok());
  EXPECT_EQ(rep.weight().last_step(), applied);
  EXPECT_EQ(applied, 7500);
  // The weight and its copy: codes 1024, scales 128, record 8, statistics 32, residual 8192.
  EXPECT_EQ(rep.weight().bytes(), 2u * (1024 + 128 + 8 + 32 + 8192));
}

TEST_F(E2eResultsTest, UndecodableRequestsAreInvalidArgumentWithAMessage) {
  grpc::GenericStub generic(server_->Channel());
  struct Case {
    std::string what;
    std::string bytes;
  };
  const std::vector<Case> cases = {
      {"invalid UTF-8 in a string field", std::string("\x0a\x02\xff\xfe", 4)},  // name
      {"random bytes", std::string("\xff\xff\xff\xff\x0f\x01", 6)},
      {"a truncated message", std::string("\x12\x10\x08\x01", 4)},  // step's update, cut
  };
  for (const Case& c : cases) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    grpc::Slice slice(c.bytes.data(), c.bytes.size());
    grpc::ByteBuffer request(&slice, 1);
    grpc::ByteBuffer reply;
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    grpc::Status status;
    generic.UnaryCall(&ctx, "/fp4q.v1.Fp4q/UpdateWeight", grpc::StubOptions(), &request, &reply,
                      [&](grpc::Status s) {
                        std::lock_guard<std::mutex> lock(mu);
                        status = s;
                        done = true;
                        cv.notify_all();
                      });
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done; });
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.what;
    EXPECT_THAT(status.error_message(),
                HasSubstr(absl::StrCat("request: ", c.bytes.size(),
                                       " bytes are not a valid fp4q.v1.UpdateWeightRequest")))
        << c.what;
  }
  // The server keeps serving.
  v1::ServerInfoReply info;
  auto ctx = Context();
  EXPECT_TRUE(stub_->ServerInfo(ctx.get(), v1::ServerInfoRequest(), &info).ok());
}

TEST_F(E2eResultsTest, LongCpuWorkStopsAtItsDeadlineAndCostlyRequestsAreRefusedUpFront) {
  // A Matmul of 1024x4096 by (2048x4096)^T (8.6e9 multiply-adds: seconds on one worker) with
  // a 0.3 s deadline: DEADLINE_EXCEEDED, and the one worker is free right after.
  v1::QuantizeRequest qa, qb;
  *qa.mutable_input() = InlineTensor(RandomF32(1024 * 4096, 8), 1024, 4096);
  *qb.mutable_input() = InlineTensor(RandomF32(2048 * 4096, 9), 2048, 4096);
  v1::QuantizeReply ra, rb;
  {
    auto c1 = Context();
    ASSERT_TRUE(stub_->Quantize(c1.get(), qa, &ra).ok());
    auto c2 = Context();
    ASSERT_TRUE(stub_->Quantize(c2.get(), qb, &rb).ok());
  }
  v1::MatmulRequest m;
  *m.mutable_a()->mutable_tensor() = AsOperand(ra.rowwise());
  *m.mutable_b()->mutable_tensor() = AsOperand(rb.rowwise());
  m.set_out_dtype(v1::DTYPE_BF16);
  {
    auto c = Context("", absl::Milliseconds(300));
    v1::MatmulReply rep;
    grpc::Status s = stub_->Matmul(c.get(), m, &rep);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << s.error_message();
  }
  {  // The worker is free within about a chunk's time.
    const absl::Time t0 = absl::Now();
    auto c = Context();
    v1::QdqRequest small;
    *small.mutable_input() = InlineTensor(RandomF32(16 * 32, 11), 16, 32);
    v1::QdqReply qr;
    ASSERT_TRUE(stub_->Qdq(c.get(), small, &qr).ok());
    EXPECT_LT(absl::Now() - t0, absl::Seconds(2));
  }
  // Over the CPU cost limit: refused at once.
  auto server = ServerProcess::Start({"--cpu_max_request_flops=1000000"});
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = (*server)->Stub();
  auto c = Context();
  v1::MatmulReply rep;
  grpc::Status s = stub->Matmul(c.get(), m, &rep);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(s.error_message(),
              HasSubstr("multiply-adds, over the CPU backend's per-request limit of 1000000 "
                        "(fp4qd --cpu_max_request_flops); nothing was run"));
}

TEST_F(E2eResultsTest, StateChangingCallsWhoseReplyCannotFitAreRefusedBeforeTheyRun) {
  auto server = ServerProcess::Start({"--max_message_bytes=1048576"});
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = (*server)->Stub();
  // 512x512 f32 returned inline: 1 MiB of DQ(W) plus the reply's fields, over the limit.
  {
    auto c = Context();
    v1::CreateWeightReply rep;
    v1::CreateWeightRequest w = Weight("w", "", 512, 512, /*ef=*/false);
    *w.mutable_initial() = InlineTensor(RandomBF16(512 * 512, 1, 0.05f), 512, 512, v1::DTYPE_BF16);
    ASSERT_TRUE(stub->CreateWeight(c.get(), w, &rep).ok());
  }
  const std::string before = StateOf(*stub, "w", false);
  v1::UpdateWeightRequest u;
  u.set_name("w");
  u.set_step(1);
  // The update itself is 1 MiB too: send it in bf16 (512 KiB) so the request fits.
  *u.mutable_update() = InlineTensor(RandomBF16(512 * 512, 2), 512, 512, v1::DTYPE_BF16);
  u.set_lr(0.1f);
  u.set_return_dequantized(true);
  auto c = Context();
  v1::UpdateWeightReply rep;
  grpc::Status s = stub->UpdateWeight(c.get(), u, &rep);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("nothing was run"));
  EXPECT_EQ(StateOf(*stub, "w", false), before);
  // Without the inline output it applies, once.
  u.set_return_dequantized(false);
  auto c2 = Context();
  ASSERT_TRUE(stub->UpdateWeight(c2.get(), u, &rep).ok());
  EXPECT_TRUE(rep.applied());
  // A Qdq with a residual key and an inline output too big: refused, and its retry with a
  // region-free smaller output is not ALREADY_EXISTS (nothing was applied).
  v1::QdqRequest q;
  *q.mutable_input() = InlineTensor(RandomBF16(512 * 512, 3), 512, 512, v1::DTYPE_BF16);
  q.set_out_dtype(v1::DTYPE_F32);
  q.mutable_options()->set_residual_key("k");
  q.mutable_options()->set_step(1);
  v1::QdqReply qr;
  auto c3 = Context();
  s = stub->Qdq(c3.get(), q, &qr);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  q.set_out_dtype(v1::DTYPE_BF16);
  auto c4 = Context();
  s = stub->Qdq(c4.get(), q, &qr);
  EXPECT_TRUE(s.ok()) << s.error_message();
}

}  // namespace
}  // namespace fp4q::server::testing
