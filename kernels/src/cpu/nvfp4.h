// NVFP4 quantization on the host (NUMERICS 2, 4, 7): global and block scales and the
// quantization of a whole f32 matrix along its rows, in 1x16 or 16x16 blocks.
#ifndef FP4Q_KERNELS_CPU_NVFP4_H_
#define FP4Q_KERNELS_CPU_NVFP4_H_

#include <cstddef>
#include <cstdint>

#include "cpu/host_tensor.h"
#include "fp4q/kernels/types.h"

namespace fp4q::kernels::cpu {

// How elements are rounded to E2M1 (NUMERICS 1 or 4).
struct ElementRounding {
  Rounding rounding = Rounding::kNearest;
  uint64_t seed = 0;
  uint64_t step = 0;
};

// G1: max |v_i| over n values, NaN ignored (0 when every value is NaN).
float AbsMax(const float* v, size_t n);

// G2 with a general numerator: S_enc = min(RN(numerator / amax), FLT_MAX), and 1 when
// amax == 0, amax is Inf, or the quotient is 0. numerator = 2688 (= 448 * 6) for map-to-6,
// emax * 6 for four-over-six.
float GlobalEncodeScale(float numerator, float amax);
// G3: RN(1 / S_enc).
float GlobalDecodeScale(float s_enc);

// B2-B3: sf = E4M3(RN(bamax * RN(S_enc * c6))).
uint8_t Nvfp4BlockScale(float bamax, float s_enc);
// B4: min(RN(1 / RN(sf * S_dec)), FLT_MAX); 1/0 gives FLT_MAX.
float BlockInverseScale(float sf, float s_dec);

// Quantizes m [rows, cols] along its rows (cols a multiple of 16; rows a multiple of 16 for
// 16x16) with global amax `amax`. `selection` kMapTo6 uses NUMERICS 2; the four-over-six
// modes use NUMERICS 7 with `emax` (256 or 448). The result's s_enc is the S_enc used.
HostQuantized QuantizeNvfp4(const Matrix& m, BlockShape block, float amax, ScaleSelection selection,
                            float emax, const ElementRounding& rounding);

}  // namespace fp4q::kernels::cpu

#endif  // FP4Q_KERNELS_CPU_NVFP4_H_
