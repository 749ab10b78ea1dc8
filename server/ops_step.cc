// Engine bodies of the trainer's step (Step, and UpdateWeight as a one-item step): every item of
// a step is checked on the device before any is written, and the step is applied as a unit.
// Numerics: docs/NUMERICS.md section 10; kernels: fp4q/kernels/step.h.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "fp4q/common/status_macros.h"
#include "fp4q/kernels/validate.h"
#include "server/engine.h"
#include "server/op_env.h"
#include "server/request_checks.h"
#include "server/step_job.h"

namespace fp4q::server {
namespace {

// The item's field path as the request spells it ("items[3]"), with the rank for groups.
std::string ItemField(const StepJob& job, size_t i) {
  return absl::StrCat(job.update_weight ? "" : absl::StrCat("items[", i, "]"));
}

std::string Sub(const StepJob& job, size_t i, absl::string_view part) {
  if (job.update_weight) return std::string(part);
  return absl::StrCat("items[", i, "].", part);
}

bool Finite(float v) { return std::isfinite(v); }

}  // namespace

absl::Status CheckStepHyper(const HyperIn& h, const std::string& f) {
  auto bad = [&](absl::string_view field, float v, absl::string_view rule) {
    return absl::InvalidArgumentError(absl::StrCat(f, ".", field, ": ", v, " ", rule));
  };
  if (!Finite(h.lr) || h.lr < 0.0f) return bad("lr", h.lr, "must be finite and >= 0");
  if (h.optimizer == kernels::OptimizerKind::kAdamW) {
    if (!Finite(h.beta1) || h.beta1 < 0.0f || h.beta1 >= 1.0f) {
      return bad("adamw.beta1", h.beta1, "must be in [0, 1)");
    }
    if (!Finite(h.beta2) || h.beta2 < 0.0f || h.beta2 >= 1.0f) {
      return bad("adamw.beta2", h.beta2, "must be in [0, 1)");
    }
    if (!Finite(h.eps) || h.eps <= 0.0f) {
      return bad("adamw.eps", h.eps,
                 "must be finite and > 0 (with 0 a zero gradient divides 0 by 0)");
    }
    if (!Finite(h.weight_decay) || h.weight_decay < 0.0f) {
      return bad("adamw.weight_decay", h.weight_decay, "must be finite and >= 0");
    }
    return absl::OkStatus();
  }
  if (!Finite(h.momentum) || h.momentum < 0.0f) {
    return bad("sgd.momentum", h.momentum, "must be finite and >= 0");
  }
  if (!Finite(h.dampening)) return bad("sgd.dampening", h.dampening, "must be finite");
  if (!Finite(h.weight_decay) || h.weight_decay < 0.0f) {
    return bad("sgd.weight_decay", h.weight_decay, "must be finite and >= 0");
  }
  if (h.nesterov && (h.momentum <= 0.0f || h.dampening != 0.0f)) {
    return absl::InvalidArgumentError(absl::StrCat(
        f, ".sgd.nesterov: needs momentum > 0 and dampening 0 (momentum ", h.momentum,
        ", dampening ", h.dampening, "), as torch.optim.SGD"));
  }
  return absl::OkStatus();
}

namespace {

// A hash of a group's hyperparameters and the update kind: a retry must send the same.
uint64_t HyperHash(const HyperIn& h, kernels::UpdateKind kind) {
  uint64_t x = 0x6a09e667f3bcc909ull ^ static_cast<uint64_t>(kind);
  auto mix = [&x](uint64_t v) {
    x ^= v + 0x9e3779b97f4a7c15ull + (x << 6) + (x >> 2);
  };
  auto bits = [](float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return static_cast<uint64_t>(u);
  };
  mix(static_cast<uint64_t>(h.optimizer));
  mix(bits(h.lr));
  mix(bits(h.momentum));
  mix(bits(h.dampening));
  mix(h.nesterov ? 1 : 0);
  mix(bits(h.weight_decay));
  mix(bits(h.beta1));
  mix(bits(h.beta2));
  mix(bits(h.eps));
  return x;
}

const char* QuantityName(kernels::StepQuantity q) {
  switch (q) {
    case kernels::StepQuantity::kUpdateSum:
      return "the update (rank sum)";
    case kernels::StepQuantity::kWeight:
      return "the new weight value";
    case kernels::StepQuantity::kResidual:
      return "the residual";
    case kernels::StepQuantity::kMoment1:
      return "the first moment / momentum buffer";
    case kernels::StepQuantity::kMoment2:
      return "the second moment";
    case kernels::StepQuantity::kDequantized:
      return "the dequantized output";
    case kernels::StepQuantity::kNone:
      break;
  }
  return "a result";
}

// The error for the first refused item of a report, naming the item, the weight and where.
absl::Status Refusal(const StepJob& job, const std::vector<size_t>& items,
                     const kernels::StepReport& report) {
  for (size_t k = 0; k < items.size(); ++k) {
    const kernels::StepItemReport& r = report.items[k];
    if (r.outcome == kernels::StepOutcome::kOk) continue;
    const size_t i = items[k];
    const std::string weight = Quote(job.Name(i));
    const std::string rank =
        job.world_size > 1 ? absl::StrCat("rank ", job.RankOf(r.rank), "'s ") : "";
    const std::string nothing = "; nothing was applied";
    switch (r.outcome) {
      case kernels::StepOutcome::kNonFiniteUpdate:
        return absl::InvalidArgumentError(absl::StrCat(
            rank, Sub(job, i, "update"), ": element ", r.index, " is ",
            std::isnan(r.value) ? "NaN" : (r.value > 0 ? "Inf" : "-Inf"), " (weight ", weight,
            ", step ", job.step, ")", nothing));
      case kernels::StepOutcome::kNonFiniteResult:
        return absl::InvalidArgumentError(absl::StrCat(
            ItemField(job, i), job.update_weight ? "" : ": ", QuantityName(r.quantity),
            " of weight ", weight, " at element ", r.index, " would be ",
            std::isnan(r.value) ? "NaN" : "infinite",
            " (lr, the update or the state overflow f32)", nothing));
      case kernels::StepOutcome::kOutOfRange:
        return absl::InvalidArgumentError(absl::StrCat(
            ItemField(job, i), job.update_weight ? "" : ": ", QuantityName(r.quantity),
            " of weight ", weight, " could pass the f32 range (bound ", r.bound,
            " >= 2^127; lr, the update or the state are too large)", nothing));
      case kernels::StepOutcome::kFingerprintMismatch:
        return absl::FailedPreconditionError(absl::StrCat(
            rank, Sub(job, i, "update"), ": weight ", weight, " already applied step ", job.step,
            " with a different update; a retry must resend the same update", nothing));
      case kernels::StepOutcome::kOk:
        break;
    }
  }
  return absl::InternalError("step: the device refused the batch without naming an item");
}

}  // namespace

// ---------------------------------------------------------------- the body

absl::Status Engine::RunStepPart(OpEnv& env, StepJob& job, const std::vector<size_t>& items,
                                 StepPartSync* barrier) {
  const size_t K = job.ranks.size();
  const StepRequest& first = *job.ranks[0].req;
  // Lock the part's weights in name order (every multi-weight operation does).
  std::vector<size_t> order = items;
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return job.entries[a]->name < job.entries[b]->name; });
  std::vector<std::unique_lock<std::mutex>> locks;
  for (size_t i : order) {
    locks.emplace_back(job.entries[i]->op_mu);
    if (!job.entries[i]->live.load()) {
      return absl::NotFoundError(
          absl::StrCat(Sub(job, i, "name"), ": no weight ", Quote(job.Name(i))));
    }
  }

  std::vector<kernels::StepItem> kitems;
  std::vector<bool> apply(items.size(), false);
  kitems.reserve(items.size());
  // Field paths are spelled out only in messages (FieldPath): "items[3].update", with "rank 2's "
  // before it in a replica group's step; an UpdateWeight's fields have no "items[i]".
  std::vector<std::string> rank_prefix(K);
  for (size_t r = 0; r < K && job.world_size > 1; ++r) {
    rank_prefix[r] = absl::StrCat("rank ", job.ranks[r].rank, "'s ");
  }
  const FieldPath no_prefix("");
  const FieldPath items_field = no_prefix.Then("items");
  for (size_t k = 0; k < items.size(); ++k) {
    const size_t i = items[k];
    StateEntry& e = *job.entries[i];
    const StepItemIn& in = first.Items()[i];
    const HyperIn& h = first.groups[in.group];
    auto group_field = [&] {
      return job.update_weight ? std::string("lr") : absl::StrCat("groups[", in.group, "]");
    };
    const OptimizerSpec& spec = e.optimizer.spec();
    // The hyperparameters must match the state the weight keeps.
    if (h.optimizer != spec.kind) {
      return absl::FailedPreconditionError(absl::StrCat(
          ItemField(job, i), job.update_weight ? "" : ": ", "weight ", Quote(job.Name(i)),
          " keeps ", spec.ToString(), " state, but ", group_field(), " sends ",
          h.optimizer == kernels::OptimizerKind::kAdamW ? "AdamW" : "SGD",
          " hyperparameters; switch optimizers with ResetOptimizer"));
    }
    if (h.optimizer == kernels::OptimizerKind::kSgd && h.momentum > 0.0f && !spec.momentum) {
      return absl::FailedPreconditionError(absl::StrCat(
          group_field(), ".sgd.momentum: ", h.momentum, " but weight ", Quote(job.Name(i)),
          " keeps no momentum buffer (create it with optimizer.momentum, or ResetOptimizer)"));
    }
    if (first.kind == kernels::UpdateKind::kDelta &&
        (spec.stateful() || h.weight_decay != 0.0f)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "kind: UPDATE_KIND_DELTA adds the update as it is, so it takes plain SGD without "
          "weight decay; weight ",
          Quote(job.Name(i)), " keeps ", spec.ToString(), " state"));
    }
    // The step: newer applies, equal retries (checked), older is refused.
    const int64_t last = e.last_step.load();
    const bool has_step = e.has_step.load();
    bool retry = false;
    if (has_step && job.step < last) {
      return absl::FailedPreconditionError(absl::StrCat(
          "step: ", job.step, " is older than the last step ", last, " of weight ",
          Quote(job.Name(i))));
    }
    if (has_step && job.step == last && e.last_fingerprints.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "step: ", job.step, " is not newer than the last step ", last, " of weight ",
          Quote(job.Name(i)), " (its creation or restored step); steps must increase"));
    }
    if (has_step && job.step == last) {
      retry = true;
      const std::vector<uint64_t> expect = job.ExpectedFingerprints(e);
      if (expect.empty() || e.last_hyper_hash != HyperHash(h, first.kind)) {
        return absl::FailedPreconditionError(absl::StrCat(
            "step: ", job.step, " was already applied to weight ", Quote(job.Name(i)),
            expect.empty() ? " by a different set of ranks" : " with other hyperparameters",
            "; a retry must resend the same step"));
      }
    }
    kernels::StepItem it;
    it.weight = e.Weight();
    it.residual = e.residual_data();
    it.stats = e.stats_data();
    it.scaling = e.params.scaling;
    it.rounding = e.params.rounding;
    it.seed = e.params.seed;
    it.step = static_cast<uint64_t>(job.step);
    it.state = e.optimizer.View();
    if (h.optimizer == kernels::OptimizerKind::kSgd && h.momentum == 0.0f) {
      it.state.momentum = false;  // torch: momentum 0 leaves the buffer alone
      it.state.moment1 = kernels::MomentTensor{};
    }
    it.hyper.lr = h.lr;
    it.hyper.weight_decay = h.weight_decay;
    it.hyper.momentum = h.momentum;
    it.hyper.dampening = h.dampening;
    it.hyper.nesterov = h.nesterov;
    it.hyper.beta1 = h.beta1;
    it.hyper.beta2 = h.beta2;
    it.hyper.eps = h.eps;
    it.hyper.t = e.optimizer_steps + 1;
    it.kind = first.kind;
    it.check_only = retry;
    if (retry) it.expect_fingerprints = job.ExpectedFingerprints(e);
    const size_t dq_bytes = static_cast<size_t>(e.rows * e.cols) * kernels::DTypeSize(e.params.dtype);
    const FieldPath item_field = job.update_weight ? no_prefix.Then("") : items_field.Index(i);
    for (size_t r = 0; r < K; ++r) {
      const StepItemIn& ri = job.ranks[r].req->Items()[i];
      const FieldPath rank(rank_prefix[r]);
      const FieldPath rank_items = rank.Then("items");
      const FieldPath rank_item = job.update_weight ? rank.Then("") : rank_items.Index(i);
      const FieldPath f = rank_item.Member("update");
      FP4Q_ASSIGN_OR_RETURN(DenseShape shape, CheckDenseTensor(ri.update, f));
      if (shape.rows != e.rows || shape.cols != e.cols) {
        return absl::InvalidArgumentError(absl::StrCat(
            f.str(), ".shape: ", ShapeString({shape.rows, shape.cols}), " does not match weight ",
            Quote(job.Name(i)), " of shape ", ShapeString({e.rows, e.cols})));
      }
      FP4Q_ASSIGN_OR_RETURN(kernels::ConstTensor x, env.Input(ri.update, shape, f));
      it.updates.push_back(x);
      StepItemResult& out = job.results[r].items[i];
      if (!job.results[r].brief) out.name = job.Name(i);  // a brief reply names no item
      if (ri.dequantized_out.has_region || ri.return_dequantized) {
        FP4Q_ASSIGN_OR_RETURN(
            uint8_t * p, env.Output(ri.dequantized_out, dq_bytes,
                                    item_field.Member("dequantized_out"), &out.dequantized));
        out.has_dequantized = true;
        out.dequantized.dtype = e.params.dtype;
        out.dequantized.shape = {e.rows, e.cols};
        it.dequantized_out.push_back(
            kernels::MutTensor{p, e.params.dtype, e.rows, e.cols, dq_bytes});
      }
    }
    apply[k] = !retry;
    env.AddProcessed(retry ? 0 : 2 * (e.total_bytes()));
    kitems.push_back(std::move(it));
  }
  FP4Q_RETURN_IF_ERROR(env.CheckNoOverlap());
  bool one_pass = false;
  const char* outcome = "";
  if (first.one_pass) {
    outcome =
        barrier != nullptr                                                ? "devices"
        : !std::all_of(apply.begin(), apply.end(), [](bool a) { return a; }) ? "retry"
                                                   : PrepareOnePass(env, job, items, &kitems);
    one_pass = std::strcmp(outcome, "one_pass") == 0;
    if (observer_ != nullptr) observer_->StepOnePass(outcome);
  }
  // The items as the backend takes them, validated once here (the requests' checks above make
  // a refusal here a bug of this engine, not of the request).
  absl::StatusOr<kernels::ValidatedStep> valid = kernels::ValidatedStep::Check(kitems);
  if (!valid.ok()) {
    return absl::InternalError(absl::StrCat(
        "step: ", valid.status().message(),
        items.size() != job.entries.size() ? " (items counted in this device's part)" : ""));
  }
  const kernels::ValidatedStep& step = *valid;
  const size_t ws_bytes = kernels::StepWorkspaceBytes(kitems);
  kernels::StepReport report;
  kernels::Backend& b = env.backend();
  const kernels::Stream st = env.stream();
  // One device whose backend waits and writes on the device: no host round trip between the
  // worker's backward pass, the step's kernels and the worker's next forward pass.
  const bool on_device = barrier == nullptr && options_.step_device_signals &&
                         b.DeviceSignals() && (!job.ready.empty() || !job.signals.empty());
  // The cancellation word after the workspace (RunStepOnDeviceSignals).
  FP4Q_ASSIGN_OR_RETURN(
      void* ws, env.Scratch(on_device ? CancelWordOffset(ws_bytes) + kCancelWordBytes : ws_bytes));
  if (on_device) {
    // A retried item's outputs are written after the report (below), so its done signals are
    // the host's to write.
    const bool all_apply = std::all_of(apply.begin(), apply.end(), [](bool a) { return a; });
    FP4Q_RETURN_IF_ERROR(
        RunStepOnDeviceSignals(env, job, step, ws, ws_bytes, all_apply, &report));
    if (!report.ok) return Refusal(job, items, report);
  } else if (barrier == nullptr) {
    FP4Q_RETURN_IF_ERROR(WaitReadySignals(env, job));
    // One device: check, apply (gated on the device by the check) and one small copy back.
    FP4Q_RETURN_IF_ERROR(env.Kernel("step", [&] {
      FP4Q_RETURN_IF_ERROR(b.StepCheckAndApply(step, ws, ws_bytes, st));
      return b.StepReadReport(kitems, ws, &report, st);
    }));
    if (!report.ok) return Refusal(job, items, report);
  } else {
    FP4Q_RETURN_IF_ERROR(WaitReadySignals(env, job));
    // Several devices: every part checks and reads its report; all apply or none do.
    FP4Q_RETURN_IF_ERROR(env.Kernel("step", [&] {
      FP4Q_RETURN_IF_ERROR(b.StepCheck(step, ws, ws_bytes, st));
      return b.StepReadReport(kitems, ws, &report, st);
    }));
    const absl::Status mine = report.ok ? absl::OkStatus() : Refusal(job, items, report);
    absl::Status all = barrier->Checked(mine);
    if (!all.ok()) return all;
    FP4Q_RETURN_IF_ERROR(env.Kernel("step", [&] {
      FP4Q_RETURN_IF_ERROR(b.StepApply(step, ws, st));
      return b.Synchronize(st);
    }));
  }
  // Applied in one pass: each weight's new state is its second copy; the two trade places.
  for (size_t k = 0; one_pass && k < items.size(); ++k) {
    StateEntry& e = *job.entries[items[k]];
    std::swap(e.codes, e.next_codes);
    std::swap(e.scales, e.next_scales);
    std::swap(e.global, e.next_global);
    std::swap(e.stats, e.next_stats);
    std::swap(e.residual, e.next_residual);
  }
  for (StepResult& r : job.results) {
    r.one_pass = one_pass;
    r.one_pass_outcome = outcome;
  }
  // A retried item writes nothing in the step; its outputs repeat the current weight.
  bool repeated = false;
  for (size_t k = 0; k < kitems.size(); ++k) {
    if (apply[k]) continue;
    for (const kernels::MutTensor& out : kitems[k].dequantized_out) {
      FP4Q_RETURN_IF_ERROR(b.Dequantize(kernels::AsConst(kitems[k].weight), out, st));
      repeated = true;
    }
  }
  if (repeated) FP4Q_RETURN_IF_ERROR(b.Synchronize(st));
  FP4Q_RETURN_IF_ERROR(env.FinishOutputs());
  // Applied: the host-side state follows.
  for (size_t k = 0; k < items.size(); ++k) {
    const size_t i = items[k];
    StateEntry& e = *job.entries[i];
    const HyperIn& h = first.groups[first.Items()[i].group];
    if (apply[k]) {
      e.last_step.store(job.step);
      e.has_step.store(true);
      ++e.optimizer_steps;
      e.last_fingerprints = std::move(report.fingerprints[k]);  // read nowhere after
      e.last_hyper_hash = HyperHash(h, first.kind);
    } else if (observer_ != nullptr) {
      observer_->UpdateNotApplied();
    }
    float amax = report.items[k].amax;
    if (!apply[k]) {  // a retry: the weight as it is
      float g[kernels::kGlobalFloats];
      FP4Q_RETURN_IF_ERROR(env.ToHost(g, e.global.data(), sizeof(g)));
      amax = g[0];
    }
    for (size_t r = 0; r < K; ++r) {
      StepItemResult& out = job.results[r].items[i];
      out.applied = apply[k];
      out.last_step = e.last_step.load();
      out.global_amax = amax;
    }
  }
  return absl::OkStatus();
}

