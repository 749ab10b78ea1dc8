// The 16-point random Hadamard transform of NUMERICS 6.
//
// Forward, per aligned group of 16 values v along a row:
//   w_i = s_i * v_i;  butterfly stages of width 1, 2, 4, 8: (a, b) -> (a + b, a - b) in f32;
//   v'_j = RN(0.25 * w'_j)
// which is v'_j = 0.25 * sum_i s_i H[i][j] v_i with H[i][j] = (-1)^popcount(i & j).
// Inverse (the transpose): butterfly on v' in f32, then * 0.25, then * s_i. Both orders are
// the CUDA backend's too. Sign flips and * 0.25 are exact (barring underflow).
#ifndef FP4Q_KERNELS_CPU_RHT_H_
#define FP4Q_KERNELS_CPU_RHT_H_

#include <cstdint>
#include <vector>

#include "fp4q/kernels/types.h"

namespace fp4q::kernels::cpu {

// TransformerEngine's default signs: bit i set where s_i = -1.
inline constexpr uint16_t kDefaultRhtSigns = 0xD7E8;

// The sign mask of a mode: kDefaultSigns -> 0xD7E8; kSeeded -> low 16 bits of word 0 of
// Philox4x32-10(key = (lo32, hi32) of rht_seed, counter = 0); kOff -> 0 (unused).
uint16_t RhtSignMask(RhtMode mode, uint64_t rht_seed);

// One group of 16, in place.
void RhtForward16(float* v, uint16_t signs);
void RhtInverse16(float* v, uint16_t signs);

// Every aligned group of 16 along the rows of a row-major [rows, cols] f32 matrix (cols a
// multiple of 16), in place; then, when `round_to` is kBF16, every value is rounded to bf16
// (and kept as the f32 of that bf16).
void RhtRows(std::vector<float>* m, int64_t rows, int64_t cols, uint16_t signs, bool inverse,
             DType round_to);

}  // namespace fp4q::kernels::cpu

#endif  // FP4Q_KERNELS_CPU_RHT_H_
