// Shared pieces of the CUDA backend tests; see cuda_test_util.h.
#include "kernels/cuda/cuda_test_util.h"

#include <cstdio>
#include <cstdlib>
#include <limits>

#include "absl/strings/str_format.h"

namespace fp4q::kernels::cuda_testing {
namespace {

CudaEnv* MakeEnv() {
  auto* env = new CudaEnv;
  env->cpu = CreateCpuBackend();
  const char* seed_env = std::getenv("FP4Q_TEST_SEED");
  env->seed = seed_env != nullptr ? static_cast<uint32_t>(std::strtoul(seed_env, nullptr, 10))
                                  : std::random_device{}();
  std::fprintf(stderr, "cuda tests: random seed %u (set FP4Q_TEST_SEED to repeat)\n", env->seed);
  const char* module_env = std::getenv("FP4Q_CUDA_MODULE");  // scripts/device/run.sh sets it
  auto module = CudaModule::Load(module_env != nullptr ? module_env : "");
  if (!module.ok()) {
    env->skip_reason = absl::StrCat("CUDA module not loadable: ", module.status().ToString());
    return env;
  }
  env->module = std::move(*module);
  auto count = env->module->DeviceCount();
  if (!count.ok()) {
    env->skip_reason = absl::StrCat("no CUDA driver: ", count.status().message());
    return env;
  }
  if (*count == 0) {
    env->skip_reason = "no CUDA device visible";
    return env;
  }
  auto gpu = env->module->CreateBackend(0);
  if (!gpu.ok()) {
    env->skip_reason = absl::StrCat("cannot create the CUDA backend: ", gpu.status().ToString());
    return env;
  }
  env->gpu = std::move(*gpu);
  const DeviceInfo info = env->gpu->Info();
  std::fprintf(stderr, "cuda tests: %s %s (cc %d.%d) from %s\n", info.name.c_str(),
               info.uuid.c_str(), info.cc_major, info.cc_minor, env->module->path().c_str());
  return env;
}

float F(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

}  // namespace

CudaEnv& Env() {
  static CudaEnv* env = MakeEnv();
  return *env;
}

void CudaTest::SetUp() {
  if (!Env().skip_reason.empty()) GTEST_SKIP() << Env().skip_reason;
}

// ---------------------------------------------------------------- DeviceBuffer

DeviceBuffer::DeviceBuffer(Backend& b, size_t bytes, size_t offset)
    : backend_(b), bytes_(bytes), offset_(offset) {
  auto p = b.Allocate(bytes + offset + 16);
  if (!p.ok()) {
    ADD_FAILURE() << "Allocate(" << bytes << "): " << p.status();
    return;
  }
  base_ = *p;
  const absl::Status s = b.Memset(base_, kDevicePoison, bytes + offset + 16, nullptr);
  if (!s.ok()) ADD_FAILURE() << "Memset: " << s;
}

DeviceBuffer::~DeviceBuffer() {
  if (base_ != nullptr) backend_.Free(base_);
}

void DeviceBuffer::Upload(const void* src, size_t bytes) {
  const absl::Status s = backend_.CopyFromHost(get(), src, bytes, nullptr);
  if (!s.ok()) ADD_FAILURE() << "CopyFromHost: " << s;
  const absl::Status t = backend_.Synchronize(nullptr);
  if (!t.ok()) ADD_FAILURE() << "Synchronize: " << t;
}

std::vector<uint8_t> DeviceBuffer::Download() const {
  std::vector<uint8_t> out(bytes_);
  const absl::Status t = backend_.Synchronize(nullptr);
  if (!t.ok()) ADD_FAILURE() << "Synchronize: " << t;
  const absl::Status s = backend_.CopyToHost(out.data(), get(), bytes_, nullptr);
  if (!s.ok()) ADD_FAILURE() << "CopyToHost: " << s;
  const absl::Status u = backend_.Synchronize(nullptr);
  if (!u.ok()) ADD_FAILURE() << "Synchronize: " << u;
  return out;
}

// ---------------------------------------------------------------- QuantPair

QuantPair::QuantPair(Backend& gpu, Format format, BlockShape block, ScaleLayout layout,
                     int64_t rows, int64_t cols, size_t offset) {
  const size_t code_bytes = static_cast<size_t>(rows * cols / 2);
  const size_t scale_bytes = ScaleBytes(rows, cols, format, layout, "t").value();
  codes.assign(code_bytes, kHostPoison);
  scales.assign(scale_bytes, kHostPoison);
  global.assign(kGlobalFloats, F(0xA5A5A5A5u));
  host = QuantizedTensor{format, block, layout, rows, cols, codes.data(), code_bytes,
                         scales.data(), scale_bytes, global.data()};
  d_codes = std::make_unique<DeviceBuffer>(gpu, code_bytes, offset);
  d_scales = std::make_unique<DeviceBuffer>(gpu, scale_bytes, offset);
  d_global = std::make_unique<DeviceBuffer>(gpu, kGlobalFloats * sizeof(float), offset);
  dev = QuantizedTensor{format,        block,
                        layout,        rows,
                        cols,          static_cast<uint8_t*>(d_codes->get()),
                        code_bytes,    static_cast<uint8_t*>(d_scales->get()),
                        scale_bytes,   static_cast<float*>(d_global->get())};
}

::testing::AssertionResult QuantPair::Matches(const std::string& what) const {
  auto r = SameBytes(d_codes->Download(), codes, what + " codes");
  if (!r) return r;
  r = SameBytes(d_scales->Download(), scales, what + " scales");
  if (!r) return r;
  return SameBytes(d_global->DownloadAs<float>(), global, what + " global");
}

// ---------------------------------------------------------------- random inputs

const char* DistName(Dist d) {
  switch (d) {
    case Dist::kNormal: return "normal";
    case Dist::kHeavyTail: return "heavy_tail";
    case Dist::kOutliers: return "outliers";
    case Dist::kSpecial: return "special";
    case Dist::kMidpoints: return "midpoints";
    case Dist::kSrThresholds: return "sr_thresholds";
  }
  return "?";
}

std::vector<float> RandomValues(size_t n, Dist dist, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uni(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  switch (dist) {
    case Dist::kNormal:
      break;
    case Dist::kHeavyTail:
      for (float& x : v) x = std::ldexp(uni(rng) < 0.5f ? -1.0f : 1.0f, 0) *
                             std::exp2(uni(rng) * 40.0f - 20.0f);
      break;
    case Dist::kOutliers:
      for (float& x : v) {
        if (uni(rng) < 0.01f) x *= 1e4f;
      }
      break;
    case Dist::kSpecial: {
      const float specials[] = {std::numeric_limits<float>::quiet_NaN(),
                                -std::numeric_limits<float>::quiet_NaN(),
                                std::numeric_limits<float>::infinity(),
                                -std::numeric_limits<float>::infinity(),
                                -0.0f,
                                F(0x00000001u),
                                F(0x80400000u),
                                1e-40f,
                                3e38f,
                                -3.3e38f,
                                F(0x7F7FFFFFu),
                                F(0x7F800001u),   // signaling NaN
                                F(0xFFA00000u)};  // negative signaling NaN
      constexpr size_t kSpecials = sizeof(specials) / sizeof(specials[0]);
      for (float& x : v) {
        const float u = uni(rng);
        if (u < 0.02f) x = specials[static_cast<size_t>(uni(rng) * kSpecials) % kSpecials];
      }
      // Some whole blocks of 16 tiny enough that their E4M3 scale underflows to 0.
      for (size_t b = 0; b + 16 <= n; b += 16) {
        if (uni(rng) < 0.05f) {
          for (size_t i = b; i < b + 16; ++i) v[i] *= 1e-30f;
        }
      }
      break;
    }
    case Dist::kMidpoints: {
      const float mids[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f,
                            0.5f,  1.0f,  1.5f,  2.0f,  3.0f, 4.0f, 6.0f};
      for (float& x : v) {
        const float m = mids[static_cast<size_t>(uni(rng) * 14.0f) % 14];
        const int e = static_cast<int>(uni(rng) * 7.0f) - 3;
        x = std::ldexp(uni(rng) < 0.5f ? -m : m, e);
      }
      break;
    }
    case Dist::kSrThresholds: {
      // Blocks of 16 led by +-6 (with the caller amax 2688 both scales are 1, so y = x): the
      // rest lie k/65536 of the way through a grid cell, nudged by -1, 0 or +1 ulp, where the
      // stochastic rounding of NUMERICS 4 turns at r16 = k; a few are subnormal, zero or on
      // the grid.
      const float grid[] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
      std::uniform_int_distribution<int> cell(0, 6), k16(0, 65536), nudge(-1, 1), kind(0, 31);
      for (size_t i = 0; i < v.size(); ++i) {
        float a;
        if (i % 16 == 0) {
          a = 6.0f;
        } else if (const int t = kind(rng); t == 0) {
          a = std::ldexp(static_cast<float>(k16(rng) + 1), -150 + static_cast<int>(i % 24));
        } else if (t == 1) {
          a = grid[cell(rng) + (i % 2)];
        } else {
          const int c = cell(rng);
          const float h = grid[c + 1] - grid[c];
          a = grid[c] + h * (static_cast<float>(k16(rng)) / 65536.0f);  // exact
          const int d = nudge(rng);
          if (d != 0) a = std::nextafter(a, d < 0 ? 0.0f : 7.0f);
        }
        v[i] = uni(rng) < 0.5f ? -a : a;
      }
      break;
    }
  }
  return v;
}

std::vector<uint16_t> ToBf16(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    uint32_t u;
    std::memcpy(&u, &v[i], 4);
    if (std::isnan(v[i])) {
      out[i] = static_cast<uint16_t>((u >> 16) | 0x40);
    } else {
      u += 0x7FFFu + ((u >> 16) & 1u);
      out[i] = static_cast<uint16_t>(u >> 16);
    }
  }
  return out;
}

ConstTensor DenseInput::host_view() const {
  return ConstTensor{dtype == DType::kF32 ? static_cast<const void*>(f32.data()) : bf16.data(),
                     dtype, rows, cols};
}

ConstTensor DenseInput::dev_view() const { return ConstTensor{dev->get(), dtype, rows, cols}; }

DenseInput MakeInput(Backend& gpu, DType dtype, int64_t rows, int64_t cols, Dist dist,
                     std::mt19937& rng, size_t offset) {
  DenseInput in;
  in.dtype = dtype;
  in.rows = rows;
  in.cols = cols;
  in.f32 = RandomValues(static_cast<size_t>(rows * cols), dist, rng);
  if (dtype == DType::kBF16) {
    in.bf16 = ToBf16(in.f32);
    in.dev = std::make_unique<DeviceBuffer>(gpu, in.bf16.size() * 2, offset);
    in.dev->Upload(in.bf16.data(), in.bf16.size() * 2);
  } else {
    in.dev = std::make_unique<DeviceBuffer>(gpu, in.f32.size() * 4, offset);
    in.dev->Upload(in.f32.data(), in.f32.size() * 4);
  }
  return in;
}

::testing::AssertionResult SameBytes(const void* a, const void* b, size_t n,
                                     const std::string& what) {
  const auto* x = static_cast<const uint8_t*>(a);
  const auto* y = static_cast<const uint8_t*>(b);
  size_t diffs = 0;
  size_t first = n;
  for (size_t i = 0; i < n; ++i) {
    if (x[i] != y[i]) {
      if (first == n) first = i;
      ++diffs;
    }
  }
  if (diffs == 0) return ::testing::AssertionSuccess();
  auto r = ::testing::AssertionFailure();
  r << what << ": " << diffs << " of " << n << " bytes differ; first at byte " << first
    << " (gpu 0x" << absl::StrFormat("%02x", x[first]) << ", cpu 0x"
    << absl::StrFormat("%02x", y[first]) << ")";
  if (first + 4 <= n) {
    uint32_t u, v;
    const size_t w = first & ~size_t{3};
    std::memcpy(&u, x + w, 4);
    std::memcpy(&v, y + w, 4);
    r << "; as words at " << w << ": gpu 0x" << absl::StrFormat("%08x", u) << " cpu 0x"
      << absl::StrFormat("%08x", v);
  }
  return r;
}

::testing::AssertionResult SameDense(const std::vector<uint8_t>& gpu, const std::vector<uint8_t>& cpu,
                                     DType dtype, const std::string& what) {
  if (gpu.size() != cpu.size()) {
    return ::testing::AssertionFailure() << what << ": sizes " << gpu.size() << " vs " << cpu.size();
  }
  const size_t es = dtype == DType::kF32 ? 4 : 2;
  size_t diffs = 0, first = 0;
  uint32_t g0 = 0, c0 = 0;
  for (size_t i = 0; i + es <= gpu.size(); i += es) {
    uint32_t g = 0, c = 0;
    std::memcpy(&g, &gpu[i], es);
    std::memcpy(&c, &cpu[i], es);
    if (g == c) continue;
    const bool g_nan = es == 4 ? (g & 0x7FFFFFFFu) > 0x7F800000u : (g & 0x7FFFu) > 0x7F80u;
    const bool c_nan = es == 4 ? (c & 0x7FFFFFFFu) > 0x7F800000u : (c & 0x7FFFu) > 0x7F80u;
    if (g_nan && c_nan) continue;
    if (diffs++ == 0) {
      first = i / es;
      g0 = g;
      c0 = c;
    }
  }
  if (diffs == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << what << ": " << diffs << " of " << gpu.size() / es << " elements differ; first at "
         << first << " (gpu 0x" << absl::StrFormat("%08x", g0) << ", cpu 0x"
         << absl::StrFormat("%08x", c0) << ")";
}

::testing::AssertionResult SameDense(const std::vector<float>& gpu, const std::vector<float>& cpu,
                                     const std::string& what) {
  std::vector<uint8_t> g(gpu.size() * 4), c(cpu.size() * 4);
  std::memcpy(g.data(), gpu.data(), g.size());
  std::memcpy(c.data(), cpu.data(), c.size());
  return SameDense(g, c, DType::kF32, what);
}

std::string OptionsName(const QuantizeOptions& o) {
  std::string s = o.format == Format::kMxfp4 ? "mxfp4" : "nvfp4";
  s += o.block == BlockShape::k16x16 ? "_16x16" : "";
  s += o.rounding == Rounding::kStochastic ? "_sr" : "_rtn";
  if (o.rht == RhtMode::kDefaultSigns) s += "_rht";
  if (o.rht == RhtMode::kSeeded) s += "_rhtseeded";
  if (o.scale_selection == ScaleSelection::kFourOverSixMae) s += "_46mae";
  if (o.scale_selection == ScaleSelection::kFourOverSixMse) s += "_46mse";
  if (o.scale_selection != ScaleSelection::kMapTo6) {
    s += absl::StrCat("_e", static_cast<int>(o.four_over_six_emax));
  }
  if (o.format == Format::kMxfp4 && o.mx_rule == MxScaleRule::kFloor) s += "_floor";
  s += o.scale_layout == ScaleLayout::kSwizzled ? "_swz" : "";
  s += o.rowwise ? "_row" : "";
  s += o.columnwise ? "_col" : "";
  s += o.has_amax ? "_amax" : "";
  return s;
}

}  // namespace fp4q::kernels::cuda_testing
