// Two fp4qd on one --state_dir: the second exits at once
// with exit code 4 and a message naming the first one's pid; the lock goes with
// the holder (clean stop or kill -9).
//
//  until server/main.cc calls LockStateDir (server/state_dir.h) at
// startup; whoever wires it drops the prefix. Today's fp4qd starts the second
// server and both write the same checkpoint (the finding: the second
// one's weights vanished after both stopped).
#include <signal.h>

#include <string>
#include <vector>

#include "e2e_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fp4q::server::testing {
namespace {

using ::testing::HasSubstr;

constexpr int kExitStateDirLocked = 4;  // server/state_dir.h, docs/DESIGN.md exit codes

TEST(E2eStateDirLockTest, SecondServerOnOneStateDirExitsAtOnceNamingTheHolder) {
  TempDir dir;
  auto first = ServerProcess::Start({"--state_dir=" + dir.path()});
  ASSERT_TRUE(first.ok()) << first.status();
  std::string log;
  const absl::Time t0 = absl::Now();
  EXPECT_EQ(RunServerToExit({"--state_dir=" + dir.path()}, &log), kExitStateDirLocked) << log;
  EXPECT_LT(absl::Now() - t0, absl::Seconds(5)) << "the second server did not exit at once";
  EXPECT_THAT(
      log, HasSubstr("is in use by another fp4qd (pid " + std::to_string((*first)->pid()) + ","));
  // The holder is unaffected, and its lock goes when it stops.
  auto health = (*first)->Health();
  auto ready = CheckHealth(*health, "readiness");
  ASSERT_TRUE(ready.ok()) << ready.status();
  EXPECT_EQ(*ready, grpc::health::v1::HealthCheckResponse::SERVING);
  (*first)->Signal(SIGTERM);
  EXPECT_EQ((*first)->Wait(), 0);
  auto next = ServerProcess::Start({"--state_dir=" + dir.path()});
  EXPECT_TRUE(next.ok()) << next.status();
}

TEST(E2eStateDirLockTest, KillNineOfTheHolderFreesTheDirectory) {
  TempDir dir;
  auto first = ServerProcess::Start({"--state_dir=" + dir.path()});
  ASSERT_TRUE(first.ok()) << first.status();
  (*first)->Signal(SIGKILL);
  EXPECT_EQ((*first)->Wait(), 128 + SIGKILL);
  auto next = ServerProcess::Start({"--state_dir=" + dir.path()});
  EXPECT_TRUE(next.ok()) << "a dead holder's lock must not need manual cleanup: " << next.status();
}

}  // namespace
}  // namespace fp4q::server::testing
