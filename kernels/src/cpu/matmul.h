// The FP4 matmul reference (NUMERICS 9, DESIGN.md "Matmul"): C = A * B^T from quantized
// operands A [M, K] and B [N, K] of the same format. Exact products (e2m1 * sf_a) *
// (e2m1 * sf_b) are summed in f64 in k order, multiplied by S_dec_a then S_dec_b in f64, and
// rounded once to c's dtype (f64 -> bf16 directly). NVFP4: S_dec = RN_f32(1 / s_enc); MXFP4:
// sf = 2^(b - 127) and S_dec = 1.
#ifndef FP4Q_KERNELS_CPU_MATMUL_H_
#define FP4Q_KERNELS_CPU_MATMUL_H_

#include "cpu/host_tensor.h"
#include "fp4q/kernels/types.h"

namespace fp4q::kernels::cpu {

// Writes c [a.rows, b.rows] (validated by the caller).
void MatmulReference(const HostQuantized& a, const HostQuantized& b, const MutTensor& c);

}  // namespace fp4q::kernels::cpu

#endif  // FP4Q_KERNELS_CPU_MATMUL_H_
