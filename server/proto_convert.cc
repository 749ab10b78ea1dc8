#include "server/proto_convert.h"

#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "fp4q/common/status_macros.h"
#include "server/proto_enums.h"

namespace fp4q::server {
namespace {

RegionSlice FromProto(const v1::RegionSlice& m) { return RegionSlice{m.region_id(), m.offset()}; }

absl::StatusOr<TensorIn> FromProto(const v1::Tensor& m, const FieldPath& field) {
  TensorIn t;
  FP4Q_ASSIGN_OR_RETURN(t.dtype, DenseDType(m.dtype(), field.Member("dtype")));
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

// `f` names the message ("options", "a.dense.options").
absl::StatusOr<QuantOptionsIn> FromProto(const v1::QuantOptions& m,
                                         const FieldPath& f = "options") {
  QuantOptionsIn in;
  kernels::QuantizeOptions& o = in.quant;
  FP4Q_ASSIGN_OR_RETURN(o.format, FormatFrom(m.format(), f.Member("format")));
  FP4Q_ASSIGN_OR_RETURN(o.block, BlockFrom(m.block(), o.format, f.Member("block")));
  FP4Q_ASSIGN_OR_RETURN(o.rounding, RoundingFrom(m.rounding(), f.Member("rounding")));
  o.seed = m.seed();
  o.step = m.step();
  FP4Q_ASSIGN_OR_RETURN(o.rht, RhtFrom(m.rht(), f.Member("rht")));
  o.rht_seed = m.rht_seed();
  FP4Q_ASSIGN_OR_RETURN(o.scale_selection,
                        SelectionFrom(m.scale_selection(), f.Member("scale_selection")));
  o.four_over_six_emax = m.four_over_six_emax() == 0.0f ? 256.0f : m.four_over_six_emax();
  o.has_amax = m.has_amax();
  o.amax = m.amax();
  FP4Q_ASSIGN_OR_RETURN(o.scale_layout, LayoutFrom(m.scale_layout(), f.Member("scale_layout")));
  FP4Q_ASSIGN_OR_RETURN(o.mx_rule, MxRuleFrom(m.mx_scale_rule(), f.Member("mx_scale_rule")));
  FP4Q_RETURN_IF_ERROR(OutputsFrom(m.outputs(), f.Member("outputs"), &o));
  in.residual_key = m.residual_key();
  return in;
}

BytesIn BytesFrom(bool inline_set, absl::string_view inline_data, bool region_set,
                  const v1::RegionSlice& region) {
  BytesIn b;
  if (inline_set) {
    b.source = Source::kInline;
    b.inline_data = inline_data;
  } else if (region_set) {
    b.source = Source::kRegion;
    b.region = FromProto(region);
  }
  return b;
}

absl::StatusOr<QuantizedIn> FromProto(const v1::QuantizedTensor& t, const FieldPath& f) {
  QuantizedIn q;
  FP4Q_ASSIGN_OR_RETURN(q.format, FormatFrom(t.format(), f.Member("format")));
  FP4Q_ASSIGN_OR_RETURN(q.block, BlockFrom(t.block(), q.format, f.Member("block")));
  FP4Q_ASSIGN_OR_RETURN(q.scale_layout,
                        LayoutFrom(t.scale_layout(), f.Member("scale_layout")));
  q.shape.assign(t.shape().begin(), t.shape().end());
  q.global_amax = t.global_amax();
  q.s_enc = t.s_enc();
  q.codes = BytesFrom(t.codes_data_case() == v1::QuantizedTensor::kCodes, t.codes(),
                      t.codes_data_case() == v1::QuantizedTensor::kCodesRegion, t.codes_region());
  q.scales =
      BytesFrom(t.scales_data_case() == v1::QuantizedTensor::kScales, t.scales(),
                t.scales_data_case() == v1::QuantizedTensor::kScalesRegion, t.scales_region());
  return q;
}

absl::StatusOr<QuantizedOperandIn> FromProto(const v1::QuantizedOperand& m,
                                             const FieldPath& field) {
  QuantizedOperandIn op;
  switch (m.operand_case()) {
    case v1::QuantizedOperand::kWeightName:
      op.is_set = true;
      op.is_weight = true;
      op.weight_name = m.weight_name();
      return op;
    case v1::QuantizedOperand::kTensor: {
      op.is_set = true;
      FP4Q_ASSIGN_OR_RETURN(op.tensor, FromProto(m.tensor(), field.Member("tensor")));
      return op;
    }
    case v1::QuantizedOperand::kDense: {
      op.is_set = true;
      op.is_dense = true;
      const FieldPath dense = field.Member("dense");
      FP4Q_ASSIGN_OR_RETURN(op.dense.tensor, FromProto(m.dense().tensor(), dense.Member("tensor")));
      FP4Q_ASSIGN_OR_RETURN(op.dense.options,
                            FromProto(m.dense().options(), dense.Member("options")));
      return op;
    }
    default:
      return op;
  }
}

void ToProto(const RegionSlice& r, v1::RegionSlice* m) {
  m->set_region_id(r.region_id);
  m->set_offset(r.offset);
}

void ToProto(TensorResult&& r, v1::TensorResult* m) {
  m->set_dtype(ToWire(r.dtype));
  for (int64_t d : r.shape) m->add_shape(d);
  if (r.in_region) {
    ToProto(r.region, m->mutable_region());
  } else {
    m->set_inline_data(std::move(r.inline_data));
  }
}

void ToProto(QuantizedResult&& r, v1::QuantizedTensor* m) {
  m->set_format(ToWire(r.format));
  m->set_block(ToWire(r.block));
  m->set_scale_layout(ToWire(r.scale_layout));
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

void ToProto(const OptimizerSpecIn& o, v1::OptimizerSpec* m) {
  m->set_kind(ToWire(o.kind));
  m->set_momentum(o.momentum);
  m->set_amsgrad(o.amsgrad);
  m->set_state_dtype(ToWire(o.dtype));
}

void ToProto(const WeightOptionsIn& o, v1::WeightOptions* m) {
  m->set_block(ToWire(o.block));
  m->set_rounding(ToWire(o.rounding));
  m->set_seed(o.seed);
  m->set_error_feedback(o.error_feedback);
  m->set_dtype(ToWire(o.dtype));
  m->set_scaling(ToWire(o.scaling));
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

absl::StatusOr<OptimizerSpecIn> FromProto(const v1::OptimizerSpec& m, const FieldPath& field) {
  OptimizerSpecIn o;
  o.set = true;
  FP4Q_ASSIGN_OR_RETURN(o.kind, OptimizerKindFrom(m.kind(), field.Member("kind")));
  FP4Q_ASSIGN_OR_RETURN(o.dtype, StateDTypeFrom(m.state_dtype(), field.Member("state_dtype")));
  o.momentum = m.momentum();
  o.amsgrad = m.amsgrad();
  return o;
}

absl::StatusOr<QuantizeRequest> FromProto(const v1::QuantizeRequest& m) {
  QuantizeRequest r;
  FP4Q_ASSIGN_OR_RETURN(r.input, FromProto(m.input(), "input"));
  FP4Q_ASSIGN_OR_RETURN(r.options, FromProto(m.options()));
  r.rowwise_codes = Target(m.has_rowwise_codes(), m.rowwise_codes());
  r.rowwise_scales = Target(m.has_rowwise_scales(), m.rowwise_scales());
  r.columnwise_codes = Target(m.has_columnwise_codes(), m.columnwise_codes());
  r.columnwise_scales = Target(m.has_columnwise_scales(), m.columnwise_scales());
  return r;
}

absl::StatusOr<DequantizeRequest> FromProto(const v1::DequantizeRequest& m) {
  DequantizeRequest r;
  FP4Q_ASSIGN_OR_RETURN(r.input, FromProto(m.input(), "input"));
  FP4Q_ASSIGN_OR_RETURN(r.out_dtype, DenseDType(m.out_dtype(), "out_dtype", kernels::DType::kF32));
  r.out = Target(m.has_out(), m.out());
  return r;
}

absl::StatusOr<QdqRequest> FromProto(const v1::QdqRequest& m) {
  QdqRequest r;
  FP4Q_ASSIGN_OR_RETURN(r.input, FromProto(m.input(), "input"));
  FP4Q_ASSIGN_OR_RETURN(r.options, FromProto(m.options()));
  FP4Q_ASSIGN_OR_RETURN(r.out_dtype, OptionalDType(m.out_dtype(), "out_dtype"));
  r.out = Target(m.has_out(), m.out());
  return r;
}

absl::StatusOr<MatmulRequest> FromProto(const v1::MatmulRequest& m) {
  MatmulRequest r;
  FP4Q_ASSIGN_OR_RETURN(r.a, FromProto(m.a(), "a"));
  FP4Q_ASSIGN_OR_RETURN(r.b, FromProto(m.b(), "b"));
  FP4Q_ASSIGN_OR_RETURN(r.out_dtype, DenseDType(m.out_dtype(), "out_dtype", kernels::DType::kF32));
  r.out = Target(m.has_out(), m.out());
  return r;
}

absl::StatusOr<CreateWeightRequest> FromProto(const v1::CreateWeightRequest& m) {
  CreateWeightRequest r;
  r.name = m.name();
  FP4Q_ASSIGN_OR_RETURN(r.initial, FromProto(m.initial(), "initial"));
  const v1::WeightOptions& o = m.options();
  FP4Q_ASSIGN_OR_RETURN(r.options.block,
                        BlockFrom(o.block(), kernels::Format::kNvfp4, "options.block"));
  FP4Q_ASSIGN_OR_RETURN(r.options.rounding, RoundingFrom(o.rounding(), "options.rounding"));
  r.options.seed = o.seed();
  r.options.error_feedback = o.error_feedback();
  FP4Q_ASSIGN_OR_RETURN(r.options.dtype,
                        DenseDType(o.dtype(), "options.dtype", kernels::DType::kF32));
  FP4Q_ASSIGN_OR_RETURN(r.options.scaling, ScalingFrom(o.scaling(), "options.scaling"));
  if (o.has_optimizer()) {
    FP4Q_ASSIGN_OR_RETURN(r.options.optimizer, FromProto(o.optimizer(), "options.optimizer"));
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
  FP4Q_ASSIGN_OR_RETURN(r.kind, UpdateKindFrom(m.kind(), "kind"));
  r.groups.reserve(static_cast<size_t>(m.groups_size()));
  r.items.reserve(static_cast<size_t>(m.items_size()));
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
  const FieldPath items("items");
  for (int k = 0; k < m.items_size(); ++k) {
    const v1::StepItem& it = m.items(k);
    StepItemIn i;
    i.name = it.name();
    const FieldPath item = items.Index(k);
    FP4Q_ASSIGN_OR_RETURN(i.update, FromProto(it.update(), item.Member("update")));
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
  r.brief_reply = m.brief_reply();
  if (m.has_done_signal()) {
    r.has_done_signal = true;
    r.done_signal = FromProto(m.done_signal().region());
    r.done_value = m.done_signal().value();
  }
  if (m.has_ready_signal()) {
    r.has_ready_signal = true;
    r.ready_signal = FromProto(m.ready_signal().region());
    r.ready_value = m.ready_signal().value();
    r.ready_timeout_ms = m.ready_signal().timeout_ms();
  }
  r.keep_plan = m.keep_plan();
  r.plan_id = m.plan_id();
  r.one_pass = m.one_pass();
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

absl::StatusOr<UpdateWeightRequest> FromProto(const v1::UpdateWeightRequest& m) {
  UpdateWeightRequest r;
  r.name = m.name();
  r.step = m.step();
  FP4Q_ASSIGN_OR_RETURN(r.update, FromProto(m.update(), "update"));
  r.lr = m.lr();
  FP4Q_ASSIGN_OR_RETURN(r.kind, UpdateKindFrom(m.kind(), "kind"));
  r.dequantized_out = Target(m.has_dequantized_out(), m.dequantized_out());
  r.return_dequantized = m.return_dequantized();
  return r;
}

absl::StatusOr<GetWeightRequest> FromProto(const v1::GetWeightRequest& m) {
  GetWeightRequest r;
  r.name = m.name();
  r.dequantized = m.dequantized();
  FP4Q_ASSIGN_OR_RETURN(r.out_dtype, OptionalDType(m.out_dtype(), "out_dtype"));
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
  uint32_t applied = 0;
  for (const StepItemResult& it : r.items) applied += it.applied ? 1 : 0;
  m->set_applied_items(applied);
  m->set_world_size(r.world_size);
  m->set_plan_id(r.plan_id);
  m->set_one_pass(r.one_pass);
  m->set_one_pass_outcome(r.one_pass_outcome);
  if (r.brief) return;
  for (StepItemResult& it : r.items) {
    v1::StepItemResult* o = m->add_items();
    o->set_name(std::move(it.name));
    o->set_applied(it.applied);
    o->set_last_step(it.last_step);
    o->set_global_amax(it.global_amax);
    if (it.has_dequantized) ToProto(std::move(it.dequantized), o->mutable_dequantized());
  }
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
    const bool weight = t.kind == TensorKind::kWeight;
    l->set_kind(weight ? v1::TENSOR_KIND_WEIGHT : v1::TENSOR_KIND_RESIDUAL);
    for (int64_t d : t.shape) l->add_shape(d);
    l->set_dtype(weight ? v1::DTYPE_U8 : v1::DTYPE_F32);  // packed codes / f32 residual
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
  l->set_max_step_plans(r.max_step_plans);
  l->set_max_world_size(r.max_world_size);
  l->set_cpu_max_request_flops(r.cpu_max_request_flops);
}

}  // namespace fp4q::server
