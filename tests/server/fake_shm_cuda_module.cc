// A stand-in for libfp4q_cuda.so that lets the end-to-end tests drive fp4qd's
// region paths (RegisterCudaRegion, region slices, leases, handle accounting)
// on a machine without a GPU.
//
// One "GPU", UUID kFakeShmUuid, whose memory is host memory and whose
// computations are the CPU backend's. Its IPC handles name POSIX shared memory
// objects instead of CUDA allocations:
//   handle = "FP4QSHM:" + shm name ("/..."), NUL-padded to 64 bytes.
// OpenIpcHandle maps the whole object (shm_open + mmap); CloseIpcHandle unmaps
// it. A handle that is not of this form, or names no object, is
// INVALID_ARGUMENT "ipc_handle: ...". The tests create the objects
// (shm_test_util.h) in the client process, so data really crosses processes, as
// with CUDA IPC.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "fp4q/kernels/backend.h"
#include "fp4q/kernels/cuda_module.h"

namespace {

constexpr char kFakeShmUuid[] = "GPU-fake-shm-0";
constexpr char kPrefix[] = "FP4QSHM:";

class ShmIpcBackend final : public fp4q::kernels::Backend {
 public:
  ShmIpcBackend() : cpu_(fp4q::kernels::CreateCpuBackend()) {}

  fp4q::kernels::DeviceInfo Info() const override {
    fp4q::kernels::DeviceInfo i = cpu_->Info();
    i.backend = "cuda";
    i.ordinal = 0;
    i.uuid = kFakeShmUuid;
    i.name = "fake GPU over host memory (POSIX shared memory IPC)";
    return i;
  }
  absl::StatusOr<void*> Allocate(size_t bytes) override { return cpu_->Allocate(bytes); }
  void Free(void* p) override { cpu_->Free(p); }
  absl::Status CopyFromHost(void* d, const void* s, size_t n, fp4q::kernels::Stream st) override {
    return cpu_->CopyFromHost(d, s, n, st);
  }
  absl::Status CopyToHost(void* d, const void* s, size_t n, fp4q::kernels::Stream st) override {
    return cpu_->CopyToHost(d, s, n, st);
  }
  absl::Status CopyDeviceToDevice(void* d, const void* s, size_t n,
                                  fp4q::kernels::Stream st) override {
    return cpu_->CopyDeviceToDevice(d, s, n, st);
  }
  absl::Status Memset(void* d, int v, size_t n, fp4q::kernels::Stream st) override {
    return cpu_->Memset(d, v, n, st);
  }
  absl::Status Synchronize(fp4q::kernels::Stream st) override { return cpu_->Synchronize(st); }
  absl::Status Healthy() const override { return cpu_->Healthy(); }

  absl::StatusOr<void*> OpenIpcHandle(const std::string& handle) override {
    if (handle.size() != 64 || handle.compare(0, 8, kPrefix) != 0) {
      return absl::InvalidArgumentError("ipc_handle: not a fake shared-memory handle");
    }
    const std::string name(handle.c_str() + 8);  // up to the first NUL
    if (name.empty() || name[0] != '/') {
      return absl::InvalidArgumentError("ipc_handle: no shared memory object name");
    }
    const int fd = ::shm_open(name.c_str(), O_RDWR, 0);
    if (fd < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("ipc_handle: invalid resource handle (", std::strerror(errno), ")"));
    }
    struct stat st;
    void* base = MAP_FAILED;
    if (::fstat(fd, &st) == 0 && st.st_size > 0) {
      base = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED,
                    fd, 0);
    }
    ::close(fd);
    if (base == MAP_FAILED) return absl::InvalidArgumentError("ipc_handle: cannot map the object");
    std::lock_guard<std::mutex> lock(mu_);
    mapped_[base] = static_cast<size_t>(st.st_size);
    return base;
  }
  absl::StatusOr<size_t> IpcMappingSize(void* base) const override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = mapped_.find(base);
    if (it == mapped_.end()) return absl::InvalidArgumentError("base: not an open handle");
    return it->second;
  }
  absl::Status CloseIpcHandle(void* base) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = mapped_.find(base);
    if (it == mapped_.end()) return absl::InvalidArgumentError("base: not an open handle");
    ::munmap(base, it->second);
    mapped_.erase(it);
    return absl::OkStatus();
  }

 protected:
  using CT = fp4q::kernels::ConstTensor;
  using MT = fp4q::kernels::MutTensor;
  using QT = fp4q::kernels::QuantizedTensor;
  using CQT = fp4q::kernels::ConstQuantizedTensor;
  using QO = fp4q::kernels::QuantizeOptions;
  using S = fp4q::kernels::Stream;
  using Guard = fp4q::kernels::FiniteGuard;
  using Items = std::vector<fp4q::kernels::StepItem>;
  absl::Status DoAmax(const CT& x, float* amax, int64_t* first_nonfinite, S s) override {
    return cpu_->Amax(x, amax, s, first_nonfinite);
  }
  absl::Status DoQuantize(const CT& x, const QO& o, float* r, const QT* rw, const QT* cw,
                          Guard* guard, S s) override {
    return cpu_->Quantize(x, o, r, rw, cw, s, guard);
  }
  absl::Status DoDequantize(const CQT& q, const MT& out, S s) override {
    return cpu_->Dequantize(q, out, s);
  }
  absl::Status DoQdq(const CT& x, const QO& o, float* r, const MT& out, Guard* guard,
                     S s) override {
    return cpu_->Qdq(x, o, r, out, s, guard);
  }
  absl::Status DoMatmul(const CQT& a, const CQT& b, const MT& c, S s) override {
    return cpu_->Matmul(a, b, c, s);
  }
  absl::Status DoStepCheck(const Items& items, void* ws, S s,
                           const fp4q::kernels::StepCancel& cancel) override {
    return cpu_->StepCheck(items, ws, fp4q::kernels::StepWorkspaceBytes(items), s, cancel);
  }
  absl::Status DoStepApply(const Items& items, void* ws, S s) override {
    return cpu_->StepApply(items, ws, s);
  }
  absl::Status DoStepReadReport(const Items& items, const void* ws,
                                fp4q::kernels::StepReport* report, S s) override {
    return cpu_->StepReadReport(items, ws, report, s);
  }
  absl::Status DoRht(const CT& in, fp4q::kernels::RhtMode m, uint64_t seed, bool inv, const MT& out,
                     S s) override {
    return cpu_->Rht(in, m, seed, inv, out, s);
  }

 private:
  std::unique_ptr<fp4q::kernels::Backend> cpu_;
  mutable std::mutex mu_;
  std::map<void*, size_t> mapped_;
};

}  // namespace

extern "C" {

int fp4q_cuda_abi_version(void) { return FP4Q_CUDA_ABI_VERSION; }

int fp4q_cuda_device_count(char* /*err*/, size_t /*err_len*/) { return 1; }

fp4q::kernels::Backend* fp4q_cuda_create_backend(int ordinal, const fp4q_cuda_options* /*options*/,
                                                 char* err, size_t err_len) {
  if (ordinal != 0) {
    std::snprintf(err, err_len, "fake shm module: no device %d", ordinal);
    return nullptr;
  }
  return new ShmIpcBackend();
}

}  // extern "C"
