#include "server/proto_convert.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace fp4q::server {
namespace {

RegionSlice FromProto(const v1::RegionSlice& m) { return RegionSlice{m.region_id(), m.offset()}; }

TensorIn FromProto(const v1::Tensor& m) {
  TensorIn t;
  t.dtype = static_cast<int>(m.dtype());
  t.shape.assign(m.shape().begin(), m.shape().end());
  switch (m.data_case()) {
    case v1::Tensor::kInlineData:
      t.data.source = Source::kInline;
      t.data.inline_data = m.inline_data();
      break;
    case v1::Tensor::kRegion:
      t.data.source = Source::kRegion;
      t.data.region = FromProto(m.region());
      break;
    default:
      t.data.source = Source::kNone;
  }
  return t;
}

OutputTarget Target(bool has, const v1::OutputTarget& m) {
  OutputTarget t;
  if (has && m.has_region()) {
    t.has_region = true;
    t.region = FromProto(m.region());
  }
  return t;
}

QuantOptionsIn FromProto(const v1::QuantOptions& m) {
  QuantOptionsIn o;
  o.format = static_cast<int>(m.format());
  o.block = static_cast<int>(m.block());
  o.rounding = static_cast<int>(m.rounding());
  o.seed = m.seed();
  o.step = m.step();
  o.rht = static_cast<int>(m.rht());
  o.rht_seed = m.rht_seed();
  o.scale_selection = static_cast<int>(m.scale_selection());
  o.four_over_six_emax = m.four_over_six_emax();
  o.has_amax = m.has_amax();
  o.amax = m.amax();
  o.scale_layout = static_cast<int>(m.scale_layout());
  o.mx_scale_rule = static_cast<int>(m.mx_scale_rule());
  o.outputs = static_cast<int>(m.outputs());
  o.residual_key = m.residual_key();
  return o;
}

QuantizedOperandIn FromProto(const v1::QuantizedOperand& m) {
  QuantizedOperandIn op;
  switch (m.operand_case()) {
    case v1::QuantizedOperand::kWeightName:
      op.is_set = true;
      op.is_weight = true;
      op.weight_name = m.weight_name();
      return op;
    case v1::QuantizedOperand::kTensor:
      break;
    default:
      return op;
  }
  op.is_set = true;
  const v1::QuantizedTensor& t = m.tensor();
  QuantizedIn& q = op.tensor;
  q.format = static_cast<int>(t.format());
  q.block = static_cast<int>(t.block());
  q.scale_layout = static_cast<int>(t.scale_layout());
  q.shape.assign(t.shape().begin(), t.shape().end());
  q.global_amax = t.global_amax();
  q.s_enc = t.s_enc();
  if (t.codes_data_case() == v1::QuantizedTensor::kCodes) {
    q.codes.source = Source::kInline;
    q.codes.inline_data = t.codes();
  } else if (t.codes_data_case() == v1::QuantizedTensor::kCodesRegion) {
    q.codes.source = Source::kRegion;
    q.codes.region = FromProto(t.codes_region());
  }
  if (t.scales_data_case() == v1::QuantizedTensor::kScales) {
    q.scales.source = Source::kInline;
    q.scales.inline_data = t.scales();
  } else if (t.scales_data_case() == v1::QuantizedTensor::kScalesRegion) {
    q.scales.source = Source::kRegion;
    q.scales.region = FromProto(t.scales_region());
  }
  return op;
}

void ToProto(const RegionSlice& r, v1::RegionSlice* m) {
  m->set_region_id(r.region_id);
  m->set_offset(r.offset);
}

void ToProto(TensorResult&& r, v1::TensorResult* m) {
  m->set_dtype(static_cast<v1::DType>(r.dtype));
  for (int64_t d : r.shape) m->add_shape(d);
  if (r.in_region) {
    ToProto(r.region, m->mutable_region());
  } else {
    m->set_inline_data(std::move(r.inline_data));
  }
}

void ToProto(QuantizedResult&& r, v1::QuantizedTensor* m) {
  m->set_format(static_cast<v1::Format>(r.format));
  m->set_block(static_cast<v1::BlockShape>(r.block));
  m->set_scale_layout(static_cast<v1::ScaleLayout>(r.scale_layout));
  for (int64_t d : r.shape) m->add_shape(d);
  m->set_global_amax(r.global_amax);
  m->set_s_enc(r.s_enc);
  if (r.codes.in_region) {
    ToProto(r.codes.region, m->mutable_codes_region());
  } else {
    m->set_codes(std::move(r.codes.inline_data));
  }
  if (r.scales.in_region) {
    ToProto(r.scales.region, m->mutable_scales_region());
  } else {
    m->set_scales(std::move(r.scales.inline_data));
  }
}

absl::Status UnknownEnum(const std::string& field, int v) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": unknown value ", v));
}

