// CudaRuntime: libcudart through dlopen/dlsym (contract in cuda_runtime.h).
#include "fp4q/client/cuda_runtime.h"

#include <dlfcn.h>

#include <array>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace fp4q::client {
namespace {

// cudaError_t values (driver_types.h) that Check classifies.
constexpr CudaError kCudaErrorInvalidValue = 1;
constexpr CudaError kCudaErrorMemoryAllocation = 2;
constexpr CudaError kCudaErrorInitializationError = 3;
constexpr CudaError kCudaErrorInvalidDevicePointer = 17;
constexpr CudaError kCudaErrorStubLibrary = 34;
constexpr CudaError kCudaErrorInsufficientDriver = 35;
constexpr CudaError kCudaErrorCallRequiresNewerDriver = 36;
constexpr CudaError kCudaErrorDevicesUnavailable = 46;
constexpr CudaError kCudaErrorNoDevice = 100;
constexpr CudaError kCudaErrorInvalidDevice = 101;
constexpr CudaError kCudaErrorNotSupported = 801;
constexpr CudaError kCudaErrorSystemNotReady = 802;
constexpr CudaError kCudaErrorSystemDriverMismatch = 803;
constexpr CudaError kCudaErrorCompatNotSupportedOnDevice = 804;

// Errors that mean "no usable CUDA here" rather than a bad argument.
bool IsUnavailable(CudaError e) {
  return e == kCudaErrorInitializationError || e == kCudaErrorStubLibrary ||
         e == kCudaErrorInsufficientDriver || e == kCudaErrorCallRequiresNewerDriver ||
         e == kCudaErrorDevicesUnavailable || e == kCudaErrorNoDevice ||
         e == kCudaErrorSystemNotReady || e == kCudaErrorSystemDriverMismatch ||
         e == kCudaErrorCompatNotSupportedOnDevice;
}

constexpr size_t kCalls = static_cast<size_t>(CudaCall::kCount);

constexpr std::array<const char*, kCalls> kCallNames = {
    "cudaGetErrorName",        "cudaGetErrorString",     "cudaGetDeviceCount",
    "cudaGetDevice",           "cudaSetDevice",          "cudaMalloc",
    "cudaFree",                "cudaMemcpy",             "cudaMemset",
    "cudaDeviceSynchronize",   "cudaPointerGetAttributes", "cudaIpcGetMemHandle",
    "cudaIpcOpenMemHandle",    "cudaIpcCloseMemHandle",  "cudaGetDriverEntryPointByVersion",
};

absl::Status CheckRange(const DeviceBuffer& buffer, uint64_t offset, uint64_t bytes,
                        const char* what) {
  if (buffer.data() == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": the buffer is empty"));
  }
  if (offset > buffer.bytes() || bytes > buffer.bytes() - offset) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": [", offset, ", ", offset, " + ",
                                                   bytes, ") overruns the buffer of ",
                                                   buffer.bytes(), " bytes"));
  }
  return absl::OkStatus();
}

}  // namespace

const char* CudaCallName(CudaCall call) {
  const size_t i = static_cast<size_t>(call);
  return i < kCalls ? kCallNames[i] : "cuda?";
}

struct CudaRuntime::Library {
  std::string path;
  void* handle = nullptr;
  std::array<void*, kCalls> fns{};

  ~Library() {
    if (handle != nullptr) dlclose(handle);
  }

  // The call's function pointer, typed by the caller; null when the library lacks it.
  template <typename Fn>
  Fn Get(CudaCall call) const {
    return reinterpret_cast<Fn>(fns[static_cast<size_t>(call)]);
  }

  // Calls it, or reports the symbol missing.
  template <typename... Args>
  CudaError Call(CudaCall call, Args... args) const {
    const auto fn = Get<CudaError (*)(Args...)>(call);
    return fn != nullptr ? fn(args...) : kCudaErrorSymbolNotFound;
  }
};

std::vector<std::string> CudaRuntime::DefaultLibraries() {
  return {"libcudart.so.13", "libcudart.so"};
}

