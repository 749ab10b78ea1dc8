// Engine bodies of the stored-weight operations (run on the weight's device executor).
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "fp4q/common/status_macros.h"
#include "fp4q/kernels/validate.h"
#include "server/engine.h"
#include "server/op_env.h"
#include "server/request_checks.h"

namespace fp4q::server {
namespace {

alignas(16) const uint8_t kProbe[16] = {};

std::string Quote(absl::string_view name) { return absl::StrCat("'", name, "'"); }

absl::StatusOr<WeightParams> ToWeightParams(const WeightOptionsIn& in) {
  WeightParams p;
  switch (in.block) {
    case 0:
    case 1:
      p.block = kernels::BlockShape::k1x16;
      break;
    case 2:
      p.block = kernels::BlockShape::k16x16;
      break;
    case 3:
      return absl::InvalidArgumentError(
          "options.block: BLOCK_SHAPE_1X32 is MXFP4's; stored weights are NVFP4 (1x16 or "
          "16x16)");
    default:
      return absl::InvalidArgumentError(absl::StrCat("options.block: unknown value ", in.block));
  }
  switch (in.rounding) {
    case 0:
    case 1:
      p.rounding = kernels::Rounding::kNearest;
      break;
    case 2:
      p.rounding = kernels::Rounding::kStochastic;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("options.rounding: unknown value ", in.rounding));
  }
  p.seed = in.seed;
  p.error_feedback = in.error_feedback;
  FP4Q_ASSIGN_OR_RETURN(p.dtype, DenseDType(in.dtype, "options.dtype", true));
  return p;
}

kernels::QuantizeOptions WeightQuantOptions(const WeightParams& p, int64_t step) {
  kernels::QuantizeOptions o;
  o.format = kernels::Format::kNvfp4;
  o.block = p.block;
  o.rounding = p.rounding;
  o.seed = p.seed;
  o.step = static_cast<uint64_t>(step);
  o.rowwise = true;
  o.columnwise = false;
  return o;
}

WeightInfo InfoOf(const StateEntry& e) {
  WeightInfo w;
  w.name = std::string(LocalName(e.name));
  w.shape = {e.rows, e.cols};
  w.options.block = ToWireBlock(e.params.block);
  w.options.rounding = e.params.rounding == kernels::Rounding::kStochastic ? 2 : 1;
  w.options.seed = e.params.seed;
  w.options.error_feedback = e.params.error_feedback;
  w.options.dtype = ToWireDType(e.params.dtype);
  w.last_step = e.last_step.load();
  w.device_uuid = e.device->label;
  w.bytes = e.sizes.total();
  return w;
}

// The named stored weight of the request's namespace, locked and live.
absl::StatusOr<std::shared_ptr<StateEntry>> LockedWeight(StateStore& store, const OpEnv& env,
                                                         const std::string& name,
                                                         std::unique_lock<std::mutex>* lock) {
  FP4Q_RETURN_IF_ERROR(CheckName(name, "name"));
  std::shared_ptr<StateEntry> e = store.Find(env.Key(name));
  if (e != nullptr) {
    *lock = std::unique_lock<std::mutex>(e->op_mu);
    if (e->live.load()) {
      if (e->kind != EntryKind::kWeight) {
        return absl::InvalidArgumentError(
            absl::StrCat("name: ", Quote(name), " is a residual key, not a weight"));
      }
      return e;
    }
    lock->unlock();
  }
  return absl::NotFoundError(absl::StrCat("name: no weight ", Quote(name)));
}

}  // namespace

