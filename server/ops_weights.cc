// Engine bodies of the stored-weight operations (run on the weight's device executor).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "fp4q/common/status_macros.h"
#include "fp4q/kernels/validate.h"
#include "server/engine.h"
#include "server/op_env.h"
#include "server/request_checks.h"
#include "server/step_job.h"

namespace fp4q::server {
namespace {

absl::StatusOr<WeightParams> ToWeightParams(const WeightOptionsIn& in) {
  if (in.block == kernels::BlockShape::k1x32) {
    return absl::InvalidArgumentError(
        "options.block: BLOCK_SHAPE_1X32 is MXFP4's; stored weights are NVFP4 (1x16 or 16x16)");
  }
  WeightParams p;
  p.block = in.block;
  p.rounding = in.rounding;
  p.seed = in.seed;
  p.error_feedback = in.error_feedback;
  p.scaling = in.scaling;
  p.dtype = in.dtype;
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

OptimizerSpecIn SpecIn(const OptimizerSpec& s) {
  OptimizerSpecIn o;
  o.set = true;
  o.kind = s.kind;
  o.momentum = s.momentum;
  o.amsgrad = s.amsgrad;
  o.dtype = s.dtype;
  return o;
}

// A requested optimizer spec, checked: momentum is SGD's, amsgrad AdamW's.
absl::StatusOr<OptimizerSpec> ToOptimizerSpec(const OptimizerSpecIn& in, absl::string_view field) {
  OptimizerSpec s;
  s.kind = in.kind;
  s.momentum = in.momentum;
  s.amsgrad = in.amsgrad;
  s.dtype = in.dtype;
  if (s.kind == kernels::OptimizerKind::kAdamW && s.momentum) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".momentum: AdamW keeps its own moments (momentum is an SGD option)"));
  }
  if (s.kind == kernels::OptimizerKind::kSgd && s.amsgrad) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".amsgrad: an AdamW option; this spec is SGD"));
  }
  return s;
}

