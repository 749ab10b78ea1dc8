// The CUDA backend: Backend (fp4q/kernels/backend.h) on one GPU. Built into libfp4q_cuda.so and
// created through the module's C ABI (cuda_module.h).
//
// - Every method first makes the backend's device current on the calling thread, then fails with
//   the poisoning error if the backend is poisoned (Healthy()).
// - Streams: the `Stream` argument is a cudaStream_t; nullptr means the backend's own
//   non-blocking stream. Work is asynchronous; Synchronize(stream) waits and reports errors.
// - A sticky CUDA error (illegal address and kin) seen by any call poisons the backend for good.
// - Temporaries (staging copies, GEMM workspaces, scratch) come from the device's stream-ordered
//   memory pool (its release threshold is raised so they stay cached).
// - Numerics are bit-identical to the CPU reference (Matmul: within its stated tolerance, see
//   cuda_matmul.cc); the kernels live in *.cu files behind launch.h.
#ifndef FP4Q_KERNELS_SRC_CUDA_CUDA_BACKEND_H_
#define FP4Q_KERNELS_SRC_CUDA_CUDA_BACKEND_H_

#include <cuda_runtime.h>

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "cuda/blas_lt.h"
#include "cuda/kernel_choice.h"
#include "fp4q/kernels/backend.h"

namespace fp4q::kernels::cuda {

class CudaBackend final : public Backend {
 public:
  // A backend on device `ordinal` (creates its stream and cuBLASLt handle); `tuning` steers
  // the choice of row-wise quantize kernels (kernel_choice.h).
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(int ordinal,
                                                             const KernelTuning& tuning = {});
  ~CudaBackend() override;

  DeviceInfo Info() const override { return info_; }

  absl::StatusOr<void*> Allocate(size_t bytes) override;
  void Free(void* ptr) override;
  absl::Status CopyFromHost(void* dst, const void* src, size_t bytes, Stream stream) override;
  absl::Status CopyToHost(void* dst, const void* src, size_t bytes, Stream stream) override;
  absl::Status CopyDeviceToDevice(void* dst, const void* src, size_t bytes,
                                  Stream stream) override;
  absl::Status Memset(void* dst, int value, size_t bytes, Stream stream) override;
  absl::Status Synchronize(Stream stream) override;
  absl::StatusOr<Stream> CreateStream() override;
  void DestroyStream(Stream stream) override;
  absl::Status Healthy() const override;

  // Device-side signals (stream_signals.cc): cuStreamWaitValue32 / cuStreamWriteValue32 through
  // the runtime's driver entry points (this module does not link libcuda), probed once at
  // creation on the backend's side stream: off where a launch queued behind an unwritten wait
  // blocks the launching thread (a tool serializing launches; see LaunchesBlockBehindWaits).
  bool DeviceSignals() const override { return signals_.wait != nullptr; }
  absl::Status WaitValue32(const void* at, uint32_t value, Stream stream) override;
  absl::Status WriteValue32(void* at, uint32_t value, Stream stream) override;
  absl::StatusOr<uint32_t> ReadValue32Now(const void* at) override;
  absl::Status WriteValue32Now(void* at, uint32_t value) override;

  absl::StatusOr<void*> OpenIpcHandle(const std::string& ipc_handle) override;
  absl::Status CloseIpcHandle(void* base) override;
  absl::StatusOr<size_t> IpcMappingSize(void* base) const override;

 protected:
  absl::Status DoAmax(const ConstTensor& x, float* amax, int64_t* first_nonfinite,
                      Stream stream) override;
  absl::Status DoQuantize(const ConstTensor& x, const QuantizeOptions& options, float* residual,
                          const QuantizedTensor* rowwise, const QuantizedTensor* columnwise,
                          FiniteGuard* guard, Stream stream) override;
  absl::Status DoDequantize(const ConstQuantizedTensor& q, const MutTensor& out,
                            Stream stream) override;
  absl::Status DoQdq(const ConstTensor& x, const QuantizeOptions& options, float* residual,
                     const MutTensor& out, FiniteGuard* guard, Stream stream) override;
  absl::Status DoMatmul(const ConstQuantizedTensor& a, const ConstQuantizedTensor& b,
                        const MutTensor& c, Stream stream) override;
  absl::Status DoStepCheck(const std::vector<StepItem>& items, void* workspace,
                           Stream stream, const StepCancel& cancel) override;
  absl::Status DoStepApply(const std::vector<StepItem>& items, void* workspace,
                           Stream stream) override;
  absl::Status DoStepReadReport(const std::vector<StepItem>& items, const void* workspace,
                                StepReport* report, Stream stream) override;
  absl::Status DoStepCheckAndApply(const std::vector<StepItem>& items, void* workspace,
                                   Stream stream, const StepCancel& cancel) override;
  absl::Status DoRht(const ConstTensor& in, RhtMode mode, uint64_t rht_seed, bool inverse,
                     const MutTensor& out, Stream stream) override;

