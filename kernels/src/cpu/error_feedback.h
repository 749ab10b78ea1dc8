// Error feedback (NUMERICS 5) on host matrices and the check of a guarded error-feedback step.
// Arguments are validated by the caller. (The stored-weight update is the step: cpu/step.h.)
#ifndef FP4Q_KERNELS_CPU_ERROR_FEEDBACK_H_
#define FP4Q_KERNELS_CPU_ERROR_FEEDBACK_H_

#include "cpu/host_tensor.h"
#include "fp4q/kernels/step.h"
#include "fp4q/kernels/types.h"

namespace fp4q::kernels::cpu {

// One step: v = RN(x + r); q = row-wise quantization of v under `options` (amax from v unless
// the caller gives one); r <- RN(v - DQ(q)). Returns q.
HostQuantized QuantizeWithFeedback(const Matrix& x, const QuantizeOptions& options,
                                   Matrix* residual);

// The check of a state-changing error-feedback step (Backend::Quantize/Qdq with a guard), in
// this order: every x finite (kNonFiniteUpdate, kUpdateSum), every v = RN(x + r) finite
// (kNonFiniteResult, kWeight), the largest value the quantization can dequantize to below 2^127
// (below the largest bf16 when `bf16_out`; kOutOfRange, kDequantized, with that bound). NVFP4:
// 2688 * S_dec with the S_enc of the amax used (options' or max |v|); MXFP4: 6 * 2^(b - 127)
// with b the scale byte of that amax. The first offending index is the smallest.
FiniteGuard FeedbackGuard(const Matrix& x, const Matrix& residual, const QuantizeOptions& options,
                          bool bf16_out);

}  // namespace fp4q::kernels::cpu

#endif  // FP4Q_KERNELS_CPU_ERROR_FEEDBACK_H_
