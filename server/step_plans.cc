#include "server/step_plans.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace fp4q::server {

uint64_t StepPlans::Keep(const std::string& session, Items items) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Plan>& plans = sessions_[session];
  if (plans.size() >= static_cast<size_t>(per_session_)) {
    auto oldest = std::min_element(plans.begin(), plans.end(),
                                   [](const Plan& a, const Plan& b) { return a.used < b.used; });
    plans.erase(oldest);
    --size_;
  }
  Plan p;
  p.id = next_id_++;
  p.used = ++clock_;
  p.items = std::move(items);
  plans.push_back(std::move(p));
  ++size_;
  return plans.back().id;
}

absl::StatusOr<StepPlans::Items> StepPlans::Find(const std::string& session, uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sessions_.find(session);
  if (it != sessions_.end()) {
    for (Plan& p : it->second) {
      if (p.id != id) continue;
      p.used = ++clock_;
      return p.items;
    }
  }
  return absl::NotFoundError(absl::StrCat(
      "plan_id: this session holds no step plan ", id, " (never kept, or dropped: a session "
      "keeps its ", per_session_, " last used, fp4qd --max_step_plans); send the items again "
      "with keep_plan; nothing was applied"));
}

void StepPlans::SessionEnded(const std::string& session) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sessions_.find(session);
  if (it == sessions_.end()) return;
  size_ -= static_cast<int64_t>(it->second.size());
  sessions_.erase(it);
}

int64_t StepPlans::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return size_;
}

}  // namespace fp4q::server
