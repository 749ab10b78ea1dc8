// The fp4q engine: everything fp4qd does, without any transport. The gRPC adapter
// (grpc_service.h) is a thin layer over this class; tests drive it directly.
//
// Threading and completion
// - Operations that touch tensors or state run on the executor of the device that holds what
//   they use (the region's GPU, the weight's or residual's device, else the least busy
//   device). The calling thread only routes: it pins regions and looks names up, never waits.
//   `done` runs exactly once, on an executor thread, or on the calling thread when the request
//   is refused up front (draining, queue full, unknown region, ...).
// - Session/region bookkeeping that may wait (unregister, close, checkpoint) runs on a small
//   control executor; ListTensors, ServerInfo, OpenSession and KeepAlive answer at once.
// Errors
// - Every input is validated before any state changes; INVALID_ARGUMENT names the request field
//   as fp4q.v1 spells it (e.g. "input.shape[1]: 40 is not a multiple of 16").
// - NOT_FOUND: unknown weight, residual, region (another session's region reads exactly like an
//   unknown one) or session. RESOURCE_EXHAUSTED: state budget, queue bound, handle cap.
//   FAILED_PRECONDITION: older step, mode unavailable. ALREADY_EXISTS: name taken, or a
//   Quantize/QDQ residual step already applied. UNAVAILABLE: draining.
// - Requests that change stored state (CreateWeight, UpdateWeight, residual_key) refuse
//   non-finite input values (INVALID_ARGUMENT); stateless requests quantize NaN/Inf exactly as
//   docs/NUMERICS.md defines.
// Steps
// - UpdateWeight steps strictly increase per weight: a repeated step is answered applied=false
//   (and nothing changes), an older one FAILED_PRECONDITION. Residual keys likewise, with
//   ALREADY_EXISTS for a repeated step (QdqReply has no applied flag).
#ifndef FP4Q_SERVER_ENGINE_H_
#define FP4Q_SERVER_ENGINE_H_

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/checkpoint.h"
#include "server/devices.h"
#include "server/executor.h"
#include "server/logging.h"
#include "server/observer.h"
#include "server/regions.h"
#include "server/requests.h"
#include "server/scratch_pool.h"
#include "server/state_store.h"
#include "server/step_plans.h"
#include "server/step_job.h"

namespace fp4q::server {

class OpEnv;
struct Operand;


struct EngineOptions {
  uint64_t state_budget_bytes = uint64_t{4} << 30;
  int max_queue_depth = 64;  // per device
  int cpu_workers = 0;       // CPU backend worker threads; 0 = hardware threads
  // Workers per GPU, each with its own CUDA stream, so requests on one GPU overlap (>= 1).
  // Requests touching the same state name still run one at a time, in arrival order.
  int streams_per_gpu = 4;
  // An idle device worker busy-polls this long for new work before sleeping (Executor::Options::
  // spin; one worker per device at a time). Zero: always sleep. Unset: automatic on GPUs
  // (spin_policy.h), never on the CPU backend, whose workers run the kernels on those cores.
  std::optional<absl::Duration> worker_spin = absl::ZeroDuration();
  // A request whose transport allows it (RequestContext::run_inline_when_idle) runs on the
  // transport's thread when its device has nothing queued or running (Executor's "Running on
  // the caller's thread"), on a stream of its own per GPU: no worker wake-up after an idle gap.
  // fp4qd's --idle_inline.
  bool idle_inline = true;
  // Request scratch buffers kept cached per device (ScratchPool); 0: none.
  uint64_t scratch_cache_bytes = uint64_t{256} << 20;
  int max_open_handles = 1024;
  absl::Duration session_lease = absl::Seconds(30);
  bool allow_cuda_ipc = false;
  // With allow_cuda_ipc: also accept RegisterCudaRegion from peers that did not come over the
  // Unix socket (PeerInfo::Transport::kUnix). Off: such calls are PERMISSION_DENIED.
  bool cuda_ipc_over_tcp = false;
  std::string state_dir;                                      // empty: no persistence
  absl::Duration checkpoint_interval = absl::ZeroDuration();  // zero: none periodic
  // Quality metrics on 1 in N Quantize requests (the first one too; at most ~1 Mi elements of
  // each, a prefix of whole rows); 0: off.
  int quality_sample_every = 16;
  std::string version = "0.1.0";
  absl::Duration maintenance_period = absl::Seconds(1);
  std::function<absl::Time()> clock;  // sessions' clock (tests); absl::Now when empty
  int max_step_items = 4096;   // items in one Step
  int max_step_plans = 16;     // step plans a session keeps (StepRequest.keep_plan)
  int max_world_size = 64;     // ranks in one replica group
  // The longest a step polls its ready signal (StepRequest.ready_signal; a request's own
  // timeout may be shorter), and the wait of a request that gives none. 1 ms - 60 s.
  absl::Duration step_ready_timeout = absl::Seconds(5);
  // A step on one device whose backend has device-side signals (Backend::DeviceSignals) is
  // queued behind device-side waits for its ready signals and writes its done signals from the
  // device (RunStepOnDeviceSignals). Off: the host polls and writes them.
  bool step_device_signals = true;
  // CPU backend: requests whose estimated multiply-adds pass this are RESOURCE_EXHAUSTED up
  // front (0: no limit).
  uint64_t cpu_max_request_flops = uint64_t{200000000000};
};

// UNAVAILABLE: the server is draining.
absl::Status DrainingStatus();

class Engine {
 public:
  // `observer` and `logger` may be null; not owned; they outlive the engine.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(std::unique_ptr<DeviceSet> devices,
                                                        EngineOptions options,
                                                        EngineObserver* observer, Logger* logger);
  ~Engine();  // Shutdown()
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Loads <state_dir>/fp4q-state.ckpt when state_dir is set and the file exists. DATA_LOSS when
  // the file is truncated or corrupt: then nothing at all is loaded. Call before serving.
  absl::Status Restore();
  // Starts the maintenance thread: session lease expiry, periodic checkpoints.
  void StartMaintenance();

