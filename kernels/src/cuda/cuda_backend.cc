// The CUDA backend: creation, device info, memory, streams, health and IPC; the elementwise
// numerics entry points. Quantization bodies are in cuda_ops.cc, the GEMM in cuda_matmul.cc.
#include "cuda/cuda_backend.h"

#include <cstdio>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cuda/cuda_status.h"
#include "cuda/kernel_codes_host.h"
#include "cuda/launch.h"
#include "cuda/staging.h"
#include "fp4q/common/status_macros.h"

namespace fp4q::kernels::cuda {
namespace {

std::string FormatUuid(const cudaUUID_t& u) {
  const auto* b = reinterpret_cast<const unsigned char*>(u.bytes);
  return absl::StrFormat(
      "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2],
      b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

absl::Status CheckCopyArgs(const void* dst, const void* src, size_t bytes) {
  if (bytes > 0 && dst == nullptr) return absl::InvalidArgumentError(absl::StrCat("dst: null with bytes ", bytes));
  if (bytes > 0 && src == nullptr) return absl::InvalidArgumentError(absl::StrCat("src: null with bytes ", bytes));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(int ordinal,
                                                                 const KernelTuning& tuning) {
  if (tuning.bf16_block_ctas != 3 && tuning.bf16_block_ctas != 4) {
    return absl::InvalidArgumentError(absl::StrCat("bf16_block_ctas: ", tuning.bf16_block_ctas,
                                                   " is not 3 or 4"));
  }
  if (tuning.step_prefetch_slots < 0 || tuning.step_prefetch_slots > kMaxStepPrefetchSlots) {
    return absl::InvalidArgumentError(absl::StrCat("step_prefetch_slots: ",
                                                   tuning.step_prefetch_slots, " is not in [0, ",
                                                   kMaxStepPrefetchSlots, "]"));
  }
  int count = 0;
  FP4Q_CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&count));
  if (ordinal < 0 || ordinal >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat("ordinal: ", ordinal, " is not a CUDA device (", count, " visible)"));
  }
  FP4Q_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal));
  cudaDeviceProp prop;
  FP4Q_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, ordinal));
  DeviceInfo info;
  info.backend = "cuda";
  info.ordinal = ordinal;
  info.uuid = FormatUuid(prop.uuid);
  info.name = prop.name;
  info.cc_major = prop.major;
  info.cc_minor = prop.minor;
  info.total_memory = prop.totalGlobalMem;

  // Keep freed pool memory cached: temporaries are reused call after call.
  cudaMemPool_t pool;
  FP4Q_CUDA_RETURN_IF_ERROR(cudaDeviceGetDefaultMemPool(&pool, ordinal));
  uint64_t threshold = UINT64_MAX;
  FP4Q_CUDA_RETURN_IF_ERROR(
      cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));

  FP4Q_ASSIGN_OR_RETURN(std::unique_ptr<BlasLt> blas, BlasLt::Create());
  cudaStream_t stream = nullptr;
  FP4Q_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::unique_ptr<CudaBackend> backend(
      new CudaBackend(ordinal, stream, std::move(info), std::move(blas), tuning));
  backend->ProbeSignals();
  return backend;
}

CudaBackend::~CudaBackend() {
  cudaSetDevice(ordinal_);
  {
    absl::MutexLock lock(&mu_);
    for (void* base : ipc_bases_) cudaIpcCloseMemHandle(base);
    ipc_bases_.clear();
  }
  {
    absl::MutexLock lock(&tickets_mu_);
    if (!tickets_.empty()) cudaDeviceSynchronize();  // cudaFree of a stream-ordered allocation
    for (auto& entry : tickets_) {
      cudaFree(entry.second.p);
      for (int* old : entry.second.retired) cudaFree(old);
    }
    tickets_.clear();
  }
  cudaStreamSynchronize(stream_);
  cudaStreamDestroy(stream_);
  absl::MutexLock lock(&side_mu_);
  if (side_stream_ != nullptr) {
    cudaStreamSynchronize(side_stream_);
    cudaStreamDestroy(side_stream_);
  }
  if (side_word_ != nullptr) cudaFreeHost(side_word_);
}

