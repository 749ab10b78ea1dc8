// Four-over-six block-scale selection; see four_over_six.h. Operation order as NUMERICS 7.
#include "cpu/four_over_six.h"

#include <algorithm>
#include <cmath>

#include "cpu/formats.h"
#include "cpu/nvfp4.h"

namespace fp4q::kernels::cpu {
namespace {

// The error of one row of 16 elements quantized with scale byte `sf_byte`.
float RowError(const Matrix& m, int64_t r, int64_t col0, uint8_t sf_byte, float amax, float s_dec,
               float emax, bool mse) {
  const float sf = E4m3ToFloat(sf_byte);
  const float inv = BlockInverseScale(sf, s_dec);
  const float denominator = 6.0f * emax;
  float err = 0.0f;
  for (int64_t c = col0; c < col0 + 16; ++c) {
    const float x = m.at(r, c);
    const float v = E2m1ToFloat(E2m1FromFloat(x * inv));
    const float dq = ((v * sf) * amax) / denominator;
    const float d = dq - x;
    err = err + (mse ? d * d : std::fabs(d));
  }
  return err;
}

// Tile error: one row as is; 16 rows summed as a tree (0-7 + 8-15, 0-3 + 4-7, 0-1 + 2-3, 0 + 1).
float TileError(const Matrix& m, int64_t row0, int64_t height, int64_t col0, uint8_t sf_byte,
                float amax, float s_dec, float emax, bool mse) {
  if (height == 1) return RowError(m, row0, col0, sf_byte, amax, s_dec, emax, mse);
  float e[16];
  for (int i = 0; i < 16; ++i) e[i] = RowError(m, row0 + i, col0, sf_byte, amax, s_dec, emax, mse);
  for (int half = 8; half >= 1; half /= 2) {
    for (int i = 0; i < half; ++i) e[i] = e[i] + e[i + half];
  }
  return e[0];
}

}  // namespace

FourOverSixChoice ChooseFourOverSix(const Matrix& m, int64_t row0, int64_t height, int64_t col0,
                                    float amax, float s_enc, float s_dec, float emax, bool mse) {
  float bamax = 0.0f;
  for (int64_t r = row0; r < row0 + height; ++r) {
    bamax = std::max(bamax, AbsMax(&m.values[static_cast<size_t>(r * m.cols + col0)], 16));
  }
  const float base = (bamax / 6.0f) * s_enc;
  FourOverSixChoice choice;
  choice.sf6 = E4m3FromFloat(std::min(base, kE4m3Max));
  choice.sf4 = E4m3FromFloat(std::min(base * 1.5f, kE4m3Max));
  choice.err6 = TileError(m, row0, height, col0, choice.sf6, amax, s_dec, emax, mse);
  choice.err4 = TileError(m, row0, height, col0, choice.sf4, amax, s_dec, emax, mse);
  choice.map_to_4 = choice.err4 < choice.err6;
  return choice;
}

}  // namespace fp4q::kernels::cpu
