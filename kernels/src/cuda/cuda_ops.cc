// The quantizing entry points of the CUDA backend: Quantize and QDQ, both with optional error
// feedback. Each plans its passes over the data:
//   - amax given (or MXFP4, whose global amax is only recorded): one pass;
//   - amax computed: an amax pass (the plain reduction, or the quantize kernel in amax-only mode
//     when the amax is of a derived tensor: x + r, RHT(x)), then one pass; small row-wise
//     tensors do both in one launch (LaunchQuantizeFusedAmax: cooperative, or for the smallest
//     bf16 tensors an ordinary one in which every CTA reduces the whole tensor);
//   - guarded (a FiniteGuard, error feedback): the amax-only pass always runs (it is the amax
//     pass when the amax is computed, else a check-only pass) and also finds the first
//     non-finite x and v; one thread decides the guard; the writing pass (and the swizzle
//     padding) read the guard's outcome on the device and write nothing when it failed. The
//     stored-weight update is the optimizer step (cuda_step.cc).
// Row-wise-only requests run the row kernels (LaunchQuantizeRows: quantize_lanes.cu where it
// applies, else quantize_rows.cu); column-wise requests the tile kernel (quantize_tile.cu), which
// reads x once for both outputs.
#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "cuda/cuda_backend.h"
#include "cuda/cuda_status.h"
#include "cuda/kernel_codes_host.h"
#include "cuda/launch.h"
#include "cuda/staging.h"
#include "fp4q/common/status_macros.h"

