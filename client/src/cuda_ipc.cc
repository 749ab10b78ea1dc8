// CudaIpc: the export of an allocation's IPC handle, over the CUDA runtime (cuda_runtime.h)
// and three driver calls reached through it.
//
// The driver ABI types needed are declared here (cuda.h's; unchanged since CUDA 10), so no CUDA
// header or library is needed to build the client.
#include "fp4q/client/cuda_ipc.h"

#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "fp4q/common/status_macros.h"

namespace fp4q::client {
namespace {

constexpr int kCudaMemoryTypeUnregistered = 0;
constexpr int kCudaMemoryTypeHost = 1;
constexpr int kCudaMemoryTypeDevice = 2;
constexpr int kCudaMemoryTypeManaged = 3;

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

using CuMemGetAddressRangeFn = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);
using CuDeviceGetFn = CUresult (*)(CUdevice*, int);
using CuDeviceGetUuidFn = CUresult (*)(CUuuid*, CUdevice);
using CuGetErrorNameFn = CUresult (*)(CUresult, const char**);

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
  std::unique_ptr<CudaRuntime> cuda;
  void* driver = nullptr;  // libcuda.so.1, only when the runtime lacks the entry-point call

  std::mutex mu;  // guards the driver functions below while they are resolved
  bool driver_resolved = false;
  CuMemGetAddressRangeFn mem_get_address_range = nullptr;
  CuDeviceGetFn device_get = nullptr;
  CuDeviceGetUuidFn device_get_uuid = nullptr;
  CuGetErrorNameFn cu_get_error_name = nullptr;

  ~Api() {
    if (driver != nullptr) dlclose(driver);
  }

  std::string DriverError(CUresult r) const {
    const char* name = nullptr;
    if (cu_get_error_name != nullptr && cu_get_error_name(r, &name) == kCuSuccess && name) {
      return absl::StrCat(name, " (", r, ")");
    }
    return absl::StrCat("CUresult ", r);
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
    if (cuda->Has(CudaCall::kGetDriverEntryPointByVersion)) {
      auto get = [&](const char* name, unsigned int version, void** fn) -> absl::Status {
        int query = -1;
        FP4Q_RETURN_IF_ERROR(cuda->Check("cudaGetDriverEntryPointByVersion",
                                         cuda->GetDriverEntryPointByVersion(name, fn, version,
                                                                            0, &query)));
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
  return CudaRuntime::DefaultLibraries();
}

absl::StatusOr<std::unique_ptr<CudaIpc>> CudaIpc::Load(
    const std::vector<std::string>& runtime_candidates) {
  absl::StatusOr<std::unique_ptr<CudaRuntime>> cuda = CudaRuntime::Load(runtime_candidates);
  if (!cuda.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("CUDA runtime not found, which CUDA IPC needs: ", cuda.status().message()));
  }
  FP4Q_RETURN_IF_ERROR((*cuda)->Require(
      {CudaCall::kGetErrorName, CudaCall::kGetErrorString, CudaCall::kGetDevice,
       CudaCall::kSetDevice, CudaCall::kFree, CudaCall::kPointerGetAttributes,
       CudaCall::kIpcGetMemHandle}));
  auto api = std::make_unique<Api>();
  api->cuda = *std::move(cuda);
  return std::unique_ptr<CudaIpc>(new CudaIpc(std::move(api)));
}

CudaIpc::CudaIpc(std::unique_ptr<Api> api) : api_(std::move(api)) {}
CudaIpc::~CudaIpc() = default;

const std::string& CudaIpc::runtime_library() const { return api_->cuda->library(); }

absl::StatusOr<CudaIpcExport> CudaIpc::Export(const void* device_ptr) const {
  Api& api = *api_;
  const CudaRuntime& cuda = *api.cuda;
  if (device_ptr == nullptr) {
    return absl::InvalidArgumentError("device pointer is null");
  }
  CudaPointerAttributes attrs;
  std::memset(&attrs, 0, sizeof(attrs));
  FP4Q_RETURN_IF_ERROR(
      cuda.Check("cudaPointerGetAttributes", cuda.PointerGetAttributes(&attrs, device_ptr)));
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
  FP4Q_RETURN_IF_ERROR(cuda.Check("cudaGetDevice", cuda.GetDevice(&previous)));
  if (previous != attrs.device) {
    FP4Q_RETURN_IF_ERROR(cuda.Check("cudaSetDevice", cuda.SetDevice(attrs.device)));
  }
  struct Restore {
    const CudaRuntime& cuda;
    int previous;
    int current;
    ~Restore() {
      if (previous != current) cuda.SetDevice(previous);
    }
  } restore{cuda, previous, attrs.device};
  // Makes the device's primary context current for the driver calls below.
  FP4Q_RETURN_IF_ERROR(cuda.Check("cudaFree(nullptr)", cuda.Free(nullptr)));
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
  FP4Q_RETURN_IF_ERROR(cuda.Check("cudaIpcGetMemHandle",
                                  cuda.IpcGetMemHandle(&handle, reinterpret_cast<void*>(out.base))));
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
