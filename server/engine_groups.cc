// Replica groups: K data-parallel ranks, one session each, contribute their updates to one
// step; the engine combines them (in rank order, on the device that holds each weight), applies
// one update to the one stored copy and answers every rank (engine_step.cc, ops_step.cc).
//
// - JoinGroup binds the calling session to a rank; the group exists while a member does.
// - A step is collected until every rank sent it, then runs. A contribution that disagrees with
//   the others (names, shapes, dtypes, hyperparameters, kind, step) fails the step for every rank
//   that sent it, naming what differs; a rank missing at the deadline fails it naming the missing
//   ranks; a member whose session ends fails it naming that rank and frees the rank. Nothing is
//   applied in any of these cases.
// - A rank sending its contribution again while the step is collected replaces it (the earlier
//   call is answered ABORTED). A rank retrying a step every weight already applied runs alone:
//   its update is compared with the one it sent (fingerprint), and it is answered applied=false.
#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "fp4q/common/status_macros.h"
#include "server/engine.h"
#include "server/request_checks.h"
#include "server/step_job.h"

namespace fp4q::server {
namespace {

bool SameBits(float a, float b) { return std::memcmp(&a, &b, sizeof(float)) == 0; }

bool SameHyper(const HyperIn& a, const HyperIn& b) {
  return a.optimizer == b.optimizer && a.has_sgd == b.has_sgd && SameBits(a.lr, b.lr) &&
         SameBits(a.momentum, b.momentum) && SameBits(a.dampening, b.dampening) &&
         a.nesterov == b.nesterov && SameBits(a.weight_decay, b.weight_decay) &&
         SameBits(a.beta1, b.beta1) && SameBits(a.beta2, b.beta2) && SameBits(a.eps, b.eps);
}

// Why `b` (rank rb) does not match `a` (rank ra), or OK.
absl::Status Agree(const StepRequest& a, uint32_t ra, const StepRequest& b, uint32_t rb) {
  auto differ = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("replica: rank ", rb, "'s ", what,
                                                   " differs from rank ", ra,
                                                   "'s; nothing was applied"));
  };
  if (a.step != b.step) return differ(absl::StrCat("step (", b.step, " vs ", a.step, ")"));
  if (a.kind != b.kind) return differ("kind");
  if (a.Items().size() != b.Items().size()) {
    return differ(absl::StrCat("number of items (", b.Items().size(), " vs ",
                               a.Items().size(), ")"));
  }
  if (a.groups.size() != b.groups.size()) return differ("number of groups");
  for (size_t g = 0; g < a.groups.size(); ++g) {
    if (!SameHyper(a.groups[g], b.groups[g])) {
      return differ(absl::StrCat("groups[", g, "] hyperparameters"));
    }
  }
  for (size_t i = 0; i < a.Items().size(); ++i) {
    const StepItemIn& x = a.Items()[i];
    const StepItemIn& y = b.Items()[i];
    if (x.name != y.name) {
      return differ(absl::StrCat("items[", i, "].name (", Quote(y.name), " vs ", Quote(x.name),
                                 ")"));
    }
    if (x.group != y.group) return differ(absl::StrCat("items[", i, "].group"));
    if (x.update.shape != y.update.shape) {
      return differ(absl::StrCat("items[", i, "].update.shape (", ShapeString(y.update.shape),
                                 " vs ", ShapeString(x.update.shape), ")"));
    }
  }
  return absl::OkStatus();
}

std::string RankList(const std::vector<uint32_t>& ranks) {
  return absl::StrCat("[", absl::StrJoin(ranks, ", "), "]");
}

}  // namespace

void Engine::FailRanks(std::vector<std::unique_ptr<StepJob::Rank>> ranks, const absl::Status& s) {
  for (auto& r : ranks) {
    if (r != nullptr && r->done) std::exchange(r->done, nullptr)(s);
  }
}

