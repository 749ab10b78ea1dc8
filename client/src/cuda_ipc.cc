// CudaIpc: the CUDA runtime through dlopen, and the export of an allocation's IPC handle.
//
// The few CUDA ABI types needed are declared here (layouts of CUDA 13's driver_types.h and
// cuda.h; the fields used are unchanged since CUDA 10), so no CUDA header or library is needed
// to build the client.
#include "fp4q/client/cuda_ipc.h"

#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "fp4q/common/status_macros.h"

namespace fp4q::client {
namespace {

// ---- Runtime ABI (cuda_runtime_api.h / driver_types.h).
using cudaError_t = int;
constexpr cudaError_t kCudaSuccess = 0;
constexpr cudaError_t kCudaErrorInvalidValue = 1;
constexpr cudaError_t kCudaErrorInitializationError = 3;
constexpr cudaError_t kCudaErrorInvalidDevicePointer = 17;
constexpr cudaError_t kCudaErrorStubLibrary = 34;
constexpr cudaError_t kCudaErrorInsufficientDriver = 35;
constexpr cudaError_t kCudaErrorCallRequiresNewerDriver = 36;
constexpr cudaError_t kCudaErrorDevicesUnavailable = 46;
constexpr cudaError_t kCudaErrorNoDevice = 100;
constexpr cudaError_t kCudaErrorNotSupported = 801;
constexpr cudaError_t kCudaErrorSystemNotReady = 802;
constexpr cudaError_t kCudaErrorSystemDriverMismatch = 803;
constexpr cudaError_t kCudaErrorCompatNotSupportedOnDevice = 804;

constexpr int kCudaMemoryTypeUnregistered = 0;
constexpr int kCudaMemoryTypeHost = 1;
constexpr int kCudaMemoryTypeDevice = 2;
constexpr int kCudaMemoryTypeManaged = 3;

struct CudaPointerAttributes {
  int type;
  int device;
  void* device_pointer;
  void* host_pointer;
  long reserved[8];  // CUDA 13 ("must be zero"); older runtimes write less
};

struct CudaIpcMemHandle {
  char reserved[kCudaIpcHandleBytes];
};

// ---- Driver ABI (cuda.h).
using CUresult = int;
using CUdeviceptr = unsigned long long;
using CUdevice = int;
struct CUuuid {
  unsigned char bytes[16];
};
constexpr CUresult kCuSuccess = 0;
constexpr CUresult kCuErrorInvalidValue = 1;
constexpr CUresult kCuErrorNotInitialized = 3;
constexpr CUresult kCuErrorNoDevice = 100;
constexpr CUresult kCuErrorNotFound = 500;

using GetErrorStrFn = const char* (*)(cudaError_t);
using GetDeviceFn = cudaError_t (*)(int*);
using SetDeviceFn = cudaError_t (*)(int);
using FreeFn = cudaError_t (*)(void*);
using PointerGetAttributesFn = cudaError_t (*)(CudaPointerAttributes*, const void*);
using IpcGetMemHandleFn = cudaError_t (*)(CudaIpcMemHandle*, void*);
using GetDriverEntryPointByVersionFn = cudaError_t (*)(const char*, void**, unsigned int,
                                                       unsigned long long, int*);
using CuMemGetAddressRangeFn = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);
using CuDeviceGetFn = CUresult (*)(CUdevice*, int);
using CuDeviceGetUuidFn = CUresult (*)(CUuuid*, CUdevice);
using CuGetErrorNameFn = CUresult (*)(CUresult, const char**);

// Runtime errors that mean "no usable CUDA here" rather than a bad argument.
bool IsUnavailable(cudaError_t e) {
  return e == kCudaErrorInitializationError || e == kCudaErrorStubLibrary ||
         e == kCudaErrorInsufficientDriver || e == kCudaErrorCallRequiresNewerDriver ||
         e == kCudaErrorDevicesUnavailable || e == kCudaErrorNoDevice ||
         e == kCudaErrorSystemNotReady || e == kCudaErrorSystemDriverMismatch ||
         e == kCudaErrorCompatNotSupportedOnDevice;
}

}  // namespace

