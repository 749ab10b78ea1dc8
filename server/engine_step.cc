// Engine::Step: routing of a trainer's step (one worker's, or a replica group's combined
// contributions) to the devices that hold its weights, and its completion. The body is
// ops_step.cc; replica groups are engine_groups.cc.
#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "fp4q/common/status_macros.h"
#include "server/engine.h"
#include "server/op_env.h"
#include "server/request_checks.h"
#include "server/step_job.h"

namespace fp4q::server {
namespace {

// The checks of a step request that need no state: sizes, names, groups, hyperparameters.
absl::Status CheckStepShape(const StepRequest& req, int max_items) {
  if (req.step < 0) {
    return absl::InvalidArgumentError(absl::StrCat("step: ", req.step, " must be >= 0"));
  }
  const std::vector<StepItemIn>& items = req.Items();
  if (items.empty()) return absl::InvalidArgumentError("items: empty (a step updates >= 1)");
  if (items.size() > static_cast<size_t>(max_items)) {
    return absl::InvalidArgumentError(absl::StrCat("items: ", items.size(), " items, at most ",
                                                   max_items,
                                                   " (fp4qd --max_step_items); split the step"));
  }
  if (req.groups.empty()) {
    return absl::InvalidArgumentError("groups: empty (send the hyperparameters of >= 1 group)");
  }
  if (req.groups.size() > items.size()) {
    return absl::InvalidArgumentError(absl::StrCat("groups: ", req.groups.size(),
                                                   " groups for ", items.size(), " items"));
  }
  for (size_t g = 0; g < req.groups.size(); ++g) {
    FP4Q_RETURN_IF_ERROR(CheckStepHyper(req.groups[g], absl::StrCat("groups[", g, "]")));
  }
  // A plan's items passed the name checks below in the step that kept them; only the groups
  // they name are new.
  const bool planned = req.planned_items != nullptr;
  // The first item whose name repeats an earlier one (a sorted list: no allocation per name).
  size_t twice = items.size();
  if (!planned) {
    std::vector<std::pair<absl::string_view, size_t>> names;
    names.reserve(items.size());
    for (size_t i = 0; i < items.size(); ++i) names.emplace_back(items[i].name, i);
    std::sort(names.begin(), names.end());
    for (size_t k = 1; k < names.size(); ++k) {
      if (names[k].first == names[k - 1].first) twice = std::min(twice, names[k].second);
    }
  }
  const FieldPath items_field("items");
  for (size_t i = 0; i < items.size(); ++i) {
    const StepItemIn& it = items[i];
    if (!planned) {
      const FieldPath item = items_field.Index(i);
      FP4Q_RETURN_IF_ERROR(CheckName(it.name, item.Member("name")));
    }
    if (i == twice) {
      return absl::InvalidArgumentError(absl::StrCat(
          "items[", i, "].name: ", Quote(it.name), " appears twice in one step"));
    }
    if (it.group >= req.groups.size()) {
      return absl::InvalidArgumentError(absl::StrCat("items[", i, "].group: ", it.group,
                                                     " but the step has ", req.groups.size(),
                                                     " groups"));
    }
  }
  return absl::OkStatus();
}

// A brief reply lists no item, so no item may ask for its DQ(W) inline.
absl::Status CheckBriefReply(const StepRequest& req, absl::string_view rank) {
  if (!req.brief_reply) return absl::OkStatus();
  for (size_t i = 0; i < req.Items().size(); ++i) {
    if (!req.Items()[i].return_dequantized) continue;
    return absl::InvalidArgumentError(absl::StrCat(
        rank, "items[", i, "].return_dequantized: true, but brief_reply leaves the items out of "
        "the reply (give dequantized_out a region, or send brief_reply false)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Engine::UseStepPlan(const RequestContext& ctx, StepRequest& req,
                                 Done<StepResult>& done) {
  if (req.plan_id != 0) {
    if (req.keep_plan) {
      return absl::InvalidArgumentError(absl::StrCat(
          "keep_plan: true with plan_id ", req.plan_id,
          "; a plan is kept of items a step sends, and this step sends none"));
    }
    if (!req.items.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "items: ", req.items.size(), " items with plan_id ", req.plan_id,
          "; send the items or a plan, not both"));
    }
    if (!req.brief_reply) {
      return absl::InvalidArgumentError(absl::StrCat(
          "brief_reply: false with plan_id ", req.plan_id,
          "; a planned step's reply lists no items (send brief_reply true)"));
    }
    absl::StatusOr<StepPlans::Items> items = plans_->Find(ctx.session_id, req.plan_id);
    if (!items.ok()) return items.status();
    req.planned_items = *std::move(items);  // shared with the plan, not copied
    return absl::OkStatus();
  }
  if (!req.keep_plan) return absl::OkStatus();
  if (options_.max_step_plans == 0) {
    return absl::FailedPreconditionError(
        "keep_plan: this server keeps no step plans (fp4qd --max_step_plans 0)");
  }
  if (ctx.session_id.empty()) {
    return absl::FailedPreconditionError(
        "keep_plan: a step plan belongs to a session; send the step in one (gRPC metadata "
        "fp4q-session, or the fast socket's hello)");
  }
  for (size_t i = 0; i < req.items.size(); ++i) {
    const StepItemIn& it = req.items[i];
    if (it.update.data.source != Source::kRegion) {
      return absl::InvalidArgumentError(absl::StrCat(
          "items[", i, "].update: inline data; a step plan keeps region slices only (an inline "
          "update's bytes change every step)"));
    }
    if (it.return_dequantized && !it.dequantized_out.has_region) {
      return absl::InvalidArgumentError(absl::StrCat(
          "items[", i, "].return_dequantized: true; a planned step's reply lists no items, so "
          "a plan's DQ(W) goes to a region (dequantized_out) or nowhere"));
    }
  }
  auto kept = std::make_shared<const std::vector<StepItemIn>>(req.items);
  done = [this, session = ctx.session_id, kept,
          inner = std::move(done)](absl::StatusOr<StepResult> r) {
    if (r.ok()) r->plan_id = plans_->Keep(session, kept);
    inner(std::move(r));
  };
  return absl::OkStatus();
}

void Engine::Step(const RequestContext& ctx, StepRequest req, Done<StepResult> done) {
  if (absl::Status s = UseStepPlan(ctx, req, done); !s.ok()) return done(s);
  if (req.has_replica) return Contribute(ctx, std::move(req), std::move(done));
  auto job = std::make_shared<StepJob>();
  StepJob::Rank r;
  r.rank = 0;
  r.ctx = ctx;
  r.req = std::make_shared<const StepRequest>(std::move(req));
  r.done = std::move(done);
  job->ranks.push_back(std::move(r));
  job->world_size = 1;
  StartStep(std::move(job));
}

absl::Status Engine::PinSignals(StepJob& job, size_t devices) {
  for (StepJob::Rank& r : job.ranks) {
    const std::string prefix =
        job.ranks.size() > 1 ? absl::StrCat("rank ", r.rank, "'s ") : std::string();
    // The 4 bytes of `slice` in a region of the rank's session on the step's one device.
    auto pin_slice = [&](const RegionSlice& slice, absl::string_view name,
                         absl::string_view when) -> absl::StatusOr<uint8_t*> {
      if (devices != 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            prefix, name, ": the step's weights are on ", devices, " devices; a ", when,
            " (send one step per device, or no ", name, ")"));
      }
      const std::string field = absl::StrCat(prefix, name, ".region");
      auto pin = job.scope.pins.find(slice.region_id);
      if (pin == job.scope.pins.end()) {
        absl::StatusOr<RegionPin> p = regions_->Acquire(r.ctx.session_id, slice.region_id, field);
        if (!p.ok()) return p.status();
        pin = job.scope.pins.emplace(slice.region_id, std::move(*p)).first;
      }
      Device* d = job.entries[0]->device;
      if (pin->second.device() != d) {
        return absl::InvalidArgumentError(absl::StrCat(
            field, ": on device ", pin->second.device()->label,
            ", but the step's weights are on device ", d->label));
      }
      return pin->second.Slice(slice.offset, sizeof(uint32_t), field);
    };
    if (r.req->has_done_signal) {
      absl::StatusOr<uint8_t*> at =
          pin_slice(r.req->done_signal, "done_signal", "done signal is written after one "
                    "device's work");
      if (!at.ok()) return at.status();
      job.signals.push_back(StepJob::Signal{*at, r.req->done_value});
    }
    if (r.req->has_ready_signal) {
      const absl::Duration most = options_.step_ready_timeout;
      const uint32_t ms = r.req->ready_timeout_ms;
      if (absl::Milliseconds(ms) > most) {
        return absl::InvalidArgumentError(absl::StrCat(
            prefix, "ready_signal.timeout_ms: ", ms, " is over this server's most, ",
            absl::ToInt64Milliseconds(most), " (--step_ready_timeout_ms)"));
      }
      absl::StatusOr<uint8_t*> at =
          pin_slice(r.req->ready_signal, "ready_signal", "ready signal is polled on one device");
      if (!at.ok()) return at.status();
      job.ready.push_back(StepJob::Ready{*at, r.req->ready_value,
                                         ms == 0 ? most : absl::Milliseconds(ms),
                                         absl::StrCat(prefix, "ready_signal")});
    }
  }
  return absl::OkStatus();
}

void Engine::WriteDoneSignals(OpEnv& env, StepJob& job) {
  if (job.signals.empty() || job.done_queued) return;
  // After the step's report was read: the weights, residuals and every DQ(W) are written.
  absl::Status s;
  for (const StepJob::Signal& sig : job.signals) {
    if (s.ok()) s = env.backend().CopyFromHost(sig.at, &sig.value, sizeof(uint32_t), env.stream());
  }
  if (s.ok()) s = env.backend().Synchronize(env.stream());  // before `job` (the values) can go
  if (!s.ok() && logger_ != nullptr) {
    // The worker's client releases its stream itself when it reads the reply.
    logger_->Warning("step done signal not written",
                     {{"step", absl::StrCat(job.step)}, {"error", s.ToString()}});
  }
}

void Engine::StartStep(std::shared_ptr<StepJob> job) {
  // Every rank is answered exactly once, with its own result or the step's one error.
  auto answer_all = [job](const absl::Status& s) {
    for (StepJob::Rank& r : job->ranks) {
      if (r.done) std::exchange(r.done, nullptr)(s);
    }
  };
  if (!Admit()) return answer_all(DrainingStatus());
  auto refuse = [this, answer_all](const absl::Status& s) {
    answer_all(s);
    Release();
  };
  const StepRequest& first = *job->ranks[0].req;
  job->step = first.step;
  {
    absl::StatusOr<std::string> ns = ResolveNamespace(job->ranks[0].ctx);
    if (!ns.ok()) return refuse(ns.status());
    job->ns = *ns;
  }
  for (size_t r = 1; r < job->ranks.size(); ++r) {
    absl::StatusOr<std::string> ns = ResolveNamespace(job->ranks[r].ctx);
    if (!ns.ok()) return refuse(ns.status());
    if (*ns != job->ns) {
      return refuse(absl::PermissionDeniedError(absl::StrCat(
          "replica: rank ", job->ranks[r].rank, " is in another namespace than rank ",
          job->ranks[0].rank)));
    }
  }
  if (absl::Status s = CheckStepShape(first, options_.max_step_items); !s.ok()) return refuse(s);
  for (const StepJob::Rank& r : job->ranks) {
    const std::string rank =
        job->ranks.size() > 1 ? absl::StrCat("rank ", r.rank, "'s ") : std::string();
    if (absl::Status s = CheckBriefReply(*r.req, rank); !s.ok()) return refuse(s);
  }
  // The weights.
  job->entries.resize(first.Items().size());
  for (size_t i = 0; i < first.Items().size(); ++i) {
    const absl::string_view name = first.Items()[i].name;
    std::shared_ptr<StateEntry> e =
        job->ns.empty() ? store_->Find(name) : store_->Find(QualifiedName(job->ns, name));
    if (e == nullptr || !e->live.load()) {
      return refuse(absl::NotFoundError(absl::StrCat(
          job->update_weight ? "name" : absl::StrCat("items[", i, "].name"), ": no weight ",
          Quote(first.Items()[i].name))));
    }
    if (e->kind != EntryKind::kWeight) {
      return refuse(absl::InvalidArgumentError(absl::StrCat(
          job->update_weight ? "name" : absl::StrCat("items[", i, "].name"), ": ",
          Quote(first.Items()[i].name), " is a residual key, not a weight")));
    }
    job->entries[i] = std::move(e);
  }
  // Every rank's regions, pinned under its own session, on the device of the weight they feed.
  for (StepJob::Rank& r : job->ranks) {
    const std::string prefix =
        job->ranks.size() > 1 ? absl::StrCat("rank ", r.rank, "'s ") : std::string();
    for (size_t i = 0; i < r.req->Items().size(); ++i) {
      const StepItemIn& it = r.req->Items()[i];
      Device* d = job->entries[i]->device;
      // The field is spelled out only when a region is first pinned or refused.
      auto field = [&](absl::string_view part) {
        return job->update_weight ? std::string(part) : absl::StrCat("items[", i, "].", part);
      };
      auto use = [&](const std::string& id, absl::string_view part) -> absl::Status {
        auto pin = job->scope.pins.find(id);
        if (pin == job->scope.pins.end()) {
          absl::StatusOr<RegionPin> p = regions_->Acquire(r.ctx.session_id, id, field(part));
          if (!p.ok()) return p.status();
          pin = job->scope.pins.emplace(id, std::move(*p)).first;
        }
        if (pin->second.device() == d) return absl::OkStatus();
        return absl::InvalidArgumentError(absl::StrCat(
            prefix, field(part), ": on device ", pin->second.device()->label, ", but weight ",
            Quote(it.name), " is on device ", d->label,
            " (a step reads and writes client memory on the weight's device)"));
      };
      if (it.update.data.source == Source::kRegion) {
        if (absl::Status s = use(it.update.data.region.region_id, "update.region"); !s.ok()) {
          return refuse(s);
        }
      }
      if (it.dequantized_out.has_region) {
        if (absl::Status s = use(it.dequantized_out.region.region_id, "dequantized_out.region");
            !s.ok()) {
          return refuse(s);
        }
      }
    }
  }
  // One part per device, each run on that device's executor.
  std::map<int, std::vector<size_t>> by_device;
  for (size_t i = 0; i < job->entries.size(); ++i) {
    by_device[job->entries[i]->device->index].push_back(i);
  }
  if (absl::Status s = PinSignals(*job, by_device.size()); !s.ok()) return refuse(s);
  job->results.resize(job->ranks.size());
  for (size_t r = 0; r < job->ranks.size(); ++r) {
    job->results[r].items.resize(first.Items().size());
    job->results[r].world_size = job->world_size;
    job->results[r].brief = job->ranks[r].req->brief_reply;
  }
  const int parts = static_cast<int>(by_device.size());
  auto barrier = parts > 1 ? std::make_shared<StepBarrier>(parts) : nullptr;
  struct Completion {
    std::mutex mu;
    int left = 0;
    absl::Status error;
    ReplyMeta meta;
  };
  auto completion = std::make_shared<Completion>();
  completion->left = parts;
  auto part_done = [this, job, completion, answer_all](const absl::Status& s,
                                                        const ReplyMeta& meta) {
    bool last = false;
    {
      std::lock_guard<std::mutex> lock(completion->mu);
      if (!s.ok() && completion->error.ok()) completion->error = s;
      if (completion->meta.device_uuid.empty()) completion->meta.device_uuid = meta.device_uuid;
      completion->meta.kernel_micros += meta.kernel_micros;
      completion->meta.queue_micros = std::max(completion->meta.queue_micros, meta.queue_micros);
      completion->meta.ready_waited = completion->meta.ready_waited || meta.ready_waited;
      completion->meta.ready_wait_micros =
          std::max(completion->meta.ready_wait_micros, meta.ready_wait_micros);
      completion->meta.processed_bytes += meta.processed_bytes;
      completion->meta.processed_elements += meta.processed_elements;
      last = --completion->left == 0;
    }
    if (!last) return;
    job->scope.pins.clear();  // client memory is no longer touched
    if (!completion->error.ok()) {
      answer_all(completion->error);
    } else {
      for (size_t r = 0; r < job->ranks.size(); ++r) {
        job->results[r].meta = completion->meta;
        std::exchange(job->ranks[r].done, nullptr)(std::move(job->results[r]));
      }
    }
    Release();
  };
  // Parts of one step are queued together, so parts of different steps are queued in the same
  // order on every device (a part waiting at the barrier never waits for a part queued behind
  // another step's waiting part).
  std::unique_lock<std::mutex> order_lock(step_order_mu_, std::defer_lock);
  if (parts > 1) order_lock.lock();
  const absl::Time queued_at = absl::Now();
  // Parts on several devices run side by side: none runs on the transport's thread.
  RequestContext split_ctx;
  const RequestContext* part_ctx = &job->ranks[0].ctx;
  if (parts > 1 && part_ctx->run_inline_when_idle) {
    split_ctx = *part_ctx;
    split_ctx.run_inline_when_idle = false;
    part_ctx = &split_ctx;
  }
  for (auto& [index, items] : by_device) {
    Device* device = &devices_->device(index);
    Executor::Keys keys;
    for (size_t i : items) keys.push_back(Executor::KeyOf(job->entries[i]->name));
    ScratchPool* pool = pools_[device->index].get();
    std::vector<size_t> mine = items;
    absl::Status queued = ExecutorFor(*device).Submit(
        *part_ctx,
        [this, job, device, pool, mine, barrier, queued_at, part_done](kernels::Stream stream) {
          ReplyMeta meta;
          meta.device_uuid = device->label;
          const double waited = absl::ToDoubleSeconds(absl::Now() - queued_at);
          meta.queue_micros = waited * 1e6;
          if (observer_ != nullptr) observer_->QueueWait(device->label, waited);
          absl::Status s;
          {
            OpEnv env(device, stream, &job->scope, observer_, &meta, pool);
            env.set_namespace(job->ns);
            env.set_context(&job->ranks[0].ctx);
            StepPartSync sync{barrier.get()};
            s = RunStepPart(env, *job, mine, barrier != nullptr ? &sync : nullptr);
            if (barrier != nullptr && !sync.arrived) barrier->Failed(s);
            WriteDoneSignals(env, *job);
            CheckHealth(*device);
            int64_t elements = 0;
            for (size_t i : mine) elements += job->entries[i]->rows * job->entries[i]->cols;
            meta.processed_elements = static_cast<uint64_t>(elements);
          }
          part_done(s, meta);
        },
        [part_done, barrier, device](absl::Status s) {
          // Refused before it ran (deadline, cancellation, shutdown): its peers must not apply.
          if (barrier != nullptr) barrier->Failed(s);
          ReplyMeta meta;
          meta.device_uuid = device->label;
          part_done(s, meta);
        },
        /*bypass_bound=*/false, std::move(keys));
    if (!queued.ok()) {
      if (barrier != nullptr) barrier->Failed(queued);
      ReplyMeta meta;
      part_done(queued, meta);
    }
  }
}

}  // namespace fp4q::server
