// The 4-bit grid of a stored NVFP4 tensor, decoded on the client from a
// QuantizedTensor reply (GetWeight quantized=true, or Quantize): each element's
// E2M1 code and its block's decode unit. The examples use it to measure how
// large an update is compared with the grid step around each weight, and which
// 4-bit codes changed.
//
// Contract
// - FromProto accepts only what it can decode exactly: NVFP4, plain scale
// layout, inline codes
//   and scales of exactly rows*cols/2 and rows*cols/16 bytes, shape [rows,
//   cols] with cols a multiple of 16, a finite positive s_enc and no NaN scale
//   byte. Anything else is INVALID_ARGUMENT naming the field and its value (a
//   reply is outside input too).
// - Values follow docs/NUMERICS.md section 2: DQ = RN(RN(e2m1(code) * sf) *
// S_dec) in f32
//   with S_dec = RN(1 / s_enc).
// - A value type; thread-compatible.
#ifndef FP4Q_EXAMPLES_NVFP4_GRID_H_
#define FP4Q_EXAMPLES_NVFP4_GRID_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "fp4q/v1/fp4q.pb.h"

namespace fp4q::examples {

// The value of an E4M3 byte (sign, 4 exponent bits with bias 7, 3 mantissa
// bits; subnormals); NaN for 0x7F and 0xFF.
float E4m3ToFloat(uint8_t byte);
// The value of an E2M1 code 0..15 (bit 3 the sign).
float E2m1ToFloat(uint8_t code);
// The code with -0 (8) written as +0 (0): two codes are the same value iff
// their canonical codes are equal. (A zero weight whose update is negative is
// stored as -0.)
inline uint8_t CanonicalCode(uint8_t code) {
  return (code & 7) == 0 ? 0 : code;
}

class Nvfp4Grid {
 public:
  static absl::StatusOr<Nvfp4Grid> FromProto(const v1::QuantizedTensor& q,
                                             int64_t rows, int64_t cols);

  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  int64_t size() const { return rows_ * cols_; }
  // Element i's code, 0..15 (row-major index).
  uint8_t code(int64_t i) const { return codes_[static_cast<size_t>(i)]; }
  const std::vector<uint8_t>& codes() const { return codes_; }
  // Element i's dequantized value (section 2, bit-exact).
  float Value(int64_t i) const;

  // True when adding `delta` to element i leaves it nearer its own grid value
  // than the next grid value in delta's direction: |delta| < half the distance
  // to that neighbour, with the block's current scale. Round-to-nearest then
  // keeps the code. At the largest magnitude (code +-6) moving outward has no
  // neighbour: true. delta == 0: true.
  bool BelowHalfStep(int64_t i, float delta) const;

  // OK when every element's Value() equals values[i] to within rel_tol *
  // |values[i]| (0: bit for bit, -0 == +0). INTERNAL naming the first element
  // that differs otherwise, and INVALID_ARGUMENT when the sizes differ.
  absl::Status CheckValues(absl::Span<const float> values,
                           double rel_tol) const;

 private:
  Nvfp4Grid() = default;
  int64_t rows_ = 0;
  int64_t cols_ = 0;
  float s_dec_ = 0;
  std::vector<uint8_t> codes_;  // one per element, unpacked
  std::vector<float> scales_;   // one per block of 16: the E4M3 value sf
};

}  // namespace fp4q::examples

#endif  // FP4Q_EXAMPLES_NVFP4_GRID_H_