  // ---- Tensor operations (asynchronous; see the header comment).
  void Quantize(const RequestContext& ctx, QuantizeRequest req, Done<QuantizeResult> done);
  void Dequantize(const RequestContext& ctx, DequantizeRequest req, Done<DequantizeResult> done);
  void Qdq(const RequestContext& ctx, QdqRequest req, Done<QdqResult> done);
  void Matmul(const RequestContext& ctx, MatmulRequest req, Done<MatmulResult> done);
  void UpdateWeight(const RequestContext& ctx, UpdateWeightRequest req,
                    Done<UpdateWeightResult> done);
  void CreateWeight(const RequestContext& ctx, CreateWeightRequest req,
                    Done<CreateWeightResult> done);
  void GetWeight(const RequestContext& ctx, GetWeightRequest req, Done<GetWeightResult> done);
  // Deletes a weight or a residual key.
  void DeleteWeight(const RequestContext& ctx, NameRequest req, Done<EmptyResult> done);
  // Zeroes a weight's residual (error feedback on) or a residual key.
  void ResetResidual(const RequestContext& ctx, NameRequest req, Done<EmptyResult> done);
  // FAILED_PRECONDITION without a state directory.
  void Checkpoint(const RequestContext& ctx, Done<CheckpointResult> done);
  // The trainer's step (fp4q.v1.StepRequest): every item of the step is checked on the device
  // before any is written, and applied as a unit; a replica-group contribution waits for the
  // group's other ranks (engine_groups.cc).
  void Step(const RequestContext& ctx, StepRequest req, Done<StepResult> done);
  // Replaces a weight's optimizer state with a zeroed one of `req.optimizer`.
  void ResetOptimizer(const RequestContext& ctx, ResetOptimizerRequest req,
                      Done<ResetOptimizerResult> done);
  // Replica groups (a session per rank) and namespaces.
  void JoinGroup(const RequestContext& ctx, JoinGroupRequest req, Done<JoinGroupResult> done);
  void LeaveGroup(const RequestContext& ctx, NameRequest req, Done<EmptyResult> done);
  // Deletes every weight, residual and group of the caller's namespace.
  void DeleteNamespace(const RequestContext& ctx, Done<DeleteNamespaceResult> done);

