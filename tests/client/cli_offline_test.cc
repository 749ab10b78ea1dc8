// The fp4q CLI without a real server: usage errors (exit 2), RPC errors (exit 1), and the
// health command's exit code against the fake service whose readiness a test can flip.
#include <string>
#include <vector>

#include "fake_server.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "subprocess.h"
#include "testing/status_matchers.h"

namespace fp4q::client {
namespace {

using ::fp4q::client::testing::FakeServer;
using ::fp4q::client::testing::RunResult;
using ::fp4q::testing::IsOk;
using ::testing::HasSubstr;

RunResult Cli(std::vector<std::string> args) {
  args.insert(args.begin(), FP4Q_CLI);
  absl::StatusOr<RunResult> r = testing::Run(args, {"FP4Q_SERVER=", "FP4Q_TOKEN="});
  EXPECT_THAT(r, IsOk());
  return r.ok() ? *r : RunResult{};
}

struct UsageCase {
  std::vector<std::string> args;
  std::string message;
};

TEST(CliUsage, MistakesExitTwoWithAMessage) {
  const std::vector<UsageCase> cases = {
      {{}, "fp4q: missing COMMAND"},
      {{"frobnicate"}, "fp4q: unknown command 'frobnicate'"},
      {{"--bogus", "info"}, "fp4q: unknown option '--bogus'"},
      {{"--server"}, "fp4q: option '--server' needs a value"},
      {{"--timeout", "0", "info"}, "option '--timeout' must be a positive number of seconds"},
      {{"--max-message-bytes", "3000000000", "info"},
       "option '--max-message-bytes' must be in [1, 2147483647], got 3000000000"},
      {{"--tls-ca", "/nonexistent/ca.pem", "info"},
       "option '--tls-ca': cannot read '/nonexistent/ca.pem'"},
      {{"--token-file", "/nonexistent/token", "info"},
       "option '--token-file': cannot read '/nonexistent/token'"},
      {{"info", "extra"}, "fp4q info: unexpected argument 'extra'"},
      {{"health", "--verbose"}, "fp4q health: unknown option '--verbose'"},
      {{"quantize", "in.safetensors"},
       "fp4q quantize: expected IN and OUT files, got 1 argument(s)"},
      {{"quantize", "a", "b", "--block", "8x8"},
       "option '--block' must be one of 1x16, 16x16; got '8x8'"},
      {{"quantize", "a", "b", "--rounding", "up"},
       "option '--rounding' must be one of rtn, sr; got 'up'"},
      {{"quantize", "a", "b", "--seed", "5"}, "option '--seed' needs --rounding sr"},
      {{"quantize", "a", "b", "--rounding", "sr", "--step", "x"},
       "option '--step' wants an unsigned integer, got 'x'"},
      {{"quantize", "a", "b", "--rht-seed", "5"}, "option '--rht-seed' needs --rht seeded"},
      {{"quantize", "a", "b", "--rht", "on"},
       "option '--rht' must be one of off, default, seeded; got 'on'"},
      {{"quantize", "a", "b", "--scale-selection", "best"},
       "option '--scale-selection' must be one of map6, 4over6-mae, 4over6-mse; got 'best'"},
      {{"quantize", "a", "b", "--emax", "448"},
       "option '--emax' needs --scale-selection 4over6-*"},
      {{"quantize", "a", "b", "--max-request-bytes", "-1"},
       "option '--max-request-bytes' wants an unsigned integer, got '-1'"},
      {{"dequantize", "a", "b", "--dtype", "f16"},
       "option '--dtype' must be one of f32, bf16; got 'f16'"},
      {{"dequantize", "a"}, "fp4q dequantize: expected IN and OUT files, got 1 argument(s)"},
      {{"bench-ipc", "--shape", "8x7"}, "option '--shape': '8x7' is not RxC"},
      {{"bench-ipc", "--dtype", "f16"}, "option '--dtype': bf16 or f32"},
  };
  for (const UsageCase& c : cases) {
    const RunResult r = Cli(c.args);
    EXPECT_EQ(r.exit_code, 2) << ::testing::PrintToString(c.args) << " stderr: " << r.err;
    EXPECT_THAT(r.err, HasSubstr(c.message)) << ::testing::PrintToString(c.args);
    EXPECT_THAT(r.err, HasSubstr("--help'.")) << ::testing::PrintToString(c.args);
    EXPECT_EQ(r.out, "") << ::testing::PrintToString(c.args);
  }
}

TEST(CliUsage, HelpForTheToolAndEachCommand) {
  RunResult r = Cli({"--help"});
  EXPECT_EQ(r.exit_code, 0);
  for (const char* command : {"health", "info", "list", "checkpoint", "quantize", "dequantize"}) {
    EXPECT_THAT(r.out, HasSubstr(std::string("  ") + command + " ")) << command;
    const RunResult c = Cli({command, "--help"});
    EXPECT_EQ(c.exit_code, 0) << command;
    EXPECT_THAT(c.out, HasSubstr(std::string("Usage: fp4q [--server ADDR] ") + command));
  }
  r = Cli({"quantize", "--help"});
  for (const char* option : {"--block 1x16|16x16", "--rounding rtn|sr", "--seed N", "--step N",
                             "--rht off|default|seeded", "--rht-seed N",
                             "--scale-selection map6|4over6-mae|4over6-mse", "--progress"}) {
    EXPECT_THAT(r.out, HasSubstr(option));
  }
}

TEST(CliErrors, UnreachableServerExitsOneWithTheRpcError) {
  const RunResult r = Cli({"--server", "127.0.0.1:1", "info"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("fp4q info: UNAVAILABLE: "));
  const RunResult q = Cli({"--server", "127.0.0.1:1", "quantize", "/nonexistent/in.safetensors",
                           "/tmp/out.safetensors"});
  EXPECT_EQ(q.exit_code, 1);
  EXPECT_THAT(q.err, HasSubstr("fp4q quantize: NOT_FOUND: "));
  EXPECT_THAT(q.err, HasSubstr("/nonexistent/in.safetensors"));
}

// bench-ipc measures only with a GPU: without one it fails with the reason, never reports.
TEST(CliErrors, BenchIpcWithoutACudaRuntimeExitsOneSayingWhy) {
  const RunResult r = Cli({"--server", "127.0.0.1:1", "bench-ipc", "--cuda-runtime",
                           "/nonexistent/libcudart.so"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("fp4q bench-ipc: FAILED_PRECONDITION: no CUDA runtime (tried "
                               "/nonexistent/libcudart.so"));
  EXPECT_EQ(r.out, "");
}

TEST(CliHealth, ExitCodeFollowsLivenessAndReadiness) {
  FakeServer server;
  RunResult r = Cli({"--server", server.address(), "health"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "liveness   SERVING\nreadiness  SERVING\n");
  server.SetHealth("readiness", false);
  r = Cli({"--server", server.address(), "health"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.out, "liveness   SERVING\nreadiness  NOT_SERVING\n");
  EXPECT_THAT(r.err, HasSubstr("fp4q health: not healthy: readiness is NOT_SERVING"));
}

TEST(CliAuth, TokenFromTheEnvironmentIsSentAsBearer) {
  FakeServer server;
  absl::StatusOr<RunResult> r =
      testing::Run({FP4Q_CLI, "--server", server.address(), "checkpoint"},
                   {"FP4Q_TOKEN=s3cret", "FP4Q_SERVER="});
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->exit_code, 0) << r->err;
  EXPECT_EQ(r->out, "checkpoint fp4q-state.ckpt: 0 bytes, 0 tensors\n");
  EXPECT_EQ(server.service().last_metadata("Checkpoint").authorization, "Bearer s3cret");
}

TEST(CliServer, AddressFromTheEnvironment) {
  FakeServer server;
  absl::StatusOr<RunResult> r =
      testing::Run({FP4Q_CLI, "list"}, {"FP4Q_SERVER=" + server.address(), "FP4Q_TOKEN="});
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->exit_code, 0) << r->err;
  EXPECT_EQ(r->out, "NAME  KIND  SHAPE  DTYPE  BYTES  DEVICE  LAST_STEP\n(no tensors)\n");
  EXPECT_EQ(server.service().calls("ListTensors"), 1);
}

}  // namespace
}  // namespace fp4q::client
