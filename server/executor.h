// Per-device executor: a bounded FIFO queue and worker threads that run requests' work on one
// backend.
//
// - Submit never blocks: when `max_queue_depth` tasks are already waiting it answers
//   RESOURCE_EXHAUSTED and queues nothing (internal tasks may bypass the bound).
// - Before a task starts, its context is checked: cancelled -> reject(CANCELLED), deadline
//   passed -> reject(DEADLINE_EXCEEDED); the work itself does not run then.
// - Workers pass their stream to the work. The Backend API has no stream creation, so every
//   worker uses the backend's own stream (nullptr): CUDA executors run one worker per device
//   (work on a device is serialized; a request's kernels then its synchronize), CPU executors
//   run `threads` workers (the CPU backend completes before returning).
// - Shutdown() stops accepting (UNAVAILABLE), runs what is queued, and joins the workers.
#ifndef FP4Q_SERVER_EXECUTOR_H_
#define FP4Q_SERVER_EXECUTOR_H_

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "fp4q/kernels/backend.h"
#include "server/observer.h"
#include "server/requests.h"

namespace fp4q::server {

class Executor {
 public:
  struct Options {
    std::string device = "cpu";  // label for metrics and messages
    int threads = 1;             // >= 1
    int max_queue_depth = 64;    // >= 1
  };
  using Work = std::function<void(kernels::Stream)>;
  using Reject = std::function<void(absl::Status)>;

  // `observer` may be null; not owned.
  Executor(Options options, EngineObserver* observer);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // Queues `work`. On a non-OK return nothing was queued and neither callback will run.
  // Exactly one of `work` / `reject` runs later, on a worker thread.
  absl::Status Submit(const RequestContext& ctx, Work work, Reject reject,
                      bool bypass_bound = false);

  void Shutdown();
  // Answers every queued (not started) task with reject(`status`); returns how many.
  int RejectQueued(const absl::Status& status);

  int64_t queued() const;
  int capacity() const { return options_.max_queue_depth; }
  const std::string& device() const { return options_.device; }

 private:
  struct Task {
    RequestContext ctx;
    Work work;
    Reject reject;
  };
  void WorkerLoop();

  const Options options_;
  EngineObserver* const observer_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace fp4q::server

#endif  // FP4Q_SERVER_EXECUTOR_H_
