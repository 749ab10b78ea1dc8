// Command-line options shared by the example programs (examples/*.cc).
//
//   --steps N          training steps (1..100000; default per example)
//   --seed N           data, initial weights and stochastic-rounding seed
//   (uint64; default 1)
//   --lr X             learning rate (finite, > 0; default per example)
//   --server ADDR      fp4qd address (default $FP4Q_SERVER, else
//   127.0.0.1:50051)
//   --transport T      inline (default) or cuda_ipc (update tensors through a
//   CUDA IPC region)
//   --csv PATH         write the loss curves (step, one column per variant)
//   --json PATH        write the results (machine-readable; what the CI test
//   checks)
//   --help             usage
//
// Parsing errors are INVALID_ARGUMENT naming the option and the value; the
// programs print them with the usage line and exit with kExitUsage.
#ifndef FP4Q_EXAMPLES_OPTIONS_H_
#define FP4Q_EXAMPLES_OPTIONS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace fp4q::examples {

// Exit codes of the example programs.
inline constexpr int kExitOk = 0;
inline constexpr int kExitError =
    1;  // an RPC, CUDA or I/O error; the message is printed
inline constexpr int kExitUsage = 2;  // bad command line
inline constexpr int kExitSkipped =
    77;  // --transport cuda_ipc where no CUDA device is usable

inline constexpr int64_t kMaxSteps = 100000;

enum class TransportKind { kInline, kCudaIpc };
const char* TransportName(TransportKind kind);  // "inline", "cuda_ipc"

// Per-example defaults (and the text of --help).
struct ExampleDefaults {
  int64_t steps = 500;
  double lr = 0.01;
};

struct ExampleOptions {
  int64_t steps = 500;
  uint64_t seed = 1;
  double lr = 0.01;
  std::string server;  // resolved: never empty after parsing
  TransportKind transport = TransportKind::kInline;
  std::string csv_path;   // empty: no CSV
  std::string json_path;  // empty: no JSON
  bool help = false;      // --help / -h given: print usage, do nothing else
};

// $FP4Q_SERVER when set and non-empty, else "127.0.0.1:50051".
std::string DefaultServerAddress();

// Parses args (args[0] is the program name and is skipped). INVALID_ARGUMENT
// for an unknown option, a missing or malformed value, a value out of range, an
// option given twice, or a positional argument.
absl::StatusOr<ExampleOptions> ParseExampleOptions(
    const std::vector<std::string>& args, const ExampleDefaults& defaults);

// The --help text.
std::string ExampleUsage(const std::string& program, const std::string& summary,
                         const ExampleDefaults& defaults);

}  // namespace fp4q::examples

#endif  // FP4Q_EXAMPLES_OPTIONS_H_
