// Engine bodies of Quantize, Dequantize, QDQ and Matmul (run on the device's executor).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>

#include "absl/strings/str_cat.h"
#include "fp4q/common/status_macros.h"
#include "fp4q/kernels/validate.h"
#include "server/engine.h"
#include "server/op_env.h"
#include "server/quality.h"
#include "server/request_checks.h"

namespace fp4q::server {


namespace {

absl::Status CheckStep(uint64_t step, absl::string_view field) {
  if (step > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", step, " is above 2^63 - 1"));
  }
  return absl::OkStatus();
}

// The refusal a failed device-side check of an error-feedback call answers with (nothing was
// written and the residual is unchanged).
absl::Status GuardStatus(const kernels::FiniteGuard& g, absl::string_view key) {
  switch (g.outcome) {
    case kernels::StepOutcome::kOk:
      return absl::OkStatus();
    case kernels::StepOutcome::kNonFiniteUpdate:
      return absl::InvalidArgumentError(absl::StrCat(
          "input: element ", g.index, " is ",
          std::isnan(g.value) ? "NaN" : (g.value > 0 ? "Inf" : "-Inf"),
          " (a call with options.residual_key changes state and refuses non-finite values); "
          "the residual is unchanged"));
    case kernels::StepOutcome::kNonFiniteResult:
      return absl::InvalidArgumentError(absl::StrCat(
          "input: element ", g.index, " plus residual '", key,
          "' would be infinite (overflows f32); the residual is unchanged"));
    case kernels::StepOutcome::kOutOfRange:
      return absl::InvalidArgumentError(absl::StrCat(
          "input: with residual '", key, "' the result could dequantize to ", g.bound,
          ", past the output's range; the residual is unchanged"));
    default:
      return absl::InternalError("guard: an outcome this server does not know");
  }
}

absl::Status Unrequested(const OutputTarget& t, absl::string_view field, absl::string_view what) {
  if (!t.has_region) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": set, but options.outputs has no ", what, " output"));
}

// QDQ's options: one row-wise output (named as the proto's `outputs`; error feedback's refusal
// first), then the kernels' QDQ option rules (the general ones, no RHT; so error feedback's
// other rules hold too).
absl::Status CheckQdqOptions(const QuantOptionsIn& in) {
  const kernels::QuantizeOptions& o = in.quant;
  FP4Q_RETURN_IF_ERROR(CheckErrorFeedbackOutputs(in));
  if (o.columnwise) {
    return absl::InvalidArgumentError(
        absl::StrCat("options.outputs: ", o.rowwise ? "OUTPUTS_BOTH" : "OUTPUTS_COLUMNWISE",
                     ", but QDQ is row-wise only; use OUTPUTS_ROWWISE"));
  }
  return kernels::ValidateQdqOptions(o, "options");
}

void FillQuantized(const kernels::QuantizedTensor& q, const float global[2], QuantizedResult* r) {
  r->format = q.format;
  r->block = q.block;
  r->scale_layout = q.scale_layout;
  r->shape = {q.rows, q.cols};
  r->global_amax = global[0];
  r->s_enc = global[1];
}

}  // namespace

