// fp4q quantize | dequantize: argument handling around file_convert.h.
#include <unistd.h>

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
    "Quantizes every 2-D F32/BF16/F16 tensor T whose last dimension is a multiple of 16 to\n"
    "NVFP4 on the server and writes T (U8 packed codes [rows, cols/2]), T_scale (F8_E4M3\n"
    "[rows, cols/16], plain row-major) and T_scale_2 (F32 [1], S_dec = 1/S_enc). Other\n"
    "tensors and the metadata are copied unchanged; a 2-D float tensor left out gets a note.\n"
    "Tensors above the message limit are sent in row chunks with the whole tensor's amax\n"
    "(identical results); stochastic rounding cannot be chunked.\n"
    "\n"
    "Options:\n"
    "  --block 1x16|16x16            block shape (default 1x16; 16x16 needs rows % 16 == 0)\n"
    "  --rounding rtn|sr             element rounding (default rtn)\n"
    "  --seed N                      stochastic rounding key (with --rounding sr; default 0)\n"
    "  --step N                      stochastic rounding counter (with --rounding sr; default 0)\n"
    "  --rht off|default|seeded      random Hadamard transform (default off)\n"
    "  --rht-seed N                  sign seed for --rht seeded (default 0)\n"
    "  --scale-selection map6|4over6-mae|4over6-mse   block scale rule (default map6)\n"
    "  --emax 256|448                four-over-six Emax (default 256)\n"
    "  --progress                    progress lines on stderr (default: when stderr is a TTY)\n"
    "  --max-request-bytes N         cap the tensor bytes of one request (forces chunking)\n";

constexpr char kDequantizeUsage[] =
    "Usage: fp4q [--server ADDR] dequantize IN.safetensors OUT.safetensors [options]\n"
    "\n"
    "Reverses `fp4q quantize`: every triple T (U8 [rows, cols/2]), T_scale (F8_E4M3\n"
    "[rows, cols/16]) and T_scale_2 (F32, one value) becomes T [rows, cols], dequantized on\n"
    "the server. Other tensors and the metadata are copied unchanged.\n"
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
  for (const std::string& note : stats.notes) {
    std::fprintf(stderr, "fp4q %s: note: %s\n", name.c_str(), note.c_str());
  }
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
                 "emax",  "max-request-bytes"};
  spec.boolean = {"progress"};
  FileArgs f;
  if (int rc = ParseFileArgs("quantize", kQuantizeUsage, context, spec, &f); rc >= 0) return rc;
  absl::StatusOr<v1::QuantOptions> quant = QuantOptionsFromArgs(f.args);
  if (!quant.ok()) return UsageFailure("quantize", std::string(quant.status().message()));
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(context.client);
  if (!client.ok()) return UsageFailure("quantize", std::string(client.status().message()));
  absl::StatusOr<ConvertStats> stats = QuantizeFile(**client, f.in, f.out, *quant, f.convert);
  if (!stats.ok()) return Failure("quantize", stats.status());
  PrintNotes("quantize", *stats);
  std::printf("quantized %zu tensor(s), copied %zu, in %zu request(s) -> %s\n", stats->converted,
              stats->passed_through, stats->requests, f.out.c_str());
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
