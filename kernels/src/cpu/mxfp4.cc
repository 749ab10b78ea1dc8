// MXFP4 quantization on the host; see mxfp4.h.
#include "cpu/mxfp4.h"

#include <algorithm>
#include <cmath>

#include "cpu/formats.h"
#include "cpu/philox.h"

namespace fp4q::kernels::cpu {
namespace {

bool IsPowerOfTwo(float p) {
  const uint32_t u = FloatBits(p) & 0x7FFFFFFFu;
  const uint32_t mantissa = u & 0x7FFFFFu;
  if ((u >> 23) == 0) return (mantissa & (mantissa - 1)) == 0;  // subnormal: one bit set
  return mantissa == 0;
}

}  // namespace

uint8_t MxScaleByte(float bamax, MxScaleRule rule) {
  int exponent;
  if (rule == MxScaleRule::kRceil) {
    const float p = bamax * C6();
    if (p == 0.0f) {
      exponent = -127;
    } else if (std::isinf(p)) {
      exponent = 128;
    } else {
      exponent = FloorLog2(p) + (IsPowerOfTwo(p) ? 0 : 1);
    }
  } else {
    if (bamax == 0.0f) return 0;
    exponent = FloorLog2(bamax) - 2;
  }
  exponent = std::clamp(exponent, -127, 127);
  return static_cast<uint8_t>(exponent + 127);
}

HostQuantized QuantizeMxfp4(const Matrix& m, float amax, MxScaleRule rule,
                            const ElementRounding& rounding) {
  HostQuantized q;
  q.format = Format::kMxfp4;
  q.block = BlockShape::k1x32;
  q.rows = m.rows;
  q.cols = m.cols;
  q.codes.assign(static_cast<size_t>(m.rows * m.cols / 2), 0);
  q.scales.assign(static_cast<size_t>(m.rows * (m.cols / 32)), 0);
  q.amax = amax;
  q.s_enc = 1.0f;

  StochasticBitStream bits(rounding.seed, rounding.step);
  for (int64_t r = 0; r < m.rows; ++r) {
    for (int64_t col0 = 0; col0 < m.cols; col0 += 32) {
      const float bamax = AbsMax(&m.values[static_cast<size_t>(r * m.cols + col0)], 32);
      const uint8_t b = MxScaleByte(bamax, rule);
      q.scales[static_cast<size_t>(r * (m.cols / 32) + col0 / 32)] = b;
      const float multiplier = std::ldexp(1.0f, 127 - static_cast<int>(b));  // exact
      for (int64_t c = col0; c < col0 + 32; ++c) {
        const float y = m.at(r, c) * multiplier;
        const uint8_t code =
            rounding.rounding == Rounding::kStochastic
                ? E2m1FromFloatStochastic(y, bits.Bits(static_cast<uint64_t>(r * m.cols + c)))
                : E2m1FromFloat(y);
        q.set_code(r, c, code);
      }
    }
  }
  return q;
}

}  // namespace fp4q::kernels::cpu
