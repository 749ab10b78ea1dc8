// The integer form of stochastic rounding that the CUDA quantizers use (E2M1SrCodeWord in
// kernels/src/cuda/device_numerics.cuh, written out here in host arithmetic) against the CPU
// reference's NUMERICS 4 (E2m1FromFloatStochastic). For each a the reference's threshold T (the
// first r16 that rounds down) is found, and the integer form must give the reference's code at
// r16 = 0, T - 1, T and 65535; since its word falls linearly in r16 and stays in range at both
// ends, that covers every r16. CI sweeps a strided sample of all f32 values in [0, 6.5) and every
// value near the grid points and binade edges; FP4Q_SR_EXHAUSTIVE=1 sweeps all 1,087,373,312.
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "cpu/formats.h"
#include "gtest/gtest.h"

namespace fp4q::kernels {
namespace {

using cpu::E2m1FromFloatStochastic;
using cpu::FloatBits;
using cpu::FloatFromBits;

// RU(1 + a) for 0 <= a <= 6: (double)r - 1 and a are exact in double.
float RoundUpOnePlus(float a) {
  float r = static_cast<float>(static_cast<double>(a) + 1.0);
  if (static_cast<double>(r) - 1.0 < static_cast<double>(a)) r = std::nextafter(r, 7.0f);
  return r;
}

// The device word: 4 * bits(max(2a, RU(1 + a))) + 0x02FFFFFC - (r16 << 8), the code in byte 3.
uint32_t CodeWord(float y, uint32_t r16) {
  const float a = std::fmin(std::fabs(y), 6.0f);
  const float m = std::fmax(a * 2.0f, RoundUpOnePlus(a));
  return FloatBits(m) * 4u + (0x02FFFFFCu - (r16 << 8));
}

// Mismatches for the f32 value with bits `b` (0 when the integer form agrees at every r16).
int CheckValue(uint32_t b, std::string* first) {
  const float a = FloatFromBits(b);
  const uint8_t at_max = E2m1FromFloatStochastic(a, 65535);
  std::vector<uint32_t> rs = {0, 65535};
  if (E2m1FromFloatStochastic(a, 0) != at_max) {
    uint32_t lo = 0, hi = 65535;  // first r16 with the lower code
    while (lo < hi) {
      const uint32_t mid = (lo + hi) / 2;
      if (E2m1FromFloatStochastic(a, static_cast<uint16_t>(mid)) == at_max) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    rs.push_back(lo - 1);
    rs.push_back(lo);
  }
  int bad = 0;
  for (const uint32_t r : rs) {
    const uint32_t w = CodeWord(a, r);
    const uint8_t ref = E2m1FromFloatStochastic(a, static_cast<uint16_t>(r));
    if ((w >> 27) != 0u || (w >> 24) != ref) {
      if (bad++ == 0 && first->empty()) {
        char buf[128];
        std::snprintf(buf, sizeof buf, "a = %a (bits 0x%08X), r16 %u: code %u, reference %u", a,
                      b, r, w >> 24, ref);
        *first = buf;
      }
    }
  }
  return bad;
}

TEST(SrIntegerForm, MatchesTheReferenceAtEveryThreshold) {
  constexpr uint32_t kEnd = 0x40D00000u;  // 6.5
  const char* env = std::getenv("FP4Q_SR_EXHAUSTIVE");
  const uint32_t stride = (env != nullptr && std::string(env) == "1") ? 1u : 1021u;
  std::vector<uint32_t> values;
  for (uint32_t b = 0; b < kEnd; b += stride) values.push_back(b);
  // Every value within 4096 ulps of the grid points, the cell midpoints, 1 and 6 (the binade
  // edges the form switches at) and the smallest normal.
  for (const float p : {0.25f, 0.5f, 0.75f, 1.0f, 1.25f, 1.5f, 1.75f, 2.0f, 2.5f, 3.0f, 3.5f,
                        4.0f, 5.0f, 6.0f, 0x1p-126f}) {
    const uint32_t c = FloatBits(p);
    for (uint32_t b = c - 4096; b <= c + 4096; ++b) values.push_back(b);
  }
  for (uint32_t b = 0; b <= 4096; ++b) values.push_back(b);  // zero and the smallest subnormals
  int64_t bad = 0;
  std::string first;
  for (const uint32_t b : values) bad += CheckValue(b, &first);
  EXPECT_EQ(bad, 0) << first;
  EXPECT_GT(values.size(), 1000000u);
}

TEST(SrIntegerForm, SaturatesAndSendsNanToSeven) {
  for (const float y : {6.0f, 6.5f, 1e30f, INFINITY, -INFINITY, NAN}) {
    for (const uint32_t r : {0u, 1u, 32768u, 65535u}) {
      EXPECT_EQ(CodeWord(y, r) >> 24, 7u) << y << " r16 " << r;
    }
  }
  // Values on the grid never move; 0.25 rounds up to 0.5 exactly when r16 < 32768.
  EXPECT_EQ(CodeWord(3.0f, 0) >> 24, 5u);
  EXPECT_EQ(CodeWord(3.0f, 65535) >> 24, 5u);
  EXPECT_EQ(CodeWord(0.25f, 32767) >> 24, 1u);
  EXPECT_EQ(CodeWord(0.25f, 32768) >> 24, 0u);
  EXPECT_EQ(CodeWord(0x1p-149f, 0) >> 24, 1u);  // the smallest subnormal: up only for r16 = 0
  EXPECT_EQ(CodeWord(0x1p-149f, 1) >> 24, 0u);
}

}  // namespace
}  // namespace fp4q::kernels
