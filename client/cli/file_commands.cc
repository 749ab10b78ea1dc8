// fp4q quantize | dequantize: argument handling around file_convert.h.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "args.h"
#include "commands.h"
#include "file_convert.h"

namespace fp4q::client::cli {
namespace {

constexpr char kQuantizeUsage[] =
    "Usage: fp4q [--server ADDR] quantize IN.safetensors OUT.safetensors [options]\n"
    "\n"
    "Quantizes the 2-D F32/BF16/F16 tensors T of IN to NVFP4 on the server and writes the\n"
    "ModelOpt layout that vLLM's and SGLang's loaders read: T (U8 packed codes [rows, cols/2]),\n"
    "T_scale (F8_E4M3 [rows, cols/16]), T_scale_2 (F32 [1], S_dec = amax/2688) and, for\n"
    "T = M.weight, M.input_scale (F32 [1]); and hf_quant_config.json beside OUT (quant_algo\n"
    "NVFP4, group_size 16, exclude_modules). Other tensors and the metadata are copied; the\n"
    "metadata records block, rounding and original dtypes (fp4q.* keys). Details:\n"
    "docs/CHECKPOINTS.md.\n"
    "\n"
    "Which tensors: every name, unless --include is given, minus --exclude and the default\n"
    "exclusions: embeddings (a name part containing \"embed\", or wte/wpe), norms (a part\n"
    "containing \"norm\", ln or ln_*) and lm_head. Tensors with fewer than 2 dimensions and\n"
    "non-float tensors are copied. A selected tensor that cannot be quantized (F64/F8, not\n"
    "2-D, cols not a multiple of 16, rows not a multiple of 16 with 16x16 blocks) fails the\n"
    "command, listing them, unless --skip-unsupported.\n"
    "Tensors above the message limit are sent in row chunks with the whole tensor's amax\n"
    "(identical results); stochastic rounding cannot be chunked.\n"
    "\n"
    "Options:\n"
    "  --block 1x16|16x16            block shape (default 1x16; 16x16 needs rows % 16 == 0)\n"
    "  --rounding rtn|sr             element rounding (default rtn)\n"
    "  --seed N                      stochastic rounding key (with --rounding sr; default 0)\n"
    "  --step N                      stochastic rounding counter (with --rounding sr; default 0)\n"
    "  --rht off|default|seeded      random Hadamard transform (default off; no\n"
    "                                hf_quant_config.json with it)\n"
    "  --rht-seed N                  sign seed for --rht seeded (default 0)\n"
    "  --scale-selection map6|4over6-mae|4over6-mse   block scale rule (default map6)\n"
    "  --emax 256|448                four-over-six Emax (default 256)\n"
    "  --include GLOB                quantize only names matching a GLOB (repeatable)\n"
    "  --exclude GLOB                copy names matching a GLOB unquantized (repeatable)\n"
    "  --no-default-excludes         quantize embeddings, norms and lm_head too\n"
    "  --skip-unsupported            copy tensors that cannot be quantized, and list them\n"
    "  --no-shared-scales            own global scale for q/k/v_proj, gate/up_proj, w1/w3 too\n"
    "                                (default: one per group, as fused loaders need)\n"
    "  --input-scale S               M.input_scale written, activation amax / 2688 (default\n"
    "                                1.0: fp4q does not calibrate activations)\n"
    "  --no-hf-quant-config          do not write hf_quant_config.json\n"
    "  --progress                    progress lines on stderr (default: when stderr is a TTY)\n"
    "  --max-request-bytes N         cap the tensor bytes of one request (forces chunking)\n";

constexpr char kDequantizeUsage[] =
    "Usage: fp4q [--server ADDR] dequantize IN.safetensors OUT.safetensors [options]\n"
    "\n"
    "Reverses `fp4q quantize`: every triple T (U8 [rows, cols/2]), T_scale (F8_E4M3\n"
    "[rows, cols/16]) and T_scale_2 (F32, one value) becomes T [rows, cols], dequantized on\n"
    "the server. The M.input_scale of a triple M.weight and the fp4q.* metadata keys are\n"
    "dropped; other tensors and the metadata are copied unchanged.\n"
    "\n"
    "Options:\n"
    "  --dtype f32|bf16              output dtype (default f32)\n"
    "  --progress                    progress lines on stderr (default: when stderr is a TTY)\n"
    "  --max-request-bytes N         cap the tensor bytes of one request (forces chunking)\n";

struct FileArgs {
  ParsedArgs args;
  std::string in, out;
  ConvertOptions convert;
};

// -1 to go on, else an exit code.
int ParseFileArgs(const std::string& name, const char* usage, const CommandContext& context,
                  const ArgSpec& spec, FileArgs* out) {
  absl::StatusOr<ParsedArgs> args = ParseArgs(context.args, 0, spec);
  if (!args.ok()) return UsageFailure(name, std::string(args.status().message()));
  if (args->help) {
    std::fputs(usage, stdout);
    return kExitOk;
  }
  if (args->positional.size() != 2) {
    return UsageFailure(name, absl::StrCat("expected IN and OUT files, got ",
                                           args->positional.size(), " argument(s)"));
  }
  absl::StatusOr<uint64_t> max_request = GetUint64(*args, "max-request-bytes", 0);
  if (!max_request.ok()) return UsageFailure(name, std::string(max_request.status().message()));
  out->in = args->positional[0];
  out->out = args->positional[1];
  out->convert.max_request_bytes = *max_request;
  const bool tty = isatty(STDERR_FILENO) == 1;
  out->convert.progress = tty || args->flags.count("progress") != 0;
  out->convert.progress_terminal = tty;
  out->args = *std::move(args);
  return -1;
}

void PrintNotes(const std::string& name, const ConvertStats& stats) {
  for (const std::string& e : stats.excluded) {
    std::fprintf(stderr, "fp4q %s: excluded %s\n", name.c_str(), e.c_str());
  }
  for (const std::string& s : stats.skipped) {
    std::fprintf(stderr, "fp4q %s: skipped (unsupported, copied unquantized) %s\n", name.c_str(),
                 s.c_str());
  }
  for (const std::string& note : stats.notes) {
    std::fprintf(stderr, "fp4q %s: note: %s\n", name.c_str(), note.c_str());
  }
}

// "copied N" with the excluded and skipped among them.
std::string CopiedSummary(const ConvertStats& stats) {
  std::string s = absl::StrCat("copied ", stats.passed_through);
  if (!stats.excluded.empty() || !stats.skipped.empty()) {
    absl::StrAppend(&s, " (", stats.excluded.size(), " excluded, ", stats.skipped.size(),
                    " unsupported)");
  }
  return s;
}

// Maps the quantize options to QuantOptions; INVALID_ARGUMENT (usage) for a bad value or a
// value given without the mode that uses it.
absl::StatusOr<v1::QuantOptions> QuantOptionsFromArgs(const ParsedArgs& args) {
  v1::QuantOptions q;
  q.set_format(v1::FORMAT_NVFP4);
  q.set_scale_layout(v1::SCALE_LAYOUT_PLAIN);
  q.set_outputs(v1::OUTPUTS_ROWWISE);
  absl::StatusOr<std::string> block = GetChoice(args, "block", {"1x16", "16x16"}, "1x16");
  if (!block.ok()) return block.status();
  q.set_block(*block == "16x16" ? v1::BLOCK_SHAPE_16X16 : v1::BLOCK_SHAPE_1X16);

  absl::StatusOr<std::string> rounding = GetChoice(args, "rounding", {"rtn", "sr"}, "rtn");
  if (!rounding.ok()) return rounding.status();
  const bool sr = *rounding == "sr";
  q.set_rounding(sr ? v1::ROUNDING_STOCHASTIC : v1::ROUNDING_NEAREST);
  for (const char* opt : {"seed", "step"}) {
    if (!sr && args.values.count(opt) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("option '--", opt, "' needs --rounding sr"));
    }
  }
  absl::StatusOr<uint64_t> seed = GetUint64(args, "seed", 0);
  if (!seed.ok()) return seed.status();
  absl::StatusOr<uint64_t> step = GetUint64(args, "step", 0);
  if (!step.ok()) return step.status();
  q.set_seed(*seed);
  q.set_step(*step);