namespace fp4q::kernels::cuda {
namespace {

QuantOptions MakeQuantOptions(const QuantizeOptions& o) {
  QuantOptions q;
  q.fmt = FmtCode(o.format, o.block);
  q.sr = o.rounding == Rounding::kStochastic;
  q.sr_keys = PhiloxKeySchedule(o.seed);
  q.step = o.step;
  q.rht = o.rht != RhtMode::kOff;
  q.rht_signs = q.rht ? RhtSignMask(RhtCode(o.rht), o.rht_seed) : 0u;
  q.scale_sel = SelCode(o.scale_selection);
  q.emax = o.four_over_six_emax;
  q.mx_rule = MxRuleCode(o.mx_rule);
  return q;
}

// An output quantized tensor of shape [rows, cols] staged for the kernels. `read_back`: a
// stand-in starts as a copy of the caller's bytes (a guarded call may write nothing, and the
// stand-in is copied back all the same).
absl::StatusOr<QOut> StageOut(Staging& st, const QuantizedTensor& t, int64_t rows, int64_t cols,
                              bool read_back) {
  FP4Q_ASSIGN_OR_RETURN(const size_t code_bytes, CodeBytes(rows, cols, "codes"));
  FP4Q_ASSIGN_OR_RETURN(const size_t scale_bytes,
                        ScaleBytes(rows, cols, t.format, t.scale_layout, "scales"));
  QOut o;
  FP4Q_ASSIGN_OR_RETURN(o.codes, st.UseAs<uint8_t>(t.codes, code_bytes, read_back, true));
  FP4Q_ASSIGN_OR_RETURN(o.scales, st.UseAs<uint8_t>(t.scales, scale_bytes, read_back, true));
  FP4Q_ASSIGN_OR_RETURN(o.global,
                        st.UseAs<float>(t.global, kGlobalFloats * sizeof(float), read_back, true));
  o.swizzled = t.scale_layout == ScaleLayout::kSwizzled;
  return o;
}

absl::Status ZeroPadding(const QOut& o, int64_t rows, int64_t cols, int fmt, cudaStream_t s,
                         const int32_t* gate = nullptr) {
  if (!o.swizzled) return absl::OkStatus();
  const int64_t scale_cols = fmt == kFmtMx ? cols / 32 : cols / 16;
  return FP4Q_CUDA_STATUS(LaunchZeroSwizzlePadding(o.scales, rows, scale_cols, s, gate, 0));
}

static_assert(sizeof(GuardPod) == sizeof(FiniteGuard), "FiniteGuard layout");
static_assert(offsetof(GuardPod, index) == offsetof(FiniteGuard, index), "FiniteGuard layout");
static_assert(offsetof(GuardPod, amax) == offsetof(FiniteGuard, amax), "FiniteGuard layout");
static_assert(offsetof(GuardPod, bound) == offsetof(FiniteGuard, bound), "FiniteGuard layout");

// The guarded amax-only pass and the guard's decision. `p` is the row pass (residual set);
// returns the device amax the writing pass uses. The writing pass must set p.gate to the guard.
absl::StatusOr<float*> RunGuard(Staging& st, const RowParams& p, const QuantizeOptions& options,
                                bool bf16_out, GuardPod* guard, float* zero_on_pass,
                                cudaStream_t s) {
  // scratch: [0] max |v|, [1] the amax to use, [2..3] padding, then the two first indices.
  FP4Q_ASSIGN_OR_RETURN(void* scratch_v, st.Scratch(32));
  float* scratch = static_cast<float*>(scratch_v);
  uint64_t* first = reinterpret_cast<uint64_t*>(static_cast<uint8_t*>(scratch_v) + 16);
  FP4Q_RETURN_IF_ERROR(FP4Q_CUDA_STATUS(cudaMemsetAsync(scratch, 0, 16, s)));
  FP4Q_RETURN_IF_ERROR(FP4Q_CUDA_STATUS(cudaMemsetAsync(first, 0xFF, 16, s)));
  RowParams a = p;
  a.amax_out = scratch;
  a.first_bad_x = first;
  a.first_bad_v = first + 1;
  FP4Q_RETURN_IF_ERROR(FP4Q_CUDA_STATUS(LaunchQuantizeRows(a, s)));
  GuardParams g;
  g.x = p.x;
  g.x_dtype = p.x_dtype;
  g.residual = p.residual;
  g.first_bad_x = first;
  g.first_bad_v = first + 1;
  g.amax_in = scratch;
  g.has_amax = options.has_amax;
  g.amax_value = options.amax;
  g.fmt = p.q.fmt;
  g.scale_sel = p.q.scale_sel;
  g.emax = p.q.emax;
  g.mx_rule = p.q.mx_rule;
  g.bf16_out = bf16_out;
  g.guard = guard;
  g.amax_out = scratch + 1;
  g.zero_on_pass = zero_on_pass;
  FP4Q_RETURN_IF_ERROR(FP4Q_CUDA_STATUS(LaunchFiniteGuard(g, s)));
  return scratch + 1;
}

absl::Status ZeroFloat(float* p, cudaStream_t s) {
  return FP4Q_CUDA_STATUS(cudaMemsetAsync(p, 0, sizeof(float), s));
}

}  // namespace

absl::Status CudaBackend::QuantizeImpl(const ConstTensor& x, const QuantizeOptions& options,
                                       float* residual, const QuantizedTensor* rowwise,
                                       const QuantizedTensor* columnwise, FiniteGuard* guard,
                                       cudaStream_t s) {
  const bool want_row = rowwise != nullptr;
  const bool want_col = columnwise != nullptr;
  if (residual != nullptr && (want_col || !want_row)) {
    return absl::InvalidArgumentError("residual: error feedback needs the row-wise output only");
  }
  FP4Q_ASSIGN_OR_RETURN(const size_t x_bytes, DenseBytes(x.rows, x.cols, x.dtype, "x"));
  Staging st(s);
  FP4Q_ASSIGN_OR_RETURN(const void* xp, st.Use(x.data, x_bytes, true, false));
  FP4Q_ASSIGN_OR_RETURN(float* res,
                        st.UseAs<float>(residual, x_bytes / DTypeSize(x.dtype) * 4, true, true));
  const QuantOptions q = MakeQuantOptions(options);
  const bool mx = q.fmt == kFmtMx;
  QOut row, col;
  const bool guarded = guard != nullptr && res != nullptr;
  if (want_row) {
    FP4Q_ASSIGN_OR_RETURN(row, StageOut(st, *rowwise, x.rows, x.cols, guarded));
  }
  if (want_col) {
    FP4Q_ASSIGN_OR_RETURN(col, StageOut(st, *columnwise, x.cols, x.rows, false));
  }

  if (!want_col) {
    RowParams p;
    p.q = q;
    p.rows = x.rows;
    p.cols = x.cols;
    p.x = xp;
    p.x_dtype = DtypeCode(x.dtype);
    p.residual = res;
    p.tuning = tuning_;
    if (guarded) {
      FP4Q_ASSIGN_OR_RETURN(GuardPod * g,
                            st.UseAs<GuardPod>(guard, sizeof(GuardPod), false, true));
      RowParams a = p;
      a.out = row;
      FP4Q_ASSIGN_OR_RETURN(float* amax, RunGuard(st, a, options, false, g,
                                                   mx ? row.global : nullptr, s));
      if (!mx) {
        row.amax_ptr = amax;
        row.write_amax = true;
      }
      p.out = row;
      p.gate = &g->outcome;
      FP4Q_RETURN_IF_ERROR(FP4Q_CUDA_STATUS(LaunchQuantizeRows(p, s)));
      FP4Q_RETURN_IF_ERROR(ZeroPadding(row, x.rows, x.cols, q.fmt, s, &g->outcome));
      return st.Finish();
    }
    if (mx) {
      FP4Q_RETURN_IF_ERROR(ZeroFloat(row.global, s));  // atomicMax target
    } else if (options.has_amax) {
      row.amax_value = options.amax;
      row.write_amax = true;
    } else if (res == nullptr && FusedAmaxFits(RowPassOf(p), p.tuning)) {  // one launch
      row.write_amax = true;
      p.out = row;
      FP4Q_RETURN_IF_ERROR(FP4Q_CUDA_STATUS(LaunchQuantizeFusedAmax(p, row.global, s)));
      FP4Q_RETURN_IF_ERROR(ZeroPadding(row, x.rows, x.cols, q.fmt, s));
      return st.Finish();
    } else {
      if (res != nullptr || q.rht) {
        FP4Q_RETURN_IF_ERROR(ZeroFloat(row.global, s));
        RowParams a = p;
        a.amax_out = row.global;
        FP4Q_RETURN_IF_ERROR(FP4Q_CUDA_STATUS(LaunchQuantizeRows(a, s)));
      } else {  // LaunchAmax zeroes its output itself
        FP4Q_RETURN_IF_ERROR(FP4Q_CUDA_STATUS(
            LaunchAmax(xp, p.x_dtype, x.rows * x.cols, row.global, nullptr, s)));
      }
      row.amax_ptr = row.global;
    }
    p.out = row;
    FP4Q_RETURN_IF_ERROR(FP4Q_CUDA_STATUS(LaunchQuantizeRows(p, s)));
  } else {
    TileParams p;
    p.q = q;
    p.rows = x.rows;
    p.cols = x.cols;
    p.x = xp;
    p.x_dtype = DtypeCode(x.dtype);
    p.tuning = tuning_;
    if (mx) {
      if (want_row) FP4Q_RETURN_IF_ERROR(ZeroFloat(row.global, s));
      FP4Q_RETURN_IF_ERROR(ZeroFloat(col.global, s));
    } else if (options.has_amax) {
      row.amax_value = col.amax_value = options.amax;
      row.write_amax = col.write_amax = true;
    } else if (q.rht) {
      // Each output has its own transform and its own amax.
      if (want_row) FP4Q_RETURN_IF_ERROR(ZeroFloat(row.global, s));
      FP4Q_RETURN_IF_ERROR(ZeroFloat(col.global, s));
      TileParams a = p;
      a.row = row;
      a.col = col;
      a.amax_only = true;
      a.row_amax_out = want_row ? row.global : nullptr;
      a.col_amax_out = col.global;
      FP4Q_RETURN_IF_ERROR(FP4Q_CUDA_STATUS(LaunchQuantizeTile(a, s)));
      row.amax_ptr = row.global;
      col.amax_ptr = col.global;
    } else {
      float* target = want_row ? row.global : col.global;
      FP4Q_RETURN_IF_ERROR(
          FP4Q_CUDA_STATUS(LaunchAmax(xp, p.x_dtype, x.rows * x.cols, target, nullptr, s)));
      row.amax_ptr = col.amax_ptr = target;
      row.write_amax = want_row && row.global != target;
      col.write_amax = col.global != target;
    }
    p.row = row;
    p.col = col;
    FP4Q_RETURN_IF_ERROR(FP4Q_CUDA_STATUS(LaunchQuantizeTile(p, s)));
  }
  if (want_row) FP4Q_RETURN_IF_ERROR(ZeroPadding(row, x.rows, x.cols, q.fmt, s));
  if (want_col) FP4Q_RETURN_IF_ERROR(ZeroPadding(col, x.cols, x.rows, q.fmt, s));
  return st.Finish();
}

absl::Status CudaBackend::QdqImpl(const ConstTensor& x, const QuantizeOptions& options,
                                  float* residual, const MutTensor& out, FiniteGuard* guard,
                                  cudaStream_t s) {
  FP4Q_ASSIGN_OR_RETURN(const size_t x_bytes, DenseBytes(x.rows, x.cols, x.dtype, "x"));
  FP4Q_ASSIGN_OR_RETURN(const size_t out_bytes, DenseBytes(out.rows, out.cols, out.dtype, "out"));
  Staging st(s);
  RowParams p;
  p.q = MakeQuantOptions(options);
  p.rows = x.rows;
  p.cols = x.cols;
  p.tuning = tuning_;
  FP4Q_ASSIGN_OR_RETURN(p.x, st.Use(x.data, x_bytes, true, false));
  p.x_dtype = DtypeCode(x.dtype);
  FP4Q_ASSIGN_OR_RETURN(p.residual, st.UseAs<float>(residual, x.rows * x.cols * 4, true, true));
  const bool guarded = guard != nullptr && p.residual != nullptr;
  // A guarded call may write nothing: a stand-in for `out` starts as a copy of it.
  FP4Q_ASSIGN_OR_RETURN(p.dq, st.Use(out.data, out_bytes, guarded, true));
  p.dq_dtype = DtypeCode(out.dtype);
  if (guarded) {
    FP4Q_ASSIGN_OR_RETURN(GuardPod * g, st.UseAs<GuardPod>(guard, sizeof(GuardPod), false, true));
    FP4Q_ASSIGN_OR_RETURN(float* amax,
                          RunGuard(st, p, options, out.dtype == DType::kBF16, g, nullptr, s));
    p.out.amax_ptr = amax;
    p.gate = &g->outcome;
  } else if (options.has_amax) {
    p.out.amax_value = options.amax;
  } else if (p.q.fmt != kFmtMx) {
    FP4Q_ASSIGN_OR_RETURN(void* scratch, st.Scratch(sizeof(float)));
    float* amax = static_cast<float*>(scratch);
    if (p.residual != nullptr || p.q.rht) {
      FP4Q_RETURN_IF_ERROR(ZeroFloat(amax, s));
      RowParams a = p;
      a.amax_out = amax;
      FP4Q_RETURN_IF_ERROR(FP4Q_CUDA_STATUS(LaunchQuantizeRows(a, s)));
    } else {
      FP4Q_RETURN_IF_ERROR(
          FP4Q_CUDA_STATUS(LaunchAmax(p.x, p.x_dtype, x.rows * x.cols, amax, nullptr, s)));
    }
    p.out.amax_ptr = amax;
  }
  FP4Q_RETURN_IF_ERROR(FP4Q_CUDA_STATUS(LaunchQuantizeRows(p, s)));
  return st.Finish();
}

}  // namespace fp4q::kernels::cuda
