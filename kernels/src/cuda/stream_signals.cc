// Device-side signals of the CUDA backend: a stream waits for, or writes, a 32-bit word in device
// memory (a worker's IPC region) without the host. These are the driver's stream memory
// operations (cuStreamWaitValue32 / cuStreamWriteValue32), reached through the runtime's driver
// entry points so that the module still links only the runtime. fp4qd uses them for a step's
// ready signals (its kernels queued behind the waits) and done signals (written behind them).
#include <cudaTypedefs.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cuda/cuda_backend.h"
#include "cuda/cuda_status.h"
#include "cuda/launch.h"
#include "cuda/step_launch.h"
#include "fp4q/common/status_macros.h"

namespace fp4q::kernels::cuda {
namespace {

// CU_STREAM_WAIT_VALUE_GEQ: (int32_t)(*addr - value) >= 0, the cyclic order of a step counter.
constexpr unsigned int kWaitGeq = CU_STREAM_WAIT_VALUE_GEQ;
// CU_STREAM_WRITE_VALUE_DEFAULT: a memory fence before the write.
constexpr unsigned int kWriteFenced = CU_STREAM_WRITE_VALUE_DEFAULT;

absl::Status DriverStatus(const char* what, int result) {
  if (result == CUDA_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": CUresult ", result));
}

using WaitFn = PFN_cuStreamWaitValue32_v11070;
using WriteFn = PFN_cuStreamWriteValue32_v11070;

void* EntryPoint(const char* symbol, int version = 12000) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t e =
      cudaGetDriverEntryPointByVersion(symbol, &fn, version, cudaEnableDefault, &found);
  if (e != cudaSuccess || found != cudaDriverEntryPointSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return fn;
}

// Loads every kernel of the CUDA module that holds `anchor` (one source file's kernels). With
// lazy loading (the default since CUDA 12.2) a kernel is loaded at its first launch, and
// loading waits for the device: a first launch queued behind a device-side wait would block
// its thread until the word is written. False when any driver call fails.
bool LoadModuleKernels(const void* anchor) {
  static const auto get_module =
      reinterpret_cast<PFN_cuFuncGetModule_v11000>(EntryPoint("cuFuncGetModule", 11000));
  static const auto count = reinterpret_cast<PFN_cuModuleGetFunctionCount_v12040>(
      EntryPoint("cuModuleGetFunctionCount", 12040));
  static const auto enumerate = reinterpret_cast<PFN_cuModuleEnumerateFunctions_v12040>(
      EntryPoint("cuModuleEnumerateFunctions", 12040));
  static const auto load =
      reinterpret_cast<PFN_cuFuncLoad_v12040>(EntryPoint("cuFuncLoad", 12040));
  if (get_module == nullptr || count == nullptr || enumerate == nullptr || load == nullptr) {
    return false;
  }
  cudaFunction_t f = nullptr;
  if (cudaGetFuncBySymbol(&f, anchor) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  CUmodule module = nullptr;
  unsigned int n = 0;
  if (get_module(&module, f) != CUDA_SUCCESS || count(&n, module) != CUDA_SUCCESS) return false;
  std::vector<CUfunction> functions(n);
  if (n > 0 && enumerate(functions.data(), n, module) != CUDA_SUCCESS) return false;
  for (CUfunction fn : functions) {
    if (load(fn) != CUDA_SUCCESS) return false;
  }
  return true;
}

// Every kernel a step on device-side signals may launch behind its waits (cuda_step.cc's
// launches, the probe's no-op).
bool LoadStepKernels() {
  for (const void* anchor : {StepCheckModule(), StepCheckLeanModule(), StepApplySgdModule(),
                             StepApplyAdamWModule(), ElementwiseModule()}) {
    if (!LoadModuleKernels(anchor)) return false;
  }
  return true;
}

// The library's other kernels (quantizers, GEMMs): not needed by a step, but while a step waits
// for its ready word on one stream, the first launch of a kernel not yet loaded blocks its
// thread on any stream (measured on the H200: bench/results/h200-step/timeline/probe/).
void LoadOtherKernels() {
  for (const void* anchor : {MatmulMidMModule(), MatmulSmallMModule(), MatmulWgmmaModule(),
                             QuantizeLanePairsModule(), QuantizeLanesModule(), QuantizeRowsModule(),
                             QuantizeTileModule()}) {
    if (!LoadModuleKernels(anchor)) {
      std::fprintf(stderr, "fp4q CUDA backend: a module's kernels could not be loaded at "
                           "start-up; their first use may wait for a step's ready word\n");
      return;
    }
  }
}

// Whether the environment says launches may be synchronous here: CUDA_LAUNCH_BLOCKING=1, or a
// tool injected into the process (CUDA_INJECTION64_PATH, or a sanitizer preloaded). A launch
// queued behind a device-side wait would then block the launching thread until the word is
// written, and the host could not time the wait out.
bool EnvironmentSaysLaunchesBlock() {
  const char* blocking = std::getenv("CUDA_LAUNCH_BLOCKING");
  const char* injection = std::getenv("CUDA_INJECTION64_PATH");
  const char* preload = std::getenv("LD_PRELOAD");
  return (blocking != nullptr && std::string(blocking) == "1") ||
         (injection != nullptr && injection[0] != '\0') ||
         (preload != nullptr && std::string(preload).find("sanitizer") != std::string::npos);
}

// How long a launch behind an unwritten wait may take before the probe calls it blocked, and
// when the probe's helper thread writes the word if the launch has not returned.
constexpr absl::Duration kBlockedAfter = absl::Milliseconds(250);
constexpr absl::Duration kReleaseAfter = absl::Milliseconds(500);

// Whether a launch queued behind an unmet device-side wait blocks the launching thread, seen by
// trying it: some tools serialize launches without a trace in the environment
// (compute-sanitizer's memcheck among them). The word is mapped pinned host memory, so a helper
// thread can release the wait with a plain store, no CUDA call (a tool that blocks one thread's
// launch may hold every other thread's calls too). A blocked launch returns when the helper
// writes the word, after kReleaseAfter; any failure counts as blocking.
bool LaunchesBlockBehindWaits(WaitFn wait, cudaStream_t side) {
  uint32_t* word = nullptr;
  if (cudaHostAlloc(reinterpret_cast<void**>(&word), 16, cudaHostAllocMapped) != cudaSuccess) {
    cudaGetLastError();
    return true;
  }
  bool blocked = true;
  void* on_device = nullptr;
  if (cudaHostGetDevicePointer(&on_device, word, 0) == cudaSuccess) {
    __atomic_store_n(word, 0u, __ATOMIC_RELEASE);
    absl::Notification queued;
    std::thread release([&] {
      queued.WaitForNotificationWithTimeout(kReleaseAfter);
      __atomic_store_n(word, 1u, __ATOMIC_RELEASE);
    });
    const absl::Time start = absl::Now();
    const bool launched =
        wait(side, reinterpret_cast<CUdeviceptr>(on_device), 1, kWaitGeq) == CUDA_SUCCESS &&
        LaunchNoOp(side) == cudaSuccess;
    const absl::Duration took = absl::Now() - start;
    queued.Notify();
    release.join();
    const bool drained = cudaStreamSynchronize(side) == cudaSuccess;
    blocked = !launched || !drained || took >= kBlockedAfter;
  }
  cudaFreeHost(word);
  cudaGetLastError();
  return blocked;
}

}  // namespace

void CudaBackend::ProbeSignals() {
  // Why the signals stay off, on fp4qd's stderr (its start-up line says only which).
  const auto off = [&](const char* why) {
    std::fprintf(stderr, "fp4q CUDA backend %s: device-side step signals off: %s\n",
                 info_.uuid.c_str(), why);
  };
  if (EnvironmentSaysLaunchesBlock()) {
    off("the environment says launches may block (CUDA_LAUNCH_BLOCKING, an injected tool)");
    return;
  }
  Signals found;
  found.wait = EntryPoint("cuStreamWaitValue32");
  found.write = EntryPoint("cuStreamWriteValue32");
  if (found.wait == nullptr || found.write == nullptr || !Enter().ok()) {
    off("the driver has no cuStreamWaitValue32 / cuStreamWriteValue32");
    return;
  }
  absl::MutexLock lock(&side_mu_);
  cudaStream_t side = nullptr;
  uint32_t* pinned = nullptr;
  void* word = nullptr;
  bool ok = cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking) == cudaSuccess &&
            cudaHostAlloc(reinterpret_cast<void**>(&pinned), 16, cudaHostAllocPortable) ==
                cudaSuccess &&
            cudaMalloc(&word, 16) == cudaSuccess &&
            cudaMemsetAsync(word, 0, 16, side) == cudaSuccess;
  // The probe: a write then a wait for it on the side stream, then the word read back.
  const auto at = reinterpret_cast<CUdeviceptr>(word);
  ok = ok && reinterpret_cast<WriteFn>(found.write)(side, at, 7, kWriteFenced) == CUDA_SUCCESS &&
       reinterpret_cast<WaitFn>(found.wait)(side, at, 7, kWaitGeq) == CUDA_SUCCESS &&
       cudaMemcpyAsync(pinned, word, 4, cudaMemcpyDeviceToHost, side) == cudaSuccess &&
       cudaStreamSynchronize(side) == cudaSuccess && *pinned == 7;
  if (word != nullptr) cudaFree(word);
  cudaGetLastError();  // a failed probe is not an error of anyone's later call
  // Then the step's kernels loaded, and whether a launch behind a wait returns at once, as
  // fp4qd's steps need (the host times the wait out and cancels it).
  const char* why = ok ? nullptr : "a write then a wait on a side stream did not work";
  if (why == nullptr && !LoadStepKernels()) why = "the step's kernels could not be loaded";
  if (why == nullptr) LoadOtherKernels();
  if (why == nullptr && LaunchesBlockBehindWaits(reinterpret_cast<WaitFn>(found.wait), side)) {
    why = "a launch behind an unwritten wait blocked the launching thread";
  }
  if (why != nullptr) {
    off(why);
    if (side != nullptr) cudaStreamDestroy(side);
    if (pinned != nullptr) cudaFreeHost(pinned);
    return;
  }
  side_stream_ = side;
  side_word_ = pinned;
  signals_ = found;
}

