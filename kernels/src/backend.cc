// The non-virtual Backend entry points: validate every argument (validate.h), then run the
// backend's implementation. Nothing is read or written when validation fails.
#include "fp4q/kernels/backend.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "fp4q/common/status_macros.h"
#include "fp4q/kernels/validate.h"

namespace fp4q::kernels {

absl::Status Backend::Amax(const ConstTensor& x, float* amax, Stream stream) {
  FP4Q_RETURN_IF_ERROR(ValidateConstTensor(x, "x"));
  if (amax == nullptr) return absl::InvalidArgumentError("amax: null");
  return DoAmax(x, amax, stream);
}

absl::Status Backend::Quantize(const ConstTensor& x, const QuantizeOptions& options,
                               float* residual, const QuantizedTensor* rowwise,
                               const QuantizedTensor* columnwise, Stream stream) {
  FP4Q_RETURN_IF_ERROR(ValidateQuantizeArgs(x, options, residual, rowwise, columnwise));
  return DoQuantize(x, options, residual, options.rowwise ? rowwise : nullptr,
                    options.columnwise ? columnwise : nullptr, stream);
}

absl::Status Backend::Dequantize(const ConstQuantizedTensor& q, const MutTensor& out,
                                 Stream stream) {
  FP4Q_RETURN_IF_ERROR(ValidateQuantizedInput(q, "q"));
  FP4Q_RETURN_IF_ERROR(ValidateMutTensor(out, "out"));
  if (out.rows != q.rows) {
    return absl::InvalidArgumentError(
        absl::StrCat("out.rows: ", out.rows, " does not match q.rows ", q.rows));
  }
  if (out.cols != q.cols) {
    return absl::InvalidArgumentError(
        absl::StrCat("out.cols: ", out.cols, " does not match q.cols ", q.cols));
  }
  return DoDequantize(q, out, stream);
}

absl::Status Backend::Qdq(const ConstTensor& x, const QuantizeOptions& options, float* residual,
                          const MutTensor& out, Stream stream) {
  FP4Q_RETURN_IF_ERROR(ValidateQdqArgs(x, options, residual, out));
  return DoQdq(x, options, residual, out, stream);
}

absl::Status Backend::Matmul(const ConstQuantizedTensor& a, const ConstQuantizedTensor& b,
                             const MutTensor& c, Stream stream) {
  FP4Q_RETURN_IF_ERROR(ValidateMatmulArgs(a, b, c));
  return DoMatmul(a, b, c, stream);
}

absl::Status Backend::UpdateWeight(const QuantizedTensor& weight, float* residual,
                                   const ConstTensor& update, float lr, UpdateKind kind,
                                   const QuantizeOptions& options, const MutTensor* dequantized_out,
                                   Stream stream) {
  FP4Q_RETURN_IF_ERROR(
      ValidateUpdateWeightArgs(weight, update, lr, kind, options, dequantized_out));
  return DoUpdateWeight(weight, residual, update, lr, kind, options, dequantized_out, stream);
}

absl::Status Backend::Rht(const ConstTensor& in, RhtMode mode, uint64_t rht_seed, bool inverse,
                          const MutTensor& out, Stream stream) {
  FP4Q_RETURN_IF_ERROR(ValidateRhtArgs(in, mode, out));
  return DoRht(in, mode, rht_seed, inverse, out, stream);
}

}  // namespace fp4q::kernels
