// Helpers for the kernels tests: owned buffers behind the non-owning views of types.h, and
// small conversions. Header-only.
#ifndef FP4Q_TESTS_KERNELS_TEST_UTIL_H_
#define FP4Q_TESTS_KERNELS_TEST_UTIL_H_

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "fp4q/kernels/backend.h"
#include "fp4q/kernels/types.h"

namespace fp4q::kernels::testing {

// Poison byte written into outputs before a call, so tests see that every byte was written.
inline constexpr uint8_t kPoison = 0xA5;

// A quantized tensor with its own buffers (poisoned), sized for `rows` x `cols` in
// format/block/layout.
struct OwnedQuantized {
  std::vector<uint8_t> codes;
  std::vector<uint8_t> scales;
  std::vector<float> global;
  QuantizedTensor view;

  OwnedQuantized(Format format, BlockShape block, ScaleLayout layout, int64_t rows, int64_t cols)
      : codes(static_cast<size_t>(rows * cols / 2), kPoison),
        scales(ScaleBytes(rows, cols, format, layout, "t").value(), kPoison),
        global(kGlobalFloats, -12345.0f) {
    view.format = format;
    view.block = block;
    view.scale_layout = layout;
    view.rows = rows;
    view.cols = cols;
    view.codes = codes.data();
    view.codes_capacity = codes.size();
    view.scales = scales.data();
    view.scales_capacity = scales.size();
    view.global = global.data();
  }
  OwnedQuantized(const OwnedQuantized&) = delete;
  OwnedQuantized& operator=(const OwnedQuantized&) = delete;

  ConstQuantizedTensor cview() const { return AsConst(view); }
  uint8_t code(int64_t r, int64_t c) const {
    const uint8_t byte = codes[static_cast<size_t>((r * view.cols + c) / 2)];
    return c % 2 == 0 ? (byte & 0xF) : (byte >> 4);
  }
  // Plain-layout scale (r, block column c).
  uint8_t scale(int64_t r, int64_t c) const {
    return scales[static_cast<size_t>(r * (view.cols / BlockElems(view.format)) + c)];
  }
};

inline ConstTensor F32View(const std::vector<float>& v, int64_t rows, int64_t cols) {
  return ConstTensor{v.data(), DType::kF32, rows, cols};
}
inline ConstTensor Bf16View(const std::vector<uint16_t>& v, int64_t rows, int64_t cols) {
  return ConstTensor{v.data(), DType::kBF16, rows, cols};
}
inline MutTensor F32Out(std::vector<float>* v, int64_t rows, int64_t cols) {
  return MutTensor{v->data(), DType::kF32, rows, cols, v->size() * sizeof(float)};
}

inline uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// n values from N(0, sigma) with a fixed seed.
inline std::vector<float> Normal(size_t n, uint32_t seed, float sigma = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

// Quantizes with the CPU backend (row-wise only unless options say otherwise) into `out`.
inline absl::Status QuantizeInto(Backend& backend, const ConstTensor& x,
                                 const QuantizeOptions& options, OwnedQuantized* rowwise,
                                 OwnedQuantized* columnwise = nullptr, float* residual = nullptr) {
  return backend.Quantize(x, options, residual, rowwise ? &rowwise->view : nullptr,
                          columnwise ? &columnwise->view : nullptr, nullptr);
}

// The folder of the golden vectors: $FP4Q_GOLDEN_DIR, else the repository's tests/data/golden.
inline std::string GoldenDir() {
  const char* env = std::getenv("FP4Q_GOLDEN_DIR");
  return env != nullptr && *env != '\0' ? env : FP4Q_GOLDEN_DIR;
}

}  // namespace fp4q::kernels::testing

#endif  // FP4Q_TESTS_KERNELS_TEST_UTIL_H_
