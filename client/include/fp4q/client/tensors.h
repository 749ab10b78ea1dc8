// Building request tensors from host memory or region slices, and reading reply tensors back.
//
// Contract
// - Everything here copies: a returned v1::Tensor owns its bytes; nothing keeps a reference to
//   the caller's span.
// - Bad arguments give INVALID_ARGUMENT naming the field and value ("shape[1] = -3 ...",
//   "inline_data has 12 bytes; dtype F32 shape [2, 4] needs 32"); shape products are
//   overflow-checked.
// - Thread safety: free functions with no shared state.
#ifndef FP4Q_CLIENT_TENSORS_H_
#define FP4Q_CLIENT_TENSORS_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "fp4q/v1/fp4q.pb.h"

namespace fp4q::client {

namespace v1 = ::fp4q::v1;

// Bytes per element of a dense dtype (F32 4, BF16 2, U8 1, F8_E4M3 1, F8_E8M0 1); 0 for
// DTYPE_UNSPECIFIED and values outside the enum.
size_t DTypeSize(v1::DType dtype);
// "F32", "BF16", "U8", "F8_E4M3", "F8_E8M0"; "DTYPE_UNSPECIFIED" / "DType(N)" otherwise.
std::string DTypeName(v1::DType dtype);
// "[2, 4]".
std::string ShapeString(absl::Span<const int64_t> shape);

// prod(shape), each dimension >= 0; INVALID_ARGUMENT naming `what` ("shape[i] = v") for a
// negative dimension or a product over INT64_MAX.
absl::StatusOr<int64_t> NumElements(absl::Span<const int64_t> shape,
                                    absl::string_view what = "shape");
// NumElements * DTypeSize, overflow-checked; INVALID_ARGUMENT for an unsized dtype.
absl::StatusOr<uint64_t> DenseBytes(v1::DType dtype, absl::Span<const int64_t> shape);

// An inline tensor from raw little-endian bytes; `bytes` must be exactly DenseBytes.
absl::StatusOr<v1::Tensor> InlineTensor(v1::DType dtype, absl::Span<const int64_t> shape,
                                        absl::string_view bytes);
// An inline F32 tensor; values.size() must equal prod(shape).
absl::StatusOr<v1::Tensor> InlineTensorF32(absl::Span<const float> values,
                                           absl::Span<const int64_t> shape);
// An inline BF16 tensor from bf16 bit patterns; bits.size() must equal prod(shape).
absl::StatusOr<v1::Tensor> InlineTensorBF16(absl::Span<const uint16_t> bits,
                                            absl::Span<const int64_t> shape);
// A tensor read from a registered region (the server checks the slice against the region).
absl::StatusOr<v1::Tensor> RegionTensor(v1::DType dtype, absl::Span<const int64_t> shape,
                                        const v1::RegionSlice& slice);
// An output target in a region.
v1::OutputTarget RegionTarget(const v1::RegionSlice& slice);

// The values of an inline F32 or BF16 result, widened to f32. FAILED_PRECONDITION when the
// result was written to a region (no inline bytes); INVALID_ARGUMENT for another dtype or a
// byte count that disagrees with dtype and shape.
absl::StatusOr<std::vector<float>> ResultToF32(const v1::TensorResult& result);

// Exact widenings and the round-to-nearest-even narrowing used by the CLI.
float Bf16ToF32(uint16_t bits);
float F16ToF32(uint16_t bits);
uint16_t F32ToBf16(float value);  // RN-even; NaN stays a (quiet) NaN of the same sign

// Little-endian copies between floats and bytes (this library targets little-endian hosts).
std::string F32Bytes(absl::Span<const float> values);
std::vector<float> BytesToF32(absl::string_view bytes);  // bytes.size() / 4 values

}  // namespace fp4q::client

#endif  // FP4Q_CLIENT_TENSORS_H_
