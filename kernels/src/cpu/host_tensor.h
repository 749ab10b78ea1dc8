// Host-side working representations of the CPU reference backend: a dense f32 matrix and a
// quantized matrix with plain (row-major) scales, plus their conversion from and to the
// public views of types.h. Callers validate the views first (validate.h); these functions do
// not check sizes again.
#ifndef FP4Q_KERNELS_CPU_HOST_TENSOR_H_
#define FP4Q_KERNELS_CPU_HOST_TENSOR_H_

#include <cstdint>
#include <vector>

#include "fp4q/kernels/types.h"

namespace fp4q::kernels::cpu {

// Row-major [rows, cols] f32 values.
struct Matrix {
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<float> values;

  Matrix() = default;
  Matrix(int64_t r, int64_t c) : rows(r), cols(c), values(static_cast<size_t>(r * c)) {}
  float& at(int64_t r, int64_t c) { return values[static_cast<size_t>(r * cols + c)]; }
  float at(int64_t r, int64_t c) const { return values[static_cast<size_t>(r * cols + c)]; }
};

// A quantized [rows, cols] matrix (quantized along cols) with plain scales.
struct HostQuantized {
  Format format = Format::kNvfp4;
  BlockShape block = BlockShape::k1x16;
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<uint8_t> codes;   // rows * cols / 2, element 2j in the low nibble of byte j
  std::vector<uint8_t> scales;  // plain [rows, cols / BlockElems(format)]
  float amax = 0.0f;            // global record [0]
  float s_enc = 1.0f;           // global record [1]

  int64_t scale_cols() const { return cols / BlockElems(format); }
  uint8_t code(int64_t r, int64_t c) const {
    const uint8_t byte = codes[static_cast<size_t>((r * cols + c) / 2)];
    return (c % 2 == 0) ? (byte & 0xF) : (byte >> 4);
  }
  void set_code(int64_t r, int64_t c, uint8_t code) {
    uint8_t& byte = codes[static_cast<size_t>((r * cols + c) / 2)];
    byte = (c % 2 == 0) ? static_cast<uint8_t>((byte & 0xF0) | (code & 0xF))
                        : static_cast<uint8_t>((byte & 0x0F) | ((code & 0xF) << 4));
  }
};

// Reads a dense input (f32 or bf16) as f32 (bf16 widened exactly).
Matrix LoadDense(const ConstTensor& x);
// Reads the f32 buffer `values` of shape [rows, cols].
Matrix LoadF32(const float* values, int64_t rows, int64_t cols);
// Writes `m` to `out` in out.dtype (bf16: round-to-nearest-even).
void StoreDense(const Matrix& m, const MutTensor& out);
// The transpose.
Matrix Transpose(const Matrix& m);

// Reads a quantized operand (unswizzling its scales).
HostQuantized LoadQuantized(const ConstQuantizedTensor& q);
// Writes codes, scales (in dst.scale_layout; swizzle padding zeroed) and the global record.
void StoreQuantized(const HostQuantized& h, const QuantizedTensor& dst);

// Scale bytes: plain [rows, scale_cols] <-> `layout` (NUMERICS 3). WriteScales writes exactly
// ScaleBytes(...) bytes at dst.
void WriteScales(const std::vector<uint8_t>& plain, int64_t rows, int64_t scale_cols,
                 ScaleLayout layout, uint8_t* dst);
std::vector<uint8_t> ReadScales(const uint8_t* src, int64_t rows, int64_t scale_cols,
                                ScaleLayout layout);

}  // namespace fp4q::kernels::cpu

#endif  // FP4Q_KERNELS_CPU_HOST_TENSOR_H_
