// cuBLASLt GEMMs of the CUDA backend, one object per device: the handle and the algorithm
// choices are cached here (keyed by shape, types and scale mode); workspaces come from the
// device's stream-ordered memory pool, so concurrent streams never share one.
//
// Both calls compute C[M, N] = alpha * A[M, K] * B[N, K]^T with row-major A, B, C and alpha a
// device pointer (one f32). Thread-safe.
#ifndef FP4Q_KERNELS_SRC_CUDA_BLAS_LT_H_
#define FP4Q_KERNELS_SRC_CUDA_BLAS_LT_H_

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace fp4q::kernels::cuda {

class BlasLt {
 public:
  // Creates the handle on the current device.
  static absl::StatusOr<std::unique_ptr<BlasLt>> Create();
  ~BlasLt();
  BlasLt(const BlasLt&) = delete;
  BlasLt& operator=(const BlasLt&) = delete;

  // bf16 operands, f32 accumulation, C in `c_type` (CUDA_R_32F or CUDA_R_16BF).
  // `alpha_beta` points to two device floats: alpha and 0 (beta).
  absl::Status MatmulBf16(int64_t m, int64_t n, int64_t k, const void* a, const void* b, void* c,
                          cudaDataType_t c_type, const float* alpha_beta, cudaStream_t stream);

  // Native block-scaled FP4 (Blackwell): E2M1 operands with swizzled scales (VEC16_UE4M3 for
  // NVFP4, VEC32_UE8M0 for MXFP4). UNIMPLEMENTED when cuBLASLt has no algorithm for it on this
  // device (the caller falls back to emulation).
  absl::Status MatmulFp4(int64_t m, int64_t n, int64_t k, bool mx, const uint8_t* a_codes,
                         const uint8_t* a_scales, const uint8_t* b_codes, const uint8_t* b_scales,
                         void* c, cudaDataType_t c_type, const float* alpha_beta,
                         cudaStream_t stream);

  // Workspace bytes offered to cuBLASLt per call.
  static constexpr size_t kWorkspaceBytes = size_t{32} << 20;

 private:
  explicit BlasLt(cublasLtHandle_t h) : handle_(h) {}

  struct Key {
    int64_t m, n, k;
    int c_type;
    int kind;  // 0 bf16, 1 nvfp4, 2 mxfp4
    bool operator<(const Key& o) const {
      return std::tie(m, n, k, c_type, kind) < std::tie(o.m, o.n, o.k, o.c_type, o.kind);
    }
  };

  absl::Status Run(const Key& key, cudaDataType_t ab_type, const void* a, const void* b,
                   const void* a_scales, const void* b_scales, void* c, const float* alpha_beta,
                   cudaStream_t stream);

  cublasLtHandle_t handle_;
  absl::Mutex mu_;
  // Cached heuristic choice per problem; absent = not asked yet; `ok = false` = none exists.
  struct Choice {
    bool ok = false;
    cublasLtMatmulAlgo_t algo{};
  };
  std::map<Key, Choice> algos_ ABSL_GUARDED_BY(mu_);
};

}  // namespace fp4q::kernels::cuda

#endif  // FP4Q_KERNELS_SRC_CUDA_BLAS_LT_H_