absl::Status Engine::RunCreateWeight(OpEnv& env, const CreateWeightRequest& req,
                                     CreateWeightResult* res) {
  FP4Q_RETURN_IF_ERROR(CheckName(req.name, "name"));
  FP4Q_ASSIGN_OR_RETURN(DenseShape shape, CheckDenseTensor(req.initial, "initial"));
  FP4Q_ASSIGN_OR_RETURN(WeightParams params, ToWeightParams(req.options));
  if (req.step < 0) {
    return absl::InvalidArgumentError(absl::StrCat("step: ", req.step, " must be >= 0"));
  }
  const kernels::QuantizeOptions opts = WeightQuantOptions(params, req.step);
  FP4Q_RETURN_IF_ERROR(RenameField(
      kernels::ValidateQuantizeInput({kProbe, shape.dtype, shape.rows, shape.cols}, opts), "x",
      "initial"));
  FP4Q_ASSIGN_OR_RETURN(kernels::ConstTensor x, env.Input(req.initial, shape, "initial"));
  FP4Q_ASSIGN_OR_RETURN(const void* hx, env.HostView(x.data, shape.bytes));
  FP4Q_RETURN_IF_ERROR(CheckFinite(hx, shape.dtype, shape.rows * shape.cols, "initial"));
  FP4Q_ASSIGN_OR_RETURN(EntrySizes sizes, SizesFor(EntryKind::kWeight, shape.rows, shape.cols,
                                                   params, "initial.shape"));

  auto e = std::make_shared<StateEntry>(env.Key(req.name), EntryKind::kWeight, &env.device(),
                                        shape.rows,
                                        shape.cols, params, sizes);
  std::unique_lock<std::mutex> lock;
  FP4Q_RETURN_IF_ERROR(store_->Reserve(e, &lock, "name"));
  auto fill = [&]() -> absl::Status {
    FP4Q_ASSIGN_OR_RETURN(e->codes, DeviceBuffer::Allocate(&env.backend(), sizes.codes));
    FP4Q_ASSIGN_OR_RETURN(e->scales, DeviceBuffer::Allocate(&env.backend(), sizes.scales));
    FP4Q_ASSIGN_OR_RETURN(e->global, DeviceBuffer::Allocate(&env.backend(), sizes.global));
    if (params.error_feedback) {
      FP4Q_ASSIGN_OR_RETURN(e->residual, DeviceBuffer::Allocate(&env.backend(), sizes.residual));
      FP4Q_RETURN_IF_ERROR(
          env.backend().Memset(e->residual.data(), 0, sizes.residual, env.stream()));
    }
    kernels::QuantizedTensor w = e->Weight();
    absl::Status s = env.Kernel("quantize", [&] {
      return env.backend().Quantize(x, opts, e->residual_data(), &w, nullptr, env.stream());
    });
    return RenameField(s, "x", "initial");
  };
  absl::Status s = fill();
  if (!s.ok()) {
    store_->Drop(e);
    return s;
  }
  e->last_step.store(req.step);
  e->has_step.store(true);
  store_->Publish(e);
  env.AddProcessed(sizes.total());
  res->meta.processed_elements = static_cast<uint64_t>(shape.rows * shape.cols);
  res->weight = InfoOf(*e);
  return absl::OkStatus();
}

