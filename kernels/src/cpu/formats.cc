// Element and scale formats; see formats.h.
#include "cpu/formats.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace fp4q::kernels::cpu {

double E4m3MagnitudeOf(uint8_t byte) {
  const int e = (byte >> 3) & 0xF;
  const int m = byte & 0x7;
  if (e == 0) return std::ldexp(static_cast<double>(m), -9);
  return std::ldexp(8.0 + m, e - 10);  // (1 + m/8) * 2^(e - 7)
}

float Bf16ToFloat(uint16_t bits) { return FloatFromBits(static_cast<uint32_t>(bits) << 16); }

uint16_t FloatToBf16(float f) {
  uint32_t u = FloatBits(f);
  if (std::isnan(f)) return static_cast<uint16_t>((u >> 16) | 0x0040);
  const uint32_t lsb = (u >> 16) & 1u;
  u += 0x7FFFu + lsb;  // round half to even; overflow carries into the exponent (-> Inf)
  return static_cast<uint16_t>(u >> 16);
}

uint16_t DoubleToBf16(double d) {
  const uint16_t sign = std::signbit(d) ? 0x8000 : 0;
  if (std::isnan(d)) return static_cast<uint16_t>(sign | 0x7FC0);
  const double a = std::fabs(d);
  if (a == 0.0 || std::isinf(a)) {
    return static_cast<uint16_t>(sign | (FloatBits(static_cast<float>(a)) >> 16));
  }
  // bf16 keeps 8 significant bits; its smallest step (subnormals) is 2^-133.
  int e = 0;
  std::frexp(a, &e);  // a = m * 2^e with m in [0.5, 1)
  const int quantum_exp = std::max(e - 8, -133);
  const double steps = std::nearbyint(std::ldexp(a, -quantum_exp));  // ties to even
  const double rounded = std::ldexp(steps, quantum_exp);
  const double bf16_max = std::ldexp(255.0, 120);  // 0x7F7F
  if (rounded > bf16_max) return static_cast<uint16_t>(sign | 0x7F80);
  return static_cast<uint16_t>(sign | (FloatBits(static_cast<float>(rounded)) >> 16));
}

uint8_t E2m1FromFloatStochastic(float y, uint16_t r) {
  if (std::isnan(y)) return 0x7;
  const float a = std::fabs(y);
  uint8_t code;
  if (a >= kE2m1Max) {
    code = 7;
  } else {
    uint8_t lo = 0;
    while (kE2m1Grid[lo + 1] <= a) ++lo;  // largest grid value <= a (a < 6)
    const float f = (a - kE2m1Grid[lo]) / (kE2m1Grid[lo + 1] - kE2m1Grid[lo]);
    code = (static_cast<float>(r) < f * 65536.0f) ? static_cast<uint8_t>(lo + 1) : lo;
  }
  return std::signbit(y) ? static_cast<uint8_t>(code | 0x8) : code;
}

uint8_t E4m3FromFloat(float u) {
  if (std::isnan(u)) return 0x7F;
  const uint8_t sign = std::signbit(u) ? 0x80 : 0;
  const double a = std::fabs(static_cast<double>(u));
  if (a >= kE4m3Max) return sign | 0x7E;
  // Largest byte lo in 0x00..0x7D with value(lo) <= a (values increase with the byte).
  uint8_t lo = 0;
  uint8_t hi = 0x7E;
  while (hi - lo > 1) {
    const uint8_t mid = static_cast<uint8_t>((lo + hi) / 2);
    if (E4m3Magnitude(mid) <= a) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  // Now value(lo) <= a < value(lo + 1); all differences are exact in double.
  const double below = a - E4m3Magnitude(lo);
  const double above = E4m3Magnitude(lo + 1) - a;
  uint8_t byte;
  if (below < above) {
    byte = lo;
  } else if (above < below) {
    byte = static_cast<uint8_t>(lo + 1);
  } else {
    byte = (lo % 2 == 0) ? lo : static_cast<uint8_t>(lo + 1);  // tie: even mantissa
  }
  return sign | byte;
}

float E8m0ToFloat(uint8_t byte) {
  if (byte == 0xFF) return std::numeric_limits<float>::quiet_NaN();
  return std::ldexp(1.0f, static_cast<int>(byte) - 127);
}

int FloorLog2(float x) {
  const uint32_t u = FloatBits(x) & 0x7FFFFFFFu;
  const int biased = static_cast<int>(u >> 23);
  if (biased == 0xFF) return 128;
  if (biased == 0) {  // subnormal: value = mantissa * 2^-149
    const uint32_t mantissa = u & 0x7FFFFFu;
    return -149 + (31 - __builtin_clz(mantissa));
  }
  return biased - 127;
}

}  // namespace fp4q::kernels::cpu
