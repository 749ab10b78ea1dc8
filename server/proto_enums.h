// Proto enums <-> the kernels' enums, for the edge (proto_convert.cc): each proto enum's values
// are one table (proto_enums.cc), read one way for requests and the other for replies.
//
// Requests: an unknown value is INVALID_ARGUMENT naming the field path ("options.rounding:
// unknown value 7"); 0 / UNSPECIFIED becomes the proto's documented default (the tables and the
// functions below say which). Replies: the proto value naming the kernels' value.
#ifndef FP4Q_SERVER_PROTO_ENUMS_H_
#define FP4Q_SERVER_PROTO_ENUMS_H_

#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fp4q/common/field_path.h"
#include "fp4q/kernels/step.h"
#include "fp4q/kernels/types.h"
#include "fp4q/v1/fp4q.pb.h"

namespace fp4q::server {

namespace v1 = ::fp4q::v1;

// F32 or BF16; anything else (UNSPECIFIED too, unless `dflt` is given) is refused by name
// ("items[2].update.dtype: DTYPE_U8; expected DTYPE_F32 or DTYPE_BF16").
absl::StatusOr<kernels::DType> DenseDType(v1::DType v, const FieldPath& field,
                                          std::optional<kernels::DType> dflt = std::nullopt);
// UNSPECIFIED: none (the input's or the weight's dtype, decided by the engine).
absl::StatusOr<std::optional<kernels::DType>> OptionalDType(v1::DType v, const FieldPath& field);
// UNSPECIFIED: NVFP4.
absl::StatusOr<kernels::Format> FormatFrom(v1::Format v, const FieldPath& field);
// UNSPECIFIED: 1x16 for NVFP4, 1x32 for MXFP4.
absl::StatusOr<kernels::BlockShape> BlockFrom(v1::BlockShape v, kernels::Format format,
                                              const FieldPath& field);
// UNSPECIFIED: plain.
absl::StatusOr<kernels::ScaleLayout> LayoutFrom(v1::ScaleLayout v, const FieldPath& field);
// UNSPECIFIED: nearest.
absl::StatusOr<kernels::Rounding> RoundingFrom(v1::Rounding v, const FieldPath& field);
// UNSPECIFIED: off.
absl::StatusOr<kernels::RhtMode> RhtFrom(v1::RhtMode v, const FieldPath& field);
// UNSPECIFIED: map-to-6.
absl::StatusOr<kernels::ScaleSelection> SelectionFrom(v1::ScaleSelection v,
                                                      const FieldPath& field);
// UNSPECIFIED: rceil.
absl::StatusOr<kernels::MxScaleRule> MxRuleFrom(v1::MxScaleRule v, const FieldPath& field);
// The kernels' rowwise / columnwise flags (UNSPECIFIED: row-wise).
absl::Status OutputsFrom(v1::Outputs v, const FieldPath& field, kernels::QuantizeOptions* o);
// UNSPECIFIED: gradient.
absl::StatusOr<kernels::UpdateKind> UpdateKindFrom(v1::UpdateKind v, const FieldPath& field);
// UNSPECIFIED: current.
absl::StatusOr<kernels::Scaling> ScalingFrom(v1::Scaling v, const FieldPath& field);
// UNSPECIFIED: SGD.
absl::StatusOr<kernels::OptimizerKind> OptimizerKindFrom(v1::OptimizerKind v,
                                                         const FieldPath& field);
// UNSPECIFIED: f32.
absl::StatusOr<kernels::StateDType> StateDTypeFrom(v1::StateDType v, const FieldPath& field);

v1::DType ToWire(kernels::DType d);
v1::Format ToWire(kernels::Format f);
v1::BlockShape ToWire(kernels::BlockShape b);
v1::ScaleLayout ToWire(kernels::ScaleLayout l);
v1::Rounding ToWire(kernels::Rounding r);
v1::Scaling ToWire(kernels::Scaling s);
v1::OptimizerKind ToWire(kernels::OptimizerKind k);
v1::StateDType ToWire(kernels::StateDType d);

}  // namespace fp4q::server

#endif  // FP4Q_SERVER_PROTO_ENUMS_H_
