// QuantizeFile and the helpers both directions share. DequantizeFile: file_dequantize.cc.
#include "file_convert.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>

#include "absl/strings/str_cat.h"
#include "file_convert_internal.h"
#include "fp4q/client/tensors.h"
#include "fp4q/common/safetensors.h"
#include "fp4q/common/status_macros.h"
#include "progress.h"

namespace fp4q::client::cli {

using common::SafetensorsFile;
using common::SafetensorsWriter;
using common::StDType;
using common::StTensorInfo;

absl::StatusOr<EncodeScale> EncodeScaleFor(float s_dec) {
  if (!std::isfinite(s_dec) || !(s_dec > 0.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("decode scale ", s_dec, " is not finite and positive"));
  }
  const float guess = 1.0f / s_dec;
  EncodeScale best{guess, false};
  float best_err = std::numeric_limits<float>::infinity();
  // Walk outwards from the guess: 1/x is monotone, so a preimage (if any) is within a few ulps.
  float down = guess;
  float up = guess;
  for (int k = 0; k <= 8; ++k) {
    for (float s : {down, up}) {
      if (!std::isfinite(s) || !(s > 0.0f)) continue;
      const float back = 1.0f / s;
      if (back == s_dec) return EncodeScale{s, true};
      const float err = std::fabs(back - s_dec);
      if (err < best_err) {
        best_err = err;
        best.s_enc = s;
      }
    }
    down = std::nextafter(down, 0.0f);
    up = std::nextafter(up, std::numeric_limits<float>::infinity());
  }
  return best;
}

uint64_t RequestBudget(const Client& client, const ConvertOptions& options,
                       const v1::ServerInfoReply& info) {
  uint64_t limit = static_cast<uint64_t>(client.options().max_message_bytes);
  if (info.limits().max_message_bytes() != 0) {
    limit = std::min<uint64_t>(limit, info.limits().max_message_bytes());
  }
  uint64_t budget = limit > kEnvelopeBytes ? limit - kEnvelopeBytes : 1;
  if (options.max_request_bytes != 0) budget = std::min(budget, options.max_request_bytes);
  return budget;
}

std::string FloatBytes(float v) {
  std::string s(4, '\0');
  std::memcpy(s.data(), &v, 4);
  return s;
}

void CopyMetadata(const SafetensorsFile& in, SafetensorsWriter* out) {
  for (const auto& [key, value] : in.metadata()) out->SetMetadata(key, value);
}

namespace {

bool IsFloatInput(StDType d) {
  return d == StDType::kF32 || d == StDType::kBF16 || d == StDType::kF16;
}

// Why a 2-D float tensor is not quantized, or "" when it is.
std::string Ineligible(const StTensorInfo& t, bool block16x16) {
  if (t.shape.size() != 2) return "";  // not 2-D: passed through silently
  if (!IsFloatInput(t.dtype)) {
    if (t.dtype == StDType::kF64 || t.dtype == StDType::kF8E4M3 || t.dtype == StDType::kF8E5M2) {
      return absl::StrCat("dtype ", common::StDTypeName(t.dtype),
                          " is not quantized (F32, BF16 and F16 are)");
    }
    return "";  // integer tensors: passed through silently
  }
  const int64_t rows = t.shape[0], cols = t.shape[1];
  if (rows == 0 || cols == 0) return absl::StrCat("it is empty [", rows, ", ", cols, "]");
  if (cols % 16 != 0) return absl::StrCat("cols ", cols, " is not a multiple of 16");
  if (block16x16 && rows % 16 != 0) {
    return absl::StrCat("rows ", rows, " is not a multiple of 16 (needed by 16x16 blocks)");
  }
  return "";
}

bool Quantizable(const StTensorInfo& t, bool block16x16) {
  return t.shape.size() == 2 && IsFloatInput(t.dtype) && Ineligible(t, block16x16).empty();
}

// The tensor's values as F32 or BF16 bytes for the request (F16 widened to F32).
struct WireInput {
  v1::DType dtype;
  std::string owned;      // set when converted
  absl::string_view data; // the bytes to send
};

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

struct QuantizedOutput {
  std::string codes;
  std::string scales;
  float s_enc = 1.0f;
};

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
    if (!rht) {
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

absl::Status CheckQuantOptions(const v1::QuantOptions& q) {
  if (q.format() != v1::FORMAT_UNSPECIFIED && q.format() != v1::FORMAT_NVFP4) {
    return absl::InvalidArgumentError("quantize files: format must be NVFP4");
  }
  if (q.scale_layout() == v1::SCALE_LAYOUT_SWIZZLED) {
    return absl::InvalidArgumentError("quantize files: scale layout must be plain");
  }
  if (q.outputs() != v1::OUTPUTS_UNSPECIFIED && q.outputs() != v1::OUTPUTS_ROWWISE) {
    return absl::InvalidArgumentError("quantize files: outputs must be row-wise");
  }
  if (q.has_amax()) {
    return absl::InvalidArgumentError("quantize files: amax is computed per tensor");
  }
  if (!q.residual_key().empty()) {
    return absl::InvalidArgumentError("quantize files: no residual key");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ConvertStats> QuantizeFile(const Client& client, const std::string& in_path,
                                          const std::string& out_path,
                                          const v1::QuantOptions& quant,
                                          const ConvertOptions& options) {
  FP4Q_RETURN_IF_ERROR(CheckQuantOptions(quant));
  FP4Q_ASSIGN_OR_RETURN(SafetensorsFile in, SafetensorsFile::ReadFile(in_path));
  const bool block16 = quant.block() == v1::BLOCK_SHAPE_16X16;

  ConvertStats stats;
  std::set<std::string> names;
  for (const StTensorInfo& t : in.tensors()) names.insert(t.name);
  uint64_t total = 0;
  size_t count = 0;
  for (const StTensorInfo& t : in.tensors()) {
    if (!Quantizable(t, block16)) continue;
    for (const char* suffix : {"_scale", "_scale_2"}) {
      if (names.count(t.name + suffix) != 0) {
        return absl::FailedPreconditionError(
            absl::StrCat("cannot quantize \"", t.name, "\": the input already has a tensor \"",
                         t.name, suffix, "\" (already quantized?)"));
      }
    }
    total += t.num_bytes();
    ++count;
  }

  FP4Q_ASSIGN_OR_RETURN(v1::ServerInfoReply info, client.ServerInfo({}, options.call));
  const uint64_t budget = RequestBudget(client, options, info);

  SafetensorsWriter out;
  CopyMetadata(in, &out);
  Progress progress(options.progress, options.progress_terminal, total);
  uint64_t done = 0;
  size_t index = 0;
  for (const StTensorInfo& t : in.tensors()) {
    const absl::string_view raw = in.Data(t);
    if (!Quantizable(t, block16)) {
      const std::string why = Ineligible(t, block16);
      if (!why.empty()) {
        stats.notes.push_back(absl::StrCat("kept \"", t.name, "\" unquantized: ", why));
      }
      FP4Q_RETURN_IF_ERROR(out.Add(t.name, t.dtype, t.shape, raw));
      ++stats.passed_through;
      continue;
    }
    const int64_t rows = t.shape[0], cols = t.shape[1];
    const WireInput wire = ToWire(in, t);
    FP4Q_ASSIGN_OR_RETURN(QuantizedOutput q,
                          QuantizeTensor(client, t.name, wire, rows, cols, quant, budget,
                                         options.call, &stats.requests));
    FP4Q_RETURN_IF_ERROR(out.Add(t.name, StDType::kU8, {rows, cols / 2}, q.codes));
    FP4Q_RETURN_IF_ERROR(
        out.Add(t.name + "_scale", StDType::kF8E4M3, {rows, cols / 16}, q.scales));
    FP4Q_RETURN_IF_ERROR(out.Add(t.name + "_scale_2", StDType::kF32, {1},
                                 FloatBytes(1.0f / q.s_enc)));
    ++stats.converted;
    done += t.num_bytes();
    progress.Update("quantized", ++index, count, t.name, t.num_bytes(), done);
  }
  progress.Finish();
  FP4Q_RETURN_IF_ERROR(out.WriteFile(out_path));
  return stats;
}

}  // namespace fp4q::client::cli
