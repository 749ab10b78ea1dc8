// The CUDA backend's Amax, Dequantize, RHT, QDQ, error feedback and UpdateWeight against the CPU
// reference, bit for bit, on fresh random data of awkward shapes; and the golden NVFP4 vectors.
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "fp4q/common/json.h"
#include "fp4q/common/safetensors.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"

namespace fp4q::kernels {
namespace {

using cuda_testing::CudaTest;
using cuda_testing::DenseInput;
using cuda_testing::DeviceBuffer;
using cuda_testing::Dist;
using cuda_testing::QuantPair;
using cuda_testing::SameBytes;

constexpr Dist kDists[] = {Dist::kNormal, Dist::kSpecial, Dist::kHeavyTail, Dist::kOutliers,
                           Dist::kMidpoints};

size_t ElemSize(DType d) { return d == DType::kF32 ? 4 : 2; }

// ---------------------------------------------------------------- Amax

TEST_F(CudaTest, AmaxMatchesCpu) {
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {1, 1}, {3, 5}, {7, 333}, {1, 8}, {129, 257}, {1024, 1031}, {2048, 2048}};
  int i = 0;
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (auto [rows, cols] : shapes) {
      for (Dist dist : kDists) {
        SCOPED_TRACE(absl::StrCat(rows, "x", cols, " ", cuda_testing::DistName(dist)));
        auto rng = Rng(++i);
        DenseInput x = cuda_testing::MakeInput(gpu(), dtype, rows, cols, dist, rng, i % 3 ? 0 : 2);
        float want = -1.0f;
        ASSERT_TRUE(cpu().Amax(x.host_view(), &want, nullptr).ok());
        DeviceBuffer out(gpu(), 4, i % 2 ? 0 : 4);
        ASSERT_TRUE(gpu().Amax(x.dev_view(), static_cast<float*>(out.get()), nullptr).ok());
        const float got = out.DownloadAs<float>()[0];
        EXPECT_TRUE(SameBytes(&got, &want, 4, "amax")) << got << " vs " << want;
      }
    }
  }
}

// ---------------------------------------------------------------- Dequantize