absl::Status CudaBackend::Enter() const {
  {
    absl::MutexLock lock(&mu_);
    if (!poison_.ok()) return poison_;
  }
  // cudaSetDevice (0.09-0.12 us a call on an H100 host) only where the thread's current device
  // is another one.
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess || current != ordinal_) {
    FP4Q_RETURN_IF_ERROR(Track(FP4Q_CUDA_STATUS(cudaSetDevice(ordinal_))));
  }
  // A stale non-sticky error of this thread (e.g. the caller's own failed call) must not be
  // reported by our launch checks; a sticky one comes back at once and poisons.
  const cudaError_t stale = cudaGetLastError();
  if (IsStickyCudaError(stale)) return Track(FP4Q_CUDA_STATUS(stale));
  return absl::OkStatus();
}

absl::Status CudaBackend::Track(absl::Status s) const {
  if (IsStickyStatus(s)) {
    absl::MutexLock lock(&mu_);
    if (poison_.ok()) {
      poison_ = absl::InternalError(
          absl::StrCat("CUDA backend on ", info_.uuid, " is poisoned: ", s.message()));
    }
  }
  return s;
}

absl::Status CudaBackend::AfterLaunches(cudaStream_t stream) const {
  // Each launcher already checked cudaGetLastError() after its launches; a fault of an earlier
  // asynchronous kernel shows up here as a sticky error.
  (void)stream;
  const cudaError_t e = cudaPeekAtLastError();
  if (IsStickyCudaError(e)) return Track(FP4Q_CUDA_STATUS(e));
  return absl::OkStatus();
}

absl::Status CudaBackend::Healthy() const {
  absl::MutexLock lock(&mu_);
  return poison_;
}

// ---------------------------------------------------------------- memory

absl::StatusOr<void*> CudaBackend::Allocate(size_t bytes) {
  FP4Q_RETURN_IF_ERROR(Enter());
  void* p = nullptr;
  absl::Status status = FP4Q_CUDA_STATUS(cudaMalloc(&p, bytes == 0 ? 1 : bytes));
  // A failed allocation (out of memory) is also this thread's last error: cleared, or the next
  // launch's cudaGetLastError() check on this thread would report it as its own.
  if (!status.ok()) cudaGetLastError();
  FP4Q_RETURN_IF_ERROR(Track(std::move(status)));
  return p;
}

void CudaBackend::Free(void* ptr) {
  if (ptr == nullptr || !Enter().ok()) return;
  Track(FP4Q_CUDA_STATUS(cudaFree(ptr))).IgnoreError();
}

absl::Status CudaBackend::CopyFromHost(void* dst, const void* src, size_t bytes, Stream stream) {
  FP4Q_RETURN_IF_ERROR(CheckCopyArgs(dst, src, bytes));
  FP4Q_RETURN_IF_ERROR(Enter());
  if (bytes == 0) return absl::OkStatus();
  return Track(FP4Q_CUDA_STATUS(
      cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, Resolve(stream))));
}

absl::Status CudaBackend::CopyToHost(void* dst, const void* src, size_t bytes, Stream stream) {
  FP4Q_RETURN_IF_ERROR(CheckCopyArgs(dst, src, bytes));
  FP4Q_RETURN_IF_ERROR(Enter());
  if (bytes == 0) return absl::OkStatus();
  return Track(FP4Q_CUDA_STATUS(
      cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, Resolve(stream))));
}

absl::Status CudaBackend::CopyDeviceToDevice(void* dst, const void* src, size_t bytes,
                                             Stream stream) {
  FP4Q_RETURN_IF_ERROR(CheckCopyArgs(dst, src, bytes));
  FP4Q_RETURN_IF_ERROR(Enter());
  if (bytes == 0) return absl::OkStatus();
  return Track(FP4Q_CUDA_STATUS(
      cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, Resolve(stream))));
}

absl::Status CudaBackend::Memset(void* dst, int value, size_t bytes, Stream stream) {
  if (bytes > 0 && dst == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("dst: null with bytes ", bytes));
  }
  FP4Q_RETURN_IF_ERROR(Enter());
  if (bytes == 0) return absl::OkStatus();
  return Track(FP4Q_CUDA_STATUS(cudaMemsetAsync(dst, value, bytes, Resolve(stream))));
}

absl::Status CudaBackend::Synchronize(Stream stream) {
  FP4Q_RETURN_IF_ERROR(Enter());
  return Track(FP4Q_CUDA_STATUS(cudaStreamSynchronize(Resolve(stream))));
}

absl::StatusOr<Stream> CudaBackend::CreateStream() {
  FP4Q_RETURN_IF_ERROR(Enter());
  cudaStream_t s = nullptr;
  FP4Q_RETURN_IF_ERROR(Track(FP4Q_CUDA_STATUS(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking))));
  return static_cast<Stream>(s);
}

