// The MXFP4 scale byte as the CUDA quantizers compute it (MxScaleByte in
// kernels/src/cuda/device_numerics.cuh: integer work on the f32 bits, no branches; written out
// here in host arithmetic) against the CPU reference (cpu::MxScaleByte: floor(log2), a
// power-of-two test, a clamp), under RCEIL and FLOOR. The device takes a block's max of
// magnitudes, so the inputs are the non-negative f32 values, infinity and the NaNs. CI sweeps a
// strided sample of all 2^31 of them and every value within 4096 ulps of each power of two and
// of six times each (where FLOOR's and RCEIL's bytes change, subnormals included), of the
// largest finite value and of infinity; FP4Q_MX_EXHAUSTIVE=1 sweeps all 2^31 (22 s on the
// development VM).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "cpu/formats.h"
#include "cpu/mxfp4.h"
#include "gtest/gtest.h"

namespace fp4q::kernels {
namespace {

using cpu::FloatBits;
using cpu::FloatFromBits;

constexpr float kC6 = 0x1.555556p-3f;  // RN(1/6), the device's constant

// The device form: RCEIL adds 0x7FFFFF to p's bits (the carry is the "plus one unless a power of
// two" of ceil(log2 p)); FLOOR takes the exponent field less two.
uint32_t DeviceForm(float bamax, MxScaleRule rule) {
  if (rule == MxScaleRule::kRceil) {
    const float p = bamax * kC6;  // one RN multiply (-ffp-contract=off)
    const uint32_t bits = FloatBits(p) & 0x7FFFFFFFu;
    const uint32_t up = (bits + 0x7FFFFFu) >> 23;
    return bits <= 0x400000u ? 0u : (up < 254u ? up : 254u);
  }
  const int e = static_cast<int>((FloatBits(bamax) & 0x7FFFFFFFu) >> 23) - 2;
  return static_cast<uint32_t>(e > 0 ? e : 0);
}

// Calls visit(bits) for each input: see the file comment.
template <typename Visit>
uint64_t ForEachInput(Visit visit) {
  const char* env = std::getenv("FP4Q_MX_EXHAUSTIVE");
  const bool all = env != nullptr && std::string(env) == "1";
  uint64_t n = 0;
  const uint32_t stride = all ? 1u : 4093u;
  for (uint64_t b = 0; b <= 0x7FFFFFFFu; b += stride, ++n) visit(static_cast<uint32_t>(b));
  if (all) return n;
  auto around = [&](uint32_t center) {
    for (int64_t d = -4096; d <= 4096; ++d) {
      const int64_t b = static_cast<int64_t>(center) + d;
      if (b >= 0 && b <= 0x7FFFFFFF) {
        visit(static_cast<uint32_t>(b));
        ++n;
      }
    }
  };
  for (uint32_t e = 1; e < 255; ++e) around(e << 23);  // 2^-126 .. 2^127
  for (int k = 0; k < 23; ++k) around(1u << k);         // the subnormal powers of two
  around(0x7F7FFFFFu);                                  // the largest finite value
  around(0x7F800000u);                                  // infinity, the NaNs above it
  // Where bamax / 6 crosses a power of two (RCEIL's edges).
  for (uint32_t e = 1; e < 254; ++e) around(FloatBits(FloatFromBits(e << 23) * 6.0f));
  for (int k = 0; k < 23; ++k) around(FloatBits(FloatFromBits(1u << k) * 6.0f));
  return n;
}

TEST(MxScaleBits, DeviceFormMatchesTheReference) {
  for (const MxScaleRule rule : {MxScaleRule::kRceil, MxScaleRule::kFloor}) {
    uint64_t bad = 0;
    std::string first;
    const uint64_t n = ForEachInput([&](uint32_t b) {
      const float x = FloatFromBits(b);
      const uint32_t want = cpu::MxScaleByte(x, rule);
      const uint32_t got = DeviceForm(x, rule);
      if (got != want && bad++ == 0) {
        char buf[128];
        std::snprintf(buf, sizeof buf, "bamax %a (bits 0x%08X): device form %u, reference %u", x,
                      b, got, want);
        first = buf;
      }
    });
    EXPECT_EQ(bad, 0u) << (rule == MxScaleRule::kRceil ? "RCEIL" : "FLOOR") << " over " << n
                       << " inputs; first: " << first;
    EXPECT_GT(n, 2500000u);
  }
}

// The edges named in device_numerics.cuh, by value.
TEST(MxScaleBits, EdgesByValue) {
  const MxScaleRule rceil = MxScaleRule::kRceil, floor = MxScaleRule::kFloor;
  // RCEIL: p = bamax / 6 at or below 2^-127 is byte 0; just above it 2^-126 (byte 1).
  EXPECT_EQ(DeviceForm(0.0f, rceil), 0u);
  EXPECT_EQ(DeviceForm(0x1p-127f * 6.0f, rceil), 0u);
  EXPECT_EQ(DeviceForm(0x1.8p-127f * 6.0f, rceil), 1u);     // p = 1.5 * 2^-127
  EXPECT_EQ(DeviceForm(6.0f, rceil), 127u);                 // p = 1: 2^0
  EXPECT_EQ(DeviceForm(6.5f, rceil), 128u);                 // p above 1: 2^1
  EXPECT_EQ(DeviceForm(FloatFromBits(0x7F7FFFFFu), rceil), 253u);  // p ~ 2^125.4: 2^126
  EXPECT_EQ(DeviceForm(FloatFromBits(0x7F800000u), rceil), 254u);  // infinity, clamped
  EXPECT_EQ(DeviceForm(FloatFromBits(0x7FC00000u), rceil), 254u);  // NaN, clamped
  // FLOOR: floor(log2 bamax) - 2.
  EXPECT_EQ(DeviceForm(0.0f, floor), 0u);
  EXPECT_EQ(DeviceForm(0x1p-140f, floor), 0u);              // a subnormal
  EXPECT_EQ(DeviceForm(4.0f, floor), 127u);
  EXPECT_EQ(DeviceForm(7.99f, floor), 127u);
  EXPECT_EQ(DeviceForm(FloatFromBits(0x7F800000u), floor), 253u);
  for (const float x : {0.0f, 0x1p-127f * 6.0f, 0x1.8p-127f * 6.0f, 6.5f, 7.99f}) {
    EXPECT_EQ(DeviceForm(x, rceil), cpu::MxScaleByte(x, rceil)) << x;
    EXPECT_EQ(DeviceForm(x, floor), cpu::MxScaleByte(x, floor)) << x;
  }
}

}  // namespace
}  // namespace fp4q::kernels
