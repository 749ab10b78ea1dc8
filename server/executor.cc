#include "server/executor.h"

#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace fp4q::server {

uint64_t Executor::KeyOf(absl::string_view name) {
  // 0 is as good a key as any other; keys only need to agree within one process.
  return static_cast<uint64_t>(absl::Hash<absl::string_view>{}(name));
}

Executor::Executor(Options options, EngineObserver* observer)
    : options_([&] {
        options.threads = std::max(1, options.threads);
        options.max_queue_depth = std::max(1, options.max_queue_depth);
        return options;
      }()),
      observer_(observer),
      spin_(options_.spin, options_.usable_cpus) {
  if (observer_ != nullptr) {
    observer_->QueueCapacity(options_.device, options_.max_queue_depth);
    observer_->QueueDepth(options_.device, 0);
  }
  workers_.reserve(options_.threads);
  for (int i = 0; i < options_.threads; ++i) {
    const kernels::Stream stream =
        i < static_cast<int>(options_.streams.size()) ? options_.streams[i] : nullptr;
    workers_.emplace_back([this, stream] { WorkerLoop(stream); });
  }
}

Executor::~Executor() { Shutdown(); }

absl::Status Executor::Submit(const RequestContext& ctx, Work work, Reject reject,
                              bool bypass_bound, Keys keys) {
  int64_t depth = 0;
  bool here = false;  // run on this thread
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) {
      return absl::UnavailableError(
          absl::StrCat("device ", options_.device, ": executor is shutting down"));
    }
    if (!bypass_bound && queue_.size() >= static_cast<size_t>(options_.max_queue_depth)) {
      if (observer_ != nullptr) observer_->QueueRejected(options_.device);
      return absl::ResourceExhaustedError(absl::StrCat("device ", options_.device,
                                                       ": work queue is full (",
                                                       options_.max_queue_depth, " queued)"));
    }
    spin_.Arrived(std::chrono::steady_clock::now());
    if (options_.run_inline && ctx.run_inline_when_idle && queue_.empty() && running_ == 0 &&
        !inline_running_) {
      // Idle: nothing could be ordered before this task, so it runs here at once.
      here = inline_running_ = true;
      ++running_;
      running_keys_.insert(running_keys_.end(), keys.begin(), keys.end());
      inline_runs_.fetch_add(1, std::memory_order_relaxed);
    } else {
      queue_.push_back(Task{ctx, std::move(work), std::move(reject), std::move(keys)});
      depth = static_cast<int64_t>(queue_.size());
    }
  }
  if (here) {
    Task task{ctx, std::move(work), std::move(reject), std::move(keys)};
    RunTask(task, options_.inline_stream);
    // Wakes the workers only for tasks queued meanwhile (some held back by this run's keys) or
    // a Shutdown waiting for this run: a wake-up with nothing to do costs the woken worker a
    // trip through the scheduler, and this thread a system call, at every step.
    if (Finished(task.keys, /*here=*/true)) cv_.notify_all();
    return absl::OkStatus();
  }
  submitted_.fetch_add(1, std::memory_order_release);
  if (observer_ != nullptr) observer_->QueueDepth(options_.device, depth);
  cv_.notify_one();
  return absl::OkStatus();
}

void Executor::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ && workers_.empty()) return;
    stopping_ = true;
  }
  submitted_.fetch_add(1, std::memory_order_release);  // ends a worker's spin at once
  cv_.notify_all();
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !inline_running_; });
  }
  for (auto& t : workers_) {
    if (t.joinable()) t.join();
  }
  workers_.clear();
}

int Executor::RejectQueued(const absl::Status& status) {
  std::deque<Task> dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    dropped.swap(queue_);
  }
  if (observer_ != nullptr) observer_->QueueDepth(options_.device, 0);
  for (Task& t : dropped) t.reject(status);
  return static_cast<int>(dropped.size());
}

int64_t Executor::queued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(queue_.size());
}

