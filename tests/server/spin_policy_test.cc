#include "server/spin_policy.h"

#include <chrono>

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
  SpinPolicy p(std::nullopt, /*hardware_threads=*/16);
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

// Below kAutoMinThreads hardware threads the automatic policy never spins; a fixed one does.
TEST(SpinPolicyTest, AutomaticNeverSpinsOnASmallMachine) {
  SpinPolicy p(std::nullopt, /*hardware_threads=*/SpinPolicy::kAutoMinThreads - 1);
  SpinPolicy fixed(absl::Microseconds(50), /*hardware_threads=*/2);
  const Clock::time_point t0 = Clock::now();
  p.Arrived(t0);
  p.Arrived(t0 + microseconds(100));
  EXPECT_EQ(Us(p.Budget()), microseconds(0));
  EXPECT_EQ(Us(fixed.Budget()), microseconds(50));
}

}  // namespace
}  // namespace fp4q::server
