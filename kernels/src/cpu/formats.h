// Element and scale formats of the CPU reference backend (docs/NUMERICS.md sections 1, 2, 8):
// E2M1 codes, E4M3 and E8M0 scale bytes, bf16, and the f32 constants of the recipe.
// Everything here is written for clarity over speed: it is the oracle the CUDA backend is
// tested against. All functions are pure and thread-safe.
#ifndef FP4Q_KERNELS_CPU_FORMATS_H_
#define FP4Q_KERNELS_CPU_FORMATS_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace fp4q::kernels::cpu {

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float FloatFromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// c6 = RN(1/6) = 0x3E2AAAAB.
inline float C6() { return FloatFromBits(0x3E2AAAABu); }
inline constexpr float kFltMax = std::numeric_limits<float>::max();
inline constexpr float kE4m3Max = 448.0f;
inline constexpr float kE2m1Max = 6.0f;

// ---- bf16 ----
// Exact widening.
float Bf16ToFloat(uint16_t bits);
// Round-to-nearest-even narrowing; NaN gives a quiet NaN with the input's sign.
uint16_t FloatToBf16(float f);
// Round-to-nearest-even from f64 directly (no intermediate f32 rounding); overflow gives Inf.
uint16_t DoubleToBf16(double d);

// ---- E2M1 (NUMERICS 1) ----
// Magnitude of codes 0..7: 0, 0.5, 1, 1.5, 2, 3, 4, 6; codes 8..15 are negative.
inline constexpr float kE2m1Grid[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
inline float E2m1ToFloat(uint8_t code) {
  const float magnitude = kE2m1Grid[code & 0x7];
  return (code & 0x8) ? -magnitude : magnitude;
}
// Round-to-nearest-even on the grid with the table's exact thresholds; saturates to +-6;
// NaN gives 0x7; the sign bit of y gives bit 3 (so -0.0 and tiny negatives give 0x8).
// The code's magnitude is the number of rounding thresholds below |y|: the midpoints of the
// grid, each counted from the side that ties to the even code (0.25 goes to 0, 0.75 to 1.0).
inline uint8_t E2m1FromFloat(float y) {
  if (std::isnan(y)) return 0x7;
  const float a = std::fabs(y);
  const int code = (a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) +
                   (a >= 3.5f) + (a > 5.0f);
  return static_cast<uint8_t>(code | (std::signbit(y) ? 0x8 : 0));
}
// Stochastic rounding (NUMERICS 4) with the element's 16 random bits `r`.
uint8_t E2m1FromFloatStochastic(float y, uint16_t r);

// ---- E4M3 (OCP FP8 E4M3FN: bias 7, max 448, 0x7F/0xFF NaN, subnormals m * 2^-9) ----
// Value of a non-negative byte 0x00..0x7E, exactly, as a double (the definition).
double E4m3MagnitudeOf(uint8_t byte);
// The same, from a table of every byte built from it at first use (a scale is decoded per
// element and rounded per block).
inline double E4m3Magnitude(uint8_t byte) {
  struct Table {
    double value[128];
    Table() {
      for (int b = 0; b < 128; ++b) value[b] = E4m3MagnitudeOf(static_cast<uint8_t>(b));
    }
  };
  static const Table table;
  return table.value[byte & 0x7F];
}
inline float E4m3ToFloat(uint8_t byte) {
  if ((byte & 0x7F) == 0x7F) return std::numeric_limits<float>::quiet_NaN();
  const float magnitude = static_cast<float>(E4m3Magnitude(byte & 0x7F));
  return (byte & 0x80) ? -magnitude : magnitude;
}
// Round-to-nearest-even, saturating at +-448 (also for +-Inf); NaN gives 0x7F.
uint8_t E4m3FromFloat(float u);

// ---- E8M0: byte b means 2^(b - 127); 255 is NaN. ----
float E8m0ToFloat(uint8_t byte);

// floor(log2 |x|) from the f32 bits for finite nonzero x (subnormals included); 128 for Inf.
int FloorLog2(float x);

}  // namespace fp4q::kernels::cpu

#endif  // FP4Q_KERNELS_CPU_FORMATS_H_