void Engine::JoinGroup(const RequestContext& ctx, JoinGroupRequest req,
                       Done<JoinGroupResult> done) {
  absl::StatusOr<JoinGroupResult> r = [&]() -> absl::StatusOr<JoinGroupResult> {
    if (draining_.load()) return DrainingStatus();
    FP4Q_RETURN_IF_ERROR(CheckName(req.group, "group"));
    if (req.world_size < 1 || req.world_size > static_cast<uint32_t>(options_.max_world_size)) {
      return absl::InvalidArgumentError(absl::StrCat("world_size: ", req.world_size,
                                                     " is not in [1, ", options_.max_world_size,
                                                     "] (fp4qd --max_world_size)"));
    }
    if (req.rank >= req.world_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank: ", req.rank, " is not in [0, ", req.world_size, ")"));
    }
    if (req.deadline_ms > 3600 * 1000) {
      return absl::InvalidArgumentError(
          absl::StrCat("deadline_ms: ", req.deadline_ms, " is over an hour (3600000)"));
    }
    if (ctx.session_id.empty()) {
      return absl::FailedPreconditionError(
          "metadata fp4q-session: JoinGroup binds a session to a rank; open one first");
    }
    FP4Q_ASSIGN_OR_RETURN(const std::string ns, ResolveNamespace(ctx));
    const std::string key = QualifiedName(ns, req.group);
    std::lock_guard<std::mutex> lock(groups_mu_);
    auto it = groups_.find(key);
    if (it == groups_.end()) {
      auto g = std::make_unique<ReplicaGroup>();
      g->name = req.group;
      g->world_size = req.world_size;
      g->members.assign(req.world_size, "");
      g->pending.resize(req.world_size);
      it = groups_.emplace(key, std::move(g)).first;
    }
    ReplicaGroup& g = *it->second;
    if (g.world_size != req.world_size) {
      return absl::InvalidArgumentError(absl::StrCat("world_size: ", req.world_size,
                                                     " but group ", Quote(req.group), " has ",
                                                     g.world_size, " ranks"));
    }
    for (uint32_t r = 0; r < g.world_size; ++r) {
      if (r != req.rank && g.members[r] == ctx.session_id) {
        return absl::InvalidArgumentError(absl::StrCat("rank: this session is already rank ", r,
                                                       " of group ", Quote(req.group)));
      }
    }
    if (!g.members[req.rank].empty() && g.members[req.rank] != ctx.session_id) {
      return absl::AlreadyExistsError(absl::StrCat(
          "rank: ", req.rank, " of group ", Quote(req.group),
          " is held by another session (it is freed when that session ends)"));
    }
    g.members[req.rank] = ctx.session_id;
    if (req.deadline_ms > 0) g.deadline = absl::Milliseconds(req.deadline_ms);
    JoinGroupResult out;
    for (const std::string& m : g.members) out.members += m.empty() ? 0 : 1;
    return out;
  }();
  done(std::move(r));
}

void Engine::LeaveGroup(const RequestContext& ctx, NameRequest req, Done<EmptyResult> done) {
  std::vector<std::unique_ptr<StepJob::Rank>> failed;
  absl::Status s = [&]() -> absl::Status {
    FP4Q_RETURN_IF_ERROR(CheckName(req.name, "group"));
    FP4Q_ASSIGN_OR_RETURN(const std::string ns, ResolveNamespace(ctx));
    std::lock_guard<std::mutex> lock(groups_mu_);
    auto it = groups_.find(QualifiedName(ns, req.name));
    bool member = false;
    if (it != groups_.end()) {
      for (uint32_t r = 0; r < it->second->world_size; ++r) {
        if (it->second->members[r] == ctx.session_id) {
          it->second->members[r].clear();
          member = true;
          if (it->second->collecting) failed = it->second->Take();
        }
      }
    }
    if (!member) {
      return absl::NotFoundError(
          absl::StrCat("group: this session is not a member of group ", Quote(req.name)));
    }
    DropEmptyGroupsLocked();
    return absl::OkStatus();
  }();
  FailRanks(std::move(failed),
            absl::AbortedError(absl::StrCat("replica: a rank left group ", Quote(req.name),
                                            " during the step; nothing was applied")));
  if (!s.ok()) return done(s);
  done(EmptyResult{});
}

