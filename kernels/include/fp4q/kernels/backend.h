// The fp4q kernels backend: one interface, two implementations (CPU reference, CUDA).
//
// Contract
// - Every public entry point validates its arguments first (validate.h, shared by both
//   backends) and returns INVALID_ARGUMENT naming the field and the value on bad input, before
//   any byte is read or written. Then it calls the backend's Do* implementation.
// - Pointers in views belong to the backend's memory space (host for CPU, device for CUDA) and
//   are not owned. Outputs must not alias inputs unless a method says so.
// - `stream` is a cudaStream_t for the CUDA backend (nullptr = the backend's own stream) and is
//   ignored by the CPU backend. CUDA work is asynchronous: results are ready after
//   Synchronize(stream). The CPU backend completes before returning.
// - Bit-exactness: for the same inputs and options, both backends write the same bytes
//   (codes, scales, global record, residuals, dequantized values). Matmul is exact on the CPU
//   (NUMERICS 9) and within the documented tolerance on the GPU.
// - Thread safety: a backend object may be used from several threads at once, each with its
//   own stream.
#ifndef FP4Q_KERNELS_BACKEND_H_
#define FP4Q_KERNELS_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fp4q/kernels/step.h"
#include "fp4q/kernels/types.h"

namespace fp4q::kernels {

using Stream = void*;

// Identity of the device a backend runs on.
struct DeviceInfo {
  std::string backend;  // "cpu" or "cuda"
  int ordinal = -1;     // CUDA ordinal in this process (-1 for cpu).
  std::string uuid;     // "GPU-xxxxxxxx-..." for CUDA, "cpu" for cpu.
  std::string name;     // device name.
  int cc_major = 0;     // compute capability (0 for cpu).
  int cc_minor = 0;
  size_t total_memory = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual DeviceInfo Info() const = 0;

  // ---- Memory (in this backend's space). ----
  virtual absl::StatusOr<void*> Allocate(size_t bytes) = 0;
  virtual void Free(void* ptr) = 0;
  virtual absl::Status CopyFromHost(void* dst, const void* src, size_t bytes, Stream stream) = 0;
  virtual absl::Status CopyToHost(void* dst, const void* src, size_t bytes, Stream stream) = 0;
  virtual absl::Status CopyDeviceToDevice(void* dst, const void* src, size_t bytes,
                                          Stream stream) = 0;
  virtual absl::Status Memset(void* dst, int value, size_t bytes, Stream stream) = 0;
  virtual absl::Status Synchronize(Stream stream) = 0;

  // ---- Streams. ----
  // A new stream of this backend, owned by the caller, who destroys it with DestroyStream once
  // its work is done. Work on distinct streams may overlap. The CPU backend has no streams:
  // it returns nullptr (which every method accepts) and DestroyStream does nothing.
  virtual absl::StatusOr<Stream> CreateStream() { return Stream{nullptr}; }
  // Waits for the stream's work, then destroys it. Null: nothing.
  virtual void DestroyStream(Stream stream) { (void)stream; }

  // A sticky device error (illegal address and kin) poisons the backend: every later call fails
  // and Healthy() returns the error. Always OK for the CPU backend.
  virtual absl::Status Healthy() const = 0;

  // ---- CUDA IPC (FAILED_PRECONDITION on the CPU backend). ----
  // Opens a cudaIpcMemHandle_t (64 bytes) exported by another process; returns the mapped base.
  // INVALID_ARGUMENT messages name the argument "ipc_handle" (as the server's request does).
  virtual absl::StatusOr<void*> OpenIpcHandle(const std::string& ipc_handle) = 0;
  virtual absl::Status CloseIpcHandle(void* base) = 0;
  // Bytes of the exporting process's allocation that an open mapping covers, from `base`. The
  // server checks each region's declared size against it, so a client cannot make it touch
  // memory past its allocation. UNIMPLEMENTED where the backend cannot tell.
  virtual absl::StatusOr<size_t> IpcMappingSize(void* base) const {
    (void)base;
    return absl::UnimplementedError("IpcMappingSize: not available on this backend");
  }