std::string FormatGpuUuid(const unsigned char bytes[16], const std::string& prefix) {
  std::string out = prefix;
  char hex[3];
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out.push_back('-');
    std::snprintf(hex, sizeof(hex), "%02x", bytes[i]);
    out.append(hex, 2);
  }
  return out;
}

struct CudaIpc::Api {
  std::string path;
  void* runtime = nullptr;
  void* driver = nullptr;  // libcuda.so.1, only when the runtime lacks the entry-point call
  GetErrorStrFn get_error_name = nullptr;
  GetErrorStrFn get_error_string = nullptr;
  GetDeviceFn get_device = nullptr;
  SetDeviceFn set_device = nullptr;
  FreeFn free = nullptr;
  PointerGetAttributesFn pointer_get_attributes = nullptr;
  IpcGetMemHandleFn ipc_get_mem_handle = nullptr;
  GetDriverEntryPointByVersionFn get_driver_entry_point = nullptr;  // optional

  std::mutex mu;  // guards the driver functions below while they are resolved
  bool driver_resolved = false;
  CuMemGetAddressRangeFn mem_get_address_range = nullptr;
  CuDeviceGetFn device_get = nullptr;
  CuDeviceGetUuidFn device_get_uuid = nullptr;
  CuGetErrorNameFn cu_get_error_name = nullptr;

  ~Api() {
    if (driver != nullptr) dlclose(driver);
    if (runtime != nullptr) dlclose(runtime);
  }

  std::string RuntimeError(cudaError_t e) const {
    return absl::StrCat(get_error_name(e), " (", get_error_string(e), ")");
  }
  std::string DriverError(CUresult r) const {
    const char* name = nullptr;
    if (cu_get_error_name != nullptr && cu_get_error_name(r, &name) == kCuSuccess && name) {
      return absl::StrCat(name, " (", r, ")");
    }
    return absl::StrCat("CUresult ", r);
  }

  absl::Status RuntimeStatus(const char* call, cudaError_t e) const {
    const std::string msg = absl::StrCat(call, ": ", RuntimeError(e));
    if (IsUnavailable(e)) return absl::FailedPreconditionError("CUDA unavailable: " + msg);
    if (e == kCudaErrorInvalidValue || e == kCudaErrorInvalidDevicePointer ||
        e == kCudaErrorNotSupported) {
      return absl::InvalidArgumentError(msg);
    }
    return absl::InternalError(msg);
  }

  absl::Status DriverStatus(const char* call, CUresult r) const {
    const std::string msg = absl::StrCat(call, ": ", DriverError(r));
    if (r == kCuErrorNotInitialized || r == kCuErrorNoDevice) {
      return absl::FailedPreconditionError("CUDA unavailable: " + msg);
    }
    if (r == kCuErrorInvalidValue || r == kCuErrorNotFound) return absl::InvalidArgumentError(msg);
    return absl::InternalError(msg);
  }

