// What `fp4q quantize` quantizes, and the files inference engines need beside its output.
//
// Selection, per tensor name (docs/CHECKPOINTS.md):
// - --include GLOB (repeatable): only names matching one of them are candidates (default: all);
// - --exclude GLOB (repeatable): names matching one are copied unquantized;
// - the default exclusions (unless --no-default-excludes): embeddings, norms and the LM head,
//   recognised from the parts of the module name (the tensor name without a final ".weight"),
//   split at '.', compared case-insensitively: a part containing "embed", or equal to "wte" or
//   "wpe" (GPT-2's token and position embeddings), is an embedding; a part containing "norm", or
//   equal to "ln" or starting with "ln_", is a norm; a part equal to "lm_head" is the LM head.
// Globs are fnmatch(3) patterns without flags: '*' and '?' also match '.', "[...]" a class.
//
// Shared global scales: loaders fuse some sibling projections into one GEMM and give the fused
// weight a single global scale (vLLM and SGLang take the largest weight_scale_2 of q/k/v, and of
// gate/up), which decodes a sibling with a smaller one wrongly. `fp4q quantize` therefore gives
// the members of such a group one global amax, the largest of theirs: "P.q_proj.weight",
// "P.k_proj.weight", "P.v_proj.weight" share one, "P.gate_proj.weight" and "P.up_proj.weight"
// one, "P.w1.weight" and "P.w3.weight" (Mixtral's experts) one.
#ifndef FP4Q_CLIENT_CLI_FILE_SELECT_H_
#define FP4Q_CLIENT_CLI_FILE_SELECT_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace fp4q::client::cli {

struct SelectOptions {
  std::vector<std::string> include;  // empty: every name is a candidate
  std::vector<std::string> exclude;
  bool default_excludes = true;
};

// The module a tensor belongs to: `name` without a final ".weight"; `name` itself otherwise.
std::string ModuleOf(const std::string& name);

// Why the default exclusions leave `name` unquantized ("embedding", "norm", "LM head"), or "".
std::string DefaultExclusion(const std::string& name);

// Why `name` is not quantized by the selection ("--exclude 'X'", "not matched by --include",
// "default exclusion: norm (name part \"input_layernorm\")"), or "" when it is a candidate.
std::string ExclusionReason(const SelectOptions& options, const std::string& name);

// The shared-scale group of `name` ("P.{q,k,v}_proj.weight", "P.{gate,up}_proj.weight",
// "P.{w1,w3}.weight"), or "" when it belongs to none.
std::string ScaleGroupOf(const std::string& name);

// Settings recorded in hf_quant_config.json.
struct HfQuantConfig {
  std::vector<std::string> exclude_modules;
};

// The hf_quant_config.json text for `config`, ModelOpt's layout:
//   {"producer": {"name": "fp4q", "version": ...}, "quant_method": "modelopt_fp4",
//    "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": null, "group_size": 16,
//                     "exclude_modules": [...]}}
// When `existing` (the text of a file already at that path) is non-empty it must be one fp4q
// wrote with the same quant_algo and group_size; its exclude_modules are kept (the union is
// written, sorted), so the shards of one checkpoint share one file. FAILED_PRECONDITION naming
// the path otherwise.
absl::StatusOr<std::string> HfQuantConfigJson(const HfQuantConfig& config,
                                              const std::string& existing,
                                              const std::string& path);

// dirname(path)/hf_quant_config.json ("hf_quant_config.json" for a bare file name).
std::string HfQuantConfigPath(const std::string& out_path);

// The whole file at `path`; NOT_FOUND when there is none, PERMISSION_DENIED / INTERNAL with the
// path and the system's message when it cannot be read.
absl::StatusOr<std::string> ReadTextFile(const std::string& path);

// Writes `text` to `path` through path.tmp and a rename. PERMISSION_DENIED / NOT_FOUND /
// INTERNAL with the path and the system's message.
absl::Status WriteTextFile(const std::string& path, const std::string& text);

}  // namespace fp4q::client::cli

#endif  // FP4Q_CLIENT_CLI_FILE_SELECT_H_
