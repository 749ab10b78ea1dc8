// How long an idle server thread (a device worker, a fast-socket connection) busy-polls for its
// next piece of work before it sleeps: a fixed time the operator gave (--worker_spin_us,
// --fast_socket_spin_us), or automatic.
//
// Automatic: twice the last gap between two arrivals (tasks submitted to the executor, frames
// read on the connection) when that gap was at most kAutoCap, else none. A caller that comes back
// within 2 ms (steps back to back, a fast inner loop) finds the thread awake, which saves it a
// thread wake-up per request (tens of microseconds on a VM); one that comes back every 10 ms (a
// training loop's step) costs no CPU. The client's automatic busy-poll of replies follows the
// same rule (client/cpp/fast_socket.h, fp4q._fast_socket). Never where fp4qd may use fewer than
// kAutoMinThreads CPUs (UsableCpus: its affinity mask and its cgroup's CPU quota, as a
// Kubernetes CPU limit sets it): on the 2-core development VM the spinning threads took the
// cores the client and fp4qd's own work needed, and a step took 2.5 times as long
// (bench/results/cpu-step-host.md).
#ifndef FP4Q_SERVER_SPIN_POLICY_H_
#define FP4Q_SERVER_SPIN_POLICY_H_

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/time/time.h"

namespace fp4q::server {

// The CPUs this process may run on: the CPUs of its affinity mask, fewer when its cgroup (v2)
// sets a CPU quota (cpu.max, rounded up); at least 1.
int UsableCpus();
// A cgroup v2 cpu.max ("QUOTA PERIOD", QUOTA "max" for none) as whole CPUs, rounded up; 0 when it
// sets no quota or does not parse.
int CpusOfCpuMax(const std::string& cpu_max);

class SpinPolicy {
 public:
  static constexpr absl::Duration kAutoCap = absl::Milliseconds(2);
  static constexpr int kAutoMinThreads = 8;

  // `fixed`: that long every time; nullopt: automatic, where `cpus` CPUs are usable (0: ask
  // UsableCpus).
  explicit SpinPolicy(std::optional<absl::Duration> fixed, int cpus = 0)
      : fixed_(fixed),
        auto_allowed_(!fixed.has_value() && (cpus > 0 ? cpus : UsableCpus()) >= kAutoMinThreads) {}

  bool automatic() const { return !fixed_.has_value(); }
  // Whether the thread ever busy-polls: a fixed spin above zero, or the automatic spin where it
  // is allowed (enough usable CPUs).
  bool may_spin() const {
    return fixed_.has_value() ? *fixed_ > absl::ZeroDuration() : auto_allowed_;
  }

  // Work arrived at `now` (steady clock); the gap since the previous arrival sets the automatic
  // spin. Thread-safe.
  void Arrived(std::chrono::steady_clock::time_point now) {
    if (!automatic()) return;
    const int64_t t = now.time_since_epoch().count();
    const int64_t prev = last_arrival_.exchange(t, std::memory_order_relaxed);
    if (prev != 0) last_gap_.store(t - prev, std::memory_order_relaxed);
  }

  // How long to busy-poll for the next arrival, from now.
  std::chrono::steady_clock::duration Budget() const {
    if (fixed_.has_value()) return absl::ToChronoNanoseconds(*fixed_);
    if (!auto_allowed_) return std::chrono::steady_clock::duration::zero();
    const int64_t gap = last_gap_.load(std::memory_order_relaxed);
    const auto cap = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        absl::ToChronoNanoseconds(kAutoCap));
    if (gap <= 0 || gap > cap.count()) return std::chrono::steady_clock::duration::zero();
    return std::min(cap, std::chrono::steady_clock::duration(2 * gap));
  }

 private:
  const std::optional<absl::Duration> fixed_;
  const bool auto_allowed_;
  std::atomic<int64_t> last_arrival_{0};  // steady clock ticks; 0: none yet
  std::atomic<int64_t> last_gap_{-1};     // ticks between the last two arrivals; -1: none yet
};

}  // namespace fp4q::server

#endif  // FP4Q_SERVER_SPIN_POLICY_H_
