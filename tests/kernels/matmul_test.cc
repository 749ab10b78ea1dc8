// The FP4 matmul reference (NUMERICS 9): hand-computed small cases and a naive
// dequantize-then-f64-GEMM comparison.
#include <cmath>
#include <cstdint>
#include <vector>

#include "cpu/formats.h"
#include "fp4q/kernels/backend.h"
#include "gtest/gtest.h"
#include "kernels/test_util.h"

namespace fp4q::kernels {
namespace {

using testing::F32Out;
using testing::F32View;
using testing::OwnedQuantized;

// Packs per-element codes into bytes (element 2j low nibble).
std::vector<uint8_t> Pack(const std::vector<uint8_t>& codes) {
  std::vector<uint8_t> out(codes.size() / 2);
  for (size_t j = 0; j < out.size(); ++j) out[j] = codes[2 * j] | (codes[2 * j + 1] << 4);
  return out;
}

TEST(MatmulTest, HandComputedNvfp4) {
  auto backend = CreateCpuBackend();
  // A [1, 16]: all 1.0 (code 2), scale 1 (0x38), S_enc 2 (S_dec 0.5).
  const std::vector<uint8_t> a_codes = Pack(std::vector<uint8_t>(16, 0x2));
  const std::vector<uint8_t> a_scales = {0x38};
  const std::vector<float> a_global = {1.0f, 2.0f};
  // B [2, 16], S_enc 4 (S_dec 0.25). Row 0: all 2.0 (code 4), scale 2 (0x40).
  // Row 1: 1.5 (code 3) and -0.5 (code 9) alternating, scale 0.5 (0x30).
  std::vector<uint8_t> b_elems(32);
  for (int k = 0; k < 16; ++k) {
    b_elems[k] = 0x4;
    b_elems[16 + k] = k % 2 == 0 ? 0x3 : 0x9;
  }
  const std::vector<uint8_t> b_codes = Pack(b_elems);
  const std::vector<uint8_t> b_scales = {0x40, 0x30};
  const std::vector<float> b_global = {1.0f, 4.0f};
  ConstQuantizedTensor a{Format::kNvfp4,
                         BlockShape::k1x16,
                         ScaleLayout::kPlain,
                         1,
                         16,
                         a_codes.data(),
                         a_codes.size(),
                         a_scales.data(),
                         a_scales.size(),
                         a_global.data()};
  ConstQuantizedTensor b{Format::kNvfp4,
                         BlockShape::k1x16,
                         ScaleLayout::kPlain,
                         2,
                         16,
                         b_codes.data(),
                         b_codes.size(),
                         b_scales.data(),
                         b_scales.size(),
                         b_global.data()};
  // C[0][0] = 16 * (1 * 1) * (2 * 2) * 0.5 * 0.25 = 8.
  // C[0][1] = (8 * (1.5 * 0.5) + 8 * (-0.5 * 0.5)) * 0.125 = (6 - 2) * 0.125 = 0.5.
  std::vector<float> c(2, -1.0f);
  ASSERT_TRUE(backend->Matmul(a, b, F32Out(&c, 1, 2), nullptr).ok());
  EXPECT_EQ(c, (std::vector<float>{8.0f, 0.5f}));
  // C' = B * A^T is the transpose: [2, 1].
  std::vector<float> ct(2, -1.0f);
  ASSERT_TRUE(backend->Matmul(b, a, F32Out(&ct, 2, 1), nullptr).ok());
  EXPECT_EQ(ct, (std::vector<float>{8.0f, 0.5f}));
  // bf16 output.
  std::vector<uint16_t> c16(2, 0xFFFF);
  ASSERT_TRUE(backend->Matmul(a, b, MutTensor{c16.data(), DType::kBF16, 1, 2, 4}, nullptr).ok());
  EXPECT_EQ(c16, (std::vector<uint16_t>{0x4100, 0x3F00}));  // 8, 0.5
}

TEST(MatmulTest, HandComputedMxfp4) {
  auto backend = CreateCpuBackend();
  // A [1, 32]: element 0 = 6 (code 7), element 1 = -1 (code 0xA), rest 0; scale b = 128 (2).
  std::vector<uint8_t> a_elems(32, 0x0), b_elems(32, 0x0);
  a_elems[0] = 0x7;
  a_elems[1] = 0xA;
  // B [1, 32]: element 0 = 0.5 (code 1), element 1 = 4 (code 6); scale b = 125 (0.25).
  b_elems[0] = 0x1;
  b_elems[1] = 0x6;
  const auto a_codes = Pack(a_elems), b_codes = Pack(b_elems);
  const std::vector<uint8_t> a_scales = {128}, b_scales = {125};
  const std::vector<float> g = {0.0f, 1.0f};
  ConstQuantizedTensor a{Format::kMxfp4,
                         BlockShape::k1x32,
                         ScaleLayout::kPlain,
                         1,
                         32,
                         a_codes.data(),
                         16,
                         a_scales.data(),
                         1,
                         g.data()};
  ConstQuantizedTensor b{Format::kMxfp4,
                         BlockShape::k1x32,
                         ScaleLayout::kPlain,
                         1,
                         32,
                         b_codes.data(),
                         16,
                         b_scales.data(),
                         1,
                         g.data()};
  // (6 * 2) * (0.5 * 0.25) + (-1 * 2) * (4 * 0.25) = 1.5 - 2 = -0.5.
  std::vector<float> c(1, 7.0f);
  ASSERT_TRUE(backend->Matmul(a, b, F32Out(&c, 1, 1), nullptr).ok());
  EXPECT_EQ(c[0], -0.5f);
}

TEST(MatmulTest, MatchesDequantizeThenF64Gemm) {
  auto backend = CreateCpuBackend();
  const int64_t m = 7, n = 5, k = 96;
  const std::vector<float> xa = testing::Normal(m * k, 51, 3.0f);
  const std::vector<float> xb = testing::Normal(n * k, 52, 0.01f);
  // Operands with different block shapes and layouts (allowed per operand).
  QuantizeOptions oa;
  OwnedQuantized qa(Format::kNvfp4, BlockShape::k1x16, ScaleLayout::kPlain, m, k);
  ASSERT_TRUE(testing::QuantizeInto(*backend, F32View(xa, m, k), oa, &qa).ok());
  QuantizeOptions ob;
  ob.scale_layout = ScaleLayout::kSwizzled;
  ob.rounding = Rounding::kStochastic;
  OwnedQuantized qb(Format::kNvfp4, BlockShape::k1x16, ScaleLayout::kSwizzled, n, k);
  ASSERT_TRUE(testing::QuantizeInto(*backend, F32View(xb, n, k), ob, &qb).ok());

  std::vector<float> c(m * n, std::nanf(""));
  ASSERT_TRUE(backend->Matmul(qa.cview(), qb.cview(), F32Out(&c, m, n), nullptr).ok());
  std::vector<float> da(xa.size()), db(xb.size());
  ASSERT_TRUE(backend->Dequantize(qa.cview(), F32Out(&da, m, k), nullptr).ok());
  ASSERT_TRUE(backend->Dequantize(qb.cview(), F32Out(&db, n, k), nullptr).ok());
  double err = 0, norm = 0;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double want = 0;
      for (int64_t t = 0; t < k; ++t) want += double(da[i * k + t]) * db[j * k + t];
      const double got = c[i * n + j];
      // The f32 DQ values carry one rounding each (2^-24 relative): far below 1e-6.
      EXPECT_NEAR(got, want, 1e-6 * std::fabs(want) + 1e-12) << i << ", " << j;
      err += (got - want) * (got - want);
      norm += want * want;
    }
  }
  EXPECT_LT(std::sqrt(err / norm), 1e-6);
  EXPECT_GT(norm, 0.0);

  // Exactness: with the scaled elements summed in f64 in k order and the decode scales applied
  // after, the f32 output is that f64 value rounded once. Recompute it here.
  const double s_dec_a = double(1.0f / qa.global[1]), s_dec_b = double(1.0f / qb.global[1]);
  std::vector<uint8_t> b_plain(n * k / 16);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < k / 16; ++j)
      b_plain[r * (k / 16) + j] = qb.scales[SwizzledScaleOffset(r, j, k / 16)];
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0;
      for (int64_t t = 0; t < k; ++t) {
        const double ea =
            double(cpu::E2m1ToFloat(qa.code(i, t))) * cpu::E4m3ToFloat(qa.scale(i, t / 16));
        const double eb = double(cpu::E2m1ToFloat(qb.code(j, t))) *
                          cpu::E4m3ToFloat(b_plain[j * (k / 16) + t / 16]);
        sum += ea * eb;
      }
      EXPECT_EQ(c[i * n + j], static_cast<float>((sum * s_dec_a) * s_dec_b)) << i << ", " << j;
    }
  }
}

}  // namespace
}  // namespace fp4q::kernels
