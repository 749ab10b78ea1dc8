// The updates-only check of an optimizer step for a launch whose items have one update each (a
// single worker's step under delayed scaling, and retried items): StepCheckKernel<false>'s
// results (step_check.cu) from the update's raw words. Its accumulators and the decide kernel
// that reads them are step_check.cu's.
#include <cuda_runtime.h>

#include <atomic>

#include "step_device.cuh"
#include "step_lean_check.cuh"
#include "step_launch.h"

namespace fp4q::kernels::cuda {
namespace {

using namespace step_dev;  // NOLINT: the step's device vocabulary
using step_ws::ItemDesc;

// The first non-finite index, max |g| and fingerprint of each item's update from its raw words
// (step_lean_check.cuh). A lane loads 16 bytes of each of its next kLeanAhead chunks before it
// works on any. A warp's chunk is 512 contiguous bytes: 256 bf16 elements (one slot of the unit
// mapping) or 128 f32 (half a slot).
constexpr int kLeanAhead = 6;

// Chunks [k, k_end) of an item's run (chunk k of the item starts at element 512 / esize * k).
template <bool kF32>
FP4Q_D void LeanRun(const LeanItem& c, int64_t k, int64_t k_end, int lane, LeanAcc* acc) {
  constexpr int64_t kChunkElems = kF32 ? 128 : 256;
  constexpr int kLaneElems = kF32 ? 4 : 8;
  // A lane's chunks stop at the run's end or the item's (its last warp-unit may be partial).
  const int64_t end = k_end * kChunkElems < c.n ? k_end * kChunkElems : c.n;
  const uint4* g = reinterpret_cast<const uint4*>(c.g) + lane;
  for (int64_t at = k * kChunkElems + kLaneElems * lane; at < end;
       at += kLeanAhead * kChunkElems) {
    uint4 w[kLeanAhead];
#pragma unroll
    for (int j = 0; j < kLeanAhead; ++j) {
      if (at + j * kChunkElems < end) w[j] = __ldg(g + (at / kLaneElems - lane + 32 * j));
    }
#pragma unroll
    for (int j = 0; j < kLeanAhead; ++j) {
      if (at + j * kChunkElems < end) LeanChunk<kF32>(w[j], at + j * kChunkElems, acc);
    }
  }
}

// Warps own contiguous runs of slots (two a warp-unit), as StepCheckKernel does.
__global__ void __launch_bounds__(kThreads, 3) StepCheckLeanKernel(const StepKernelArgs a) {
  StepGridEnter();
  const int lane = threadIdx.x & 31;
  const WarpSlots run = WarpSlotsOf(a.total_units);
  int64_t s = run.begin;
  const int64_t s_end = run.end;
  int e = 0;
  int item = -1;
  LeanItem c{};
  LeanAcc acc;
  while (s < s_end) {
    e = Advance(a.list, a.n_entries, e, s >> 1);
    const int it = a.list[e].item;
    if (it != item) {
      if (item >= 0) LeanFlush(a, item, c, acc);
      acc = LeanAcc{};
      item = it;
      const ItemDesc& d = a.descs[it];
      const step_ws::UpdateDesc u0 = a.updates[d.first_update];
      c.g = static_cast<const uint8_t*>(u0.data);
      c.n = d.n;
      c.first_update = d.first_update;
      c.f32 = u0.dtype == kF32;
      c.check_only = d.check_only != 0;
    }
    const int64_t s0 = 2 * a.list[e].unit_begin;  // the item's first slot in the launch
    const int64_t item_end = 2 * a.list[e + 1].unit_begin;
    const int64_t run_end = item_end < s_end ? item_end : s_end;
    if (c.f32) {
      LeanRun<true>(c, 2 * (s - s0), 2 * (run_end - s0), lane, &acc);
    } else {
      LeanRun<false>(c, s - s0, run_end - s0, lane, &acc);
    }
    s = run_end;
  }
  if (item >= 0) LeanFlush(a, item, c, acc);
}

}  // namespace

cudaError_t LaunchStepCheckOneRank(const StepKernelArgs& a, cudaStream_t s) {
  static std::atomic<int> resident[kMaxStepDevices];
  return LaunchStepGrid(StepCheckLeanKernel, 0, resident, a, s);
}

const void* StepCheckLeanModule() { return reinterpret_cast<const void*>(&StepCheckLeanKernel); }

}  // namespace fp4q::kernels::cuda
