// DequantizeFile: T / T_scale / T_scale_2 triples back to dense F32 or BF16 tensors.
#include <algorithm>
#include <cstring>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "file_convert.h"
#include "file_convert_internal.h"
#include "file_select.h"
#include "fp4q/client/tensors.h"
#include "fp4q/common/safetensors.h"
#include "fp4q/common/status_macros.h"
#include "progress.h"

namespace fp4q::client::cli {
namespace {

using common::SafetensorsFile;
using common::SafetensorsWriter;
using common::StDType;
using common::StTensorInfo;

struct Triple {
  const StTensorInfo* codes = nullptr;
  const StTensorInfo* scales = nullptr;
  const StTensorInfo* scale_2 = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  float s_dec = 1.0f;
};

// The triple rooted at `t`, or nullopt-like (codes == nullptr) when t is not the codes of one;
// INVALID_ARGUMENT when the names match but the parts disagree.
absl::StatusOr<Triple> FindTriple(const SafetensorsFile& file,
                                  const std::map<std::string, const StTensorInfo*>& by_name,
                                  const StTensorInfo& t) {
  Triple tr;
  if (t.dtype != StDType::kU8 || t.shape.size() != 2) return tr;
  auto s1 = by_name.find(t.name + "_scale");
  auto s2 = by_name.find(t.name + "_scale_2");
  if (s1 == by_name.end() || s2 == by_name.end()) return tr;
  const StTensorInfo& sc = *s1->second;
  const StTensorInfo& g = *s2->second;
  const int64_t rows = t.shape[0];
  const int64_t cols = t.shape[1] * 2;
  const std::string who = absl::StrCat("quantized tensor \"", t.name, "\" [", rows, ", ",
                                       t.shape[1], "] codes: ");
  if (cols % 16 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, "cols ", cols, " (2 x ", t.shape[1], ") is not a multiple of 16"));
  }
  if (sc.dtype != StDType::kF8E4M3 && sc.dtype != StDType::kU8) {
    return absl::InvalidArgumentError(absl::StrCat(who, "\"", sc.name, "\" has dtype ",
                                                   common::StDTypeName(sc.dtype),
                                                   ", expected F8_E4M3"));
  }
  if (sc.shape.size() != 2 || sc.shape[0] != rows || sc.shape[1] != cols / 16) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, "\"", sc.name, "\" has shape ", ShapeString(sc.shape),
                     ", expected [", rows, ", ", cols / 16, "]"));
  }
  if (g.dtype != StDType::kF32 || g.num_elements() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, "\"", g.name, "\" has dtype ", common::StDTypeName(g.dtype), " shape ",
        ShapeString(g.shape), ", expected one F32 value"));
  }
  std::memcpy(&tr.s_dec, file.Data(g).data(), 4);
  tr.codes = &t;
  tr.scales = &sc;
  tr.scale_2 = &g;
  tr.rows = rows;
  tr.cols = cols;
  return tr;
}

absl::StatusOr<std::string> DequantizeTriple(const Client& client, const SafetensorsFile& file,
                                             const Triple& tr, v1::DType out_dtype,
                                             uint64_t budget, const CallOptions& call,
                                             ConvertStats* stats) {
  const std::string& name = tr.codes->name;
  FP4Q_ASSIGN_OR_RETURN(const EncodeScale enc, EncodeScaleFor(tr.s_dec));
  if (!enc.exact) {
    stats->notes.push_back(absl::StrCat(
        "\"", name, "_scale_2\" = ", tr.s_dec, " is not RN(1/s) of any f32 s; dequantized with ",
        "s_enc = ", enc.s_enc, " (decode scale ", 1.0f / enc.s_enc, ")"));
  }
  const uint64_t cols = static_cast<uint64_t>(tr.cols);
  const uint64_t code_row = cols / 2, scale_row = cols / 16;
  const uint64_t out_row = cols * DTypeSize(out_dtype);
  const uint64_t row_bytes = std::max(code_row + scale_row, out_row);
  const int64_t chunk_rows =
      static_cast<int64_t>(std::min<uint64_t>(budget / row_bytes, static_cast<uint64_t>(tr.rows)));
  if (chunk_rows == 0) {
    return absl::ResourceExhaustedError(absl::StrCat("tensor \"", name, "\": one row takes ",
                                                     row_bytes, " bytes, more than the request ",
                                                     "budget of ", budget, " bytes"));
  }
  const absl::string_view codes = file.Data(*tr.codes);
  const absl::string_view scales = file.Data(*tr.scales);
  std::string out;
  out.reserve(static_cast<size_t>(tr.rows) * out_row);
  for (int64_t r0 = 0; r0 < tr.rows; r0 += chunk_rows) {
    const int64_t n = std::min(chunk_rows, tr.rows - r0);
    const uint64_t un = static_cast<uint64_t>(n), ur0 = static_cast<uint64_t>(r0);
    v1::DequantizeRequest request;
    v1::QuantizedTensor* q = request.mutable_input()->mutable_tensor();
    q->set_format(v1::FORMAT_NVFP4);
    q->set_block(v1::BLOCK_SHAPE_1X16);  // 16x16 scales are stored per row: same values
    q->set_scale_layout(v1::SCALE_LAYOUT_PLAIN);
    q->add_shape(n);
    q->add_shape(tr.cols);
    q->set_global_amax(2688.0f * tr.s_dec);  // informational: DQ uses S_dec only
    q->set_s_enc(enc.s_enc);
    const absl::string_view c = codes.substr(ur0 * code_row, un * code_row);
    const absl::string_view s = scales.substr(ur0 * scale_row, un * scale_row);
    q->set_codes(c.data(), c.size());
    q->set_scales(s.data(), s.size());
    request.set_out_dtype(out_dtype);
    ++stats->requests;
    FP4Q_ASSIGN_OR_RETURN(v1::DequantizeReply reply, client.Dequantize(request, call));
    const v1::TensorResult& r = reply.output();
    if (r.dtype() != out_dtype || r.shape_size() != 2 || r.shape(0) != n ||
        r.shape(1) != tr.cols || r.inline_data().size() != un * out_row) {
      return absl::InternalError(absl::StrCat(
          "Dequantize reply for \"", name, "\": dtype ", DTypeName(r.dtype()), " shape ",
          ShapeString(std::vector<int64_t>(r.shape().begin(), r.shape().end())), " with ",
          r.inline_data().size(), " bytes; expected ", DTypeName(out_dtype), " [", n, ", ",
          tr.cols, "] with ", un * out_row));
    }
    out += r.inline_data();
  }
  return out;
}

}  // namespace

