// CUDA / cuBLASLt errors as absl::Status; see cuda_status.h.
#include "cuda/cuda_status.h"

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"

namespace fp4q::kernels::cuda {

bool IsStickyCudaError(cudaError_t e) {
  switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorAssert:
    case cudaErrorLaunchTimeout:
    case cudaErrorECCUncorrectable:
    case cudaErrorContextIsDestroyed:
    case cudaErrorDevicesUnavailable:
    case cudaErrorUnknown:
      return true;
    default:
      return false;
  }
}

absl::Status CudaErrorToStatus(cudaError_t e, const char* expr, const char* file, int line) {
  if (e == cudaSuccess) return absl::OkStatus();
  // A failed runtime call also becomes the thread's "last error"; clear it (unless sticky, which
  // cannot be cleared) so the next launch check does not report it again.
  if (!IsStickyCudaError(e)) cudaGetLastError();
  const std::string msg = absl::StrCat(file, ":", line, ": ", expr, ": ", cudaGetErrorString(e),
                                       " (", cudaGetErrorName(e), ")");
  switch (e) {
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(msg);
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInitializationError:
      return absl::UnavailableError(msg);
    default: {
      absl::Status s = absl::InternalError(msg);
      if (IsStickyCudaError(e)) s.SetPayload(kStickyPayload, absl::Cord(cudaGetErrorName(e)));
      return s;
    }
  }
}

bool IsStickyStatus(const absl::Status& s) {
  return !s.ok() && s.GetPayload(kStickyPayload).has_value();
}

absl::Status CublasErrorToStatus(cublasStatus_t e, const char* expr, const char* file, int line) {
  if (e == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  const std::string msg = absl::StrCat(file, ":", line, ": ", expr, ": ",
                                       cublasLtGetStatusString(e), " (", cublasLtGetStatusName(e),
                                       ")");
  switch (e) {
    case CUBLAS_STATUS_ALLOC_FAILED:
      return absl::ResourceExhaustedError(msg);
    case CUBLAS_STATUS_NOT_SUPPORTED:
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return absl::UnimplementedError(msg);
    default:
      return absl::InternalError(msg);
  }
}

}  // namespace fp4q::kernels::cuda
