// The CPU reference backend: host memory, and the numerics of NUMERICS.md computed plainly on
// host copies (cpu/*.h). Stateless, so one object serves any number of threads. Every entry
// point reads all its inputs into host matrices before writing any output, so outputs may alias
// inputs where backend.h allows it.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "cpu/error_feedback.h"
#include "cpu/host_tensor.h"
#include "cpu/matmul.h"
#include "cpu/nvfp4.h"
#include "cpu/quantize.h"
#include "cpu/rht.h"
#include "cpu/step.h"
#include "fp4q/kernels/backend.h"
#include "step_report.h"

namespace fp4q::kernels {
namespace {

constexpr size_t kAlignment = 64;

absl::Status CheckCopy(const void* dst, const void* src, size_t bytes) {
  if (bytes > 0 && (dst == nullptr || src == nullptr)) {
    return absl::InvalidArgumentError(
        absl::StrCat(dst == nullptr ? "dst" : "src", ": null with bytes ", bytes));
  }
  return absl::OkStatus();
}

class CpuBackend final : public Backend {
 public:
  DeviceInfo Info() const override {
    DeviceInfo info;
    info.backend = "cpu";
    info.ordinal = -1;
    info.uuid = "cpu";
    info.name = "CPU reference backend";
    const long pages = sysconf(_SC_PHYS_PAGES);
    const long page_size = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page_size > 0) {
      info.total_memory = static_cast<size_t>(pages) * static_cast<size_t>(page_size);
    }
    return info;
  }

  absl::StatusOr<void*> Allocate(size_t bytes) override {
    const size_t rounded = (std::max<size_t>(bytes, 1) + kAlignment - 1) / kAlignment * kAlignment;
    if (rounded < bytes) {
      return absl::ResourceExhaustedError(absl::StrCat("bytes: ", bytes, " cannot be allocated"));
    }
    void* p = std::aligned_alloc(kAlignment, rounded);
    if (p == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("host allocation of ", bytes, " bytes failed"));
    }
    return p;
  }

  void Free(void* ptr) override { std::free(ptr); }