const char* Engine::PrepareOnePass(OpEnv& env, StepJob& job, const std::vector<size_t>& items,
                                   std::vector<kernels::StepItem>* kitems) {
  for (const kernels::StepItem& it : *kitems) {
    if (!kernels::OnePassItem(it)) return "items";
  }
  const char* outcome = SetStepNext(env, job, items, kitems);
  if (std::strcmp(outcome, "one_pass") != 0) {
    for (kernels::StepItem& it : *kitems) it.next = kernels::StepNext{};  // every item or none
  }
  return outcome;
}

const char* Engine::SetStepNext(OpEnv& env, StepJob& job, const std::vector<size_t>& items,
                                std::vector<kernels::StepItem>* kitems) {
  for (size_t k = 0; k < items.size(); ++k) {
    const std::shared_ptr<StateEntry>& e = job.entries[items[k]];
    if (e->next_codes.empty()) {
      const EntrySizes& z = e->sizes;
      const uint64_t bytes = z.codes + z.scales + z.global + z.stats + z.residual;
      if (!store_->SetNextStateBytes(e, bytes, "one_pass").ok()) return "budget";
      kernels::Backend* b = &env.backend();
      absl::StatusOr<DeviceBuffer> c = DeviceBuffer::Allocate(b, z.codes);
      absl::StatusOr<DeviceBuffer> s = DeviceBuffer::Allocate(b, z.scales);
      absl::StatusOr<DeviceBuffer> g = DeviceBuffer::Allocate(b, z.global);
      absl::StatusOr<DeviceBuffer> st = DeviceBuffer::Allocate(b, z.stats);
      absl::StatusOr<DeviceBuffer> r = DeviceBuffer::Allocate(b, z.residual);
      if (!c.ok() || !s.ok() || !g.ok() || !st.ok() || !r.ok()) {
        store_->SetNextStateBytes(e, 0, "one_pass").IgnoreError();  // a release always fits
        return "memory";
      }
      e->next_codes = *std::move(c);
      e->next_scales = *std::move(s);
      e->next_global = *std::move(g);
      e->next_stats = *std::move(st);
      e->next_residual = *std::move(r);
    }
    kernels::StepNext& n = (*kitems)[k].next;
    n.codes = e->next_codes.as<uint8_t>();
    n.scales = e->next_scales.as<uint8_t>();
    n.global = e->next_global.as<float>();
    n.stats = e->next_stats.as<float>();
    n.residual = e->next_residual.as<float>();
  }
  return "one_pass";
}

