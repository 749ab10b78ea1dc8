#include "server/executor.h"

#include <atomic>
#include <future>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace fp4q::server {
namespace {

using ::fp4q::testing::StatusIs;
using ::testing::HasSubstr;

class CountingObserver : public EngineObserver {
 public:
  void QueueRejected(absl::string_view device) override {
    rejected_device = std::string(device);
    ++rejected;
  }
  void QueueDepth(absl::string_view, int64_t depth) override { last_depth = depth; }
  std::atomic<int> rejected{0};
  std::atomic<int64_t> last_depth{-1};
  std::string rejected_device;
};

TEST(ExecutorTest, QueueBoundAnswersResourceExhaustedAndQueuesNothing) {
  CountingObserver obs;
  Executor x({"cpu", /*threads=*/1, /*max_queue_depth=*/2}, &obs);
  absl::Notification started, release;
  std::atomic<int> ran{0};
  // Occupy the only worker.
  ASSERT_TRUE(x.Submit(
                   {},
                   [&](kernels::Stream) {
                     started.Notify();
                     release.WaitForNotification();
                   },
                   [](absl::Status) {})
                  .ok());
  started.WaitForNotification();
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(x.Submit(
                     {}, [&](kernels::Stream) { ++ran; }, [](absl::Status) {})
                    .ok());
  }
  EXPECT_EQ(x.queued(), 2);
  bool rejected_ran = false;
  absl::Status s = x.Submit(
      {}, [&](kernels::Stream) { rejected_ran = true; },
      [&](absl::Status) { rejected_ran = true; });
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kResourceExhausted,
                          HasSubstr("device cpu: work queue is full (2 queued)")));
  EXPECT_EQ(obs.rejected.load(), 1);
  EXPECT_EQ(obs.rejected_device, "cpu");
  // Internal work may bypass the bound.
  ASSERT_TRUE(x.Submit(
                   {}, [&](kernels::Stream) { ++ran; }, [](absl::Status) {},
                   /*bypass_bound=*/true)
                  .ok());
  release.Notify();
  x.Shutdown();
  EXPECT_EQ(ran.load(), 3);
  EXPECT_FALSE(rejected_ran);
  EXPECT_EQ(obs.last_depth.load(), 0);
}

TEST(ExecutorTest, DeadlineAndCancellationAreCheckedBeforeWorkStarts) {
  Executor x({"cpu", 1, 8}, nullptr);
  std::promise<absl::Status> expired, cancelled, fine;
  bool expired_ran = false, cancelled_ran = false;
  RequestContext past;
  past.deadline = absl::Now() - absl::Seconds(1);
  RequestContext gone;
  gone.is_cancelled = [] { return true; };
  RequestContext ok;
  ok.deadline = absl::Now() + absl::Seconds(60);
  ok.is_cancelled = [] { return false; };
  ASSERT_TRUE(x.Submit(
                   past, [&](kernels::Stream) { expired_ran = true; },
                   [&](absl::Status s) { expired.set_value(s); })
                  .ok());
  ASSERT_TRUE(x.Submit(
                   gone, [&](kernels::Stream) { cancelled_ran = true; },
                   [&](absl::Status s) { cancelled.set_value(s); })
                  .ok());
  ASSERT_TRUE(x.Submit(
                   ok, [&](kernels::Stream) { fine.set_value(absl::OkStatus()); },
                   [&](absl::Status s) { fine.set_value(s); })
                  .ok());
  EXPECT_THAT(expired.get_future().get(),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("deadline passed")));
  EXPECT_THAT(cancelled.get_future().get(),
              StatusIs(absl::StatusCode::kCancelled, HasSubstr("cancelled")));
  EXPECT_TRUE(fine.get_future().get().ok());
  x.Shutdown();
  EXPECT_FALSE(expired_ran);
  EXPECT_FALSE(cancelled_ran);
}

TEST(ExecutorTest, RejectQueuedAndShutdown) {
  Executor x({"GPU-x", 1, 8}, nullptr);
  absl::Notification started, release;
  ASSERT_TRUE(x.Submit(
                   {},
                   [&](kernels::Stream) {
                     started.Notify();
                     release.WaitForNotification();
                   },
                   [](absl::Status) {})
                  .ok());
  started.WaitForNotification();
  std::vector<absl::Status> rejected;
  std::mutex mu;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(x.Submit(
                     {}, [](kernels::Stream) { FAIL() << "must not run"; },
                     [&](absl::Status s) {
                       std::lock_guard<std::mutex> l(mu);
                       rejected.push_back(s);
                     })
                    .ok());
  }
  EXPECT_EQ(x.RejectQueued(absl::UnavailableError("going away")), 3);
  ASSERT_EQ(rejected.size(), 3u);
  EXPECT_THAT(rejected[2], StatusIs(absl::StatusCode::kUnavailable, HasSubstr("going away")));
  release.Notify();
  x.Shutdown();
  EXPECT_THAT(x.Submit(
                  {}, [](kernels::Stream) {}, [](absl::Status) {}),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("device GPU-x")));
}

}  // namespace
}  // namespace fp4q::server
