// The examples library and programs against a live fp4qd (CPU backend, port 0):
// the experiment's plumbing on a few steps, the two update paths agreeing bit
// for bit, clean-up of server state, the transports' checks and errors, and the
// programs' exit codes.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "fp4q/client/client.h"
#include "fp4q/client/tensors.h"
#include "fp4q/common/json.h"
#include "fp4q/examples/cuda_runtime.h"
#include "fp4q/examples/experiment.h"
#include "fp4q/examples/options.h"
#include "fp4q/examples/problems.h"
#include "fp4q/examples/report.h"
#include "fp4q/examples/transport.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "subprocess.h"
#include "testing/status_matchers.h"

namespace fp4q::examples {
namespace {

using ::fp4q::client::testing::RunResult;
using ::fp4q::client::testing::ServerProcess;
using ::fp4q::client::testing::TempDir;
using ::fp4q::testing::IsOk;
using ::fp4q::testing::StatusIs;
using ::testing::HasSubstr;

class ExamplesLiveTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    absl::StatusOr<std::unique_ptr<ServerProcess>> s =
        ServerProcess::Start(FP4Q_FP4QD, {"--listen=127.0.0.1:0",
                                          "--metrics_listen=", "--backend=cpu",
                                          "--log_format=text", "--workers=2"});
    ASSERT_THAT(s, IsOk());
    server_ = s->release();
    client::ClientOptions o;
    o.address = server_->address();
    absl::StatusOr<std::unique_ptr<client::Client>> c =
        client::Client::Connect(o);
    ASSERT_THAT(c, IsOk());
    client_ = c->release();
  }
  static void TearDownTestSuite() {
    delete client_;
    client_ = nullptr;
    if (server_ != nullptr) {
      EXPECT_EQ(server_->Stop(), 0) << server_->Log();
    }
    delete server_;
    server_ = nullptr;
  }

  // Names of the server's tensors that start with "fp4q-examples/".
  static std::vector<std::string> ExampleTensors() {
    std::vector<std::string> names;
    absl::StatusOr<v1::ListTensorsReply> r = client_->ListTensors();
    EXPECT_THAT(r, IsOk());
    if (!r.ok()) return names;
    for (const v1::TensorListing& t : r->tensors()) {
      if (t.name().rfind("fp4q-examples/", 0) == 0) names.push_back(t.name());
    }
    return names;
  }

  static absl::StatusOr<ExperimentResult> RunShort(const Problem& problem,
                                                   UpdatePath path,
                                                   int64_t steps) {
    std::unique_ptr<Transport> t = MakeInlineTransport(*client_);
    ExperimentConfig c;
    c.example = path == UpdatePath::kQdq ? "linear_qdq" : "linear";
    c.path = path;
    c.steps = steps;
    c.lr = 0.02;
    c.seed = 5;
    return RunExperiment(*client_, *t, problem, c, nullptr);
  }

  static ServerProcess* server_;
  static client::Client* client_;
};

ServerProcess* ExamplesLiveTest::server_ = nullptr;
client::Client* ExamplesLiveTest::client_ = nullptr;

TEST_F(ExamplesLiveTest, AShortRunRecordsEveryStepAndLeavesNoState) {
  auto problem = MakeLinearProblem(5);
  absl::StatusOr<ExperimentResult> r =
      RunShort(*problem, UpdatePath::kStoredWeight, 4);
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->backend, "cpu");
  EXPECT_EQ(r->transport, "inline");
  EXPECT_EQ(r->server, server_->address());
  ASSERT_EQ(r->variants.size(), 5u);
  for (size_t i = 0; i < 5; ++i) {
    const VariantResult& v = r->variants[i];
    EXPECT_EQ(v.variant, kAllVariants[i]);
    ASSERT_EQ(v.losses.size(), 5u) << VariantLabel(v.variant);
    for (double l : v.losses) EXPECT_TRUE(std::isfinite(l) && l > 0);
    EXPECT_EQ(v.weights, IsQuantized(v.variant) ? 64 * 256 : 0);
  }
  // fp32 starts at the f32 W0; RTN and RTN+EF store the same RTN(W0); SR and
  // SR+EF the same SR(W0) (same seed, step 0), which differs from RTN(W0).
  EXPECT_EQ(r->Get(Variant::kFp32).start_loss(),
            *problem->LossAndGradient(problem->initial(), nullptr));
  EXPECT_EQ(r->Get(Variant::kRtn).start_loss(),
            r->Get(Variant::kRtnEf).start_loss());
  EXPECT_EQ(r->Get(Variant::kSr).start_loss(),
            r->Get(Variant::kSrEf).start_loss());
  EXPECT_NE(r->Get(Variant::kSr).start_loss(),
            r->Get(Variant::kRtn).start_loss());
  // The first step is the same gradient for RTN and RTN+EF, but only EF keeps
  // the part round-to-nearest drops.
  EXPECT_NE(r->Get(Variant::kRtn).losses[1], r->Get(Variant::kRtnEf).losses[1]);
  EXPECT_EQ(r->count_first, 64 * 256);
  EXPECT_EQ(r->count_all, 4 * 64 * 256);
  EXPECT_GT(r->target_rtn_loss, 0);
  EXPECT_TRUE(ExampleTensors().empty());
}

