#include "server/executor.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace fp4q::server {

Executor::Executor(Options options, EngineObserver* observer)
    : options_([&] {
        options.threads = std::max(1, options.threads);
        options.max_queue_depth = std::max(1, options.max_queue_depth);
        return options;
      }()),
      observer_(observer) {
  if (observer_ != nullptr) {
    observer_->QueueCapacity(options_.device, options_.max_queue_depth);
    observer_->QueueDepth(options_.device, 0);
  }
  workers_.reserve(options_.threads);
  for (int i = 0; i < options_.threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

Executor::~Executor() { Shutdown(); }

absl::Status Executor::Submit(const RequestContext& ctx, Work work, Reject reject,
                              bool bypass_bound) {
  int64_t depth = 0;
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
    queue_.push_back(Task{ctx, std::move(work), std::move(reject)});
    depth = static_cast<int64_t>(queue_.size());
  }
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
  cv_.notify_all();
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

void Executor::WorkerLoop() {
  for (;;) {
    Task task;
    int64_t depth = 0;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and drained
      task = std::move(queue_.front());
      queue_.pop_front();
      depth = static_cast<int64_t>(queue_.size());
    }
    if (observer_ != nullptr) observer_->QueueDepth(options_.device, depth);
    if (task.ctx.is_cancelled && task.ctx.is_cancelled()) {
      task.reject(absl::CancelledError("the request was cancelled before its work started"));
      continue;
    }
    if (absl::Now() >= task.ctx.deadline) {
      task.reject(
          absl::DeadlineExceededError("the request's deadline passed before its work started"));
      continue;
    }
    task.work(/*stream=*/nullptr);
  }
}

}  // namespace fp4q::server