absl::Status Engine::RunUpdateWeight(OpEnv& env, const UpdateWeightRequest& req,
                                     UpdateWeightResult* res) {
  FP4Q_RETURN_IF_ERROR(CheckName(req.name, "name"));
  FP4Q_ASSIGN_OR_RETURN(DenseShape shape, CheckDenseTensor(req.update, "update"));
  kernels::UpdateKind kind;
  switch (req.kind) {
    case 0:
    case 1:
      kind = kernels::UpdateKind::kGradient;
      break;
    case 2:
      kind = kernels::UpdateKind::kDelta;
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat("kind: unknown value ", req.kind));
  }
  if (kind == kernels::UpdateKind::kGradient && !std::isfinite(req.lr)) {
    return absl::InvalidArgumentError(absl::StrCat("lr: ", req.lr, " is not finite"));
  }
  std::unique_lock<std::mutex> lock;
  FP4Q_ASSIGN_OR_RETURN(std::shared_ptr<StateEntry> e, LockedWeight(*store_, env, req.name, &lock));
  if (shape.rows != e->rows || shape.cols != e->cols) {
    return absl::InvalidArgumentError(absl::StrCat(
        "update.shape: ", ShapeString({shape.rows, shape.cols}), " does not match weight ",
        Quote(LocalName(e->name)), " of shape ", ShapeString({e->rows, e->cols})));
  }
  const bool want_dq = req.dequantized_out.has_region || req.return_dequantized;
  FP4Q_ASSIGN_OR_RETURN(size_t dq_bytes,
                        kernels::DenseBytes(e->rows, e->cols, e->params.dtype, "update.shape"));
  FP4Q_ASSIGN_OR_RETURN(kernels::ConstTensor x, env.Input(req.update, shape, "update"));
  kernels::MutTensor dq{nullptr, e->params.dtype, e->rows, e->cols, dq_bytes};
  if (want_dq) {
    FP4Q_ASSIGN_OR_RETURN(
        dq.data, env.Output(req.dequantized_out, dq_bytes, "dequantized_out", &res->dequantized));
    res->has_dequantized = true;
    res->dequantized.dtype = ToWireDType(e->params.dtype);
    res->dequantized.shape = {e->rows, e->cols};
  }
  FP4Q_RETURN_IF_ERROR(env.CheckNoOverlap());
  kernels::QuantizedTensor w = e->Weight();
  res->meta.processed_elements = static_cast<uint64_t>(e->rows * e->cols);
  const int64_t last = e->last_step.load();
  if (req.step == last) {
    // A retry of an applied step: nothing changes; the reply repeats the current weight.
    if (observer_ != nullptr) observer_->UpdateNotApplied();
    if (want_dq) {
      FP4Q_RETURN_IF_ERROR(env.Kernel("dequantize", [&] {
        return env.backend().Dequantize(kernels::AsConst(w), dq, env.stream());
      }));
      FP4Q_RETURN_IF_ERROR(env.FinishOutputs());
    }
    float g[2];
    FP4Q_RETURN_IF_ERROR(env.ToHost(g, w.global, sizeof(g)));
    res->applied = false;
    res->last_step = last;
    res->global_amax = g[0];
    return absl::OkStatus();
  }
  if (req.step < last) {
    return absl::FailedPreconditionError(absl::StrCat(
        "step: ", req.step, " is older than the last step ", last, " of weight ", Quote(LocalName(e->name))));
  }
  FP4Q_ASSIGN_OR_RETURN(const void* hx, env.HostView(x.data, shape.bytes));
  FP4Q_RETURN_IF_ERROR(CheckFinite(hx, shape.dtype, shape.rows * shape.cols, "update"));
  const kernels::QuantizeOptions opts = WeightQuantOptions(e->params, req.step);
  {
    absl::Status s =
        kernels::ValidateUpdateWeightArgs(w, x, req.lr, kind, opts, want_dq ? &dq : nullptr);
    FP4Q_RETURN_IF_ERROR(RenameField(s, "weight", "name"));
  }
  env.AddProcessed(2 * e->sizes.total());
  absl::Status s = env.Kernel("update_weight", [&] {
    return env.backend().UpdateWeight(w, e->residual_data(), x, req.lr, kind, opts,
                                      want_dq ? &dq : nullptr, env.stream());
  });
  if (s.ok()) s = env.FinishOutputs();
  FP4Q_RETURN_IF_ERROR(s);
  float g[2];
  FP4Q_RETURN_IF_ERROR(env.ToHost(g, w.global, sizeof(g)));
  e->last_step.store(req.step);
  res->applied = true;
  res->last_step = req.step;
  res->global_amax = g[0];
  return absl::OkStatus();
}