absl::StatusOr<ConvertStats> DequantizeFile(const Client& client, const std::string& in_path,
                                            const std::string& out_path, v1::DType out_dtype,
                                            const ConvertOptions& options) {
  if (out_dtype != v1::DTYPE_F32 && out_dtype != v1::DTYPE_BF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("dequantize: out dtype must be F32 or BF16, got ", DTypeName(out_dtype)));
  }
  FP4Q_RETURN_IF_ERROR(CheckPaths(in_path, out_path));
  FP4Q_ASSIGN_OR_RETURN(SafetensorsFile in, SafetensorsFile::ReadFile(in_path));
  std::map<std::string, const StTensorInfo*> by_name;
  for (const StTensorInfo& t : in.tensors()) by_name[t.name] = &t;

  std::vector<Triple> triples;
  std::set<std::string> consumed;
  uint64_t total = 0;
  for (const StTensorInfo& t : in.tensors()) {
    FP4Q_ASSIGN_OR_RETURN(Triple tr, FindTriple(in, by_name, t));
    if (tr.codes == nullptr) continue;
    consumed.insert(tr.codes->name);
    consumed.insert(tr.scales->name);
    consumed.insert(tr.scale_2->name);
    // The activation scale quantize wrote for "M.weight" describes the quantized checkpoint.
    if (const std::string module = ModuleOf(tr.codes->name); module != tr.codes->name) {
      auto input_scale = by_name.find(module + ".input_scale");
      if (input_scale != by_name.end() && input_scale->second->dtype == StDType::kF32 &&
          input_scale->second->num_elements() == 1) {
        consumed.insert(input_scale->first);
      }
    }
    total += tr.codes->num_bytes() + tr.scales->num_bytes();
    triples.push_back(tr);
  }

  ConvertStats stats;
  SafetensorsWriter out;
  for (const auto& [key, value] : in.metadata()) {
    if (key.rfind("fp4q.", 0) != 0) out.SetMetadata(key, value);  // quantize's record dropped
  }
  for (const StTensorInfo& t : in.tensors()) {
    if (consumed.count(t.name) != 0) continue;
    FP4Q_RETURN_IF_ERROR(out.Add(t.name, t.dtype, t.shape, in.Data(t)));
    ++stats.passed_through;
  }
  if (!triples.empty()) {
    FP4Q_ASSIGN_OR_RETURN(v1::ServerInfoReply info, client.ServerInfo({}, options.call));
    const uint64_t budget = RequestBudget(client, options, info);
    Progress progress(options.progress, options.progress_terminal, total);
    uint64_t done = 0;
    size_t index = 0;
    for (const Triple& tr : triples) {
      FP4Q_ASSIGN_OR_RETURN(std::string values, DequantizeTriple(client, in, tr, out_dtype,
                                                                 budget, options.call, &stats));
      const StDType dtype = out_dtype == v1::DTYPE_F32 ? StDType::kF32 : StDType::kBF16;
      FP4Q_RETURN_IF_ERROR(out.Add(tr.codes->name, dtype, {tr.rows, tr.cols}, values));
      ++stats.converted;
      const uint64_t bytes = tr.codes->num_bytes() + tr.scales->num_bytes();
      done += bytes;
      progress.Update("dequantized", ++index, triples.size(), tr.codes->name, bytes, done);
    }
    progress.Finish();
  }
  FP4Q_RETURN_IF_ERROR(out.WriteFile(out_path));
  return stats;
}

}  // namespace fp4q::client::cli