int64_t Executor::idle_wakeups() const {
  std::lock_guard<std::mutex> lock(mu_);
  return idle_wakeups_;
}

int64_t Executor::load() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(queue_.size()) + running_;
}

int Executor::NextRunnable() const {
  // A task may start when none of its keys is held by a running task or by an earlier task
  // still waiting (that keeps same-key tasks in submission order).
  Keys blocked;
  for (size_t i = 0; i < queue_.size(); ++i) {
    const Task& t = queue_[i];
    bool ok = true;
    for (uint64_t k : t.keys) {
      if (std::find(running_keys_.begin(), running_keys_.end(), k) != running_keys_.end() ||
          std::find(blocked.begin(), blocked.end(), k) != blocked.end()) {
        ok = false;
        break;
      }
    }
    if (ok) return static_cast<int>(i);
    blocked.insert(blocked.end(), t.keys.begin(), t.keys.end());
  }
  return -1;
}

void Executor::WorkerLoop(kernels::Stream stream) {
  for (;;) {
    Task task;
    int64_t depth = 0;
    {
      std::unique_lock<std::mutex> lock(mu_);
      int next = -1;
      const auto spin = spin_.Budget();
      if (spin > spin.zero() && !stopping_ && NextRunnable() < 0 && !spinning_.exchange(true)) {
        // Busy-poll (without the lock) until a task is submitted or the spin time is over.
        const uint64_t seen = submitted_.load(std::memory_order_acquire);
        lock.unlock();
        const auto until = std::chrono::steady_clock::now() + spin;
        while (submitted_.load(std::memory_order_acquire) == seen &&
               std::chrono::steady_clock::now() < until) {
#if defined(__x86_64__)
          __builtin_ia32_pause();
#endif
        }
        if (submitted_.load(std::memory_order_acquire) != seen) {
          spin_pickups_.fetch_add(1, std::memory_order_relaxed);
          if (observer_ != nullptr) observer_->SpinPickup(options_.device);
        }
        spinning_.store(false);
        lock.lock();
      }
      bool woken = false;  // the predicate's first call is before any wait
      cv_.wait(lock, [&] {
        next = NextRunnable();
        const bool go = next >= 0 || (stopping_ && queue_.empty());
        if (woken && !go) ++idle_wakeups_;
        woken = true;
        return go;
      });
      if (next < 0) return;  // stopping and drained
      task = std::move(queue_[next]);
      queue_.erase(queue_.begin() + next);
      depth = static_cast<int64_t>(queue_.size());
      running_keys_.insert(running_keys_.end(), task.keys.begin(), task.keys.end());
      ++running_;
    }
    if (observer_ != nullptr) observer_->QueueDepth(options_.device, depth);
    RunTask(task, stream);
    // A task held back by these keys may start now, on any worker.
    if (Finished(task.keys, /*here=*/false) && !task.keys.empty()) cv_.notify_all();
  }
}

void Executor::RunTask(Task& task, kernels::Stream stream) {
  if (task.ctx.is_cancelled && task.ctx.is_cancelled()) {
    task.reject(absl::CancelledError("the request was cancelled before its work started"));
  } else if (absl::Now() >= task.ctx.deadline) {
    task.reject(
        absl::DeadlineExceededError("the request's deadline passed before its work started"));
  } else {
    task.work(stream);
  }
  // Destroy the task's captures (replies, pins) before the next one starts; the keys stay.
  task.ctx = RequestContext{};
  task.work = nullptr;
  task.reject = nullptr;
}

bool Executor::Finished(const Keys& keys, bool here) {
  std::lock_guard<std::mutex> lock(mu_);
  if (here) inline_running_ = false;
  --running_;
  for (uint64_t k : keys) {
    running_keys_.erase(std::find(running_keys_.begin(), running_keys_.end(), k));
  }
  return !queue_.empty() || stopping_;
}

}  // namespace fp4q::server