  // Resolves the driver calls once (after the runtime has initialised the driver).
  absl::Status ResolveDriver() {
    std::lock_guard<std::mutex> lock(mu);
    if (driver_resolved) return absl::OkStatus();
    if (get_driver_entry_point != nullptr) {
      auto get = [&](const char* name, unsigned int version, void** fn) -> absl::Status {
        int query = -1;
        const cudaError_t e = get_driver_entry_point(name, fn, version, 0, &query);
        if (e != kCudaSuccess) return RuntimeStatus("cudaGetDriverEntryPointByVersion", e);
        if (query != 0 || *fn == nullptr) {
          return absl::FailedPreconditionError(absl::StrCat(
              "CUDA driver lacks ", name, " (version ", version, "; query result ", query, ")"));
        }
        return absl::OkStatus();
      };
      FP4Q_RETURN_IF_ERROR(get("cuMemGetAddressRange", 12000,
                               reinterpret_cast<void**>(&mem_get_address_range)));
      FP4Q_RETURN_IF_ERROR(get("cuDeviceGet", 12000, reinterpret_cast<void**>(&device_get)));
      FP4Q_RETURN_IF_ERROR(
          get("cuDeviceGetUuid", 12000, reinterpret_cast<void**>(&device_get_uuid)));
      // Only for messages; its absence is tolerated.
      if (!get("cuGetErrorName", 12000, reinterpret_cast<void**>(&cu_get_error_name)).ok()) {
        cu_get_error_name = nullptr;
      }
    } else {
      driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
      if (driver == nullptr) {
        return absl::FailedPreconditionError(
            absl::StrCat("CUDA unavailable: cannot load libcuda.so.1: ", dlerror()));
      }
      mem_get_address_range =
          reinterpret_cast<CuMemGetAddressRangeFn>(dlsym(driver, "cuMemGetAddressRange_v2"));
      device_get = reinterpret_cast<CuDeviceGetFn>(dlsym(driver, "cuDeviceGet"));
      device_get_uuid = reinterpret_cast<CuDeviceGetUuidFn>(dlsym(driver, "cuDeviceGetUuid_v2"));
      if (device_get_uuid == nullptr) {
        device_get_uuid = reinterpret_cast<CuDeviceGetUuidFn>(dlsym(driver, "cuDeviceGetUuid"));
      }
      cu_get_error_name = reinterpret_cast<CuGetErrorNameFn>(dlsym(driver, "cuGetErrorName"));
      if (mem_get_address_range == nullptr || device_get == nullptr ||
          device_get_uuid == nullptr) {
        return absl::FailedPreconditionError(
            "libcuda.so.1 lacks cuMemGetAddressRange_v2, cuDeviceGet or cuDeviceGetUuid");
      }
    }
    driver_resolved = true;
    return absl::OkStatus();
  }
};

std::vector<std::string> CudaIpc::DefaultRuntimeLibraries() {
  return {"libcudart.so.13", "libcudart.so"};
}

absl::StatusOr<std::unique_ptr<CudaIpc>> CudaIpc::Load(
    const std::vector<std::string>& runtime_candidates) {
  const std::vector<std::string> candidates =
      runtime_candidates.empty() ? DefaultRuntimeLibraries() : runtime_candidates;
  auto api = std::make_unique<Api>();
  std::vector<std::string> failures;
  for (const std::string& path : candidates) {
    dlerror();
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* err = dlerror();
      failures.push_back(absl::StrCat(path, ": ", err ? err : "unknown dlopen error"));
      continue;
    }
    api->runtime = handle;
    api->path = path;
    break;
  }
  if (api->runtime == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("CUDA runtime not found; CUDA IPC needs libcudart (tried ",
                     absl::StrJoin(failures, "; "), ")"));
  }
  std::vector<std::string> missing;
  auto sym = [&](const char* name, auto* fn) {
    *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(dlsym(api->runtime, name));
    if (*fn == nullptr) missing.push_back(name);
  };
  sym("cudaGetErrorName", &api->get_error_name);
  sym("cudaGetErrorString", &api->get_error_string);
  sym("cudaGetDevice", &api->get_device);
  sym("cudaSetDevice", &api->set_device);
  sym("cudaFree", &api->free);
  sym("cudaPointerGetAttributes", &api->pointer_get_attributes);
  sym("cudaIpcGetMemHandle", &api->ipc_get_mem_handle);
  if (!missing.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "CUDA runtime ", api->path, " lacks ", absl::StrJoin(missing, ", ")));
  }
  api->get_driver_entry_point = reinterpret_cast<GetDriverEntryPointByVersionFn>(
      dlsym(api->runtime, "cudaGetDriverEntryPointByVersion"));
  return std::unique_ptr<CudaIpc>(new CudaIpc(std::move(api)));
}