  absl::Status CopyFromHost(void* dst, const void* src, size_t bytes, Stream) override {
    return Copy(dst, src, bytes);
  }
  absl::Status CopyToHost(void* dst, const void* src, size_t bytes, Stream) override {
    return Copy(dst, src, bytes);
  }
  absl::Status CopyDeviceToDevice(void* dst, const void* src, size_t bytes, Stream) override {
    return Copy(dst, src, bytes);
  }
  absl::Status Memset(void* dst, int value, size_t bytes, Stream) override {
    if (bytes > 0 && dst == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("dst: null with bytes ", bytes));
    }
    if (bytes > 0) std::memset(dst, value, bytes);
    return absl::OkStatus();
  }
  absl::Status Synchronize(Stream) override { return absl::OkStatus(); }
  absl::Status Healthy() const override { return absl::OkStatus(); }

  absl::StatusOr<void*> OpenIpcHandle(const std::string&) override {
    return absl::FailedPreconditionError("CUDA IPC is not available on the CPU backend");
  }
  absl::Status CloseIpcHandle(void*) override {
    return absl::FailedPreconditionError("CUDA IPC is not available on the CPU backend");
  }

 protected:
  absl::Status DoAmax(const ConstTensor& x, float* amax, int64_t* first_nonfinite,
                      Stream) override {
    const cpu::Matrix m = cpu::LoadDense(x);
    *amax = cpu::AbsMax(m.values.data(), m.values.size());
    if (first_nonfinite != nullptr) {
      *first_nonfinite = -1;
      for (size_t i = 0; i < m.values.size(); ++i) {
        if (!std::isfinite(m.values[i])) {
          *first_nonfinite = static_cast<int64_t>(i);
          break;
        }
      }
    }
    return absl::OkStatus();
  }

  absl::Status DoQuantize(const ConstTensor& x, const QuantizeOptions& options, float* residual,
                          const QuantizedTensor* rowwise, const QuantizedTensor* columnwise,
                          FiniteGuard* guard, Stream) override {
    const cpu::Matrix m = cpu::LoadDense(x);
    if (residual != nullptr) {
      cpu::Matrix r = cpu::LoadF32(residual, x.rows, x.cols);
      if (guard != nullptr) {
        *guard = cpu::FeedbackGuard(m, r, options, /*bf16_out=*/false);
        if (guard->outcome != StepOutcome::kOk) return absl::OkStatus();  // nothing written
      }
      const cpu::HostQuantized q = cpu::QuantizeWithFeedback(m, options, &r);
      cpu::StoreQuantized(q, *rowwise);
      std::memcpy(residual, r.values.data(), r.values.size() * sizeof(float));
      return absl::OkStatus();
    }
    if (rowwise != nullptr) {
      cpu::StoreQuantized(cpu::QuantizeMatrix(m, x.dtype, options, /*columnwise=*/false), *rowwise);
    }
    if (columnwise != nullptr) {
      cpu::StoreQuantized(cpu::QuantizeMatrix(m, x.dtype, options, /*columnwise=*/true),
                          *columnwise);
    }
    return absl::OkStatus();
  }

  absl::Status DoDequantize(const ConstQuantizedTensor& q, const MutTensor& out, Stream) override {
    cpu::StoreDense(cpu::DequantizeHost(cpu::LoadQuantized(q)), out);
    return absl::OkStatus();
  }

  absl::Status DoQdq(const ConstTensor& x, const QuantizeOptions& options, float* residual,
                     const MutTensor& out, FiniteGuard* guard, Stream) override {
    const cpu::Matrix m = cpu::LoadDense(x);
    cpu::HostQuantized q;
    cpu::Matrix r;
    if (residual != nullptr) {
      r = cpu::LoadF32(residual, x.rows, x.cols);
      if (guard != nullptr) {
        *guard = cpu::FeedbackGuard(m, r, options, out.dtype == DType::kBF16);
        if (guard->outcome != StepOutcome::kOk) return absl::OkStatus();  // nothing written
      }
      q = cpu::QuantizeWithFeedback(m, options, &r);
    } else {
      q = cpu::QuantizeMatrix(m, x.dtype, options, /*columnwise=*/false);
    }
    cpu::StoreDense(cpu::DequantizeHost(q), out);
    if (residual != nullptr) {
      std::memcpy(residual, r.values.data(), r.values.size() * sizeof(float));
    }
    return absl::OkStatus();
  }

  absl::Status DoMatmul(const ConstQuantizedTensor& a, const ConstQuantizedTensor& b,
                        const MutTensor& c, Stream) override {
    cpu::MatmulReference(cpu::LoadQuantized(a), cpu::LoadQuantized(b), c);
    return absl::OkStatus();
  }

  absl::Status DoStepCheck(const std::vector<StepItem>& items, void* workspace, Stream,
                           const StepCancel& cancel) override {
    cpu::StepCheckHost(items, static_cast<uint8_t*>(workspace), cancel);
    return absl::OkStatus();
  }

  absl::Status DoStepApply(const std::vector<StepItem>& items, void* workspace, Stream) override {
    return cpu::StepApplyHost(items, static_cast<uint8_t*>(workspace));
  }

  absl::Status DoStepCheckAndApply(const std::vector<StepItem>& items, void* workspace, Stream,
                                   const StepCancel& cancel) override {
    auto* ws = static_cast<uint8_t*>(workspace);
    if (items[0].next.present()) return cpu::StepOnePassHost(items, ws, cancel);
    cpu::StepCheckHost(items, ws, cancel);
    return cpu::StepApplyHost(items, ws);
  }

  absl::Status DoStepReadReport(const std::vector<StepItem>& items, const void* workspace,
                                StepReport* report, Stream) override {
    DecodeStepReport(items, StepLayoutOf(items), static_cast<const uint8_t*>(workspace), report);
    return absl::OkStatus();
  }

  absl::Status DoRht(const ConstTensor& in, RhtMode mode, uint64_t rht_seed, bool inverse,
                     const MutTensor& out, Stream) override {
    cpu::Matrix m = cpu::LoadDense(in);
    cpu::RhtRows(&m.values, m.rows, m.cols, cpu::RhtSignMask(mode, rht_seed), inverse, in.dtype);
    cpu::StoreDense(m, out);
    return absl::OkStatus();
  }

 private:
  static absl::Status Copy(void* dst, const void* src, size_t bytes) {
    if (auto s = CheckCopy(dst, src, bytes); !s.ok()) return s;
    if (bytes > 0) std::memmove(dst, src, bytes);
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<Backend> CreateCpuBackend() { return std::make_unique<CpuBackend>(); }

}  // namespace fp4q::kernels