absl::Status CudaBackend::WaitValue32(const void* at, uint32_t value, Stream stream) {
  if (signals_.wait == nullptr) return Backend::WaitValue32(at, value, stream);
  if (at == nullptr) return absl::InvalidArgumentError("at: null");
  FP4Q_RETURN_IF_ERROR(Enter());
  return DriverStatus("cuStreamWaitValue32",
                      reinterpret_cast<WaitFn>(signals_.wait)(
                          Resolve(stream), reinterpret_cast<CUdeviceptr>(at), value, kWaitGeq));
}

absl::Status CudaBackend::WriteValue32(void* at, uint32_t value, Stream stream) {
  if (signals_.write == nullptr) return Backend::WriteValue32(at, value, stream);
  if (at == nullptr) return absl::InvalidArgumentError("at: null");
  FP4Q_RETURN_IF_ERROR(Enter());
  return DriverStatus("cuStreamWriteValue32",
                      reinterpret_cast<WriteFn>(signals_.write)(
                          Resolve(stream), reinterpret_cast<CUdeviceptr>(at), value, kWriteFenced));
}

absl::StatusOr<uint32_t> CudaBackend::ReadValue32Now(const void* at) {
  if (signals_.wait == nullptr) return Backend::ReadValue32Now(at);
  if (at == nullptr) return absl::InvalidArgumentError("at: null");
  FP4Q_RETURN_IF_ERROR(Enter());
  absl::MutexLock lock(&side_mu_);
  FP4Q_RETURN_IF_ERROR(Track(FP4Q_CUDA_STATUS(
      cudaMemcpyAsync(side_word_, at, 4, cudaMemcpyDeviceToHost, side_stream_))));
  FP4Q_RETURN_IF_ERROR(Track(FP4Q_CUDA_STATUS(cudaStreamSynchronize(side_stream_))));
  return *side_word_;
}

absl::Status CudaBackend::WriteValue32Now(void* at, uint32_t value) {
  if (signals_.write == nullptr) return Backend::WriteValue32Now(at, value);
  if (at == nullptr) return absl::InvalidArgumentError("at: null");
  FP4Q_RETURN_IF_ERROR(Enter());
  absl::MutexLock lock(&side_mu_);
  FP4Q_RETURN_IF_ERROR(DriverStatus(
      "cuStreamWriteValue32",
      reinterpret_cast<WriteFn>(signals_.write)(side_stream_, reinterpret_cast<CUdeviceptr>(at),
                                                value, kWriteFenced)));
  return Track(FP4Q_CUDA_STATUS(cudaStreamSynchronize(side_stream_)));
}

}  // namespace fp4q::kernels::cuda
