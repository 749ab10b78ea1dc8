// MXFP4 quantization on the host (NUMERICS 8 with DESIGN.md "Numerics decisions"): blocks of
// 32 along a row, an E8M0 scale byte per block, no global scale.
#ifndef FP4Q_KERNELS_CPU_MXFP4_H_
#define FP4Q_KERNELS_CPU_MXFP4_H_

#include <cstdint>

#include "cpu/host_tensor.h"
#include "cpu/nvfp4.h"
#include "fp4q/kernels/types.h"

namespace fp4q::kernels::cpu {

// The E8M0 scale byte of a block with max |x| = bamax (NaN ignored by the caller).
// RCEIL: p = RN(bamax * c6); exponent = -127 if p == 0, 128 if p is Inf, else floor(log2 p)
//        plus 1 unless p is a power of two. FLOOR: floor(log2 bamax) - 2 (b = 0 for 0).
// The exponent is clamped to [-127, 127]; b = exponent + 127.
uint8_t MxScaleByte(float bamax, MxScaleRule rule);

// Quantizes m [rows, cols] (cols a multiple of 32) along its rows: y = RN(x * 2^(127 - b)),
// then E2M1 (or SR). The result's global record is [amax, 1].
HostQuantized QuantizeMxfp4(const Matrix& m, float amax, MxScaleRule rule,
                            const ElementRounding& rounding);

}  // namespace fp4q::kernels::cpu

#endif  // FP4Q_KERNELS_CPU_MXFP4_H_
