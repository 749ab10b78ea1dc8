// bench-step's command line: its usage text and its options parsed into a Config.
#ifndef FP4Q_CLIENT_CLI_BENCH_STEP_ARGS_H_
#define FP4Q_CLIENT_CLI_BENCH_STEP_ARGS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "args.h"
#include "bench_step.h"

namespace fp4q::client::cli::bench_step {

extern const char kUsage[];

// What one bench-step run measures, from its options.
struct Config {
  std::string model;
  int layers = 0;
  std::vector<WeightShape> shapes;
  StepOptions options;
  uint64_t iters = 100, warmup = 10, align = 16;
  std::optional<uint64_t> spin_us;  // --spin-us; unset: the client's automatic spin
  std::string init = "ipc", prefix, json, fast_socket, cuda_runtime;
  std::optional<double> copy_bandwidth;
  bool plan = false;  // --plan: the items kept as a server step plan after the first step
  bool one_pass = false;  // --one-pass: StepRequest.one_pass, and every reply must say so
  uint64_t gap_us = 0;    // --gap-us: the host sleeps this long before each step
  bool heads_up = true;   // --no-heads-up clears it: no heads-up before a step after a gap
};

// The options as a Config; INVALID_ARGUMENT naming the option on a mistake.
absl::Status ParseConfig(const ParsedArgs& args, Config* c);

}  // namespace fp4q::client::cli::bench_step

#endif  // FP4Q_CLIENT_CLI_BENCH_STEP_ARGS_H_
