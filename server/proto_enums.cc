// The enum tables of proto_enums.h.
#include "server/proto_enums.h"

#include <cstddef>
#include <string>

#include "absl/strings/str_cat.h"
#include "fp4q/common/status_macros.h"

namespace fp4q::server {
namespace {

template <typename P, typename K>
struct Pair {
  P proto;
  K kernel;
};

// The kernels' value of proto value `v` (unknown: INVALID_ARGUMENT naming `field`).
template <typename P, typename K, size_t N>
absl::StatusOr<K> Lookup(const Pair<P, K> (&table)[N], P v, const FieldPath& field) {
  for (const Pair<P, K>& e : table) {
    if (e.proto == v) return e.kernel;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(field.str(), ": unknown value ", static_cast<int>(v)));
}

// The first proto value naming `k` (tables list UNSPECIFIED last, so replies name the value).
template <typename P, typename K, size_t N>
P Reverse(const Pair<P, K> (&table)[N], K k) {
  for (const Pair<P, K>& e : table) {
    if (e.kernel == k) return e.proto;
  }
  return table[0].proto;
}

using kernels::BlockShape;
using kernels::DType;
using kernels::Format;
using kernels::MxScaleRule;
using kernels::OptimizerKind;
using kernels::RhtMode;
using kernels::Rounding;
using kernels::ScaleLayout;
using kernels::ScaleSelection;
using kernels::Scaling;
using kernels::StateDType;
using kernels::UpdateKind;

constexpr Pair<v1::DType, DType> kDTypes[] = {{v1::DTYPE_F32, DType::kF32},
                                              {v1::DTYPE_BF16, DType::kBF16}};
constexpr Pair<v1::Format, Format> kFormats[] = {{v1::FORMAT_NVFP4, Format::kNvfp4},
                                                 {v1::FORMAT_MXFP4, Format::kMxfp4},
                                                 {v1::FORMAT_UNSPECIFIED, Format::kNvfp4}};
// UNSPECIFIED depends on the format (BlockFrom).
constexpr Pair<v1::BlockShape, BlockShape> kBlocks[] = {
    {v1::BLOCK_SHAPE_1X16, BlockShape::k1x16},
    {v1::BLOCK_SHAPE_16X16, BlockShape::k16x16},
    {v1::BLOCK_SHAPE_1X32, BlockShape::k1x32}};
constexpr Pair<v1::ScaleLayout, ScaleLayout> kLayouts[] = {
    {v1::SCALE_LAYOUT_PLAIN, ScaleLayout::kPlain},
    {v1::SCALE_LAYOUT_SWIZZLED, ScaleLayout::kSwizzled},
    {v1::SCALE_LAYOUT_UNSPECIFIED, ScaleLayout::kPlain}};
constexpr Pair<v1::Rounding, Rounding> kRoundings[] = {
    {v1::ROUNDING_NEAREST, Rounding::kNearest},
    {v1::ROUNDING_STOCHASTIC, Rounding::kStochastic},
    {v1::ROUNDING_UNSPECIFIED, Rounding::kNearest}};
constexpr Pair<v1::RhtMode, RhtMode> kRhtModes[] = {
    {v1::RHT_MODE_OFF, RhtMode::kOff},
    {v1::RHT_MODE_DEFAULT_SIGNS, RhtMode::kDefaultSigns},
    {v1::RHT_MODE_SEEDED, RhtMode::kSeeded},
    {v1::RHT_MODE_UNSPECIFIED, RhtMode::kOff}};
constexpr Pair<v1::ScaleSelection, ScaleSelection> kSelections[] = {
    {v1::SCALE_SELECTION_MAP_TO_6, ScaleSelection::kMapTo6},
    {v1::SCALE_SELECTION_FOUR_OVER_SIX_MAE, ScaleSelection::kFourOverSixMae},
    {v1::SCALE_SELECTION_FOUR_OVER_SIX_MSE, ScaleSelection::kFourOverSixMse},
    {v1::SCALE_SELECTION_UNSPECIFIED, ScaleSelection::kMapTo6}};
constexpr Pair<v1::MxScaleRule, MxScaleRule> kMxRules[] = {
    {v1::MX_SCALE_RULE_RCEIL, MxScaleRule::kRceil},
    {v1::MX_SCALE_RULE_FLOOR, MxScaleRule::kFloor},
    {v1::MX_SCALE_RULE_UNSPECIFIED, MxScaleRule::kRceil}};
constexpr Pair<v1::UpdateKind, UpdateKind> kUpdateKinds[] = {
    {v1::UPDATE_KIND_GRADIENT, UpdateKind::kGradient},
    {v1::UPDATE_KIND_DELTA, UpdateKind::kDelta},
    {v1::UPDATE_KIND_UNSPECIFIED, UpdateKind::kGradient}};
constexpr Pair<v1::Scaling, Scaling> kScalings[] = {{v1::SCALING_CURRENT, Scaling::kCurrent},
                                                    {v1::SCALING_DELAYED, Scaling::kDelayed},
                                                    {v1::SCALING_UNSPECIFIED, Scaling::kCurrent}};
constexpr Pair<v1::OptimizerKind, OptimizerKind> kOptimizers[] = {
    {v1::OPTIMIZER_KIND_SGD, OptimizerKind::kSgd},
    {v1::OPTIMIZER_KIND_ADAMW, OptimizerKind::kAdamW},
    {v1::OPTIMIZER_KIND_UNSPECIFIED, OptimizerKind::kSgd}};
constexpr Pair<v1::StateDType, StateDType> kStateDTypes[] = {
    {v1::STATE_DTYPE_F32, StateDType::kF32},
    {v1::STATE_DTYPE_BF16, StateDType::kBF16},
    {v1::STATE_DTYPE_NVFP4, StateDType::kNvfp4},
    {v1::STATE_DTYPE_UNSPECIFIED, StateDType::kF32}};

}  // namespace

absl::StatusOr<DType> DenseDType(v1::DType v, const FieldPath& field,
                                 std::optional<DType> dflt) {
  if (v == v1::DTYPE_UNSPECIFIED && dflt.has_value()) return *dflt;
  for (const auto& e : kDTypes) {
    if (e.proto == v) return e.kernel;
  }
  const std::string name = v1::DType_IsValid(v)
                               ? v1::DType_Name(v)
                               : absl::StrCat("unknown value ", static_cast<int>(v));
  return absl::InvalidArgumentError(
      absl::StrCat(field.str(), ": ", name, "; expected DTYPE_F32 or DTYPE_BF16"));
}

absl::StatusOr<std::optional<DType>> OptionalDType(v1::DType v, const FieldPath& field) {
  if (v == v1::DTYPE_UNSPECIFIED) return std::optional<DType>();
  FP4Q_ASSIGN_OR_RETURN(DType d, DenseDType(v, field));
  return std::optional<DType>(d);
}

absl::StatusOr<Format> FormatFrom(v1::Format v, const FieldPath& field) {
  return Lookup(kFormats, v, field);
}

absl::StatusOr<BlockShape> BlockFrom(v1::BlockShape v, Format format, const FieldPath& field) {
  if (v == v1::BLOCK_SHAPE_UNSPECIFIED) {
    return format == Format::kMxfp4 ? BlockShape::k1x32 : BlockShape::k1x16;
  }
  return Lookup(kBlocks, v, field);
}

absl::StatusOr<ScaleLayout> LayoutFrom(v1::ScaleLayout v, const FieldPath& field) {
  return Lookup(kLayouts, v, field);
}

absl::StatusOr<Rounding> RoundingFrom(v1::Rounding v, const FieldPath& field) {
  return Lookup(kRoundings, v, field);
}

absl::StatusOr<RhtMode> RhtFrom(v1::RhtMode v, const FieldPath& field) {
  return Lookup(kRhtModes, v, field);
}

absl::StatusOr<ScaleSelection> SelectionFrom(v1::ScaleSelection v, const FieldPath& field) {
  return Lookup(kSelections, v, field);
}

absl::StatusOr<MxScaleRule> MxRuleFrom(v1::MxScaleRule v, const FieldPath& field) {
  return Lookup(kMxRules, v, field);
}

absl::Status OutputsFrom(v1::Outputs v, const FieldPath& field, kernels::QuantizeOptions* o) {
  switch (v) {
    case v1::OUTPUTS_UNSPECIFIED:
    case v1::OUTPUTS_ROWWISE:
      o->rowwise = true;
      o->columnwise = false;
      return absl::OkStatus();
    case v1::OUTPUTS_COLUMNWISE:
      o->rowwise = false;
      o->columnwise = true;
      return absl::OkStatus();
    case v1::OUTPUTS_BOTH:
      o->rowwise = true;
      o->columnwise = true;
      return absl::OkStatus();
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(field.str(), ": unknown value ", static_cast<int>(v)));
  }
}

