// MXFP4 (NUMERICS 8, DESIGN "Numerics decisions"): E8M0 scale bytes at hand-picked amaxes under
// RCEIL and FLOOR, elements, dequantization.
#include "cpu/mxfp4.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "fp4q/kernels/backend.h"
#include "gtest/gtest.h"
#include "kernels/test_util.h"

namespace fp4q::kernels {
namespace {

using testing::F32Out;
using testing::F32View;
using testing::OwnedQuantized;

TEST(MxScaleTest, RceilAtHandPickedAmaxes) {
  using cpu::MxScaleByte;
  const MxScaleRule r = MxScaleRule::kRceil;
  // p = RN(amax * c6); exponent = ceil(log2 p) from the bits; b = exponent + 127.
  EXPECT_EQ(MxScaleByte(6.0f, r), 127);   // p = RN(1.0000000298) = 1: a power of two
  EXPECT_EQ(MxScaleByte(12.0f, r), 128);  // p = 2
  EXPECT_EQ(MxScaleByte(3.0f, r), 126);   // p = 0.5
  EXPECT_EQ(MxScaleByte(7.0f, r), 128);   // p = 1.1666: floor 0, not a power of two -> 1
  EXPECT_EQ(MxScaleByte(std::nextafter(6.0f, 7.0f), r), 128);  // p = 1.0000001 -> 1
  EXPECT_EQ(MxScaleByte(5.9f, r), 127);                        // p = 0.98333 -> 0
  EXPECT_EQ(MxScaleByte(0.0f, r), 0);                          // p = 0 -> -127
  EXPECT_EQ(MxScaleByte(1e-45f, r), 0);                        // p = RN(2^-149 / 6) = 0 -> -127
  // p = RN(1.5 * 2^-128 * c6) = 2^-130 (subnormal, a power of two) -> -130, clamped to -127.
  EXPECT_EQ(MxScaleByte(std::ldexp(1.5f, -128), r), 0);
  EXPECT_EQ(MxScaleByte(std::ldexp(1.0f, -120) * 6.0f, r), 7);  // p = 2^-120 -> b = 7
  // FLT_MAX: p = 5.67e37, floor(log2 p) = 125, + 1 = 126.
  EXPECT_EQ(MxScaleByte(std::numeric_limits<float>::max(), r), 253);
  EXPECT_EQ(MxScaleByte(std::numeric_limits<float>::infinity(), r), 254);  // 128 -> 127
}

TEST(MxScaleTest, FloorAtHandPickedAmaxes) {
  using cpu::MxScaleByte;
  const MxScaleRule f = MxScaleRule::kFloor;
  // floor(log2 amax) - 2.
  EXPECT_EQ(MxScaleByte(6.0f, f), 127);   // 2 - 2 = 0
  EXPECT_EQ(MxScaleByte(7.99f, f), 127);  // 2 - 2 = 0: 7.99 then clips to 6
  EXPECT_EQ(MxScaleByte(8.0f, f), 128);   // 3 - 2 = 1
  EXPECT_EQ(MxScaleByte(1.0f, f), 125);   // 0 - 2
  EXPECT_EQ(MxScaleByte(0.3f, f), 123);   // -2 - 2
  EXPECT_EQ(MxScaleByte(0.0f, f), 0);
  EXPECT_EQ(MxScaleByte(1e-45f, f), 0);                               // -149 - 2, clamped to -127
  EXPECT_EQ(MxScaleByte(std::numeric_limits<float>::max(), f), 252);  // 127 - 2
}

TEST(Mxfp4Test, QuantizesAndDequantizesABlock) {
  auto backend = CreateCpuBackend();
  // One block of 32: amax 7 -> RCEIL b = 128 (scale 2); FLOOR b = 127 (scale 1).
  std::vector<float> x(32, 0.0f);
  x[0] = 7.0f;
  x[1] = 1.4f;
  x[2] = -0.3f;
  x[3] = -5.0f;
  x[31] = 2.9f;
  for (MxScaleRule rule : {MxScaleRule::kRceil, MxScaleRule::kFloor}) {
    QuantizeOptions o;
    o.format = Format::kMxfp4;
    o.block = BlockShape::k1x32;
    o.mx_rule = rule;
    OwnedQuantized q(Format::kMxfp4, BlockShape::k1x32, ScaleLayout::kPlain, 1, 32);
    ASSERT_TRUE(testing::QuantizeInto(*backend, F32View(x, 1, 32), o, &q).ok());
    EXPECT_EQ(q.global[0], 7.0f);
    EXPECT_EQ(q.global[1], 1.0f);
    std::vector<float> dq(32, -99.0f);
    ASSERT_TRUE(backend->Dequantize(q.cview(), F32Out(&dq, 1, 32), nullptr).ok());
    if (rule == MxScaleRule::kRceil) {
      EXPECT_EQ(q.scale(0, 0), 128);
      // y = x / 2: 3.5 -> 4, 0.7 -> 0.5, -0.15 -> -0, -2.5 -> -2, 1.45 -> 1.5.
      EXPECT_EQ(q.code(0, 0), 0x6);
      EXPECT_EQ(q.code(0, 1), 0x1);
      EXPECT_EQ(q.code(0, 2), 0x8);
      EXPECT_EQ(q.code(0, 3), 0xC);
      EXPECT_EQ(q.code(0, 31), 0x3);
      EXPECT_EQ(dq[0], 8.0f);
      EXPECT_EQ(dq[1], 1.0f);
      EXPECT_EQ(dq[3], -4.0f);
      EXPECT_EQ(dq[31], 3.0f);
    } else {
      EXPECT_EQ(q.scale(0, 0), 127);
      // y = x: 7 -> 6 (clipped), 1.4 -> 1.5, -0.3 -> -0.5, -5 -> -4 (tie 4 | 6: 4), 2.9 -> 3.
      EXPECT_EQ(q.code(0, 0), 0x7);
      EXPECT_EQ(q.code(0, 1), 0x3);
      EXPECT_EQ(q.code(0, 2), 0x9);
      EXPECT_EQ(q.code(0, 3), 0xE);
      EXPECT_EQ(q.code(0, 31), 0x5);
      EXPECT_EQ(dq[0], 6.0f);
      EXPECT_EQ(dq[3], -4.0f);
    }
    EXPECT_EQ(dq[4], 0.0f);
  }
}

TEST(Mxfp4Test, TinyScalesAndNanScaleByte) {
  auto backend = CreateCpuBackend();
  // Block amax 6 * 2^-126: p = 2^-126 -> b = 1, multiplier 2^126 (exact).
  std::vector<float> x(32, 0.0f);
  x[0] = std::ldexp(6.0f, -126);
  x[1] = std::ldexp(-1.0f, -126);
  QuantizeOptions o;
  o.format = Format::kMxfp4;
  o.block = BlockShape::k1x32;
  OwnedQuantized q(Format::kMxfp4, BlockShape::k1x32, ScaleLayout::kPlain, 1, 32);
  ASSERT_TRUE(testing::QuantizeInto(*backend, F32View(x, 1, 32), o, &q).ok());
  EXPECT_EQ(q.scale(0, 0), 1);
  EXPECT_EQ(q.code(0, 0), 0x7);
  EXPECT_EQ(q.code(0, 1), 0xA);
  std::vector<float> dq(32);
  ASSERT_TRUE(backend->Dequantize(q.cview(), F32Out(&dq, 1, 32), nullptr).ok());
  EXPECT_EQ(dq[0], x[0]);
  EXPECT_EQ(dq[1], x[1]);
  // E8M0 255 is NaN.
  q.scales[0] = 255;
  ASSERT_TRUE(backend->Dequantize(q.cview(), F32Out(&dq, 1, 32), nullptr).ok());
  EXPECT_TRUE(std::isnan(dq[0]));
  EXPECT_TRUE(std::isnan(dq[5]));
}

}  // namespace
}  // namespace fp4q::kernels