absl::StatusOr<std::shared_ptr<StateEntry>> Engine::ResidualFor(OpEnv& env, const std::string& key,
                                                                int64_t rows, int64_t cols,
                                                                uint64_t step,
                                                                std::unique_lock<std::mutex>* lock,
                                                                bool* created) {
  const std::string field = "options.residual_key";
  for (int attempt = 0; attempt < 4; ++attempt) {
    std::shared_ptr<StateEntry> e = store_->Find(env.Key(key));
    if (e != nullptr) {
      std::unique_lock<std::mutex> l(e->op_mu);
      if (!e->live.load()) continue;  // deleted (or its creation failed) meanwhile
      if (e->kind != EntryKind::kResidual) {
        return absl::InvalidArgumentError(absl::StrCat(
            field, ": ", Quote(key), " is a stored weight; update it with UpdateWeight"));
      }
      if (e->device != &env.device()) {
        return absl::FailedPreconditionError(
            absl::StrCat(field, ": ", Quote(key), " moved to another device; retry"));
      }
      if (e->rows != rows || e->cols != cols) {
        return absl::InvalidArgumentError(
            absl::StrCat("input.shape: ", ShapeString({rows, cols}), " does not match residual ",
                         Quote(key), " of shape ", ShapeString({e->rows, e->cols})));
      }
      const int64_t s = static_cast<int64_t>(step);
      if (e->has_step.load()) {
        const int64_t last = e->last_step.load();
        if (s == last) {
          return absl::AlreadyExistsError(
              absl::StrCat("options.step: ", s, " was already applied to residual ", Quote(key)));
        }
        if (s < last) {
          return absl::FailedPreconditionError(absl::StrCat("options.step: ", s,
                                                            " is older than the last step ", last,
                                                            " of residual ", Quote(key)));
        }
      }
      *lock = std::move(l);
      *created = false;
      return e;
    }
    FP4Q_ASSIGN_OR_RETURN(EntrySizes sizes,
                          SizesFor(EntryKind::kResidual, rows, cols, WeightParams{}, field));
    auto fresh = std::make_shared<StateEntry>(env.Key(key), EntryKind::kResidual, &env.device(),
                                              rows, cols, WeightParams{}, sizes);
    std::unique_lock<std::mutex> l;
    absl::Status s = store_->Reserve(fresh, &l, field);
    if (s.code() == absl::StatusCode::kAlreadyExists) continue;  // a concurrent creator won
    FP4Q_RETURN_IF_ERROR(s);
    absl::StatusOr<DeviceBuffer> buf = DeviceBuffer::Allocate(&env.backend(), sizes.residual);
    absl::Status zeroed = buf.ok()
                              ? env.backend().Memset(buf->data(), 0, sizes.residual, env.stream())
                              : buf.status();
    if (zeroed.ok()) zeroed = env.backend().Synchronize(env.stream());
    if (!zeroed.ok()) {
      store_->Drop(fresh);
      return zeroed;
    }
    fresh->residual = std::move(*buf);
    *lock = std::move(l);
    *created = true;
    return fresh;
  }
  return absl::AbortedError(absl::StrCat(field, ": ", Quote(key), " changed concurrently; retry"));
}

void Engine::SampleQuality(OpEnv& env, const kernels::ConstTensor& x,
                           const kernels::QuantizedTensor& q) {
  if (options_.quality_sample_every <= 0 || observer_ == nullptr) return;
  if (quantize_count_.fetch_add(1) % static_cast<uint64_t>(options_.quality_sample_every) != 0) {
    return;
  }
  // One sample at a time: on a GPU the statistics run after the reply on the request's worker
  // and take milliseconds, so back-to-back callers would otherwise tie up every worker of a
  // device with them (seen on the H200 as a queue-wait p99 of ~3 ms). A sample that finds
  // another one still running is skipped.
  if (quality_running_.exchange(true)) return;
  std::shared_ptr<void> done_sampling(nullptr, [this](void*) { quality_running_.store(false); });
  // A bounded sample: a prefix of whole rows, about 1 Mi elements at most, cut where the scale
  // layout allows (16x16 tiles: 16 rows; swizzled scales: 128-row tiles).
  const int64_t unit = q.scale_layout == kernels::ScaleLayout::kSwizzled ? 128
                       : q.block == kernels::BlockShape::k16x16          ? 16
                                                                         : 1;
  int64_t rows = x.rows;
  const int64_t limit = std::max<int64_t>(1, (int64_t{1} << 20) / x.cols);
  if (rows > limit) rows = std::min(x.rows, std::max(unit, limit / unit * unit));
  kernels::ConstQuantizedTensor sample = kernels::AsConst(q);
  sample.rows = rows;
  const int64_t n = rows * x.cols;
  const size_t dq_bytes = static_cast<size_t>(n) * sizeof(float);
  absl::StatusOr<void*> dq = env.Scratch(dq_bytes);
  if (!dq.ok()) return;
  kernels::MutTensor out{*dq, kernels::DType::kF32, rows, x.cols, dq_bytes};
  if (!env.backend().Dequantize(sample, out, env.stream()).ok()) return;
  // Copy what the statistics read out of client memory now (the reply releases it).
  const size_t x_bytes = static_cast<size_t>(n) * kernels::DTypeSize(x.dtype);
  const size_t codes_bytes = static_cast<size_t>(n / 2);
  absl::StatusOr<void*> xs = env.Scratch(x_bytes);
  absl::StatusOr<void*> cs = env.Scratch(codes_bytes);
  if (!xs.ok() || !cs.ok()) return;
  if (!env.backend().CopyDeviceToDevice(*xs, x.data, x_bytes, env.stream()).ok()) return;
  if (!env.backend().CopyDeviceToDevice(*cs, q.codes, codes_bytes, env.stream()).ok()) return;
  if (!env.backend().Synchronize(env.stream()).ok()) return;
  const kernels::DType dtype = x.dtype;
  const int64_t cols = x.cols;
  const void* xp = *xs;
  const void* cp = *cs;
  const void* dqp = *dq;
  auto stats = [this, &env, xp, cp, dqp, x_bytes, codes_bytes, dq_bytes, dtype, n, rows, cols,
                done_sampling] {
    absl::StatusOr<const void*> hx = env.HostView(xp, x_bytes);
    absl::StatusOr<const void*> hdq = env.HostView(dqp, dq_bytes);
    absl::StatusOr<const void*> hcodes = env.HostView(cp, codes_bytes);
    if (!hx.ok() || !hdq.ok() || !hcodes.ok()) return;
    const std::vector<float> xf = ToF32(*hx, dtype, n);
    QualityStats s = ComputeQuality(xf.data(), static_cast<const float*>(*hdq),
                                    static_cast<const uint8_t*>(*hcodes), rows, cols);
    if (s.valid) observer_->Quality(s.sqnr_db, s.clipped_ratio, s.underflow_ratio);
  };
  // On a GPU the device-to-host copies and the statistics (milliseconds for 1 Mi elements)
  // would delay the reply; the CPU backend computes them at once (its metrics are then exact
  // when the reply arrives).
  if (env.device().host_memory) {
    stats();
  } else {
    env.Defer(std::move(stats));
  }
}