  // ---- Sessions and regions.
  // `ns`: the session's namespace (CheckNamespace rules); a caller whose token binds it to a
  // namespace may open sessions of that namespace only (PERMISSION_DENIED).
  absl::StatusOr<OpenSessionResult> OpenSession(const RequestContext& ctx,
                                                const std::string& client_name,
                                                const std::string& ns);
  // A session of the default namespace.
  absl::StatusOr<OpenSessionResult> OpenSession(const std::string& client_name) {
    return OpenSession(RequestContext{}, client_name, "");
  }
  absl::StatusOr<uint32_t> KeepAlive(const RequestContext& ctx);  // lease seconds
  void CloseSession(const RequestContext& ctx, Done<uint32_t> done);
  // With allow_cuda_ipc and without cuda_ipc_over_tcp, only callers whose ctx.peer came over
  // the Unix socket may register (PERMISSION_DENIED otherwise, before any field is looked at).
  void RegisterRegion(const RequestContext& ctx, RegisterRegionRequest req, Done<std::string> done);
  void UnregisterRegion(const RequestContext& ctx, std::string region_id, Done<EmptyResult> done);

  // ---- Inspection.
  // The state of the caller's namespace, names as the caller spells them.
  absl::StatusOr<std::vector<TensorListing>> ListTensors(const RequestContext& ctx);
  // The default namespace's state.
  absl::StatusOr<std::vector<TensorListing>> ListTensors() { return ListTensors(RequestContext{}); }
  // The namespace a request's names live in: its session's (NOT_FOUND for an unknown or
  // expired session), else the one its token binds, else the default namespace "".
  absl::StatusOr<std::string> ResolveNamespace(const RequestContext& ctx) const;
  // Lists "cuda_ipc" among supported_modes when a caller could register regions at all
  // (--allow_cuda_ipc on a CUDA backend); the adapter drops it for callers that
  // CudaIpcAllowedFor refuses, so each client sees what it may use.
  ServerInfoResult ServerInfo() const;
  // Whether RegisterRegion would accept a caller with this peer (allow_cuda_ipc, and the Unix
  // socket unless cuda_ipc_over_tcp).
  bool CudaIpcAllowedFor(const PeerInfo& peer) const;

  // ---- Lifecycle.
  // From now on new requests are refused with UNAVAILABLE.
  void BeginDrain();
  // Waits until no request is in flight; false on timeout.
  bool WaitIdle(absl::Duration timeout);
  // Answers queued, not yet started work with UNAVAILABLE (after a drain timeout); returns how
  // many requests were refused.
  int RejectQueued();
  // Writes a checkpoint now (blocking; FAILED_PRECONDITION without a state directory).
  absl::StatusOr<CheckpointStats> CheckpointNow();
  // Stops maintenance and executors (queued work still runs).
  void Shutdown();

  uint64_t epoch() const { return epoch_; }
  const std::string& backend_kind() const { return devices_->kind(); }
  int64_t in_flight() const { return in_flight_.load(); }
  // OK, or the sticky backend error that poisoned a device.
  absl::Status poisoned() const;
  // Called once, from an executor thread, when a device reports a sticky error.
  void SetPoisonHandler(std::function<void(const absl::Status&)> handler);

  // For tests.
  RegionManager& regions() { return *regions_; }
  const StepPlans& step_plans() const { return *plans_; }
  StateStore& store() { return *store_; }
  DeviceSet& devices() { return *devices_; }

 private:
  struct Route;
  template <typename Req, typename Res>
  struct Call;

  Engine(std::unique_ptr<DeviceSet> devices, EngineOptions options, EngineObserver* observer,
         Logger* logger);

  // Routes and queues one tensor operation; `route` lists what it touches, `body` runs on
  // the chosen device's executor.
  template <typename Req, typename Res>
  void Dispatch(const RequestContext& ctx, Req req, Done<Res> done,
                void (*route)(const Req&, Route*),
                absl::Status (Engine::*body)(OpEnv&, const Req&, Res*));
  // Runs `fn` on the control executor and answers `done` with its result (or the executor's
  // refusal). Control work (cleanup, checkpoints) is admitted while draining too.
  template <typename Res>
  void Control(const RequestContext& ctx, Done<Res> done, std::function<absl::StatusOr<Res>()> fn) {
    auto shared = std::make_shared<Done<Res>>(std::move(done));
    SubmitControl(
        ctx, [shared, fn = std::move(fn)] { (*shared)(fn()); },
        [shared](const absl::Status& s) { (*shared)(s); });
  }
  // Runs `work` on the control executor, or `refused` with why it did not run.
  void SubmitControl(const RequestContext& ctx, std::function<void()> work,
                     std::function<void(const absl::Status&)> refused);
  Executor& ExecutorFor(const Device& d) { return *executors_[d.index]; }
  void CheckHealth(Device& d);
  bool Admit();    // counts a request in flight unless draining
  void Release();  // the request finished
  Device* LeastStateDevice();