void Engine::DropEmptyGroupsLocked() {
  for (auto it = groups_.begin(); it != groups_.end();) {
    bool any = false;
    for (const std::string& m : it->second->members) any = any || !m.empty();
    if (!any && !it->second->collecting) {
      it = groups_.erase(it);
    } else {
      ++it;
    }
  }
}

void Engine::Contribute(const RequestContext& ctx, StepRequest req, Done<StepResult> done) {
  std::vector<std::unique_ptr<StepJob::Rank>> failed;
  absl::Status fail_status;
  std::shared_ptr<StepJob> ready;
  absl::Status refused = [&]() -> absl::Status {
    FP4Q_RETURN_IF_ERROR(CheckName(req.replica_group, "replica.group"));
    FP4Q_ASSIGN_OR_RETURN(const std::string ns, ResolveNamespace(ctx));
    std::lock_guard<std::mutex> lock(groups_mu_);
    auto it = groups_.find(QualifiedName(ns, req.replica_group));
    if (it == groups_.end()) {
      return absl::NotFoundError(absl::StrCat("replica.group: no group ",
                                              Quote(req.replica_group), " (JoinGroup first)"));
    }
    ReplicaGroup& g = *it->second;
    if (req.rank >= g.world_size || g.members[req.rank] != ctx.session_id ||
        ctx.session_id.empty()) {
      return absl::PermissionDeniedError(absl::StrCat("replica.rank: ", req.rank,
                                                      " is not this session's rank in group ",
                                                      Quote(req.replica_group)));
    }
    // A step every weight already applied: this rank retries alone (checked, applied=false).
    if (!g.collecting || g.step != req.step) {
      bool applied = !req.Items().empty();
      for (const StepItemIn& item : req.Items()) {
        std::shared_ptr<StateEntry> e = store_->Find(QualifiedName(ns, item.name));
        applied = applied && e != nullptr && e->has_step.load() && e->last_step.load() == req.step;
      }
      if (applied) {
        auto job = std::make_shared<StepJob>();
        job->world_size = g.world_size;
        StepJob::Rank r;
        r.rank = req.rank;
        r.ctx = ctx;
        r.req = std::make_shared<const StepRequest>(std::move(req));
        r.done = std::move(done);
        job->ranks.push_back(std::move(r));
        ready = std::move(job);
        return absl::OkStatus();
      }
    }
    if (g.collecting && g.step != req.step) {
      fail_status = absl::InvalidArgumentError(absl::StrCat(
          "replica: rank ", req.rank, " sent step ", req.step, " while group ",
          Quote(req.replica_group), " collects step ", g.step,
          " (ranks must step together); nothing was applied"));
      failed = g.Take();
      return fail_status;
    }
    auto mine = std::make_unique<StepJob::Rank>();
    mine->rank = req.rank;
    mine->ctx = ctx;
    mine->req = std::make_shared<const StepRequest>(std::move(req));
    mine->done = std::move(done);
    if (!g.collecting) {
      g.collecting = true;
      g.step = mine->req->step;
      g.collect_until = absl::Now() + g.deadline;
      groups_cv_.notify_all();
    }
    for (const auto& p : g.pending) {
      if (p == nullptr || p->rank == mine->rank) continue;
      absl::Status s = Agree(*p->req, p->rank, *mine->req, mine->rank);
      if (!s.ok()) {
        fail_status = s;
        failed = g.Take();
        failed.push_back(std::move(mine));
        return absl::OkStatus();  // answered with the others
      }
      break;  // the others agree among themselves
    }
    if (g.pending[mine->rank] != nullptr) {  // a retry while collecting: the new call wins
      std::unique_ptr<StepJob::Rank> old = std::move(g.pending[mine->rank]);
      std::vector<std::unique_ptr<StepJob::Rank>> superseded;
      superseded.push_back(std::move(old));
      failed = std::move(superseded);
      fail_status = absl::AbortedError(
          "replica: superseded by a later call of the same rank for the same step");
    }
    g.pending[mine->rank] = std::move(mine);
    if (g.Missing().empty()) {
      auto job = std::make_shared<StepJob>();
      job->world_size = g.world_size;
      for (auto& p : g.Take()) job->ranks.push_back(std::move(*p));
      ready = std::move(job);
    }
    return absl::OkStatus();
  }();
  if (!refused.ok() && failed.empty()) {
    if (done) done(refused);
    return;
  }
  if (!refused.ok()) {
    if (done) done(refused);
    FailRanks(std::move(failed), fail_status);
    return;
  }
  FailRanks(std::move(failed), fail_status);
  if (ready != nullptr) StartStep(std::move(ready));
}

