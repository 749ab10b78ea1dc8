// A stand-in for libcudart (and, through cudaGetDriverEntryPointByVersion, the three driver
// calls CudaIpc uses), loaded through client::CudaRuntime (CudaIpc::Load, Session) in tests
// where no GPU exists. It has the calls CudaIpc needs but not cudaGetDeviceCount, cudaMalloc
// or cudaMemcpy, so the examples' runtime refuses it ("lacks cudaGetDeviceCount, ...").
// Built with FP4Q_FAKE_CUDART_MEMORY (fp4q_fake_cudart_memory) it has them too, as one device
// whose "device memory" is host memory (cudaMalloc is an aligned host allocation, registered
// as an allocation of device 0; cudaMemcpy is memcpy): for tools such as `fp4q bench-step`
// that allocate and fill device memory before they talk to a server.
// It tracks fake "allocations" (ranges of host addresses that are never dereferenced), the
// current device per process, and hands out deterministic IPC handles that change when an
// allocation is replaced. Test hooks are the fake_cuda_* functions.
//
// Like the real driver, cuMemGetAddressRange here only finds allocations of the current
// device, so a test sees whether CudaIpc makes the pointer's device current.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

namespace {

struct Alloc {
  uintptr_t base;
  size_t size;
  int device;
  unsigned generation;
};

std::mutex mu;
std::vector<Alloc> allocs;
unsigned next_generation = 1;
int current_device = 0;
int forced_error = 0;  // returned by cudaPointerGetAttributes when non-zero
int ipc_calls = 0;

struct Attributes {
  int type;
  int device;
  void* device_pointer;
  void* host_pointer;
  long reserved[8];
};

const Alloc* Find(uintptr_t p) {
  for (const Alloc& a : allocs) {
    if (p >= a.base && p - a.base < a.size) return &a;
  }
  return nullptr;
}

constexpr int kNumDevices = 4;

}  // namespace