void CudaBackend::DestroyStream(Stream stream) {
  if (stream == nullptr || stream == static_cast<Stream>(stream_)) return;
  cudaSetDevice(ordinal_);
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  cudaStreamSynchronize(s);
  {
    absl::MutexLock lock(&tickets_mu_);
    const auto it = tickets_.find(s);
    if (it != tickets_.end()) {
      cudaFree(it->second.p);
      for (int* old : it->second.retired) cudaFree(old);
      tickets_.erase(it);
    }
  }
  cudaStreamDestroy(s);
}

absl::StatusOr<int*> CudaBackend::SplitTickets(cudaStream_t stream, int64_t n) {
  if (n <= 0) return nullptr;
  absl::MutexLock lock(&tickets_mu_);
  Tickets& t = tickets_[stream];
  if (t.n >= n) return t.p;
  int64_t want = 64;
  while (want < n) want *= 2;
  void* p = nullptr;
  const size_t bytes = static_cast<size_t>(want) * sizeof(int);
  FP4Q_RETURN_IF_ERROR(Track(FP4Q_CUDA_STATUS(cudaMallocAsync(&p, bytes, stream))));
  const absl::Status zeroed = Track(FP4Q_CUDA_STATUS(cudaMemsetAsync(p, 0, bytes, stream)));
  if (!zeroed.ok()) {
    cudaFreeAsync(p, stream);
    return zeroed;
  }
  if (t.p != nullptr) t.retired.push_back(t.p);
  t.p = static_cast<int*>(p);
  t.n = want;
  return t.p;
}

// ---------------------------------------------------------------- IPC

absl::StatusOr<void*> CudaBackend::OpenIpcHandle(const std::string& ipc_handle) {
  if (ipc_handle.size() != sizeof(cudaIpcMemHandle_t)) {
    return absl::InvalidArgumentError(absl::StrCat("ipc_handle: ", ipc_handle.size(),
                                                   " bytes, a cudaIpcMemHandle_t has ",
                                                   sizeof(cudaIpcMemHandle_t)));
  }
  FP4Q_RETURN_IF_ERROR(Enter());
  cudaIpcMemHandle_t h;
  std::memcpy(&h, ipc_handle.data(), sizeof(h));
  void* base = nullptr;
  // Lazy peer access stays on: without it a handle of another GPU's allocation may still map,
  // and a kernel touching it would fault (a sticky error). Which GPU an allocation lives on is
  // checked below where the runtime reports it, and by RegionManager (a handle already open on
  // another GPU); on the H200 x2 machine cudaPointerGetAttributes named the opening GPU for a
  // peer mapping (docs/RELIABILITY.md, "Several GPUs").
  const cudaError_t e = cudaIpcOpenMemHandle(&base, h, cudaIpcMemLazyEnablePeerAccess);
  if (e != cudaSuccess) {
    const absl::Status s = Track(FP4Q_CUDA_STATUS(e));
    if (IsStickyStatus(s)) return s;
    cudaGetLastError();  // not sticky: clear it so later launch checks do not see it
    return absl::InvalidArgumentError(
        absl::StrCat("ipc_handle: cannot be opened on ", info_.uuid, ": ", s.message()));
  }
  // Second guard: where the runtime does report another GPU as the owner, refuse it, saying
  // where the allocation lives.
  cudaPointerAttributes attr;
  std::memset(&attr, 0, sizeof(attr));
  const cudaError_t ae = cudaPointerGetAttributes(&attr, base);
  if (ae != cudaSuccess || (attr.type == cudaMemoryTypeDevice && attr.device != ordinal_)) {
    cudaIpcCloseMemHandle(base);
    if (ae != cudaSuccess) return Track(FP4Q_CUDA_STATUS(ae));
    std::string owner = absl::StrCat("CUDA device ", attr.device);
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, attr.device) == cudaSuccess) owner = FormatUuid(prop.uuid);
    cudaGetLastError();
    return absl::InvalidArgumentError(absl::StrCat("ipc_handle: the allocation lives on ", owner,
                                                   ", not on ", info_.uuid));
  }
  absl::MutexLock lock(&mu_);
  ipc_bases_.insert(base);
  return base;
}

absl::Status CudaBackend::CloseIpcHandle(void* base) {
  FP4Q_RETURN_IF_ERROR(Enter());
  {
    absl::MutexLock lock(&mu_);
    if (ipc_bases_.erase(base) == 0) {
      return absl::NotFoundError(
          absl::StrCat("base: ", absl::StrFormat("%p", base), " is not an open IPC mapping"));
    }
  }
  return Track(FP4Q_CUDA_STATUS(cudaIpcCloseMemHandle(base)));
}