absl::Status Engine::RunQuantize(OpEnv& env, const QuantizeRequest& req, QuantizeResult* res) {
  FP4Q_ASSIGN_OR_RETURN(DenseShape shape, CheckDenseTensor(req.input, "input"));
  FP4Q_RETURN_IF_ERROR(CheckQuantOptions(req.options));
  const kernels::QuantizeOptions& opts = req.options.quant;
  const bool ef = !req.options.residual_key.empty();
  if (ef) {
    FP4Q_RETURN_IF_ERROR(CheckName(req.options.residual_key, "options.residual_key"));
    FP4Q_RETURN_IF_ERROR(CheckStep(opts.step, "options.step"));
  }
  const FieldPath input_field("input");
  FP4Q_RETURN_IF_ERROR(
      kernels::ValidateQuantizeShape(shape.rows, shape.cols, opts, input_field.Shaped()));
  if (!opts.rowwise) {
    FP4Q_RETURN_IF_ERROR(Unrequested(req.rowwise_codes, "rowwise_codes", "row-wise"));
    FP4Q_RETURN_IF_ERROR(Unrequested(req.rowwise_scales, "rowwise_scales", "row-wise"));
  }
  if (!opts.columnwise) {
    FP4Q_RETURN_IF_ERROR(Unrequested(req.columnwise_codes, "columnwise_codes", "column-wise"));
    FP4Q_RETURN_IF_ERROR(Unrequested(req.columnwise_scales, "columnwise_scales", "column-wise"));
  }
  FP4Q_ASSIGN_OR_RETURN(kernels::ConstTensor x, env.Input(req.input, shape, "input"));
  kernels::QuantizedTensor rq, cq;
  float* rglobal = nullptr;
  float* cglobal = nullptr;
  if (opts.rowwise) {
    FP4Q_ASSIGN_OR_RETURN(rq, QuantizedOutput(opts, shape.rows, shape.cols, "input.shape"));
    FP4Q_ASSIGN_OR_RETURN(rq.codes, env.Output(req.rowwise_codes, rq.codes_capacity,
                                               "rowwise_codes", &res->rowwise.codes));
    FP4Q_ASSIGN_OR_RETURN(rq.scales, env.Output(req.rowwise_scales, rq.scales_capacity,
                                                "rowwise_scales", &res->rowwise.scales));
    FP4Q_ASSIGN_OR_RETURN(void* g, env.Scratch(kernels::kGlobalFloats * sizeof(float)));
    rq.global = rglobal = static_cast<float*>(g);
  }
  if (opts.columnwise) {
    FP4Q_ASSIGN_OR_RETURN(cq, QuantizedOutput(opts, shape.cols, shape.rows, "input.shape"));
    FP4Q_ASSIGN_OR_RETURN(cq.codes, env.Output(req.columnwise_codes, cq.codes_capacity,
                                               "columnwise_codes", &res->columnwise.codes));
    FP4Q_ASSIGN_OR_RETURN(cq.scales, env.Output(req.columnwise_scales, cq.scales_capacity,
                                                "columnwise_scales", &res->columnwise.scales));
    FP4Q_ASSIGN_OR_RETURN(void* g, env.Scratch(kernels::kGlobalFloats * sizeof(float)));
    cq.global = cglobal = static_cast<float*>(g);
  }
  FP4Q_RETURN_IF_ERROR(env.CheckNoOverlap());

  std::shared_ptr<StateEntry> residual;
  std::unique_lock<std::mutex> residual_lock;
  bool created = false;
  kernels::FiniteGuard* guard = nullptr;  // error feedback: checked on the device, gated there
  if (ef) {
    FP4Q_ASSIGN_OR_RETURN(residual,
                          ResidualFor(env, req.options.residual_key, shape.rows, shape.cols,
                                      opts.step, &residual_lock, &created));
    env.AddProcessed(2 * residual->sizes.residual);
    absl::StatusOr<void*> g = env.Scratch(sizeof(kernels::FiniteGuard));
    if (!g.ok()) {
      if (created) store_->Drop(residual);
      return g.status();
    }
    guard = static_cast<kernels::FiniteGuard*>(*g);
  }
  float rg[2] = {0, 0};
  float cg[2] = {0, 0};
  kernels::FiniteGuard seen;
  // The global records' and the guard's copies ride on the kernel's synchronization.
  absl::Status s = env.Kernel("quantize", [&] {
    absl::Status k =
        env.backend().Quantize(x, opts, residual ? residual->residual_data() : nullptr,
                               opts.rowwise ? &rq : nullptr, opts.columnwise ? &cq : nullptr,
                               env.stream(), guard);
    if (k.ok() && guard != nullptr) {
      k = env.backend().CopyToHost(&seen, guard, sizeof(seen), env.stream());
    }
    if (k.ok() && rglobal != nullptr) {
      k = env.backend().CopyToHost(rg, rglobal, sizeof(rg), env.stream());
    }
    if (k.ok() && cglobal != nullptr) {
      k = env.backend().CopyToHost(cg, cglobal, sizeof(cg), env.stream());
    }
    return k;
  });
  if (s.ok() && guard != nullptr) s = GuardStatus(seen, req.options.residual_key);
  if (s.ok()) s = env.FinishOutputs();
  if (!s.ok()) {
    if (created) store_->Drop(residual);
    return s;
  }
  if (residual != nullptr) {
    residual->last_step.store(static_cast<int64_t>(opts.step));
    residual->has_step.store(true);
    if (created) store_->Publish(residual);
    residual_lock.unlock();
  }
  res->meta.processed_elements = static_cast<uint64_t>(shape.rows * shape.cols);
  if (opts.rowwise) {
    res->has_rowwise = true;
    FillQuantized(rq, rg, &res->rowwise);
  }
  if (opts.columnwise) {
    res->has_columnwise = true;
    FillQuantized(cq, cg, &res->columnwise);
  }
  // Quality compares DQ with x, so not with RHT (DQ is in the transformed domain) nor with error
  // feedback (it quantized x + r).
  if (!ef && opts.rowwise && opts.rht == kernels::RhtMode::kOff) SampleQuality(env, x, rq);
  return absl::OkStatus();
}

