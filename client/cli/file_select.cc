// Tensor selection, shared-scale groups and hf_quant_config.json; see file_select.h.
#include "file_select.h"

#include <fnmatch.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "fp4q/common/json.h"

#ifndef FP4Q_VERSION
#define FP4Q_VERSION "0.0.0"
#endif

namespace fp4q::client::cli {
namespace {

constexpr char kWeightSuffix[] = ".weight";

bool Matches(const std::string& pattern, const std::string& name) {
  return fnmatch(pattern.c_str(), name.c_str(), 0) == 0;
}

// The group of `component` among the fused siblings, or "".
const char* FusedGroup(absl::string_view component) {
  if (component == "q_proj" || component == "k_proj" || component == "v_proj") {
    return "{q,k,v}_proj";
  }
  if (component == "gate_proj" || component == "up_proj") return "{gate,up}_proj";
  if (component == "w1" || component == "w3") return "{w1,w3}";
  return nullptr;
}

absl::Status SystemError(const std::string& what, const std::string& path, int err) {
  const std::string message = absl::StrCat(what, " \"", path, "\": ", std::strerror(err));
  if (err == EACCES || err == EPERM || err == EROFS) return absl::PermissionDeniedError(message);
  if (err == ENOENT || err == ENOTDIR) return absl::NotFoundError(message);
  return absl::InternalError(message);
}

}  // namespace

std::string ModuleOf(const std::string& name) {
  if (absl::EndsWith(name, kWeightSuffix) && name.size() > sizeof(kWeightSuffix) - 1) {
    return name.substr(0, name.size() - (sizeof(kWeightSuffix) - 1));
  }
  return name;
}

std::string DefaultExclusion(const std::string& name) {
  for (absl::string_view part : absl::StrSplit(ModuleOf(name), '.')) {
    const std::string p = absl::AsciiStrToLower(part);
    if (absl::StrContains(p, "embed") || p == "wte" || p == "wpe") {
      return absl::StrCat("embedding (name part \"", part, "\")");
    }
    if (absl::StrContains(p, "norm") || p == "ln" || absl::StartsWith(p, "ln_")) {
      return absl::StrCat("norm (name part \"", part, "\")");
    }
    if (p == "lm_head") return "LM head (name part \"lm_head\")";
  }
  return "";
}

std::string ExclusionReason(const SelectOptions& options, const std::string& name) {
  if (!options.include.empty()) {
    const bool included = std::any_of(options.include.begin(), options.include.end(),
                                      [&](const std::string& p) { return Matches(p, name); });
    if (!included) return "not matched by --include";
  }
  for (const std::string& p : options.exclude) {
    if (Matches(p, name)) return absl::StrCat("--exclude '", p, "'");
  }
  if (options.default_excludes) {
    const std::string why = DefaultExclusion(name);
    if (!why.empty()) return absl::StrCat("default exclusion: ", why);
  }
  return "";
}

std::string ScaleGroupOf(const std::string& name) {
  const std::string module = ModuleOf(name);
  if (module == name) return "";  // not "<module>.weight"
  const size_t dot = module.rfind('.');
  const std::string parent = dot == std::string::npos ? "" : module.substr(0, dot + 1);
  const std::string last = dot == std::string::npos ? module : module.substr(dot + 1);
  const char* group = FusedGroup(last);
  if (group == nullptr) return "";
  return absl::StrCat(parent, group, kWeightSuffix);
}

std::string HfQuantConfigPath(const std::string& out_path) {
  const size_t slash = out_path.rfind('/');
  if (slash == std::string::npos) return "hf_quant_config.json";
  return out_path.substr(0, slash + 1) + "hf_quant_config.json";
}

absl::StatusOr<std::string> HfQuantConfigJson(const HfQuantConfig& config,
                                              const std::string& existing,
                                              const std::string& path) {
  std::set<std::string> modules(config.exclude_modules.begin(), config.exclude_modules.end());
  if (!existing.empty()) {
    const std::string refuse =
        absl::StrCat("\"", path, "\" exists and was not written by fp4q for NVFP4 with "
                     "group_size 16 (");
    absl::StatusOr<common::JsonValue> doc = common::ParseJson(existing);
    if (!doc.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat(refuse, "not JSON: ", doc.status().message(), "); remove it or write "
                       "the output to another directory"));
    }
    const common::JsonValue* producer = doc->Find("producer");
    const common::JsonValue* producer_name =
        producer != nullptr ? producer->Find("name") : nullptr;
    const common::JsonValue* q = doc->Find("quantization");
    const common::JsonValue* algo = q != nullptr ? q->Find("quant_algo") : nullptr;
    const common::JsonValue* group = q != nullptr ? q->Find("group_size") : nullptr;
    const common::JsonValue* excluded = q != nullptr ? q->Find("exclude_modules") : nullptr;
    std::string why;
    if (producer_name == nullptr || !producer_name->is_string() ||
        producer_name->text() != "fp4q") {
      why = "its producer.name is not \"fp4q\"";
    } else if (algo == nullptr || !algo->is_string() || algo->text() != "NVFP4") {
      why = "its quantization.quant_algo is not \"NVFP4\"";
    } else if (group == nullptr || !group->is_number() || group->text() != "16") {
      why = "its quantization.group_size is not 16";
    } else if (excluded == nullptr || !excluded->is_array()) {
      why = "it has no quantization.exclude_modules list";
    }
    if (!why.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat(refuse, why, "); remove it or write the output to another directory"));
    }
    for (const common::JsonValue& m : excluded->items()) {
      if (m.is_string()) modules.insert(m.text());
    }
  }
  std::vector<std::string> quoted;
  for (const std::string& m : modules) quoted.push_back(common::JsonQuote(m));
  const std::string list =
      quoted.empty() ? "[]" : absl::StrCat("[\n      ", absl::StrJoin(quoted, ",\n      "), "\n    ]");
  return absl::StrCat(
      "{\n"
      "  \"producer\": {\"name\": \"fp4q\", \"version\": ", common::JsonQuote(FP4Q_VERSION), "},\n"
      "  \"quant_method\": \"modelopt_fp4\",\n"
      "  \"quantization\": {\n"
      "    \"quant_algo\": \"NVFP4\",\n"
      "    \"kv_cache_quant_algo\": null,\n"
      "    \"group_size\": 16,\n"
      "    \"exclude_modules\": ", list, "\n"
      "  }\n"
      "}\n");
}

absl::StatusOr<std::string> ReadTextFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return SystemError("cannot read", path, errno);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return SystemError("cannot read", path, errno);
  return text;
}

absl::Status WriteTextFile(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return SystemError("cannot create", tmp, errno);
    out << text;
    out.flush();
    if (!out) return SystemError("cannot write", tmp, errno);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    return SystemError(absl::StrCat("cannot rename \"", tmp, "\" to"), path, err);
  }
  return absl::OkStatus();
}

}  // namespace fp4q::client::cli
