// Launchers of the optimizer step's kernels (step_check.cu, step_apply_*.cu): plain parameter
// structs over the workspace of step_layout.h and functions returning cudaError_t, the seam
// between cuda_step.cc (absl::Status, the host-built item table) and the kernels. Includes only
// the CUDA runtime and the plain layout header.
//
// Every launcher checks cudaGetLastError() after its launch. Nothing here synchronizes.
#ifndef FP4Q_KERNELS_SRC_CUDA_STEP_LAUNCH_H_
#define FP4Q_KERNELS_SRC_CUDA_STEP_LAUNCH_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/kernel_codes.h"
#include "step_layout.h"

namespace fp4q::kernels::cuda {

// One grouped launch over the items of one kernel variant: entries [0, n_entries) of `list`,
// whose entry n_entries holds the launch's total of warp-units (step_ws::kUnitElems each).
struct StepKernelArgs {
  const step_ws::Header* header = nullptr;  // the batch flag (the apply is gated on it)
  // One pass: each CTA of the apply that passes the cancellation gate writes 1 here
  // (Header::one_pass_ran), so that the restore rewrites outputs only where an apply ran.
  int32_t* ran = nullptr;
  const step_ws::ItemDesc* descs = nullptr;
  const step_ws::UpdateDesc* updates = nullptr;
  const step_ws::OutDesc* outs = nullptr;
  const step_ws::ListEntry* list = nullptr;
  int32_t n_entries = 0;
  int64_t total_units = 0;
  const step_ws::Plan* plans = nullptr;
  uint64_t* idx_acc = nullptr;      // [item][kIdxSlots][kAccCopies]
  uint64_t* upd_idx_acc = nullptr;  // [update][kAccCopies]
  uint32_t* max_acc = nullptr;      // [item][kMaxSlots][kAccCopies]
  uint64_t* fp_acc = nullptr;       // [update][kAccCopies]
  // How many slots ahead of the one it works on a warp asks L2 for (0: none; the backend's
  // tuning, kernel_choice.h's KernelTuning::step_prefetch_slots).
  int32_t prefetch_slots = 0;
  // One-pass apply: it does not wait for a decision, so it returns at once when the step's
  // StepCancel word holds its token (null: never).
  const uint32_t* cancel_word = nullptr;
  uint32_t cancel_token = 0;
};

// The per-item decision after the check kernels (one CTA): reports, fingerprints, plans and the
// batch flag.
struct StepDecideArgs {
  step_ws::Header* header = nullptr;
  const step_ws::ItemDesc* descs = nullptr;
  const step_ws::UpdateDesc* updates = nullptr;
  int32_t n_items = 0;
  int32_t n_updates = 0;
  step_ws::ReportPod* reports = nullptr;
  uint64_t* fingerprints = nullptr;
  step_ws::Plan* plans = nullptr;
  const uint64_t* idx_acc = nullptr;
  const uint64_t* upd_idx_acc = nullptr;
  const uint32_t* max_acc = nullptr;
  const uint64_t* fp_acc = nullptr;
  const uint32_t* cancel_word = nullptr;  // StepCancel: refuse the batch when it holds the token
  uint32_t cancel_token = 0;
};

// The apply's epilogue (one CTA, gated): global records of the weights and NVFP4 moments, and
// the statistics.
struct StepFinishArgs {
  const step_ws::Header* header = nullptr;
  const step_ws::ItemDesc* descs = nullptr;
  int32_t n_items = 0;
  const step_ws::Plan* plans = nullptr;
  const uint32_t* max_acc = nullptr;
};

// A batch's workspace set before its other work: the header zeroed, the first-index
// accumulators [ff_begin, ff_end) to all ones (no index), the maxima and fingerprint sums
// [ff_end, total) to zero (byte offsets of step_ws::Layout, multiples of 16).
cudaError_t LaunchStepInit(void* workspace, size_t ff_begin, size_t ff_end, size_t total,
                           cudaStream_t s);
// The largest item table LaunchStepInitWithTable carries in its launch (a kernel argument; CUDA
// 12.1+ takes up to 32764 bytes of them): GPT-2's 50 items are 21.9 KB.
inline constexpr size_t kInlineTableBytes = 24 * 1024;
// LaunchStepInit's work, and the item table's `table_bytes` bytes at `table` (host memory, read
// at the call) written to [table_at, table_at + table_bytes) of the workspace by the same kernel:
// no host-to-device copy between the initial values and the step's kernels, so that those start
// as programmatic dependent launches behind it. cudaErrorInvalidValue for a table over
// kInlineTableBytes or offsets that are not multiples of 16, or a table that overlaps the
// header or [ff_begin, total).
cudaError_t LaunchStepInitWithTable(void* workspace, size_t ff_begin, size_t ff_end, size_t total,
                                    const void* table, size_t table_at, size_t table_bytes,
                                    cudaStream_t s);
// Updates only (delayed scaling and check-only items): finiteness of every rank and of the
// rank sum / mean, max |g|, fingerprints.
cudaError_t LaunchStepCheckUpdates(const StepKernelArgs& a, cudaStream_t s);
// The same results when every item of the launch has one update (step_check_lean.cu: the raw
// words, no rank loop).
cudaError_t LaunchStepCheckOneRank(const StepKernelArgs& a, cudaStream_t s);
// Current scaling: the whole computation of NUMERICS 10.2 D..V without writes, for items of
// one optimizer variant (step_ws::kOpt*) and state dtype (step_ws::kSt*).
cudaError_t LaunchStepCheckFull(const StepKernelArgs& a, int opt, int state_dtype, cudaStream_t s);
cudaError_t LaunchStepDecide(const StepDecideArgs& a, cudaStream_t s);
// The apply of items of one variant, gated on the batch flag. SGD (plain, momentum) in
// step_apply_sgd.cu, AdamW in step_apply_adamw.cu.
cudaError_t LaunchStepApplySgd(const StepKernelArgs& a, int opt, int state_dtype, bool sr,
                               bool tile16, cudaStream_t s);
cudaError_t LaunchStepApplyAdamW(const StepKernelArgs& a, int opt, int state_dtype, bool sr,
                                 bool tile16, cudaStream_t s);
// The apply of a launch whose every item is LeanSgdItem (step_apply.cuh's lean SGD run alone,
// with more CTAs an SM under RTN).
cudaError_t LaunchStepApplySgdLean(const StepKernelArgs& a, bool sr, cudaStream_t s);
// One-pass steps (step.h StepNext; every item LeanSgdItem, delayed scaling): the lean apply,
// gated on the step's cancellation word alone (StepKernelArgs::cancel_word), writing each item's
// new state to its *_next pointers and accumulating what the one-rank check does (first
// non-finite index, max |g|, fingerprints) from the words it reads. In the step's last apply
// launch (`decide_last`) the CTA that finishes last then does the decide kernel's work and, for
// an accepted batch, the finish kernel's, in place of their launches. Then
// LaunchStepRestoreOutputs: gated on a refused batch, it rewrites every item's dequantized
// output with DQ(W) of the unchanged weight (step_apply_sgd.cu).
struct StepOnePassArgs {
  StepKernelArgs apply;
  StepDecideArgs decide;  // read when decide_last
  bool decide_last = false;
};
cudaError_t LaunchStepApplySgdOnePass(const StepOnePassArgs& a, bool sr, cudaStream_t s);
cudaError_t LaunchStepRestoreOutputs(const StepKernelArgs& a, cudaStream_t s);

// Plain SGD items of the common shape, which the apply's lean run takes (step_apply.cuh
// LeanSgdRun): one update that is a gradient, no weight decay, 1x16 blocks with row-major
// scales, the update bf16 or f32 and the dequantized output (if any) of the same dtype. The host
// (which launches a launch of such items only on the lean kernel) and the generic apply kernel
// (which takes the lean run for such an item) decide it by this one function.
inline __host__ __device__ bool LeanSgdItem(const step_ws::ItemDesc& d, int32_t update_dtype,
                                            int32_t out_dtype) {
  return d.opt == step_ws::kOptSgdPlain && d.tile16 == 0 && d.swizzled == 0 && d.delta == 0 &&
         d.wd == 0.0f && d.n_updates == 1 && d.n_outs <= 1 &&
         (update_dtype == kBF16 || update_dtype == kF32) &&
         (d.n_outs == 0 || out_dtype == update_dtype);
}
cudaError_t LaunchStepFinish(const StepFinishArgs& a, cudaStream_t s);

// A kernel of each file whose kernels a step launches, which names that file's CUDA module: the
// backend loads every kernel of these modules before it queues a step behind a device-side wait
// (stream_signals.cc), since loading a kernel lazily, at its first launch, waits for the device.
const void* StepCheckModule();       // step_check.cu
const void* StepCheckLeanModule();   // step_check_lean.cu
const void* StepApplySgdModule();    // step_apply_sgd.cu
const void* StepApplyAdamWModule();  // step_apply_adamw.cu

}  // namespace fp4q::kernels::cuda

#endif  // FP4Q_KERNELS_SRC_CUDA_STEP_LAUNCH_H_
