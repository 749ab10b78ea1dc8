// One tensor of QuantizeFile: its bytes as a request dtype, its amax, and its quantization in
// requests of at most the budget's bytes, checked against the shape asked for.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "file_convert_internal.h"
#include "fp4q/client/tensors.h"
#include "fp4q/common/status_macros.h"

namespace fp4q::client::cli {

using common::SafetensorsFile;
using common::StDType;
using common::StTensorInfo;

namespace {

absl::Status CheckRowwise(const std::string& name, const v1::QuantizedTensor& q, int64_t rows,
                          int64_t cols) {
  const uint64_t codes = static_cast<uint64_t>(rows) * static_cast<uint64_t>(cols) / 2;
  const uint64_t scales = static_cast<uint64_t>(rows) * static_cast<uint64_t>(cols) / 16;
  if (q.shape_size() != 2 || q.shape(0) != rows || q.shape(1) != cols) {
    return absl::InternalError(absl::StrCat("Quantize reply for \"", name, "\": shape ",
                                            ShapeString(std::vector<int64_t>(q.shape().begin(), q.shape().end())),
                                            ", expected [", rows, ", ", cols, "]"));
  }
  if (q.codes().size() != codes || q.scales().size() != scales) {
    return absl::InternalError(absl::StrCat(
        "Quantize reply for \"", name, "\": ", q.codes().size(), " code bytes and ",
        q.scales().size(), " scale bytes inline, expected ", codes, " and ", scales));
  }
  if (q.scale_layout() == v1::SCALE_LAYOUT_SWIZZLED) {
    return absl::InternalError(
        absl::StrCat("Quantize reply for \"", name, "\": swizzled scales, asked for plain"));
  }
  return absl::OkStatus();
}

}  // namespace

WireInput ToWire(const SafetensorsFile& file, const StTensorInfo& t) {
  WireInput w;
  const absl::string_view raw = file.Data(t);
  if (t.dtype == StDType::kF16) {
    const size_t n = raw.size() / 2;
    w.owned.resize(n * 4);
    for (size_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, raw.data() + 2 * i, 2);
      const float f = F16ToF32(h);
      std::memcpy(w.owned.data() + 4 * i, &f, 4);
    }
    w.dtype = v1::DTYPE_F32;
    w.data = w.owned;
  } else {
    w.dtype = t.dtype == StDType::kF32 ? v1::DTYPE_F32 : v1::DTYPE_BF16;
    w.data = raw;
  }
  return w;
}

// max |x| over F32 or BF16 bytes, NaN ignored (NUMERICS G1).
float HostAmax(v1::DType dtype, absl::string_view data) {
  float amax = 0.0f;
  if (dtype == v1::DTYPE_F32) {
    for (size_t i = 0; i + 4 <= data.size(); i += 4) {
      float v;
      std::memcpy(&v, data.data() + i, 4);
      const float a = std::fabs(v);
      if (a > amax) amax = a;  // false for NaN
    }
  } else {
    for (size_t i = 0; i + 2 <= data.size(); i += 2) {
      uint16_t b;
      std::memcpy(&b, data.data() + i, 2);
      const float a = std::fabs(Bf16ToF32(b));
      if (a > amax) amax = a;
    }
  }
  return amax;
}