CudaIpc::CudaIpc(std::unique_ptr<Api> api) : api_(std::move(api)) {}
CudaIpc::~CudaIpc() = default;

const std::string& CudaIpc::runtime_library() const { return api_->path; }

absl::StatusOr<CudaIpcExport> CudaIpc::Export(const void* device_ptr) const {
  Api& api = *api_;
  if (device_ptr == nullptr) {
    return absl::InvalidArgumentError("device pointer is null");
  }
  CudaPointerAttributes attrs;
  std::memset(&attrs, 0, sizeof(attrs));
  cudaError_t e = api.pointer_get_attributes(&attrs, device_ptr);
  if (e != kCudaSuccess) return api.RuntimeStatus("cudaPointerGetAttributes", e);
  const std::string where = absl::StrCat("pointer ", absl::Hex(reinterpret_cast<uintptr_t>(
                                                         device_ptr), absl::kZeroPad16));
  switch (attrs.type) {
    case kCudaMemoryTypeDevice: break;
    case kCudaMemoryTypeUnregistered:
      return absl::InvalidArgumentError(where + " is not CUDA memory (unregistered host memory)");
    case kCudaMemoryTypeHost:
      return absl::InvalidArgumentError(where + " is pinned host memory, not device memory");
    case kCudaMemoryTypeManaged:
      return absl::InvalidArgumentError(where + " is managed memory, which CUDA IPC cannot export");
    default:
      return absl::InvalidArgumentError(absl::StrCat(where, " has unknown memory type ",
                                                     attrs.type));
  }

  int previous = -1;
  e = api.get_device(&previous);
  if (e != kCudaSuccess) return api.RuntimeStatus("cudaGetDevice", e);
  if (previous != attrs.device) {
    e = api.set_device(attrs.device);
    if (e != kCudaSuccess) return api.RuntimeStatus("cudaSetDevice", e);
  }
  struct Restore {
    const Api& api;
    int previous;
    int current;
    ~Restore() {
      if (previous != current) api.set_device(previous);
    }
  } restore{api, previous, attrs.device};
  // Makes the device's primary context current for the driver calls below.
  e = api.free(nullptr);
  if (e != kCudaSuccess) return api.RuntimeStatus("cudaFree(nullptr)", e);
  FP4Q_RETURN_IF_ERROR(api.ResolveDriver());

  CudaIpcExport out;
  out.device = attrs.device;
  CUdeviceptr base = 0;
  size_t size = 0;
  const CUdeviceptr ptr = static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(device_ptr));
  CUresult r = api.mem_get_address_range(&base, &size, ptr);
  if (r != kCuSuccess) return api.DriverStatus("cuMemGetAddressRange", r);
  if (ptr < base || ptr - base >= size) {
    return absl::InternalError(absl::StrCat("cuMemGetAddressRange: ", where,
                                            " lies outside the range it returned (base ",
                                            absl::Hex(base), ", ", size, " bytes)"));
  }
  out.base = static_cast<uintptr_t>(base);
  out.allocation_bytes = size;
  out.offset = ptr - base;

  CudaIpcMemHandle handle;
  std::memset(&handle, 0, sizeof(handle));
  e = api.ipc_get_mem_handle(&handle, reinterpret_cast<void*>(out.base));
  if (e != kCudaSuccess) return api.RuntimeStatus("cudaIpcGetMemHandle", e);
  out.handle.assign(handle.reserved, sizeof(handle.reserved));

  CUdevice dev = 0;
  r = api.device_get(&dev, attrs.device);
  if (r != kCuSuccess) return api.DriverStatus("cuDeviceGet", r);
  CUuuid uuid;
  r = api.device_get_uuid(&uuid, dev);
  if (r != kCuSuccess) return api.DriverStatus("cuDeviceGetUuid", r);
  out.device_uuid = FormatGpuUuid(uuid.bytes);
  return out;
}

}  // namespace fp4q::client