WeightInfo InfoOf(const StateEntry& e) {
  WeightInfo w;
  w.name = std::string(LocalName(e.name));
  w.shape = {e.rows, e.cols};
  w.options.block = e.params.block;
  w.options.rounding = e.params.rounding;
  w.options.seed = e.params.seed;
  w.options.error_feedback = e.params.error_feedback;
  w.options.dtype = e.params.dtype;
  w.options.scaling = e.params.scaling;
  w.options.optimizer = SpecIn(e.optimizer.spec());
  w.last_step = e.last_step.load();
  w.device_uuid = e.device->label;
  w.bytes = e.total_bytes();
  w.optimizer_steps = e.optimizer_steps;
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
  FP4Q_ASSIGN_OR_RETURN(OptimizerSpec spec,
                        ToOptimizerSpec(req.options.optimizer, "options.optimizer"));
  if (req.step < 0) {
    return absl::InvalidArgumentError(absl::StrCat("step: ", req.step, " must be >= 0"));
  }
  kernels::QuantizeOptions opts = WeightQuantOptions(params, req.step);
  const FieldPath initial_field("initial");
  FP4Q_RETURN_IF_ERROR(
      kernels::ValidateQuantizeShape(shape.rows, shape.cols, opts, initial_field.Shaped()));
  FP4Q_ASSIGN_OR_RETURN(kernels::ConstTensor x, env.Input(req.initial, shape, "initial"));
  FP4Q_ASSIGN_OR_RETURN(EntrySizes sizes, SizesFor(EntryKind::kWeight, shape.rows, shape.cols,
                                                   params, "initial.shape"));
  FP4Q_ASSIGN_OR_RETURN(const uint64_t state_bytes,
                        OptimizerStorage::BytesFor(spec, shape.rows, shape.cols));

  auto e = std::make_shared<StateEntry>(env.Key(req.name), EntryKind::kWeight, &env.device(),
                                        shape.rows, shape.cols, params, sizes);
  e->optimizer_bytes.store(state_bytes);  // counted by Reserve
  std::unique_lock<std::mutex> lock;
  FP4Q_RETURN_IF_ERROR(store_->Reserve(e, &lock, "name"));
  kernels::Backend& b = env.backend();
  auto fill = [&]() -> absl::Status {
    FP4Q_ASSIGN_OR_RETURN(e->codes, DeviceBuffer::Allocate(&b, sizes.codes));
    FP4Q_ASSIGN_OR_RETURN(e->scales, DeviceBuffer::Allocate(&b, sizes.scales));
    FP4Q_ASSIGN_OR_RETURN(e->global, DeviceBuffer::Allocate(&b, sizes.global));
    FP4Q_ASSIGN_OR_RETURN(e->stats, DeviceBuffer::Allocate(&b, sizes.stats));
    FP4Q_RETURN_IF_ERROR(b.Memset(e->stats.data(), 0, sizes.stats, env.stream()));
    if (params.error_feedback) {
      FP4Q_ASSIGN_OR_RETURN(e->residual, DeviceBuffer::Allocate(&b, sizes.residual));
      FP4Q_RETURN_IF_ERROR(b.Memset(e->residual.data(), 0, sizes.residual, env.stream()));
    }
    FP4Q_ASSIGN_OR_RETURN(e->optimizer, OptimizerStorage::Create(&b, env.stream(), spec,
                                                                 shape.rows, shape.cols));
    // The device checks the initial value while it takes its amax (one pass, one small copy):
    // the amax lands in stats[kStatNextAmax], where delayed scaling reads it at the first step.
    FP4Q_ASSIGN_OR_RETURN(void* bad, env.Scratch(sizeof(int64_t)));
    float* amax = e->stats_data() + kernels::kStatNextAmax;
    struct {
      float amax;
      int64_t bad;
    } seen{};
    FP4Q_RETURN_IF_ERROR(env.Kernel("amax", [&] {
      FP4Q_RETURN_IF_ERROR(b.Amax(x, amax, env.stream(), static_cast<int64_t*>(bad)));
      FP4Q_RETURN_IF_ERROR(b.CopyToHost(&seen.amax, amax, sizeof(float), env.stream()));
      return b.CopyToHost(&seen.bad, bad, sizeof(int64_t), env.stream());
    }));
    if (seen.bad >= 0) {
      // The offending element itself, for the message (a refusal: one more small copy).
      float v = 0.0f;
      const size_t esize = kernels::DTypeSize(x.dtype);
      uint32_t bits = 0;
      FP4Q_RETURN_IF_ERROR(env.ToHost(&bits, static_cast<const uint8_t*>(x.data) +
                                                 static_cast<size_t>(seen.bad) * esize,
                                      esize));
      if (esize == 2) bits <<= 16;
      std::memcpy(&v, &bits, sizeof(v));
      return absl::InvalidArgumentError(absl::StrCat(
          "initial: element ", seen.bad, " is ", std::isnan(v) ? "NaN" : (v > 0 ? "Inf" : "-Inf"),
          " (a stored weight must start finite)"));
    }
    opts.has_amax = true;
    opts.amax = seen.amax;
    kernels::QuantizedTensor w = e->Weight();
    return env.Kernel("quantize", [&] {
      FP4Q_RETURN_IF_ERROR(b.Quantize(x, opts, e->residual_data(), &w, nullptr, env.stream()));
      if (!params.error_feedback) return absl::OkStatus();
      // The residual's largest magnitude: the bound delayed scaling's first check starts from.
      const kernels::ConstTensor r{e->residual_data(), kernels::DType::kF32, shape.rows,
                                   shape.cols};
      return b.Amax(r, e->stats_data() + kernels::kStatMaxResidual, env.stream());
    });
  };
  absl::Status s = fill();
  if (!s.ok()) {
    store_->Drop(e);
    return s;
  }
  e->last_step.store(req.step);
  e->has_step.store(true);
  store_->Publish(e);
  env.AddProcessed(sizes.total() + state_bytes);
  res->meta.processed_elements = static_cast<uint64_t>(shape.rows * shape.cols);
  res->weight = InfoOf(*e);
  return absl::OkStatus();
}