v1::OptimizerKind ToWire(kernels::OptimizerKind k) {
  return k == kernels::OptimizerKind::kAdamW ? v1::OPTIMIZER_KIND_ADAMW : v1::OPTIMIZER_KIND_SGD;
}

v1::StateDType ToWire(kernels::StateDType d) {
  switch (d) {
    case kernels::StateDType::kBF16:
      return v1::STATE_DTYPE_BF16;
    case kernels::StateDType::kNvfp4:
      return v1::STATE_DTYPE_NVFP4;
    case kernels::StateDType::kF32:
      break;
  }
  return v1::STATE_DTYPE_F32;
}

void ToProto(const OptimizerSpecIn& o, v1::OptimizerSpec* m) {
  m->set_kind(ToWire(o.kind));
  m->set_momentum(o.momentum);
  m->set_amsgrad(o.amsgrad);
  m->set_state_dtype(ToWire(o.dtype));
}

void ToProto(const WeightOptionsIn& o, v1::WeightOptions* m) {
  m->set_block(static_cast<v1::BlockShape>(o.block));
  m->set_rounding(static_cast<v1::Rounding>(o.rounding));
  m->set_seed(o.seed);
  m->set_error_feedback(o.error_feedback);
  m->set_dtype(static_cast<v1::DType>(o.dtype));
  m->set_scaling(o.scaling == kernels::Scaling::kDelayed ? v1::SCALING_DELAYED
                                                         : v1::SCALING_CURRENT);
  ToProto(o.optimizer, m->mutable_optimizer());
}

void ToProto(const WeightInfo& w, v1::WeightInfo* m) {
  m->set_name(w.name);
  for (int64_t d : w.shape) m->add_shape(d);
  ToProto(w.options, m->mutable_options());
  m->set_last_step(w.last_step);
  m->set_device_uuid(w.device_uuid);
  m->set_bytes(w.bytes);
  m->set_optimizer_steps(w.optimizer_steps);
}

}  // namespace

absl::StatusOr<OptimizerSpecIn> FromProto(const v1::OptimizerSpec& m, const std::string& field) {
  OptimizerSpecIn o;
  o.set = true;
  switch (m.kind()) {
    case v1::OPTIMIZER_KIND_UNSPECIFIED:
    case v1::OPTIMIZER_KIND_SGD:
      o.kind = kernels::OptimizerKind::kSgd;
      break;
    case v1::OPTIMIZER_KIND_ADAMW:
      o.kind = kernels::OptimizerKind::kAdamW;
      break;
    default:
      return UnknownEnum(field + ".kind", m.kind());
  }
  switch (m.state_dtype()) {
    case v1::STATE_DTYPE_UNSPECIFIED:
    case v1::STATE_DTYPE_F32:
      o.dtype = kernels::StateDType::kF32;
      break;
    case v1::STATE_DTYPE_BF16:
      o.dtype = kernels::StateDType::kBF16;
      break;
    case v1::STATE_DTYPE_NVFP4:
      o.dtype = kernels::StateDType::kNvfp4;
      break;
    default:
      return UnknownEnum(field + ".state_dtype", m.state_dtype());
  }
  o.momentum = m.momentum();
  o.amsgrad = m.amsgrad();
  return o;
}

QuantizeRequest FromProto(const v1::QuantizeRequest& m) {
  QuantizeRequest r;
  r.input = FromProto(m.input());
  r.options = FromProto(m.options());
  r.rowwise_codes = Target(m.has_rowwise_codes(), m.rowwise_codes());
  r.rowwise_scales = Target(m.has_rowwise_scales(), m.rowwise_scales());
  r.columnwise_codes = Target(m.has_columnwise_codes(), m.columnwise_codes());
  r.columnwise_scales = Target(m.has_columnwise_scales(), m.columnwise_scales());
  return r;
}

DequantizeRequest FromProto(const v1::DequantizeRequest& m) {
  DequantizeRequest r;
  r.input = FromProto(m.input());
  r.out_dtype = static_cast<int>(m.out_dtype());
  r.out = Target(m.has_out(), m.out());
  return r;
}

QdqRequest FromProto(const v1::QdqRequest& m) {
  QdqRequest r;
  r.input = FromProto(m.input());
  r.options = FromProto(m.options());
  r.out_dtype = static_cast<int>(m.out_dtype());
  r.out = Target(m.has_out(), m.out());
  return r;
}

MatmulRequest FromProto(const v1::MatmulRequest& m) {
  MatmulRequest r;
  r.a = FromProto(m.a());
  r.b = FromProto(m.b());
  r.out_dtype = static_cast<int>(m.out_dtype());
  r.out = Target(m.has_out(), m.out());
  return r;
}

