// The quantization pipeline of the CPU reference backend, on host matrices:
//   output matrix M = x (row-wise) or x^T (column-wise)
//   RHT (optional) along M's rows, rounded to the input dtype (NUMERICS 6)
//   global amax = caller's, or max |M| (NaN ignored)
//   NVFP4 (NUMERICS 2, 4, 7) or MXFP4 (NUMERICS 8)
// and dequantization. Arguments are validated by the caller (validate.h).
#ifndef FP4Q_KERNELS_CPU_QUANTIZE_H_
#define FP4Q_KERNELS_CPU_QUANTIZE_H_

#include "cpu/host_tensor.h"
#include "fp4q/kernels/types.h"

namespace fp4q::kernels::cpu {

// The quantization of x (columnwise = false) or of x^T (columnwise = true) under `options`;
// `input_dtype` is the dtype x arrived in (bf16: the RHT output is rounded to bf16).
HostQuantized QuantizeMatrix(const Matrix& x, DType input_dtype, const QuantizeOptions& options,
                             bool columnwise);

// DQ of every element: NVFP4 RN(RN(e2m1 * sf) * S_dec) with S_dec = RN(1 / s_enc); MXFP4
// RN(e2m1 * 2^(b - 127)) (the global record is not used). NaN scale bytes give NaN.
Matrix DequantizeHost(const HostQuantized& q);

}  // namespace fp4q::kernels::cpu

#endif  // FP4Q_KERNELS_CPU_QUANTIZE_H_
