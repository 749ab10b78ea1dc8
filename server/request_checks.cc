#include "server/request_checks.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "fp4q/common/status_macros.h"
#include "fp4q/kernels/validate.h"

namespace fp4q::server {

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

std::string Quote(absl::string_view name) { return absl::StrCat("'", name, "'"); }

const char* DTypeFieldName(kernels::DType dtype) {
  return dtype == kernels::DType::kBF16 ? "DTYPE_BF16" : "DTYPE_F32";
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

absl::Status CheckShape2D(const std::vector<int64_t>& shape, const FieldPath& field) {
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
  d.dtype = t.dtype;
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
                         DTypeFieldName(t.dtype), " ", ShapeString(t.shape), " needs ", d.bytes));
      }
      break;
    case Source::kRegion:
      break;
  }
  return d;
}

absl::Status CheckErrorFeedbackOutputs(const QuantOptionsIn& in, absl::string_view field) {
  const kernels::QuantizeOptions& o = in.quant;
  if (in.residual_key.empty() || !o.columnwise) return absl::OkStatus();
  // Named here: the kernels call it columnwise, the proto outputs.
  return absl::InvalidArgumentError(absl::StrCat(
      field, ".outputs: ", o.rowwise ? "OUTPUTS_BOTH" : "OUTPUTS_COLUMNWISE",
      ", but error feedback (", field, ".residual_key) is row-wise only; use OUTPUTS_ROWWISE"));
}

absl::Status CheckQuantOptions(const QuantOptionsIn& in, absl::string_view field) {
  const kernels::QuantizeOptions& o = in.quant;
  const std::string options(field);
  FP4Q_RETURN_IF_ERROR(CheckErrorFeedbackOutputs(in, field));
  FP4Q_RETURN_IF_ERROR(kernels::ValidateQuantizeOptions(o, options));
  if (in.residual_key.empty()) return absl::OkStatus();
  const FieldPath root(options);
  return kernels::ValidateErrorFeedback(o, root.Member("residual_key"), options);
}

absl::StatusOr<kernels::QuantizedTensor> QuantizedOutput(const kernels::QuantizeOptions& o,
                                                         int64_t rows, int64_t cols,
                                                         absl::string_view field) {
  kernels::QuantizedTensor q;
  q.format = o.format;
  q.block = o.block;
  q.scale_layout = o.scale_layout;
  q.rows = rows;
  q.cols = cols;
  FP4Q_ASSIGN_OR_RETURN(q.codes_capacity, kernels::CodeBytes(rows, cols, field));
  FP4Q_ASSIGN_OR_RETURN(q.scales_capacity,
                        kernels::ScaleBytes(rows, cols, o.format, o.scale_layout, field));
  return q;
}

}  // namespace fp4q::server