absl::StatusOr<std::unique_ptr<CudaRuntime>> CudaRuntime::Load(
    const std::vector<std::string>& candidates) {
  const std::vector<std::string> names = candidates.empty() ? DefaultLibraries() : candidates;
  auto library = std::make_unique<Library>();
  std::vector<std::string> failures;
  for (const std::string& name : names) {
    dlerror();
    library->handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (library->handle != nullptr) {
      library->path = name;
      break;
    }
    const char* why = dlerror();
    failures.push_back(absl::StrCat(name, ": ", why != nullptr ? why : "unknown dlopen error"));
  }
  if (library->handle == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("no CUDA runtime (tried ", absl::StrJoin(failures, "; "), ")"));
  }
  for (size_t i = 0; i < kCalls; ++i) library->fns[i] = dlsym(library->handle, kCallNames[i]);
  return std::unique_ptr<CudaRuntime>(new CudaRuntime(std::move(library)));
}

CudaRuntime::CudaRuntime(std::unique_ptr<Library> library) : library_(std::move(library)) {}
CudaRuntime::CudaRuntime(CudaRuntime&& other) noexcept = default;
CudaRuntime::~CudaRuntime() = default;

const std::string& CudaRuntime::library() const { return library_->path; }

bool CudaRuntime::Has(CudaCall call) const {
  const size_t i = static_cast<size_t>(call);
  return i < kCalls && library_->fns[i] != nullptr;
}

absl::Status CudaRuntime::Require(std::initializer_list<CudaCall> calls) const {
  std::vector<std::string> missing;
  for (CudaCall call : calls) {
    if (!Has(call)) missing.push_back(CudaCallName(call));
  }
  if (missing.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("CUDA runtime ", library_->path, " lacks ", absl::StrJoin(missing, ", ")));
}

std::string CudaRuntime::ErrorText(CudaError error) const {
  using ErrorStrFn = const char* (*)(CudaError);
  const auto name = library_->Get<ErrorStrFn>(CudaCall::kGetErrorName);
  const auto text = library_->Get<ErrorStrFn>(CudaCall::kGetErrorString);
  const char* n = name != nullptr ? name(error) : nullptr;
  const char* t = text != nullptr ? text(error) : nullptr;
  return absl::StrCat(n != nullptr ? n : absl::StrCat("cudaError ", error), " (",
                      t != nullptr ? t : "no error text", ")");
}

absl::Status CudaRuntime::Check(const char* call, CudaError error) const {
  if (error == kCudaSuccess) return absl::OkStatus();
  const std::string msg = absl::StrCat(call, ": ", ErrorText(error));
  if (IsUnavailable(error)) return absl::FailedPreconditionError("CUDA unavailable: " + msg);
  if (error == kCudaErrorMemoryAllocation) return absl::ResourceExhaustedError(msg);
  if (error == kCudaErrorInvalidValue || error == kCudaErrorInvalidDevicePointer ||
      error == kCudaErrorInvalidDevice || error == kCudaErrorNotSupported) {
    return absl::InvalidArgumentError(msg);
  }
  return absl::InternalError(msg);
}

CudaError CudaRuntime::GetDeviceCount(int* count) const {
  return library_->Call(CudaCall::kGetDeviceCount, count);
}
CudaError CudaRuntime::GetDevice(int* device) const {
  return library_->Call(CudaCall::kGetDevice, device);
}
CudaError CudaRuntime::SetDevice(int device) const {
  return library_->Call(CudaCall::kSetDevice, device);
}
CudaError CudaRuntime::Malloc(void** ptr, size_t bytes) const {
  return library_->Call(CudaCall::kMalloc, ptr, bytes);
}
CudaError CudaRuntime::Free(void* ptr) const { return library_->Call(CudaCall::kFree, ptr); }
CudaError CudaRuntime::Memcpy(void* dst, const void* src, size_t bytes,
                              CudaMemcpyKind kind) const {
  return library_->Call(CudaCall::kMemcpy, dst, src, bytes, static_cast<int>(kind));
}
CudaError CudaRuntime::Memset(void* ptr, int value, size_t bytes) const {
  return library_->Call(CudaCall::kMemset, ptr, value, bytes);
}
CudaError CudaRuntime::DeviceSynchronize() const {
  return library_->Call(CudaCall::kDeviceSynchronize);
}
CudaError CudaRuntime::PointerGetAttributes(CudaPointerAttributes* attributes,
                                            const void* ptr) const {
  return library_->Call(CudaCall::kPointerGetAttributes, attributes, ptr);
}
CudaError CudaRuntime::IpcGetMemHandle(CudaIpcMemHandle* handle, void* ptr) const {
  return library_->Call(CudaCall::kIpcGetMemHandle, handle, ptr);
}
CudaError CudaRuntime::IpcOpenMemHandle(void** ptr, const CudaIpcMemHandle& handle,
                                        unsigned int flags) const {
  // cudaIpcMemHandle_t is passed by value.
  return library_->Call(CudaCall::kIpcOpenMemHandle, ptr, handle, flags);
}
CudaError CudaRuntime::IpcCloseMemHandle(void* ptr) const {
  return library_->Call(CudaCall::kIpcCloseMemHandle, ptr);
}
CudaError CudaRuntime::GetDriverEntryPointByVersion(const char* symbol, void** fn,
                                                    unsigned int version,
                                                    unsigned long long flags,
                                                    int* query_result) const {
  return library_->Call(CudaCall::kGetDriverEntryPointByVersion, symbol, fn, version, flags,
                        query_result);
}

