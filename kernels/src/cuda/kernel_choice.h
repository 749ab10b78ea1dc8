// Which kernel runs a row-wise quantization pass: the one host-side decision for every such
// pass the CUDA backend launches (cuda_ops.cc plans the passes; quantize_rows.cu and
// quantize_lanes.cu launch what this says). Plain C++, no CUDA types, so it is unit-tested on
// machines without a GPU (tests/kernels/kernel_choice_test.cc).
//
// The kernels (all bit-identical, NUMERICS):
//   kRows               quantize_rows.cu: one thread per 32 elements of a row; every format
//                       (MXFP4, 16x16 tiles, four-over-six) and row length.
//                       (16x16 Quantize and QDQ on the lanes: tile pairs, map-to-6, rows a
//                       multiple of 16.)
//   kLanesGuardedAmax   quantize_lane_pairs.cu, the guarded amax-only pass of error feedback
//                       (first non-finite x and v; no rounding).
//   kLanesResidual      quantize_lane_pairs.cu, a lane pair per block with the f32 residual (error
//                       feedback, QDQ and Quantize).
//   kLanesBlocks        quantize_lanes.cu, one block a lane (no residual; MXFP4 a lane pair per
//                       block), 3 CTAs per SM.
//   kLanesBlocksFourCtas the same for bf16 input at 4 CTAs per SM (KernelTuning).
// The lane kernels cover NVFP4 1x16 with map-to-6 scales, NVFP4 16x16 tiles with map-to-6
// scales and MXFP4 without a residual, rows whose length is a multiple of 64, no RHT with a
// residual, and fewer than 2^31 blocks.
#ifndef FP4Q_KERNELS_SRC_CUDA_KERNEL_CHOICE_H_
#define FP4Q_KERNELS_SRC_CUDA_KERNEL_CHOICE_H_

#include <cstdint>

#include "cuda/kernel_codes.h"

namespace fp4q::kernels::cuda {

// Knobs of the CUDA backend's kernels (fp4qd --cuda_row_kernels, --cuda_bf16_block_ctas,
// --cuda_step_prefetch; fp4q_bench for A/B measurements). The defaults are what the H200
// measurements chose (bench/results/h200.md).
inline constexpr int kMaxStepPrefetchSlots = 16;
struct KernelTuning {
  bool rows_only = false;  // every pass takes kRows (and two-output passes the shared tiles)
  int bf16_block_ctas = 3;  // 3 or 4: CTAs per SM of the bf16 one-block-a-lane kernel
  // Slots (256 elements each) past those a lane keeps in flight in its shared-memory ring that a
  // warp of the SGD step's apply and current-scaling check asks L2 for, in
  // [0, kMaxStepPrefetchSlots]; 0: no prefetch.
  int step_prefetch_slots = 2;
};

// What the choice depends on, from the pass's RowParams.
struct RowPass {
  int fmt = kFmtNv1x16;
  int scale_sel = kSelMapTo6;
  bool rht = false;
  bool residual = false;     // error feedback: the f32 residual is read (and written)
  bool amax_only = false;    // the pass only reduces max |v|
  bool guarded = false;      // the guarded amax-only pass (first non-finite x and v)
  int x_dtype = kBF16;
  int64_t rows = 0;
  int64_t cols = 0;
};

enum class RowKernel { kRows, kLanesGuardedAmax, kLanesResidual, kLanesBlocks, kLanesBlocksFourCtas };

RowKernel ChooseRowKernel(const RowPass& p, const KernelTuning& t);

// Elements up to which the global amax and the quantization share one cooperative launch.
inline constexpr uint64_t kFusedAmaxMaxElems = uint64_t{1} << 20;

// Whether a pass that computes its own global amax can do it in that one launch: a
// one-block-a-lane pass of at most kFusedAmaxMaxElems elements.
bool FusedAmaxFits(const RowPass& p, const KernelTuning& t);

// Elements up to which such a pass over bf16 x has every CTA reduce the whole tensor instead
// (an ordinary launch, no grid barrier): 128 KB read once more by each of a few CTAs, from L2.
inline constexpr uint64_t kCtaAmaxMaxElems = uint64_t{1} << 16;
// Whether such a pass (FusedAmaxFits) takes that launch: bf16 x of at most kCtaAmaxMaxElems.
bool CtaAmaxFits(const RowPass& p);

const char* RowKernelName(RowKernel k);

// Whether a two-output pass (row-wise and/or column-wise output from one read of x,
// quantize_tile.cu) takes the lane tiles (a CTA task of 64 rows x 256 columns, a block a lane
// for each output) rather than the shared 64 x 128 tiles: NVFP4 1x16 with map-to-6 scales from
// bf16 x, rows a multiple of 64, columns of 256, fewer than 2^31 blocks. KernelTuning::rows_only
// says no.
bool LaneTilesCover(const RowPass& p, const KernelTuning& t);

}  // namespace fp4q::kernels::cuda

#endif  // FP4Q_KERNELS_SRC_CUDA_KERNEL_CHOICE_H_
