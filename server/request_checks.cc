#include "server/request_checks.h"

#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "fp4q/common/status_macros.h"
#include "fp4q/kernels/validate.h"

namespace fp4q::server {
namespace {

absl::Status Unknown(absl::string_view field, absl::string_view name, int v) {
  return absl::InvalidArgumentError(absl::StrCat(field, ".", name, ": unknown value ", v));
}

}  // namespace

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

std::string Quote(absl::string_view name) { return absl::StrCat("'", name, "'"); }

const uint8_t* ShapeProbe() {
  alignas(16) static const uint8_t probe[16] = {};
  return probe;
}

std::string WireDTypeName(int dtype) {
  switch (dtype) {
    case kWireDTypeUnspecified:
      return "DTYPE_UNSPECIFIED";
    case kWireF32:
      return "DTYPE_F32";
    case kWireBF16:
      return "DTYPE_BF16";
    case kWireU8:
      return "DTYPE_U8";
    case kWireF8E4M3:
      return "DTYPE_F8_E4M3";
    case kWireF8E8M0:
      return "DTYPE_F8_E8M0";
    default:
      return absl::StrCat("unknown value ", dtype);
  }
}

absl::Status CheckName(absl::string_view name, const FieldPath& field) {
  if (name.empty()) return absl::InvalidArgumentError(absl::StrCat(field.str(), ": empty"));
  if (name.size() > kMaxNameBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(field.str(), ": ", name.size(), " bytes, at most ", kMaxNameBytes));
  }
  for (size_t i = 0; i < name.size(); ++i) {
    const unsigned char c = name[i];
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-' || c == '/' || c == ':';
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat(field.str(), ": byte ", i, " (0x", absl::Hex(c, absl::kZeroPad2),
                       ") is not allowed; names use A-Z a-z 0-9 . _ - / :"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckNamespace(absl::string_view ns, const FieldPath& field) {
  if (ns.empty()) return absl::OkStatus();
  if (ns.size() > kMaxNamespaceBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(field.str(), ": ", ns.size(), " bytes, at most ", kMaxNamespaceBytes));
  }
  return CheckName(ns, field);
}

std::string QualifiedName(absl::string_view ns, absl::string_view name) {
  if (ns.empty()) return std::string(name);
  return absl::StrCat(ns, std::string(1, kNamespaceSeparator), name);
}

absl::string_view NamespaceOf(absl::string_view key) {
  const size_t bar = key.find(kNamespaceSeparator);
  return bar == absl::string_view::npos ? absl::string_view() : key.substr(0, bar);
}

absl::string_view LocalName(absl::string_view key) {
  const size_t bar = key.find(kNamespaceSeparator);
  return bar == absl::string_view::npos ? key : key.substr(bar + 1);
}

absl::StatusOr<kernels::DType> DenseDType(int dtype, const FieldPath& field,
                                          bool allow_unspecified, kernels::DType dflt) {
  switch (dtype) {
    case kWireF32:
      return kernels::DType::kF32;
    case kWireBF16:
      return kernels::DType::kBF16;
    case kWireDTypeUnspecified:
      if (allow_unspecified) return dflt;
      break;
    default:
      break;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(field.str(), ": ", WireDTypeName(dtype), "; expected DTYPE_F32 or DTYPE_BF16"));
}

int ToWireDType(kernels::DType dtype) {
  return dtype == kernels::DType::kBF16 ? kWireBF16 : kWireF32;
}

absl::Status CheckShape2D(const std::vector<int64_t>& shape,
                          const FieldPath& field) {
  if (shape.size() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(field.str(), ": ", ShapeString(shape), " has rank ",
                     shape.size(), "; expected [rows, cols]"));
  }
  for (int i = 0; i < 2; ++i) {
    if (shape[i] < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(field.str(), "[", i, "]: ", shape[i], " must be >= 1"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<DenseShape> CheckDenseTensor(const TensorIn& t, const FieldPath& field) {
  DenseShape d;
  FP4Q_ASSIGN_OR_RETURN(d.dtype, DenseDType(t.dtype, field.Member("dtype")));
  FP4Q_RETURN_IF_ERROR(CheckShape2D(t.shape, field.Member("shape")));
  d.rows = t.shape[0];
  d.cols = t.shape[1];
  FP4Q_ASSIGN_OR_RETURN(
      d.bytes, kernels::DenseBytes(d.rows, d.cols, d.dtype, field.Member("shape")));
  switch (t.data.source) {
    case Source::kNone:
      return absl::InvalidArgumentError(
          absl::StrCat(field.str(), ": no data (set inline_data or region)"));
    case Source::kInline:
      if (t.data.inline_data.size() != d.bytes) {
        return absl::InvalidArgumentError(
            absl::StrCat(field.str(), ".inline_data: ", t.data.inline_data.size(), " bytes; ",
                         WireDTypeName(t.dtype), " ", ShapeString(t.shape), " needs ", d.bytes));
      }
      break;
    case Source::kRegion:
      break;
  }
  return d;
}

absl::StatusOr<kernels::Format> ToFormat(int v, absl::string_view field) {
  switch (v) {
    case 0:
    case 1:
      return kernels::Format::kNvfp4;
    case 2:
      return kernels::Format::kMxfp4;
    default:
      return Unknown(field, "format", v);
  }
}

absl::StatusOr<kernels::BlockShape> ToBlock(int v, kernels::Format format,
                                            absl::string_view field) {
  switch (v) {
    case 0:
      return format == kernels::Format::kMxfp4 ? kernels::BlockShape::k1x32
                                               : kernels::BlockShape::k1x16;
    case 1:
      return kernels::BlockShape::k1x16;
    case 2:
      return kernels::BlockShape::k16x16;
    case 3:
      return kernels::BlockShape::k1x32;
    default:
      return Unknown(field, "block", v);
  }
}

absl::StatusOr<kernels::ScaleLayout> ToLayout(int v, absl::string_view field) {
  switch (v) {
    case 0:
    case 1:
      return kernels::ScaleLayout::kPlain;
    case 2:
      return kernels::ScaleLayout::kSwizzled;
    default:
      return Unknown(field, "scale_layout", v);
  }
}

int ToWireFormat(kernels::Format f) { return f == kernels::Format::kMxfp4 ? 2 : 1; }
int ToWireBlock(kernels::BlockShape b) {
  switch (b) {
    case kernels::BlockShape::k1x16:
      return 1;
    case kernels::BlockShape::k16x16:
      return 2;
    case kernels::BlockShape::k1x32:
      return 3;
  }
  return 0;
}
int ToWireLayout(kernels::ScaleLayout l) { return l == kernels::ScaleLayout::kSwizzled ? 2 : 1; }

absl::StatusOr<kernels::QuantizeOptions> ToQuantizeOptions(const QuantOptionsIn& in,
                                                           absl::string_view field) {
  kernels::QuantizeOptions o;
  FP4Q_ASSIGN_OR_RETURN(o.format, ToFormat(in.format, field));
  FP4Q_ASSIGN_OR_RETURN(o.block, ToBlock(in.block, o.format, field));
  switch (in.rounding) {
    case 0:
    case 1:
      o.rounding = kernels::Rounding::kNearest;
      break;
    case 2:
      o.rounding = kernels::Rounding::kStochastic;
      break;
    default:
      return Unknown(field, "rounding", in.rounding);
  }
  o.seed = in.seed;
  o.step = in.step;
  switch (in.rht) {
    case 0:
    case 1:
      o.rht = kernels::RhtMode::kOff;
      break;
    case 2:
      o.rht = kernels::RhtMode::kDefaultSigns;
      break;
    case 3:
      o.rht = kernels::RhtMode::kSeeded;
      break;
    default:
      return Unknown(field, "rht", in.rht);
  }
  o.rht_seed = in.rht_seed;
  switch (in.scale_selection) {
    case 0:
    case 1:
      o.scale_selection = kernels::ScaleSelection::kMapTo6;
      break;
    case 2:
      o.scale_selection = kernels::ScaleSelection::kFourOverSixMae;
      break;
    case 3:
      o.scale_selection = kernels::ScaleSelection::kFourOverSixMse;
      break;
    default:
      return Unknown(field, "scale_selection", in.scale_selection);
  }
  o.four_over_six_emax = in.four_over_six_emax == 0.0f ? 256.0f : in.four_over_six_emax;
  o.has_amax = in.has_amax;
  o.amax = in.amax;
  FP4Q_ASSIGN_OR_RETURN(o.scale_layout, ToLayout(in.scale_layout, field));
  switch (in.mx_scale_rule) {
    case 0:
    case 1:
      o.mx_rule = kernels::MxScaleRule::kRceil;
      break;
    case 2:
      o.mx_rule = kernels::MxScaleRule::kFloor;
      break;
    default:
      return Unknown(field, "mx_scale_rule", in.mx_scale_rule);
  }
  switch (in.outputs) {
    case 0:
    case 1:
      o.rowwise = true;
      o.columnwise = false;
      break;
    case 2:
      o.rowwise = false;
      o.columnwise = true;
      break;
    case 3:
      o.rowwise = true;
      o.columnwise = true;
      break;
    default:
      return Unknown(field, "outputs", in.outputs);
  }
  if (!in.residual_key.empty() && o.columnwise) {  // named here: the kernels call it columnwise
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".outputs: ", o.rowwise ? "OUTPUTS_BOTH" : "OUTPUTS_COLUMNWISE",
        ", but error feedback (", field, ".residual_key) is row-wise only; use OUTPUTS_ROWWISE"));
  }
  absl::Status s = kernels::ValidateQuantizeOptions(o);
  if (!s.ok()) {
    s = RenameField(s, "options.mx_rule", absl::StrCat(field, ".mx_scale_rule"));
    s = RenameField(s, "options.rowwise", absl::StrCat(field, ".outputs"));
    s = RenameField(s, "options.columnwise", absl::StrCat(field, ".outputs"));
    s = RenameField(s, "options.has_amax", absl::StrCat(field, ".amax"));
    s = RenameField(s, "options", field);
    return s;
  }
  return o;
}

absl::Status RenameField(const absl::Status& status, absl::string_view from, absl::string_view to) {
  if (status.code() != absl::StatusCode::kInvalidArgument || from.empty()) return status;
  const absl::string_view msg = status.message();
  auto ident = [](char c) { return absl::ascii_isalnum(c) || c == '_'; };
  // `from` as a path at `i`: at the start followed by '.', ':', '[' or ' '; later (a path the
  // message quotes, "does not match a.cols 32") after a non-path byte and followed by '.' or '['.
  auto at = [&](size_t i) {
    if (!absl::StartsWith(msg.substr(i), from) || i + from.size() >= msg.size()) return false;
    const char next = msg[i + from.size()];
    if (i == 0) return next == '.' || next == ':' || next == '[' || next == ' ';
    const char prev = msg[i - 1];
    return !ident(prev) && prev != '.' && (next == '.' || next == '[');
  };
  std::string out;
  size_t copied = 0;
  for (size_t i = 0; i < msg.size(); ++i) {
    if (!at(i)) continue;
    absl::StrAppend(&out, msg.substr(copied, i - copied), to);
    size_t end = i + from.size();
    // A tensor's dimensions are its shape's entries; a stored weight (`to` its weight_name)
    // has no shape field in the request: its rows and columns are the weight's.
    const bool stored = absl::EndsWith(to, ".weight_name");
    for (auto [dim, index] :
         {std::pair<absl::string_view, absl::string_view>{".rows", stored ? " (the weight's rows)" : ".shape[0]"},
          {".cols", stored ? " (the weight's columns)" : ".shape[1]"}}) {
      const absl::string_view rest = msg.substr(end);
      if (absl::StartsWith(rest, dim) && (rest.size() == dim.size() || !ident(rest[dim.size()]))) {
        absl::StrAppend(&out, index);
        end += dim.size();
        break;
      }
    }
    copied = end;
    i = end - 1;
  }
  if (copied == 0) return status;
  absl::StrAppend(&out, msg.substr(copied));
  return absl::InvalidArgumentError(out);
}


}  // namespace fp4q::server
