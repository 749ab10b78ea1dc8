// Argument validation shared by every backend (the Backend's public entry points call these
// before any memory is touched). Each returns INVALID_ARGUMENT with a message naming the field
// and the offending value, e.g. "x.cols: 40 is not a multiple of the block size 16".
// Field names used in messages: x, out, residual, rowwise, columnwise, a, b, c, weight, update,
// options.<field>.
#ifndef FP4Q_KERNELS_VALIDATE_H_
#define FP4Q_KERNELS_VALIDATE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "fp4q/kernels/step.h"
#include "fp4q/kernels/types.h"

namespace fp4q::kernels {

// Enum values in range, option combinations NUMERICS.md defines (e.g. four-over-six is NVFP4
// only, RTN only and not combined with RHT; MXFP4 uses 1x32 blocks; at least one output;
// caller amax finite and >= 0; emax 256 or 448).
absl::Status ValidateQuantizeOptions(const QuantizeOptions& options);

// A dense input: non-null, known dtype, rows >= 1, cols >= 1, byte size without overflow.
absl::Status ValidateConstTensor(const ConstTensor& t, const FieldPath& field);
// A dense output: as above plus capacity >= rows * cols * dtype size.
absl::Status ValidateMutTensor(const MutTensor& t, const FieldPath& field);

// Quantize/QDQ shape rules for x under `options` (cols multiple of the block; rows multiple of
// 16 for 16x16 blocks and for column-wise output).
absl::Status ValidateQuantizeInput(const ConstTensor& x, const QuantizeOptions& options);

// An output quantized tensor of shape [rows, cols] in `options`' format/block/layout, with
// capacities large enough.
absl::Status ValidateQuantizedOutput(const QuantizedTensor& q, int64_t rows, int64_t cols,
                                     const QuantizeOptions& options, const FieldPath& field);
// A quantized operand: known enums, shape rules for its format and block, non-null buffers of
// the needed sizes.
absl::Status ValidateQuantizedInput(const ConstQuantizedTensor& q, const FieldPath& field);

// The full argument sets of the Backend entry points.
absl::Status ValidateQuantizeArgs(const ConstTensor& x, const QuantizeOptions& options,
                                  const float* residual, const QuantizedTensor* rowwise,
                                  const QuantizedTensor* columnwise);
absl::Status ValidateQdqArgs(const ConstTensor& x, const QuantizeOptions& options,
                             const float* residual, const MutTensor& out);
absl::Status ValidateMatmulArgs(const ConstQuantizedTensor& a, const ConstQuantizedTensor& b,
                                const MutTensor& c);
absl::Status ValidateUpdateWeightArgs(const QuantizedTensor& weight, const ConstTensor& update,
                                      float lr, UpdateKind kind, const QuantizeOptions& options,
                                      const MutTensor* dequantized_out);
// One step item (step.h): the weight NVFP4 row-wise 1x16/16x16 (plain or swizzled scales),
// updates and outputs of its shape, the optimizer state its OptimizerState names present (and
// nothing else; NVFP4 moments 1x16 plain of the weight's shape), hyperparameters finite and in
// range (lr >= 0, betas in [0, 1), eps > 0, momentum >= 0 and only with a momentum buffer,
// nesterov only with momentum > 0 and dampening 0, weight_decay >= 0, t >= 1), kDelta only with
// plain SGD (no momentum, no weight decay), stats present under delayed scaling, one expected
// fingerprint per update for check-only items, and every dense buffer and code array 16-byte
// aligned (the kernels' vector accesses). Messages name `field` (e.g. "items[3]") followed by
// the part ("items[3].updates[1].rows: ...").
// ValidateStepItems: 1 .. 2^24 items, each valid, no stored weight written by two items.
absl::Status ValidateStepItem(const StepItem& item, const FieldPath& field);
absl::Status ValidateStepItems(const std::vector<StepItem>& items);

absl::Status ValidateRhtArgs(const ConstTensor& in, RhtMode mode, const MutTensor& out);

// A residual held with shape [residual_rows, residual_cols] (e.g. a named server state tensor)
// used for error feedback on x: the shapes must be equal ("residual.rows: 8 does not match x.rows
// 16"). The Backend's `float* residual` is x-shaped by contract, so callers holding residuals
// check them with this before calling Quantize/Qdq.
absl::Status ValidateResidualShape(int64_t residual_rows, int64_t residual_cols,
                                   const ConstTensor& x);

}  // namespace fp4q::kernels

#endif  // FP4Q_KERNELS_VALIDATE_H_
