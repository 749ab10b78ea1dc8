// E2M1, E4M3, E8M0 and bf16 conversions at hand-picked values from the NUMERICS.md tables.
#include "cpu/formats.h"

#include <cmath>
#include <cstdint>
#include <limits>

#include "gtest/gtest.h"
#include "kernels/test_util.h"

namespace fp4q::kernels::cpu {
namespace {

using testing::FromBits;

float Up(float x) { return std::nextafter(x, 100.0f); }
float Down(float x) { return std::nextafter(x, -100.0f); }

TEST(E2m1Test, RoundToNearestThresholdsFromTheTable) {
  struct Case {
    float y;
    uint8_t code;
  };
  const Case cases[] = {
      {0.0f, 0x0},  {0.25f, 0x0},   {Up(0.25f), 0x1}, {0.5f, 0x1},      {Down(0.75f), 0x1},
      {0.75f, 0x2}, {1.0f, 0x2},    {1.25f, 0x2},     {Up(1.25f), 0x3}, {Down(1.75f), 0x3},
      {1.75f, 0x4}, {2.3f, 0x4},    {2.5f, 0x4},      {Up(2.5f), 0x5},  {Down(3.5f), 0x5},
      {3.5f, 0x6},  {5.0f, 0x6},    {Up(5.0f), 0x7},  {6.0f, 0x7},      {7.0f, 0x7},
      {1e30f, 0x7}, {-0.0f, 0x8},   {-0.1f, 0x8},     {-0.3f, 0x9},     {-2.3f, 0xC},
      {-3.5f, 0xE}, {-100.0f, 0xF},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(E2m1FromFloat(c.y), c.code) << "y = " << c.y;
  }
}

TEST(E2m1Test, NonFiniteInputs) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(E2m1FromFloat(inf), 0x7);
  EXPECT_EQ(E2m1FromFloat(-inf), 0xF);
  EXPECT_EQ(E2m1FromFloat(std::nanf("")), 0x7);
  EXPECT_EQ(E2m1FromFloat(-std::nanf("")), 0x7);  // NaN gives +6 whatever its sign
  EXPECT_EQ(E2m1FromFloatStochastic(std::nanf(""), 0), 0x7);
  EXPECT_EQ(E2m1FromFloatStochastic(-inf, 0), 0xF);
}

TEST(E2m1Test, DecodesEveryCode) {
  const float expected[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                              -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
  for (int c = 0; c < 16; ++c) {
    EXPECT_EQ(testing::Bits(E2m1ToFloat(static_cast<uint8_t>(c))), testing::Bits(expected[c]))
        << "code " << c;
  }
}

TEST(E2m1Test, StochasticRoundingCompareIsExact) {
  // 2.3f = 0x40133333 = 2.2999999523162842; f = 0.2999999523162842, f * 65536 = 19660.796875.
  EXPECT_EQ(E2m1FromFloatStochastic(2.3f, 19660), 0x5);  // r < 19660.796875: up to 3
  EXPECT_EQ(E2m1FromFloatStochastic(2.3f, 19661), 0x4);  // otherwise down to 2
  EXPECT_EQ(E2m1FromFloatStochastic(-2.3f, 0), 0xD);
  // 0.25: lo 0, hi 0.5, f = 0.5, threshold 32768.
  EXPECT_EQ(E2m1FromFloatStochastic(0.25f, 32767), 0x1);
  EXPECT_EQ(E2m1FromFloatStochastic(0.25f, 32768), 0x0);
  // 5: lo 4, hi 6, f = 0.5.
  EXPECT_EQ(E2m1FromFloatStochastic(5.0f, 32767), 0x7);
  EXPECT_EQ(E2m1FromFloatStochastic(5.0f, 32768), 0x6);
  // On the grid it never moves, even with r = 0.
  EXPECT_EQ(E2m1FromFloatStochastic(3.0f, 0), 0x5);
  EXPECT_EQ(E2m1FromFloatStochastic(0.0f, 0), 0x0);
  EXPECT_EQ(E2m1FromFloatStochastic(-0.0f, 0), 0x8);
  // At or beyond 6: 6.
  EXPECT_EQ(E2m1FromFloatStochastic(6.0f, 0), 0x7);
  EXPECT_EQ(E2m1FromFloatStochastic(9.0f, 65535), 0x7);
  // Just below 6: f = (5.9999995 - 4) / 2 = 0.99999976, threshold 65535.984; r = 65535 rounds up.
  EXPECT_EQ(E2m1FromFloatStochastic(Down(6.0f), 65535), 0x7);
}

TEST(E4m3Test, Decodes) {
  EXPECT_EQ(E4m3ToFloat(0x00), 0.0f);
  EXPECT_EQ(E4m3ToFloat(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(E4m3ToFloat(0x07), 7 * std::ldexp(1.0f, -9));
  EXPECT_EQ(E4m3ToFloat(0x08), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(E4m3ToFloat(0x38), 1.0f);
  EXPECT_EQ(E4m3ToFloat(0x3C), 1.5f);
  EXPECT_EQ(E4m3ToFloat(0x77), 240.0f);
  EXPECT_EQ(E4m3ToFloat(0x7E), 448.0f);
  EXPECT_EQ(E4m3ToFloat(0xB8), -1.0f);
  EXPECT_TRUE(std::isnan(E4m3ToFloat(0x7F)));
  EXPECT_TRUE(std::isnan(E4m3ToFloat(0xFF)));
}

TEST(E4m3Test, EncodesRoundToNearestEvenSaturating) {
  EXPECT_EQ(E4m3FromFloat(0.0f), 0x00);
  EXPECT_EQ(E4m3FromFloat(1.0f), 0x38);
  EXPECT_EQ(E4m3FromFloat(1.0625f), 0x38);  // tie 1 | 1.125: even mantissa
  EXPECT_EQ(E4m3FromFloat(Up(1.0625f)), 0x39);
  EXPECT_EQ(E4m3FromFloat(1.1875f), 0x3A);                // tie 1.125 | 1.25: even mantissa
  EXPECT_EQ(E4m3FromFloat(std::ldexp(1.0f, -10)), 0x00);  // tie 0 | 2^-9
  EXPECT_EQ(E4m3FromFloat(Up(std::ldexp(1.0f, -10))), 0x01);
  EXPECT_EQ(E4m3FromFloat(std::ldexp(3.0f, -10)), 0x02);  // tie 2^-9 | 2^-8: even
  EXPECT_EQ(E4m3FromFloat(std::ldexp(1.0f, -11)), 0x00);
  EXPECT_EQ(E4m3FromFloat(230.0f), 0x76);  // 224 | 240 -> 224 (nearer)
  EXPECT_EQ(E4m3FromFloat(232.0f), 0x76);  // tie 224 | 240: even (0x76)
  EXPECT_EQ(E4m3FromFloat(432.0f), 0x7E);  // tie 416 | 448: even (0x7E)
  EXPECT_EQ(E4m3FromFloat(Down(432.0f)), 0x7D);
  EXPECT_EQ(E4m3FromFloat(448.0f), 0x7E);
  EXPECT_EQ(E4m3FromFloat(464.0f), 0x7E);  // would round to 480: saturates
  EXPECT_EQ(E4m3FromFloat(1e30f), 0x7E);
  EXPECT_EQ(E4m3FromFloat(std::numeric_limits<float>::infinity()), 0x7E);
  EXPECT_EQ(E4m3FromFloat(-1.5f), 0xBC);
  EXPECT_EQ(E4m3FromFloat(std::nanf("")), 0x7F);
}

TEST(E4m3Test, RoundTripsEveryFiniteByte) {
  for (int b = 0; b < 256; ++b) {
    if ((b & 0x7F) == 0x7F) continue;
    EXPECT_EQ(E4m3FromFloat(E4m3ToFloat(static_cast<uint8_t>(b))), b) << "byte " << b;
  }
}

TEST(E8m0Test, Decodes) {
  EXPECT_EQ(E8m0ToFloat(127), 1.0f);
  EXPECT_EQ(E8m0ToFloat(128), 2.0f);
  EXPECT_EQ(E8m0ToFloat(0), std::ldexp(1.0f, -127));
  EXPECT_EQ(E8m0ToFloat(254), std::ldexp(1.0f, 127));
  EXPECT_TRUE(std::isnan(E8m0ToFloat(255)));
}

TEST(Bf16Test, FloatNarrowingIsRoundToNearestEven) {
  EXPECT_EQ(FloatToBf16(1.0f), 0x3F80);
  EXPECT_EQ(FloatToBf16(1.00390625f), 0x3F80);  // 1 + 2^-8: tie, even
  EXPECT_EQ(FloatToBf16(Up(1.00390625f)), 0x3F81);
  EXPECT_EQ(FloatToBf16(1.01171875f), 0x3F82);  // 1 + 3 * 2^-8: tie, even
  EXPECT_EQ(FloatToBf16(-2.0f), 0xC000);
  EXPECT_EQ(FloatToBf16(std::numeric_limits<float>::max()), 0x7F80);  // rounds up to Inf
  EXPECT_EQ(FloatToBf16(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(FloatToBf16(std::nanf("")) & 0x7FC0, 0x7FC0);
  EXPECT_EQ(Bf16ToFloat(0x3FC0), 1.5f);
  EXPECT_EQ(Bf16ToFloat(0x0001), std::ldexp(1.0f, -133));
}

TEST(Bf16Test, DoubleNarrowingRoundsOnce) {
  // 1 + 2^-8 + 2^-40: above the tie, so 1 + 2^-7. Via f32 it would first become 1 + 2^-8 (a
  // tie) and then 1: double rounding.
  EXPECT_EQ(DoubleToBf16(1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40)), 0x3F81);
  EXPECT_EQ(DoubleToBf16(1.0 + std::ldexp(1.0, -8)), 0x3F80);
  EXPECT_EQ(DoubleToBf16(-1.5), 0xBFC0);
  EXPECT_EQ(DoubleToBf16(0.0), 0x0000);
  EXPECT_EQ(DoubleToBf16(-0.0), 0x8000);
  EXPECT_EQ(DoubleToBf16(std::ldexp(1.0, -133)), 0x0001);  // smallest subnormal
  EXPECT_EQ(DoubleToBf16(std::ldexp(1.0, -134)), 0x0000);  // tie with 0: even
  EXPECT_EQ(DoubleToBf16(std::ldexp(3.0, -134)), 0x0002);  // tie 1 | 2 steps: even
  EXPECT_EQ(DoubleToBf16(1e-300), 0x0000);
  EXPECT_EQ(DoubleToBf16(std::ldexp(255.0, 120)), 0x7F7F);  // largest finite
  EXPECT_EQ(DoubleToBf16(std::ldexp(255.5, 120)), 0x7F80);  // tie -> 2^128: Inf
  EXPECT_EQ(DoubleToBf16(1e300), 0x7F80);
  EXPECT_EQ(DoubleToBf16(-std::numeric_limits<double>::infinity()), 0xFF80);
  EXPECT_EQ(DoubleToBf16(std::nan("")) & 0x7FC0, 0x7FC0);
}

TEST(FloorLog2Test, FromTheBits) {
  EXPECT_EQ(FloorLog2(1.0f), 0);
  EXPECT_EQ(FloorLog2(1.99f), 0);
  EXPECT_EQ(FloorLog2(0.75f), -1);
  EXPECT_EQ(FloorLog2(-8.0f), 3);
  EXPECT_EQ(FloorLog2(std::ldexp(1.0f, -149)), -149);
  EXPECT_EQ(FloorLog2(std::ldexp(3.0f, -149)), -148);
  EXPECT_EQ(FloorLog2(std::numeric_limits<float>::max()), 127);
  EXPECT_EQ(FloorLog2(std::numeric_limits<float>::infinity()), 128);
  EXPECT_EQ(testing::Bits(C6()), 0x3E2AAAABu);
  EXPECT_EQ(FromBits(0x3E2AAAABu), 1.0f / 6.0f);
}

}  // namespace
}  // namespace fp4q::kernels::cpu
