// The CUDA backend's FiniteGuard (the device-side check of a state-changing Quantize / Qdq) and
// the Amax index of the first non-finite element, against the CPU reference: the same outcome,
// quantity, index and values, and nothing written by a refused call. Device buffers start
// poisoned.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"

namespace fp4q::kernels {
namespace {

using cuda_testing::CudaTest;
using cuda_testing::DeviceBuffer;
using cuda_testing::Dist;

bool SameFloat(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) || std::memcmp(&a, &b, 4) == 0;
}
bool SameDouble(double a, double b) {
  return (std::isnan(a) && std::isnan(b)) || std::memcmp(&a, &b, 8) == 0;
}

TEST_F(CudaTest, FiniteGuardMatchesCpuAndRefusalsWriteNothing) {
  int id = 0;
  for (Format format : {Format::kNvfp4, Format::kMxfp4}) {
    for (auto [rows, cols] :
         std::vector<std::pair<int64_t, int64_t>>{{1, 32}, {7, 96}, {64, 128}, {33, 1024}}) {
      for (int spoil = 0; spoil < 4; ++spoil) {  // none, x NaN, v overflow, DQ range
        for (bool qdq : {false, true}) {
          ++id;
          SCOPED_TRACE(absl::StrCat(FormatName(format), " ", rows, "x", cols, " spoil ", spoil,
                                    qdq ? " qdq" : " quantize"));
          auto rng = Rng(9500 + id);
          QuantizeOptions o;
          o.format = format;
          o.block = format == Format::kMxfp4 ? BlockShape::k1x32 : BlockShape::k1x16;
          o.rounding = id % 2 ? Rounding::kStochastic : Rounding::kNearest;
          o.seed = 11;
          o.step = 3;
          const size_t n = static_cast<size_t>(rows * cols);
          const DType dtype = id % 3 ? DType::kBF16 : DType::kF32;
          cuda_testing::DenseInput x =
              cuda_testing::MakeInput(gpu(), dtype, rows, cols, Dist::kNormal, rng, 0);
          std::vector<float> r(n, 0.01f);
          const size_t at = n / 3;
          auto put = [&](float value) {
            x.f32[at] = value;
            if (dtype == DType::kBF16) {
              x.bf16 = cuda_testing::ToBf16(x.f32);
              x.dev->Upload(x.bf16.data(), n * 2);
            } else {
              x.dev->Upload(x.f32.data(), n * 4);
            }
          };
          if (spoil == 1) put(std::numeric_limits<float>::quiet_NaN());
          if (spoil == 2) {
            put(3e38f);
            r[at] = 3e38f;
          }
          if (spoil == 3) put(3e38f);
          DeviceBuffer dr(gpu(), n * 4, id % 4 == 3 ? 4 : 0);
          dr.Upload(r.data(), n * 4);
          std::vector<float> hr = r;
          FiniteGuard want;
          DeviceBuffer dguard(gpu(), sizeof(FiniteGuard), id % 2 ? 8 : 0);
          if (qdq) {
            const DType out_dtype = id % 4 < 2 ? DType::kF32 : DType::kBF16;
            const size_t ob = n * (out_dtype == DType::kF32 ? 4 : 2);
            std::vector<uint8_t> hout(ob, cuda_testing::kHostPoison);
            DeviceBuffer dout(gpu(), ob);
            ASSERT_TRUE(cpu()
                            .Qdq(x.host_view(), o, hr.data(),
                                 MutTensor{hout.data(), out_dtype, rows, cols, ob}, nullptr, &want)
                            .ok());
            const absl::Status s = gpu().Qdq(x.dev_view(), o, static_cast<float*>(dr.get()),
                                             MutTensor{dout.get(), out_dtype, rows, cols, ob},
                                             nullptr, static_cast<FiniteGuard*>(dguard.get()));
            ASSERT_TRUE(s.ok()) << s;
            if (want.outcome == StepOutcome::kOk) {
              EXPECT_TRUE(cuda_testing::SameDense(dout.Download(), hout, out_dtype, "out"));
            } else {
              EXPECT_EQ(dout.Download(), std::vector<uint8_t>(ob, cuda_testing::kDevicePoison));
            }
          } else {
            cuda_testing::QuantPair q(gpu(), format, o.block, ScaleLayout::kPlain, rows, cols);
            ASSERT_TRUE(
                cpu().Quantize(x.host_view(), o, hr.data(), &q.host, nullptr, nullptr, &want).ok());
            const absl::Status s =
                gpu().Quantize(x.dev_view(), o, static_cast<float*>(dr.get()), &q.dev, nullptr,
                               nullptr, static_cast<FiniteGuard*>(dguard.get()));
            ASSERT_TRUE(s.ok()) << s;
            if (want.outcome == StepOutcome::kOk) {
              EXPECT_TRUE(q.Matches("guarded quantize"));
            } else {  // nothing written on either side: each still holds its own poison
              const std::vector<uint8_t> codes = q.d_codes->Download();
              const std::vector<uint8_t> scales = q.d_scales->Download();
              const std::vector<uint8_t> global = q.d_global->Download();
              EXPECT_EQ(codes, std::vector<uint8_t>(codes.size(), cuda_testing::kDevicePoison));
              EXPECT_EQ(scales, std::vector<uint8_t>(scales.size(), cuda_testing::kDevicePoison));
              EXPECT_EQ(global, std::vector<uint8_t>(global.size(), cuda_testing::kDevicePoison));
              EXPECT_EQ(q.codes, std::vector<uint8_t>(q.codes.size(), cuda_testing::kHostPoison));
            }
          }
          EXPECT_EQ(want.outcome, spoil == 0   ? StepOutcome::kOk
                                  : spoil == 1 ? StepOutcome::kNonFiniteUpdate
                                  : spoil == 2 ? StepOutcome::kNonFiniteResult
                                               : StepOutcome::kOutOfRange);
          const FiniteGuard got = dguard.DownloadAs<FiniteGuard>()[0];
          EXPECT_EQ(got.outcome, want.outcome);
          EXPECT_EQ(got.quantity, want.quantity);
          EXPECT_EQ(got.index, want.index);
          EXPECT_TRUE(SameFloat(got.value, want.value)) << got.value << " vs " << want.value;
          EXPECT_TRUE(SameFloat(got.amax, want.amax)) << got.amax << " vs " << want.amax;
          EXPECT_TRUE(SameDouble(got.bound, want.bound)) << got.bound << " vs " << want.bound;
          // The residual: unchanged when refused, the CPU's when not.
          EXPECT_TRUE(cuda_testing::SameDense(
              dr.DownloadAs<float>(), want.outcome == StepOutcome::kOk ? hr : r, "residual"));
        }
      }
    }
  }
}

TEST_F(CudaTest, AmaxFirstNonFiniteMatchesCpu) {
  int id = 0;
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (auto [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{
             {1, 1}, {3, 5}, {7, 333}, {129, 257}, {1024, 1031}}) {
      for (Dist dist : {Dist::kNormal, Dist::kSpecial}) {
        ++id;
        SCOPED_TRACE(absl::StrCat(rows, "x", cols, " ", cuda_testing::DistName(dist)));
        auto rng = Rng(9900 + id);
        cuda_testing::DenseInput x =
            cuda_testing::MakeInput(gpu(), dtype, rows, cols, dist, rng, id % 3 ? 0 : 2);
        float want = -1.0f;
        int64_t want_first = 77;
        ASSERT_TRUE(cpu().Amax(x.host_view(), &want, nullptr, &want_first).ok());
        DeviceBuffer out(gpu(), 4);
        DeviceBuffer first(gpu(), 8, id % 2 ? 0 : 4);
        ASSERT_TRUE(gpu()
                        .Amax(x.dev_view(), static_cast<float*>(out.get()), nullptr,
                              static_cast<int64_t*>(first.get()))
                        .ok());
        EXPECT_EQ(first.DownloadAs<int64_t>()[0], want_first);
        const float got = out.DownloadAs<float>()[0];
        EXPECT_TRUE(cuda_testing::SameBytes(&got, &want, 4, "amax"));
      }
    }
  }
}

}  // namespace
}  // namespace fp4q::kernels
