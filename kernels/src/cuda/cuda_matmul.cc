// The FP4 GEMM C = A * B^T of the CUDA backend, dispatched by compute capability and M:
//
//   Blackwell (cc >= 10): cuBLASLt's native block-scaled FP4 (CUDA_R_4F_E2M1 operands,
//     VEC16_UE4M3 / VEC32_UE8M0 scales in the swizzled layout, S_dec_a * S_dec_b in alpha).
//     NOT RUN: this repository has only been run on Hopper; when cuBLASLt offers no algorithm the
//     call falls through to the emulation below.
//   M <= kSmallMMax = 16 (decode): matmul_small_m.cu reads B's 4-bit codes and dequantizes them
//     in registers (bf16 tensor-core MMAs, f32 accumulation, K slices summed in a fixed order).
//   M <= kWgmmaPathMax = 256 on Hopper (cc 9.0): matmul_wgmma.cu, the same decode feeding the
//     register operand of warpgroup MMAs, A streamed through shared memory as their other one.
//   M <= kMidMMax = 64 elsewhere: matmul_mid_m.cu, the same decode feeding more mma.sync MMAs
//     per weight, A streamed through shared memory.
//   otherwise: A and B dequantized exactly to bf16 (e2m1 * sf fits in bf16), cuBLASLt bf16 GEMM
//     with f32 accumulation and S_dec_a * S_dec_b in alpha.
//
// Tolerance against the CPU reference (exact f64 sum): the products are exact; the f32
// accumulation and the rounding of alpha and of the result give a relative Frobenius error of a
// few 1e-7 for f32 output at K = 8192 (tested < 1e-5); bf16 output adds one bf16 rounding (2^-9).
// MXFP4 operands whose dequantized values leave bf16's range (scale bytes above 254 - 3) are not
// representable on the emulated paths.
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

struct StagedOperand {
  GemmOperand op;
  int64_t scale_cols = 0;
};

absl::StatusOr<StagedOperand> StageOperand(Staging& st, const ConstQuantizedTensor& t) {
  FP4Q_ASSIGN_OR_RETURN(const size_t code_bytes, CodeBytes(t.rows, t.cols, "codes"));
  FP4Q_ASSIGN_OR_RETURN(const size_t scale_bytes,
                        ScaleBytes(t.rows, t.cols, t.format, t.scale_layout, "scales"));
  StagedOperand s;
  s.op.rows = t.rows;
  s.op.cols = t.cols;
  s.op.swizzled = t.scale_layout == ScaleLayout::kSwizzled;
  s.scale_cols = t.format == Format::kMxfp4 ? t.cols / 32 : t.cols / 16;
  FP4Q_ASSIGN_OR_RETURN(s.op.codes, st.UseAs<const uint8_t>(t.codes, code_bytes, true, false));
  FP4Q_ASSIGN_OR_RETURN(s.op.scales, st.UseAs<const uint8_t>(t.scales, scale_bytes, true, false));
  FP4Q_ASSIGN_OR_RETURN(s.op.global,
                        st.UseAs<const float>(t.global, kGlobalFloats * sizeof(float), true, false));
  return s;
}

// Device floats [alpha, 0] for cuBLASLt (pointer mode device).
absl::StatusOr<float*> AlphaBeta(Staging& st, const GemmOperand& a, const GemmOperand& b, bool mx,
                                 cudaStream_t s) {
  FP4Q_ASSIGN_OR_RETURN(void* p, st.Scratch(2 * sizeof(float)));
  float* ab = static_cast<float*>(p);
  FP4Q_RETURN_IF_ERROR(FP4Q_CUDA_STATUS(cudaMemsetAsync(ab + 1, 0, sizeof(float), s)));
  FP4Q_RETURN_IF_ERROR(FP4Q_CUDA_STATUS(LaunchGemmAlpha(a.global, b.global, mx, ab, s)));
  return ab;
}

// The operand's scales in the swizzled layout (converted into scratch when plain).
absl::StatusOr<const uint8_t*> SwizzledScales(Staging& st, const StagedOperand& o,
                                              cudaStream_t s) {
  if (o.op.swizzled) return o.op.scales;
  const size_t bytes = static_cast<size_t>((o.op.rows + 127) / 128 * 128 *
                                           ((o.scale_cols + 3) / 4 * 4));
  FP4Q_ASSIGN_OR_RETURN(void* p, st.Scratch(bytes));
  FP4Q_RETURN_IF_ERROR(FP4Q_CUDA_STATUS(LaunchSwizzleScales(
      o.op.scales, o.op.rows, o.scale_cols, static_cast<uint8_t*>(p), s)));
  return static_cast<const uint8_t*>(p);
}

