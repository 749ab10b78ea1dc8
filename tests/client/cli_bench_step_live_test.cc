// `fp4q bench-step` against a real fp4qd. With the CPU backend (and the fake CUDA runtime that
// has host memory for device memory) it must refuse before it creates anything: a CPU fp4qd
// offers no cuda_ipc. On a GPU (LiveCudaIpc.*: the device suite's gpu-tests) it runs a small
// model's steps over gRPC and the fast socket and reports the server's kernel time; skipped,
// with CUDA's reason, where no GPU is usable.
#include <unistd.h>

#include <string>
#include <vector>

#include "fp4q/client/cuda_runtime.h"
#include "fp4q/common/json.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "live_support.h"
#include "subprocess.h"
#include "testing/status_matchers.h"

namespace fp4q::client::testing {
namespace {

using ::fp4q::testing::IsOk;
using ::testing::HasSubstr;

TEST(CliBenchStepLive, ACpuServerIsRefusedBeforeAnythingIsCreated) {
  if (TestBackend() != "cpu")
    GTEST_SKIP() << "the CPU backend's refusal; backend " << TestBackend();
  absl::StatusOr<std::unique_ptr<ServerProcess>> server = StartFp4qd({"--allow_cuda_ipc"});
  ASSERT_THAT(server, IsOk());
  absl::StatusOr<RunResult> r =
      testing::Run({CliPath(), "--server", (*server)->address(), "bench-step", "--model",
                    "square8192", "--cuda-runtime", FP4Q_FAKE_CUDART_MEMORY});
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->exit_code, 1) << r->err;
  EXPECT_THAT(r->err, HasSubstr("fp4q bench-step: FAILED_PRECONDITION: the server (backend cpu) "
                                "does not offer cuda_ipc to this caller"));
  EXPECT_EQ(r->out, "");
  absl::StatusOr<v1::ListTensorsReply> list = ConnectTo((*server)->address())->ListTensors();
  ASSERT_THAT(list, IsOk());
  EXPECT_EQ(list->tensors_size(), 0);
}

TEST(LiveCudaIpc, BenchStepStepsASmallModelOverGrpcAndTheFastSocket) {
  absl::StatusOr<std::unique_ptr<CudaRuntime>> cuda = CudaRuntime::Load();
  if (!cuda.ok()) GTEST_SKIP() << "no CUDA runtime: " << cuda.status();
  if (absl::StatusOr<int> n = (*cuda)->DeviceCount(); !n.ok()) {
    GTEST_SKIP() << "no usable CUDA device: " << n.status();
  }
  TempDir dir;
  const std::string sock = dir.File("fp4qd.sock");
  const std::string fast = "/tmp/fp4q-bench-step-" + std::to_string(::getpid()) + ".fast";
  // --fast_socket_spin_us given: fp4qd takes heads-ups on any machine with the CUDA backend.
  absl::StatusOr<std::unique_ptr<ServerProcess>> server =
      StartFp4qd({"--backend=cuda", "--allow_cuda_ipc", "--unix_socket=" + sock,
                  "--fast_socket=" + fast, "--fast_socket_spin_us=20"});
  ASSERT_THAT(server, IsOk());
  struct Case {
    const char* what;
    std::vector<std::string> args;
    int64_t gap_us, heads_ups;
  };
  const std::vector<Case> cases = {
      {"gRPC", {}, 0, 0},
      {"fast socket", {"--fast-socket", fast}, 0, 0},
      // A heads-up before each of the 6 steps (1 warm-up, 5 timed), each after a 3 ms gap.
      {"fast socket, gaps", {"--fast-socket", fast, "--gap-us", "3000"}, 3000, 6},
      {"fast socket, gaps, no heads-ups",
       {"--fast-socket", fast, "--gap-us", "3000", "--no-heads-up"}, 3000, 0},
      {"gRPC, gaps", {"--gap-us", "3000"}, 3000, 0},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const bool over_fast = !c.args.empty() && c.args[0] == "--fast-socket";
    std::vector<std::string> argv = {
        CliPath(), "--server", "unix://" + sock, "bench-step", "--shapes", "256x512,64x1024,1x16",
        "--iters", "5",        "--warmup",       "1",          "--json",   dir.File("r.json")};
    argv.insert(argv.end(), c.args.begin(), c.args.end());
    absl::StatusOr<RunResult> r = testing::Run(argv);
    ASSERT_THAT(r, IsOk());
    ASSERT_EQ(r->exit_code, 0) << r->err << "\nserver log:\n" << (*server)->Log();
    absl::StatusOr<common::JsonValue> doc = common::ParseJson(r->out);
    ASSERT_THAT(doc, IsOk()) << r->out;
    EXPECT_EQ(doc->Find("backend")->text(), "cuda");
    EXPECT_EQ(doc->Find("transport")->text(), over_fast ? "fast_socket" : "grpc");
    EXPECT_EQ(*doc->Find("parameters")->AsInt64(), 256 * 512 + 64 * 1024 + 16);
    EXPECT_GT(*doc->Find("kernel_us")->Find("p50")->AsDouble(), 0);
    EXPECT_GE(*doc->Find("wall_us")->Find("p50")->AsDouble(),
              *doc->Find("kernel_us")->Find("p50")->AsDouble());
    EXPECT_GT(*doc->Find("server_state_bytes")->AsInt64(), 0);
    EXPECT_EQ(*doc->Find("gap_us")->AsInt64(), c.gap_us);
    EXPECT_EQ(*doc->Find("heads_ups")->AsInt64(), c.heads_ups);
  }
  absl::StatusOr<v1::ListTensorsReply> list = ConnectTo("unix://" + sock)->ListTensors();
  ASSERT_THAT(list, IsOk());
  EXPECT_EQ(list->tensors_size(), 0);  // the runs deleted their weights
}

}  // namespace
}  // namespace fp4q::client::testing