TEST_F(ExamplesLiveTest, StoredWeightAndQdqPathsAgreeBitForBit) {
  auto problem = MakeLinearProblem(6);
  absl::StatusOr<ExperimentResult> stored =
      RunShort(*problem, UpdatePath::kStoredWeight, 6);
  absl::StatusOr<ExperimentResult> qdq =
      RunShort(*problem, UpdatePath::kQdq, 6);
  ASSERT_THAT(stored, IsOk());
  ASSERT_THAT(qdq, IsOk());
  for (Variant v : kAllVariants) {
    EXPECT_EQ(stored->Get(v).losses, qdq->Get(v).losses) << VariantLabel(v);
  }
  EXPECT_EQ(stored->below_all, qdq->below_all);
  EXPECT_EQ(stored->Get(Variant::kRtn).moved, qdq->Get(Variant::kRtn).moved);
  EXPECT_TRUE(ExampleTensors().empty());
}

TEST_F(ExamplesLiveTest,
       InlineTransportChecksItsArgumentsAndKeepsServerErrors) {
  std::unique_ptr<Transport> t = MakeInlineTransport(*client_);
  const std::vector<float> g(32, 0.25f);
  EXPECT_THAT(t->UpdateWeight("fp4q-examples/test/none", 1, 0.1f, g, 2, 16),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no weight")));
  EXPECT_THAT(t->UpdateWeight("fp4q-examples/test/none", 1, 0.1f, g, 4, 16),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("gradient: 32 values for shape [4, 16]")));
  EXPECT_THAT(t->Qdq(g, 0, 32, v1::QuantOptions()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("shape [0, 32]: dimensions must be >= 1")));
  v1::QuantOptions bad;
  bad.set_block(v1::BLOCK_SHAPE_16X16);  // needs rows % 16 == 0
  EXPECT_THAT(t->Qdq(g, 2, 16, bad),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("16")));

  // A step applied twice is refused by the transport (the examples own their
  // steps).
  v1::CreateWeightRequest create;
  create.set_name("fp4q-examples/test/w");
  std::vector<float> w(32);
  for (int i = 0; i < 32; ++i) w[i] = 0.1f * (i - 16);
  ASSERT_THAT(client::InlineTensorF32(w, {2, 16}), IsOk());
  *create.mutable_initial() = *client::InlineTensorF32(w, {2, 16});
  ASSERT_THAT(client_->CreateWeight(create), IsOk());
  absl::StatusOr<std::vector<float>> dq =
      t->UpdateWeight("fp4q-examples/test/w", 1, 0.1f, g, 2, 16);
  ASSERT_THAT(dq, IsOk());
  EXPECT_EQ(dq->size(), 32u);
  EXPECT_THAT(
      t->UpdateWeight("fp4q-examples/test/w", 1, 0.1f, g, 2, 16),
      StatusIs(absl::StatusCode::kFailedPrecondition,
               HasSubstr("step 1 of weight 'fp4q-examples/test/w' had already "
                         "been applied")));
  v1::DeleteWeightRequest del;
  del.set_name("fp4q-examples/test/w");
  EXPECT_THAT(client_->DeleteWeight(del), IsOk());
}

TEST(TransportChecksTest, ResultsAreCheckedForDtypeShapeAndUnwrittenValues) {
  v1::TensorResult r;
  r.set_dtype(v1::DTYPE_F32);
  r.add_shape(1);
  r.add_shape(3);
  const std::vector<float> ok = {1, 2, 3};
  EXPECT_THAT(CheckResult(r, ok, 1, 3, "out"), IsOk());
  EXPECT_THAT(CheckResult(r, ok, 3, 1, "out"),
              StatusIs(absl::StatusCode::kInternal,
                       HasSubstr("out: shape [1, 3], expected [3, 1]")));
  const std::vector<float> poisoned = {1, NAN, 3};
  EXPECT_THAT(
      CheckResult(r, poisoned, 1, 3, "out"),
      StatusIs(
          absl::StatusCode::kInternal,
          HasSubstr("out: element 1 is nan (the output was not written?)")));
  r.set_dtype(v1::DTYPE_BF16);
  EXPECT_THAT(CheckResult(r, ok, 1, 3, "out"),
              StatusIs(absl::StatusCode::kInternal,
                       HasSubstr("out: dtype BF16, expected F32")));
}