TEST_F(CudaTest, DequantizeMatchesCpuOnArbitraryBytes) {
  int i = 0;
  for (Format format : {Format::kNvfp4, Format::kMxfp4}) {
    for (ScaleLayout layout : {ScaleLayout::kPlain, ScaleLayout::kSwizzled}) {
      for (DType out_dtype : {DType::kF32, DType::kBF16}) {
        for (auto [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{
                 {1, 32}, {7, 96}, {130, 160}, {300, 2080}}) {
          SCOPED_TRACE(absl::StrCat(FormatName(format), " ", rows, "x", cols,
                                    layout == ScaleLayout::kSwizzled ? " swizzled" : "",
                                    out_dtype == DType::kF32 ? " f32" : " bf16"));
          auto rng = Rng(1000 + ++i);
          const BlockShape block = format == Format::kMxfp4 ? BlockShape::k1x32 : BlockShape::k1x16;
          QuantPair q(gpu(), format, block, layout, rows, cols, i % 4 == 1 ? 8 : 0);
          // Random codes; scales random, with 5% NaN encodings (0x7F/0xFF, E8M0 255).
          std::uniform_int_distribution<int> byte(0, 255);
          std::uniform_real_distribution<float> uni(0.0f, 1.0f);
          for (auto& b : q.codes) b = static_cast<uint8_t>(byte(rng));
          for (auto& b : q.scales) {
            b = static_cast<uint8_t>(byte(rng));
            if (format == Format::kNvfp4 && uni(rng) < 0.7f) b &= 0x7F;
          }
          q.global = {3.5f, format == Format::kNvfp4 ? 1234.567f : 1.0f};
          q.d_codes->Upload(q.codes.data(), q.codes.size());
          q.d_scales->Upload(q.scales.data(), q.scales.size());
          q.d_global->Upload(q.global.data(), 8);
          const size_t n = static_cast<size_t>(rows * cols);
          std::vector<uint8_t> want(n * ElemSize(out_dtype), cuda_testing::kHostPoison);
          DeviceBuffer got(gpu(), want.size(), i % 3 == 2 ? 2 : 0);
          ASSERT_TRUE(cpu().Dequantize(AsConst(q.host),
                                       MutTensor{want.data(), out_dtype, rows, cols, want.size()},
                                       nullptr)
                          .ok());
          const absl::Status s = gpu().Dequantize(
              AsConst(q.dev), MutTensor{got.get(), out_dtype, rows, cols, want.size()}, nullptr);
          ASSERT_TRUE(s.ok()) << s;
          EXPECT_TRUE(cuda_testing::SameDense(got.Download(), want, out_dtype, "dequantized"));
        }
      }
    }
  }
}

// ---------------------------------------------------------------- RHT

TEST_F(CudaTest, RhtMatchesCpuForwardAndInverse) {
  int i = 0;
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (RhtMode mode : {RhtMode::kDefaultSigns, RhtMode::kSeeded}) {
      for (bool inverse : {false, true}) {
        for (bool in_place : {false, true}) {
          for (auto [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{
                   {1, 16}, {7, 48}, {129, 400}}) {
            ++i;
            SCOPED_TRACE(absl::StrCat(rows, "x", cols, " mode ", static_cast<int>(mode),
                                      inverse ? " inverse" : "", in_place ? " in place" : ""));
            auto rng = Rng(2000 + i);
            const uint64_t seed = (static_cast<uint64_t>(rng()) << 32) | rng();
            DenseInput x = cuda_testing::MakeInput(gpu(), dtype, rows, cols, kDists[i % 5], rng,
                                                   i % 4 == 3 ? 2 : 0);
            const size_t bytes = static_cast<size_t>(rows * cols) * ElemSize(dtype);
            std::vector<uint8_t> want(bytes, cuda_testing::kHostPoison);
            ASSERT_TRUE(cpu().Rht(x.host_view(), mode, seed, inverse,
                                  MutTensor{want.data(), dtype, rows, cols, bytes}, nullptr)
                            .ok());
            DeviceBuffer separate(gpu(), bytes);
            void* out = in_place ? x.dev->get() : separate.get();
            const absl::Status s =
                gpu().Rht(x.dev_view(), mode, seed, inverse,
                          MutTensor{out, dtype, rows, cols, bytes}, nullptr);
            ASSERT_TRUE(s.ok()) << s;
            EXPECT_TRUE(cuda_testing::SameDense(
                in_place ? x.dev->Download() : separate.Download(), want, dtype, "rht output"));
          }
        }
      }
    }
  }
}

// ---------------------------------------------------------------- QDQ and error feedback

struct EfMode {
  Format format;
  BlockShape block;
  Rounding rounding;
  ScaleSelection sel;
};

std::vector<EfMode> EfModes() {
  std::vector<EfMode> m;
  for (BlockShape b : {BlockShape::k1x16, BlockShape::k16x16}) {
    for (Rounding r : {Rounding::kNearest, Rounding::kStochastic}) {
      m.push_back({Format::kNvfp4, b, r, ScaleSelection::kMapTo6});
    }
    m.push_back({Format::kNvfp4, b, Rounding::kNearest, ScaleSelection::kFourOverSixMae});
    m.push_back({Format::kNvfp4, b, Rounding::kNearest, ScaleSelection::kFourOverSixMse});
  }
  for (Rounding r : {Rounding::kNearest, Rounding::kStochastic}) {
    m.push_back({Format::kMxfp4, BlockShape::k1x32, r, ScaleSelection::kMapTo6});
  }
  return m;
}

QuantizeOptions EfOptions(const EfMode& m, std::mt19937& rng, int i) {
  QuantizeOptions o;
  o.format = m.format;
  o.block = m.block;
  o.rounding = m.rounding;
  o.scale_selection = m.sel;
  o.four_over_six_emax = i % 2 ? 448.0f : 256.0f;
  o.mx_rule = i % 3 == 1 ? MxScaleRule::kFloor : MxScaleRule::kRceil;
  o.seed = (static_cast<uint64_t>(rng()) << 32) | rng();
  o.step = rng();
  o.scale_layout = i % 2 ? ScaleLayout::kSwizzled : ScaleLayout::kPlain;
  return o;
}

std::vector<float> Residual(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> d(0.0f, 0.05f);
  std::vector<float> r(n);
  for (float& v : r) v = d(rng);
  return r;
}

TEST_F(CudaTest, QuantizeWithErrorFeedbackMatchesCpu) {
  int i = 0;
  for (const EfMode& m : EfModes()) {
    for (DType dtype : {DType::kBF16, DType::kF32}) {
      // 208 columns: quantize_rows.cu; 192 (a multiple of 64): the lane kernel for NVFP4 1x16.
      for (const int64_t nv_cols : {208, 192}) {
      for (bool has_amax : {false, true}) {
        ++i;
        const int64_t rows = 48, cols = m.format == Format::kMxfp4 ? 160 : nv_cols;
        auto rng = Rng(3000 + i);
        QuantizeOptions o = EfOptions(m, rng, i);
        SCOPED_TRACE(cuda_testing::OptionsName(o));
        DenseInput x = cuda_testing::MakeInput(gpu(), dtype, rows, cols, kDists[i % 5], rng,
                                               i % 5 == 2 ? 4 : 0);
        if (has_amax && m.format == Format::kNvfp4) {
          o.has_amax = true;
          o.amax = 2.0f;
        }
        std::vector<float> r = Residual(static_cast<size_t>(rows * cols), rng);
        DeviceBuffer dr(gpu(), r.size() * 4, i % 3 == 0 ? 4 : 0);
        dr.Upload(r.data(), r.size() * 4);
        QuantPair q(gpu(), o.format, o.block, o.scale_layout, rows, cols);
        // Two steps: the residual carries over.
        for (int step = 0; step < 2; ++step) {
          o.step += step;
          ASSERT_TRUE(cpu().Quantize(x.host_view(), o, r.data(), &q.host, nullptr, nullptr).ok());
          const absl::Status s =
              gpu().Quantize(x.dev_view(), o, static_cast<float*>(dr.get()), &q.dev, nullptr,
                             nullptr);
          ASSERT_TRUE(s.ok()) << s;
          EXPECT_TRUE(q.Matches(absl::StrCat("step ", step)));
          EXPECT_TRUE(cuda_testing::SameDense(dr.DownloadAs<float>(), r,
                                              absl::StrCat("residual step ", step)));
        }
      }
      }
    }
  }
}

TEST_F(CudaTest, QdqMatchesCpuWithAndWithoutFeedback) {
  int i = 0;
  for (const EfMode& m : EfModes()) {
    for (DType dtype : {DType::kBF16, DType::kF32}) {
      for (DType out_dtype : {DType::kF32, DType::kBF16}) {
        for (bool feedback : {false, true}) {
        // 80 (MXFP4: 96) columns: quantize_rows.cu; 128 (a multiple of 64): the lane kernel for
        // NVFP4 1x16 and, without feedback, MXFP4.
        for (const int64_t nv_cols : {80, 128}) {
          ++i;
          const int64_t rows = m.block == BlockShape::k16x16 ? 32 : 9;
          const int64_t cols = m.format == Format::kMxfp4 && nv_cols == 80 ? 96 : nv_cols;
          auto rng = Rng(4000 + i);
          QuantizeOptions o = EfOptions(m, rng, i);
          o.scale_layout = ScaleLayout::kPlain;
          SCOPED_TRACE(absl::StrCat(cuda_testing::OptionsName(o), feedback ? " feedback" : ""));
          DenseInput x = cuda_testing::MakeInput(gpu(), dtype, rows, cols, kDists[i % 5], rng);
          const size_t n = static_cast<size_t>(rows * cols);
          std::vector<float> r = Residual(n, rng);
          DeviceBuffer dr(gpu(), n * 4);
          dr.Upload(r.data(), n * 4);
          const size_t out_bytes = n * ElemSize(out_dtype);
          std::vector<uint8_t> want(out_bytes, cuda_testing::kHostPoison);
          // Same dtype: write in place over x (allowed by backend.h).
          const bool alias = out_dtype == dtype && i % 2 == 0;
          DeviceBuffer separate(gpu(), out_bytes);
          void* out = alias ? x.dev->get() : separate.get();
          ASSERT_TRUE(cpu().Qdq(x.host_view(), o, feedback ? r.data() : nullptr,
                                MutTensor{want.data(), out_dtype, rows, cols, out_bytes}, nullptr)
                          .ok());
          const absl::Status s =
              gpu().Qdq(x.dev_view(), o, feedback ? static_cast<float*>(dr.get()) : nullptr,
                        MutTensor{out, out_dtype, rows, cols, out_bytes}, nullptr);
          ASSERT_TRUE(s.ok()) << s;
          EXPECT_TRUE(cuda_testing::SameDense(alias ? x.dev->Download() : separate.Download(), want,
                                              out_dtype, "qdq"));
          if (feedback) EXPECT_TRUE(cuda_testing::SameDense(dr.DownloadAs<float>(), r, "residual"));
        }
        }
      }
    }
  }
}

// ---------------------------------------------------------------- calls back to back

// Quantize, Dequantize and Amax as one dependent chain on the backend's stream with no host
// synchronization between the calls: each link quantizes the previous link's dequantized output
// (a fresh, poisoned buffer), so a kernel that read its input before the kernel writing it had
// finished would quantize poison. Small tensors: the lane kernels, the fused-amax cooperative
// launch, the amax-only pass, the amax reduction and dequantize, each launched while the one
// before it may still run. Every link's codes, scales, global record, amax and dequantized
// values bit for bit against the CPU backend.
TEST_F(CudaTest, CallsBackToBackWithoutHostSyncMatchCpu) {
  constexpr int kLinks = 10;
  int case_id = 0;
  for (auto [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{
           {1, 4096}, {16, 4096}, {128, 4096}, {48, 192}}) {
    SCOPED_TRACE(absl::StrCat(rows, "x", cols));
    auto rng = Rng(9000 + ++case_id);
    const size_t n = static_cast<size_t>(rows * cols);
    DenseInput x0 = cuda_testing::MakeInput(gpu(), DType::kBF16, rows, cols, Dist::kNormal, rng);
    // The options of link i: RTN with the amax computed, SR with it given, MXFP4, 16x16 (or
    // 1x16) RTN after an RHT with the amax computed, SR after an RHT.
    auto options_of = [&](int i, float cpu_amax) {
      QuantizeOptions o;
      o.scale_layout = ScaleLayout::kPlain;
      switch (i % 5) {
        case 1:
          o.rounding = Rounding::kStochastic;
          o.seed = 77 + i;
          o.step = i;
          o.has_amax = true;
          o.amax = cpu_amax;
          break;
        case 2:
          o.format = Format::kMxfp4;
          o.block = BlockShape::k1x32;
          break;
        case 3:
          o.rht = RhtMode::kDefaultSigns;
          if (rows % 16 == 0) o.block = BlockShape::k16x16;
          break;
        case 4:
          o.rht = RhtMode::kDefaultSigns;
          o.rounding = Rounding::kStochastic;
          o.seed = 5;
          o.step = i;
          break;
        default:
          break;
      }
      return o;
    };
    // The CPU chain first (the SR links take its amax as given on both sides).
    std::vector<std::vector<uint16_t>> cpu_x(kLinks + 1);
    std::vector<float> cpu_amax(kLinks);
    std::vector<QuantizeOptions> opts(kLinks);
    std::vector<std::unique_ptr<QuantPair>> q(kLinks);
    cpu_x[0] = x0.bf16;
    for (int i = 0; i < kLinks; ++i) {
      const ConstTensor xi{cpu_x[i].data(), DType::kBF16, rows, cols};
      ASSERT_TRUE(cpu().Amax(xi, &cpu_amax[i], nullptr).ok());
      opts[i] = options_of(i, cpu_amax[i]);
      q[i] = std::make_unique<QuantPair>(gpu(), opts[i].format, opts[i].block, ScaleLayout::kPlain,
                                         rows, cols);
      ASSERT_TRUE(cpu().Quantize(xi, opts[i], nullptr, &q[i]->host, nullptr, nullptr).ok());
      cpu_x[i + 1].assign(n, 0);
      ASSERT_TRUE(cpu().Dequantize(AsConst(q[i]->host),
                                   MutTensor{cpu_x[i + 1].data(), DType::kBF16, rows, cols, n * 2},
                                   nullptr)
                      .ok());
    }
    // The GPU chain: every buffer allocated (and poisoned) before the first call.
    std::vector<std::unique_ptr<DeviceBuffer>> dx;
    for (int i = 0; i < kLinks; ++i) dx.push_back(std::make_unique<DeviceBuffer>(gpu(), n * 2));
    DeviceBuffer amax(gpu(), kLinks * sizeof(float));
    ASSERT_TRUE(gpu().Synchronize(nullptr).ok());
    const void* in = x0.dev->get();
    for (int i = 0; i < kLinks; ++i) {
      const ConstTensor xi{in, DType::kBF16, rows, cols};
      absl::Status st = gpu().Amax(xi, static_cast<float*>(amax.get()) + i, nullptr);
      ASSERT_TRUE(st.ok()) << st;
      st = gpu().Quantize(xi, opts[i], nullptr, &q[i]->dev, nullptr, nullptr);
      ASSERT_TRUE(st.ok()) << st;
      st = gpu().Dequantize(AsConst(q[i]->dev),
                            MutTensor{dx[i]->get(), DType::kBF16, rows, cols, n * 2}, nullptr);
      ASSERT_TRUE(st.ok()) << st;
      in = dx[i]->get();
    }
    EXPECT_TRUE(SameBytes(amax.DownloadAs<float>(), cpu_amax, "amax of every link"));
    for (int i = 0; i < kLinks; ++i) {
      SCOPED_TRACE(absl::StrCat("link ", i, " ", cuda_testing::OptionsName(opts[i])));
      EXPECT_TRUE(q[i]->Matches("quantized"));
      EXPECT_TRUE(SameBytes(dx[i]->DownloadAs<uint16_t>(), cpu_x[i + 1], "dequantized"));
    }
  }
}

// ---------------------------------------------------------------- UpdateWeight

TEST_F(CudaTest, UpdateWeightMatchesCpuOverSeveralSteps) {
  int i = 0;
  for (BlockShape block : {BlockShape::k1x16, BlockShape::k16x16}) {
    for (Rounding rounding : {Rounding::kNearest, Rounding::kStochastic}) {
      for (UpdateKind kind : {UpdateKind::kGradient, UpdateKind::kDelta}) {
        for (bool with_residual : {false, true}) {
          ++i;
          const int64_t rows = 48, cols = 144;
          const size_t n = static_cast<size_t>(rows * cols);
          auto rng = Rng(5000 + i);
          const DType upd_dtype = i % 2 ? DType::kBF16 : DType::kF32;
          const DType dq_dtype = i % 3 ? DType::kF32 : DType::kBF16;
          QuantizeOptions o;
          o.block = block;
          o.rounding = rounding;
          o.seed = (static_cast<uint64_t>(rng()) << 32) | rng();
          o.scale_layout = i % 4 < 2 ? ScaleLayout::kPlain : ScaleLayout::kSwizzled;
          SCOPED_TRACE(absl::StrCat(cuda_testing::OptionsName(o), " kind ",
                                    static_cast<int>(kind), with_residual ? " residual" : ""));
          // The initial weight: a CPU quantization, uploaded to both sides.
          QuantPair w(gpu(), Format::kNvfp4, block, o.scale_layout, rows, cols);
          DenseInput w0 = cuda_testing::MakeInput(gpu(), DType::kF32, rows, cols, Dist::kNormal,
                                                  rng);
          QuantizeOptions init;
          init.block = block;
          init.scale_layout = o.scale_layout;
          ASSERT_TRUE(cpu().Quantize(w0.host_view(), init, nullptr, &w.host, nullptr, nullptr).ok());
          w.d_codes->Upload(w.codes.data(), w.codes.size());
          w.d_scales->Upload(w.scales.data(), w.scales.size());
          w.d_global->Upload(w.global.data(), 8);
          std::vector<float> r = Residual(n, rng);
          DeviceBuffer dr(gpu(), n * 4, i % 3 == 1 ? 4 : 0);
          dr.Upload(r.data(), n * 4);
          for (int step = 1; step <= 3; ++step) {
            o.step = static_cast<uint64_t>(step);
            DenseInput u = cuda_testing::MakeInput(gpu(), upd_dtype, rows, cols, kDists[step % 5],
                                                   rng);
            const float lr = 0.01f * static_cast<float>(step);
            const size_t dq_bytes = n * ElemSize(dq_dtype);
            std::vector<uint8_t> want_dq(dq_bytes, cuda_testing::kHostPoison);
            DeviceBuffer got_dq(gpu(), dq_bytes);
            MutTensor host_dq{want_dq.data(), dq_dtype, rows, cols, dq_bytes};
            MutTensor dev_dq{got_dq.get(), dq_dtype, rows, cols, dq_bytes};
            // Non-finite updates (the kSpecial step) are refused by both, with the same error,
            // and change nothing.
            const absl::Status cs = cpu().UpdateWeight(w.host, with_residual ? r.data() : nullptr,
                                                       u.host_view(), lr, kind, o, &host_dq,
                                                       nullptr);
            const absl::Status s =
                gpu().UpdateWeight(w.dev, with_residual ? static_cast<float*>(dr.get()) : nullptr,
                                   u.dev_view(), lr, kind, o, &dev_dq, nullptr);
            ASSERT_EQ(s.code(), cs.code()) << s << " vs " << cs;
            EXPECT_EQ(s.message(), cs.message());
            EXPECT_TRUE(w.Matches(absl::StrCat("weight after step ", step)));
            if (cs.ok()) {
              EXPECT_TRUE(
                  cuda_testing::SameDense(got_dq.Download(), want_dq, dq_dtype, "dequantized_out"));
            }
            if (with_residual) {
              EXPECT_TRUE(cuda_testing::SameDense(dr.DownloadAs<float>(), r, "residual"));
            }
          }
        }
      }
    }
  }
}

// ---------------------------------------------------------------- golden vectors

TEST_F(CudaTest, ReproducesTheGoldenVectors) {
  const char* dir = std::getenv("FP4Q_GOLDEN_DIR");
  const std::string path = std::string(dir != nullptr && *dir ? dir : FP4Q_GOLDEN_DIR) +
                           "/nvfp4_rtn_public.safetensors";
  auto file = common::SafetensorsFile::ReadFile(path);
  ASSERT_TRUE(file.ok()) << file.status();
  auto cases = common::ParseJson(file->Metadata("cases").value());
  ASSERT_TRUE(cases.ok() && cases->is_array());
  ASSERT_GE(cases->items().size(), 10u);
  for (const common::JsonValue& c : cases->items()) {
    const std::string key = c.Find("key")->text();
    SCOPED_TRACE("golden case " + key);
    const int64_t rows = c.Find("rows")->AsInt64().value();
    const int64_t cols = c.Find("cols")->AsInt64().value();
    const BlockShape block =
        c.Find("block")->text() == "16x16" ? BlockShape::k16x16 : BlockShape::k1x16;
    auto info = file->Find(key + ".x");
    ASSERT_TRUE(info.ok());
    const bool bf16 = (*info)->dtype == common::StDType::kBF16;
    std::vector<uint8_t> raw;
    if (bf16) {
      auto v = file->CopyTensor<uint16_t>(key + ".x", common::StDType::kBF16).value();
      raw.resize(v.size() * 2);
      std::memcpy(raw.data(), v.data(), raw.size());
    } else {
      auto v = file->CopyTensor<float>(key + ".x", common::StDType::kF32).value();
      raw.resize(v.size() * 4);
      std::memcpy(raw.data(), v.data(), raw.size());
    }
    DeviceBuffer dx(gpu(), raw.size());
    dx.Upload(raw.data(), raw.size());
    QuantizeOptions o;
    o.block = block;
    QuantPair q(gpu(), Format::kNvfp4, block, ScaleLayout::kPlain, rows, cols);
    const absl::Status s = gpu().Quantize(
        ConstTensor{dx.get(), bf16 ? DType::kBF16 : DType::kF32, rows, cols}, o, nullptr, &q.dev,
        nullptr, nullptr);
    ASSERT_TRUE(s.ok()) << s;
    const auto codes = file->CopyTensor<uint8_t>(key + ".codes", common::StDType::kU8).value();
    const auto scales = file->CopyTensor<uint8_t>(key + ".scales", common::StDType::kU8).value();
    const auto amax = file->CopyTensor<float>(key + ".global_amax", common::StDType::kF32).value();
    const auto s_enc = file->CopyTensor<float>(key + ".s_enc", common::StDType::kF32).value();
    EXPECT_TRUE(SameBytes(q.d_codes->Download(), codes, "golden codes"));
    EXPECT_TRUE(SameBytes(q.d_scales->Download(), scales, "golden scales"));
    const auto global = q.d_global->DownloadAs<float>();
    EXPECT_TRUE(SameBytes(&global[0], amax.data(), 4, "golden amax"));
    EXPECT_TRUE(SameBytes(&global[1], s_enc.data(), 4, "golden s_enc"));
  }
}

}  // namespace
}  // namespace fp4q::kernels
