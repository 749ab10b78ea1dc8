// One trainer's step as the engine runs it: the contributions of its ranks (one for a single
// worker, K for a replica group, in rank order), the weights its items name, the regions pinned
// for it, and each rank's result. Built by Engine::Step (engine_step.cc), run by
// Engine::RunStepPart (ops_step.cc) on the executor of each device that holds its weights.
#ifndef FP4Q_SERVER_STEP_JOB_H_
#define FP4Q_SERVER_STEP_JOB_H_

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "server/op_env.h"
#include "server/requests.h"
#include "server/state_store.h"

namespace fp4q::server {

struct StepJob {
  struct Rank {
    uint32_t rank = 0;  // the rank number (0 for a single worker)
    RequestContext ctx;
    std::shared_ptr<const StepRequest> req;  // every rank's items name the same weights
    Done<StepResult> done;
  };
  std::string ns;
  int64_t step = 0;
  bool update_weight = false;  // an UpdateWeight call (field names without "items[i].")
  std::vector<Rank> ranks;     // rank order
  std::vector<std::shared_ptr<StateEntry>> entries;  // per item, request order
  std::vector<StepResult> results;                   // per rank
  RequestScope scope;                                // every rank's regions
  // Each rank's done signal (StepRequest.done_signal), written after the step's device work.
  struct Signal {
    uint8_t* at = nullptr;  // in a pinned region of `scope`
    uint32_t value = 0;
  };
  std::vector<Signal> signals;
  // The device writes every done signal behind the step's kernels (queued by
  // Engine::RunStepOnDeviceSignals): the host writes none after them.
  bool done_queued = false;
  // Each rank's ready signal (StepRequest.ready_signal), polled before the step reads an update.
  struct Ready {
    const uint8_t* at = nullptr;  // in a pinned region of `scope`
    uint32_t value = 0;
    absl::Duration timeout;
    std::string field;  // "ready_signal" or "rank R's ready_signal"
  };
  std::vector<Ready> ready;
  // Ranks in the group (1 for a single worker). `ranks` holds all of them for a step, or one
  // when a rank retries an applied step alone.
  uint32_t world_size = 1;

  std::string Name(size_t i) const { return ranks[0].req->Items()[i].name; }
  uint32_t RankOf(int32_t update_index) const {
    return update_index >= 0 && static_cast<size_t>(update_index) < ranks.size()
               ? ranks[static_cast<size_t>(update_index)].rank
               : 0;
  }
  // What a retry's updates must hash to: the weight's stored fingerprints of the ranks
  // sending, or empty when the weight applied this step with another world size.
  std::vector<uint64_t> ExpectedFingerprints(const StateEntry& e) const {
    if (e.last_fingerprints.size() != world_size) return {};
    std::vector<uint64_t> out;
    for (const Rank& r : ranks) {
      if (r.rank >= e.last_fingerprints.size()) return {};
      out.push_back(e.last_fingerprints[r.rank]);
    }
    return out;
  }
};

// How long a group waits for its ranks' contributions of a step unless JoinGroup says.
inline constexpr uint32_t kDefaultGroupDeadlineMs = 30000;

// A replica group (engine_groups.cc) and the step it is collecting; guarded by the engine's
// groups mutex.
struct ReplicaGroup {
  std::string name;  // as the caller spells it
  uint32_t world_size = 0;
  absl::Duration deadline = absl::Milliseconds(kDefaultGroupDeadlineMs);  // JoinGroup's
  std::vector<std::string> members;  // session id per rank ("": free)
  bool collecting = false;
  int64_t step = 0;
  absl::Time collect_until;
  std::vector<std::unique_ptr<StepJob::Rank>> pending;  // per rank

  std::vector<uint32_t> Missing() const {
    std::vector<uint32_t> out;
    for (uint32_t r = 0; r < world_size; ++r) {
      if (pending[r] == nullptr) out.push_back(r);
    }
    return out;
  }
  // Hands the pending contributions out (answered by the caller, outside the lock).
  std::vector<std::unique_ptr<StepJob::Rank>> Take() {
    std::vector<std::unique_ptr<StepJob::Rank>> out;
    for (auto& p : pending) {
      if (p != nullptr) out.push_back(std::move(p));
    }
    pending.clear();
    pending.resize(world_size);
    collecting = false;
    return out;
  }
};

// A parameter group's hyperparameters in range (INVALID_ARGUMENT naming `field`.<name>).
absl::Status CheckStepHyper(const HyperIn& h, const std::string& field);

// The parts of a step on several devices meet here after their checks: all apply or none do.
class StepBarrier {
 public:
  explicit StepBarrier(int parts) : waiting_(parts) {}
  // Reports this part's check and waits for every part's: OK when all passed, else the first
  // refusal (in arrival order).
  absl::Status Checked(const absl::Status& mine) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!mine.ok() && first_.ok()) first_ = mine;
    if (--waiting_ == 0) cv_.notify_all();
    cv_.wait(lock, [&] { return waiting_ == 0; });
    return first_;
  }
  // A part that will never check (refused before it ran, or failed before its check): counts
  // down without waiting.
  void Failed(const absl::Status& why) {
    std::lock_guard<std::mutex> lock(mu_);
    if (first_.ok()) first_ = why.ok() ? absl::AbortedError("step: a part did not run") : why;
    if (--waiting_ == 0) cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int waiting_;
  absl::Status first_;
};

// One part's side of the barrier: remembers whether it arrived, so a part that fails earlier
// still counts down (StepBarrier::Failed) and its peers never wait for it.
struct StepPartSync {
  StepBarrier* barrier = nullptr;
  bool arrived = false;
  absl::Status Checked(const absl::Status& mine) {
    arrived = true;
    return barrier->Checked(mine);
  }
};

}  // namespace fp4q::server

#endif  // FP4Q_SERVER_STEP_JOB_H_