TEST_F(ExamplesLiveTest, CudaIpcTransportRunsWhereAGpuIs) {
  absl::StatusOr<std::unique_ptr<CudaRuntime>> cuda = CudaRuntime::Load();
  if (!cuda.ok()) {
    GTEST_SKIP() << "no usable CUDA device here: " << cuda.status().message();
  }
  // A GPU machine: this CPU-backend server does not accept regions; the
  // transport's first request must fail with the server's answer, not crash or
  // hang.
  absl::StatusOr<std::unique_ptr<Transport>> t =
      MakeCudaIpcTransport(*client_, std::move(*cuda), 64);
  ASSERT_THAT(t, IsOk());
  const std::vector<float> x(32, 0.5f);
  EXPECT_FALSE((*t)->Qdq(x, 2, 16, v1::QuantOptions()).ok());
}

// ---------------------------------------------------------------- the programs

std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

TEST_F(ExamplesLiveTest, ProgramWritesTableCsvAndJson) {
  TempDir dir;
  absl::StatusOr<RunResult> r =
      client::testing::Run({FP4Q_EXAMPLE_MLP, "--server", server_->address(),
                            "--steps", "3", "--seed", "4", "--csv",
                            dir.File("m.csv"), "--json", dir.File("m.json")});
  ASSERT_THAT(r, IsOk());
  ASSERT_EQ(r->exit_code, 0) << r->err;
  for (const char* s : {"== mlp: two-layer MLP", "RTN+EF", "SR+EF",
                        "final/start", "updates below half a grid step"}) {
    EXPECT_THAT(r->out, HasSubstr(s));
  }
  const std::string csv = ReadFile(dir.File("m.csv"));
  EXPECT_EQ(csv.rfind("step,fp32,rtn,sr,rtn_ef,sr_ef\n0,", 0), 0u) << csv;
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'),
            5);  // header + steps 0..3
  absl::StatusOr<common::JsonValue> j =
      common::ParseJson(ReadFile(dir.File("m.json")));
  ASSERT_THAT(j, IsOk());
  EXPECT_EQ(j->Find("example")->text(), "mlp");
  EXPECT_EQ(*j->Find("steps")->AsInt64(), 3);
  EXPECT_EQ(*j->Find("seed")->AsUint64(), 4u);
  EXPECT_EQ(j->Find("backend")->text(), "cpu");
}

TEST_F(ExamplesLiveTest, ProgramExitCodes) {
  absl::StatusOr<RunResult> help =
      client::testing::Run({FP4Q_EXAMPLE_LINEAR, "--help"});
  ASSERT_THAT(help, IsOk());
  EXPECT_EQ(help->exit_code, kExitOk);
  EXPECT_THAT(help->out, HasSubstr("--transport"));

  absl::StatusOr<RunResult> usage =
      client::testing::Run({FP4Q_EXAMPLE_LINEAR, "--steps", "zero"});
  ASSERT_THAT(usage, IsOk());
  EXPECT_EQ(usage->exit_code, kExitUsage);
  EXPECT_THAT(
      usage->err,
      HasSubstr("option '--steps' wants an unsigned integer, got 'zero'"));

  // Nothing listens on port 1.
  absl::StatusOr<RunResult> down = client::testing::Run(
      {FP4Q_EXAMPLE_LINEAR, "--server", "127.0.0.1:1", "--steps", "1"});
  ASSERT_THAT(down, IsOk());
  EXPECT_EQ(down->exit_code, kExitError);
  EXPECT_THAT(down->err, HasSubstr("UNAVAILABLE"));

  absl::StatusOr<RunResult> write =
      client::testing::Run({FP4Q_EXAMPLE_LINEAR, "--server", server_->address(),
                            "--steps", "1", "--csv", "/nonexistent-dir/a.csv"});
  ASSERT_THAT(write, IsOk());
  EXPECT_EQ(write->exit_code, kExitError);
  EXPECT_THAT(write->err, HasSubstr("/nonexistent-dir/a.csv.tmp"));

  absl::StatusOr<RunResult> ipc = client::testing::Run(
      {FP4Q_EXAMPLE_LINEAR_QDQ, "--server", server_->address(), "--steps", "1",
       "--transport", "cuda_ipc"});
  ASSERT_THAT(ipc, IsOk());
  if (CudaRuntime::Load().ok()) {
    // A GPU machine: the CPU-backend server refuses the region (no
    // --allow_cuda_ipc).
    EXPECT_EQ(ipc->exit_code, kExitError) << ipc->err;
  } else {
    EXPECT_EQ(ipc->exit_code, kExitSkipped) << ipc->err;
    EXPECT_THAT(ipc->err,
                HasSubstr("skipped: --transport cuda_ipc needs a CUDA device"));
  }
  EXPECT_TRUE(ExampleTensors().empty());
}

}  // namespace
}  // namespace fp4q::examples