uint32_t Engine::DropGroupsOf(const std::string& ns) {
  std::vector<std::unique_ptr<StepJob::Rank>> failed;
  uint32_t dropped = 0;
  {
    std::lock_guard<std::mutex> lock(groups_mu_);
    for (auto it = groups_.begin(); it != groups_.end();) {
      if (NamespaceOf(it->first) != ns) {
        ++it;
        continue;
      }
      for (auto& p : it->second->Take()) failed.push_back(std::move(p));
      it = groups_.erase(it);
      ++dropped;
    }
  }
  FailRanks(std::move(failed), absl::AbortedError("replica: the group's namespace was deleted; "
                                                  "nothing was applied"));
  return dropped;
}

void Engine::GroupSessionEnded(const std::string& session_id) {
  std::vector<std::pair<std::vector<std::unique_ptr<StepJob::Rank>>, absl::Status>> failed;
  {
    std::lock_guard<std::mutex> lock(groups_mu_);
    for (auto& [key, g] : groups_) {
      for (uint32_t r = 0; r < g->world_size; ++r) {
        if (g->members[r] != session_id) continue;
        g->members[r].clear();
        if (g->collecting) {
          failed.emplace_back(
              g->Take(), absl::UnavailableError(absl::StrCat(
                             "replica: rank ", r, " of group ", Quote(g->name),
                             " lost its session (its process died, closed it, or let its lease "
                             "lapse) during step ", g->step,
                             "; nothing was applied; rank ", r, " can JoinGroup again")));
        }
      }
    }
    DropEmptyGroupsLocked();
  }
  for (auto& [ranks, s] : failed) FailRanks(std::move(ranks), s);
}

void Engine::GroupDeadlineLoop() {
  std::unique_lock<std::mutex> lock(groups_mu_);
  while (!stop_groups_) {
    absl::Time next = absl::InfiniteFuture();
    const absl::Time now = absl::Now();
    std::vector<std::pair<std::vector<std::unique_ptr<StepJob::Rank>>, absl::Status>> failed;
    for (auto& [key, g] : groups_) {
      if (!g->collecting) continue;
      if (g->collect_until <= now) {
        const std::vector<uint32_t> missing = g->Missing();
        const int64_t step = g->step;
        failed.emplace_back(
            g->Take(), absl::DeadlineExceededError(absl::StrCat(
                           "replica: ranks ", RankList(missing), " of group ", Quote(g->name),
                           " did not send step ", step, " within ",
                           absl::ToInt64Milliseconds(g->deadline), " ms; nothing was applied")));
      } else {
        next = std::min(next, g->collect_until);
      }
    }
    if (!failed.empty()) {
      lock.unlock();
      for (auto& [ranks, s] : failed) FailRanks(std::move(ranks), s);
      lock.lock();
      continue;
    }
    if (next == absl::InfiniteFuture()) {
      groups_cv_.wait(lock);
    } else {
      groups_cv_.wait_for(lock, absl::ToChronoNanoseconds(next - absl::Now()));
    }
  }
}

}  // namespace fp4q::server