absl::Status Engine::RunGetWeight(OpEnv& env, const GetWeightRequest& req, GetWeightResult* res) {
  std::unique_lock<std::mutex> lock;
  FP4Q_ASSIGN_OR_RETURN(std::shared_ptr<StateEntry> e, LockedWeight(*store_, env, req.name, &lock));
  FP4Q_ASSIGN_OR_RETURN(kernels::DType dt,
                        DenseDType(req.out_dtype, "out_dtype", true, e->params.dtype));
  if (!req.dequantized && req.out.has_region) {
    return absl::InvalidArgumentError("out: set, but dequantized is false");
  }
  if (req.residual && !e->params.error_feedback) {
    return absl::FailedPreconditionError(
        absl::StrCat("residual: weight ", Quote(LocalName(e->name)),
                     " keeps no residual (its options.error_feedback is off)"));
  }
  kernels::QuantizedTensor w = e->Weight();
  if (req.dequantized) {
    FP4Q_ASSIGN_OR_RETURN(size_t bytes, kernels::DenseBytes(e->rows, e->cols, dt, "out"));
    FP4Q_ASSIGN_OR_RETURN(uint8_t * out, env.Output(req.out, bytes, "out", &res->dequantized));
    kernels::MutTensor m{out, dt, e->rows, e->cols, bytes};
    FP4Q_RETURN_IF_ERROR(env.Kernel("dequantize", [&] {
      return env.backend().Dequantize(kernels::AsConst(w), m, env.stream());
    }));
    res->has_dequantized = true;
    res->dequantized.dtype = ToWireDType(dt);
    res->dequantized.shape = {e->rows, e->cols};
  }
  FP4Q_RETURN_IF_ERROR(env.FinishOutputs());
  if (req.quantized) {
    QuantizedResult& q = res->quantized;
    q.codes.inline_data.resize(w.codes_capacity);
    q.scales.inline_data.resize(w.scales_capacity);
    FP4Q_RETURN_IF_ERROR(env.ToHost(q.codes.inline_data.data(), w.codes, w.codes_capacity));
    FP4Q_RETURN_IF_ERROR(env.ToHost(q.scales.inline_data.data(), w.scales, w.scales_capacity));
    float g[2];
    FP4Q_RETURN_IF_ERROR(env.ToHost(g, w.global, sizeof(g)));
    q.format = ToWireFormat(w.format);
    q.block = ToWireBlock(w.block);
    q.scale_layout = ToWireLayout(w.scale_layout);
    q.shape = {e->rows, e->cols};
    q.global_amax = g[0];
    q.s_enc = g[1];
    res->has_quantized = true;
    env.AddProcessed(w.codes_capacity + w.scales_capacity);
  }
  if (req.residual) {
    TensorResult& r = res->residual;
    r.inline_data.resize(e->sizes.residual);
    FP4Q_RETURN_IF_ERROR(env.ToHost(r.inline_data.data(), e->residual.data(), e->sizes.residual));
    r.dtype = kWireF32;
    r.shape = {e->rows, e->cols};
    res->has_residual = true;
    env.AddProcessed(e->sizes.residual);
  }
  res->meta.processed_elements = static_cast<uint64_t>(e->rows * e->cols);
  res->weight = InfoOf(*e);
  return absl::OkStatus();
}

absl::Status Engine::RunDeleteWeight(OpEnv& env, const NameRequest& req, EmptyResult* /*res*/) {
  FP4Q_RETURN_IF_ERROR(CheckName(req.name, "name"));
  std::shared_ptr<StateEntry> e = store_->Find(env.Key(req.name));
  if (e != nullptr) {
    std::unique_lock<std::mutex> lock(e->op_mu);
    if (e->live.load()) {
      store_->Drop(e);
      e->codes.Reset();
      e->scales.Reset();
      e->global.Reset();
      e->residual.Reset();
      return absl::OkStatus();
    }
  }
  return absl::NotFoundError(absl::StrCat("name: no weight or residual ", Quote(req.name)));
}

absl::Status Engine::RunResetResidual(OpEnv& env, const NameRequest& req, EmptyResult* /*res*/) {
  FP4Q_RETURN_IF_ERROR(CheckName(req.name, "name"));
  std::shared_ptr<StateEntry> e = store_->Find(env.Key(req.name));
  std::unique_lock<std::mutex> lock;
  if (e != nullptr) lock = std::unique_lock<std::mutex>(e->op_mu);
  if (e == nullptr || !e->live.load()) {
    return absl::NotFoundError(absl::StrCat("name: no weight or residual ", Quote(req.name)));
  }
  if (e->residual.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("name: weight ", Quote(req.name),
                     " keeps no residual (its options.error_feedback is off)"));
  }
  FP4Q_RETURN_IF_ERROR(
      env.backend().Memset(e->residual.data(), 0, e->sizes.residual, env.stream()));
  return env.backend().Synchronize(env.stream());
}

}  // namespace fp4q::server
