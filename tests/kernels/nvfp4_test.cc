// NVFP4 scaling (NUMERICS 2) at hand-picked values: the global scale guards, the operation
// order of the block scale, all-zero and underflowing blocks, NaN/Inf, and dequantization.
#include "cpu/nvfp4.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "cpu/formats.h"
#include "cpu/four_over_six.h"
#include "fp4q/kernels/backend.h"
#include "gtest/gtest.h"
#include "kernels/test_util.h"

namespace fp4q::kernels {
namespace {

using testing::Bits;
using testing::F32Out;
using testing::F32View;
using testing::FromBits;
using testing::OwnedQuantized;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kFltMax = std::numeric_limits<float>::max();

TEST(Nvfp4ScaleTest, GlobalEncodeScaleGuards) {
  EXPECT_EQ(cpu::GlobalEncodeScale(2688.0f, 2688.0f), 1.0f);
  EXPECT_EQ(cpu::GlobalEncodeScale(2688.0f, 6.0f), 448.0f);
  EXPECT_EQ(cpu::GlobalEncodeScale(2688.0f, 0.0f), 1.0f);       // amax 0
  EXPECT_EQ(cpu::GlobalEncodeScale(2688.0f, kInf), 1.0f);       // amax Inf
  EXPECT_EQ(cpu::GlobalEncodeScale(2688.0f, 1e-45f), kFltMax);  // 2688 / 2^-149 = Inf -> FLT_MAX
  EXPECT_EQ(cpu::GlobalEncodeScale(2688.0f, kFltMax), 2688.0f / kFltMax);
  EXPECT_EQ(cpu::GlobalEncodeScale(1536.0f, 4.0f), 384.0f);  // four-over-six, emax 256
  EXPECT_EQ(cpu::GlobalDecodeScale(4.0f), 0.25f);
}

TEST(Nvfp4ScaleTest, BlockScaleAssociatesAsWritten) {
  // amax 0x3f800347, bamax 0x3b1b71b2: t = RN(S_enc * c6) and RN(bamax * t) is exactly 1.0625,
  // a tie between E4M3 1 (0x38) and 1.125 (0x39): even, 0x38. The other association,
  // RN(RN(bamax * S_enc) * c6), gives 1.0625001 and 0x39.
  const float amax = FromBits(0x3f800347u);
  const float bamax = FromBits(0x3b1b71b2u);
  const float s_enc = cpu::GlobalEncodeScale(2688.0f, amax);
  const float t = s_enc * cpu::C6();
  ASSERT_EQ(bamax * t, 1.0625f);
  ASSERT_GT((bamax * s_enc) * cpu::C6(), 1.0625f);
  EXPECT_EQ(cpu::Nvfp4BlockScale(bamax, s_enc), 0x38);

  // Through the backend: block 0 holds the amax, block 1 has block amax `bamax`.
  std::vector<float> x(32, 0.0f);
  x[0] = amax;
  x[16] = bamax;
  x[17] = -bamax / 2;
  auto backend = CreateCpuBackend();
  OwnedQuantized q(Format::kNvfp4, BlockShape::k1x16, ScaleLayout::kPlain, 1, 32);
  ASSERT_TRUE(testing::QuantizeInto(*backend, F32View(x, 1, 32), QuantizeOptions(), &q).ok());
  EXPECT_EQ(q.scale(0, 1), 0x38);
  EXPECT_EQ(Bits(q.global[0]), 0x3f800347u);
  EXPECT_EQ(q.global[1], s_enc);
}

TEST(Nvfp4ScaleTest, FourOverSixBaseDividesFirst) {
  // amax 0x3f8009d5, bamax 0x3b980bac, emax 256: base = RN(RN(bamax / 6) * S_enc) = 1.1875, a
  // tie between E4M3 1.125 (0x39) and 1.25 (0x3A): even, 0x3A. bamax * RN(S_enc * c6) would
  // give 1.1874999 and 0x39.
  const float amax = FromBits(0x3f8009d5u);
  const float bamax = FromBits(0x3b980bacu);
  const float s_enc = cpu::GlobalEncodeScale(1536.0f, amax);
  ASSERT_EQ((bamax / 6.0f) * s_enc, 1.1875f);
  ASSERT_LT(bamax * (s_enc * cpu::C6()), 1.1875f);
  std::vector<float> x(16, 0.0f);
  x[0] = bamax;
  const cpu::Matrix m = cpu::LoadF32(x.data(), 1, 16);
  const cpu::FourOverSixChoice c = cpu::ChooseFourOverSix(
      m, 0, 1, 0, amax, s_enc, cpu::GlobalDecodeScale(s_enc), 256.0f, /*mse=*/false);
  EXPECT_EQ(c.sf6, 0x3A);
  EXPECT_EQ(c.sf4, cpu::E4m3FromFloat(1.1875f * 1.5f));  // 1.78125: tie 1.75 | 1.875 -> 0x3E
  EXPECT_EQ(c.sf4, 0x3E);
}

TEST(Nvfp4ScaleTest, InverseScaleOfZeroIsFltMax) {
  EXPECT_EQ(cpu::BlockInverseScale(0.0f, 0.25f), kFltMax);
  EXPECT_EQ(cpu::BlockInverseScale(2.0f, 0.25f), 2.0f);
}

TEST(Nvfp4BlockTest, AllZeroBlockGetsScaleZeroAndCodesZero) {
  auto backend = CreateCpuBackend();
  std::vector<float> x(48, 0.0f);
  for (int i = 16; i < 32; ++i) x[i] = static_cast<float>(i - 20);  // block 1: -4..11
  x[40] = -0.0f;                                                    // block 2: zeros, one -0
  OwnedQuantized q(Format::kNvfp4, BlockShape::k1x16, ScaleLayout::kPlain, 1, 48);
  ASSERT_TRUE(testing::QuantizeInto(*backend, F32View(x, 1, 48), QuantizeOptions(), &q).ok());
  EXPECT_EQ(q.scale(0, 0), 0x00);
  EXPECT_EQ(q.scale(0, 2), 0x00);
  EXPECT_NE(q.scale(0, 1), 0x00);
  for (int c = 0; c < 16; ++c) EXPECT_EQ(q.code(0, c), 0x0) << c;
  for (int c = 32; c < 48; ++c) EXPECT_EQ(q.code(0, c), c == 40 ? 0x8 : 0x0) << c;
  // Block 1 (amax 11 = the global amax): u = RN(11 * RN(RN(2688 / 11) * c6)) rounds to 448.
  EXPECT_EQ(q.scale(0, 1), 0x7E);
  EXPECT_EQ(q.code(0, 16 + 15), 0x7);  // 11 -> 6
  EXPECT_EQ(q.code(0, 16), 0xC);       // -4 * 6 / 11 = -2.18 -> -2
}

TEST(Nvfp4BlockTest, UnderflowingBlockGetsScaleZeroAndSaturatedCodes) {
  // Block 0 holds 1e6 (the amax); block 1 holds values near 1e-3: u = 1e-3 * 448 / 1e6 =
  // 4.5e-7, below half of E4M3's smallest step 2^-9, so sf = 0, inv = FLT_MAX and every
  // nonzero element saturates to +-6, dequantizing to 0.
  auto backend = CreateCpuBackend();
  std::vector<float> x(32, 0.0f);
  x[0] = 1e6f;
  x[16] = 1e-3f;
  x[17] = -2e-3f;
  x[18] = 0.0f;
  x[19] = -0.0f;
  OwnedQuantized q(Format::kNvfp4, BlockShape::k1x16, ScaleLayout::kPlain, 1, 32);
  ASSERT_TRUE(testing::QuantizeInto(*backend, F32View(x, 1, 32), QuantizeOptions(), &q).ok());
  EXPECT_EQ(q.scale(0, 1), 0x00);
  EXPECT_EQ(q.code(0, 16), 0x7);
  EXPECT_EQ(q.code(0, 17), 0xF);
  EXPECT_EQ(q.code(0, 18), 0x0);
  EXPECT_EQ(q.code(0, 19), 0x8);
  std::vector<float> dq(32, 1.0f);
  ASSERT_TRUE(backend->Dequantize(q.cview(), F32Out(&dq, 1, 32), nullptr).ok());
  for (int c = 16; c < 32; ++c) EXPECT_EQ(std::fabs(dq[c]), 0.0f) << c;
  EXPECT_NEAR(dq[0], 1e6f, 1.0f);
}

TEST(Nvfp4BlockTest, NanAndInf) {
  auto backend = CreateCpuBackend();
  // NaN does not count in the amax: global amax 3, block amax 3.
  std::vector<float> x(16, 1.0f);
  x[0] = std::nanf("");
  x[1] = 3.0f;
  x[2] = -std::nanf("");
  OwnedQuantized q(Format::kNvfp4, BlockShape::k1x16, ScaleLayout::kPlain, 1, 16);
  ASSERT_TRUE(testing::QuantizeInto(*backend, F32View(x, 1, 16), QuantizeOptions(), &q).ok());
  EXPECT_EQ(q.global[0], 3.0f);
  EXPECT_EQ(q.global[1], 2688.0f / 3.0f);
  EXPECT_EQ(q.code(0, 0), 0x7);
  EXPECT_EQ(q.code(0, 1), 0x7);
  EXPECT_EQ(q.code(0, 2), 0x7);
  EXPECT_EQ(q.code(0, 3), 0x4);  // 1 * 6 / 3 = 2
  float amax = -1;
  ASSERT_TRUE(backend->Amax(F32View(x, 1, 16), &amax, nullptr).ok());
  EXPECT_EQ(amax, 3.0f);

  // Inf: the amax is Inf, so S_enc = 1; the Inf block's u is Inf and saturates to 448; its
  // finite elements become x / 448.
  std::vector<float> y(32, 0.0f);
  y[0] = kInf;
  y[1] = -kInf;
  y[2] = 1792.0f;  // 1792 / 448 = 4
  y[16] = 2.0f;    // block 1: bamax 2, u = RN(2 * c6) = 0.33333334 -> E4M3 0.34375 (0x2B)
  y[17] = 1.0f;
  OwnedQuantized qi(Format::kNvfp4, BlockShape::k1x16, ScaleLayout::kPlain, 1, 32);
  ASSERT_TRUE(testing::QuantizeInto(*backend, F32View(y, 1, 32), QuantizeOptions(), &qi).ok());
  EXPECT_EQ(qi.global[0], kInf);
  EXPECT_EQ(qi.global[1], 1.0f);
  EXPECT_EQ(qi.scale(0, 0), 0x7E);
  EXPECT_EQ(qi.code(0, 0), 0x7);
  EXPECT_EQ(qi.code(0, 1), 0xF);
  EXPECT_EQ(qi.code(0, 2), 0x6);
  EXPECT_EQ(qi.scale(0, 1), 0x2B);
  // inv = RN(1 / 0.34375) = 2.9090909: 2 -> 5.818 -> 6; 1 -> 2.909 -> 3.
  EXPECT_EQ(qi.code(0, 16), 0x7);
  EXPECT_EQ(qi.code(0, 17), 0x5);
}

TEST(Nvfp4DequantizeTest, ProductThenDecodeScale) {
  auto backend = CreateCpuBackend();
  // code 7 (6), sf 0x7E (448), S_enc 3: DQ = RN(RN(6 * 448) * RN(1 / 3)) = RN(2688 *
  // 0.33333334) = RN(896.0000267) = 896 (the f32 step at 896 is 2^-14).
  std::vector<uint8_t> codes(8, 0x00), scales(1, 0x7E);
  codes[0] = 0x97;  // element 0: code 7; element 1: code 9 (-0.5)
  codes[1] = 0x0F;  // element 2: -6; element 3: 0
  std::vector<float> global = {8.0f, 3.0f};
  ConstQuantizedTensor q{Format::kNvfp4, BlockShape::k1x16, ScaleLayout::kPlain, 1, 16,
                         codes.data(),   codes.size(),      scales.data(),       1, global.data()};
  std::vector<float> out(16, -7.0f);
  ASSERT_TRUE(backend->Dequantize(q, F32Out(&out, 1, 16), nullptr).ok());
  EXPECT_EQ(out[0], 896.0f);
  EXPECT_EQ(out[1], -224.0f * (1.0f / 3.0f));  // RN(-224 * 0.33333334)
  EXPECT_EQ(out[2], -896.0f);
  EXPECT_EQ(out[3], 0.0f);

  // bf16 output: RN of the f32 value. 896 is exact; -74.666672 -> bf16 -74.5 (0xC295).
  std::vector<uint16_t> out16(16, 0xFFFF);
  MutTensor o16{out16.data(), DType::kBF16, 1, 16, out16.size() * 2};
  ASSERT_TRUE(backend->Dequantize(q, o16, nullptr).ok());
  EXPECT_EQ(out16[0], 0x4460);  // 896
  EXPECT_EQ(out16[1], 0xC295);  // -74.5
  EXPECT_EQ(out16[3], 0x0000);

  // A NaN scale byte (0x7F) dequantizes to NaN.
  scales[0] = 0x7F;
  ASSERT_TRUE(backend->Dequantize(q, F32Out(&out, 1, 16), nullptr).ok());
  EXPECT_TRUE(std::isnan(out[0]));
  EXPECT_TRUE(std::isnan(out[3]));
}

}  // namespace
}  // namespace fp4q::kernels