absl::StatusOr<UpdateKind> UpdateKindFrom(v1::UpdateKind v, const FieldPath& field) {
  return Lookup(kUpdateKinds, v, field);
}

absl::StatusOr<Scaling> ScalingFrom(v1::Scaling v, const FieldPath& field) {
  return Lookup(kScalings, v, field);
}

absl::StatusOr<OptimizerKind> OptimizerKindFrom(v1::OptimizerKind v, const FieldPath& field) {
  return Lookup(kOptimizers, v, field);
}

absl::StatusOr<StateDType> StateDTypeFrom(v1::StateDType v, const FieldPath& field) {
  return Lookup(kStateDTypes, v, field);
}

v1::DType ToWire(DType d) { return Reverse(kDTypes, d); }
v1::Format ToWire(Format f) { return Reverse(kFormats, f); }
v1::BlockShape ToWire(BlockShape b) { return Reverse(kBlocks, b); }
v1::ScaleLayout ToWire(ScaleLayout l) { return Reverse(kLayouts, l); }
v1::Rounding ToWire(Rounding r) { return Reverse(kRoundings, r); }
v1::Scaling ToWire(Scaling s) { return Reverse(kScalings, s); }
v1::OptimizerKind ToWire(OptimizerKind k) { return Reverse(kOptimizers, k); }
v1::StateDType ToWire(StateDType d) { return Reverse(kStateDTypes, d); }

}  // namespace fp4q::server