absl::StatusOr<CreateWeightRequest> FromProto(const v1::CreateWeightRequest& m) {
  CreateWeightRequest r;
  r.name = m.name();
  r.initial = FromProto(m.initial());
  r.options.block = static_cast<int>(m.options().block());
  r.options.rounding = static_cast<int>(m.options().rounding());
  r.options.seed = m.options().seed();
  r.options.error_feedback = m.options().error_feedback();
  r.options.dtype = static_cast<int>(m.options().dtype());
  switch (m.options().scaling()) {
    case v1::SCALING_UNSPECIFIED:
    case v1::SCALING_CURRENT:
      r.options.scaling = kernels::Scaling::kCurrent;
      break;
    case v1::SCALING_DELAYED:
      r.options.scaling = kernels::Scaling::kDelayed;
      break;
    default:
      return UnknownEnum("options.scaling", m.options().scaling());
  }
  if (m.options().has_optimizer()) {
    absl::StatusOr<OptimizerSpecIn> spec = FromProto(m.options().optimizer(), "options.optimizer");
    if (!spec.ok()) return spec.status();
    r.options.optimizer = *spec;
  }
  r.step = m.step();
  r.device_uuid = m.device_uuid();
  return r;
}

absl::StatusOr<ResetOptimizerRequest> FromProto(const v1::ResetOptimizerRequest& m) {
  ResetOptimizerRequest r;
  r.name = m.name();
  absl::StatusOr<OptimizerSpecIn> spec = FromProto(m.optimizer(), "optimizer");
  if (!spec.ok()) return spec.status();
  r.optimizer = *spec;
  return r;
}

absl::StatusOr<StepRequest> FromProto(const v1::StepRequest& m) {
  StepRequest r;
  r.step = m.step();
  switch (m.kind()) {
    case v1::UPDATE_KIND_UNSPECIFIED:
    case v1::UPDATE_KIND_GRADIENT:
      r.kind = kernels::UpdateKind::kGradient;
      break;
    case v1::UPDATE_KIND_DELTA:
      r.kind = kernels::UpdateKind::kDelta;
      break;
    default:
      return UnknownEnum("kind", m.kind());
  }
  for (const v1::Hyperparameters& g : m.groups()) {
    HyperIn h;
    h.lr = g.lr();
    switch (g.optimizer_case()) {
      case v1::Hyperparameters::kAdamw:
        h.optimizer = kernels::OptimizerKind::kAdamW;
        h.beta1 = g.adamw().beta1();
        h.beta2 = g.adamw().beta2();
        h.eps = g.adamw().eps();
        h.weight_decay = g.adamw().weight_decay();
        break;
      case v1::Hyperparameters::kSgd:
        h.has_sgd = true;
        h.momentum = g.sgd().momentum();
        h.dampening = g.sgd().dampening();
        h.nesterov = g.sgd().nesterov();
        h.weight_decay = g.sgd().weight_decay();
        break;
      default:
        break;
    }
    r.groups.push_back(h);
  }
  for (const v1::StepItem& it : m.items()) {
    StepItemIn i;
    i.name = it.name();
    i.update = FromProto(it.update());
    i.dequantized_out = Target(it.has_dequantized_out(), it.dequantized_out());
    i.return_dequantized = it.return_dequantized();
    i.group = it.group();
    r.items.push_back(std::move(i));
  }
  if (m.has_replica()) {
    r.has_replica = true;
    r.replica_group = m.replica().group();
    r.rank = m.replica().rank();
  }
  return r;
}

JoinGroupRequest FromProto(const v1::JoinGroupRequest& m) {
  JoinGroupRequest r;
  r.group = m.group();
  r.world_size = m.world_size();
  r.rank = m.rank();
  r.deadline_ms = m.deadline_ms();
  return r;
}

UpdateWeightRequest FromProto(const v1::UpdateWeightRequest& m) {
  UpdateWeightRequest r;
  r.name = m.name();
  r.step = m.step();
  r.update = FromProto(m.update());
  r.lr = m.lr();
  r.kind = static_cast<int>(m.kind());
  r.dequantized_out = Target(m.has_dequantized_out(), m.dequantized_out());
  r.return_dequantized = m.return_dequantized();
  return r;
}

GetWeightRequest FromProto(const v1::GetWeightRequest& m) {
  GetWeightRequest r;
  r.name = m.name();
  r.dequantized = m.dequantized();
  r.out_dtype = static_cast<int>(m.out_dtype());
  r.quantized = m.quantized();
  r.residual = m.residual();
  r.out = Target(m.has_out(), m.out());
  r.optimizer_state = m.optimizer_state();
  return r;
}

RegisterRegionRequest FromProto(const v1::RegisterCudaRegionRequest& m) {
  return RegisterRegionRequest{m.ipc_handle(), m.size(), m.device_uuid()};
}

