#include "server/spin_policy.h"

#include <chrono>
#include <thread>

#include "gtest/gtest.h"

namespace fp4q::server {
namespace {

using std::chrono::microseconds;
using Clock = std::chrono::steady_clock;

microseconds Us(Clock::duration d) { return std::chrono::duration_cast<microseconds>(d); }

TEST(SpinPolicyTest, FixedSpinsItsTimeWhateverTheArrivals) {
  SpinPolicy zero(absl::ZeroDuration());
  SpinPolicy fixed(absl::Microseconds(500));
  EXPECT_FALSE(fixed.automatic());
  const Clock::time_point t0 = Clock::now();
  EXPECT_EQ(Us(zero.Budget()), microseconds(0));
  EXPECT_EQ(Us(fixed.Budget()), microseconds(500));
  fixed.Arrived(t0);
  fixed.Arrived(t0 + microseconds(100));
  zero.Arrived(t0);
  zero.Arrived(t0 + microseconds(100));
  EXPECT_EQ(Us(fixed.Budget()), microseconds(500));
  EXPECT_EQ(Us(zero.Budget()), microseconds(0));
}

// Automatic: twice the gap between the last two arrivals while it is at most 2 ms, capped at
// 2 ms; nothing before two arrivals or after a longer gap.
TEST(SpinPolicyTest, AutomaticFollowsTheLastGap) {
  SpinPolicy p(std::nullopt, /*cpus=*/16);
  EXPECT_TRUE(p.automatic());
  EXPECT_EQ(Us(p.Budget()), microseconds(0)) << "no arrival yet";
  const Clock::time_point t0 = Clock::now();
  p.Arrived(t0);
  EXPECT_EQ(Us(p.Budget()), microseconds(0)) << "one arrival: no gap yet";
  p.Arrived(t0 + microseconds(300));
  EXPECT_EQ(Us(p.Budget()), microseconds(600));
  p.Arrived(t0 + microseconds(300 + 1500));
  EXPECT_EQ(Us(p.Budget()), microseconds(2000)) << "twice 1.5 ms, capped at 2 ms";
  p.Arrived(t0 + microseconds(1800 + 2000));
  EXPECT_EQ(Us(p.Budget()), microseconds(2000)) << "a gap of exactly 2 ms still spins";
  p.Arrived(t0 + microseconds(3800 + 10000));
  EXPECT_EQ(Us(p.Budget()), microseconds(0)) << "a training loop's 10 ms gap: no spin";
  p.Arrived(t0 + microseconds(13800 + 40));
  EXPECT_EQ(Us(p.Budget()), microseconds(80)) << "back to back again";
}

// Below kAutoMinThreads usable CPUs the automatic policy never spins; a fixed one does.
TEST(SpinPolicyTest, AutomaticNeverSpinsOnASmallMachine) {
  SpinPolicy p(std::nullopt, /*cpus=*/SpinPolicy::kAutoMinThreads - 1);
  SpinPolicy fixed(absl::Microseconds(50), /*cpus=*/2);
  const Clock::time_point t0 = Clock::now();
  p.Arrived(t0);
  p.Arrived(t0 + microseconds(100));
  EXPECT_EQ(Us(p.Budget()), microseconds(0));
  EXPECT_EQ(Us(fixed.Budget()), microseconds(50));
}

// A cgroup's cpu.max as whole CPUs (a Kubernetes CPU limit of 1.5 is "150000 100000").
TEST(SpinPolicyTest, CpuMaxReadsAsWholeCpus) {
  EXPECT_EQ(CpusOfCpuMax("max 100000\n"), 0) << "no quota";
  EXPECT_EQ(CpusOfCpuMax("200000 100000\n"), 2);
  EXPECT_EQ(CpusOfCpuMax("150000 100000"), 2) << "rounded up";
  EXPECT_EQ(CpusOfCpuMax("50000 100000"), 1);
  EXPECT_EQ(CpusOfCpuMax("1600000 100000"), 16);
  for (const char* bad : {"", "max", "100000", "x 100000", "100000 0", "-5 100000", "10 y"}) {
    EXPECT_EQ(CpusOfCpuMax(bad), 0) << "'" << bad << "'";
  }
}

// This machine's answer: at least one CPU, at most its hardware threads.
TEST(SpinPolicyTest, UsableCpusIsBetweenOneAndTheHardwareThreads) {
  const int cpus = UsableCpus();
  EXPECT_GE(cpus, 1);
  const unsigned hw = std::thread::hardware_concurrency();
  if (hw > 0) EXPECT_LE(cpus, static_cast<int>(hw));
}

}  // namespace
}  // namespace fp4q::server