absl::Status Engine::RunQdq(OpEnv& env, const QdqRequest& req, QdqResult* res) {
  FP4Q_ASSIGN_OR_RETURN(DenseShape shape, CheckDenseTensor(req.input, "input"));
  FP4Q_RETURN_IF_ERROR(CheckQdqOptions(req.options));
  const kernels::QuantizeOptions& opts = req.options.quant;
  const kernels::DType out_dt = req.out_dtype.value_or(shape.dtype);
  const bool ef = !req.options.residual_key.empty();
  if (ef) {
    FP4Q_RETURN_IF_ERROR(CheckName(req.options.residual_key, "options.residual_key"));
    FP4Q_RETURN_IF_ERROR(CheckStep(opts.step, "options.step"));
  }
  const FieldPath input_field("input");
  FP4Q_RETURN_IF_ERROR(
      kernels::ValidateQuantizeShape(shape.rows, shape.cols, opts, input_field.Shaped()));
  FP4Q_ASSIGN_OR_RETURN(size_t out_bytes,
                        kernels::DenseBytes(shape.rows, shape.cols, out_dt, "input.shape"));
  FP4Q_ASSIGN_OR_RETURN(kernels::ConstTensor x, env.Input(req.input, shape, "input"));
  FP4Q_ASSIGN_OR_RETURN(uint8_t * out, env.Output(req.out, out_bytes, "out", &res->output));
  if (out_dt == shape.dtype) {
    FP4Q_RETURN_IF_ERROR(env.CheckNoOverlap({{"out.region", "input.region"}}));
  } else {
    FP4Q_RETURN_IF_ERROR(env.CheckNoOverlap());
  }
  kernels::MutTensor m{out, out_dt, shape.rows, shape.cols, out_bytes};
  res->meta.processed_elements = static_cast<uint64_t>(shape.rows * shape.cols);
  res->output.dtype = out_dt;
  res->output.shape = {shape.rows, shape.cols};

  if (!ef) {
    // Global amax as the QDQ uses it: the caller's, else amax(x) (QDQ has no RHT).
    if (opts.has_amax) {
      res->global_amax = opts.amax;
    } else {
      FP4Q_ASSIGN_OR_RETURN(void* amax, env.Scratch(sizeof(float)));
      FP4Q_RETURN_IF_ERROR(env.Kernel(
          "amax", [&] { return env.backend().Amax(x, static_cast<float*>(amax), env.stream()); }));
      FP4Q_RETURN_IF_ERROR(env.ToHost(&res->global_amax, amax, sizeof(float)));
    }
    absl::Status s =
        env.Kernel("qdq", [&] { return env.backend().Qdq(x, opts, nullptr, m, env.stream()); });
    if (s.ok()) s = env.FinishOutputs();
    return s;
  }

  // Error feedback: one QDQ pass with the residual step, checked on the device first (the
  // guard also carries the amax of v = x + r it used, for the reply).
  FP4Q_ASSIGN_OR_RETURN(void* g, env.Scratch(sizeof(kernels::FiniteGuard)));
  auto* guard = static_cast<kernels::FiniteGuard*>(g);
  std::unique_lock<std::mutex> residual_lock;
  bool created = false;
  FP4Q_ASSIGN_OR_RETURN(std::shared_ptr<StateEntry> residual,
                        ResidualFor(env, req.options.residual_key, shape.rows, shape.cols,
                                    opts.step, &residual_lock, &created));
  env.AddProcessed(2 * residual->sizes.residual);
  kernels::FiniteGuard seen;
  absl::Status s = env.Kernel("qdq", [&] {
    FP4Q_RETURN_IF_ERROR(
        env.backend().Qdq(x, opts, residual->residual_data(), m, env.stream(), guard));
    return env.backend().CopyToHost(&seen, guard, sizeof(seen), env.stream());
  });
  if (s.ok()) s = GuardStatus(seen, req.options.residual_key);
  if (s.ok()) s = env.FinishOutputs();
  if (!s.ok()) {
    if (created) store_->Drop(residual);
    return s;
  }
  residual->last_step.store(static_cast<int64_t>(opts.step));
  residual->has_step.store(true);
  if (created) store_->Publish(residual);
  res->global_amax = opts.has_amax ? opts.amax : seen.amax;
  return absl::OkStatus();
}


}  // namespace fp4q::server
