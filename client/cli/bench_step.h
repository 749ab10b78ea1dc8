// The parts of `fp4q bench-step` that need neither a server nor a GPU, so tests can check them
// alone: the model shape tables, the bytes floor of a step, the layout of the two buffers, the
// CreateWeight and Step requests, the statistics and the JSON report.
//
// Contract
// - Shapes are [rows, cols] of bf16 matrices, cols a multiple of 16 (NVFP4 1x16 blocks).
// - The floor counts each byte the step must move once, read + written, with bf16 gradients
//   and a bf16 DQ(W) output (FloorBytes). It is exact in bytes; per parameter it is
//   13.125 for SGD RTN + EF (see FloorFor). Scaling and rounding do not change it: with
//   current scaling the server reads the inputs twice (the amax pass), so the floor is a bound
//   such a step cannot reach.
// - Nothing here fails on a valid model; the parsers return INVALID_ARGUMENT naming the option.
#ifndef FP4Q_CLIENT_CLI_BENCH_STEP_H_
#define FP4Q_CLIENT_CLI_BENCH_STEP_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "fp4q/v1/fp4q.pb.h"

namespace fp4q::client::cli::bench_step {

namespace v1 = ::fp4q::v1;

struct WeightShape {
  std::string name;  // under the run's prefix
  int64_t rows = 0;
  int64_t cols = 0;
  uint64_t elements() const { return static_cast<uint64_t>(rows) * static_cast<uint64_t>(cols); }
};

// The model tables: "gpt2-small" (12 layers of attn.c_attn 768x2304, attn.c_proj 768x768,
// mlp.c_fc 768x3072, mlp.c_proj 3072x768, then wte 50257x768 and wpe 1024x768: 50 matrices,
// 124,318,464 parameters; GPT-2's 124.4M adds biases and LayerNorms, which are not matrices),
// "llama3-8b" (`layers` layers of self_attn.{q,k,v,o}_proj 4096x4096, 1024x4096, 1024x4096,
// 4096x4096 and mlp.{gate,up,down}_proj 14336x4096, 14336x4096, 4096x14336: 218,103,808 a
// layer, 6,979,321,856 for 32) and "square8192" (one 8192x8192). `layers` is used by
// llama3-8b only and must be >= 1 there. INVALID_ARGUMENT for another model name.
absl::StatusOr<std::vector<WeightShape>> ModelShapes(const std::string& model, int layers);
// The models ModelShapes knows, in --help order.
const std::vector<std::string>& ModelNames();

// "RxC,RxC,...": weights w0, w1, ... INVALID_ARGUMENT "option '--shapes': ..." for an empty list,
// a malformed entry, C not a multiple of 16, or a side outside [1, 1048576].
absl::StatusOr<std::vector<WeightShape>> ParseShapes(const std::string& list);

uint64_t ParameterCount(const std::vector<WeightShape>& shapes);

enum class Optimizer { kSgd, kAdamW };
enum class StateDType { kF32, kBf16, kNvfp4 };

struct StepOptions {
  Optimizer optimizer = Optimizer::kSgd;  // plain SGD (no momentum, no weight decay)
  bool error_feedback = true;
  bool stochastic_rounding = false;           // false: round to nearest
  bool delayed_scaling = false;               // false: current scaling
  StateDType state_dtype = StateDType::kF32;  // AdamW's m and v, or SGD's momentum buffer
  float momentum = 0.0f;  // SGD: torch's momentum; > 0 keeps a momentum buffer (state_dtype)
  float lr = 1e-3f;
  uint64_t seed = 1;  // weight i gets seed + i (stochastic rounding)
};

const char* OptimizerName(Optimizer o);    // "sgd", "adamw"
const char* StateDTypeName(StateDType d);  // "f32", "bf16", "nvfp4"

// Bytes a step of the whole model moves at least, by part (each the sum of read + written).
struct FloorBytes {
  uint64_t codes = 0;            // E2M1 codes, 0.5 B read + 0.5 B written per parameter
  uint64_t scales = 0;           // E4M3 block scales, 1/16 B read + 1/16 B written
  uint64_t gradient = 0;         // bf16 gradient read: 2 B
  uint64_t dequantized = 0;      // bf16 DQ(W) written: 2 B
  uint64_t residual = 0;         // f32 residual read + written: 8 B (error feedback only)
  uint64_t optimizer_state = 0;  // SGD's momentum buffer read + written (f32 8 B, bf16 4 B,
                                 // nvfp4 2 x 0.5625 B); AdamW m and v: f32 16 B, bf16 8 B,
                                 // nvfp4 2.25 B (codes + scales of each, both directions)
  uint64_t total() const {
    return codes + scales + gradient + dequantized + residual + optimizer_state;
  }
};
FloorBytes FloorFor(const std::vector<WeightShape>& shapes, const StepOptions& options);
// total() / ParameterCount (0 for no parameters). SGD RTN + EF: 13.125; without EF 5.125;
// AdamW adds 16 (f32), 8 (bf16) or 2.25 (nvfp4).
double FloorBytesPerParameter(const std::vector<WeightShape>& shapes, const StepOptions& options);

// Server state the weights hold, estimated (codes, scales, residual, optimizer state; the
// per-weight records left out): for the hint when CreateWeight runs out of budget.
uint64_t EstimatedStateBytes(const std::vector<WeightShape>& shapes, const StepOptions& options);
// The second copy one-pass steps keep of each weight (StepRequest.one_pass): codes, scales, its
// 8-byte record and 32 bytes of statistics, and the residual with error feedback.
uint64_t OnePassCopyBytes(const std::vector<WeightShape>& shapes, const StepOptions& options);

// Where each weight's bf16 slice lies in a buffer holding all of them back to back.
struct Layout {
  std::vector<uint64_t> offsets;  // per weight, multiples of `align`
  uint64_t total_bytes = 0;       // end of the last slice
};
// `align` is a power of two >= 16 (the service's region offset rule).
Layout PackBf16(const std::vector<WeightShape>& shapes, uint64_t align);

// CreateWeight for weight `index`: bf16 `initial` (its data left for the caller to set:
// a region slice or inline bytes), NVFP4 1x16, the options' rounding, scaling, error feedback
// and optimizer state, DQ(W) in bf16, on `device_uuid` (empty: the server's choice).
v1::CreateWeightRequest CreateRequest(const WeightShape& shape, size_t index,
                                      const StepOptions& options, const std::string& device_uuid);

// One step of every weight: item i updates shapes[i] with the bf16 gradient at
// grads + layout.offsets[i] and writes DQ(W) to params + layout.offsets[i]; one group with
// the options' lr (AdamW: torch's defaults beta1 0.9, beta2 0.999, eps 1e-8, weight decay
// 0.01). The caller sets the step number.
v1::StepRequest BuildStepRequest(const std::vector<WeightShape>& shapes, const Layout& layout,
                                 const v1::RegionSlice& grads, const v1::RegionSlice& params,
                                 const StepOptions& options);

// Samples (microseconds): nearest-rank percentiles (p(q) is the sample of rank ceil(q * n)).
struct SampleStats {
  uint64_t count = 0;
  double p50 = 0, p90 = 0, min = 0, max = 0, mean = 0;
};
SampleStats Describe(std::vector<double> samples);

// Bytes moved in `micros` microseconds, in GB/s (1e9 bytes per second); 0 when micros <= 0.
double GigabytesPerSecond(uint64_t bytes, double micros);

struct Report {
  std::string server, transport, backend, server_version, host, cuda_runtime;
  // The server's GPUs as (uuid, name), and the GPU of the buffers (GPU 0 here).
  std::vector<std::pair<std::string, std::string>> gpus;
  std::string device_uuid;