 private:
  CudaBackend(int ordinal, cudaStream_t stream, DeviceInfo info, std::unique_ptr<BlasLt> blas,
              const KernelTuning& tuning)
      : ordinal_(ordinal),
        stream_(stream),
        info_(std::move(info)),
        blas_(std::move(blas)),
        tuning_(tuning) {}

  // Makes the device current and checks the poison flag. Every entry point calls it first.
  absl::Status Enter() const;
  cudaStream_t Resolve(Stream s) const {
    return s == nullptr ? stream_ : static_cast<cudaStream_t>(s);
  }
  // Records `s` as the poisoning error when it came from a sticky CUDA error; returns `s`.
  absl::Status Track(absl::Status s) const;
  // Checks the stream's pending launch errors after a sequence of launches.
  absl::Status AfterLaunches(cudaStream_t stream) const;

  // Numerics bodies (cuda_ops.cc, cuda_matmul.cc, cuda_step.cc); wrapped by the Do* methods
  // with Track().
  absl::Status QuantizeImpl(const ConstTensor& x, const QuantizeOptions& options,
                            float* residual, const QuantizedTensor* rowwise,
                            const QuantizedTensor* columnwise, FiniteGuard* guard,
                            cudaStream_t stream);
  absl::Status QdqImpl(const ConstTensor& x, const QuantizeOptions& options, float* residual,
                       const MutTensor& out, FiniteGuard* guard, cudaStream_t stream);
  absl::Status MatmulImpl(const ConstQuantizedTensor& a, const ConstQuantizedTensor& b,
                          const MutTensor& c, cudaStream_t stream);
  absl::Status StepCheckImpl(const std::vector<StepItem>& items, void* workspace,
                             cudaStream_t stream, const StepCancel& cancel);
  // `n` zeroed split tickets for a kernel on `stream` that puts them back to zero (the small-M
  // GEMM): one array per stream, kept and grown (stream-ordered) across calls, so no launch
  // zeroes them. Null for n == 0.
  absl::StatusOr<int*> SplitTickets(cudaStream_t stream, int64_t n);
  // Resolves the stream memory operations and checks that they run (stream_signals.cc); on
  // any failure the backend has no device-side signals.
  void ProbeSignals();
  absl::Status StepApplyImpl(const std::vector<StepItem>& items, void* workspace,
                             cudaStream_t stream);
  // Both, with the batch's item table and launch list built once.
  absl::Status StepCheckAndApplyImpl(const std::vector<StepItem>& items, void* workspace,
                                     cudaStream_t stream, const StepCancel& cancel);
  absl::Status StepReadReportImpl(const std::vector<StepItem>& items, const void* workspace,
                                  StepReport* report, cudaStream_t stream);

  const int ordinal_;
  const cudaStream_t stream_;
  const DeviceInfo info_;
  const std::unique_ptr<BlasLt> blas_;
  const KernelTuning tuning_;

  // Stream memory operations (null: not available) and the side stream the *Now calls use,
  // with its pinned word.
  struct Signals {
    void* wait = nullptr;   // PFN_cuStreamWaitValue32_v11070
    void* write = nullptr;  // PFN_cuStreamWriteValue32_v11070
  };
  Signals signals_;
  absl::Mutex side_mu_;
  cudaStream_t side_stream_ ABSL_GUARDED_BY(side_mu_) = nullptr;
  uint32_t* side_word_ ABSL_GUARDED_BY(side_mu_) = nullptr;  // pinned host memory

  struct Tickets {
    int* p = nullptr;
    int64_t n = 0;
    // Smaller arrays this one replaced: another thread may still launch with one (it asked
    // before the growth), so they are freed only with the stream or the backend.
    std::vector<int*> retired;
  };
  absl::Mutex tickets_mu_;
  std::map<cudaStream_t, Tickets> tickets_ ABSL_GUARDED_BY(tickets_mu_);

  mutable absl::Mutex mu_;
  mutable absl::Status poison_ ABSL_GUARDED_BY(mu_);
  std::set<void*> ipc_bases_ ABSL_GUARDED_BY(mu_);
};

}  // namespace fp4q::kernels::cuda

#endif  // FP4Q_KERNELS_SRC_CUDA_CUDA_BACKEND_H_
