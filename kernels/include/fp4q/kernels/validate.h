// Argument validation shared by every backend (the Backend's public entry points call these
// before any memory is touched). Each returns INVALID_ARGUMENT with a message naming the field
// and the offending value, e.g. "x.cols: 40 is not a multiple of the block size 16".
//
// Messages name arguments by the FieldPath the caller passes: the Backend's entry points use
// their parameter names (x, out, residual, rowwise, columnwise, a, b, c, q, weight, update,
// options.<field>); a server passes its request's field paths ("input", "b.tensor",
// "items[3]"), so its messages need no renaming. The shape-only checks (ValidateQuantizeShape,
// ValidateQuantizedShape, ValidateErrorFeedback) read no buffer: a caller can run them before
// its buffers exist.
#ifndef FP4Q_KERNELS_VALIDATE_H_
#define FP4Q_KERNELS_VALIDATE_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "fp4q/common/field_path.h"
#include "fp4q/kernels/step.h"
#include "fp4q/kernels/types.h"

namespace fp4q::kernels {

// Messages name one argument by a FieldPath (fp4q/common/field_path.h): its path and how it
// names its two dimensions. From a plain path ("x", "items[3].updates[1]") they are
// "<path>.rows" and "<path>.cols"; a request tensor whose shape is a list names them
// "<path>.shape[0]" / "<path>.shape[1]" (Shaped); an argument with no shape of its own in the
// request names them as it likes (Dims, e.g. "a.weight_name (the weight's rows)"). Paths are
// spelled out only when a check fails.

// Enum values in range, option combinations NUMERICS.md defines (e.g. four-over-six is NVFP4
// only, RTN only and not combined with RHT; MXFP4 uses 1x32 blocks; at least one output;
// caller amax finite and >= 0; emax 256 or 448).
// Messages name the fields below `field` ("options.rht") and quote other options by the same
// prefix ("needs options.rounding nearest").
absl::Status ValidateQuantizeOptions(const QuantizeOptions& options,
                                     const FieldPath& field = "options");

// A dense input: non-null, known dtype, rows >= 1, cols >= 1, byte size without overflow.
absl::Status ValidateConstTensor(const ConstTensor& t, const FieldPath& field);
// A dense output: as above plus capacity >= rows * cols * dtype size.
absl::Status ValidateMutTensor(const MutTensor& t, const FieldPath& field);

// Quantize/QDQ shape rules for a [rows, cols] x under `options` (both >= 1; cols a multiple of
// the block; rows a multiple of 16 for 16x16 blocks and for column-wise output). Reads no buffer.
absl::Status ValidateQuantizeShape(int64_t rows, int64_t cols, const QuantizeOptions& options,
                                   const FieldPath& x = "x");
// ValidateConstTensor(x) and ValidateQuantizeShape.
absl::Status ValidateQuantizeInput(const ConstTensor& x, const QuantizeOptions& options,
                                   const FieldPath& field = "x");
// Error feedback (a residual) under `options`: row-wise output only, no RHT. `residual` names
// the residual argument, `options` the options' prefix. Reads no buffer.
absl::Status ValidateErrorFeedback(const QuantizeOptions& options,
                                   const FieldPath& residual = "residual",
                                   const FieldPath& field = "options");

// An output quantized tensor of shape [rows, cols] in `options`' format/block/layout, with
// capacities large enough.
absl::Status ValidateQuantizedOutput(const QuantizedTensor& q, int64_t rows, int64_t cols,
                                     const QuantizeOptions& options, const FieldPath& field);
// A quantized operand's header: known enums, a block of its format, rows and cols >= 1, cols a
// multiple of the block, rows a multiple of 16 for 16x16 blocks. Reads no buffer.
absl::Status ValidateQuantizedShape(Format format, BlockShape block, ScaleLayout layout,
                                    int64_t rows, int64_t cols, const FieldPath& field);
// A quantized operand: ValidateQuantizedShape, then non-null buffers of the needed sizes.
absl::Status ValidateQuantizedInput(const ConstQuantizedTensor& q, const FieldPath& field);

// The full argument sets of the Backend entry points.
absl::Status ValidateQuantizeArgs(const ConstTensor& x, const QuantizeOptions& options,
                                  const float* residual, const QuantizedTensor* rowwise,
                                  const QuantizedTensor* columnwise);
// QDQ's options: valid, row-wise output only, no RHT. Reads no buffer.
absl::Status ValidateQdqOptions(const QuantizeOptions& options, const FieldPath& field = "options");
absl::Status ValidateQdqArgs(const ConstTensor& x, const QuantizeOptions& options,
                             const float* residual, const MutTensor& out);
// Messages name the operands `a_field`, `b_field` and `c_field` ("b.cols: 16 does not match
// a.cols 32 (K)").
absl::Status ValidateMatmulArgs(const ConstQuantizedTensor& a, const ConstQuantizedTensor& b,
                                const MutTensor& c, const FieldPath& a_field = "a",
                                const FieldPath& b_field = "b", const FieldPath& c_field = "c");
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
