// Argument validation shared by every backend; see validate.h. Messages name the field and the
// offending value ("x.cols: 40 is not a multiple of the block size 16").
#include "fp4q/kernels/validate.h"

#include <cmath>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "fp4q/common/status_macros.h"

namespace fp4q::kernels {
namespace {

absl::Status Invalid(const FieldPath& field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(field.str(), ": ", what));
}
// The same, for a name spelled already (a path's dimension: FieldPath::Rows).
absl::Status InvalidAt(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

// rows and cols >= 1, named as `field` names its dimensions.
absl::Status CheckDims(int64_t rows, int64_t cols, const FieldPath& field) {
  if (rows < 1) return InvalidAt(field.Rows(), absl::StrCat(rows, " must be >= 1"));
  if (cols < 1) return InvalidAt(field.Cols(), absl::StrCat(cols, " must be >= 1"));
  return absl::OkStatus();
}

bool ValidDType(DType d) { return d == DType::kF32 || d == DType::kBF16; }
bool ValidFormat(Format f) { return f == Format::kNvfp4 || f == Format::kMxfp4; }
bool ValidBlock(BlockShape b) {
  return b == BlockShape::k1x16 || b == BlockShape::k16x16 || b == BlockShape::k1x32;
}
bool ValidLayout(ScaleLayout l) { return l == ScaleLayout::kPlain || l == ScaleLayout::kSwizzled; }

const char* RoundingName(Rounding r) {
  switch (r) {
    case Rounding::kNearest:
      return "nearest";
    case Rounding::kStochastic:
      return "stochastic";
  }
  return nullptr;
}

const char* RhtName(RhtMode m) {
  switch (m) {
    case RhtMode::kOff:
      return "off";
    case RhtMode::kDefaultSigns:
      return "default_signs";
    case RhtMode::kSeeded:
      return "seeded";
  }
  return nullptr;
}

const char* SelectionName(ScaleSelection s) {
  switch (s) {
    case ScaleSelection::kMapTo6:
      return "map_to_6";
    case ScaleSelection::kFourOverSixMae:
      return "four_over_six_mae";
    case ScaleSelection::kFourOverSixMse:
      return "four_over_six_mse";
  }
  return nullptr;
}

const char* LayoutName(ScaleLayout l) {
  switch (l) {
    case ScaleLayout::kPlain:
      return "plain";
    case ScaleLayout::kSwizzled:
      return "swizzled";
  }
  return nullptr;
}

const char* MxRuleName(MxScaleRule r) {
  switch (r) {
    case MxScaleRule::kRceil:
      return "rceil";
    case MxScaleRule::kFloor:
      return "floor";
  }
  return nullptr;
}

const char* UpdateKindName(UpdateKind k) {
  switch (k) {
    case UpdateKind::kGradient:
      return "gradient";
    case UpdateKind::kDelta:
      return "delta";
  }
  return nullptr;
}

// "<field>: 7 is not a valid <what>" for an enum value whose name is null.
absl::Status CheckEnum(const char* name, int value, const FieldPath& field,
                       absl::string_view what) {
  if (name != nullptr) return absl::OkStatus();
  return Invalid(field, absl::StrCat(value, " is not a valid ", what));
}

std::string EnumText(const char* name, int value) {
  return name != nullptr ? std::string(name) : std::to_string(value);
}

absl::Status CheckBlockForFormat(Format format, BlockShape block, const FieldPath& field) {
  if (!ValidBlock(block)) {
    return Invalid(field, absl::StrCat(static_cast<int>(block), " is not a valid block shape"));
  }
  if (format == Format::kNvfp4 && block == BlockShape::k1x32) {
    return Invalid(field, "1x32 is not an NVFP4 block (1x16 or 16x16)");
  }
  if (format == Format::kMxfp4 && block != BlockShape::k1x32) {
    return Invalid(field, absl::StrCat(BlockShapeName(block), " is not an MXFP4 block (1x32)"));
  }
  return absl::OkStatus();
}

absl::Status CheckSameShape(int64_t rows, int64_t cols, const FieldPath& field, int64_t want_rows,
                            int64_t want_cols, absl::string_view want_field) {
  if (rows != want_rows) {
    return InvalidAt(field.Rows(), absl::StrCat(rows, " does not match ",
                                                want_field, " ", want_rows));
  }
  if (cols != want_cols) {
    return InvalidAt(field.Cols(), absl::StrCat(cols, " does not match ",
                                                want_field, " ", want_cols));
  }
  return absl::OkStatus();
}

absl::Status CheckCapacity(const void* ptr, size_t capacity, size_t needed,
                           const FieldPath& field, absl::string_view buffer) {
  if (ptr == nullptr) return Invalid(field.Member(buffer), "null");
  if (capacity < needed) {
    const std::string member = absl::StrCat(buffer, "_capacity");
    return Invalid(field.Member(member),
                   absl::StrCat(capacity, " bytes is smaller than the ", needed, " needed"));
  }
  return absl::OkStatus();
}

// Codes, scales and global record of a quantized tensor with known-valid enums.
absl::Status CheckQuantizedBuffers(Format format, ScaleLayout layout, int64_t rows, int64_t cols,
                                   const void* codes, size_t codes_capacity, const void* scales,
                                   size_t scales_capacity, const void* global,
                                   const FieldPath& field) {
  FP4Q_RETURN_IF_ERROR(CheckDims(rows, cols, field));
  FP4Q_ASSIGN_OR_RETURN(size_t code_bytes, CodeBytes(rows, cols, field));
  FP4Q_ASSIGN_OR_RETURN(size_t scale_bytes, ScaleBytes(rows, cols, format, layout, field));
  FP4Q_RETURN_IF_ERROR(CheckCapacity(codes, codes_capacity, code_bytes, field, "codes"));
  FP4Q_RETURN_IF_ERROR(CheckCapacity(scales, scales_capacity, scale_bytes, field, "scales"));
  if (global == nullptr) return Invalid(field.Member("global"), "null");
  return absl::OkStatus();
}

}  // namespace


absl::Status ValidateQuantizeOptions(const QuantizeOptions& o, const FieldPath& field) {
  if (!ValidFormat(o.format)) {
    return Invalid(field.Member("format"),
                   absl::StrCat(static_cast<int>(o.format), " is not a valid format"));
  }
  FP4Q_RETURN_IF_ERROR(CheckBlockForFormat(o.format, o.block, field.Member("block")));
  FP4Q_RETURN_IF_ERROR(CheckEnum(RoundingName(o.rounding), static_cast<int>(o.rounding),
                                 field.Member("rounding"), "rounding"));
  FP4Q_RETURN_IF_ERROR(CheckEnum(RhtName(o.rht), static_cast<int>(o.rht),
                                 field.Member("rht"), "RHT mode"));
  FP4Q_RETURN_IF_ERROR(CheckEnum(
      SelectionName(o.scale_selection), static_cast<int>(o.scale_selection),
      field.Member("scale_selection"), "scale selection"));
  FP4Q_RETURN_IF_ERROR(CheckEnum(LayoutName(o.scale_layout), static_cast<int>(o.scale_layout),
                                 field.Member("scale_layout"), "scale layout"));
  FP4Q_RETURN_IF_ERROR(CheckEnum(MxRuleName(o.mx_rule), static_cast<int>(o.mx_rule),
                                 field.Member("mx_rule"), "MX scale rule"));
  if (!o.rowwise && !o.columnwise) {
    return Invalid(field.Member("rowwise"),
                   absl::StrCat("false and ", field.Member("columnwise").str(),
                                " false: no output requested"));
  }
  if (o.has_amax) {
    if (o.format == Format::kMxfp4) {
      return Invalid(field.Member("amax"),
                     absl::StrCat(o.amax, " given, but MXFP4 has no global scale"));
    }
    if (!std::isfinite(o.amax) || o.amax < 0.0f) {
      return Invalid(field.Member("amax"), absl::StrCat(o.amax, " is not finite and >= 0"));
    }
  }
  if (o.scale_selection != ScaleSelection::kMapTo6) {
    const std::string mode = SelectionName(o.scale_selection);
    const FieldPath sel = field.Member("scale_selection");
    if (o.format != Format::kNvfp4) {
      return Invalid(sel, absl::StrCat(mode, " is NVFP4 only (format ", FormatName(o.format), ")"));
    }
    if (o.rounding != Rounding::kNearest) {
      return Invalid(
          sel, absl::StrCat(mode, " needs ", field.Member("rounding").str(),
                            " nearest, not ", RoundingName(o.rounding)));
    }
    if (o.rht != RhtMode::kOff) {
      return Invalid(
          sel, absl::StrCat(mode, " is not combined with ",
                            field.Member("rht").str(), " ", RhtName(o.rht)));
    }
    if (o.four_over_six_emax != 256.0f && o.four_over_six_emax != 448.0f) {
      return Invalid(field.Member("four_over_six_emax"),
                     absl::StrCat(o.four_over_six_emax, " is not 256 or 448"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateConstTensor(const ConstTensor& t, const FieldPath& field) {
  if (!ValidDType(t.dtype)) {
    return Invalid(field.Member("dtype"),
                   absl::StrCat(static_cast<int>(t.dtype), " is not a valid dtype"));
  }
  FP4Q_RETURN_IF_ERROR(CheckDims(t.rows, t.cols, field));
  FP4Q_RETURN_IF_ERROR(DenseBytes(t.rows, t.cols, t.dtype, field).status());
  if (t.data == nullptr) return Invalid(field.Member("data"), "null");
  return absl::OkStatus();
}

absl::Status ValidateMutTensor(const MutTensor& t, const FieldPath& field) {
  if (!ValidDType(t.dtype)) {
    return Invalid(field.Member("dtype"),
                   absl::StrCat(static_cast<int>(t.dtype), " is not a valid dtype"));
  }
  FP4Q_RETURN_IF_ERROR(CheckDims(t.rows, t.cols, field));
  FP4Q_ASSIGN_OR_RETURN(size_t bytes, DenseBytes(t.rows, t.cols, t.dtype, field));
  if (t.data == nullptr) return Invalid(field.Member("data"), "null");
  if (t.capacity < bytes) {
    return Invalid(field.Member("capacity"),
                   absl::StrCat(t.capacity, " bytes is smaller than the ", bytes, " bytes of [",
                                t.rows, ", ", t.cols, "] ", DTypeName(t.dtype)));
  }
  return absl::OkStatus();
}

absl::Status ValidateQuantizeShape(int64_t rows, int64_t cols, const QuantizeOptions& o,
                                   const FieldPath& x) {
  FP4Q_RETURN_IF_ERROR(CheckDims(rows, cols, x));
  const int block = BlockElems(o.format);
  if (cols % block != 0) {
    return InvalidAt(x.Cols(), absl::StrCat(cols, " is not a multiple of the block size ", block));
  }
  if (o.block == BlockShape::k16x16 && rows % 16 != 0) {
    return InvalidAt(x.Rows(), absl::StrCat(rows, " is not a multiple of 16 (16x16 blocks)"));
  }
  if (o.columnwise && rows % block != 0) {
    return InvalidAt(x.Rows(), absl::StrCat(rows, " is not a multiple of the block size ", block,
                                          " (column-wise output)"));
  }
  return absl::OkStatus();
}

absl::Status ValidateQuantizeInput(const ConstTensor& x, const QuantizeOptions& o,
                                   const FieldPath& field) {
  FP4Q_RETURN_IF_ERROR(ValidateConstTensor(x, field));
  return ValidateQuantizeShape(x.rows, x.cols, o, field);
}

absl::Status ValidateErrorFeedback(const QuantizeOptions& o, const FieldPath& residual,
                                   const FieldPath& field) {
  if (!o.rowwise) {
    return Invalid(residual, absl::StrCat("error feedback needs the row-wise output (",
                                                 field.Member("rowwise").str(), " is false)"));
  }
  if (o.columnwise) {
    return Invalid(residual, absl::StrCat("error feedback is row-wise only (",
                                                 field.Member("columnwise").str(), " is true)"));
  }
  if (o.rht != RhtMode::kOff) {
    return Invalid(residual, absl::StrCat("error feedback is not combined with ",
                                                 field.Member("rht").str(), " ", RhtName(o.rht)));
  }
  return absl::OkStatus();
}

absl::Status ValidateQuantizedOutput(const QuantizedTensor& q, int64_t rows, int64_t cols,
                                     const QuantizeOptions& o, const FieldPath& field) {
  if (q.format != o.format) {
    return Invalid(field.Member("format"),
                   absl::StrCat(ValidFormat(q.format) ? FormatName(q.format)
                                                      : std::to_string(static_cast<int>(q.format)),
                                " does not match options.format ", FormatName(o.format)));
  }
  if (q.block != o.block) {
    return Invalid(field.Member("block"),
                   absl::StrCat(ValidBlock(q.block) ? BlockShapeName(q.block)
                                                    : std::to_string(static_cast<int>(q.block)),
                                " does not match options.block ", BlockShapeName(o.block)));
  }
  if (q.scale_layout != o.scale_layout) {
    return Invalid(field.Member("scale_layout"),
                   absl::StrCat(EnumText(LayoutName(q.scale_layout),
                                         static_cast<int>(q.scale_layout)),
                                " does not match options.scale_layout ",
                                LayoutName(o.scale_layout)));
  }
  FP4Q_RETURN_IF_ERROR(CheckSameShape(q.rows, q.cols, field, rows, cols, "the expected"));
  return CheckQuantizedBuffers(q.format, q.scale_layout, q.rows, q.cols, q.codes, q.codes_capacity,
                               q.scales, q.scales_capacity, q.global, field);
}

absl::Status ValidateQuantizedShape(Format format, BlockShape block, ScaleLayout layout,
                                    int64_t rows, int64_t cols, const FieldPath& field) {
  if (!ValidFormat(format)) {
    return Invalid(field.Member("format"),
                   absl::StrCat(static_cast<int>(format), " is not a valid format"));
  }
  FP4Q_RETURN_IF_ERROR(CheckBlockForFormat(format, block, field.Member("block")));
  FP4Q_RETURN_IF_ERROR(CheckEnum(LayoutName(layout), static_cast<int>(layout),
                                 field.Member("scale_layout"), "scale layout"));
  FP4Q_RETURN_IF_ERROR(CheckDims(rows, cols, field));
  const int elems = BlockElems(format);
  if (cols % elems != 0) {
    return InvalidAt(
        field.Cols(),
        absl::StrCat(cols, " is not a multiple of the block size ", elems));
  }
  if (block == BlockShape::k16x16 && rows % 16 != 0) {
    return InvalidAt(field.Rows(), absl::StrCat(rows, " is not a multiple of 16 (16x16 blocks)"));
  }
  return absl::OkStatus();
}

absl::Status ValidateQuantizedInput(const ConstQuantizedTensor& q, const FieldPath& field) {
  FP4Q_RETURN_IF_ERROR(
      ValidateQuantizedShape(q.format, q.block, q.scale_layout, q.rows, q.cols, field));
  return CheckQuantizedBuffers(q.format, q.scale_layout, q.rows, q.cols, q.codes, q.codes_capacity,
                               q.scales, q.scales_capacity, q.global, field);
}

absl::Status ValidateQuantizeArgs(const ConstTensor& x, const QuantizeOptions& o,
                                  const float* residual, const QuantizedTensor* rowwise,
                                  const QuantizedTensor* columnwise) {
  FP4Q_RETURN_IF_ERROR(ValidateQuantizeOptions(o));
  FP4Q_RETURN_IF_ERROR(ValidateQuantizeInput(x, o));
  if (o.rowwise) {
    if (rowwise == nullptr) return Invalid("rowwise", "null but options.rowwise is true");
    FP4Q_RETURN_IF_ERROR(ValidateQuantizedOutput(*rowwise, x.rows, x.cols, o, "rowwise"));
  }
  if (o.columnwise) {
    if (columnwise == nullptr) return Invalid("columnwise", "null but options.columnwise is true");
    FP4Q_RETURN_IF_ERROR(ValidateQuantizedOutput(*columnwise, x.cols, x.rows, o, "columnwise"));
  }
  if (residual != nullptr) FP4Q_RETURN_IF_ERROR(ValidateErrorFeedback(o));
  return absl::OkStatus();
}

absl::Status ValidateQdqOptions(const QuantizeOptions& o, const FieldPath& field) {
  FP4Q_RETURN_IF_ERROR(ValidateQuantizeOptions(o, field));
  if (!o.rowwise) return Invalid(field.Member("rowwise"), "false, but QDQ is row-wise");
  if (o.columnwise) return Invalid(field.Member("columnwise"), "true, but QDQ is row-wise only");
  if (o.rht != RhtMode::kOff) {
    return Invalid(field.Member("rht"), absl::StrCat(RhtName(o.rht), " is not supported by QDQ"));
  }
  return absl::OkStatus();
}

absl::Status ValidateQdqArgs(const ConstTensor& x, const QuantizeOptions& o, const float* residual,
                             const MutTensor& out) {
  (void)residual;  // any residual is x-shaped f32 (see ValidateResidualShape)
  FP4Q_RETURN_IF_ERROR(ValidateQdqOptions(o));
  FP4Q_RETURN_IF_ERROR(ValidateQuantizeInput(x, o));
  FP4Q_RETURN_IF_ERROR(ValidateMutTensor(out, "out"));
  return CheckSameShape(out.rows, out.cols, "out", x.rows, x.cols, "x");
}

absl::Status ValidateMatmulArgs(const ConstQuantizedTensor& a, const ConstQuantizedTensor& b,
                                const MutTensor& c, const FieldPath& a_field,
                                const FieldPath& b_field, const FieldPath& c_field) {
  FP4Q_RETURN_IF_ERROR(ValidateQuantizedInput(a, a_field));
  FP4Q_RETURN_IF_ERROR(ValidateQuantizedInput(b, b_field));
  if (a.format != b.format) {
    return Invalid(b_field.Member("format"),
                   absl::StrCat(FormatName(b.format), " does not match ",
                                a_field.Member("format").str(), " ",
                                FormatName(a.format)));
  }
  if (a.cols != b.cols) {
    return InvalidAt(b_field.Cols(), absl::StrCat(b.cols, " does not match ", a_field.Cols(), " ",
                                                a.cols, " (K)"));
  }
  FP4Q_RETURN_IF_ERROR(ValidateMutTensor(c, c_field));
  if (c.rows != a.rows) {
    return InvalidAt(c_field.Rows(), absl::StrCat(c.rows, " does not match ", a_field.Rows(), " ",
                                                a.rows, " (M)"));
  }
  if (c.cols != b.rows) {
    return InvalidAt(c_field.Cols(), absl::StrCat(c.cols, " does not match ", b_field.Rows(), " ",
                                                b.rows, " (N)"));
  }
  return absl::OkStatus();
}

absl::Status ValidateUpdateWeightArgs(const QuantizedTensor& weight, const ConstTensor& update,
                                      float lr, UpdateKind kind, const QuantizeOptions& o,
                                      const MutTensor* dequantized_out) {
  FP4Q_RETURN_IF_ERROR(ValidateQuantizedInput(AsConst(weight), "weight"));
  if (weight.format != Format::kNvfp4) {
    return Invalid("weight.format",
                   absl::StrCat(FormatName(weight.format), ", but stored weights are NVFP4"));
  }
  FP4Q_RETURN_IF_ERROR(ValidateConstTensor(update, "update"));
  FP4Q_RETURN_IF_ERROR(
      CheckSameShape(update.rows, update.cols, "update", weight.rows, weight.cols, "weight"));
  FP4Q_RETURN_IF_ERROR(
      CheckEnum(UpdateKindName(kind), static_cast<int>(kind), "kind", "update kind"));
  if (kind == UpdateKind::kGradient && !std::isfinite(lr)) {
    return Invalid("lr", absl::StrCat(lr, " is not finite"));
  }
  FP4Q_RETURN_IF_ERROR(ValidateQuantizeOptions(o));
  if (o.format != weight.format) {
    return Invalid("options.format",
                   absl::StrCat(FormatName(o.format), " does not match weight.format ",
                                FormatName(weight.format)));
  }
  if (o.block != weight.block) {
    return Invalid("options.block",
                   absl::StrCat(BlockShapeName(o.block), " does not match weight.block ",
                                BlockShapeName(weight.block)));
  }
  if (o.scale_layout != weight.scale_layout) {
    return Invalid("options.scale_layout",
                   absl::StrCat(LayoutName(o.scale_layout), " does not match weight.scale_layout ",
                                LayoutName(weight.scale_layout)));
  }
  if (!o.rowwise || o.columnwise) {
    return Invalid("options.columnwise",
                   absl::StrCat(o.columnwise ? "true" : "false", " (options.rowwise ",
                                o.rowwise ? "true" : "false",
                                "): a stored weight is quantized row-wise only"));
  }
  if (o.rht != RhtMode::kOff) {
    return Invalid("options.rht",
                   absl::StrCat(RhtName(o.rht), " is not supported by UpdateWeight"));
  }
  if (o.scale_selection != ScaleSelection::kMapTo6) {
    return Invalid("options.scale_selection",
                   absl::StrCat(SelectionName(o.scale_selection),
                                " is not supported by UpdateWeight (map_to_6 only)"));
  }
  if (o.has_amax) {
    return Invalid(
        "options.amax",
        absl::StrCat(o.amax, " given, but UpdateWeight takes the amax of the new value"));
  }
  if (dequantized_out != nullptr) {
    FP4Q_RETURN_IF_ERROR(ValidateMutTensor(*dequantized_out, "dequantized_out"));
    FP4Q_RETURN_IF_ERROR(CheckSameShape(dequantized_out->rows, dequantized_out->cols,
                                        "dequantized_out", weight.rows, weight.cols, "weight"));
  }
  return absl::OkStatus();
}

namespace {

const char* ScalingName(Scaling s) {
  switch (s) {
    case Scaling::kCurrent:
      return "current";
    case Scaling::kDelayed:
      return "delayed";
  }
  return nullptr;
}

const char* OptimizerName(OptimizerKind k) {
  switch (k) {
    case OptimizerKind::kSgd:
      return "sgd";
    case OptimizerKind::kAdamW:
      return "adamw";
  }
  return nullptr;
}

const char* StateDTypeName(StateDType d) {
  switch (d) {
    case StateDType::kF32:
      return "f32";
    case StateDType::kBF16:
      return "bf16";
    case StateDType::kNvfp4:
      return "nvfp4";
  }
  return nullptr;
}

// The kernels read 16 bytes at a time: dense buffers and code bytes start 16-byte aligned.
absl::Status CheckAligned(const void* p, const FieldPath& field) {
  if (p == nullptr || reinterpret_cast<uintptr_t>(p) % 16 == 0) return absl::OkStatus();
  return Invalid(field, absl::StrCat(absl::Hex(reinterpret_cast<uintptr_t>(p), absl::kZeroPad16),
                                     " is not 16-byte aligned"));
}

absl::Status CheckHyper(float value, bool ok, const FieldPath& field, absl::string_view rule) {
  if (std::isfinite(value) && ok) return absl::OkStatus();
  return Invalid(field, absl::StrCat(value, " is not ", rule));
}

// One moment tensor: present (in `dtype`'s representation) exactly when `wanted`.
absl::Status CheckMoment(const MomentTensor& m, bool wanted, StateDType dtype,
                         const QuantizedTensor& weight, const FieldPath& field,
                         absl::string_view why) {
  if (!wanted) {
    if (m.present()) return Invalid(field, absl::StrCat("set, but ", why));
    return absl::OkStatus();
  }
  if (dtype == StateDType::kNvfp4) {
    if (m.dense != nullptr) {
      return Invalid(field.Member("dense"), "set, but the state dtype is nvfp4");
    }
    const QuantizedTensor& q = m.quantized;
    const FieldPath qf = field.Member("quantized");
    FP4Q_RETURN_IF_ERROR(ValidateQuantizedInput(AsConst(q), qf));
    if (q.format != Format::kNvfp4) {
      return Invalid(qf.Member("format"),
                     absl::StrCat(FormatName(q.format), ", but nvfp4 moments are NVFP4"));
    }
    if (q.block != BlockShape::k1x16) {
      return Invalid(qf.Member("block"),
                     absl::StrCat(BlockShapeName(q.block), ", but nvfp4 moments use 1x16 blocks"));
    }
    if (q.scale_layout != ScaleLayout::kPlain) {
      return Invalid(qf.Member("scale_layout"),
                     absl::StrCat(LayoutName(q.scale_layout),
                                  ", but moments use the plain layout"));
    }
    FP4Q_RETURN_IF_ERROR(CheckSameShape(q.rows, q.cols, qf, weight.rows, weight.cols, "weight"));
    return CheckAligned(q.codes, qf.Member("codes"));
  }
  if (m.quantized.codes != nullptr) {
    return Invalid(field.Member("quantized.codes"),
                   absl::StrCat("set, but the state dtype is ", StateDTypeName(dtype)));
  }
  if (m.dense == nullptr) return Invalid(field.Member("dense"), "null");
  return CheckAligned(m.dense, field.Member("dense"));
}

// A one-pass item's new state lies apart from the state it replaces (every next buffer against
// each of the item's own), so that a refused step, which writes only the next state, leaves the
// item's state as it was.
absl::Status CheckNextApart(const StepItem& item, const FieldPath& nf) {
  struct Span {
    const char* name;
    const void* p;
    size_t bytes;
  };
  const QuantizedTensor& w = item.weight;
  const StepNext& n = item.next;
  // The bytes a step reads or writes (one-pass items have 1x16 blocks, plain scales).
  const size_t elems = static_cast<size_t>(w.rows * w.cols), cb = elems / 2, scb = elems / 16;
  const size_t rb = elems * sizeof(float);
  const size_t gb = kGlobalFloats * sizeof(float), sb = kStepStatFloats * sizeof(float);
  const Span own[] = {{"weight.codes", w.codes, cb}, {"weight.scales", w.scales, scb},
                      {"weight.global", w.global, gb}, {"stats", item.stats, sb},
                      {"residual", item.residual, rb}};
  const Span next[] = {{"codes", n.codes, cb}, {"scales", n.scales, scb}, {"global", n.global, gb},
                       {"stats", n.stats, sb}, {"residual", n.residual, rb}};
  const auto at = [](const Span& x) { return reinterpret_cast<uintptr_t>(x.p); };
  for (const Span& x : next) {
    for (const Span& o : own) {
      if (x.p != nullptr && o.p != nullptr && at(x) < at(o) + o.bytes &&
          at(o) < at(x) + x.bytes) {
        return Invalid(nf.Member(x.name), absl::StrCat("overlaps the item's ", o.name,
                                                       ": the next state is written beside it"));
      }
    }
  }
  return absl::OkStatus();
}

// A one-pass item's new state (StepNext): all of it present, aligned like the state it replaces.
absl::Status ValidateStepNext(const StepItem& item, const FieldPath& nf) {
  const StepNext& n = item.next;
  if (!n.present()) {
    if (n.scales != nullptr || n.global != nullptr || n.stats != nullptr || n.residual != nullptr) {
      return Invalid(nf.Member("codes"), "null, but other buffers of the next state are set");
    }
    return absl::OkStatus();
  }
  if (!OnePassItem(item)) {
    return Invalid(nf, "set, but only plain SGD items (no momentum or weight decay, one gradient, "
                       "delayed scaling, 1x16 plain scales, at most one output of the "
                       "gradient's dtype, not check-only) run in one pass");
  }
  if (n.scales == nullptr) return Invalid(nf.Member("scales"), "null");
  if (n.global == nullptr) return Invalid(nf.Member("global"), "null");
  if (n.stats == nullptr) return Invalid(nf.Member("stats"), "null");
  if ((n.residual != nullptr) != (item.residual != nullptr)) {
    return Invalid(nf.Member("residual"),
                   item.residual != nullptr ? "null, but the item keeps a residual"
                                            : "set, but the item keeps no residual");
  }
  FP4Q_RETURN_IF_ERROR(CheckAligned(n.codes, nf.Member("codes")));
  FP4Q_RETURN_IF_ERROR(CheckAligned(n.residual, nf.Member("residual")));
  if (reinterpret_cast<uintptr_t>(n.global) % 4 != 0 ||
      reinterpret_cast<uintptr_t>(n.stats) % 4 != 0) {
    return Invalid(nf.Member(reinterpret_cast<uintptr_t>(n.global) % 4 != 0 ? "global" : "stats"),
                   "not 4-byte aligned");
  }
  return CheckNextApart(item, nf);
}

}  // namespace

absl::Status ValidateStepItem(const StepItem& item, const FieldPath& field) {
  const QuantizedTensor& w = item.weight;
  const FieldPath wf = field.Member("weight");
  FP4Q_RETURN_IF_ERROR(ValidateQuantizedInput(AsConst(w), wf));
  if (w.format != Format::kNvfp4) {
    return Invalid(wf.Member("format"),
                   absl::StrCat(FormatName(w.format), ", but stored weights are NVFP4"));
  }
  FP4Q_RETURN_IF_ERROR(CheckAligned(w.codes, wf.Member("codes")));
  FP4Q_RETURN_IF_ERROR(CheckAligned(item.residual, field.Member("residual")));
  FP4Q_RETURN_IF_ERROR(CheckEnum(ScalingName(item.scaling), static_cast<int>(item.scaling),
                                 field.Member("scaling"), "scaling"));
  FP4Q_RETURN_IF_ERROR(CheckEnum(RoundingName(item.rounding), static_cast<int>(item.rounding),
                                 field.Member("rounding"), "rounding"));
  FP4Q_RETURN_IF_ERROR(CheckEnum(UpdateKindName(item.kind), static_cast<int>(item.kind),
                                 field.Member("kind"), "update kind"));
  if (item.scaling == Scaling::kDelayed && item.stats == nullptr) {
    return Invalid(field.Member("stats"), "null, but delayed scaling reads the statistics");
  }
  if (item.stats != nullptr && reinterpret_cast<uintptr_t>(item.stats) % 4 != 0) {
    return Invalid(field.Member("stats"), "not 4-byte aligned");
  }

  // Optimizer state.
  const OptimizerState& st = item.state;
  const FieldPath sf = field.Member("state");
  FP4Q_RETURN_IF_ERROR(CheckEnum(OptimizerName(st.kind), static_cast<int>(st.kind),
                                 sf.Member("kind"), "optimizer kind"));
  FP4Q_RETURN_IF_ERROR(CheckEnum(StateDTypeName(st.dtype), static_cast<int>(st.dtype),
                                 sf.Member("dtype"), "state dtype"));
  const bool sgd = st.kind == OptimizerKind::kSgd;
  if (sgd && st.amsgrad) return Invalid(sf.Member("amsgrad"), "true, but kind is sgd");
  if (!sgd && st.momentum) return Invalid(sf.Member("momentum"), "true, but kind is adamw");
  FP4Q_RETURN_IF_ERROR(CheckMoment(st.moment1, sgd ? st.momentum : true, st.dtype, w,
                                   sf.Member("moment1"),
                                   "SGD without momentum keeps none"));
  FP4Q_RETURN_IF_ERROR(CheckMoment(st.moment2, !sgd, st.dtype, w, sf.Member("moment2"),
                                   "SGD keeps no second moment"));
  FP4Q_RETURN_IF_ERROR(CheckMoment(st.max_moment2, !sgd && st.amsgrad, st.dtype, w,
                                   sf.Member("max_moment2"),
                                   "only AdamW with amsgrad keeps max v"));

  // Hyperparameters.
  const StepHyper& h = item.hyper;
  const FieldPath hf = field.Member("hyper");
  FP4Q_RETURN_IF_ERROR(CheckHyper(h.lr, h.lr >= 0.0f, hf.Member("lr"), "finite and >= 0"));
  FP4Q_RETURN_IF_ERROR(CheckHyper(h.weight_decay, h.weight_decay >= 0.0f,
                                  hf.Member("weight_decay"), "finite and >= 0"));
  if (h.t < 1) return Invalid(hf.Member("t"), absl::StrCat(h.t, " is not >= 1"));
  if (sgd) {
    FP4Q_RETURN_IF_ERROR(CheckHyper(h.momentum, h.momentum >= 0.0f,
                                    hf.Member("momentum"), "finite and >= 0"));
    FP4Q_RETURN_IF_ERROR(
        CheckHyper(h.dampening, true, hf.Member("dampening"), "finite"));
    if (h.momentum != 0.0f && !st.momentum) {
      return Invalid(hf.Member("momentum"),
                     absl::StrCat(h.momentum, " needs a momentum buffer (", sf.str(),
                                  ".momentum is false)"));
    }
    if (h.nesterov && (h.momentum <= 0.0f || h.dampening != 0.0f)) {
      return Invalid(hf.Member("nesterov"),
                     absl::StrCat("true needs momentum > 0 and dampening 0 (momentum ", h.momentum,
                                  ", dampening ", h.dampening, ")"));
    }
  } else {
    FP4Q_RETURN_IF_ERROR(CheckHyper(h.beta1, h.beta1 >= 0.0f && h.beta1 < 1.0f,
                                    hf.Member("beta1"), "in [0, 1)"));
    FP4Q_RETURN_IF_ERROR(CheckHyper(h.beta2, h.beta2 >= 0.0f && h.beta2 < 1.0f,
                                    hf.Member("beta2"), "in [0, 1)"));
    FP4Q_RETURN_IF_ERROR(
        CheckHyper(h.eps, h.eps > 0.0f, hf.Member("eps"), "finite and > 0"));
  }
  if (item.kind == UpdateKind::kDelta &&
      (!sgd || st.momentum || h.weight_decay != 0.0f)) {
    return Invalid(field.Member("kind"),
                   absl::StrCat("delta needs plain SGD (kind ", OptimizerName(st.kind),
                                ", momentum ", st.momentum ? "true" : "false", ", weight_decay ",
                                h.weight_decay, ")"));
  }

  // Updates and outputs.
  const FieldPath updates = field.Member("updates");
  if (item.updates.empty()) return Invalid(updates, "empty");
  for (size_t k = 0; k < item.updates.size(); ++k) {
    const FieldPath uf = updates.Index(static_cast<int64_t>(k));
    const ConstTensor& u = item.updates[k];
    FP4Q_RETURN_IF_ERROR(ValidateConstTensor(u, uf));
    FP4Q_RETURN_IF_ERROR(CheckSameShape(u.rows, u.cols, uf, w.rows, w.cols, "weight"));
    FP4Q_RETURN_IF_ERROR(CheckAligned(u.data, uf.Member("data")));
  }
  const FieldPath outs = field.Member("dequantized_out");
  for (size_t k = 0; k < item.dequantized_out.size(); ++k) {
    const MutTensor& o = item.dequantized_out[k];
    if (o.data == nullptr) continue;
    const FieldPath of = outs.Index(static_cast<int64_t>(k));
    FP4Q_RETURN_IF_ERROR(ValidateMutTensor(o, of));
    FP4Q_RETURN_IF_ERROR(CheckSameShape(o.rows, o.cols, of, w.rows, w.cols, "weight"));
    FP4Q_RETURN_IF_ERROR(CheckAligned(o.data, of.Member("data")));
  }
  if (item.check_only && item.expect_fingerprints.size() != item.updates.size()) {
    return Invalid(field.Member("expect_fingerprints"),
                   absl::StrCat(item.expect_fingerprints.size(), " fingerprints for ",
                                item.updates.size(), " updates"));
  }
  return ValidateStepNext(item, field.Member("next"));
}

absl::Status ValidateStepItems(const std::vector<StepItem>& items) {
  if (items.empty()) return Invalid("items", "empty");
  if (items.size() > (size_t{1} << 24)) {
    return Invalid("items", absl::StrCat(items.size(), " items exceed the limit of 2^24"));
  }
  size_t updates = 0;
  std::vector<std::pair<const void*, size_t>> written;  // (weight codes, the item writing them)
  written.reserve(items.size());
  const FieldPath root("items");
  for (size_t i = 0; i < items.size(); ++i) {
    FP4Q_RETURN_IF_ERROR(ValidateStepItem(items[i], root.Index(static_cast<int64_t>(i))));
    if (items[i].next.present() != items[0].next.present()) {
      const FieldPath item = root.Index(static_cast<int64_t>(i));
      return Invalid(item.Member("next"),
                     absl::StrCat(items[i].next.present() ? "set" : "not set", ", but items[0]'s ",
                                  items[0].next.present() ? "is" : "is not",
                                  ": a step runs in one pass for every item or none"));
    }
    updates += items[i].updates.size();
    if (!items[i].check_only) written.emplace_back(items[i].weight.codes, i);
  }
  // Two items writing one weight: the first item that repeats an earlier one is named.
  std::sort(written.begin(), written.end());
  size_t first = 0, later = items.size();
  for (size_t k = 1, start = 0; k < written.size(); ++k) {
    if (written[k].first != written[start].first) {
      start = k;  // a new weight; its earliest item comes first
    } else if (written[k].second < later) {
      first = written[start].second;
      later = written[k].second;
    }
  }
  if (later < items.size()) {
    const FieldPath item = root.Index(static_cast<int64_t>(later));
    return Invalid(item.Member("weight"),
                   absl::StrCat("the same stored weight as items[", first, "]"));
  }
  if (updates > (size_t{1} << 30)) {
    return Invalid("items", absl::StrCat(updates, " updates exceed the limit of 2^30"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ValidatedStep> ValidatedStep::Check(const std::vector<StepItem>& items) {
  FP4Q_RETURN_IF_ERROR(ValidateStepItems(items));
  return ValidatedStep(&items);
}

absl::Status ValidateRhtArgs(const ConstTensor& in, RhtMode mode, const MutTensor& out) {
  FP4Q_RETURN_IF_ERROR(CheckEnum(RhtName(mode), static_cast<int>(mode), "mode", "RHT mode"));
  if (mode == RhtMode::kOff) return Invalid("mode", "off is not a transform");
  FP4Q_RETURN_IF_ERROR(ValidateConstTensor(in, "in"));
  if (in.cols % 16 != 0) {
    return Invalid("in.cols", absl::StrCat(in.cols, " is not a multiple of 16"));
  }
  FP4Q_RETURN_IF_ERROR(ValidateMutTensor(out, "out"));
  if (out.dtype != in.dtype) {
    return Invalid("out.dtype", absl::StrCat(DTypeName(out.dtype), " does not match in.dtype ",
                                             DTypeName(in.dtype)));
  }
  return CheckSameShape(out.rows, out.cols, "out", in.rows, in.cols, "in");
}

absl::Status ValidateResidualShape(int64_t residual_rows, int64_t residual_cols,
                                   const ConstTensor& x) {
  return CheckSameShape(residual_rows, residual_cols, "residual", x.rows, x.cols, "x");
}

}  // namespace fp4q::kernels
