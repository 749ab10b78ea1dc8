// Types shared by every fp4q kernels backend: dtypes, quantization options, non-owning tensor
// views and the size arithmetic of the packed formats. The numerics themselves are defined by
// docs/NUMERICS.md; section numbers below refer to it.
//
// Nothing here allocates or owns memory. A view's pointers are host pointers for the CPU
// backend and device pointers for the CUDA backend.
#ifndef FP4Q_KERNELS_TYPES_H_
#define FP4Q_KERNELS_TYPES_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "fp4q/common/field_path.h"

namespace fp4q::kernels {

// Element type of a dense tensor (inputs, dequantized outputs, residuals, matmul outputs).
enum class DType : int {
  kF32 = 1,
  kBF16 = 2,
};

enum class Format : int {
  kNvfp4 = 1,  // E2M1 values, E4M3 scale per 16 elements, f32 global scale (NUMERICS 2).
  kMxfp4 = 2,  // E2M1 values, E8M0 scale per 32 elements, no global scale (NUMERICS 8).
};

enum class BlockShape : int {
  k1x16 = 1,    // NVFP4: 16 consecutive elements of a row.
  k16x16 = 2,   // NVFP4: a 16x16 tile (rows must be a multiple of 16).
  k1x32 = 3,    // MXFP4: 32 consecutive elements of a row (the only MXFP4 block).
};

enum class Rounding : int {
  kNearest = 1,     // round-to-nearest-even (NUMERICS 1).
  kStochastic = 2,  // Philox4x32-10 keyed by (seed, step, index) (NUMERICS 4).
};

enum class RhtMode : int {
  kOff = 0,
  kDefaultSigns = 1,  // TransformerEngine's sign vector, bitmask 0xD7E8 (NUMERICS 6).
  kSeeded = 2,        // signs from Philox4x32-10(key = rht_seed, counter = 0), word 0.
};

enum class ScaleSelection : int {
  kMapTo6 = 0,         // the block amax maps to 6 (NUMERICS 2).
  kFourOverSixMae = 1,  // NUMERICS 7, mean-absolute-error criterion.
  kFourOverSixMse = 2,  // NUMERICS 7, mean-squared-error criterion.
};

enum class ScaleLayout : int {
  kPlain = 0,     // row-major [rows, cols / block].
  kSwizzled = 1,  // 128x4 tensor-core layout (NUMERICS 3).
};

enum class MxScaleRule : int {
  kRceil = 0,  // cuBLAS rule: ceil(log2(amax / 6)) (default).
  kFloor = 1,  // OCP MX v1.0: floor(log2(amax)) - 2.
};

enum class UpdateKind : int {
  kGradient = 1,  // x = DQ(W) - lr * g
  kDelta = 2,     // x = DQ(W) + d
};

// Options of one quantization. Defaults give NVFP4, 1x16 blocks, RTN, computed amax, plain
// scales, row-wise output only. Combinations NUMERICS.md leaves undefined are rejected with
// INVALID_ARGUMENT by ValidateQuantizeOptions (see validate.h).
struct QuantizeOptions {
  Format format = Format::kNvfp4;
  BlockShape block = BlockShape::k1x16;  // k1x32 is implied for kMxfp4.
  Rounding rounding = Rounding::kNearest;
  uint64_t seed = 0;  // stochastic rounding key.
  uint64_t step = 0;  // stochastic rounding counter (high half).
  RhtMode rht = RhtMode::kOff;
  uint64_t rht_seed = 0;  // used when rht == kSeeded.
  ScaleSelection scale_selection = ScaleSelection::kMapTo6;
  float four_over_six_emax = 256.0f;  // 256 (default) or 448.
  bool has_amax = false;              // true: use `amax` instead of computing it.
  float amax = 0.0f;                  // caller-supplied global amax (finite, >= 0).
  ScaleLayout scale_layout = ScaleLayout::kPlain;
  MxScaleRule mx_rule = MxScaleRule::kRceil;
  bool rowwise = true;      // quantize x [rows, cols] along cols.
  bool columnwise = false;  // quantize x^T [cols, rows] along rows (rows % 16 == 0).
};

// A dense 2-D row-major input tensor.
struct ConstTensor {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
};

// A dense 2-D row-major output tensor; `capacity` is the size of the buffer in bytes.
struct MutTensor {
  void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  size_t capacity = 0;
};

// Global scale record of a quantized tensor: two f32 values in the backend's memory.
//   global[0] = the global amax used (computed or caller-given),
//   global[1] = S_enc (NVFP4, NUMERICS 2 G2 or 7) or 1.0f (MXFP4).
// S_dec is always RN(1 / S_enc).
inline constexpr int kGlobalFloats = 2;

// A quantized [rows, cols] matrix, quantized along cols. `codes` holds rows * cols / 2 bytes
// (element 2j low nibble); `scales` holds the block scales in `scale_layout`.
// Capacities are in bytes; writers check them, readers check them against the needed size.
struct QuantizedTensor {
  Format format = Format::kNvfp4;
  BlockShape block = BlockShape::k1x16;
  ScaleLayout scale_layout = ScaleLayout::kPlain;
  int64_t rows = 0;
  int64_t cols = 0;
  uint8_t* codes = nullptr;
  size_t codes_capacity = 0;
  uint8_t* scales = nullptr;
  size_t scales_capacity = 0;
  float* global = nullptr;  // kGlobalFloats floats.
};

// Read-only quantized operand (dequantize, matmul).
struct ConstQuantizedTensor {
  Format format = Format::kNvfp4;
  BlockShape block = BlockShape::k1x16;
  ScaleLayout scale_layout = ScaleLayout::kPlain;
  int64_t rows = 0;
  int64_t cols = 0;
  const uint8_t* codes = nullptr;
  size_t codes_capacity = 0;
  const uint8_t* scales = nullptr;
  size_t scales_capacity = 0;
  const float* global = nullptr;
};

inline ConstQuantizedTensor AsConst(const QuantizedTensor& q) {
  return ConstQuantizedTensor{q.format, q.block,  q.scale_layout,    q.rows,
                              q.cols,   q.codes,  q.codes_capacity,  q.scales,
                              q.scales_capacity, q.global};
}

// ---- Size arithmetic (overflow-checked; INVALID_ARGUMENT names `what`). ----

size_t DTypeSize(DType dtype);
const char* DTypeName(DType dtype);
const char* FormatName(Format format);
const char* BlockShapeName(BlockShape block);

// Elements per scale along a row: 16 (NVFP4) or 32 (MXFP4).
int BlockElems(Format format);

// rows * cols * element size, or INVALID_ARGUMENT when a dimension is < 1 or the product
// overflows (limit: 2^62 bytes).
absl::StatusOr<size_t> DenseBytes(int64_t rows, int64_t cols, DType dtype,
                                  const FieldPath& what);
// Packed code bytes of a [rows, cols] quantized matrix: rows * cols / 2.
absl::StatusOr<size_t> CodeBytes(int64_t rows, int64_t cols, const FieldPath& what);
// Scale bytes of a [rows, cols] quantized matrix in `layout` (swizzled pads to 128 x 4).
absl::StatusOr<size_t> ScaleBytes(int64_t rows, int64_t cols, Format format,
                                  ScaleLayout layout, const FieldPath& what);
// Byte offset of scale (r, c) in the swizzled layout with `scale_cols` logical scale columns.
size_t SwizzledScaleOffset(int64_t r, int64_t c, int64_t scale_cols);

}  // namespace fp4q::kernels

#endif  // FP4Q_KERNELS_TYPES_H_
