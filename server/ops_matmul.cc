// Engine bodies of Dequantize and Matmul (run on the device's executor): their operands are
// request tensors or stored weights; Matmul chunks long A operands by rows.
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "fp4q/common/status_macros.h"
#include "fp4q/kernels/validate.h"
#include "server/engine.h"
#include "server/op_env.h"
#include "server/request_checks.h"

namespace fp4q::server {

// A quantized operand: a request tensor, or a stored weight (then `entry` is set and the view
// is filled in once its lock is held).
struct Operand {
  kernels::ConstQuantizedTensor q;
  std::shared_ptr<StateEntry> entry;
  std::string field;  // "a", "b", "input"
  // How messages name it: "a.tensor" with dimensions "a.tensor.shape[0]" / "[1]", a stored
  // weight's "a.weight_name" (no shape in the request: "a.weight_name (the weight's rows)"), or
  // "a.dense.tensor" (column-wise: its rows are the tensor's shape[1]).
  std::string path;
  bool weight_dims = false;
  // A dense operand: `x` quantized with `quant` into `dense` (scratch) before the GEMM.
  bool is_dense = false;
  kernels::ConstTensor x;
  kernels::QuantizeOptions quant;
  kernels::QuantizedTensor dense;
};

namespace {

// The operand's path for messages; `root` is FieldPath(o.path), kept by the caller.
FieldPath OperandPath(const FieldPath& root, const Operand& o) {
  if (o.weight_dims) return root.Dims(" (the weight's rows)", " (the weight's columns)");
  if (o.is_dense && o.quant.columnwise) return root.Dims(".shape[1]", ".shape[0]");  // Q(x^T)
  return root.Shaped();
}

// A's rows [r0, r0 + rows) as an operand of their own: plain scale layouts slice by rows (16x16
// blocks at multiples of 16 rows); swizzled ones by 128-row tiles (a tile's scales are
// contiguous). Null when `rows` cannot be cut there.
bool RowSlice(const kernels::ConstQuantizedTensor& q, int64_t r0, int64_t rows,
              kernels::ConstQuantizedTensor* out) {
  const int64_t unit = q.scale_layout == kernels::ScaleLayout::kSwizzled ? 128
                       : q.block == kernels::BlockShape::k16x16          ? 16
                                                                         : 1;
  if (r0 % unit != 0 || (rows % unit != 0 && r0 + rows != q.rows)) return false;
  const int64_t per_block = kernels::BlockElems(q.format);
  const int64_t scale_cols = q.cols / per_block;
  *out = q;
  out->rows = rows;
  out->codes = q.codes + r0 * q.cols / 2;
  out->codes_capacity = static_cast<size_t>(rows * q.cols / 2);
  if (q.scale_layout == kernels::ScaleLayout::kSwizzled) {
    const int64_t tile = ((scale_cols + 3) / 4) * 512;  // bytes of one 128-row tile
    out->scales = q.scales + (r0 / 128) * tile;
    out->scales_capacity = static_cast<size_t>((rows + 127) / 128 * tile);
  } else {
    out->scales = q.scales + r0 * scale_cols;
    out->scales_capacity = static_cast<size_t>(rows * scale_cols);
  }
  return true;
}

absl::Status ChunkedMatmul(OpEnv& env, const kernels::ConstQuantizedTensor& a,
                           const kernels::ConstQuantizedTensor& b, const kernels::MutTensor& c) {
  const double per_row = static_cast<double>(b.rows) * static_cast<double>(a.cols);
  const int64_t unit = a.scale_layout == kernels::ScaleLayout::kSwizzled ? 128
                       : a.block == kernels::BlockShape::k16x16          ? 16
                                                                         : 1;
  int64_t chunk = static_cast<int64_t>(static_cast<double>(int64_t{1} << 27) / per_row);
  chunk = std::max<int64_t>(unit, chunk / unit * unit);
  const size_t esize = kernels::DTypeSize(c.dtype);
  for (int64_t r0 = 0; r0 < a.rows; r0 += chunk) {
    FP4Q_RETURN_IF_ERROR(env.StillWanted());
    const int64_t rows = std::min(chunk, a.rows - r0);
    kernels::ConstQuantizedTensor part;
    if (!RowSlice(a, r0, rows, &part)) {
      return env.backend().Matmul(a, b, c, env.stream());  // not sliceable: whole
    }
    kernels::MutTensor out = c;
    out.data = static_cast<uint8_t*>(c.data) + static_cast<size_t>(r0 * c.cols) * esize;
    out.rows = rows;
    out.capacity = static_cast<size_t>(rows * c.cols) * esize;
    FP4Q_RETURN_IF_ERROR(env.backend().Matmul(part, b, out, env.stream()));
  }
  return absl::OkStatus();
}

// A dense operand (Matmul's `dense`): checked as Quantize checks its input and options, with
// the one-output and no-state rules of an operand; its quantized form gets scratch buffers.
absl::Status ResolveDense(OpEnv& env, const DenseOperandIn& in, const std::string& field,
                          Operand* out) {
  const std::string f = absl::StrCat(field, ".dense");
  out->path = absl::StrCat(f, ".tensor");  // messages name the tensor's dimensions
  out->is_dense = true;
  const FieldPath fp(f);
  const FieldPath tensor = fp.Member("tensor");
  const std::string options = absl::StrCat(f, ".options");
  FP4Q_ASSIGN_OR_RETURN(DenseShape shape, CheckDenseTensor(in.tensor, tensor));
  const kernels::QuantizeOptions& o = in.options.quant;
  if (!in.options.residual_key.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        options, ".residual_key: set, but Matmul changes no state (error feedback is Quantize's "
        "or a stored weight's)"));
  }
  if (o.rowwise && o.columnwise) {
    return absl::InvalidArgumentError(absl::StrCat(
        options, ".outputs: OUTPUTS_BOTH, but an operand is one quantization: OUTPUTS_ROWWISE "
        "(Q(x)) or OUTPUTS_COLUMNWISE (Q(x^T))"));
  }
  FP4Q_RETURN_IF_ERROR(CheckQuantOptions(in.options, options));
  FP4Q_RETURN_IF_ERROR(
      kernels::ValidateQuantizeShape(shape.rows, shape.cols, o, tensor.Shaped()));
  FP4Q_ASSIGN_OR_RETURN(out->x, env.Input(in.tensor, shape, tensor));
  out->quant = o;
  const std::string shape_field = absl::StrCat(f, ".tensor.shape");
  FP4Q_ASSIGN_OR_RETURN(out->dense,
                        o.columnwise ? QuantizedOutput(o, shape.cols, shape.rows, shape_field)
                                     : QuantizedOutput(o, shape.rows, shape.cols, shape_field));
  kernels::QuantizedTensor& q = out->dense;
  FP4Q_ASSIGN_OR_RETURN(void* codes, env.Scratch(q.codes_capacity));
  FP4Q_ASSIGN_OR_RETURN(void* scales, env.Scratch(q.scales_capacity));
  FP4Q_ASSIGN_OR_RETURN(void* global, env.Scratch(kernels::kGlobalFloats * sizeof(float)));
  q.codes = static_cast<uint8_t*>(codes);
  q.scales = static_cast<uint8_t*>(scales);
  q.global = static_cast<float*>(global);
  out->q = kernels::AsConst(q);
  return absl::OkStatus();
}