  absl::StatusOr<std::string> rht = GetChoice(args, "rht", {"off", "default", "seeded"}, "off");
  if (!rht.ok()) return rht.status();
  q.set_rht(*rht == "default"  ? v1::RHT_MODE_DEFAULT_SIGNS
            : *rht == "seeded" ? v1::RHT_MODE_SEEDED
                               : v1::RHT_MODE_OFF);
  if (*rht != "seeded" && args.values.count("rht-seed") != 0) {
    return absl::InvalidArgumentError("option '--rht-seed' needs --rht seeded");
  }
  absl::StatusOr<uint64_t> rht_seed = GetUint64(args, "rht-seed", 0);
  if (!rht_seed.ok()) return rht_seed.status();
  q.set_rht_seed(*rht_seed);

  absl::StatusOr<std::string> sel =
      GetChoice(args, "scale-selection", {"map6", "4over6-mae", "4over6-mse"}, "map6");
  if (!sel.ok()) return sel.status();
  q.set_scale_selection(*sel == "4over6-mae"   ? v1::SCALE_SELECTION_FOUR_OVER_SIX_MAE
                        : *sel == "4over6-mse" ? v1::SCALE_SELECTION_FOUR_OVER_SIX_MSE
                                               : v1::SCALE_SELECTION_MAP_TO_6);
  absl::StatusOr<std::string> emax = GetChoice(args, "emax", {"256", "448"}, "256");
  if (!emax.ok()) return emax.status();
  if (*sel == "map6" && args.values.count("emax") != 0) {
    return absl::InvalidArgumentError("option '--emax' needs --scale-selection 4over6-*");
  }
  q.set_four_over_six_emax(*emax == "448" ? 448.0f : 256.0f);
  return q;
}

}  // namespace