absl::StatusOr<size_t> CudaBackend::IpcMappingSize(void* base) const {
  {
    absl::MutexLock lock(&mu_);
    if (ipc_bases_.count(base) == 0) {
      return absl::NotFoundError(
          absl::StrCat("base: ", absl::StrFormat("%p", base), " is not an open IPC mapping"));
    }
  }
  // cuMemGetAddressRange through the runtime's driver entry point: the module links no libcuda.
  using GetAddressRange = int (*)(unsigned long long*, size_t*, unsigned long long);
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  FP4Q_RETURN_IF_ERROR(FP4Q_CUDA_STATUS(cudaGetDriverEntryPointByVersion(
      "cuMemGetAddressRange", &fn, 12000, cudaEnableDefault, &found)));
  if (fn == nullptr || found != cudaDriverEntryPointSuccess) {
    return absl::UnavailableError("cuMemGetAddressRange: not found in the CUDA driver");
  }
  unsigned long long alloc_base = 0;
  size_t alloc_size = 0;
  const auto ptr = static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(base));
  const int rc = reinterpret_cast<GetAddressRange>(fn)(&alloc_base, &alloc_size, ptr);
  if (rc != 0) {
    return absl::InternalError(absl::StrCat("cuMemGetAddressRange(", absl::StrFormat("%p", base),
                                            ") failed with CUresult ", rc));
  }
  // The mapping starts at the allocation's base; what lies beyond `base` is usable.
  return alloc_size - static_cast<size_t>(ptr - alloc_base);
}

// ---------------------------------------------------------------- elementwise numerics

absl::Status CudaBackend::DoAmax(const ConstTensor& x, float* amax, int64_t* first_nonfinite,
                                 Stream stream) {
  FP4Q_RETURN_IF_ERROR(Enter());
  const cudaStream_t s = Resolve(stream);
  const size_t n = static_cast<size_t>(x.rows * x.cols);
  Staging st(s);
  FP4Q_ASSIGN_OR_RETURN(const void* xp, st.Use(x.data, n * DTypeSize(x.dtype), true, false));
  FP4Q_ASSIGN_OR_RETURN(float* out, st.UseAs<float>(amax, sizeof(float), false, true));
  FP4Q_ASSIGN_OR_RETURN(
      uint64_t * first,
      st.UseAs<uint64_t>(first_nonfinite, sizeof(int64_t), false, true));  // -1 = ~0: none
  FP4Q_RETURN_IF_ERROR(Track(FP4Q_CUDA_STATUS(
      LaunchAmax(xp, DtypeCode(x.dtype), x.rows * x.cols, out, first, s))));
  FP4Q_RETURN_IF_ERROR(Track(st.Finish()));
  return AfterLaunches(s);
}

absl::Status CudaBackend::DoDequantize(const ConstQuantizedTensor& q, const MutTensor& out,
                                       Stream stream) {
  FP4Q_RETURN_IF_ERROR(Enter());
  const cudaStream_t s = Resolve(stream);
  FP4Q_ASSIGN_OR_RETURN(const size_t code_bytes, CodeBytes(q.rows, q.cols, "q"));
  FP4Q_ASSIGN_OR_RETURN(const size_t scale_bytes,
                        ScaleBytes(q.rows, q.cols, q.format, q.scale_layout, "q"));
  FP4Q_ASSIGN_OR_RETURN(const size_t out_bytes, DenseBytes(out.rows, out.cols, out.dtype, "out"));
  Staging st(s);
  DequantParams p;
  p.rows = q.rows;
  p.cols = q.cols;
  p.mx = q.format == Format::kMxfp4;
  p.swizzled = q.scale_layout == ScaleLayout::kSwizzled;
  FP4Q_ASSIGN_OR_RETURN(p.codes, st.UseAs<const uint8_t>(q.codes, code_bytes, true, false));
  FP4Q_ASSIGN_OR_RETURN(p.scales, st.UseAs<const uint8_t>(q.scales, scale_bytes, true, false));
  FP4Q_ASSIGN_OR_RETURN(p.global, st.UseAs<const float>(q.global, 8, true, false));
  FP4Q_ASSIGN_OR_RETURN(p.out, st.Use(out.data, out_bytes, false, true));
  p.out_dtype = DtypeCode(out.dtype);
  FP4Q_RETURN_IF_ERROR(Track(FP4Q_CUDA_STATUS(LaunchDequantize(p, s))));
  FP4Q_RETURN_IF_ERROR(Track(st.Finish()));
  return AfterLaunches(s);
}