absl::Status Engine::RunUpdateWeight(OpEnv& env, const UpdateWeightRequest& req,
                                     UpdateWeightResult* res) {
  // A one-item step: the same checks, kernels and retry rules as Step (ops_step.cc).
  FP4Q_RETURN_IF_ERROR(CheckName(req.name, "name"));
  auto step = std::make_shared<StepRequest>();
  step->step = req.step;
  step->kind = req.kind;
  if (step->kind == kernels::UpdateKind::kGradient && !std::isfinite(req.lr)) {
    return absl::InvalidArgumentError(absl::StrCat("lr: ", req.lr, " is not finite"));
  }
  HyperIn h;
  h.lr = step->kind == kernels::UpdateKind::kGradient ? req.lr : 0.0f;
  step->groups.push_back(h);
  StepItemIn item;
  item.name = req.name;
  item.update = req.update;
  item.dequantized_out = req.dequantized_out;
  item.return_dequantized = req.return_dequantized;
  step->items.push_back(std::move(item));
  StepJob job;
  job.ns = env.ns();
  job.step = req.step;
  job.update_weight = true;
  job.world_size = 1;
  StepJob::Rank r;
  r.req = step;
  job.ranks.push_back(std::move(r));
  job.results.resize(1);
  job.results[0].items.resize(1);
  std::shared_ptr<StateEntry> e = store_->Find(env.Key(req.name));
  if (e == nullptr || !e->live.load()) {
    return absl::NotFoundError(absl::StrCat("name: no weight ", Quote(req.name)));
  }
  if (e->kind != EntryKind::kWeight) {
    return absl::InvalidArgumentError(
        absl::StrCat("name: ", Quote(req.name), " is a residual key, not a weight"));
  }
  if (e->optimizer.spec().stateful()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "name: weight ", Quote(req.name), " keeps ", e->optimizer.spec().ToString(),
        " state; update it with Step and its hyperparameters"));
  }
  job.entries.push_back(e);
  FP4Q_RETURN_IF_ERROR(RunStepPart(env, job, {0}, nullptr));
  StepItemResult& out = job.results[0].items[0];
  res->meta.processed_elements = static_cast<uint64_t>(e->rows * e->cols);
  res->applied = out.applied;
  res->last_step = out.last_step;
  res->global_amax = out.global_amax;
  res->has_dequantized = out.has_dequantized;
  res->dequantized = std::move(out.dequantized);
  return absl::OkStatus();
}

absl::Status Engine::RunGetWeight(OpEnv& env, const GetWeightRequest& req, GetWeightResult* res) {
  std::unique_lock<std::mutex> lock;
  FP4Q_ASSIGN_OR_RETURN(std::shared_ptr<StateEntry> e, LockedWeight(*store_, env, req.name, &lock));
  const kernels::DType dt = req.out_dtype.value_or(e->params.dtype);
  if (!req.dequantized && req.out.has_region) {
    return absl::InvalidArgumentError("out: set, but dequantized is false");
  }
  if (req.residual && !e->params.error_feedback) {
    return absl::FailedPreconditionError(
        absl::StrCat("residual: weight ", Quote(LocalName(e->name)),
                     " keeps no residual (its options.error_feedback is off)"));
  }
  if (req.optimizer_state && !e->optimizer.spec().stateful()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "optimizer_state: weight ", Quote(LocalName(e->name)),
        " keeps no optimizer state (plain SGD; see CreateWeight's options.optimizer)"));
  }
  kernels::QuantizedTensor w = e->Weight();
  {  // Everything returned inline must fit one reply: checked before anything is read.
    uint64_t inline_bytes = 0;
    if (req.dequantized && !req.out.has_region) {
      inline_bytes += static_cast<uint64_t>(e->rows * e->cols) * kernels::DTypeSize(dt);
    }
    if (req.quantized) inline_bytes += e->sizes.codes + e->sizes.scales;
    if (req.residual) inline_bytes += e->sizes.residual;
    if (req.optimizer_state) inline_bytes += e->optimizer_bytes.load();
    FP4Q_RETURN_IF_ERROR(env.InlineFits(OutputTarget{}, inline_bytes, "reply"));
  }
  if (req.dequantized) {
    FP4Q_ASSIGN_OR_RETURN(size_t bytes, kernels::DenseBytes(e->rows, e->cols, dt, "out"));
    FP4Q_ASSIGN_OR_RETURN(uint8_t * out, env.Output(req.out, bytes, "out", &res->dequantized));
    kernels::MutTensor m{out, dt, e->rows, e->cols, bytes};
    FP4Q_RETURN_IF_ERROR(env.Kernel("dequantize", [&] {
      return env.backend().Dequantize(kernels::AsConst(w), m, env.stream());
    }));
    res->has_dequantized = true;
    res->dequantized.dtype = dt;
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
    q.format = w.format;
    q.block = w.block;
    q.scale_layout = w.scale_layout;
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
    r.dtype = kernels::DType::kF32;
    r.shape = {e->rows, e->cols};
    res->has_residual = true;
    env.AddProcessed(e->sizes.residual);
  }
  if (req.optimizer_state) {
    const OptimizerStorage& st = e->optimizer;
    res->has_optimizer_state = true;
    res->optimizer_spec = SpecIn(st.spec());
    res->optimizer_steps = e->optimizer_steps;
    for (int i = 0; i < st.spec().moments(); ++i) {
      MomentResult m;
      m.name = MomentName(st.spec(), i);
      m.dtype = st.spec().dtype;
      const OptimizerStorage::Moment& src = st.moments()[static_cast<size_t>(i)];
      if (st.spec().dtype == kernels::StateDType::kNvfp4) {
        const kernels::QuantizedTensor q = st.QuantizedView(i);
        m.quantized.codes.inline_data.resize(q.codes_capacity);
        m.quantized.scales.inline_data.resize(q.scales_capacity);
        FP4Q_RETURN_IF_ERROR(env.ToHost(m.quantized.codes.inline_data.data(), q.codes,
                                        q.codes_capacity));
        FP4Q_RETURN_IF_ERROR(env.ToHost(m.quantized.scales.inline_data.data(), q.scales,
                                        q.scales_capacity));
        float g[kernels::kGlobalFloats];
        FP4Q_RETURN_IF_ERROR(env.ToHost(g, q.global, sizeof(g)));
        m.quantized.format = q.format;
        m.quantized.block = q.block;
        m.quantized.scale_layout = q.scale_layout;
        m.quantized.shape = {e->rows, e->cols};
        m.quantized.global_amax = g[0];
        m.quantized.s_enc = g[1];
        env.AddProcessed(q.codes_capacity + q.scales_capacity);
      } else {
        m.dense.inline_data.resize(src.dense.size());
        FP4Q_RETURN_IF_ERROR(
            env.ToHost(m.dense.inline_data.data(), src.dense.data(), src.dense.size()));
        m.dense.dtype = st.spec().dtype == kernels::StateDType::kF32 ? kernels::DType::kF32
                                                                     : kernels::DType::kBF16;
        m.dense.shape = {e->rows, e->cols};
        env.AddProcessed(src.dense.size());
      }
      res->moments.push_back(std::move(m));
    }
  }
  res->meta.processed_elements = static_cast<uint64_t>(e->rows * e->cols);
  res->weight = InfoOf(*e);
  return absl::OkStatus();
}