extern "C" {

// ---- Test hooks.
unsigned fake_cuda_add_allocation(void* base, size_t size, int device) {
  std::lock_guard<std::mutex> lock(mu);
  allocs.push_back({reinterpret_cast<uintptr_t>(base), size, device, next_generation});
  return next_generation++;
}
void fake_cuda_remove_allocation(void* base) {
  std::lock_guard<std::mutex> lock(mu);
  for (size_t i = 0; i < allocs.size(); ++i) {
    if (allocs[i].base == reinterpret_cast<uintptr_t>(base)) {
      allocs.erase(allocs.begin() + static_cast<long>(i));
      return;
    }
  }
}
void fake_cuda_set_error(int code) {
  std::lock_guard<std::mutex> lock(mu);
  forced_error = code;
}
int fake_cuda_current_device() {
  std::lock_guard<std::mutex> lock(mu);
  return current_device;
}
int fake_cuda_ipc_calls() {
  std::lock_guard<std::mutex> lock(mu);
  return ipc_calls;
}
// The handle the fake gives the allocation at `base` (for tests to compare against).
void fake_cuda_expected_handle(void* base, char out[64]) {
  std::lock_guard<std::mutex> lock(mu);
  std::memset(out, 0, 64);
  const Alloc* a = Find(reinterpret_cast<uintptr_t>(base));
  if (a == nullptr) return;
  std::memcpy(out, "FAKEIPC", 7);
  std::memcpy(out + 8, &a->base, sizeof(a->base));
  std::memcpy(out + 16, &a->generation, sizeof(a->generation));
  std::memcpy(out + 20, &a->device, sizeof(a->device));
}

// ---- Runtime API.
const char* cudaGetErrorName(int e) {
  switch (e) {
    case 0: return "cudaSuccess";
    case 1: return "cudaErrorInvalidValue";
    case 35: return "cudaErrorInsufficientDriver";
    case 100: return "cudaErrorNoDevice";
    case 101: return "cudaErrorInvalidDevice";
    default: return "cudaErrorUnknown";
  }
}
const char* cudaGetErrorString(int e) {
  switch (e) {
    case 35: return "CUDA driver version is insufficient for CUDA runtime version";
    case 100: return "no CUDA-capable device is detected";
    default: return "fake error";
  }
}
int cudaGetDevice(int* device) {
  std::lock_guard<std::mutex> lock(mu);
  *device = current_device;
  return 0;
}
int cudaSetDevice(int device) {
  if (device < 0 || device >= kNumDevices) return 101;
  std::lock_guard<std::mutex> lock(mu);
  current_device = device;
  return 0;
}
#ifndef FP4Q_FAKE_CUDART_MEMORY
int cudaFree(void* p) { return p == nullptr ? 0 : 1; }
#else
int cudaGetDeviceCount(int* count) {
  *count = 1;
  return 0;
}
int cudaMalloc(void** ptr, size_t bytes) {
  if (bytes == 0) return 1;
  void* p = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
  if (p == nullptr) return 2;  // cudaErrorMemoryAllocation
  std::lock_guard<std::mutex> lock(mu);
  allocs.push_back({reinterpret_cast<uintptr_t>(p), bytes, current_device, next_generation++});
  *ptr = p;
  return 0;
}
int cudaFree(void* p) {
  if (p == nullptr) return 0;
  std::lock_guard<std::mutex> lock(mu);
  for (size_t i = 0; i < allocs.size(); ++i) {
    if (allocs[i].base == reinterpret_cast<uintptr_t>(p)) {
      allocs.erase(allocs.begin() + static_cast<long>(i));
      std::free(p);
      return 0;
    }
  }
  return 1;
}
int cudaMemcpy(void* dst, const void* src, size_t bytes, int /*kind*/) {
  std::memcpy(dst, src, bytes);
  return 0;
}
int cudaMemset(void* p, int value, size_t bytes) {
  std::memset(p, value, bytes);
  return 0;
}
int cudaDeviceSynchronize() { return 0; }
#endif
int cudaPointerGetAttributes(Attributes* attrs, const void* ptr) {
  std::lock_guard<std::mutex> lock(mu);
  if (forced_error != 0) return forced_error;
  const Alloc* a = Find(reinterpret_cast<uintptr_t>(ptr));
  if (a == nullptr) {
    attrs->type = 0;  // unregistered
    attrs->device = -2;
    return 0;
  }
  attrs->type = 2;  // device
  attrs->device = a->device;
  attrs->device_pointer = const_cast<void*>(ptr);
  attrs->host_pointer = nullptr;
  return 0;
}
int cudaIpcGetMemHandle(char* handle, void* ptr) {
  std::lock_guard<std::mutex> lock(mu);
  ++ipc_calls;
  const Alloc* a = Find(reinterpret_cast<uintptr_t>(ptr));
  if (a == nullptr || a->base != reinterpret_cast<uintptr_t>(ptr)) return 1;  // not a base
  std::memset(handle, 0, 64);
  std::memcpy(handle, "FAKEIPC", 7);
  std::memcpy(handle + 8, &a->base, sizeof(a->base));
  std::memcpy(handle + 16, &a->generation, sizeof(a->generation));
  std::memcpy(handle + 20, &a->device, sizeof(a->device));
  return 0;
}

// ---- Driver API, reached through the entry-point query.
static int FakeMemGetAddressRange(unsigned long long* base, size_t* size,
                                  unsigned long long ptr) {
  std::lock_guard<std::mutex> lock(mu);
  const Alloc* a = Find(static_cast<uintptr_t>(ptr));
  if (a == nullptr || a->device != current_device) return 500;  // CUDA_ERROR_NOT_FOUND
  *base = a->base;
  *size = a->size;
  return 0;
}
static int FakeDeviceGet(int* dev, int ordinal) {
  if (ordinal < 0 || ordinal >= kNumDevices) return 101;
  *dev = ordinal;
  return 0;
}
static int FakeDeviceGetUuid(unsigned char* uuid, int dev) {
  for (int i = 0; i < 16; ++i) uuid[i] = static_cast<unsigned char>(0x10 * dev + i);
  return 0;
}
static int FakeGetErrorName(int r, const char** name) {
  *name = r == 500 ? "CUDA_ERROR_NOT_FOUND" : "CUDA_ERROR_UNKNOWN";
  return 0;
}

int cudaGetDriverEntryPointByVersion(const char* symbol, void** fn, unsigned int /*version*/,
                                     unsigned long long /*flags*/, int* status) {
  *fn = nullptr;
  if (std::strcmp(symbol, "cuMemGetAddressRange") == 0) {
    *fn = reinterpret_cast<void*>(&FakeMemGetAddressRange);
  } else if (std::strcmp(symbol, "cuDeviceGet") == 0) {
    *fn = reinterpret_cast<void*>(&FakeDeviceGet);
  } else if (std::strcmp(symbol, "cuDeviceGetUuid") == 0) {
    *fn = reinterpret_cast<void*>(&FakeDeviceGetUuid);
  } else if (std::strcmp(symbol, "cuGetErrorName") == 0) {
    *fn = reinterpret_cast<void*>(&FakeGetErrorName);
  }
  if (status != nullptr) *status = *fn == nullptr ? 1 : 0;
  return 0;
}

}  // extern "C"
