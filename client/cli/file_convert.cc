// QuantizeFile and the helpers both directions share. DequantizeFile: file_dequantize.cc.
#include "file_convert.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "file_convert_internal.h"
#include "file_select.h"
#include "fp4q/common/json.h"
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

bool IsFloat(StDType d) {
  return IsFloatInput(d) || d == StDType::kF64 || d == StDType::kF8E4M3 ||
         d == StDType::kF8E5M2;
}

// What QuantizeFile does with one tensor.
enum class Action { kQuantize, kCopy, kExclude, kUnsupported };

struct Decision {
  Action action = Action::kCopy;
  std::string why;  // kExclude / kUnsupported: the reason
};

Decision Decide(const StTensorInfo& t, bool block16x16, const SelectOptions& select) {
  // Not a matrix (biases, norm weights, scalars) or not floating point (ids, masks): copied.
  if (t.shape.size() < 2 || !IsFloat(t.dtype)) return {Action::kCopy, ""};
  const std::string excluded = ExclusionReason(select, t.name);
  if (!excluded.empty()) return {Action::kExclude, excluded};
  if (!IsFloatInput(t.dtype)) {
    return {Action::kUnsupported, absl::StrCat("dtype ", common::StDTypeName(t.dtype),
                                               " is not quantized (F32, BF16 and F16 are)")};
  }
  if (t.shape.size() != 2) {
    return {Action::kUnsupported,
            absl::StrCat(t.shape.size(), "-D: only 2-D tensors are quantized (reshape it to "
                         "[rows, cols] first)")};
  }
  const int64_t rows = t.shape[0], cols = t.shape[1];
  if (rows == 0 || cols == 0) return {Action::kUnsupported, "it is empty"};
  if (cols % 16 != 0) {
    return {Action::kUnsupported, absl::StrCat("cols ", cols, " is not a multiple of 16")};
  }
  if (block16x16 && rows % 16 != 0) {
    return {Action::kUnsupported,
            absl::StrCat("rows ", rows, " is not a multiple of 16 (needed by 16x16 blocks)")};
  }
  return {Action::kQuantize, ""};
}

std::string Describe(const StTensorInfo& t) {
  return absl::StrCat("\"", t.name, "\" ", ShapeString(t.shape), " ",
                      common::StDTypeName(t.dtype));
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

absl::Status CheckPaths(const std::string& in_path, const std::string& out_path) {
  struct stat in_st {}, out_st {};
  if (::stat(in_path.c_str(), &in_st) == 0 && ::stat(out_path.c_str(), &out_st) == 0 &&
      in_st.st_dev == out_st.st_dev && in_st.st_ino == out_st.st_ino) {
    return absl::InvalidArgumentError(absl::StrCat(
        "OUT \"", out_path, "\" is the input file \"", in_path,
        "\": writing it would replace the input; choose another output path"));
  }
  const size_t slash = out_path.rfind('/');
  const std::string dir = slash == std::string::npos ? "."
                          : slash == 0                 ? "/"
                                                       : out_path.substr(0, slash);
  struct stat dir_st {};
  if (::stat(dir.c_str(), &dir_st) != 0) {
    const int err = errno;
    const std::string what = absl::StrCat("output directory \"", dir, "\" of \"", out_path, "\"");
    if (err == ENOENT || err == ENOTDIR) {
      return absl::NotFoundError(absl::StrCat(what, " does not exist; create it first"));
    }
    return absl::PermissionDeniedError(absl::StrCat(what, ": ", std::strerror(err)));
  }
  if (!S_ISDIR(dir_st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("output directory \"", dir, "\" of \"", out_path, "\" is not a directory"));
  }
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    return absl::PermissionDeniedError(absl::StrCat("output directory \"", dir, "\" of \"",
                                                    out_path, "\" is not writable: ",
                                                    std::strerror(errno)));
  }
  return absl::OkStatus();
}

namespace {

const char* RoundingMetadata(const v1::QuantOptions& q) {
  return q.rounding() == v1::ROUNDING_STOCHASTIC ? "sr" : "rtn";
}

const char* RhtMetadata(const v1::QuantOptions& q) {
  return q.rht() == v1::RHT_MODE_DEFAULT_SIGNS ? "default"
         : q.rht() == v1::RHT_MODE_SEEDED      ? "seeded"
                                               : "off";
}

const char* SelectionMetadata(const v1::QuantOptions& q) {
  return q.scale_selection() == v1::SCALE_SELECTION_FOUR_OVER_SIX_MAE   ? "4over6-mae"
         : q.scale_selection() == v1::SCALE_SELECTION_FOUR_OVER_SIX_MSE ? "4over6-mse"
                                                                        : "map6";
}

// {"a": "b", ...} with keys in order.
std::string JsonObject(const std::map<std::string, std::string>& m) {
  std::vector<std::string> parts;
  for (const auto& [k, v] : m) parts.push_back(common::JsonQuote(k) + ": " + common::JsonQuote(v));
  return absl::StrCat("{", absl::StrJoin(parts, ", "), "}");
}

}  // namespace