  // Operation bodies (ops_quantize.cc, ops_weights.cc).
  absl::Status RunQuantize(OpEnv& env, const QuantizeRequest& req, QuantizeResult* res);
  absl::Status RunDequantize(OpEnv& env, const DequantizeRequest& req, DequantizeResult* res);
  absl::Status RunQdq(OpEnv& env, const QdqRequest& req, QdqResult* res);
  absl::Status RunMatmul(OpEnv& env, const MatmulRequest& req, MatmulResult* res);
  absl::Status RunCreateWeight(OpEnv& env, const CreateWeightRequest& req, CreateWeightResult* res);
  absl::Status RunUpdateWeight(OpEnv& env, const UpdateWeightRequest& req, UpdateWeightResult* res);
  absl::Status RunGetWeight(OpEnv& env, const GetWeightRequest& req, GetWeightResult* res);
  absl::Status RunDeleteWeight(OpEnv& env, const NameRequest& req, EmptyResult* res);
  absl::Status RunResetResidual(OpEnv& env, const NameRequest& req, EmptyResult* res);
  absl::Status RunResetOptimizer(OpEnv& env, const ResetOptimizerRequest& req,
                                 ResetOptimizerResult* res);
  // The step (ops_step.cc): the items of `job` held on env's device; with `sync` (several
  // devices) it checks, meets the other parts, then applies.
  absl::Status RunStepPart(OpEnv& env, StepJob& job, const std::vector<size_t>& items,
                           StepPartSync* sync);
  // Whether the items of one device's part of a step run in one pass (StepRequest.one_pass;
  // ops_step.cc): every item a kernels::OnePassItem, and every weight's second copy there
  // (allocated here on first use). Sets each item's StepNext and returns "one_pass", or returns
  // why not (kOnePassOutcomes: "items", "budget", "memory").
  const char* PrepareOnePass(OpEnv& env, StepJob& job, const std::vector<size_t>& items,
                             std::vector<kernels::StepItem>* kitems);
  // PrepareOnePass's copies, item by item: "one_pass", or "budget" / "memory" at the first item
  // without one (the items before it keep their StepNext; PrepareOnePass clears them).
  const char* SetStepNext(OpEnv& env, StepJob& job, const std::vector<size_t>& items,
                          std::vector<kernels::StepItem>* kitems);
  // Routes a step to the device(s) holding its weights and answers its ranks (engine_step.cc).
  void StartStep(std::shared_ptr<StepJob> job);
  // Each rank's StepRequest.done_signal and ready_signal checked and pinned (nothing read or
  // written yet), or the error naming it; `devices`: how many devices the step's weights are on.
  absl::Status PinSignals(StepJob& job, size_t devices);
  // Polls each rank's ready signal until it holds its value (ops_step.cc); DEADLINE_EXCEEDED
  // naming it when its timeout or the request's deadline passes first. `side`: read each word
  // on the backend's side stream (env's stream is held by a device-side wait for it).
  absl::Status WaitReadySignals(OpEnv& env, const StepJob& job, bool side = false);
  // The step of one device whose backend has device-side signals (ops_step.cc): its kernels
  // queued behind device-side waits for the ready signals, the done signals written behind
  // them (`done_after_apply`), then the host watches the ready words, cancels and releases the
  // step past their timeout, and reads the report.
  absl::Status RunStepOnDeviceSignals(OpEnv& env, StepJob& job,
                                      const kernels::ValidatedStep& step, void* ws,
                                      size_t ws_bytes, bool done_after_apply,
                                      kernels::StepReport* report);
  // Writes them on env's stream after the step's device work (whatever its outcome).
  void WriteDoneSignals(OpEnv& env, StepJob& job);
  // Replica groups (engine_groups.cc).
  void Contribute(const RequestContext& ctx, StepRequest req, Done<StepResult> done);
  void FailRanks(std::vector<std::unique_ptr<StepJob::Rank>> ranks, const absl::Status& s);
  void GroupSessionEnded(const std::string& session_id);
  // StepRequest.keep_plan and plan_id: fills `req`'s items from its plan, or has `done` keep
  // them as one when the step is answered OK (engine_step.cc).
  absl::Status UseStepPlan(const RequestContext& ctx, StepRequest& req,
                           Done<StepResult>& done);
  void GroupDeadlineLoop();
  void DropEmptyGroupsLocked();
  // Ends every group of namespace `ns` (their pending steps fail); returns how many.
  uint32_t DropGroupsOf(const std::string& ns);

