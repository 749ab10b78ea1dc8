// NVFP4 quantization on the host; see nvfp4.h. Every f32 operation is written as NUMERICS 2
// orders it (this file is compiled with -ffp-contract=off: no FMA).
#include "cpu/nvfp4.h"

#include <algorithm>
#include <cmath>

#include "cpu/formats.h"
#include "cpu/four_over_six.h"
#include "cpu/philox.h"

namespace fp4q::kernels::cpu {

float AbsMax(const float* v, size_t n) {
  float amax = 0.0f;
  for (size_t i = 0; i < n; ++i) {
    const float a = std::fabs(v[i]);
    if (a > amax) amax = a;  // false for NaN
  }
  return amax;
}

float GlobalEncodeScale(float numerator, float amax) {
  if (amax == 0.0f || std::isinf(amax)) return 1.0f;
  const float s_enc = std::min(numerator / amax, kFltMax);
  return s_enc == 0.0f ? 1.0f : s_enc;
}

float GlobalDecodeScale(float s_enc) { return 1.0f / s_enc; }

uint8_t Nvfp4BlockScale(float bamax, float s_enc) {
  const float t = s_enc * C6();
  const float u = bamax * t;
  return E4m3FromFloat(u);
}

float BlockInverseScale(float sf, float s_dec) {
  const float denominator = sf * s_dec;
  return std::min(1.0f / denominator, kFltMax);
}

namespace {

// max |x| over rows [row0, row0 + height), cols [col0, col0 + 16), NaN ignored.
float TileAbsMax(const Matrix& m, int64_t row0, int64_t height, int64_t col0) {
  float bamax = 0.0f;
  for (int64_t r = row0; r < row0 + height; ++r) {
    bamax = std::max(bamax, AbsMax(&m.values[static_cast<size_t>(r * m.cols + col0)], 16));
  }
  return bamax;
}

}  // namespace

HostQuantized QuantizeNvfp4(const Matrix& m, BlockShape block, float amax, ScaleSelection selection,
                            float emax, const ElementRounding& rounding) {
  HostQuantized q;
  q.format = Format::kNvfp4;
  q.block = block;
  q.rows = m.rows;
  q.cols = m.cols;
  q.codes.assign(static_cast<size_t>(m.rows * m.cols / 2), 0);
  q.scales.assign(static_cast<size_t>(m.rows * (m.cols / 16)), 0);
  q.amax = amax;

  const bool four_over_six = selection != ScaleSelection::kMapTo6;
  const float numerator = four_over_six ? emax * 6.0f : kE4m3Max * kE2m1Max;
  q.s_enc = GlobalEncodeScale(numerator, amax);
  const float s_dec = GlobalDecodeScale(q.s_enc);

  StochasticBitStream bits(rounding.seed, rounding.step);
  const int64_t height = block == BlockShape::k16x16 ? 16 : 1;
  for (int64_t row0 = 0; row0 < m.rows; row0 += height) {
    for (int64_t col0 = 0; col0 < m.cols; col0 += 16) {
      uint8_t sf_byte;
      if (four_over_six) {
        sf_byte = ChooseFourOverSix(m, row0, height, col0, amax, q.s_enc, s_dec, emax,
                                    selection == ScaleSelection::kFourOverSixMse)
                      .chosen();
      } else {
        sf_byte = Nvfp4BlockScale(TileAbsMax(m, row0, height, col0), q.s_enc);
      }
      const float inv = BlockInverseScale(E4m3ToFloat(sf_byte), s_dec);
      for (int64_t r = row0; r < row0 + height; ++r) {
        q.scales[static_cast<size_t>(r * (m.cols / 16) + col0 / 16)] = sf_byte;
        for (int64_t c = col0; c < col0 + 16; ++c) {
          const float y = m.at(r, c) * inv;
          const uint8_t code =
              rounding.rounding == Rounding::kStochastic
                  ? E2m1FromFloatStochastic(y, bits.Bits(static_cast<uint64_t>(r * m.cols + c)))
                  : E2m1FromFloat(y);
          q.set_code(r, c, code);
        }
      }
    }
  }
  return q;
}

}  // namespace fp4q::kernels::cpu