int RunQuantize(const CommandContext& context) {
  ArgSpec spec;
  spec.valued = {"block", "rounding", "seed",  "step", "rht", "rht-seed", "scale-selection",
                 "emax",  "max-request-bytes", "input-scale"};
  spec.repeated = {"include", "exclude"};
  spec.boolean = {"progress", "no-default-excludes", "skip-unsupported", "no-shared-scales",
                  "no-hf-quant-config"};
  FileArgs f;
  if (int rc = ParseFileArgs("quantize", kQuantizeUsage, context, spec, &f); rc >= 0) return rc;
  absl::StatusOr<v1::QuantOptions> quant = QuantOptionsFromArgs(f.args);
  if (!quant.ok()) return UsageFailure("quantize", std::string(quant.status().message()));
  if (auto it = f.args.lists.find("include"); it != f.args.lists.end()) {
    f.convert.select.include = it->second;
  }
  if (auto it = f.args.lists.find("exclude"); it != f.args.lists.end()) {
    f.convert.select.exclude = it->second;
  }
  for (const auto* list : {&f.convert.select.include, &f.convert.select.exclude}) {
    for (const std::string& p : *list) {
      if (p.empty()) return UsageFailure("quantize", "an --include/--exclude pattern is empty");
    }
  }
  f.convert.select.default_excludes = f.args.flags.count("no-default-excludes") == 0;
  f.convert.skip_unsupported = f.args.flags.count("skip-unsupported") != 0;
  f.convert.shared_scales = f.args.flags.count("no-shared-scales") == 0;
  f.convert.hf_quant_config = f.args.flags.count("no-hf-quant-config") == 0;
  absl::StatusOr<double> input_scale = GetDouble(f.args, "input-scale", 1.0);
  if (!input_scale.ok()) return UsageFailure("quantize", std::string(input_scale.status().message()));
  const float input_scale_f = static_cast<float>(*input_scale);
  if (!std::isfinite(input_scale_f) || !(input_scale_f > 0.0f)) {
    return UsageFailure("quantize", absl::StrCat("option '--input-scale' must be a finite f32 > 0, "
                                                 "got '", GetString(f.args, "input-scale", ""),
                                                 "'"));
  }
  f.convert.input_scale = input_scale_f;
  if (absl::Status paths = CheckPaths(f.in, f.out); absl::IsInvalidArgument(paths)) {
    return UsageFailure("quantize", std::string(paths.message()));
  }
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(context.client);
  if (!client.ok()) return UsageFailure("quantize", std::string(client.status().message()));
  absl::StatusOr<ConvertStats> stats = QuantizeFile(**client, f.in, f.out, *quant, f.convert);
  if (!stats.ok()) return Failure("quantize", stats.status());
  PrintNotes("quantize", *stats);
  std::printf("quantized %zu tensor(s), %s, in %zu request(s) -> %s\n", stats->converted,
              CopiedSummary(*stats).c_str(), stats->requests, f.out.c_str());
  if (!stats->hf_quant_config_path.empty()) {
    std::printf("wrote %s\n", stats->hf_quant_config_path.c_str());
  }
  return kExitOk;
}

int RunDequantize(const CommandContext& context) {
  ArgSpec spec;
  spec.valued = {"dtype", "max-request-bytes"};
  spec.boolean = {"progress"};
  FileArgs f;
  if (int rc = ParseFileArgs("dequantize", kDequantizeUsage, context, spec, &f); rc >= 0) {
    return rc;
  }
  absl::StatusOr<std::string> dtype = GetChoice(f.args, "dtype", {"f32", "bf16"}, "f32");
  if (!dtype.ok()) return UsageFailure("dequantize", std::string(dtype.status().message()));
  if (absl::Status paths = CheckPaths(f.in, f.out); absl::IsInvalidArgument(paths)) {
    return UsageFailure("dequantize", std::string(paths.message()));
  }
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(context.client);
  if (!client.ok()) return UsageFailure("dequantize", std::string(client.status().message()));
  absl::StatusOr<ConvertStats> stats =
      DequantizeFile(**client, f.in, f.out, *dtype == "bf16" ? v1::DTYPE_BF16 : v1::DTYPE_F32,
                     f.convert);
  if (!stats.ok()) return Failure("dequantize", stats.status());
  PrintNotes("dequantize", *stats);
  std::printf("dequantized %zu tensor(s), copied %zu, in %zu request(s) -> %s\n",
              stats->converted, stats->passed_through, stats->requests, f.out.c_str());
  return kExitOk;
}

}  // namespace fp4q::client::cli