absl::StatusOr<int> CudaRuntime::DeviceCount() const {
  int count = 0;
  const CudaError e = GetDeviceCount(&count);
  if (e != kCudaSuccess) {
    return absl::FailedPreconditionError(
        absl::StrCat("no usable CUDA device: cudaGetDeviceCount: ", ErrorText(e)));
  }
  if (count < 1) {
    return absl::FailedPreconditionError("no usable CUDA device: cudaGetDeviceCount found 0");
  }
  return count;
}

absl::StatusOr<DeviceBuffer> CudaRuntime::Allocate(uint64_t bytes) const {
  if (bytes == 0) return absl::InvalidArgumentError("Allocate: 0 bytes");
  void* ptr = nullptr;
  const CudaError e = Malloc(&ptr, bytes);
  if (e != kCudaSuccess) return Check(absl::StrCat("cudaMalloc(", bytes, ")").c_str(), e);
  return DeviceBuffer(this, ptr, bytes);
}

absl::Status CudaRuntime::CopyToDevice(const DeviceBuffer& buffer, uint64_t offset,
                                       const void* src, uint64_t bytes) const {
  absl::Status s = CheckRange(buffer, offset, bytes, "CopyToDevice");
  if (!s.ok()) return s;
  char* dst = static_cast<char*>(buffer.data()) + offset;
  s = Check("cudaMemcpy(host to device)", Memcpy(dst, src, bytes, CudaMemcpyKind::kHostToDevice));
  if (!s.ok()) return s;
  // From pageable memory the copy may still be in flight when cudaMemcpy returns.
  return Check("cudaDeviceSynchronize", DeviceSynchronize());
}

absl::Status CudaRuntime::CopyToHost(void* dst, const DeviceBuffer& buffer, uint64_t offset,
                                     uint64_t bytes) const {
  absl::Status s = CheckRange(buffer, offset, bytes, "CopyToHost");
  if (!s.ok()) return s;
  const char* src = static_cast<const char*>(buffer.data()) + offset;
  return Check("cudaMemcpy(device to host)",
               Memcpy(dst, src, bytes, CudaMemcpyKind::kDeviceToHost));
}

absl::Status CudaRuntime::Fill(const DeviceBuffer& buffer, uint64_t offset, uint8_t value,
                               uint64_t bytes) const {
  absl::Status s = CheckRange(buffer, offset, bytes, "Fill");
  if (!s.ok()) return s;
  char* dst = static_cast<char*>(buffer.data()) + offset;
  s = Check("cudaMemset", Memset(dst, value, bytes));
  if (!s.ok()) return s;
  return Check("cudaDeviceSynchronize", DeviceSynchronize());
}

DeviceBuffer::~DeviceBuffer() { Reset(); }

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : runtime_(std::exchange(other.runtime_, nullptr)),
      data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    Reset();
    runtime_ = std::exchange(other.runtime_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void DeviceBuffer::Reset() {
  if (runtime_ != nullptr && data_ != nullptr) runtime_->Free(data_);
  runtime_ = nullptr;
  data_ = nullptr;
  bytes_ = 0;
}

}  // namespace fp4q::client
