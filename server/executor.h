// Per-device executor: a bounded FIFO queue and worker threads that run requests' work on one
// backend.
//
// - Submit never blocks: when `max_queue_depth` tasks are already waiting it answers
//   RESOURCE_EXHAUSTED and queues nothing (internal tasks may bypass the bound).
// - Before a task starts, its context is checked: cancelled -> reject(CANCELLED), deadline
//   passed -> reject(DEADLINE_EXCEEDED); the work itself does not run then.
// - Workers: `threads` of them; worker i passes `streams[i]` to the work (nullptr, the
//   backend's own stream, when `streams` has no entry i). A CUDA device gets one stream per
//   worker (Engine: --streams_per_gpu), so requests on one GPU overlap; the CPU backend ignores
//   streams and completes before returning.
// - Ordering keys: a task may carry keys (hashes of the state names it touches). Tasks sharing
//   a key never run at the same time and start in submission order; tasks without a common key
//   run in parallel, each in FIFO order among the tasks it could run with. So two UpdateWeight
//   calls of one name queued back to back run one after the other, in order, whichever worker
//   picks them up.
// - Spinning: an idle worker busy-polls for new work before it sleeps on the condition
//   variable, at most one worker of an executor at a time: a task submitted while one spins
//   starts without a thread wake-up (tens of microseconds on a VM), for one CPU core per device
//   kept busy while requests keep coming. How long: `spin` (zero: never), or with `spin` unset
//   twice the last gap between two submissions when it was at most 2 ms (spin_policy.h).
// - Running on the caller's thread: with `run_inline` set and a request context that allows it
//   (RequestContext::run_inline_when_idle), Submit runs the work at once on the calling thread
//   when nothing is queued or running, with `inline_stream` (null on the CPU backend): no worker
//   is woken (after an idle gap the wake-up is tens of microseconds on a VM). It counts as
//   running while it runs (load(), keys), so later tasks queue as usual and run beside it on the
//   workers' own streams. One such run at a time per executor.
// - Shutdown() stops accepting (UNAVAILABLE), runs what is queued, waits for a run on a
//   caller's thread to end, and joins the workers.
#ifndef FP4Q_SERVER_EXECUTOR_H_
#define FP4Q_SERVER_EXECUTOR_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "fp4q/kernels/backend.h"
#include "server/observer.h"
#include "server/requests.h"
#include "server/spin_policy.h"

namespace fp4q::server {

class Executor {
 public:
  struct Options {
    std::string device = "cpu";  // label for metrics and messages
    int threads = 1;             // >= 1
    int max_queue_depth = 64;    // >= 1
    // Stream of worker i (not owned; outlives the executor). Missing entries: nullptr.
    std::vector<kernels::Stream> streams;
    std::optional<absl::Duration> spin = absl::ZeroDuration();  // see "Spinning" above
    // The CPUs fp4qd may use, for the automatic spin (SpinPolicy; 0: UsableCpus()).
    int usable_cpus = 0;
    // Work run on a submitting thread (see "Running on the caller's thread"): allowed at all,
    // and the stream it gets (not owned; outlives the executor; nullptr on the CPU backend).
    bool run_inline = false;
    kernels::Stream inline_stream = nullptr;
  };
  using Work = std::function<void(kernels::Stream)>;
  using Reject = std::function<void(absl::Status)>;
  using Keys = absl::InlinedVector<uint64_t, 2>;

  // The ordering key of a state name.
  static uint64_t KeyOf(absl::string_view name);

  // `observer` may be null; not owned.
  Executor(Options options, EngineObserver* observer);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // Queues `work`. On a non-OK return nothing was queued and neither callback will run.
  // Exactly one of `work` / `reject` runs later, on a worker thread, or before Submit returns,
  // on the calling thread (see "Running on the caller's thread"). `keys`: see above.
  absl::Status Submit(const RequestContext& ctx, Work work, Reject reject,
                      bool bypass_bound = false, Keys keys = {});

  void Shutdown();
  // Answers every queued (not started) task with reject(`status`); returns how many.
  int RejectQueued(const absl::Status& status);

  int64_t queued() const;
  // Tasks queued or running.
  int64_t load() const;
  int capacity() const { return options_.max_queue_depth; }
  // Spins that ended with a task submitted (its worker started it without a wake-up).
  int64_t spin_pickups() const { return spin_pickups_.load(std::memory_order_relaxed); }
  // Tasks run on the submitting thread.
  int64_t inline_runs() const { return inline_runs_.load(std::memory_order_relaxed); }
  // Times a sleeping worker was woken and found nothing it could start.
  int64_t idle_wakeups() const;
  int threads() const { return options_.threads; }
  const std::string& device() const { return options_.device; }

 private:
  struct Task {
    RequestContext ctx;
    Work work;
    Reject reject;
    Keys keys;
  };
  void WorkerLoop(kernels::Stream stream);
  // Runs `task`'s work with `stream` unless its context was cancelled or its deadline passed
  // (then its reject), and destroys its captures.
  static void RunTask(Task& task, kernels::Stream stream);
  // The end of a task that held `keys` (`here`: run on a submitting thread): no longer running,
  // its keys free. Returns whether a thread may wait for this end: a task is queued (a worker
  // may have found it held back by these keys), or a Shutdown is under way.
  bool Finished(const Keys& keys, bool here);
  // Index of the first queued task that may start now, or -1. Requires mu_.
  int NextRunnable() const;

  const Options options_;
  EngineObserver* const observer_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  std::vector<uint64_t> running_keys_;  // keys of running tasks (a multiset; few entries)
  int running_ = 0;
  bool stopping_ = false;
  std::atomic<uint64_t> submitted_{0};  // tasks ever queued: what a spinning worker watches
  std::atomic<bool> spinning_{false};   // one worker spins at a time
  SpinPolicy spin_;                     // how long it spins
  std::atomic<int64_t> spin_pickups_{0};
  bool inline_running_ = false;  // a task runs on a submitting thread (mu_)
  std::atomic<int64_t> inline_runs_{0};
  int64_t idle_wakeups_ = 0;  // (mu_)
  std::vector<std::thread> workers_;
};

}  // namespace fp4q::server

#endif  // FP4Q_SERVER_EXECUTOR_H_