absl::Status Engine::RunResetOptimizer(OpEnv& env, const ResetOptimizerRequest& req,
                                       ResetOptimizerResult* res) {
  std::unique_lock<std::mutex> lock;
  FP4Q_ASSIGN_OR_RETURN(OptimizerSpec spec, ToOptimizerSpec(req.optimizer, "optimizer"));
  FP4Q_ASSIGN_OR_RETURN(std::shared_ptr<StateEntry> e, LockedWeight(*store_, env, req.name, &lock));
  FP4Q_ASSIGN_OR_RETURN(const uint64_t bytes, OptimizerStorage::BytesFor(spec, e->rows, e->cols));
  // The budget first (nothing changes when it does not fit), then the new zeroed state.
  const uint64_t old_bytes = e->optimizer_bytes.load();
  FP4Q_RETURN_IF_ERROR(store_->SetOptimizerBytes(e, std::max(bytes, old_bytes), "optimizer"));
  absl::StatusOr<OptimizerStorage> fresh =
      OptimizerStorage::Create(&env.backend(), env.stream(), spec, e->rows, e->cols);
  if (!fresh.ok()) {
    store_->SetOptimizerBytes(e, old_bytes, "optimizer").IgnoreError();
    return fresh.status();
  }
  e->optimizer = *std::move(fresh);
  FP4Q_RETURN_IF_ERROR(store_->SetOptimizerBytes(e, bytes, "optimizer"));
  e->optimizer_steps = 0;
  env.AddProcessed(bytes);
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
      e->stats.Reset();
      e->residual.Reset();
      e->optimizer = OptimizerStorage();
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
  if (!e->stats.empty()) {  // the residual's bound for delayed scaling's check is 0 again
    FP4Q_RETURN_IF_ERROR(env.backend().Memset(e->stats_data() + kernels::kStatMaxResidual, 0,
                                              sizeof(float), env.stream()));
  }
  return env.backend().Synchronize(env.stream());
}

}  // namespace fp4q::server