absl::StatusOr<QuantizedOutput> QuantizeTensor(const Client& client, const std::string& name,
                                               const WireInput& in, int64_t rows, int64_t cols,
                                               const v1::QuantOptions& base, uint64_t budget,
                                               const CallOptions& call, size_t* requests) {
  const uint64_t row_bytes = static_cast<uint64_t>(cols) * DTypeSize(in.dtype);
  const int64_t unit = base.block() == v1::BLOCK_SHAPE_16X16 ? 16 : 1;
  int64_t chunk_rows = rows;
  if (static_cast<uint64_t>(rows) * row_bytes > budget) {
    chunk_rows = static_cast<int64_t>(budget / row_bytes) / unit * unit;
    if (chunk_rows == 0) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "tensor \"", name, "\": ", unit, " row(s) take ", unit * row_bytes,
          " bytes, more than the request budget of ", budget, " bytes"));
    }
  }
  const bool chunked = chunk_rows < rows;
  v1::QuantOptions options = base;
  auto quantize = [&](int64_t r0, int64_t n, const v1::QuantOptions& opts)
      -> absl::StatusOr<v1::QuantizedTensor> {
    v1::QuantizeRequest request;
    FP4Q_ASSIGN_OR_RETURN(
        *request.mutable_input(),
        InlineTensor(in.dtype, {n, cols},
                     in.data.substr(static_cast<size_t>(r0) * row_bytes,
                                    static_cast<size_t>(n) * row_bytes)));
    *request.mutable_options() = opts;
    ++*requests;
    FP4Q_ASSIGN_OR_RETURN(v1::QuantizeReply reply, client.Quantize(request, call));
    if (!reply.has_rowwise()) {
      return absl::InternalError(
          absl::StrCat("Quantize reply for \"", name, "\" has no row-wise output"));
    }
    FP4Q_RETURN_IF_ERROR(CheckRowwise(name, reply.rowwise(), n, cols));
    return std::move(*reply.mutable_rowwise());
  };

  if (chunked) {
    const std::string why = absl::StrCat("tensor \"", name, "\" (", rows * row_bytes,
                                         " bytes) exceeds the request budget of ", budget,
                                         " bytes and must be sent in chunks, but ");
    if (base.rounding() == v1::ROUNDING_STOCHASTIC) {
      return absl::FailedPreconditionError(absl::StrCat(
          why, "stochastic rounding cannot be chunked (its random bits depend on each "
          "element's index in the whole tensor); raise the server's --max_message_bytes and "
          "the client's --max-message-bytes"));
    }
    float amax = 0.0f;
    const bool rht = base.rht() == v1::RHT_MODE_DEFAULT_SIGNS || base.rht() == v1::RHT_MODE_SEEDED;
    if (base.has_amax()) {
      amax = base.amax();  // a shared-scale group's amax
    } else if (!rht) {
      amax = HostAmax(in.dtype, in.data);
    } else {
      // First pass: the amax of each transformed chunk, as the server computes it.
      for (int64_t r0 = 0; r0 < rows; r0 += chunk_rows) {
        const int64_t n = std::min(chunk_rows, rows - r0);
        FP4Q_ASSIGN_OR_RETURN(v1::QuantizedTensor q, quantize(r0, n, base));
        amax = std::max(amax, q.global_amax());
      }
    }
    if (!std::isfinite(amax)) {
      return absl::FailedPreconditionError(absl::StrCat(
          why, "its global amax is ", amax,
          " and a chunk can only be given a finite amax; raise the message limits"));
    }
    options.set_amax(amax);
  }

  QuantizedOutput out;
  out.codes.reserve(static_cast<size_t>(rows) * static_cast<size_t>(cols) / 2);
  out.scales.reserve(static_cast<size_t>(rows) * static_cast<size_t>(cols) / 16);
  bool first = true;
  for (int64_t r0 = 0; r0 < rows; r0 += chunk_rows) {
    const int64_t n = std::min(chunk_rows, rows - r0);
    FP4Q_ASSIGN_OR_RETURN(v1::QuantizedTensor q, quantize(r0, n, options));
    const float s_enc = q.s_enc();
    if (first) {
      if (!std::isfinite(s_enc) || !(s_enc > 0.0f)) {
        return absl::InternalError(absl::StrCat("Quantize reply for \"", name, "\": s_enc ",
                                                s_enc, " is not finite and positive"));
      }
      out.s_enc = s_enc;
      first = false;
    } else if (std::memcmp(&out.s_enc, &s_enc, 4) != 0) {
      return absl::InternalError(absl::StrCat("tensor \"", name, "\": chunk at row ", r0,
                                              " got s_enc ", q.s_enc(), ", the first got ",
                                              out.s_enc, " with the same amax"));
    }
    out.codes += q.codes();
    out.scales += q.scales();
  }
  return out;
}
}  // namespace fp4q::client::cli