absl::StatusOr<void*> DequantizeBf16(Staging& st, const GemmOperand& o, bool mx, cudaStream_t s) {
  FP4Q_ASSIGN_OR_RETURN(void* out, st.Scratch(static_cast<size_t>(o.rows * o.cols * 2)));
  DequantParams p;
  p.rows = o.rows;
  p.cols = o.cols;
  p.mx = mx;
  p.codes = o.codes;
  p.scales = o.scales;
  p.swizzled = o.swizzled;
  p.global = o.global;
  p.out = out;
  p.out_dtype = kBF16;
  p.raw = true;
  FP4Q_RETURN_IF_ERROR(FP4Q_CUDA_STATUS(LaunchDequantize(p, s)));
  return out;
}

}  // namespace

absl::Status CudaBackend::MatmulImpl(const ConstQuantizedTensor& a, const ConstQuantizedTensor& b,
                                     const MutTensor& c, cudaStream_t s) {
  const int64_t m = a.rows;
  const int64_t n = b.rows;
  const int64_t k = a.cols;
  const bool mx = a.format == Format::kMxfp4;
  FP4Q_ASSIGN_OR_RETURN(const size_t c_bytes, DenseBytes(c.rows, c.cols, c.dtype, "c"));
  Staging st(s);
  FP4Q_ASSIGN_OR_RETURN(const StagedOperand sa, StageOperand(st, a));
  FP4Q_ASSIGN_OR_RETURN(const StagedOperand sb, StageOperand(st, b));
  FP4Q_ASSIGN_OR_RETURN(void* cp, st.Use(c.data, c_bytes, false, true));
  const cudaDataType_t c_type = c.dtype == DType::kF32 ? CUDA_R_32F : CUDA_R_16BF;

  if (info_.cc_major >= 10) {
    FP4Q_ASSIGN_OR_RETURN(const uint8_t* a_sw, SwizzledScales(st, sa, s));
    FP4Q_ASSIGN_OR_RETURN(const uint8_t* b_sw, SwizzledScales(st, sb, s));
    FP4Q_ASSIGN_OR_RETURN(float* ab, AlphaBeta(st, sa.op, sb.op, mx, s));
    const absl::Status native = blas_->MatmulFp4(m, n, k, mx, sa.op.codes, a_sw, sb.op.codes,
                                                 b_sw, cp, c_type, ab, s);
    if (native.ok()) return st.Finish();
    if (!absl::IsUnimplemented(native)) return native;
  }

  const bool hopper = info_.cc_major == 9 && info_.cc_minor == 0;
  const bool wgmma = hopper && m > kSmallMMax && m <= kWgmmaPathMax;
  if ((m <= kMidMMax || wgmma) && k <= (int64_t{1} << 26)) {
    const bool small = m <= kSmallMMax;
    SmallMParams p;
    p.mx = mx;
    p.a = sa.op;
    p.b = sb.op;
    p.c = cp;
    p.c_dtype = DtypeCode(c.dtype);
    p.pdl = info_.cc_major >= 9;
    if (small) {
      FP4Q_ASSIGN_OR_RETURN(p.zeroed_tickets, SplitTickets(s, SmallMTickets(m, n, k)));
    }
    const size_t ws = small   ? SmallMWorkspaceBytes(m, n, k)
                      : wgmma ? WgmmaWorkspaceBytes(m, n, k)
                              : MidMWorkspaceBytes(m, n, k);
    if (ws > 0) {
      FP4Q_ASSIGN_OR_RETURN(p.workspace, st.Scratch(ws));
    }
    FP4Q_RETURN_IF_ERROR(FP4Q_CUDA_STATUS(small   ? LaunchSmallMMatmul(p, s)
                                          : wgmma ? LaunchWgmmaMatmul(p, s)
                                                  : LaunchMidMMatmul(p, s)));
    return st.Finish();
  }

  FP4Q_ASSIGN_OR_RETURN(void* abf, DequantizeBf16(st, sa.op, mx, s));
  FP4Q_ASSIGN_OR_RETURN(void* bbf, DequantizeBf16(st, sb.op, mx, s));
  FP4Q_ASSIGN_OR_RETURN(float* ab, AlphaBeta(st, sa.op, sb.op, mx, s));
  FP4Q_RETURN_IF_ERROR(blas_->MatmulBf16(m, n, k, abf, bbf, cp, c_type, ab, s));
  return st.Finish();
}

}  // namespace fp4q::kernels::cuda
