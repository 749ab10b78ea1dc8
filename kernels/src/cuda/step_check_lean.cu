// The updates-only check of an optimizer step for a launch whose items have one update each (a
// single worker's step under delayed scaling, and retried items): StepCheckKernel<false>'s
// results (step_check.cu) from the update's raw words. Its accumulators and the decide kernel
// that reads them are step_check.cu's.
#include <cuda_runtime.h>

#include <atomic>

#include "step_device.cuh"
#include "step_launch.h"

namespace fp4q::kernels::cuda {
namespace {

using namespace step_dev;  // NOLINT: the step's device vocabulary
using step_ws::ItemDesc;

// The update's first non-finite index, max |g| and its fingerprint. A lane loads 16 bytes
// of each of its next kLeanAhead chunks before it works on any; |g| is a word's bits without the
// signs (bf16 two at a time, VIMNMX.U16x2), and an element's index is computed only in a chunk
// that holds an Inf or NaN. A warp's chunk is 512 contiguous bytes: 256 bf16 elements (one slot
// of the unit mapping) or 128 f32 (half a slot).
constexpr int kLeanAhead = 6;

struct LeanItem {
  const uint8_t* g;
  int64_t n;
  int first_update;
  bool f32;
  bool check_only;
};

struct LeanAcc {
  uint64_t fp = 0;
  uint64_t bad = kNone;  // the first element of the lane's first chunk holding an Inf or NaN
  uint32_t mag = 0;      // bf16: two 16-bit maxima; f32: the bits of max |g|
};

FP4Q_D uint64_t Word64(uint32_t lo, uint32_t hi) {
  return static_cast<uint64_t>(hi) << 32 | lo;
}

// One lane's chunk at element `at`: 8 bf16 (64-bit words at / 4, at / 4 + 1 of NUMERICS 10.7) or
// 4 f32 (words at / 2, at / 2 + 1). A lane's chunks come in increasing order, so its first bad
// chunk is the one noted first.
template <bool kF32>
FP4Q_D void LeanChunk(const uint4& w, int64_t at, LeanAcc* acc) {
  constexpr uint64_t kG = 0x9E3779B97F4A7C15ull;
  const uint64_t h = static_cast<uint64_t>(at >> (kF32 ? 1 : 2)) * kG;
  acc->fp += Mix64(h + Word64(w.x, w.y)) + Mix64(h + kG + Word64(w.z, w.w));
  bool bad;
  if constexpr (kF32) {
    constexpr uint32_t kM = 0x7FFFFFFFu;
    const uint32_t m = max(max(w.x & kM, w.y & kM), max(w.z & kM, w.w & kM));
    bad = m >= 0x7F800000u;
    acc->mag = max(acc->mag, m);
  } else {
    constexpr uint32_t kM = 0x7FFF7FFFu;
    const uint32_t m = __vmaxu2(__vmaxu2(w.x & kM, w.y & kM), __vmaxu2(w.z & kM, w.w & kM));
    bad = __vcmpgeu2(m, 0x7F807F80u) != 0;
    acc->mag = __vmaxu2(acc->mag, m);
  }
  if (bad && acc->bad == kNone) acc->bad = static_cast<uint64_t>(at);
}

// The first Inf or NaN of the chunk at element `at` (one the lane noted: read again).
template <bool kF32>
FP4Q_D uint64_t LeanFirstBad(const LeanItem& c, uint64_t at) {
  const uint4 w = __ldg(reinterpret_cast<const uint4*>(c.g + at * (kF32 ? 4 : 2)));
  const uint32_t u[4] = {w.x, w.y, w.z, w.w};
  for (int i = 0; i < (kF32 ? 4 : 8); ++i) {
    const uint32_t mag = kF32 ? (u[i] & 0x7FFFFFFFu) : ((u[i >> 1] >> (16 * (i & 1))) & 0x7FFFu);
    if (mag >= (kF32 ? 0x7F800000u : 0x7F80u)) return at + i;
  }
  return kNone;  // not reached: the chunk was seen to hold one
}

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

FP4Q_D void LeanFlush(const StepKernelArgs& a, int item, const LeanItem& c, const LeanAcc& acc) {
  const int64_t u = static_cast<int64_t>(c.first_update) * step_ws::kAccCopies;
  FlushSum(a.fp_acc + u, acc.fp);
  if (c.check_only) return;
  uint64_t bad = acc.bad;
  if (bad != kNone) bad = c.f32 ? LeanFirstBad<true>(c, bad) : LeanFirstBad<false>(c, bad);
  FlushMin(a.upd_idx_acc + u, bad);
  const uint32_t bits = c.f32 ? acc.mag : max(acc.mag & 0xFFFFu, acc.mag >> 16) << 16;
  FlushMax(a.max_acc, item, step_ws::kMaxG, __uint_as_float(bits));
}

// Warps own contiguous runs of slots (two a warp-unit), as StepCheckKernel does.
__global__ void __launch_bounds__(kThreads, 3) StepCheckLeanKernel(const StepKernelArgs a) {
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