  std::string model;  // "gpt2-small", ..., "custom" (--shapes)
  int layers = 0;     // llama3-8b only, else 0
  uint64_t weights = 0, parameters = 0;
  StepOptions options;
  std::string init;  // "ipc" or "inline"
  uint64_t align = 16;
  std::optional<uint64_t> spin_us;  // unset: the client's automatic spin
  // FastSocketStats over every step
  uint64_t polled = 0, polled_then_slept = 0, replied_before_spin = 0;
  uint64_t heads_ups = 0;  // FastSocketStats::heads_ups over every step
  uint64_t gap_us = 0;     // --gap-us
  bool plan = false;  // the steps named a server step plan (--plan)
  bool one_pass = false;  // the steps ran in one pass (--one-pass)
  uint64_t iters = 0, warmup = 0;
  FloorBytes floor;
  uint64_t state_bytes = 0;  // sum of CreateWeight's WeightInfo.bytes
  double setup_s = 0;
  SampleStats wall, kernel, queue, server_time, overhead, client_side;  // microseconds

  std::optional<double> copy_bandwidth_gbps;  // --copy-bandwidth
};
// One JSON object (`fp4q bench-step --help` lists the fields).
std::string ReportJson(const Report& r);

}  // namespace fp4q::client::cli::bench_step

#endif  // FP4Q_CLIENT_CLI_BENCH_STEP_H_
