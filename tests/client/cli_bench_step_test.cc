// `fp4q bench-step` as a process, without a GPU: usage errors (exit 2), the refusals that end a
// run before it measures anything (exit 1, saying why), and a whole run against the fake
// service with the fake CUDA runtime that has host memory for device memory
// (fake_cudart.cc built with FP4Q_FAKE_CUDART_MEMORY): what it creates, the Step requests it
// sends, the report and the cleanup. Against a real fp4qd: cli_bench_step_live_test.cc.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench_step.h"
#include "fake_server.h"
#include "fp4q/common/json.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "subprocess.h"
#include "testing/status_matchers.h"
#include "testing/files.h"

namespace fp4q::client {
namespace {

using ::fp4q::testing::ReadAll;

using ::fp4q::client::cli::bench_step::WeightShape;
using ::fp4q::client::testing::FakeFp4q;
using ::fp4q::client::testing::FakeServer;
using ::fp4q::client::testing::RunResult;
using ::fp4q::client::testing::TempDir;
using ::fp4q::testing::IsOk;
using ::testing::HasSubstr;

RunResult Cli(std::vector<std::string> args) {
  args.insert(args.begin(), FP4Q_CLI);
  absl::StatusOr<RunResult> r = testing::Run(args, {"FP4Q_SERVER=", "FP4Q_TOKEN="});
  EXPECT_THAT(r, IsOk());
  return r.ok() ? *r : RunResult{};
}

float Bf16ToFloat(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

TEST(CliBenchStep, UsageMistakesExitTwoWithAMessage) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--model", "gpt3"}, "option '--model' must be one of gpt2-small, llama3-8b, square8192"},
      {{"--layers", "4"}, "option '--layers' needs --model llama3-8b"},
      {{"--model", "llama3-8b", "--layers", "0"}, "option '--layers' must be in [1, 1024], got 0"},
      {{"--shapes", "8x7"}, "option '--shapes': '8x7' is not RxC"},
      {{"--shapes", "8x16", "--model", "square8192"},
       "options '--shapes' and '--model' exclude each other"},
      {{"--optimizer", "adam"}, "option '--optimizer' must be one of sgd, adamw; got 'adam'"},
      {{"--ef", "--no-ef"}, "options '--ef' and '--no-ef' exclude each other"},
      {{"--ef=1"}, "option '--ef' takes no value (got '1')"},
      {{"--rounding", "up"}, "option '--rounding' must be one of rtn, sr; got 'up'"},
      {{"--scaling", "late"}, "option '--scaling' must be one of current, delayed; got 'late'"},
      {{"--state-dtype", "f16", "--optimizer", "adamw"},
       "option '--state-dtype' must be one of f32, bf16, nvfp4; got 'f16'"},
      {{"--state-dtype", "bf16"}, "option '--state-dtype' needs --optimizer adamw or --momentum > 0"},
      {{"--momentum", "1"}, "option '--momentum' must be in [0, 1), got 1"},
      {{"--momentum", "-0.1"}, "option '--momentum' must be in [0, 1), got -0.1"},
      {{"--momentum", "nan"}, "option '--momentum' must be in [0, 1), got nan"},
      {{"--momentum", "0.9", "--optimizer", "adamw"}, "option '--momentum' needs --optimizer sgd"},
      {{"--lr", "-1"}, "option '--lr' must be finite and >= 0, got -1"},
      {{"--lr", "x"}, "option '--lr' wants a number, got 'x'"},
      {{"--iters", "0"}, "options '--iters' (1-1000000) and '--warmup' (0-1000000)"},
      {{"--warmup", "-3"}, "option '--warmup' wants an unsigned integer, got '-3'"},
      {{"--init", "zeros"}, "option '--init' must be one of ipc, inline; got 'zeros'"},
      {{"--align", "48"}, "option '--align' must be a power of two in [16, 4096], got 48"},
      {{"--prefix", "bad name"}, "option '--prefix': 'bad name' must be 1-200 bytes"},
      {{"--copy-bandwidth", "-5"}, "option '--copy-bandwidth' must be in (0, 1e6] GB/s, got -5"},
      {{"--spin-us", "10"}, "option '--spin-us': 0-1000000, with --fast-socket"},
      {{"--gap-us", "1000001"}, "option '--gap-us' must be in [0, 1000000], got '1000001'"},
      {{"--gap-us", "-1"}, "option '--gap-us' must be in [0, 1000000], got '-1'"},
      {{"--no-heads-up"}, "option '--no-heads-up' needs --fast-socket"},
      {{"--one-pass"}, "option '--one-pass' needs plain SGD (--optimizer sgd, no --momentum) "
                       "and --scaling delayed"},
      {{"--one-pass", "--scaling", "delayed", "--momentum", "0.5"},
       "option '--one-pass' needs plain SGD"},
      {{"--bogus"}, "unknown option '--bogus'"},
      {{"extra"}, "fp4q bench-step: unexpected argument 'extra'"},
  };
  for (const auto& [args, message] : cases) {
    std::vector<std::string> argv = {"--server", "127.0.0.1:1", "bench-step"};
    argv.insert(argv.end(), args.begin(), args.end());
    const RunResult r = Cli(argv);
    EXPECT_EQ(r.exit_code, 2) << ::testing::PrintToString(args) << " stderr: " << r.err;
    EXPECT_THAT(r.err, HasSubstr(message)) << ::testing::PrintToString(args);
    EXPECT_THAT(r.err, HasSubstr("Try 'fp4q bench-step --help'."))
        << ::testing::PrintToString(args);
    EXPECT_EQ(r.out, "") << ::testing::PrintToString(args);
  }
}

TEST(CliBenchStep, HelpListsTheCommandAndItsOptions) {
  RunResult r = Cli({"--help"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_THAT(r.out, HasSubstr("  bench-step   the trainer's step"));
  r = Cli({"bench-step", "--help"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_THAT(r.out, HasSubstr("Usage: fp4q [--server ADDR] bench-step [--model "
                               "gpt2-small|llama3-8b|square8192]"));
  for (const char* option :
       {"--optimizer sgd|adamw", "[--momentum X]", "[--ef|--no-ef]", "--rounding rtn|sr",
        "--scaling current|delayed", "--state-dtype f32|bf16|nvfp4", "--copy-bandwidth GBPS",
        "--fast-socket PATH", "--json FILE", "13.125 B per parameter", "[--gap-us N]",
        "[--no-heads-up]", "heads_ups"}) {
    EXPECT_THAT(r.out, HasSubstr(option));
  }
}

// Without a runtime, or with one that cannot allocate device memory, it says so and reports
// nothing.
TEST(CliBenchStep, WithoutAUsableCudaRuntimeExitsOneSayingWhy) {
  RunResult r =
      Cli({"--server", "127.0.0.1:1", "bench-step", "--cuda-runtime", "/nonexistent/libcudart.so"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("fp4q bench-step: FAILED_PRECONDITION: no CUDA runtime (tried "
                               "/nonexistent/libcudart.so"));
  EXPECT_EQ(r.out, "");
  r = Cli({"--server", "127.0.0.1:1", "bench-step", "--cuda-runtime", FP4Q_FAKE_CUDART});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("fp4q bench-step: FAILED_PRECONDITION: CUDA runtime"));
  EXPECT_THAT(r.err, HasSubstr("lacks cudaGetDeviceCount, cudaMalloc, cudaMemcpy, "
                               "cudaDeviceSynchronize"));
  EXPECT_EQ(r.out, "");
}

TEST(CliBenchStep, AServerWithoutCudaIpcOrWithTooFewStepItemsIsRefused) {
  FakeServer server;
  RunResult r =
      Cli({"--server", server.address(), "bench-step", "--cuda-runtime", FP4Q_FAKE_CUDART_MEMORY});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("fp4q bench-step: FAILED_PRECONDITION: the server (backend fake) "
                               "does not offer cuda_ipc to this caller: run fp4qd --backend cuda "
                               "--allow_cuda_ipc"));
  EXPECT_EQ(r.out, "");

  v1::ServerInfoReply info;
  info.add_supported_modes("cuda_ipc");
  info.mutable_limits()->set_max_step_items(2);
  server.service().SetServerInfo(info);
  r = Cli({"--server", server.address(), "bench-step", "--shapes", "16x16,16x16,16x16",
           "--cuda-runtime", FP4Q_FAKE_CUDART_MEMORY});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("the model has 3 weights but the server takes at most 2 items in "
                               "one Step (fp4qd --max_step_items)"));

  // The buffers live on a GPU the server does not have.
  info.mutable_limits()->set_max_step_items(4096);
  info.add_gpus()->set_uuid("GPU-ffffffff-ffff-ffff-ffff-ffffffffffff");
  server.service().SetServerInfo(info);
  r = Cli({"--server", server.address(), "bench-step", "--shapes", "16x16", "--cuda-runtime",
           FP4Q_FAKE_CUDART_MEMORY});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("GPU 0 here (GPU-00010203-0405-0607-0809-0a0b0c0d0e0f) is not one "
                               "of the server's GPUs (GPU-ffffffff-ffff-ffff-ffff-ffffffffffff)"));
  EXPECT_EQ(server.service().calls("OpenSession"), 0);
  EXPECT_EQ(server.service().calls("CreateWeight"), 0);
  EXPECT_EQ(server.service().calls("Step"), 0);
}

TEST(CliBenchStep, AWholeRunAgainstTheFakeService) {
  FakeServer server;
  v1::ServerInfoReply info;
  info.add_supported_modes("cuda_ipc");
  info.add_gpus()->set_uuid("GPU-00010203-0405-0607-0809-0a0b0c0d0e0f");  // the fake's GPU 0
  server.service().SetServerInfo(info);
  TempDir dir;
  const RunResult r = Cli({"--server",
                           server.address(),
                           "bench-step",
                           "--shapes",
                           "32x64,3x48,16x16",
                           "--optimizer",
                           "adamw",
                           "--state-dtype",
                           "nvfp4",
                           "--rounding",
                           "sr",
                           "--scaling",
                           "delayed",
                           "--iters",
                           "5",
                           "--warmup",
                           "2",
                           "--align",
                           "256",
                           "--prefix",
                           "t/run",
                           "--copy-bandwidth",
                           "4000",
                           "--json",
                           dir.File("r.json"),
                           "--cuda-runtime",
                           FP4Q_FAKE_CUDART_MEMORY});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("fp4q bench-step: custom: 3 weights, 2448 parameters"));
  EXPECT_EQ(ReadAll(dir.File("r.json")), r.out);

  // One region per buffer, each the size of the layout.
  const std::vector<WeightShape> shapes = {
      {"t/run/w0", 32, 64}, {"t/run/w1", 3, 48}, {"t/run/w2", 16, 16}};
  const cli::bench_step::Layout layout = cli::bench_step::PackBf16(shapes, 256);
  const std::vector<v1::RegisterCudaRegionRequest> regs = server.service().registrations();
  ASSERT_EQ(regs.size(), 2u);
  for (const auto& reg : regs) {
    EXPECT_EQ(reg.size(), layout.total_bytes);
    EXPECT_EQ(reg.device_uuid(), "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f");
  }

  // The weights, created from the parameter region with the run's options.
  const std::vector<v1::CreateWeightRequest> created = server.service().created();
  ASSERT_EQ(created.size(), 3u);
  std::string grad_region, param_region;
  for (size_t i = 0; i < created.size(); ++i) {
    const v1::CreateWeightRequest& c = created[i];
    EXPECT_EQ(c.name(), shapes[i].name);
    EXPECT_THAT(c.initial().shape(), ::testing::ElementsAre(shapes[i].rows, shapes[i].cols));
    ASSERT_TRUE(c.initial().has_region()) << c.name();
    EXPECT_EQ(c.initial().region().offset(), layout.offsets[i]);
    param_region = c.initial().region().region_id();
    EXPECT_EQ(c.options().optimizer().kind(), v1::OPTIMIZER_KIND_ADAMW);
    EXPECT_EQ(c.options().optimizer().state_dtype(), v1::STATE_DTYPE_NVFP4);
    EXPECT_EQ(c.options().rounding(), v1::ROUNDING_STOCHASTIC);
    EXPECT_EQ(c.options().scaling(), v1::SCALING_DELAYED);
    EXPECT_TRUE(c.options().error_feedback());
    EXPECT_EQ(c.device_uuid(), "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f");
  }

  // 2 + 5 steps, numbered from 1, each naming every weight's two slices.
  const std::vector<v1::StepRequest> steps = server.service().steps();
  ASSERT_EQ(steps.size(), 7u);
  for (size_t s = 0; s < steps.size(); ++s) {
    EXPECT_EQ(steps[s].step(), static_cast<int64_t>(s) + 1);
    ASSERT_EQ(steps[s].groups_size(), 1);
    EXPECT_TRUE(steps[s].groups(0).has_adamw());
    EXPECT_TRUE(steps[s].brief_reply());  // DQ(W) goes to regions: nothing read per item
    ASSERT_EQ(steps[s].items_size(), 3);
    for (int i = 0; i < 3; ++i) {
      const v1::StepItem& it = steps[s].items(i);
      EXPECT_EQ(it.name(), shapes[i].name);
      EXPECT_EQ(it.update().dtype(), v1::DTYPE_BF16);
      EXPECT_EQ(it.update().region().offset(), layout.offsets[i]);
      EXPECT_EQ(it.dequantized_out().region().region_id(), param_region);
      EXPECT_EQ(it.dequantized_out().region().offset(), layout.offsets[i]);
      grad_region = it.update().region().region_id();
    }
  }
  EXPECT_NE(grad_region, param_region);
  EXPECT_EQ(server.service().last_metadata("Step").session, "0123456789abcdef0123456789abcdef");
  // Cleanup: every weight deleted, the session closed.
  EXPECT_EQ(server.service().calls("DeleteWeight"), 3);
  EXPECT_EQ(server.service().calls("CloseSession"), 1);

  absl::StatusOr<common::JsonValue> doc = common::ParseJson(r.out);
  ASSERT_THAT(doc, IsOk()) << r.out;
  EXPECT_EQ(doc->Find("tool")->text(), "fp4q bench-step");
  EXPECT_EQ(doc->Find("transport")->text(), "grpc");
  EXPECT_EQ(doc->Find("backend")->text(), "fake");
  EXPECT_EQ(doc->Find("model")->text(), "custom");
  EXPECT_EQ(doc->Find("device_uuid")->text(), "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f");
  ASSERT_EQ(doc->Find("gpus")->items().size(), 1u);
  EXPECT_EQ(doc->Find("gpus")->items()[0].Find("uuid")->text(),
            "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f");
  EXPECT_EQ(*doc->Find("weights")->AsInt64(), 3);
  EXPECT_EQ(*doc->Find("parameters")->AsInt64(), 2448);
  EXPECT_EQ(doc->Find("optimizer")->text(), "adamw");
  EXPECT_EQ(doc->Find("state_dtype")->text(), "nvfp4");
  EXPECT_EQ(doc->Find("rounding")->text(), "sr");
  EXPECT_EQ(doc->Find("scaling")->text(), "delayed");
  EXPECT_EQ(*doc->Find("iters")->AsInt64(), 5);
  EXPECT_DOUBLE_EQ(*doc->Find("floor")->Find("bytes_per_parameter")->AsDouble(), 15.375);
  EXPECT_EQ(*doc->Find("floor")->Find("bytes")->AsInt64(), 37638);  // 2448 x 15.375
  EXPECT_DOUBLE_EQ(*doc->Find("kernel_us")->Find("p50")->AsDouble(), FakeFp4q::kStepKernelMicros);
  EXPECT_DOUBLE_EQ(*doc->Find("queue_us")->Find("p90")->AsDouble(), FakeFp4q::kStepQueueMicros);
  EXPECT_DOUBLE_EQ(*doc->Find("server_us")->Find("min")->AsDouble(), FakeFp4q::kStepServerMicros);
  const common::JsonValue* wall = doc->Find("wall_us");
  EXPECT_GT(*wall->Find("min")->AsDouble(), 0);
  EXPECT_LE(*wall->Find("min")->AsDouble(), *wall->Find("p50")->AsDouble());
  EXPECT_LE(*wall->Find("p50")->AsDouble(), *wall->Find("p90")->AsDouble());
  EXPECT_LE(*wall->Find("p90")->AsDouble(), *wall->Find("max")->AsDouble());
  EXPECT_GT(*doc->Find("achieved_gbps")->Find("wall_p50")->AsDouble(), 0);
  EXPECT_DOUBLE_EQ(*doc->Find("copy_bandwidth_gbps")->AsDouble(), 4000);
  ASSERT_NE(doc->Find("pct_of_copy_bandwidth"), nullptr);
}

TEST(CliBenchStep, InlineInitialValuesAreSmallNonZeroBf16) {
  FakeServer server;
  v1::ServerInfoReply info;
  info.add_supported_modes("cuda_ipc");
  server.service().SetServerInfo(info);
  const RunResult r =
      Cli({"--server", server.address(), "bench-step", "--shapes", "64x64", "--no-ef", "--init",
           "inline", "--iters", "1", "--warmup", "0", "--cuda-runtime", FP4Q_FAKE_CUDART_MEMORY});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::vector<v1::CreateWeightRequest> created = server.service().created();
  ASSERT_EQ(created.size(), 1u);
  EXPECT_FALSE(created[0].options().error_feedback());
  const std::string& bytes = created[0].initial().inline_data();
  ASSERT_EQ(bytes.size(), 64u * 64 * 2);
  double sum_sq = 0;
  for (size_t e = 0; e < bytes.size() / 2; ++e) {
    uint16_t b;
    std::memcpy(&b, &bytes[2 * e], 2);
    const float v = Bf16ToFloat(b);
    ASSERT_TRUE(std::isfinite(v));
    EXPECT_LT(std::fabs(v), 0.2f);
    sum_sq += static_cast<double>(v) * v;
  }
  EXPECT_NEAR(std::sqrt(sum_sq / (64 * 64)), 0.02, 0.002);  // ~N(0, 0.02)
  EXPECT_EQ(server.service().steps().size(), 1u);
}

}  // namespace
}  // namespace fp4q::client