// Quantizes a dense operand into its scratch (on the request's stream, before the GEMM).
absl::Status QuantizeDense(OpEnv& env, Operand& op) {
  if (!op.is_dense) return absl::OkStatus();
  const bool col = op.quant.columnwise;
  return env.backend().Quantize(op.x, op.quant, nullptr, col ? nullptr : &op.dense,
                                col ? &op.dense : nullptr, env.stream(), nullptr);
}

// `dense_ok`: Matmul's operands may be dense (Dequantize refuses them before this).
absl::Status ResolveOperand(OpEnv& env, StateStore& store, const QuantizedOperandIn& in,
                            const std::string& field, bool dense_ok, Operand* out) {
  out->field = field;
  if (!in.is_set) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, dense_ok ? ": set tensor, weight_name or dense" : ": set tensor or weight_name"));
  }
  if (in.is_dense) return ResolveDense(env, in.dense, field, out);
  if (in.is_weight) {
    const std::string f = absl::StrCat(field, ".weight_name");
    out->path = f;
    out->weight_dims = true;
    FP4Q_RETURN_IF_ERROR(CheckName(in.weight_name, f));
    out->entry = store.Find(env.Key(in.weight_name));
    if (out->entry == nullptr) {
      return absl::NotFoundError(absl::StrCat(f, ": no weight ", Quote(in.weight_name)));
    }
    if (out->entry->kind != EntryKind::kWeight) {
      return absl::InvalidArgumentError(
          absl::StrCat(f, ": ", Quote(in.weight_name), " is a residual, not a weight"));
    }
    return absl::OkStatus();
  }
  const QuantizedIn& t = in.tensor;
  const std::string f = absl::StrCat(field, ".tensor");
  out->path = f;
  kernels::ConstQuantizedTensor& q = out->q;
  q.format = t.format;
  q.block = t.block;
  q.scale_layout = t.scale_layout;
  const FieldPath fp(f);
  FP4Q_RETURN_IF_ERROR(CheckShape2D(t.shape, fp.Member("shape")));
  q.rows = t.shape[0];
  q.cols = t.shape[1];
  // Shape rules before touching any bytes.
  const FieldPath shaped = fp.Shaped();
  FP4Q_RETURN_IF_ERROR(kernels::ValidateQuantizedShape(q.format, q.block, q.scale_layout, q.rows,
                                                       q.cols, shaped));
  float s_enc = t.s_enc;
  if (q.format == kernels::Format::kMxfp4 && s_enc == 0.0f) s_enc = 1.0f;  // no global scale
  if (!std::isfinite(s_enc) || !(s_enc > 0.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat(f, ".s_enc: ", t.s_enc, " must be finite and > 0"));
  }
  // The shape is valid: only an overflow is left to refuse (its message names f).
  FP4Q_ASSIGN_OR_RETURN(q.codes_capacity, kernels::CodeBytes(q.rows, q.cols, f));
  FP4Q_ASSIGN_OR_RETURN(q.scales_capacity,
                        kernels::ScaleBytes(q.rows, q.cols, q.format, q.scale_layout, f));
  FP4Q_ASSIGN_OR_RETURN(q.codes,
                        env.InputBytes(t.codes, q.codes_capacity, fp.Member("codes"),
                                       fp.Member("codes_region")));
  FP4Q_ASSIGN_OR_RETURN(q.scales,
                        env.InputBytes(t.scales, q.scales_capacity, fp.Member("scales"),
                                       fp.Member("scales_region")));
  const float global[kernels::kGlobalFloats] = {t.global_amax, s_enc};
  FP4Q_ASSIGN_OR_RETURN(void* g, env.Scratch(sizeof(global)));
  if (env.device().host_memory) {
    std::memcpy(g, global, sizeof(global));
  } else {
    FP4Q_RETURN_IF_ERROR(env.backend().CopyFromHost(g, global, sizeof(global), env.stream()));
  }
  q.global = static_cast<const float*>(g);
  return absl::OkStatus();
}

