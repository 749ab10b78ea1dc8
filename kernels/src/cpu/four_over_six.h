// Four-over-six block-scale selection (NUMERICS 7): per block (1x16) or tile (16x16), the
// map-to-6 and map-to-4 candidates are both tried and the one with the smaller error kept
// (ties keep map-to-6).
#ifndef FP4Q_KERNELS_CPU_FOUR_OVER_SIX_H_
#define FP4Q_KERNELS_CPU_FOUR_OVER_SIX_H_

#include <cstdint>

#include "cpu/host_tensor.h"

namespace fp4q::kernels::cpu {

struct FourOverSixChoice {
  uint8_t sf6 = 0;    // map-to-6 candidate scale byte
  uint8_t sf4 = 0;    // map-to-4 candidate scale byte
  float err6 = 0.0f;  // the candidates' errors as NUMERICS 7 defines them
  float err4 = 0.0f;
  bool map_to_4 = false;
  uint8_t chosen() const { return map_to_4 ? sf4 : sf6; }
};

// The choice for the block of m with rows [row0, row0 + height) (height 1 or 16) and columns
// [col0, col0 + 16). `amax` is the global amax, s_enc/s_dec the four-over-six global scales
// (GlobalEncodeScale(emax * 6, amax) and its decode scale), `mse` selects the MSE criterion.
FourOverSixChoice ChooseFourOverSix(const Matrix& m, int64_t row0, int64_t height, int64_t col0,
                                    float amax, float s_enc, float s_dec, float emax, bool mse);

}  // namespace fp4q::kernels::cpu

#endif  // FP4Q_KERNELS_CPU_FOUR_OVER_SIX_H_
