#include "fp4q/examples/options.h"

#include <cmath>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "args.h"  // the fp4q CLI's option parser (client/cli)
#include "fp4q/common/status_macros.h"

namespace fp4q::examples {

namespace cli = ::fp4q::client::cli;

const char* TransportName(TransportKind kind) {
  return kind == TransportKind::kCudaIpc ? "cuda_ipc" : "inline";
}

std::string DefaultServerAddress() {
  const char* env = std::getenv("FP4Q_SERVER");
  if (env != nullptr && env[0] != '\0') return env;
  return "127.0.0.1:50051";
}

absl::StatusOr<ExampleOptions> ParseExampleOptions(
    const std::vector<std::string>& args, const ExampleDefaults& defaults) {
  cli::ArgSpec spec;
  spec.valued = {"steps", "seed", "lr", "server", "transport", "csv", "json"};
  FP4Q_ASSIGN_OR_RETURN(cli::ParsedArgs parsed, cli::ParseArgs(args, 1, spec));
  ExampleOptions o;
  o.help = parsed.help;
  if (!parsed.positional.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unexpected argument '", parsed.positional[0], "' (options only)"));
  }
  FP4Q_ASSIGN_OR_RETURN(
      const uint64_t steps,
      cli::GetUint64(parsed, "steps", static_cast<uint64_t>(defaults.steps)));
  if (steps < 1 || steps > static_cast<uint64_t>(kMaxSteps)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "option '--steps': ", steps, " is outside [1, ", kMaxSteps, "]"));
  }
  o.steps = static_cast<int64_t>(steps);
  FP4Q_ASSIGN_OR_RETURN(o.seed, cli::GetUint64(parsed, "seed", 1));
  FP4Q_ASSIGN_OR_RETURN(o.lr, cli::GetDouble(parsed, "lr", defaults.lr));
  if (!std::isfinite(o.lr) || !(o.lr > 0) ||
      !std::isfinite(static_cast<float>(o.lr))) {
    return absl::InvalidArgumentError(
        absl::StrCat("option '--lr': ", absl::StrFormat("%g", o.lr),
                     " is not a finite number > 0"));
  }
  o.server = cli::GetString(parsed, "server", DefaultServerAddress());
  if (o.server.empty())
    return absl::InvalidArgumentError("option '--server': empty address");
  FP4Q_ASSIGN_OR_RETURN(
      const std::string transport,
      cli::GetChoice(parsed, "transport", {"inline", "cuda_ipc"}, "inline"));
  o.transport = transport == "cuda_ipc" ? TransportKind::kCudaIpc
                                        : TransportKind::kInline;
  o.csv_path = cli::GetString(parsed, "csv", "");
  o.json_path = cli::GetString(parsed, "json", "");
  if (parsed.values.count("csv") && o.csv_path.empty()) {
    return absl::InvalidArgumentError("option '--csv': empty path");
  }
  if (parsed.values.count("json") && o.json_path.empty()) {
    return absl::InvalidArgumentError("option '--json': empty path");
  }
  return o;
}

std::string ExampleUsage(const std::string& program, const std::string& summary,
                         const ExampleDefaults& defaults) {
  return absl::StrCat(
      "usage: ", program,
      " [--steps N] [--seed N] [--lr X] [--server ADDR] [--transport "
      "inline|cuda_ipc]\n"
      "       [--csv PATH] [--json PATH]\n\n",
      summary,
      "\n\n"
      "Trains five variants against a running fp4qd and prints a table: fp32 "
      "(client only,\n"
      "no quantization), RTN, SR, RTN+EF and SR+EF (4-bit NVFP4 weights "
      "updated through the\n"
      "service; EF = error feedback with a server-held residual).\n\n"
      "options:\n"
      "  --steps N        training steps, 1..",
      kMaxSteps, " (default ", defaults.steps,
      ")\n"
      "  --seed N         seed of the data, the initial weights and stochastic "
      "rounding\n"
      "                   (default 1)\n"
      "  --lr X           learning rate (default ",
      absl::StrFormat("%g", defaults.lr),
      ")\n"
      "  --server ADDR    fp4qd address (default $FP4Q_SERVER, else "
      "127.0.0.1:50051)\n"
      "  --transport T    inline (default): tensors inside the gRPC messages; "
      "cuda_ipc: the\n"
      "                   update tensors go through a registered CUDA IPC "
      "region (needs a\n"
      "                   GPU and fp4qd --backend cuda --allow_cuda_ipc)\n"
      "  --csv PATH       write the loss curves: step and one column per "
      "variant\n"
      "  --json PATH      write the results as JSON\n\n"
      "exit status: 0 done, 1 error (printed), 2 bad usage, 77 skipped "
      "(cuda_ipc without a\n"
      "usable CUDA device)\n");
}

}  // namespace fp4q::examples