// Locks the distinct stored weights among `ops` in name order and fills in their views.
absl::Status LockOperands(std::vector<Operand*> ops,
                          std::vector<std::unique_lock<std::mutex>>* locks) {
  std::vector<Operand*> weights;
  for (Operand* op : ops) {
    if (op->entry != nullptr) weights.push_back(op);
  }
  std::sort(weights.begin(), weights.end(),
            [](Operand* x, Operand* y) { return x->entry->name < y->entry->name; });
  StateEntry* last = nullptr;
  for (Operand* op : weights) {
    if (op->entry.get() != last) locks->emplace_back(op->entry->op_mu);
    last = op->entry.get();
    if (!op->entry->live.load()) {
      return absl::NotFoundError(
          absl::StrCat(op->field, ".weight_name: no weight ", Quote(LocalName(op->entry->name))));
    }
    op->q = kernels::AsConst(op->entry->Weight());
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Engine::RunDequantize(OpEnv& env, const DequantizeRequest& req,
                                   DequantizeResult* res) {
  if (req.input.is_dense) {
    return absl::InvalidArgumentError(
        "input.dense: Dequantize takes a quantized tensor or a weight_name (Qdq quantizes and "
        "dequantizes a dense tensor)");
  }
  Operand op;
  FP4Q_RETURN_IF_ERROR(ResolveOperand(env, *store_, req.input, "input", false, &op));
  const kernels::DType dt = req.out_dtype;
  std::vector<std::unique_lock<std::mutex>> locks;
  FP4Q_RETURN_IF_ERROR(LockOperands({&op}, &locks));
  FP4Q_ASSIGN_OR_RETURN(size_t bytes, kernels::DenseBytes(op.q.rows, op.q.cols, dt, "out"));
  FP4Q_RETURN_IF_ERROR(env.InlineFits(req.out, bytes, "out"));
  FP4Q_ASSIGN_OR_RETURN(uint8_t * out, env.Output(req.out, bytes, "out", &res->output));
  FP4Q_RETURN_IF_ERROR(env.CheckNoOverlap());
  if (op.entry != nullptr) env.AddProcessed(op.entry->sizes.codes + op.entry->sizes.scales);
  kernels::MutTensor m{out, dt, op.q.rows, op.q.cols, bytes};
  absl::Status s =
      env.Kernel("dequantize", [&] { return env.backend().Dequantize(op.q, m, env.stream()); });
  if (s.ok()) s = env.FinishOutputs();
  FP4Q_RETURN_IF_ERROR(s);
  res->output.dtype = dt;
  res->output.shape = {op.q.rows, op.q.cols};
  res->meta.processed_elements = static_cast<uint64_t>(op.q.rows * op.q.cols);
  return absl::OkStatus();
}

absl::Status Engine::RunMatmul(OpEnv& env, const MatmulRequest& req, MatmulResult* res) {
  Operand a, b;
  FP4Q_RETURN_IF_ERROR(ResolveOperand(env, *store_, req.a, "a", true, &a));
  FP4Q_RETURN_IF_ERROR(ResolveOperand(env, *store_, req.b, "b", true, &b));
  const kernels::DType dt = req.out_dtype;
  std::vector<std::unique_lock<std::mutex>> locks;
  FP4Q_RETURN_IF_ERROR(LockOperands({&a, &b}, &locks));
  for (const Operand* op : {&a, &b}) {
    if (op->entry != nullptr) env.AddProcessed(op->entry->sizes.codes + op->entry->sizes.scales);
  }
  const int64_t m = a.q.rows;
  const int64_t n = b.q.rows;
  FP4Q_ASSIGN_OR_RETURN(size_t bytes, kernels::DenseBytes(m, n, dt, "out"));
  FP4Q_RETURN_IF_ERROR(env.InlineFits(req.out, bytes, "out"));
  // The CPU backend computes every product: refuse what would take hours, before it starts.
  const double flops = static_cast<double>(m) * static_cast<double>(n) *
                       static_cast<double>(a.q.cols);
  if (env.device().host_memory && options_.cpu_max_request_flops > 0 &&
      flops > static_cast<double>(options_.cpu_max_request_flops)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "a: ", m, "x", a.q.cols, " times b: ", n, "x", b.q.cols, "^T is ", flops,
        " multiply-adds, over the CPU backend's per-request limit of ",
        options_.cpu_max_request_flops, " (fp4qd --cpu_max_request_flops); nothing was run"));
  }
  FP4Q_ASSIGN_OR_RETURN(uint8_t * out, env.Output(req.out, bytes, "out", &res->output));
  FP4Q_RETURN_IF_ERROR(env.CheckNoOverlap());
  kernels::MutTensor c{out, dt, m, n, bytes};
  const FieldPath a_root(a.path), b_root(b.path);
  FP4Q_RETURN_IF_ERROR(kernels::ValidateMatmulArgs(a.q, b.q, c, OperandPath(a_root, a),
                                                   OperandPath(b_root, b), "out"));
  absl::Status s = env.Kernel("matmul", [&] {
    FP4Q_RETURN_IF_ERROR(QuantizeDense(env, a));
    FP4Q_RETURN_IF_ERROR(QuantizeDense(env, b));
    if (!env.device().host_memory) return env.backend().Matmul(a.q, b.q, c, env.stream());
    // On the CPU: row chunks of A (~2^27 multiply-adds each), the deadline checked between them.
    return ChunkedMatmul(env, a.q, b.q, c);
  });
  if (s.ok()) s = env.FinishOutputs();
  FP4Q_RETURN_IF_ERROR(s);
  res->output.dtype = dt;
  res->output.shape = {m, n};
  res->meta.processed_elements = static_cast<uint64_t>(m * n);
  return absl::OkStatus();
}
}  // namespace fp4q::server