void ToProto(QuantizeResult&& r, v1::QuantizeReply* m) {
  if (r.has_rowwise) ToProto(std::move(r.rowwise), m->mutable_rowwise());
  if (r.has_columnwise) ToProto(std::move(r.columnwise), m->mutable_columnwise());
}

void ToProto(DequantizeResult&& r, v1::DequantizeReply* m) {
  ToProto(std::move(r.output), m->mutable_output());
}

void ToProto(QdqResult&& r, v1::QdqReply* m) {
  ToProto(std::move(r.output), m->mutable_output());
  m->set_global_amax(r.global_amax);
}

void ToProto(MatmulResult&& r, v1::MatmulReply* m) {
  ToProto(std::move(r.output), m->mutable_output());
}

void ToProto(CreateWeightResult&& r, v1::CreateWeightReply* m) {
  ToProto(r.weight, m->mutable_weight());
}

void ToProto(UpdateWeightResult&& r, v1::UpdateWeightReply* m) {
  m->set_applied(r.applied);
  m->set_last_step(r.last_step);
  if (r.has_dequantized) ToProto(std::move(r.dequantized), m->mutable_dequantized());
  m->set_global_amax(r.global_amax);
}

void ToProto(GetWeightResult&& r, v1::GetWeightReply* m) {
  ToProto(r.weight, m->mutable_weight());
  if (r.has_dequantized) ToProto(std::move(r.dequantized), m->mutable_dequantized());
  if (r.has_quantized) ToProto(std::move(r.quantized), m->mutable_quantized());
  if (r.has_residual) ToProto(std::move(r.residual), m->mutable_residual());
  if (r.has_optimizer_state) {
    v1::OptimizerStateResult* o = m->mutable_optimizer_state();
    ToProto(r.optimizer_spec, o->mutable_spec());
    o->set_steps(r.optimizer_steps);
    for (MomentResult& mo : r.moments) {
      v1::MomentState* s = o->add_moments();
      s->set_name(std::move(mo.name));
      s->set_dtype(ToWire(mo.dtype));
      if (mo.dtype == kernels::StateDType::kNvfp4) {
        ToProto(std::move(mo.quantized), s->mutable_quantized());
      } else {
        ToProto(std::move(mo.dense), s->mutable_dense());
      }
    }
  }
}

void ToProto(StepResult&& r, v1::StepReply* m) {
  for (StepItemResult& it : r.items) {
    v1::StepItemResult* o = m->add_items();
    o->set_name(std::move(it.name));
    o->set_applied(it.applied);
    o->set_last_step(it.last_step);
    o->set_global_amax(it.global_amax);
    if (it.has_dequantized) ToProto(std::move(it.dequantized), o->mutable_dequantized());
  }
  m->set_world_size(r.world_size);
}

void ToProto(ResetOptimizerResult&& r, v1::ResetOptimizerReply* m) {
  ToProto(r.weight, m->mutable_weight());
}

void ToProto(CheckpointResult&& r, v1::CheckpointReply* m) {
  m->set_path(r.file_name);
  m->set_bytes(r.bytes);
  m->set_tensors(r.tensors);
}

void ToProto(std::vector<TensorListing>&& r, v1::ListTensorsReply* m) {
  for (TensorListing& t : r) {
    v1::TensorListing* l = m->add_tensors();
    l->set_name(std::move(t.name));
    l->set_kind(static_cast<v1::TensorKind>(t.kind));
    for (int64_t d : t.shape) l->add_shape(d);
    l->set_dtype(static_cast<v1::DType>(t.dtype));
    l->set_bytes(t.bytes);
    l->set_device_uuid(std::move(t.device_uuid));
    l->set_last_step(t.last_step);
  }
}

void ToProto(ServerInfoResult&& r, uint64_t max_message_bytes, v1::ServerInfoReply* m) {
  m->set_version(std::move(r.version));
  m->set_backend(std::move(r.backend));
  for (GpuListing& g : r.gpus) {
    v1::GpuInfo* p = m->add_gpus();
    p->set_uuid(std::move(g.uuid));
    p->set_name(std::move(g.name));
    p->set_cc_major(g.cc_major);
    p->set_cc_minor(g.cc_minor);
    p->set_total_memory(g.total_memory);
    p->set_state_bytes(g.state_bytes);
  }
  for (std::string& mode : r.supported_modes) m->add_supported_modes(std::move(mode));
  v1::Limits* l = m->mutable_limits();
  l->set_max_message_bytes(max_message_bytes);
  l->set_state_budget_bytes(r.state_budget_bytes);
  l->set_max_queue_depth(r.max_queue_depth);
  l->set_max_open_handles(r.max_open_handles);
  l->set_session_lease_seconds(r.session_lease_seconds);
  l->set_max_step_items(r.max_step_items);
  l->set_max_world_size(r.max_world_size);
  l->set_cpu_max_request_flops(r.cpu_max_request_flops);
}

}  // namespace fp4q::server
