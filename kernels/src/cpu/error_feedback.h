// Error feedback (NUMERICS 5) and the stored-weight update (DESIGN.md "UpdateWeight") on host
// matrices. Arguments are validated by the caller.
#ifndef FP4Q_KERNELS_CPU_ERROR_FEEDBACK_H_
#define FP4Q_KERNELS_CPU_ERROR_FEEDBACK_H_

#include "cpu/host_tensor.h"
#include "fp4q/kernels/types.h"

namespace fp4q::kernels::cpu {

// One step: v = RN(x + r); q = row-wise quantization of v under `options` (amax from v unless
// the caller gives one); r <- RN(v - DQ(q)). Returns q.
HostQuantized QuantizeWithFeedback(const Matrix& x, const QuantizeOptions& options,
                                   Matrix* residual);

// d = DQ(w); x = RN(d - RN(lr * u)) (kGradient) or RN(d + u) (kDelta);
// v = residual ? RN(x + r) : x; w <- Q(v) (amax from v); r <- RN(v - DQ(w)).
// Returns the new w; *dequantized (when non-null) receives DQ(new w).
HostQuantized UpdateWeightHost(const HostQuantized& w, const Matrix& update, float lr,
                               UpdateKind kind, const QuantizeOptions& options, Matrix* residual,
                               Matrix* dequantized);

}  // namespace fp4q::kernels::cpu

#endif  // FP4Q_KERNELS_CPU_ERROR_FEEDBACK_H_
