// Step plans (fp4q.v1.StepRequest.keep_plan / plan_id): the items of a trainer's step, parsed
// once and kept per session, so that the steps after it send an id instead of every item.
//
// Contract
// - A plan holds the items as they were sent (names, region slices, groups), never the regions
//   or the weights: a step that names a plan pins and checks them again as if they had been
//   sent, so a plan keeps no memory mapped, no weight alive and no check skipped.
// - Each session keeps at most `per_session` plans; keeping one more drops the one used least
//   recently. A session's plans end with it (SessionEnded).
// - An id another session holds is NOT_FOUND with the message of an id nobody holds.
// Thread-safe.
#ifndef FP4Q_SERVER_STEP_PLANS_H_
#define FP4Q_SERVER_STEP_PLANS_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "server/requests.h"

namespace fp4q::server {

class StepPlans {
 public:
  using Items = std::shared_ptr<const std::vector<StepItemIn>>;

  explicit StepPlans(int per_session) : per_session_(per_session) {}

  // Keeps `items` as a plan of `session` and returns its id (never 0).
  uint64_t Keep(const std::string& session, Items items);
  // The items of `session`'s plan `id`; NOT_FOUND naming plan_id when it holds none.
  absl::StatusOr<Items> Find(const std::string& session, uint64_t id);
  // Drops every plan of `session`.
  void SessionEnded(const std::string& session);
  // Plans held, over all sessions.
  int64_t size() const;

 private:
  struct Plan {
    uint64_t id = 0;
    uint64_t used = 0;  // the clock at its last Keep or Find
    Items items;
  };
  const int per_session_;
  mutable std::mutex mu_;
  uint64_t next_id_ = 1;
  uint64_t clock_ = 0;
  int64_t size_ = 0;
  std::unordered_map<std::string, std::vector<Plan>> sessions_;
};

}  // namespace fp4q::server

#endif  // FP4Q_SERVER_STEP_PLANS_H_