absl::Status Engine::RunStepOnDeviceSignals(OpEnv& env, StepJob& job,
                                            const kernels::ValidatedStep& step,
                                            void* ws, size_t ws_bytes, bool done_after_apply,
                                            kernels::StepReport* report) {
  kernels::Backend& b = env.backend();
  const kernels::Stream st = env.stream();
  // The cancellation word: zeroed (and done) before anything is queued, so the only write
  // the check can see is this step's own cancellation.
  kernels::StepCancel cancel;
  auto* word =
      reinterpret_cast<uint32_t*>(static_cast<uint8_t*>(ws) + CancelWordOffset(ws_bytes));
  if (!job.ready.empty()) {
    FP4Q_RETURN_IF_ERROR(b.WriteValue32Now(word, 0));
    cancel.word = word;
    cancel.token = static_cast<uint32_t>(next_cancel_token_.fetch_add(1)) | 1u;  // never 0
  }
  // Releases a stream held by the waits: the cancellation first, then each ready word its
  // value (the worker's own write of it later changes nothing). A check that decided before
  // the cancellation landed (the worker wrote its word in the meantime) applies the step.
  auto release = [&] {
    if (cancel.word == nullptr) return;
    absl::Status s = b.WriteValue32Now(word, cancel.token);
    for (const StepJob::Ready& r : job.ready) {
      if (s.ok()) s = b.WriteValue32Now(const_cast<uint8_t*>(r.at), r.value);
    }
    if (!s.ok() && logger_ != nullptr) {
      logger_->Error("step stream not released",
                     {{"step", absl::StrCat(job.step)}, {"error", s.ToString()}});
    }
  };
  absl::Status queued = [&]() -> absl::Status {
    for (const StepJob::Ready& r : job.ready) {
      FP4Q_RETURN_IF_ERROR(b.WaitValue32(r.at, r.value, st));
    }
    FP4Q_RETURN_IF_ERROR(b.StepCheckAndApply(step, ws, ws_bytes, st, cancel));
    if (done_after_apply) {
      for (const StepJob::Signal& sig : job.signals) {
        FP4Q_RETURN_IF_ERROR(b.WriteValue32(sig.at, sig.value, st));
      }
      job.done_queued = true;
    }
    return absl::OkStatus();
  }();
  if (!queued.ok()) {
    // Part of the step may be queued behind the waits: release it (cancelled: it applies
    // nothing) and let it drain before the error goes back.
    job.done_queued = false;
    release();
    b.Synchronize(st).IgnoreError();
    return queued;
  }
  // The host only watches: the device starts the step when the words are written.
  const absl::Status ready = WaitReadySignals(env, job, /*side=*/true);
  if (!ready.ok()) release();
  const absl::Status read =
      env.Kernel("step", [&] { return b.StepReadReport(step.items(), ws, report, st); });
  if (!read.ok()) return read;
  if (!ready.ok() && !report->ok) return ready;  // cancelled (or refused): nothing changed
  return absl::OkStatus();
}

