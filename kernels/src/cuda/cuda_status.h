// CUDA and cuBLASLt errors as absl::Status (STYLE "Errors"): every call is checked and turned
// into a Status carrying file:line, the expression and the library's message, e.g.
//   "kernels/src/cuda/cuda_backend.cc:120: cudaMalloc(&p, bytes): out of memory
//    (cudaErrorMemoryAllocation)".
// Codes: allocation failures RESOURCE_EXHAUSTED; missing driver/device UNAVAILABLE; everything
// else INTERNAL. IsStickyCudaError() names the errors that poison the CUDA context.
#ifndef FP4Q_KERNELS_SRC_CUDA_CUDA_STATUS_H_
#define FP4Q_KERNELS_SRC_CUDA_CUDA_STATUS_H_

#include <cublasLt.h>
#include <cuda_runtime.h>

#include "absl/status/status.h"

namespace fp4q::kernels::cuda {

// True for errors after which the context is unusable (illegal address and kin).
bool IsStickyCudaError(cudaError_t e);

// Statuses made from sticky errors carry this payload (the CUDA error name).
inline constexpr char kStickyPayload[] = "fp4q/cuda-sticky-error";
bool IsStickyStatus(const absl::Status& s);

absl::Status CudaErrorToStatus(cudaError_t e, const char* expr, const char* file, int line);
absl::Status CublasErrorToStatus(cublasStatus_t e, const char* expr, const char* file, int line);

}  // namespace fp4q::kernels::cuda

#define FP4Q_CUDA_STATUS(expr) \
  ::fp4q::kernels::cuda::CudaErrorToStatus((expr), #expr, __FILE__, __LINE__)

#define FP4Q_CUBLAS_STATUS(expr) \
  ::fp4q::kernels::cuda::CublasErrorToStatus((expr), #expr, __FILE__, __LINE__)

// Evaluates a cudaError_t expression; returns a Status from the enclosing function when it fails.
#define FP4Q_CUDA_RETURN_IF_ERROR(expr)                                  \
  do {                                                                   \
    const cudaError_t fp4q_cuda_err_ = (expr);                           \
    if (fp4q_cuda_err_ != cudaSuccess) {                                 \
      return ::fp4q::kernels::cuda::CudaErrorToStatus(fp4q_cuda_err_, #expr, __FILE__, \
                                                       __LINE__);        \
    }                                                                    \
  } while (0)

#define FP4Q_CUBLAS_RETURN_IF_ERROR(expr)                                \
  do {                                                                   \
    const cublasStatus_t fp4q_cublas_err_ = (expr);                      \
    if (fp4q_cublas_err_ != CUBLAS_STATUS_SUCCESS) {                     \
      return ::fp4q::kernels::cuda::CublasErrorToStatus(fp4q_cublas_err_, #expr, __FILE__, \
                                                         __LINE__);      \
    }                                                                    \
  } while (0)

#endif  // FP4Q_KERNELS_SRC_CUDA_CUDA_STATUS_H_
