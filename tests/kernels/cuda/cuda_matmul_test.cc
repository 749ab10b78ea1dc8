// The CUDA backend's FP4 GEMM against the CPU reference (exact products summed in f64): relative
// Frobenius error below 1e-5 for f32 output and 3e-3 for bf16 output (one bf16 rounding), for
// NVFP4 and MXFP4, both block shapes and scale layouts, and M on every path (small-M kernel up
// to 16; on Hopper the wgmma kernel up to 256, elsewhere the mid-M kernel up to 64; dequantize +
// cuBLASLt above), including the decode shapes
// M = 1 and 16 at K = 8192, and each direct kernel's edges: for small M, M = 1, 3, 8, 9, 16,
// N not a multiple of 16 or 128; for mid M, M on both sides of its 32- and 64-row A tiles, N
// not a multiple of 256; for both, K not a multiple of 128 (NVFP4 also K = 16 mod 32), single
// and split K slices.
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"

namespace fp4q::kernels {
namespace {

using cuda_testing::CudaTest;
using cuda_testing::DenseInput;
using cuda_testing::DeviceBuffer;
using cuda_testing::Dist;
using cuda_testing::QuantPair;

float Bf16ToFloat(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

std::vector<double> AsDoubles(const std::vector<uint8_t>& raw, DType dtype) {
  std::vector<double> out;
  if (dtype == DType::kF32) {
    std::vector<float> f(raw.size() / 4);
    std::memcpy(f.data(), raw.data(), raw.size());
    out.assign(f.begin(), f.end());
  } else {
    std::vector<uint16_t> h(raw.size() / 2);
    std::memcpy(h.data(), raw.data(), raw.size());
    for (uint16_t b : h) out.push_back(Bf16ToFloat(b));
  }
  return out;
}

// ||got - want|| / ||want||; NaN when any value is non-finite.
double RelativeFrobenius(const std::vector<double>& got, const std::vector<double>& want) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(got[i]) || !std::isfinite(want[i])) return NAN;
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  // An exactly zero reference (a dot product that cancels, e.g. M = N = 1 with coarse MXFP4
  // values): the absolute error, which must then be 0 as well.
  return den == 0.0 ? std::sqrt(num) : std::sqrt(num / den);
}

struct Shape {
  int64_t m, n, k;
};

class MatmulTest : public CudaTest {
 protected:
  void RunShapes(const std::vector<Shape>& shapes, int salt,
                 const std::vector<Format>& formats = {Format::kNvfp4, Format::kMxfp4});
  // q's host tensor quantized by the CPU backend (its block shape and scale layout) from `dist`
  // values, then copied to its device tensor.
  void QuantizeOnHostAndUpload(QuantPair* q, Format format, Dist dist, std::mt19937& rng) {
    DenseInput x =
        cuda_testing::MakeInput(gpu(), DType::kF32, q->host.rows, q->host.cols, dist, rng);
    QuantizeOptions o;
    o.format = format;
    o.block = q->host.block;
    o.scale_layout = q->host.scale_layout;
    ASSERT_TRUE(cpu().Quantize(x.host_view(), o, nullptr, &q->host, nullptr, nullptr).ok());
    q->d_codes->Upload(q->codes.data(), q->codes.size());
    q->d_scales->Upload(q->scales.data(), q->scales.size());
    q->d_global->Upload(q->global.data(), 8);
  }
};

TEST_F(MatmulTest, WithinToleranceOfCpuReference) {
  RunShapes({{1, 8, 64},
             {1, 300, 1024},
             {5, 72, 96},
             {16, 256, 4096},
             {17, 40, 160},
             {33, 129, 224},
             {128, 512, 2048},
             {129, 257, 512},
             {300, 200, 1056},
             {512, 384, 512},
             {520, 136, 256},
             {1024, 72, 128}},
            6000);
}

// Small-M kernel edges (K a multiple of 32: both formats). K <= 128 runs one K slice; the rest
// split K; 16 x 25600 x 2048 hits the kernel's cap on chunks per slice.
TEST_F(MatmulTest, SmallMRaggedShapes) {
  RunShapes({{3, 37, 96},
             {1, 1, 32},
             {8, 129, 1056},
             {9, 300, 4128},
             {16, 23, 224},
             {16, 513, 2080},
             {3, 1000, 9216},
             {16, 25600, 2048}},
            8000);
}

// NVFP4 only: K = 16 mod 32 (rows of codes only 8-byte aligned, half-filled last lane).
TEST_F(MatmulTest, SmallMKOddMultipleOf16) {
  RunShapes({{1, 45, 48}, {16, 130, 1040}, {7, 64, 4112}, {12, 17, 16}, {8, 200, 144}}, 9000,
            {Format::kNvfp4});
}

// Mid-M kernel edges (16 < M <= 64; K a multiple of 32: both formats): 4 and 8 n8 tiles of A
// rows, M not a multiple of either tile, N not a multiple of 256 (warps with no rows, partial
// warps), K not a multiple of 128, one chunk of K, single and split slices; M = 65, the first
// M past the kernel. On Hopper these shapes run the wgmma kernel instead.
TEST_F(MatmulTest, MidMRaggedShapes) {
  RunShapes({{17, 300, 4128},
             {32, 1000, 2080},
             {33, 257, 9216},
             {64, 513, 1056},
             {40, 255, 128},
             {48, 40, 96},
             {64, 770, 2048},
             {57, 600, 3072},
             {25, 130, 4096},
             {65, 300, 2080}},
            10000);
}

// NVFP4 only: mid-M with K = 16 mod 32.
TEST_F(MatmulTest, MidMKOddMultipleOf16) {
  RunShapes({{24, 130, 1040}, {50, 70, 4112}, {63, 17, 16}, {40, 300, 144}}, 11000,
            {Format::kNvfp4});
}

// The wgmma kernel's edges (Hopper, 16 < M <= 256; K a multiple of 32: both formats): token
// tiles of 32, 64 and 128 with M not a multiple of them, two tiles (M = 200), N not a multiple
// of 128 (a warpgroup with no rows, warps with some), one chunk of K and K not a multiple of
// 128, single and split K slices; M = 300 and 512 past it (the kernel took them in the H200 run
// that set the bound), M = 513. Elsewhere these run the mid-M kernel or cuBLASLt.
TEST_F(MatmulTest, WgmmaRaggedShapes) {
  RunShapes({{17, 300, 4128},
             {33, 200, 2080},
             {65, 129, 1056},
             {100, 1000, 2048},
             {128, 513, 4096},
             {200, 64, 128},
             {300, 130, 3072},
             {512, 257, 2080},
             {97, 40, 96},
             {513, 136, 256}},
            12000);
}

// The wgmma kernel with K split in two (its CTA pairs): 66 and 57 row groups of 128 with one
// token tile split K in two on GPUs of 132 and 114 SMs (the H100 / H200 SXM and PCIe kinds).
TEST_F(MatmulTest, WgmmaKSplitInTwo) {
  RunShapes({{64, 8448, 1024}, {128, 8448, 512}, {33, 7296, 1024}, {100, 7256, 544}}, 12500);
}

// NVFP4 only: the wgmma kernel with K = 16 mod 32.
TEST_F(MatmulTest, WgmmaKOddMultipleOf16) {
  RunShapes({{70, 130, 1040}, {128, 70, 4112}, {257, 17, 16}, {400, 300, 144}}, 13000,
            {Format::kNvfp4});
}

// The benchmark's decode shapes and a mid-M one at K = 8192 (large: kept apart so memcheck runs
// can leave them out).
TEST_F(MatmulTest, DecodeShapesAtK8192) {
  RunShapes({{16, 1024, 8192}, {1, 8192, 8192}, {64, 1024, 8192}, {128, 1024, 8192}}, 7000);
}

// The small-M kernel's split tickets outlive a call (one zeroed array per stream, which the
// kernel puts back to zero): the same products on the default stream, twice on a second stream
// (N = 12800: 100 row groups grow that stream's array past its first 64 tickets), then on the
// default stream again; each within tolerance of the CPU reference and every repeat the same bits.
TEST_F(MatmulTest, SmallMSplitTicketsAcrossCallsAndStreams) {
  absl::StatusOr<Stream> side = gpu().CreateStream();
  ASSERT_TRUE(side.ok()) << side.status();
  const std::vector<Shape> shapes = {{1, 300, 1024}, {16, 1024, 8192}, {1, 12800, 1024}};
  std::vector<std::vector<uint8_t>> first(shapes.size());
  const std::vector<Stream> order = {nullptr, *side, *side, nullptr};
  for (size_t round = 0; round < order.size(); ++round) {
    for (size_t i = 0; i < shapes.size(); ++i) {
      const Shape& sh = shapes[i];
      SCOPED_TRACE(absl::StrCat("round ", round, " M=", sh.m, " N=", sh.n, " K=", sh.k));
      auto rng = Rng(14000 + static_cast<int>(i));
      QuantPair a(gpu(), Format::kNvfp4, BlockShape::k1x16, ScaleLayout::kPlain, sh.m, sh.k);
      QuantPair b(gpu(), Format::kNvfp4, BlockShape::k1x16, ScaleLayout::kSwizzled, sh.n, sh.k);
      for (QuantPair* q : {&a, &b}) {
        ASSERT_NO_FATAL_FAILURE(QuantizeOnHostAndUpload(q, Format::kNvfp4, Dist::kNormal, rng));
      }
      const size_t c_bytes = static_cast<size_t>(sh.m * sh.n) * 4;
      std::vector<uint8_t> poison(c_bytes, cuda_testing::kHostPoison);
      DeviceBuffer got(gpu(), c_bytes);
      got.Upload(poison.data(), c_bytes);
      const absl::Status st = gpu().Matmul(AsConst(a.dev), AsConst(b.dev),
                                           MutTensor{got.get(), DType::kF32, sh.m, sh.n, c_bytes},
                                           order[round]);
      ASSERT_TRUE(st.ok()) << st;
      ASSERT_TRUE(gpu().Synchronize(order[round]).ok());
      std::vector<uint8_t> bytes = got.Download();
      if (round == 0) {
        std::vector<uint8_t> want(c_bytes, cuda_testing::kHostPoison);
        ASSERT_TRUE(cpu().Matmul(AsConst(a.host), AsConst(b.host),
                                 MutTensor{want.data(), DType::kF32, sh.m, sh.n, c_bytes}, nullptr)
                        .ok());
        const double err = RelativeFrobenius(AsDoubles(bytes, DType::kF32),
                                             AsDoubles(want, DType::kF32));
        EXPECT_LT(err, 1e-5) << "relative Frobenius error " << err;
        first[i] = std::move(bytes);
      } else {
        EXPECT_EQ(bytes, first[i]) << "differs from round 0";
      }
    }
  }
  gpu().DestroyStream(*side);
}

void MatmulTest::RunShapes(const std::vector<Shape>& shapes, int salt,
                           const std::vector<Format>& formats) {
  int i = 0;
  for (Format format : formats) {
    for (const Shape& sh : shapes) {
      for (DType c_dtype : {DType::kF32, DType::kBF16}) {
        ++i;
        const bool mx = format == Format::kMxfp4;
        // 16x16 blocks need rows % 16 == 0; alternate block shapes and layouts per operand.
        const BlockShape a_block = mx ? BlockShape::k1x32
                                      : (sh.m % 16 == 0 && i % 2 ? BlockShape::k16x16
                                                                 : BlockShape::k1x16);
        const BlockShape b_block = mx ? BlockShape::k1x32
                                      : (sh.n % 16 == 0 && i % 3 ? BlockShape::k16x16
                                                                 : BlockShape::k1x16);
        const ScaleLayout a_layout = i % 4 < 2 ? ScaleLayout::kPlain : ScaleLayout::kSwizzled;
        const ScaleLayout b_layout = i % 4 == 1 || i % 4 == 2 ? ScaleLayout::kSwizzled
                                                              : ScaleLayout::kPlain;
        SCOPED_TRACE(absl::StrCat(FormatName(format), " M=", sh.m, " N=", sh.n, " K=", sh.k,
                                  c_dtype == DType::kF32 ? " f32" : " bf16", " blocks ",
                                  BlockShapeName(a_block), "/", BlockShapeName(b_block),
                                  " layouts ", static_cast<int>(a_layout), "/",
                                  static_cast<int>(b_layout)));
        auto rng = Rng(salt + i);
        QuantPair a(gpu(), format, a_block, a_layout, sh.m, sh.k);
        QuantPair b(gpu(), format, b_block, b_layout, sh.n, sh.k);
        for (QuantPair* q : {&a, &b}) {
          ASSERT_NO_FATAL_FAILURE(QuantizeOnHostAndUpload(
              q, format, i % 2 ? Dist::kNormal : Dist::kOutliers, rng));
        }
        const size_t es = c_dtype == DType::kF32 ? 4 : 2;
        const size_t c_bytes = static_cast<size_t>(sh.m * sh.n) * es;
        std::vector<uint8_t> want(c_bytes, cuda_testing::kHostPoison);
        DeviceBuffer got(gpu(), c_bytes);
        ASSERT_TRUE(cpu().Matmul(AsConst(a.host), AsConst(b.host),
                                 MutTensor{want.data(), c_dtype, sh.m, sh.n, c_bytes}, nullptr)
                        .ok());
        const absl::Status s = gpu().Matmul(AsConst(a.dev), AsConst(b.dev),
                                            MutTensor{got.get(), c_dtype, sh.m, sh.n, c_bytes},
                                            nullptr);
        ASSERT_TRUE(s.ok()) << s;
        const double err = RelativeFrobenius(AsDoubles(got.Download(), c_dtype),
                                             AsDoubles(want, c_dtype));
        const double tol = c_dtype == DType::kF32 ? 1e-5 : 3e-3;
        EXPECT_LT(err, tol) << "relative Frobenius error " << err;
        std::printf("matmul %s M=%lld N=%lld K=%lld %s: rel. Frobenius error %.3g\n",
                    FormatName(format), static_cast<long long>(sh.m),
                    static_cast<long long>(sh.n), static_cast<long long>(sh.k),
                    c_dtype == DType::kF32 ? "f32" : "bf16", err);
      }
    }
  }
}

}  // namespace
}  // namespace fp4q::kernels
