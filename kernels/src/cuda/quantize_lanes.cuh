// What the lane-granular quantize kernels share: quantize_lanes.cu (one 16-element block a
// lane: Quantize and QDQ without error feedback) and quantize_lane_pairs.cu (a lane pair a block:
// error feedback and its amax-only passes). Device code; included by those two files only.
#ifndef FP4Q_KERNELS_SRC_CUDA_QUANTIZE_LANES_CUH_
#define FP4Q_KERNELS_SRC_CUDA_QUANTIZE_LANES_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "div_magic.h"
#include "launch.h"

namespace fp4q::kernels::cuda::lanes {

constexpr int kThreads = 256;
constexpr unsigned kFull = 0xFFFFFFFFu;

struct LaneParams {
  RowParams p;
  uint64_t n_gran = 0;     // 8-element granules (elements / 8)
  uint32_t n_blocks = 0;   // 16-element blocks (elements / 16 < 2^31)
  // Non-null: compute the global amax in the launch itself (see QuantizeBlocksKernel).
  float* fused_amax = nullptr;
  // floor((2^64 - 1) / scale_cols) + 1: block -> row (swizzled). This form wraps for a divisor
  // of 1 (div_magic.h's does not); the lane kernels' rows are 64 elements or more, so
  // scale_cols >= 2 here.
  uint64_t row_magic = 0;
  uint32_t scale_cols = 0;
  // The RHT's signs (q.rht_signs) as sign bits of packed bf16 pairs: word k flips elements 2k
  // (bit 15) and 2k + 1 (bit 31) of a block.
  uint32_t rht_sign_words[8] = {};
  // NVFP4 16x16 (LaneBlockIndex): a warp step covers 16 rows by 2 * kU blocks, units_per_row
  // steps a row of tiles; unit_magic = DivMagic(units_per_row) (div_magic.h).
  uint32_t units_per_row = 0;
  uint64_t unit_magic = 0;
  // p.q.sr_keys' first two rounds at p.q.step (SR groups are below 2^32 here: n_blocks < 2^31).
  PhiloxHead sr_head;
};

// CTAs per SM the kernel reaches (registers), asked once per kernel; the grid is one wave.
template <typename Kernel>
int ResidentCtas(Kernel k) {
  int n = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k, kThreads, 0) != cudaSuccess || n < 1) {
    cudaGetLastError();
    n = 2;
  }
  return n;
}

// Error feedback on quantize_lane_pairs.cu's kernel: the quantizing pass (sr: stochastic
// rounding) or, with `track`, the guarded amax-only pass (first non-finite x and v; no rounding).
// In: float or __nv_bfloat16.
template <typename In>
cudaError_t LaunchLanePairs(const LaneParams& lp, bool sr, bool track, cudaStream_t s);

}  // namespace fp4q::kernels::cuda::lanes

#endif  // FP4Q_KERNELS_SRC_CUDA_QUANTIZE_LANES_CUH_