  // ---- Device-side signals (32-bit words in backend memory, e.g. a worker's IPC region). ----
  // Whether the calls below run (CUDA stream memory operations, probed when the backend is
  // created; off where launches may be synchronous, CUDA_LAUNCH_BLOCKING=1 or a tool injected
  // such as compute-sanitizer or Nsight Compute, since a launch behind a wait would then block
  // its thread). False: each returns UNIMPLEMENTED, and a caller polls and writes such words
  // from the host.
  virtual bool DeviceSignals() const { return false; }
  // Queues on `stream` a wait, on the device, until the word at `at` holds `value` or a later
  // one modulo 2^32 ((int32_t)(word - value) >= 0); the stream's later work runs after it.
  virtual absl::Status WaitValue32(const void* at, uint32_t value, Stream stream);
  // Queues on `stream` a write of `value` to the word at `at`, after the stream's earlier work
  // and with a memory fence before it (what that work wrote is visible first).
  virtual absl::Status WriteValue32(void* at, uint32_t value, Stream stream);
  // Reads / writes the word now, on a stream of the backend's own that nothing else waits for,
  // and returns once done: for a host watching (or releasing) a wait queued on another stream.
  virtual absl::StatusOr<uint32_t> ReadValue32Now(const void* at);
  virtual absl::Status WriteValue32Now(void* at, uint32_t value);

  // ---- Numerics. ----

  // Global amax of `x` (NaN ignored), written to *amax (backend memory, one float). With
  // `first_nonfinite` (backend memory, one int64) the same pass also writes the row-major index
  // of the first NaN/Inf element of x there, or -1 when every element is finite.
  absl::Status Amax(const ConstTensor& x, float* amax, Stream stream,
                    int64_t* first_nonfinite = nullptr);

  // Quantizes x. Writes the requested outputs: `rowwise` (x along cols, shape [rows, cols]) and
  // `columnwise` (x^T along rows, shape [cols, rows]); each may be null when not requested by
  // `options`. With `residual` (f32 [rows, cols], may be null) runs one error-feedback step
  // (NUMERICS 5): v = x + r is quantized and r <- v - DQ(q) in place (row-wise output needed).
  // `guard` (backend memory, may be null; needs `residual`): state-changing quantization. The
  // backend first checks on the device that x, v and the results are finite (fused into the
  // amax pass when the amax is computed, else one extra read), writes the outcome to *guard,
  // and when the check fails writes no output and leaves `residual` unchanged.
  absl::Status Quantize(const ConstTensor& x, const QuantizeOptions& options, float* residual,
                        const QuantizedTensor* rowwise, const QuantizedTensor* columnwise,
                        Stream stream, FiniteGuard* guard = nullptr);

  // out = DQ(q) in out.dtype (NUMERICS 2 "Dequantize"); out has q's shape.
  absl::Status Dequantize(const ConstQuantizedTensor& q, const MutTensor& out, Stream stream);

  // out = DQ(Q(x)) (row-wise), with optional error feedback as in Quantize. out has x's shape
  // and may alias x when the dtypes match. `guard`: as in Quantize (then `out` is not written
  // either when the check fails).
  absl::Status Qdq(const ConstTensor& x, const QuantizeOptions& options, float* residual,
                   const MutTensor& out, Stream stream, FiniteGuard* guard = nullptr);

  // c = A * B^T; a is [M, K], b is [N, K], c is [M, N] (f32 or bf16). Formats must match.
  absl::Status Matmul(const ConstQuantizedTensor& a, const ConstQuantizedTensor& b,
                      const MutTensor& c, Stream stream);

  // Stored-weight update in place (NUMERICS 5): a one-item step (below) with plain SGD, current
  // scaling and no statistics, run to completion (synchronizes `stream`):
  //   d = DQ(W);  x = RN(d - RN(lr * u)) (kGradient) or RN(d + u) (kDelta)
  //   v = residual ? RN(x + r) : x;  W <- Q(v) with `options` (amax from v);  r <- RN(v - DQ(W))
  // `weight` is read and rewritten in place (row-wise, NVFP4). `update` has W's shape. When
  // `dequantized_out` is non-null the new DQ(W) is written there. A non-finite update or result
  // is INVALID_ARGUMENT and changes nothing.
  absl::Status UpdateWeight(const QuantizedTensor& weight, float* residual,
                            const ConstTensor& update, float lr, UpdateKind kind,
                            const QuantizeOptions& options, const MutTensor* dequantized_out,
                            Stream stream);