absl::Status Engine::WaitReadySignals(OpEnv& env, const StepJob& job, bool side) {
  if (job.ready.empty()) return absl::OkStatus();
  // The wait is the workers' (their backward passes), not fp4qd's: the reply header and the
  // metrics keep it apart from the request's own time.
  const absl::Time began = absl::Now();
  const absl::Status waited = [&]() -> absl::Status {
    for (const StepJob::Ready& r : job.ready) {
      const absl::Time start = absl::Now();
      const absl::Time until = start + r.timeout;
      uint32_t v = 0;
      for (int polls = 0;; ++polls) {
        if (side) {
          FP4Q_ASSIGN_OR_RETURN(v, env.backend().ReadValue32Now(r.at));
        } else if (env.device().host_memory) {
          v = __atomic_load_n(reinterpret_cast<const uint32_t*>(r.at), __ATOMIC_ACQUIRE);
        } else {
          FP4Q_RETURN_IF_ERROR(env.ToHost(&v, r.at, sizeof(v)));
        }
        // `value` or a later one, modulo 2^32 (the worker counts steps with wrap-around).
        if (static_cast<int32_t>(v - r.value) >= 0) break;
        const absl::Time now = absl::Now();
        if (now >= until) {
          return absl::DeadlineExceededError(absl::StrCat(
              r.field, ": the worker's stream did not write ", r.value, " within ",
              absl::ToInt64Milliseconds(r.timeout), " ms (it holds ", v,
              "); the step changed nothing"));
        }
        if (absl::Status s = env.StillWanted(); !s.ok()) {
          return absl::Status(s.code(), absl::StrCat(r.field, ": still waiting for ", r.value,
                                                     " (it holds ", v, "): ", s.message()));
        }
        // A read is a few microseconds. After the first 200 us (or --worker_spin_us, where
        // the operator gave fp4qd cores to busy-poll) a short sleep between reads keeps the
        // wait from holding a core through a long backward pass.
        if (now - start > std::max(absl::Microseconds(200),
                                   options_.worker_spin.value_or(absl::ZeroDuration()))) {
          absl::SleepFor(absl::Microseconds(20));
        }
      }
    }
    return absl::OkStatus();
  }();
  ReplyMeta& m = env.meta();
  m.ready_waited = true;
  m.ready_wait_micros += absl::ToDoubleMicroseconds(absl::Now() - began);
  return waited;
}

}  // namespace fp4q::server
