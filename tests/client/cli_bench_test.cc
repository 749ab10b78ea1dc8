// `fp4q bench` end to end against a real fp4qd: a short run's JSON report, the server's memory,
// cleanup of what the run created, bad options, and a server that refuses the setup.
#include <string>

#include "absl/strings/str_cat.h"
#include "fp4q/common/json.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "live_support.h"
#include "subprocess.h"
#include "testing/files.h"

namespace fp4q::client::testing {
namespace {

using ::fp4q::testing::ReadAll;

using ::testing::HasSubstr;

TEST(CliBenchTest, ShortRunReportsEveryRpcAndCleansUp) {
  auto server = StartFp4qd();
  ASSERT_TRUE(server.ok()) << server.status();
  TempDir dir;
  auto run =
      testing::Run({FP4Q_CLI, "--server", (*server)->address(), "bench", "--clients", "3",
                    "--channels", "2", "--duration", "1.5", "--warmup", "0.2", "--shape", "16x64",
                    "--server-pid", absl::StrCat((*server)->pid()), "--json", dir.File("r.json")});
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_code, 0) << run->err;
  EXPECT_THAT(run->err, HasSubstr("fp4q bench: t=1s measure calls="));
  EXPECT_THAT(run->out, HasSubstr("total: "));
  auto doc = common::ParseJson(ReadAll(dir.File("r.json")));
  ASSERT_TRUE(doc.ok()) << doc.status();
  EXPECT_EQ(doc->Find("backend")->text(), TestBackend());
  EXPECT_EQ(*doc->Find("clients")->AsInt64(), 3);
  EXPECT_EQ(*doc->Find("channels")->AsInt64(), 2);
  EXPECT_EQ(*doc->Find("total")->Find("errors")->AsInt64(), 0);
  EXPECT_GT(*doc->Find("total")->Find("ok")->AsInt64(), 20);
  for (const char* rpc :
       {"quantize", "qdq", "dequantize", "update", "get", "list", "info", "keepalive"}) {
    const common::JsonValue* r = doc->Find("rpcs")->Find(rpc);
    ASSERT_NE(r, nullptr) << rpc;
    EXPECT_GT(*r->Find("ok")->AsInt64(), 0) << rpc;
    const double p50 = *r->Find("p50_us")->AsDouble(), p99 = *r->Find("p99_us")->AsDouble(),
                 p999 = *r->Find("p999_us")->AsDouble(), max = *r->Find("max_us")->AsDouble();
    EXPECT_GT(p50, 0) << rpc;
    EXPECT_LE(p50, p99) << rpc;
    EXPECT_LE(p99, p999) << rpc;
    EXPECT_LE(p999, max) << rpc;
  }
  EXPECT_GT(*doc->Find("rpcs")->Find("quantize")->Find("kernel_p50_us")->AsDouble(), 0);
  const common::JsonValue* mem = doc->Find("server_memory");
  EXPECT_GT(*mem->Find("rss_before_kib")->AsInt64(), 1000);
  EXPECT_GT(*mem->Find("rss_after_kib")->AsInt64(), 1000);
  // The run's weights and sessions are gone.
  auto client = ConnectTo((*server)->address());
  auto list = client->ListTensors();
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ(list->tensors_size(), 0);
}

// `health` (grpc.health.v1 Check) is the floor the small RPCs are compared with, over TCP and
// over the Unix socket.
TEST(CliBenchTest, HealthFloorOverTcpAndUnixSocket) {
  TempDir dir;
  const std::string sock = dir.File("fp4qd.sock");
  auto server = StartFp4qd({"--unix_socket", sock});
  ASSERT_TRUE(server.ok()) << server.status();
  for (const std::string& target : {(*server)->address(), "unix://" + sock}) {
    SCOPED_TRACE(target);
    auto run = testing::Run({FP4Q_CLI, "--server", target, "bench", "--clients", "1",
                             "--duration", "0.5", "--warmup", "0.1", "--quiet", "--mix",
                             "health=1,list=1", "--json", dir.File("h.json")});
    ASSERT_TRUE(run.ok()) << run.status();
    EXPECT_EQ(run->exit_code, 0) << run->err;
    auto doc = common::ParseJson(ReadAll(dir.File("h.json")));
    ASSERT_TRUE(doc.ok()) << doc.status();
    EXPECT_EQ(*doc->Find("total")->Find("errors")->AsInt64(), 0);
    for (const char* rpc : {"health", "list"}) {
      const common::JsonValue* r = doc->Find("rpcs")->Find(rpc);
      ASSERT_NE(r, nullptr) << rpc;
      EXPECT_GT(*r->Find("ok")->AsInt64(), 10) << rpc;
    }
    EXPECT_EQ(doc->Find("rpcs")->Find("quantize"), nullptr);
  }
}

TEST(CliBenchTest, BadOptionsAndRefusedSetup) {
  auto help = testing::Run({FP4Q_CLI, "--help"});
  ASSERT_TRUE(help.ok()) << help.status();
  EXPECT_THAT(help->out, HasSubstr("  bench        load generator"));
  help = testing::Run({FP4Q_CLI, "bench", "--help"});
  ASSERT_TRUE(help.ok()) << help.status();
  EXPECT_EQ(help->exit_code, 0);
  EXPECT_THAT(help->out, HasSubstr("Usage: fp4q [--server ADDR] bench [--clients N]"));
  for (auto [arg, message] : {std::pair{"--mix=bogus=1", "option '--mix': 'bogus=1' is not"},
                              std::pair{"--mix=list=0", "option '--mix': no RPC has weight > 0"},
                              std::pair{"--shape=3x10", "option '--shape': '3x10' is not RxC"},
                              std::pair{"--clients=0", "option '--clients' must be in [1, 4096]"},
                              std::pair{"--duration=0", "option '--duration' out of range"}}) {
    auto run = testing::Run({FP4Q_CLI, "--server", "127.0.0.1:1", "bench", arg});
    ASSERT_TRUE(run.ok()) << run.status();
    EXPECT_EQ(run->exit_code, 2) << arg;
    EXPECT_THAT(run->err, HasSubstr(message)) << arg;
  }
  // A server whose state budget cannot hold a client's weight: setup fails, exit 1.
  auto server = StartFp4qd({"--state_budget_bytes=1000"});
  ASSERT_TRUE(server.ok()) << server.status();
  auto run = testing::Run({FP4Q_CLI, "--server", (*server)->address(), "bench", "--duration", "1"});
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_code, 1);
  EXPECT_THAT(run->err, HasSubstr("fp4q bench: RESOURCE_EXHAUSTED: name: 'bench/"));
}

}  // namespace
}  // namespace fp4q::client::testing
