// What the one-rank check of an optimizer step accumulates from an update's raw words, per lane:
// the fingerprint (NUMERICS 10.7), the first element of the first 16-byte chunk holding an Inf
// or NaN, and max |g|, flushed into the step's accumulators when a warp leaves an item. Shared
// by the one-rank check kernel (step_check_lean.cu) and the one-pass apply (step_apply.cuh),
// which reads the same words once for both. |g| is a word's bits without the signs (bf16 two at
// a time, VIMNMX.U16x2); an element's index is computed only in a chunk that holds an Inf or
// NaN.
#ifndef FP4Q_KERNELS_SRC_CUDA_STEP_LEAN_CHECK_CUH_
#define FP4Q_KERNELS_SRC_CUDA_STEP_LEAN_CHECK_CUH_

#include <cuda_runtime.h>

#include "step_device.cuh"
#include "step_launch.h"

namespace fp4q::kernels::cuda::step_dev {

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

}  // namespace fp4q::kernels::cuda::step_dev

#endif  // FP4Q_KERNELS_SRC_CUDA_STEP_LEAN_CHECK_CUH_