  // A Quantize/QDQ residual key: found (checked against shape and step) or created; returned
  // with its op_mu locked in *lock. `created` says whether it is new (not yet published).
  absl::StatusOr<std::shared_ptr<StateEntry>> ResidualFor(OpEnv& env, const std::string& key,
                                                          int64_t rows, int64_t cols, uint64_t step,
                                                          std::unique_lock<std::mutex>* lock,
                                                          bool* created);
  void SampleQuality(OpEnv& env, const kernels::ConstTensor& x, const kernels::QuantizedTensor& q);
  // Persistence (engine_persist.cc).
  absl::Status RestoreRecord(CheckpointRecord record);
  // The entry as a checkpoint record, copied under its lock on its device's executor (an
  // entry deleted meanwhile gives kind 0). The byte buffers of `reuse` (a record already
  // written) hold the copies: their memory is already mapped, so a checkpoint pays its page
  // faults once, not once per record.
  absl::StatusOr<CheckpointRecord> Snapshot(const std::shared_ptr<StateEntry>& entry,
                                            CheckpointRecord reuse = {});
  void MaintenanceLoop();

  const EngineOptions options_;
  EngineObserver* const observer_;
  Logger* const logger_;
  const uint64_t epoch_;
  std::unique_ptr<DeviceSet> devices_;
  std::unique_ptr<StateStore> store_;
  std::unique_ptr<RegionManager> regions_;
  std::unique_ptr<StepPlans> plans_;  // step plans per session (engine_step.cc)
  std::vector<std::unique_ptr<Executor>> executors_;  // one per device, same order
  // The workers' streams and the idle-inline stream, per device.
  std::vector<std::vector<kernels::Stream>> streams_;
  std::vector<std::unique_ptr<ScratchPool>> pools_;    // per device
  std::unique_ptr<Executor> control_;

  std::atomic<bool> draining_{false};
  std::atomic<int64_t> in_flight_{0};
  std::mutex idle_mu_;
  std::condition_variable idle_cv_;

  mutable std::mutex poison_mu_;
  absl::Status poisoned_;
  std::function<void(const absl::Status&)> poison_handler_;

  std::atomic<uint64_t> quantize_count_{0};
  // StepCancel tokens of steps queued behind device-side ready waits (RunStepOnDeviceSignals).
  std::atomic<uint64_t> next_cancel_token_{1};
  // Bytes after a step's workspace for its cancellation word (one 16-byte slot).
  static constexpr size_t kCancelWordBytes = 16;
  static constexpr size_t CancelWordOffset(size_t ws_bytes) { return (ws_bytes + 15) / 16 * 16; }
  std::atomic<bool> quality_running_{false};  // a quality sample is being computed
  std::mutex checkpoint_mu_;  // one checkpoint at a time

  std::mutex maintenance_mu_;
  std::condition_variable maintenance_cv_;
  bool stop_maintenance_ = false;
  std::thread maintenance_;

  std::mutex step_order_mu_;  // queues the parts of a multi-device step together
  std::mutex groups_mu_;
  std::condition_variable groups_cv_;
  std::map<std::string, std::unique_ptr<ReplicaGroup>, std::less<>> groups_;  // key ns|name
  bool stop_groups_ = false;  // groups_mu_
  std::thread groups_thread_;
};

}  // namespace fp4q::server

#endif  // FP4Q_SERVER_ENGINE_H_
