// Argument validation shared by every backend; see validate.h. Messages name the field and the
// offending value ("x.cols: 40 is not a multiple of the block size 16").
#include "fp4q/kernels/validate.h"

#include <cmath>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "fp4q/common/status_macros.h"

namespace fp4q::kernels {
namespace {

absl::Status Invalid(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
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
absl::Status CheckEnum(const char* name, int value, absl::string_view field,
                       absl::string_view what) {
  if (name != nullptr) return absl::OkStatus();
  return Invalid(field, absl::StrCat(value, " is not a valid ", what));
}

absl::Status CheckBlockForFormat(Format format, BlockShape block, absl::string_view field) {
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

absl::Status CheckSameShape(int64_t rows, int64_t cols, absl::string_view field, int64_t want_rows,
                            int64_t want_cols, absl::string_view want_field) {
  if (rows != want_rows) {
    return Invalid(absl::StrCat(field, ".rows"),
                   absl::StrCat(rows, " does not match ", want_field, " ", want_rows));
  }
  if (cols != want_cols) {
    return Invalid(absl::StrCat(field, ".cols"),
                   absl::StrCat(cols, " does not match ", want_field, " ", want_cols));
  }
  return absl::OkStatus();
}

absl::Status CheckCapacity(const void* ptr, size_t capacity, size_t needed,
                           const std::string& field, absl::string_view buffer) {
  if (ptr == nullptr) return Invalid(absl::StrCat(field, ".", buffer), "null");
  if (capacity < needed) {
    return Invalid(absl::StrCat(field, ".", buffer, "_capacity"),
                   absl::StrCat(capacity, " bytes is smaller than the ", needed, " needed"));
  }
  return absl::OkStatus();
}

// Codes, scales and global record of a quantized tensor with known-valid enums.
absl::Status CheckQuantizedBuffers(Format format, ScaleLayout layout, int64_t rows, int64_t cols,
                                   const void* codes, size_t codes_capacity, const void* scales,
                                   size_t scales_capacity, const void* global,
                                   const std::string& field) {
  FP4Q_ASSIGN_OR_RETURN(size_t code_bytes, CodeBytes(rows, cols, field));
  FP4Q_ASSIGN_OR_RETURN(size_t scale_bytes, ScaleBytes(rows, cols, format, layout, field));
  FP4Q_RETURN_IF_ERROR(CheckCapacity(codes, codes_capacity, code_bytes, field, "codes"));
  FP4Q_RETURN_IF_ERROR(CheckCapacity(scales, scales_capacity, scale_bytes, field, "scales"));
  if (global == nullptr) return Invalid(absl::StrCat(field, ".global"), "null");
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateQuantizeOptions(const QuantizeOptions& o) {
  if (!ValidFormat(o.format)) {
    return Invalid("options.format",
                   absl::StrCat(static_cast<int>(o.format), " is not a valid format"));
  }
  FP4Q_RETURN_IF_ERROR(CheckBlockForFormat(o.format, o.block, "options.block"));
  FP4Q_RETURN_IF_ERROR(CheckEnum(RoundingName(o.rounding), static_cast<int>(o.rounding),
                                 "options.rounding", "rounding"));
  FP4Q_RETURN_IF_ERROR(
      CheckEnum(RhtName(o.rht), static_cast<int>(o.rht), "options.rht", "RHT mode"));
  FP4Q_RETURN_IF_ERROR(CheckEnum(SelectionName(o.scale_selection),
                                 static_cast<int>(o.scale_selection), "options.scale_selection",
                                 "scale selection"));
  FP4Q_RETURN_IF_ERROR(CheckEnum(LayoutName(o.scale_layout), static_cast<int>(o.scale_layout),
                                 "options.scale_layout", "scale layout"));
  FP4Q_RETURN_IF_ERROR(CheckEnum(MxRuleName(o.mx_rule), static_cast<int>(o.mx_rule),
                                 "options.mx_rule", "MX scale rule"));
  if (!o.rowwise && !o.columnwise) {
    return Invalid("options.rowwise", "false and options.columnwise false: no output requested");
  }
  if (o.has_amax) {
    if (o.format == Format::kMxfp4) {
      return Invalid("options.amax", absl::StrCat(o.amax, " given, but MXFP4 has no global scale"));
    }
    if (!std::isfinite(o.amax) || o.amax < 0.0f) {
      return Invalid("options.amax", absl::StrCat(o.amax, " is not finite and >= 0"));
    }
  }
  if (o.scale_selection != ScaleSelection::kMapTo6) {
    const std::string mode = SelectionName(o.scale_selection);
    if (o.format != Format::kNvfp4) {
      return Invalid("options.scale_selection",
                     absl::StrCat(mode, " is NVFP4 only (format ", FormatName(o.format), ")"));
    }
    if (o.rounding != Rounding::kNearest) {
      return Invalid(
          "options.scale_selection",
          absl::StrCat(mode, " needs options.rounding nearest, not ", RoundingName(o.rounding)));
    }
    if (o.rht != RhtMode::kOff) {
      return Invalid("options.scale_selection",
                     absl::StrCat(mode, " is not combined with options.rht ", RhtName(o.rht)));
    }
    if (o.four_over_six_emax != 256.0f && o.four_over_six_emax != 448.0f) {
      return Invalid("options.four_over_six_emax",
                     absl::StrCat(o.four_over_six_emax, " is not 256 or 448"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateConstTensor(const ConstTensor& t, const std::string& field) {
  if (!ValidDType(t.dtype)) {
    return Invalid(absl::StrCat(field, ".dtype"),
                   absl::StrCat(static_cast<int>(t.dtype), " is not a valid dtype"));
  }
  FP4Q_RETURN_IF_ERROR(DenseBytes(t.rows, t.cols, t.dtype, field).status());
  if (t.data == nullptr) return Invalid(absl::StrCat(field, ".data"), "null");
  return absl::OkStatus();
}

absl::Status ValidateMutTensor(const MutTensor& t, const std::string& field) {
  if (!ValidDType(t.dtype)) {
    return Invalid(absl::StrCat(field, ".dtype"),
                   absl::StrCat(static_cast<int>(t.dtype), " is not a valid dtype"));
  }
  FP4Q_ASSIGN_OR_RETURN(size_t bytes, DenseBytes(t.rows, t.cols, t.dtype, field));
  if (t.data == nullptr) return Invalid(absl::StrCat(field, ".data"), "null");
  if (t.capacity < bytes) {
    return Invalid(absl::StrCat(field, ".capacity"),
                   absl::StrCat(t.capacity, " bytes is smaller than the ", bytes, " bytes of [",
                                t.rows, ", ", t.cols, "] ", DTypeName(t.dtype)));
  }
  return absl::OkStatus();
}

absl::Status ValidateQuantizeInput(const ConstTensor& x, const QuantizeOptions& o) {
  FP4Q_RETURN_IF_ERROR(ValidateConstTensor(x, "x"));
  const int block = BlockElems(o.format);
  if (x.cols % block != 0) {
    return Invalid("x.cols", absl::StrCat(x.cols, " is not a multiple of the block size ", block));
  }
  if (o.block == BlockShape::k16x16 && x.rows % 16 != 0) {
    return Invalid("x.rows", absl::StrCat(x.rows, " is not a multiple of 16 (16x16 blocks)"));
  }
  if (o.columnwise && x.rows % block != 0) {
    return Invalid("x.rows", absl::StrCat(x.rows, " is not a multiple of the block size ", block,
                                          " (column-wise output)"));
  }
  return absl::OkStatus();
}

absl::Status ValidateQuantizedOutput(const QuantizedTensor& q, int64_t rows, int64_t cols,
                                     const QuantizeOptions& o, const std::string& field) {
  if (q.format != o.format) {
    return Invalid(absl::StrCat(field, ".format"),
                   absl::StrCat(ValidFormat(q.format) ? FormatName(q.format)
                                                      : std::to_string(static_cast<int>(q.format)),
                                " does not match options.format ", FormatName(o.format)));
  }
  if (q.block != o.block) {
    return Invalid(absl::StrCat(field, ".block"),
                   absl::StrCat(ValidBlock(q.block) ? BlockShapeName(q.block)
                                                    : std::to_string(static_cast<int>(q.block)),
                                " does not match options.block ", BlockShapeName(o.block)));
  }
  if (q.scale_layout != o.scale_layout) {
    return Invalid(
        absl::StrCat(field, ".scale_layout"),
        absl::StrCat(ValidLayout(q.scale_layout) ? LayoutName(q.scale_layout)
                                                 : std::to_string(static_cast<int>(q.scale_layout)),
                     " does not match options.scale_layout ", LayoutName(o.scale_layout)));
  }
  FP4Q_RETURN_IF_ERROR(CheckSameShape(q.rows, q.cols, field, rows, cols, "the expected"));
  return CheckQuantizedBuffers(q.format, q.scale_layout, q.rows, q.cols, q.codes, q.codes_capacity,
                               q.scales, q.scales_capacity, q.global, field);
}

absl::Status ValidateQuantizedInput(const ConstQuantizedTensor& q, const std::string& field) {
  if (!ValidFormat(q.format)) {
    return Invalid(absl::StrCat(field, ".format"),
                   absl::StrCat(static_cast<int>(q.format), " is not a valid format"));
  }
  FP4Q_RETURN_IF_ERROR(CheckBlockForFormat(q.format, q.block, absl::StrCat(field, ".block")));
  FP4Q_RETURN_IF_ERROR(CheckEnum(LayoutName(q.scale_layout), static_cast<int>(q.scale_layout),
                                 absl::StrCat(field, ".scale_layout"), "scale layout"));
  FP4Q_RETURN_IF_ERROR(CodeBytes(q.rows, q.cols, field).status());  // dims >= 1
  const int block = BlockElems(q.format);
  if (q.cols % block != 0) {
    return Invalid(absl::StrCat(field, ".cols"),
                   absl::StrCat(q.cols, " is not a multiple of the block size ", block));
  }
  if (q.block == BlockShape::k16x16 && q.rows % 16 != 0) {
    return Invalid(absl::StrCat(field, ".rows"),
                   absl::StrCat(q.rows, " is not a multiple of 16 (16x16 blocks)"));
  }
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
  if (residual != nullptr) {
    if (!o.rowwise) {
      return Invalid("residual",
                     "error feedback needs the row-wise output (options.rowwise is false)");
    }
    if (o.columnwise) {
      return Invalid("residual", "error feedback is row-wise only (options.columnwise is true)");
    }
    if (o.rht != RhtMode::kOff) {
      return Invalid("residual", absl::StrCat("error feedback is not combined with options.rht ",
                                              RhtName(o.rht)));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateQdqArgs(const ConstTensor& x, const QuantizeOptions& o, const float* residual,
                             const MutTensor& out) {
  (void)residual;  // any residual is x-shaped f32 (see ValidateResidualShape)
  FP4Q_RETURN_IF_ERROR(ValidateQuantizeOptions(o));
  if (!o.rowwise) return Invalid("options.rowwise", "false, but QDQ is row-wise");
  if (o.columnwise) return Invalid("options.columnwise", "true, but QDQ is row-wise only");
  if (o.rht != RhtMode::kOff) {
    return Invalid("options.rht", absl::StrCat(RhtName(o.rht), " is not supported by QDQ"));
  }
  FP4Q_RETURN_IF_ERROR(ValidateQuantizeInput(x, o));
  FP4Q_RETURN_IF_ERROR(ValidateMutTensor(out, "out"));
  return CheckSameShape(out.rows, out.cols, "out", x.rows, x.cols, "x");
}

absl::Status ValidateMatmulArgs(const ConstQuantizedTensor& a, const ConstQuantizedTensor& b,
                                const MutTensor& c) {
  FP4Q_RETURN_IF_ERROR(ValidateQuantizedInput(a, "a"));
  FP4Q_RETURN_IF_ERROR(ValidateQuantizedInput(b, "b"));
  if (a.format != b.format) {
    return Invalid("b.format", absl::StrCat(FormatName(b.format), " does not match a.format ",
                                            FormatName(a.format)));
  }
  if (a.cols != b.cols) {
    return Invalid("b.cols", absl::StrCat(b.cols, " does not match a.cols ", a.cols, " (K)"));
  }
  FP4Q_RETURN_IF_ERROR(ValidateMutTensor(c, "c"));
  if (c.rows != a.rows) {
    return Invalid("c.rows", absl::StrCat(c.rows, " does not match a.rows ", a.rows, " (M)"));
  }
  if (c.cols != b.rows) {
    return Invalid("c.cols", absl::StrCat(c.cols, " does not match b.rows ", b.rows, " (N)"));
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
