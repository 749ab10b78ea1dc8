// Shared pieces of the CUDA backend tests: the fixture that loads libfp4q_cuda.so through
// CudaModule and skips with the reason when it cannot run (module missing, no driver, no
// device), device buffers that start poisoned, random inputs of several distributions, and
// byte-exact comparison with readable first-difference messages.
#ifndef FP4Q_TESTS_KERNELS_CUDA_CUDA_TEST_UTIL_H_
#define FP4Q_TESTS_KERNELS_CUDA_CUDA_TEST_UTIL_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "fp4q/kernels/backend.h"
#include "fp4q/kernels/cuda_module.h"
#include "gtest/gtest.h"

namespace fp4q::kernels::cuda_testing {

// Outputs start poisoned, with different bytes on the two sides, so a byte that neither backend
// wrote cannot compare equal.
inline constexpr uint8_t kHostPoison = 0xA5;
inline constexpr uint8_t kDevicePoison = 0x5A;

// The process-wide module and backends (created once; the module outlives the backends).
struct CudaEnv {
  std::unique_ptr<CudaModule> module;
  std::unique_ptr<Backend> gpu;
  std::unique_ptr<Backend> cpu;
  std::string skip_reason;  // non-empty: every test skips with it
  uint32_t seed = 0;        // base seed of this run's random data (printed once)
};

CudaEnv& Env();

// Fixture: skips with Env().skip_reason when no GPU backend could be made.
class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override;
  Backend& gpu() { return *Env().gpu; }
  Backend& cpu() { return *Env().cpu; }
  // A fresh generator for this test (seed printed on failure through SCOPED_TRACE by callers).
  std::mt19937 Rng(uint32_t salt) const { return std::mt19937(Env().seed * 2654435761u + salt); }
};

template <typename P>
class CudaParamTest : public ::testing::TestWithParam<P> {
 protected:
  void SetUp() override {
    if (!Env().skip_reason.empty()) GTEST_SKIP() << Env().skip_reason;
  }
  Backend& gpu() { return *Env().gpu; }
  Backend& cpu() { return *Env().cpu; }
  std::mt19937 Rng(uint32_t salt) const { return std::mt19937(Env().seed * 2654435761u + salt); }
};

// A device buffer of the GPU backend, `offset` bytes into a larger allocation (to exercise
// unaligned views), filled with kDevicePoison.
class DeviceBuffer {
 public:
  DeviceBuffer(Backend& b, size_t bytes, size_t offset = 0);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return static_cast<uint8_t*>(base_) + offset_; }
  size_t size() const { return bytes_; }
  void Upload(const void* src, size_t bytes);
  std::vector<uint8_t> Download() const;
  template <typename T>
  std::vector<T> DownloadAs() const {
    const std::vector<uint8_t> raw = Download();
    std::vector<T> out(raw.size() / sizeof(T));
    std::memcpy(out.data(), raw.data(), out.size() * sizeof(T));
    return out;
  }

 private:
  Backend& backend_;
  void* base_ = nullptr;
  size_t bytes_;
  size_t offset_;
};

// Host and device buffers of one quantized tensor in a format/block/layout, poisoned
// (kHostPoison / kDevicePoison).
struct QuantPair {
  std::vector<uint8_t> codes, scales;
  std::vector<float> global;
  QuantizedTensor host;
  std::unique_ptr<DeviceBuffer> d_codes, d_scales, d_global;
  QuantizedTensor dev;

  QuantPair(Backend& gpu, Format format, BlockShape block, ScaleLayout layout, int64_t rows,
            int64_t cols, size_t offset = 0);
  // Compares the GPU's bytes with the host's (all of codes, scales incl. padding, global).
  ::testing::AssertionResult Matches(const std::string& what) const;
};

// ---- random inputs

enum class Dist {
  kNormal,      // N(0, 1)
  kHeavyTail,   // |x| = 2^U(-20, 20), random sign
  kOutliers,    // N(0, 1) with 1% of values x1e4
  kSpecial,     // N(0, 1) with NaN, +-Inf, -0, subnormals, 3e38, and some tiny blocks
  kMidpoints,   // exact E2M1 rounding midpoints and grid values times random powers of two
  kSrThresholds,  // values at the r16 thresholds of stochastic rounding (blocks led by +-6)
};
const char* DistName(Dist d);
std::vector<float> RandomValues(size_t n, Dist dist, std::mt19937& rng);

// x as bf16 bits (RN) and the f32 values those bits hold.
std::vector<uint16_t> ToBf16(const std::vector<float>& v);

// A dense input held on host and device (dtype f32 or bf16).
struct DenseInput {
  std::vector<float> f32;
  std::vector<uint16_t> bf16;
  DType dtype;
  int64_t rows, cols;
  std::unique_ptr<DeviceBuffer> dev;
  ConstTensor host_view() const;
  ConstTensor dev_view() const;
};
DenseInput MakeInput(Backend& gpu, DType dtype, int64_t rows, int64_t cols, Dist dist,
                     std::mt19937& rng, size_t offset = 0);

// Byte-exact comparison with the first difference described.
::testing::AssertionResult SameBytes(const void* a, const void* b, size_t n,
                                     const std::string& what);
template <typename T>
::testing::AssertionResult SameBytes(const std::vector<T>& a, const std::vector<T>& b,
                                     const std::string& what) {
  if (a.size() != b.size()) {
    return ::testing::AssertionFailure()
           << what << ": sizes " << a.size() << " vs " << b.size();
  }
  return SameBytes(a.data(), b.data(), a.size() * sizeof(T), what);
}

// Dense f32/bf16 outputs (residuals, DQ, RHT output): bit-identical, except that a NaN matches
// any NaN (payload and sign of NaNs are unspecified: x86 propagates an input's payload, the GPU
// produces its canonical NaN; DESIGN "NaN payloads").
::testing::AssertionResult SameDense(const std::vector<uint8_t>& gpu, const std::vector<uint8_t>& cpu,
                                     DType dtype, const std::string& what);
::testing::AssertionResult SameDense(const std::vector<float>& gpu, const std::vector<float>& cpu,
                                     const std::string& what);

std::string OptionsName(const QuantizeOptions& o);

}  // namespace fp4q::kernels::cuda_testing

#endif  // FP4Q_TESTS_KERNELS_CUDA_CUDA_TEST_UTIL_H_
