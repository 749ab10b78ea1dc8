// Requests and results of the fp4q engine: plain C++ structs, no protobuf.
//
// The transports' shared edge (proto_convert.cc, called by the op table of both the gRPC
// adapter and the fast socket) converts fp4q.v1 messages to and from these. Enum fields carry
// the kernels' own types (fp4q/kernels/types.h, step.h): the edge converts each proto enum once,
// answers an unknown value with INVALID_ARGUMENT naming the field path ("options.rounding:
// unknown value 7"), and fills in the proto's documented default where 0 / UNSPECIFIED means
// one. The engine validates everything else (shapes, combinations, names) itself.
//
// Ownership: `absl::string_view` fields point at the caller's bytes (the received message). The
// caller keeps them alive until the engine calls the completion callback.
#ifndef FP4Q_SERVER_REQUESTS_H_
#define FP4Q_SERVER_REQUESTS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "fp4q/kernels/step.h"
#include "fp4q/kernels/types.h"

namespace fp4q::server {

// An asynchronous operation's completion: called exactly once with the result or the error.
template <typename T>
using Done = std::function<void(absl::StatusOr<T>)>;

// What a listed state tensor is (fp4q.v1.TensorKind).
enum class TensorKind { kWeight, kResidual };

// Where a tensor's bytes are.
enum class Source { kNone, kInline, kRegion };

// A slice of a registered CUDA IPC region.
struct RegionSlice {
  std::string region_id;
  uint64_t offset = 0;
};

// Bytes given inline or by region (codes, scales).
struct BytesIn {
  Source source = Source::kNone;
  absl::string_view inline_data;
  RegionSlice region;
};

// A dense input tensor (fp4q.v1.Tensor).
struct TensorIn {
  kernels::DType dtype = kernels::DType::kF32;  // the edge refuses any other dtype
  std::vector<int64_t> shape;
  BytesIn data;
};

// Where an output goes: a region slice, or inline in the reply when unset.
struct OutputTarget {
  bool has_region = false;
  RegionSlice region;
};

// An output tensor. Exactly one of inline_data (non-empty) or region (in_region) holds it.
struct TensorResult {
  kernels::DType dtype = kernels::DType::kF32;
  std::vector<int64_t> shape;
  std::string inline_data;
  bool in_region = false;
  RegionSlice region;
};

// Output bytes (codes or scales) of a quantized result.
struct BytesResult {
  std::string inline_data;
  bool in_region = false;
  RegionSlice region;
};

// fp4q.v1.QuantOptions: the kernels' options with the proto's defaults filled in (format NVFP4,
// block 1x16 or 1x32 for MXFP4, RTN, no RHT, map-to-6, emax 256, plain scales, rceil, outputs
// row-wise), plus the server's error-feedback key. Combinations are the engine's to check.
struct QuantOptionsIn {
  kernels::QuantizeOptions quant;
  std::string residual_key;
};

// fp4q.v1.QuantizedTensor in a request (format NVFP4, block by format, plain: the defaults).
struct QuantizedIn {
  kernels::Format format = kernels::Format::kNvfp4;
  kernels::BlockShape block = kernels::BlockShape::k1x16;
  kernels::ScaleLayout scale_layout = kernels::ScaleLayout::kPlain;
  std::vector<int64_t> shape;
  float global_amax = 0.0f;
  float s_enc = 0.0f;
  BytesIn codes;
  BytesIn scales;
};

// fp4q.v1.DenseOperand: a dense tensor Matmul quantizes with `options`.
struct DenseOperandIn {
  TensorIn tensor;
  QuantOptionsIn options;
};

// fp4q.v1.QuantizedOperand: a quantized tensor, a server-held weight, or a dense tensor.
struct QuantizedOperandIn {
  bool is_weight = false;
  bool is_dense = false;
  bool is_set = false;  // false: no field was set
  std::string weight_name;
  QuantizedIn tensor;
  DenseOperandIn dense;
};

// fp4q.v1.QuantizedTensor in a result.
struct QuantizedResult {
  kernels::Format format = kernels::Format::kNvfp4;
  kernels::BlockShape block = kernels::BlockShape::k1x16;
  kernels::ScaleLayout scale_layout = kernels::ScaleLayout::kPlain;
  std::vector<int64_t> shape;
  float global_amax = 0.0f;
  float s_enc = 0.0f;
  BytesResult codes;
  BytesResult scales;
};

// What every result carries besides its payload (the adapter adds the epoch and backend).
struct ReplyMeta {
  std::string device_uuid;
  double kernel_micros = 0.0;
  double queue_micros = 0.0;        // waited in the device's executor queue
  bool ready_waited = false;        // a Step that waited for its ready signals,
  double ready_wait_micros = 0.0;   // and for how long (the longest of its parts)
  uint64_t processed_bytes = 0;     // tensor bytes read + written
  uint64_t processed_elements = 0;  // elements of the main tensor
};

// Who sent a request, as the transport saw it.
struct PeerInfo {
  enum class Transport {
    kUnknown,  // not said (in-process callers); treated like TCP by the CUDA IPC check
    kTcp,      // a TCP connection (--listen): the peer's identity is unknown
    kUnix,     // the Unix socket (--unix_socket): uid/pid checked with SO_PEERCRED
  };
  Transport transport = Transport::kUnknown;
  int64_t uid = -1;  // kUnix: the connecting process's uid and pid (at connect time)
  int64_t pid = -1;
};

// The context of one request, as the transport saw it.
struct RequestContext {
  absl::Time deadline = absl::InfiniteFuture();
  // Polled before work starts; may be empty. Must be callable from any thread.
  std::function<bool()> is_cancelled;
  std::string session_id;  // metadata "fp4q-session"; empty when absent
  PeerInfo peer;
  // The caller's token binds it to this namespace (call layer, --namespace_tokens_file).
  bool namespace_bound = false;
  std::string bound_namespace;
  // The namespace the request's names live in: resolved by the engine from the session (or the
  // bound namespace) before the request is routed. Transports leave it empty.
  std::string ns;
  // Bytes the transport can carry back in one reply (0: no limit): operations refuse inline
  // outputs that could not fit before they do the work.
  uint64_t reply_limit = 0;
  // The calling thread may run the request's device work itself when the device's executor is
  // idle (Executor::Submit), instead of waking a worker. Set by the fast socket, whose
  // connection thread would only wait for this reply (requests pipelined behind it are read
  // once it is done); the engine clears it for work split over several devices, whose parts
  // must run side by side.
  bool run_inline_when_idle = false;
};

// ---------------------------------------------------------------- operations

struct QuantizeRequest {
  TensorIn input;
  QuantOptionsIn options;
  OutputTarget rowwise_codes, rowwise_scales, columnwise_codes, columnwise_scales;
};
struct QuantizeResult {
  ReplyMeta meta;
  bool has_rowwise = false;
  QuantizedResult rowwise;
  bool has_columnwise = false;
  QuantizedResult columnwise;
};

struct DequantizeRequest {
  QuantizedOperandIn input;
  kernels::DType out_dtype = kernels::DType::kF32;  // UNSPECIFIED: F32
  OutputTarget out;
};
struct DequantizeResult {
  ReplyMeta meta;
  TensorResult output;
};

struct QdqRequest {
  TensorIn input;
  QuantOptionsIn options;
  std::optional<kernels::DType> out_dtype;  // UNSPECIFIED (unset): the input's dtype
  OutputTarget out;
};
struct QdqResult {
  ReplyMeta meta;
  TensorResult output;
  float global_amax = 0.0f;
};

struct MatmulRequest {
  QuantizedOperandIn a, b;
  kernels::DType out_dtype = kernels::DType::kF32;  // UNSPECIFIED: F32
  OutputTarget out;
};
struct MatmulResult {
  ReplyMeta meta;
  TensorResult output;
};

// fp4q.v1.OptimizerSpec, converted at the edge (proto_convert).
struct OptimizerSpecIn {
  bool set = false;  // the message was present
  kernels::OptimizerKind kind = kernels::OptimizerKind::kSgd;
  bool momentum = false;
  bool amsgrad = false;
  kernels::StateDType dtype = kernels::StateDType::kF32;
};

// fp4q.v1.WeightOptions with the defaults filled in (1x16, RTN, F32, current scaling). The
// engine refuses blocks stored weights do not use (1x32).
struct WeightOptionsIn {
  kernels::BlockShape block = kernels::BlockShape::k1x16;
  kernels::Rounding rounding = kernels::Rounding::kNearest;
  uint64_t seed = 0;
  bool error_feedback = false;
  kernels::DType dtype = kernels::DType::kF32;
  kernels::Scaling scaling = kernels::Scaling::kCurrent;
  OptimizerSpecIn optimizer;
};

struct WeightInfo {
  std::string name;
  std::vector<int64_t> shape;
  WeightOptionsIn options;
  int64_t last_step = 0;
  std::string device_uuid;
  uint64_t bytes = 0;
  int64_t optimizer_steps = 0;
};

struct CreateWeightRequest {
  std::string name;
  TensorIn initial;
  WeightOptionsIn options;
  int64_t step = 0;
  std::string device_uuid;
};
struct CreateWeightResult {
  ReplyMeta meta;
  WeightInfo weight;
};

struct UpdateWeightRequest {
  std::string name;
  int64_t step = 0;
  TensorIn update;
  float lr = 0.0f;
  kernels::UpdateKind kind = kernels::UpdateKind::kGradient;  // UNSPECIFIED: gradient
  OutputTarget dequantized_out;
  bool return_dequantized = false;
};
struct UpdateWeightResult {
  ReplyMeta meta;
  bool applied = false;
  int64_t last_step = 0;
  bool has_dequantized = false;
  TensorResult dequantized;
  float global_amax = 0.0f;
};

struct GetWeightRequest {
  std::string name;
  bool dequantized = false;
  std::optional<kernels::DType> out_dtype;  // UNSPECIFIED (unset): the weight's dtype
  bool quantized = false;
  bool residual = false;
  OutputTarget out;
  bool optimizer_state = false;
};
// One moment tensor as stored (GetWeight's optimizer_state).
struct MomentResult {
  std::string name;  // torch's state name: "momentum_buffer", "exp_avg", ...
  kernels::StateDType dtype = kernels::StateDType::kF32;
  TensorResult dense;         // F32 / BF16
  QuantizedResult quantized;  // NVFP4
};
struct GetWeightResult {
  ReplyMeta meta;
  WeightInfo weight;
  bool has_dequantized = false;
  TensorResult dequantized;
  bool has_quantized = false;
  QuantizedResult quantized;
  bool has_residual = false;
  TensorResult residual;
  bool has_optimizer_state = false;
  OptimizerSpecIn optimizer_spec;
  int64_t optimizer_steps = 0;
  std::vector<MomentResult> moments;
};

struct ResetOptimizerRequest {
  std::string name;
  OptimizerSpecIn optimizer;
};
struct ResetOptimizerResult {
  ReplyMeta meta;
  WeightInfo weight;
};

// ---------------------------------------------------------------- the trainer's step

// One parameter group's hyperparameters (fp4q.v1.Hyperparameters).
struct HyperIn {
  float lr = 0.0f;
  kernels::OptimizerKind optimizer = kernels::OptimizerKind::kSgd;
  bool has_sgd = false;  // the sgd message was set (else plain SGD)
  float momentum = 0.0f;
  float dampening = 0.0f;
  bool nesterov = false;
  float weight_decay = 0.0f;
  float beta1 = 0.0f;
  float beta2 = 0.0f;
  float eps = 0.0f;
};

struct StepItemIn {
  std::string name;
  TensorIn update;
  OutputTarget dequantized_out;
  bool return_dequantized = false;
  uint32_t group = 0;
};

struct StepRequest {
  int64_t step = 0;
  std::vector<HyperIn> groups;
  std::vector<StepItemIn> items;  // as sent; Items() is what the step updates
  // A planned step's items (plan_id): the kept plan's own, shared rather than copied into
  // `items` (Engine::UseStepPlan).
  std::shared_ptr<const std::vector<StepItemIn>> planned_items;
  const std::vector<StepItemIn>& Items() const {
    return planned_items != nullptr ? *planned_items : items;
  }
  kernels::UpdateKind kind = kernels::UpdateKind::kGradient;
  bool has_replica = false;
  std::string replica_group;
  uint32_t rank = 0;
  bool brief_reply = false;  // the reply counts the items instead of listing them
  bool has_done_signal = false;  // fp4q.v1.DoneSignal: `done_value` written at `done_signal`
  RegionSlice done_signal;
  uint32_t done_value = 0;
  bool has_ready_signal = false;  // fp4q.v1.ReadySignal: polled until it holds `ready_value`
  RegionSlice ready_signal;
  uint32_t ready_value = 0;
  uint32_t ready_timeout_ms = 0;  // 0: the server's
  bool keep_plan = false;  // keep the items as a step plan of the session (StepReply.plan_id)
  uint64_t plan_id = 0;    // nonzero: the items are this plan's (`items` empty)
  bool one_pass = false;   // apply in one pass where it can (fp4q.v1.StepRequest.one_pass)
};

struct StepItemResult {
  std::string name;
  bool applied = false;
  int64_t last_step = 0;
  float global_amax = 0.0f;
  bool has_dequantized = false;
  TensorResult dequantized;
};
struct StepResult {
  ReplyMeta meta;
  std::vector<StepItemResult> items;
  uint32_t world_size = 1;
  bool brief = false;  // the request's brief_reply: the reply carries applied_items only
  uint64_t plan_id = 0;  // keep_plan: the plan kept of the step's items
  bool one_pass = false;  // the step ran in one pass
  // Why (observer.h kOnePassOutcomes; fp4q.v1.StepReply.one_pass_outcome); empty when the
  // request did not ask for one pass.
  const char* one_pass_outcome = "";
};

// ---------------------------------------------------------------- replica groups, namespaces

struct JoinGroupRequest {
  std::string group;
  uint32_t world_size = 0;
  uint32_t rank = 0;
  uint32_t deadline_ms = 0;  // 0: 30000
};
struct JoinGroupResult {
  uint32_t members = 0;
};
struct DeleteNamespaceResult {
  uint32_t deleted = 0;
};

struct NameRequest {
  std::string name;
};
struct EmptyResult {
  ReplyMeta meta;
};

// The edge lists weights as DTYPE_U8 (their packed codes) and residuals as DTYPE_F32.
struct TensorListing {
  std::string name;
  TensorKind kind = TensorKind::kWeight;
  std::vector<int64_t> shape;
  uint64_t bytes = 0;
  std::string device_uuid;
  int64_t last_step = 0;
};

struct CheckpointResult {
  ReplyMeta meta;
  std::string file_name;  // inside the state directory; never a full path
  uint64_t bytes = 0;
  uint32_t tensors = 0;
};

struct OpenSessionResult {
  std::string session_id;
  uint32_t lease_seconds = 0;
  std::string ns;
};

struct RegisterRegionRequest {
  std::string ipc_handle;
  uint64_t size = 0;
  std::string device_uuid;
};

struct GpuListing {
  std::string uuid;
  std::string name;
  int cc_major = 0;
  int cc_minor = 0;
  uint64_t total_memory = 0;
  uint64_t state_bytes = 0;
};

struct ServerInfoResult {
  std::string version;
  std::string backend;
  std::vector<GpuListing> gpus;
  std::vector<std::string> supported_modes;
  uint64_t state_budget_bytes = 0;
  uint32_t max_queue_depth = 0;
  uint32_t max_open_handles = 0;
  uint32_t session_lease_seconds = 0;
  uint32_t max_step_items = 0;
  uint32_t max_step_plans = 0;
  uint32_t max_world_size = 0;
  uint64_t cpu_max_request_flops = 0;
};

}  // namespace fp4q::server

#endif  // FP4Q_SERVER_REQUESTS_H_