absl::StatusOr<ConvertStats> QuantizeFile(const Client& client, const std::string& in_path,
                                          const std::string& out_path,
                                          const v1::QuantOptions& quant,
                                          const ConvertOptions& options) {
  FP4Q_RETURN_IF_ERROR(CheckQuantOptions(quant));
  if (!std::isfinite(options.input_scale) || !(options.input_scale > 0.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("input scale ", options.input_scale, " is not finite and > 0"));
  }
  FP4Q_RETURN_IF_ERROR(CheckPaths(in_path, out_path));
  FP4Q_ASSIGN_OR_RETURN(SafetensorsFile in, SafetensorsFile::ReadFile(in_path));
  const bool block16 = quant.block() == v1::BLOCK_SHAPE_16X16;
  const bool rht = quant.rht() == v1::RHT_MODE_DEFAULT_SIGNS || quant.rht() == v1::RHT_MODE_SEEDED;
  // An hf_quant_config.json already beside OUT must be one this tool can extend: checked before
  // any work, so a refusal writes nothing.
  const bool write_config = options.hf_quant_config && !rht;
  const std::string config_path = HfQuantConfigPath(out_path);
  std::string existing_config;
  if (write_config) {
    if (absl::StatusOr<std::string> text = ReadTextFile(config_path); text.ok()) {
      existing_config = *std::move(text);
      FP4Q_RETURN_IF_ERROR(HfQuantConfigJson({}, existing_config, config_path).status());
    } else if (!absl::IsNotFound(text.status())) {
      return text.status();
    }
  }

  ConvertStats stats;
  std::set<std::string> names;
  for (const StTensorInfo& t : in.tensors()) names.insert(t.name);
  std::vector<Decision> decisions;
  std::vector<std::string> unsupported;
  uint64_t total = 0;
  size_t count = 0;
  for (const StTensorInfo& t : in.tensors()) {
    decisions.push_back(Decide(t, block16, options.select));
    const Decision& d = decisions.back();
    if (d.action == Action::kUnsupported) {
      unsupported.push_back(absl::StrCat(Describe(t), ": ", d.why));
    }
    if (d.action != Action::kQuantize) continue;
    for (const char* suffix : {"_scale", "_scale_2"}) {
      if (names.count(t.name + suffix) != 0) {
        return absl::FailedPreconditionError(
            absl::StrCat("cannot quantize \"", t.name, "\": the input already has a tensor \"",
                         t.name, suffix, "\" (already quantized?)"));
      }
    }
    const std::string module = ModuleOf(t.name);
    if (module != t.name && names.count(module + ".input_scale") != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot quantize \"", t.name, "\": the input already has a tensor \"",
                       module, ".input_scale\" (already quantized?)"));
    }
    total += t.num_bytes();
    ++count;
  }
  if (!unsupported.empty() && !options.skip_unsupported) {
    return absl::FailedPreconditionError(absl::StrCat(
        unsupported.size(), " tensor(s) cannot be quantized, nothing was written ",
        "(--skip-unsupported copies them unquantized, --exclude leaves them out):\n  ",
        absl::StrJoin(unsupported, "\n  ")));
  }
  for (const std::string& u : unsupported) stats.skipped.push_back(u);

  // Shared-scale groups: the largest amax of each group's members (file_select.h).
  std::map<std::string, float> group_amax;
  std::map<std::string, std::vector<std::string>> group_members;
  if (options.shared_scales && !rht) {
    for (size_t i = 0; i < in.tensors().size(); ++i) {
      const StTensorInfo& t = in.tensors()[i];
      if (decisions[i].action != Action::kQuantize) continue;
      const std::string group = ScaleGroupOf(t.name);
      if (group.empty()) continue;
      const WireInput wire = ToWire(in, t);
      const float a = HostAmax(wire.dtype, wire.data);
      auto [it, fresh] = group_amax.emplace(group, a);
      if (!fresh) it->second = std::max(it->second, a);
      group_members[group].push_back(t.name);
    }
    for (auto it = group_members.begin(); it != group_members.end();) {
      const float a = group_amax[it->first];
      if (it->second.size() < 2) {
        group_amax.erase(it->first);
        it = group_members.erase(it);
      } else if (!std::isfinite(a)) {
        stats.notes.push_back(absl::StrCat("group ", it->first, ": its amax is ", a,
                                           ", so each member keeps its own global scale"));
        group_amax.erase(it->first);
        it = group_members.erase(it);
      } else {
        stats.notes.push_back(absl::StrCat("one global scale (amax ", a, ") for ",
                                           absl::StrJoin(it->second, ", ")));
        ++it;
      }
    }
  } else if (options.shared_scales && rht) {
    stats.notes.push_back("no shared scale groups with --rht (each transformed tensor has its "
                          "own amax)");
  }

  FP4Q_ASSIGN_OR_RETURN(v1::ServerInfoReply info, client.ServerInfo({}, options.call));
  const uint64_t budget = RequestBudget(client, options, info);

  SafetensorsWriter out;
  CopyMetadata(in, &out);
  std::map<std::string, std::string> original_dtypes, groups_of;
  std::set<std::string> exclude_modules;
  Progress progress(options.progress, options.progress_terminal, total);
  uint64_t done = 0;
  size_t index = 0;
  for (size_t i = 0; i < in.tensors().size(); ++i) {
    const StTensorInfo& t = in.tensors()[i];
    const Decision& d = decisions[i];
    const absl::string_view raw = in.Data(t);
    if (d.action != Action::kQuantize) {
      if (d.action == Action::kExclude) stats.excluded.push_back(absl::StrCat(t.name, ": ", d.why));
      // Loaders must know that these matrices' modules hold dense weights.
      if (d.action == Action::kExclude || d.action == Action::kUnsupported) {
        exclude_modules.insert(ModuleOf(t.name));
      }
      FP4Q_RETURN_IF_ERROR(out.Add(t.name, t.dtype, t.shape, raw));
      ++stats.passed_through;
      continue;
    }
    const int64_t rows = t.shape[0], cols = t.shape[1];
    const WireInput wire = ToWire(in, t);
    v1::QuantOptions tensor_options = quant;
    const std::string group = ScaleGroupOf(t.name);
    if (auto g = group_amax.find(group); !group.empty() && g != group_amax.end()) {
      tensor_options.set_amax(g->second);
      groups_of[t.name] = group;
    }
    FP4Q_ASSIGN_OR_RETURN(QuantizedOutput q,
                          QuantizeTensor(client, t.name, wire, rows, cols, tensor_options, budget,
                                         options.call, &stats.requests));
    FP4Q_RETURN_IF_ERROR(out.Add(t.name, StDType::kU8, {rows, cols / 2}, q.codes));
    FP4Q_RETURN_IF_ERROR(
        out.Add(t.name + "_scale", StDType::kF8E4M3, {rows, cols / 16}, q.scales));
    FP4Q_RETURN_IF_ERROR(out.Add(t.name + "_scale_2", StDType::kF32, {1},
                                 FloatBytes(1.0f / q.s_enc)));
    const std::string module = ModuleOf(t.name);
    if (module != t.name) {
      FP4Q_RETURN_IF_ERROR(out.Add(module + ".input_scale", StDType::kF32, {1},
                                   FloatBytes(options.input_scale)));
    }
    original_dtypes[t.name] = common::StDTypeName(t.dtype);
    ++stats.converted;
    done += t.num_bytes();
    progress.Update("quantized", ++index, count, t.name, t.num_bytes(), done);
  }
  progress.Finish();
  out.SetMetadata("fp4q.format", "nvfp4");
  out.SetMetadata("fp4q.block", block16 ? "16x16" : "1x16");
  out.SetMetadata("fp4q.rounding", RoundingMetadata(quant));
  if (quant.rounding() == v1::ROUNDING_STOCHASTIC) {
    out.SetMetadata("fp4q.seed", absl::StrCat(quant.seed()));
    out.SetMetadata("fp4q.step", absl::StrCat(quant.step()));
  }
  out.SetMetadata("fp4q.rht", RhtMetadata(quant));
  if (quant.rht() == v1::RHT_MODE_SEEDED) {
    out.SetMetadata("fp4q.rht_seed", absl::StrCat(quant.rht_seed()));
  }
  out.SetMetadata("fp4q.scale_selection", SelectionMetadata(quant));
  if (quant.scale_selection() != v1::SCALE_SELECTION_MAP_TO_6 &&
      quant.scale_selection() != v1::SCALE_SELECTION_UNSPECIFIED) {
    out.SetMetadata("fp4q.four_over_six_emax",
                    quant.four_over_six_emax() == 448.0f ? "448" : "256");
  }
  out.SetMetadata("fp4q.original_dtypes", JsonObject(original_dtypes));
  out.SetMetadata("fp4q.input_scale", absl::StrCat(options.input_scale));
  out.SetMetadata("fp4q.scale_groups", JsonObject(groups_of));
  FP4Q_RETURN_IF_ERROR(out.WriteFile(out_path));

  if (!options.hf_quant_config) return stats;
  if (rht) {
    stats.notes.push_back("no hf_quant_config.json: with --rht the stored weights are in the "
                          "transformed domain, which inference loaders do not undo");
    return stats;
  }
  HfQuantConfig config;
  config.exclude_modules.assign(exclude_modules.begin(), exclude_modules.end());
  FP4Q_ASSIGN_OR_RETURN(std::string json,
                        HfQuantConfigJson(config, existing_config, config_path));
  FP4Q_RETURN_IF_ERROR(WriteTextFile(config_path, json));
  stats.hf_quant_config_path = config_path;
  return stats;
}

}  // namespace fp4q::client::cli
