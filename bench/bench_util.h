// Measurement helpers of fp4q_bench: CUDA-event timing with warm-up and medians, device buffers
// with random (never zero) contents, the cuBLASLt bf16 GEMM baseline, and the JSON record.
#ifndef FP4Q_BENCH_BENCH_UTIL_H_
#define FP4Q_BENCH_BENCH_UTIL_H_

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace fp4q::bench {

// Exits with a message on a CUDA or cuBLASLt error (a benchmark has no way to go on).
void Check(cudaError_t e, const char* what);
void CheckBlas(cublasStatus_t e, const char* what);

struct Timing {
  double median_us = 0;
  double min_us = 0;
  double max_us = 0;
  int iters = 0;
};

// Runs fn(i) `warmup` times, then `iters` times each between two events on `s`; medians.
Timing TimeEvents(cudaStream_t s, int warmup, int iters, const std::function<void(int)>& fn);
// Host wall-clock per call of `calls` back-to-back calls (one synchronize at the end); with
// `enqueue_us`, also the host's time per call before that synchronize (the calls' own host
// cost where the GPU keeps up; the wall where the host waits on a full launch queue).
double WallPerCallUs(cudaStream_t s, int calls, const std::function<void(int)>& fn,
                     double* enqueue_us = nullptr);

// A device allocation (cudaMalloc) freed on destruction.
class DevMem {
 public:
  explicit DevMem(size_t bytes);
  ~DevMem();
  DevMem(const DevMem&) = delete;
  DevMem& operator=(const DevMem&) = delete;
  void* get() const { return p_; }
  size_t size() const { return bytes_; }

 private:
  void* p_ = nullptr;
  size_t bytes_;
};

// n bf16 (or f32) values ~ N(0, sigma) with a few larger ones, never all zero, from `seed`.
std::vector<uint16_t> RandomBf16(size_t n, uint64_t seed, float sigma = 1.0f);
std::vector<float> RandomF32(size_t n, uint64_t seed, float sigma = 1.0f);

// C[M, N] (bf16) = A[M, K] (bf16) * B[N, K]^T with cuBLASLt (f32 accumulation), the baseline.
class CublasBf16Gemm {
 public:
  CublasBf16Gemm(int64_t m, int64_t n, int64_t k);
  ~CublasBf16Gemm();
  void Run(const void* a, const void* b, void* c, cudaStream_t s);

 private:
  cublasLtHandle_t h_ = nullptr;
  cublasLtMatmulDesc_t op_ = nullptr;
  cublasLtMatrixLayout_t la_ = nullptr, lb_ = nullptr, lc_ = nullptr;
  cublasLtMatmulAlgo_t algo_{};
  void* ws_ = nullptr;
  size_t ws_bytes_ = size_t{64} << 20;
};

// One row of the result table.
struct Row {
  std::string name;       // e.g. "quantize_nvfp4_1x16_rtn_amax_given"
  std::string shape;      // e.g. "8192x8192 bf16"
  double us = 0;          // median microseconds
  double bytes = 0;       // bytes read + written (0 when not a memory-bound row)
  double flops = 0;       // floating-point operations (GEMM rows)
  double baseline_us = 0; // cuBLAS on the same shape (GEMM rows)
  std::string target;     // the target, in words
  double target_value = 0;
  std::string target_kind;  // "copy_fraction", "max_us", "speedup_vs_cublas", "throughput_vs_cublas"
  std::string note;
};

std::string Json(const std::string& s);
// Writes the JSON record; returns false on an I/O error.
bool WriteJson(const std::string& path, const std::string& header_json, double copy_gbps,
               const std::vector<Row>& rows);
// Whether a row meets its target (copy_gbps: the measured copy ceiling).
bool Met(const Row& r, double copy_gbps);
std::string MarkdownTable(double copy_gbps, const std::vector<Row>& rows);

}  // namespace fp4q::bench

#endif  // FP4Q_BENCH_BENCH_UTIL_H_
