// The CUDA runtime calls the examples need, reached with dlopen/dlsym. Only
// plain C types cross the boundary: cudaError_t is an int, cudaMemcpyKind an
// int (1 host to device, 2 device to host), sizes are size_t.
#include "fp4q/examples/cuda_runtime.h"

#include <dlfcn.h>

#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace fp4q::examples {
namespace {

using CudaError = int;
constexpr CudaError kCudaSuccess = 0;
constexpr int kMemcpyHostToDevice = 1;
constexpr int kMemcpyDeviceToHost = 2;

using ErrorStrFn = const char* (*)(CudaError);
using GetDeviceCountFn = CudaError (*)(int*);
using MallocFn = CudaError (*)(void**, size_t);
using FreeFn = CudaError (*)(void*);
using MemcpyFn = CudaError (*)(void*, const void*, size_t, int);
using MemsetFn = CudaError (*)(void*, int, size_t);
using SynchronizeFn = CudaError (*)();

absl::Status CheckRange(const DeviceBuffer& buffer, uint64_t offset,
                        uint64_t bytes, const char* what) {
  if (buffer.data() == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": the buffer is empty"));
  }
  if (offset > buffer.bytes() || bytes > buffer.bytes() - offset) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": [", offset, ", ", offset, " + ", bytes,
                     ") overruns the buffer of ", buffer.bytes(), " bytes"));
  }
  return absl::OkStatus();
}

}  // namespace

struct CudaRuntime::Api {
  std::string library;
  void* handle = nullptr;
  int device_count = 0;
  ErrorStrFn error_name = nullptr;
  ErrorStrFn error_string = nullptr;
  GetDeviceCountFn get_device_count = nullptr;
  MallocFn malloc = nullptr;
  FreeFn free = nullptr;
  MemcpyFn memcpy = nullptr;
  MemsetFn memset = nullptr;
  SynchronizeFn synchronize = nullptr;

  ~Api() {
    if (handle != nullptr) dlclose(handle);
  }

  std::string Error(CudaError e) const {
    return absl::StrCat(error_name(e), " (", error_string(e), ")");
  }
  absl::Status Check(const char* call, CudaError e) const {
    if (e == kCudaSuccess) return absl::OkStatus();
    return absl::InternalError(absl::StrCat(call, ": ", Error(e)));
  }
};

CudaRuntime::CudaRuntime(std::unique_ptr<Api> api) : api_(std::move(api)) {}
CudaRuntime::~CudaRuntime() = default;

absl::StatusOr<std::unique_ptr<CudaRuntime>> CudaRuntime::Load(
    const std::vector<std::string>& candidates) {
  const std::vector<std::string> names =
      candidates.empty()
          ? std::vector<std::string>{"libcudart.so.13", "libcudart.so"}
          : candidates;
  auto api = std::make_unique<Api>();
  std::vector<std::string> tried;
  for (const std::string& name : names) {
    api->handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (api->handle != nullptr) {
      api->library = name;
      break;
    }
    const char* why = dlerror();
    tried.push_back(
        absl::StrCat(name, ": ", why != nullptr ? why : "unknown error"));
  }
  if (api->handle == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("no CUDA runtime: ", absl::StrJoin(tried, "; ")));
  }
  auto sym = [&](const char* name, auto* fn) -> absl::Status {
    *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(
        dlsym(api->handle, name));
    if (*fn == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat(api->library, " lacks ", name));
    }
    return absl::OkStatus();
  };
  for (absl::Status s :
       {sym("cudaGetErrorName", &api->error_name),
        sym("cudaGetErrorString", &api->error_string),
        sym("cudaGetDeviceCount", &api->get_device_count),
        sym("cudaMalloc", &api->malloc), sym("cudaFree", &api->free),
        sym("cudaMemcpy", &api->memcpy), sym("cudaMemset", &api->memset),
        sym("cudaDeviceSynchronize", &api->synchronize)}) {
    if (!s.ok()) return s;
  }
  const CudaError e = api->get_device_count(&api->device_count);
  if (e != kCudaSuccess) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no usable CUDA device: cudaGetDeviceCount: ", api->Error(e)));
  }
  if (api->device_count < 1) {
    return absl::FailedPreconditionError(
        "no usable CUDA device: cudaGetDeviceCount found 0");
  }
  return std::unique_ptr<CudaRuntime>(new CudaRuntime(std::move(api)));
}

const std::string& CudaRuntime::library() const { return api_->library; }
int CudaRuntime::device_count() const { return api_->device_count; }

absl::StatusOr<DeviceBuffer> CudaRuntime::Allocate(uint64_t bytes) const {
  if (bytes == 0) return absl::InvalidArgumentError("Allocate: 0 bytes");
  void* ptr = nullptr;
  const CudaError e = api_->malloc(&ptr, bytes);
  if (e != kCudaSuccess) {
    return absl::InternalError(
        absl::StrCat("cudaMalloc(", bytes, "): ", api_->Error(e)));
  }
  return DeviceBuffer(this, ptr, bytes);
}

absl::Status CudaRuntime::CopyToDevice(const DeviceBuffer& buffer,
                                       uint64_t offset, const void* src,
                                       uint64_t bytes) const {
  absl::Status s = CheckRange(buffer, offset, bytes, "CopyToDevice");
  if (!s.ok()) return s;
  char* dst = static_cast<char*>(buffer.data()) + offset;
  s = api_->Check("cudaMemcpy(host to device)",
                  api_->memcpy(dst, src, bytes, kMemcpyHostToDevice));
  if (!s.ok()) return s;
  // From pageable memory the copy may still be in flight when cudaMemcpy
  // returns.
  return api_->Check("cudaDeviceSynchronize", api_->synchronize());
}

absl::Status CudaRuntime::CopyToHost(void* dst, const DeviceBuffer& buffer,
                                     uint64_t offset, uint64_t bytes) const {
  absl::Status s = CheckRange(buffer, offset, bytes, "CopyToHost");
  if (!s.ok()) return s;
  const char* src = static_cast<const char*>(buffer.data()) + offset;
  return api_->Check("cudaMemcpy(device to host)",
                     api_->memcpy(dst, src, bytes, kMemcpyDeviceToHost));
}

absl::Status CudaRuntime::Fill(const DeviceBuffer& buffer, uint64_t offset,
                               uint8_t value, uint64_t bytes) const {
  absl::Status s = CheckRange(buffer, offset, bytes, "Fill");
  if (!s.ok()) return s;
  char* dst = static_cast<char*>(buffer.data()) + offset;
  s = api_->Check("cudaMemset", api_->memset(dst, value, bytes));
  if (!s.ok()) return s;
  return api_->Check("cudaDeviceSynchronize", api_->synchronize());
}

void CudaRuntime::Free(void* ptr) const { api_->free(ptr); }

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

}  // namespace fp4q::examples