absl::Status CudaBackend::DoRht(const ConstTensor& in, RhtMode mode, uint64_t rht_seed,
                                bool inverse, const MutTensor& out, Stream stream) {
  FP4Q_RETURN_IF_ERROR(Enter());
  const cudaStream_t s = Resolve(stream);
  FP4Q_ASSIGN_OR_RETURN(const size_t bytes, DenseBytes(in.rows, in.cols, in.dtype, "in"));
  Staging st(s);
  RhtParams p;
  FP4Q_ASSIGN_OR_RETURN(p.in, st.Use(in.data, bytes, true, false));
  FP4Q_ASSIGN_OR_RETURN(p.out, st.Use(out.data, bytes, false, true));
  p.dtype = DtypeCode(in.dtype);
  p.rows = in.rows;
  p.cols = in.cols;
  p.signs = mode == RhtMode::kOff ? 0u : RhtSignMask(RhtCode(mode), rht_seed);
  p.inverse = inverse;
  FP4Q_RETURN_IF_ERROR(Track(FP4Q_CUDA_STATUS(LaunchRht(p, s))));
  FP4Q_RETURN_IF_ERROR(Track(st.Finish()));
  return AfterLaunches(s);
}

// ---------------------------------------------------------------- wrappers of the bodies

absl::Status CudaBackend::DoQuantize(const ConstTensor& x, const QuantizeOptions& options,
                                     float* residual, const QuantizedTensor* rowwise,
                                     const QuantizedTensor* columnwise, FiniteGuard* guard,
                                     Stream stream) {
  FP4Q_RETURN_IF_ERROR(Enter());
  const cudaStream_t s = Resolve(stream);
  FP4Q_RETURN_IF_ERROR(Track(QuantizeImpl(x, options, residual, rowwise, columnwise, guard, s)));
  return AfterLaunches(s);
}

absl::Status CudaBackend::DoQdq(const ConstTensor& x, const QuantizeOptions& options,
                                float* residual, const MutTensor& out, FiniteGuard* guard,
                                Stream stream) {
  FP4Q_RETURN_IF_ERROR(Enter());
  const cudaStream_t s = Resolve(stream);
  FP4Q_RETURN_IF_ERROR(Track(QdqImpl(x, options, residual, out, guard, s)));
  return AfterLaunches(s);
}

absl::Status CudaBackend::DoStepCheck(const std::vector<StepItem>& items, void* workspace,
                                      Stream stream, const StepCancel& cancel) {
  FP4Q_RETURN_IF_ERROR(Enter());
  const cudaStream_t s = Resolve(stream);
  FP4Q_RETURN_IF_ERROR(Track(StepCheckImpl(items, workspace, s, cancel)));
  return AfterLaunches(s);
}

absl::Status CudaBackend::DoStepApply(const std::vector<StepItem>& items, void* workspace,
                                      Stream stream) {
  FP4Q_RETURN_IF_ERROR(Enter());
  const cudaStream_t s = Resolve(stream);
  FP4Q_RETURN_IF_ERROR(Track(StepApplyImpl(items, workspace, s)));
  return AfterLaunches(s);
}

absl::Status CudaBackend::DoStepCheckAndApply(const std::vector<StepItem>& items,
                                              void* workspace, Stream stream,
                                              const StepCancel& cancel) {
  FP4Q_RETURN_IF_ERROR(Enter());
  const cudaStream_t s = Resolve(stream);
  FP4Q_RETURN_IF_ERROR(Track(StepCheckAndApplyImpl(items, workspace, s, cancel)));
  return AfterLaunches(s);
}

absl::Status CudaBackend::DoStepReadReport(const std::vector<StepItem>& items,
                                           const void* workspace, StepReport* report,
                                           Stream stream) {
  FP4Q_RETURN_IF_ERROR(Enter());
  const cudaStream_t s = Resolve(stream);
  return Track(StepReadReportImpl(items, workspace, report, s));
}

absl::Status CudaBackend::DoMatmul(const ConstQuantizedTensor& a, const ConstQuantizedTensor& b,
                                   const MutTensor& c, Stream stream) {
  FP4Q_RETURN_IF_ERROR(Enter());
  const cudaStream_t s = Resolve(stream);
  FP4Q_RETURN_IF_ERROR(Track(MatmulImpl(a, b, c, s)));
  return AfterLaunches(s);
}

}  // namespace fp4q::kernels::cuda