  // ---- The trainer's step (step.h). `workspace` is backend memory of at least
  // StepWorkspaceBytes(items) bytes, 16-byte aligned, kept by the caller from StepCheck to the
  // last StepReadReport of the batch. The same `items` are passed to all three.
  // Queues the check of the whole batch (validates every item first: INVALID_ARGUMENT names
  // "items[i].<field>"). `cancel` (step.h): refuse the batch when its word holds its token.
  absl::Status StepCheck(const std::vector<StepItem>& items, void* workspace,
                         size_t workspace_bytes, Stream stream, const StepCancel& cancel = {});
  // Queues the apply: every item's state is rewritten when the batch's check passed, nothing
  // is written otherwise (the flag is read on the device). Once per StepCheck: its plan (amaxes,
  // old scales) is of the state the check saw. FAILED_PRECONDITION on the CPU backend when no
  // check ran on `workspace`.
  absl::Status StepApply(const std::vector<StepItem>& items, void* workspace, Stream stream);
  // The same for items validated once (ValidatedStep::Check): nothing is validated again but
  // the workspace.
  absl::Status StepCheck(const ValidatedStep& step, void* workspace, size_t workspace_bytes,
                         Stream stream, const StepCancel& cancel = {});
  absl::Status StepApply(const ValidatedStep& step, void* workspace, Stream stream);
  // StepCheck then StepApply of the same batch on one stream, for a caller that applies right
  // after the check (one device). The CUDA backend builds the batch's item table and launch
  // list once for both. With a StepNext on every item it is a one-pass step (step.h): the new
  // state goes to StepNext, the report is the same (but for a cancelled step's: step.h
  // StepReport::cancelled), and a refused batch leaves each
  // dequantized output holding DQ(W) of its unchanged weight. StepCheck and StepApply refuse
  // one-pass items (FAILED_PRECONDITION).
  absl::Status StepCheckAndApply(const ValidatedStep& step, void* workspace,
                                 size_t workspace_bytes, Stream stream,
                                 const StepCancel& cancel = {});
  // Copies the batch's outcome to `report` (one small copy) and synchronizes the stream.
  absl::Status StepReadReport(const std::vector<StepItem>& items, const void* workspace,
                              StepReport* report, Stream stream);

  // 16-point random Hadamard transform along cols (inverse = false) or its inverse, NUMERICS 6.
  // out.dtype == in.dtype; out may alias in.
  absl::Status Rht(const ConstTensor& in, RhtMode mode, uint64_t rht_seed, bool inverse,
                   const MutTensor& out, Stream stream);

 protected:
  virtual absl::Status DoAmax(const ConstTensor& x, float* amax, int64_t* first_nonfinite,
                              Stream stream) = 0;
  virtual absl::Status DoQuantize(const ConstTensor& x, const QuantizeOptions& options,
                                  float* residual, const QuantizedTensor* rowwise,
                                  const QuantizedTensor* columnwise, FiniteGuard* guard,
                                  Stream stream) = 0;
  virtual absl::Status DoDequantize(const ConstQuantizedTensor& q, const MutTensor& out,
                                    Stream stream) = 0;
  virtual absl::Status DoQdq(const ConstTensor& x, const QuantizeOptions& options,
                             float* residual, const MutTensor& out, FiniteGuard* guard,
                             Stream stream) = 0;
  virtual absl::Status DoMatmul(const ConstQuantizedTensor& a, const ConstQuantizedTensor& b,
                                const MutTensor& c, Stream stream) = 0;
  virtual absl::Status DoStepCheck(const std::vector<StepItem>& items, void* workspace,
                                   Stream stream, const StepCancel& cancel) = 0;
  virtual absl::Status DoStepApply(const std::vector<StepItem>& items, void* workspace,
                                   Stream stream) = 0;
  virtual absl::Status DoStepReadReport(const std::vector<StepItem>& items,
                                        const void* workspace, StepReport* report,
                                        Stream stream) = 0;
  // Default: DoStepCheck, then DoStepApply when it succeeded; one-pass items (StepNext) are
  // UNIMPLEMENTED (a backend that runs them overrides this).
  virtual absl::Status DoStepCheckAndApply(const std::vector<StepItem>& items, void* workspace,
                                           Stream stream, const StepCancel& cancel);
  virtual absl::Status DoRht(const ConstTensor& in, RhtMode mode, uint64_t rht_seed,
                             bool inverse, const MutTensor& out, Stream stream) = 0;
};

// The exact CPU reference backend. Never fails for lack of a GPU.
std::unique_ptr<Backend> CreateCpuBackend();

}  // namespace fp4q::kernels

#endif  // FP4Q_KERNELS_BACKEND_H_
