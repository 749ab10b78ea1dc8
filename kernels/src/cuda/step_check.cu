// The check of an optimizer step (NUMERICS 10.4) on the GPU, and the apply's epilogue:
//   StepCheckKernel<false>   delayed scaling and check-only items: reads the updates only
//                            (finiteness of every rank, of the rank sum / mean, max |g|, the
//                            fingerprints); per element 2 (bf16) or 4 (f32) bytes per rank read.
//   (step_check_lean.cu: the same for a launch whose items have one update each, a single
//   worker's step, on the raw words with no per-element conversion.)
//   StepCheckKernel<true, opt, state>   current scaling: the whole recurrence D..V without
//                            writes (the weight, residual and moments are read as the apply
//                            reads them: NVFP4 0.5625, f32 4, bf16 2 bytes per element each),
//                            amaxes of v and of the moments to be stored, first non-finite index
//                            of each quantity.
//   StepDecideKernel         one CTA: per item the outcome, the plan of the apply, the
//                            fingerprints, and the batch flag (step_decide.cuh's DecideBatch).
//   StepFinishKernel         one CTA, gated on the batch flag: global records and statistics
//                            (FinishBatch).
//   StepInitKernel           the header and accumulators' initial values (before the table).
//   StepInitTableKernel      the same, and an item table of at most kInlineTableBytes carried
//                            in its launch, written into the workspace.
// Each grouped launch covers every item of its variant: warps walk the launch's warp-units
// grid-stride, per-item partial results stay in registers until the warp's item changes and are
// then flushed with one atomic per warp into one of kAccCopies replicas (no hot address).
//
// The fingerprint hashes 64-bit words (four bf16 or two f32 elements): about 25 integer
// operations a word. Lanes own eight consecutive elements (step_device.cuh's LocateHalf), so a
// warp's bf16 loads cover 512 contiguous bytes.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cstring>

#include "launch.h"
#include "step_decide.cuh"
#include "step_device.cuh"
#include "step_launch.h"

namespace fp4q::kernels::cuda {
namespace {

using namespace step_dev;  // NOLINT: the step's device vocabulary
using step_ws::ItemDesc;

// ---------------------------------------------------------------- the check kernels

// Per-item partial results of one lane.
struct CheckAcc {
  uint64_t fp0 = 0;       // rank 0's fingerprint sum
  uint64_t bad0 = kNone;  // rank 0's first non-finite index
  uint64_t bad[step_ws::kIdxSlots];
  float max[5];  // kMaxG .. kMaxSvm
  FP4Q_D void Reset() {
    fp0 = 0;
    bad0 = kNone;
#pragma unroll
    for (int q = 0; q < step_ws::kIdxSlots; ++q) bad[q] = kNone;
#pragma unroll
    for (int q = 0; q < 5; ++q) max[q] = 0.0f;
  }
};

FP4Q_D void FlushCheck(const StepKernelArgs& a, int item, int64_t u0, bool check_only,
                       const CheckAcc& c, bool full) {
  FlushSum(a.fp_acc + u0 * step_ws::kAccCopies, c.fp0);
  FlushMin(a.upd_idx_acc + u0 * step_ws::kAccCopies, c.bad0);
  if (check_only) return;
  const int q_end = full ? step_ws::kIdxSlots : step_ws::kIdxG + 1;
  for (int q = 0; q < q_end; ++q) {
    FlushMin(
        a.idx_acc + (static_cast<int64_t>(item) * step_ws::kIdxSlots + q) * step_ws::kAccCopies,
        c.bad[q]);
  }
  const int m_end = full ? 5 : 1;
  for (int q = 0; q < m_end; ++q) FlushMax(a.max_acc, item, q, c.max[q]);
}

FP4Q_D void NoteBad(uint64_t* slot, int64_t index) {
  if (static_cast<uint64_t>(index) < *slot) *slot = static_cast<uint64_t>(index);
}

// What a warp keeps of its current item (in registers: see step_apply.cuh's ApplyItem).
struct CheckItem {
  Scalars s;
  float s_dec_old;
  float m_sdec[3];
  HalfItem p;
  const void* g0;
  int g0_dtype;
  int first_update, n_updates;
  bool check_only;
  void* m_dense[3];
  uint8_t* m_codes[3];
  uint8_t* m_scales[3];
};

template <bool kCurrent, int kSt>
FP4Q_D void LoadCheckItem(const StepKernelArgs& a, int it, CheckItem* c) {
  const ItemDesc& d = a.descs[it];
  c->s = LoadScalars(d);
  c->p = LoadHalfItem(d);
  c->first_update = d.first_update;
  c->n_updates = d.n_updates;
  c->check_only = d.check_only != 0;
  const step_ws::UpdateDesc u0 = a.updates[d.first_update];
  c->g0 = u0.data;
  c->g0_dtype = u0.dtype;
  c->s_dec_old = 1.0f;
#pragma unroll
  for (int j = 0; j < 3; ++j) {
    c->m_sdec[j] = 1.0f;
    c->m_dense[j] = d.m_dense[j];
    c->m_codes[j] = d.m_codes[j];
    c->m_scales[j] = d.m_scales[j];
  }
  if (kCurrent) {
    c->s_dec_old = __frcp_rn(d.global[1]);
#pragma unroll
    for (int j = 0; j < 3; ++j) {
      if (kSt == step_ws::kStNvfp4 && d.m_global[j] != nullptr) c->m_sdec[j] = __frcp_rn(d.m_global[j][1]);
    }
  }
}

// The check's slot ring: the apply's (step_device.cuh's StepRing) under current scaling; rank 0's
// update alone, eight slots deep, for the updates-only check.
template <bool kCurrent, int kOpt, int kSt>
struct CheckRing {
  using Ring = typename StepRing<kOpt, kSt>::Ring;
  static constexpr int kDepth = StepRing<kOpt, kSt>::kDepth;
};
template <int kOpt, int kSt>
struct CheckRing<false, kOpt, kSt> {
  using Ring = SlotRing<2, 0, 8>;
  static constexpr int kDepth = 8;
};

// One slot (eight elements a lane, step_device.cuh's LocateHalf; a check always sees the
// flattened tensor), from the ring's stage and the scale byte of the weight's block. Every lane
// of the warp calls it (the rank flushes are warp-wide).
template <bool kCurrent, int kOpt, int kSt, typename Ring>
FP4Q_D void CheckHalf(const StepKernelArgs& a, const CheckItem& c, const LaneHalf& b,
                      const Ring& ring, int stage, uint32_t scale, CheckAcc* acc) {
  const unsigned mask = __ballot_sync(kFull, b.valid);  // pairs are valid together
  float g[8];
  if (b.valid) {
    RingValues8(ring, stage, 0, mask, c.g0_dtype, b.h, g);
    acc->fp0 += FingerprintPart8(g, c.g0_dtype, b.at);
    if (!c.check_only) {
      // The largest magnitude's bits and whether any is Inf or NaN, in integer operations; the
      // first index only when one is (the rare, refused case).
      uint32_t mag = 0;
#pragma unroll
      for (int i = 0; i < 8; ++i) mag = max(mag, __float_as_uint(g[i]) & 0x7FFFFFFFu);
      if (mag >= 0x7F800000u) {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          if (!Finite(g[i])) NoteBad(&acc->bad0, b.at + i);
        }
      }
      // One rank: g is its update, so that check covers g's and its max is g's.
      if (c.n_updates == 1) {
        acc->max[step_ws::kMaxG] = fmaxf(acc->max[step_ws::kMaxG], __uint_as_float(mag));
      }
    }
  }
  // Ranks after the first flush per slot (uniform over the warp: the item is).
  for (int k = 1; k < c.n_updates; ++k) {
    uint64_t fp = 0;
    uint64_t bad = kNone;
    if (b.valid) {
      const step_ws::UpdateDesc ud = a.updates[c.first_update + k];
      float uk[8];
      PairLoad8(mask, ud.data, ud.dtype, b.at, b.h, uk);
      fp = FingerprintPart8(uk, ud.dtype, b.at);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        if (!Finite(uk[i])) NoteBad(&bad, b.at + i);
        g[i] = __fadd_rn(g[i], uk[i]);
      }
    }
    const int64_t slot = (static_cast<int64_t>(c.first_update) + k) * step_ws::kAccCopies;
    FlushSum(a.fp_acc + slot, fp);
    if (!c.check_only) FlushMin(a.upd_idx_acc + slot, bad);
  }
  if (!b.valid || c.check_only) return;
  if (c.n_updates > 1) {
    // The mean of several ranks can overflow where no rank does: checked on its own.
#pragma unroll
    for (int i = 0; i < 8; ++i) g[i] = __fdiv_rn(g[i], c.s.kf);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      acc->max[step_ws::kMaxG] = fmaxf(acc->max[step_ws::kMaxG], fabsf(g[i]));
      if (!Finite(g[i])) NoteBad(&acc->bad[step_ws::kIdxG], b.at + i);
    }
  }
  if constexpr (kCurrent) {
    float dq[8], r[8], m1[8], m2[8], mm2[8];
    DqWord8(*ring.W4(stage, 0), E4M3Value(scale), c.s_dec_old, dq);
    if (c.s.has_r) {
      RingValues8(ring, stage, 2, mask, kF32, b.h, r);
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) r[i] = 0.0f;
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) m1[i] = m2[i] = mm2[i] = 0.0f;
    if (HasM1<kOpt>() && !(kOpt == step_ws::kOptSgdMomentum && c.s.t1)) {
      RingMoment8<kSt>(ring, stage, 0, mask, b, c.m_scales[0], c.m_sdec[0], false, m1);
    }
    if (IsAdamW<kOpt>()) {
      RingMoment8<kSt>(ring, stage, 1, mask, b, c.m_scales[1], c.m_sdec[1], true, m2);
    }
    if (HasMm2<kOpt>()) {
      RingMoment8<kSt>(ring, stage, 2, mask, b, c.m_scales[2], c.m_sdec[2], true, mm2);
    }
    // Whether any result is Inf or NaN, as the largest magnitude's bits (integer operations);
    // the per-element first indices only when one is (the elements recomputed, in the rare,
    // refused case).
    WithItemFlags<kOpt>(c.s, [&](auto f) {
      constexpr unsigned kF = decltype(f)::value;
      uint32_t bad_mag = 0;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const Elem el = StepElementF<kOpt, kF>(c.s, g[i], dq[i], r[i], m1[i], m2[i], mm2[i]);
        uint32_t m =
            max(__float_as_uint(el.x) & 0x7FFFFFFFu, __float_as_uint(el.v) & 0x7FFFFFFFu);
        if (HasM1<kOpt>()) m = max(m, __float_as_uint(el.m1) & 0x7FFFFFFFu);
        if (IsAdamW<kOpt>()) m = max(m, __float_as_uint(el.v2) & 0x7FFFFFFFu);
        if (HasMm2<kOpt>()) m = max(m, __float_as_uint(el.vm) & 0x7FFFFFFFu);
        bad_mag = max(bad_mag, m);
        acc->max[step_ws::kMaxV] = fmaxf(acc->max[step_ws::kMaxV], fabsf(el.v));
        if (HasM1<kOpt>()) acc->max[step_ws::kMaxM1] = fmaxf(acc->max[step_ws::kMaxM1], fabsf(el.m1));
        if (IsAdamW<kOpt>()) {
          acc->max[step_ws::kMaxS2] = fmaxf(acc->max[step_ws::kMaxS2], __fsqrt_rn(el.v2));
        }
        if (HasMm2<kOpt>()) {
          acc->max[step_ws::kMaxSvm] = fmaxf(acc->max[step_ws::kMaxSvm], __fsqrt_rn(el.vm));
        }
      }
      if (bad_mag >= 0x7F800000u) {
        for (int i = 0; i < 8; ++i) {
          const Elem el = StepElementF<kOpt, kF>(c.s, g[i], dq[i], r[i], m1[i], m2[i], mm2[i]);
          const int64_t idx = b.at + i;
          if (HasM1<kOpt>() && !Finite(el.m1)) NoteBad(&acc->bad[step_ws::kIdxM1], idx);
          if (IsAdamW<kOpt>() && (!Finite(el.v2) || (HasMm2<kOpt>() && !Finite(el.vm)))) {
            NoteBad(&acc->bad[step_ws::kIdxM2], idx);
          }
          if (!Finite(el.x) || !Finite(el.v)) NoteBad(&acc->bad[step_ws::kIdxW], idx);
        }
      }
    });
  }
}

// CTAs per SM each variant is compiled for: the updates-only check fits the registers (and its
// ring the shared memory) of three.
template <bool kCurrent, int kOpt>
constexpr int CheckMinCtas() {
  return kCurrent ? 2 : 3;
}

// Warps own contiguous runs of slots, as the apply does, and keep the check ring's kDepth - 1
// slots ahead in flight within a run in one item.
template <bool kCurrent, int kOpt, int kSt>
__global__ void __launch_bounds__(kThreads, (CheckMinCtas<kCurrent, kOpt>())) StepCheckKernel(const StepKernelArgs a) {
  StepGridEnter();
  using R = CheckRing<kCurrent, kOpt, kSt>;
  constexpr int kD = R::kDepth;
  // The L2 prefetch (past the ring) serves the current-scaling check of SGD: AdamW's check and
  // momentum's with NVFP4 state have no registers left for its addresses (they would spill).
  constexpr bool kPrefetch =
      kCurrent && !IsAdamW<kOpt>() && !(HasM1<kOpt>() && kSt == step_ws::kStNvfp4);
  extern __shared__ uint4 step_smem[];
  const auto ring = R::Ring::Of(reinterpret_cast<unsigned char*>(step_smem));
  const int lane = threadIdx.x & 31;
  const WarpSlots run = WarpSlotsOf(a.total_units);
  int64_t s = run.begin;
  const int64_t s_end = run.end;
  int e = 0;
  int item = -1;
  CheckItem c;
  CheckAcc acc;
  acc.Reset();
  while (s < s_end) {
    e = Advance(a.list, a.n_entries, e, s >> 1);
    const int it = a.list[e].item;
    if (it != item) {
      if (item >= 0) FlushCheck(a, item, c.first_update, c.check_only, acc, kCurrent);
      acc.Reset();
      item = it;
      LoadCheckItem<kCurrent, kSt>(a, it, &c);
    }
    const int64_t u0 = a.list[e].unit_begin;
    const int64_t item_end = 2 * a.list[e + 1].unit_begin;  // the next entry, or the sentinel
    const int64_t run_end = item_end < s_end ? item_end : s_end;
    const auto at_slot = [&](int64_t t) {
      return LocateHalf<false>(c.p, (t >> 1) - u0, static_cast<int>(t & 1), lane);
    };
#pragma unroll
    for (int j = 0; j + 1 < kD; ++j) {
      if (s + j < run_end) {
        IssueSlot<kOpt, kSt, kCurrent>(ring, j, c, at_slot(s + j));
      } else {
        CpAsyncCommit();
      }
    }
    LaneHalf b = at_slot(s);
    uint32_t scale = kCurrent && b.valid ? c.p.scales[b.scale_at] : 0u;
    int stage = 0;
    for (; s < run_end; ++s) {
      const int64_t t = s + kD - 1;
      const int st_t = stage == 0 ? kD - 1 : stage - 1;
      if (t < run_end) {
        IssueSlot<kOpt, kSt, kCurrent>(ring, st_t, c, at_slot(t));
      } else {
        CpAsyncCommit();
      }
      LaneHalf bn{};
      uint32_t scale_n = 0u;
      if (s + 1 < run_end) {
        bn = at_slot(s + 1);
        if (kCurrent && bn.valid) scale_n = c.p.scales[bn.scale_at];
      }
      CpAsyncWait<kD - 1>();
      CheckHalf<kCurrent, kOpt, kSt>(a, c, b, ring, stage, scale, &acc);
      // The slot prefetch_slots past the ring's newest, when it is in the item and the run
      // (issued after the check, so that none of its values is live across the prefetch).
      const int64_t tp = t + a.prefetch_slots;
      if (kPrefetch && a.prefetch_slots > 0 && tp < run_end) {
        const LaneHalf bt = at_slot(tp);
        PrefetchSlot<kOpt, kSt>(c.g0, c.g0_dtype, c.p, c.m_dense, c.m_codes, kCurrent, bt.at);
      }
      b = bn;
      scale = scale_n;
      stage = stage + 1 == kD ? 0 : stage + 1;
    }
  }
  if (item >= 0) FlushCheck(a, item, c.first_update, c.check_only, acc, kCurrent);
}

// ---------------------------------------------------------------- the workspace's initial values

// LaunchStepInit in 16-byte words: the header's, then [ff_begin, total).
FP4Q_D void InitWords(uint4* ws, int64_t ff_begin, int64_t ff_end, int64_t total) {
  constexpr int64_t kHeader = sizeof(step_ws::Header) / 16;
  const int64_t n = kHeader + (total - ff_begin);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t w = i < kHeader ? i : ff_begin + (i - kHeader);
    const uint32_t v = w >= ff_begin && w < ff_end ? 0xFFFFFFFFu : 0u;
    ws[w] = make_uint4(v, v, v, v);
  }
}

__global__ void __launch_bounds__(kThreads)
    StepInitKernel(uint4* ws, int64_t ff_begin, int64_t ff_end, int64_t total) {
  StepGridEnter();
  InitWords(ws, ff_begin, ff_end, total);
}

// An item table of at most kWords 16-byte words, passed by value.
template <int kWords>
struct InlineTable {
  uint4 words[kWords];
};

// StepInitKernel's words, and the table's `n_table` words written from the kernel's argument
// to ws[table_at ..].
template <int kWords>
__global__ void __launch_bounds__(kThreads)
    StepInitTableKernel(uint4* ws, int64_t ff_begin, int64_t ff_end, int64_t total,
                        int64_t table_at, int n_table, const InlineTable<kWords> table) {
  StepGridEnter();
  InitWords(ws, ff_begin, ff_end, total);
  for (int i = static_cast<int>(blockIdx.x) * kThreads + static_cast<int>(threadIdx.x);
       i < n_table; i += static_cast<int>(gridDim.x) * kThreads) {
    ws[table_at + i] = table.words[i];
  }
}

// ---------------------------------------------------------------- decide, finish (step_decide.cuh)

__global__ void __launch_bounds__(kThreads) StepDecideKernel(const StepDecideArgs a) {
  StepGridEnter();
  DecideBatch(a);
}

__global__ void __launch_bounds__(kThreads) StepFinishKernel(const StepFinishArgs a) {
  StepGridEnter();
  if (a.header->checked != step_ws::kCheckedMagic || a.header->ok != 1) return;
  FinishBatch(a);
}

// ---------------------------------------------------------------- launchers

template <bool kCurrent, int kOpt, int kSt>
cudaError_t LaunchCheck(const StepKernelArgs& a, cudaStream_t s) {
  static std::atomic<int> resident[kMaxStepDevices];
  return LaunchStepGrid(StepCheckKernel<kCurrent, kOpt, kSt>,
                        CheckRing<kCurrent, kOpt, kSt>::Ring::kBytes, resident, a, s);
}

template <int kOpt>
cudaError_t LaunchCheckOpt(const StepKernelArgs& a, int st, cudaStream_t s) {
  switch (st) {
    case step_ws::kStF32:
      return LaunchCheck<true, kOpt, step_ws::kStF32>(a, s);
    case step_ws::kStBF16:
      return LaunchCheck<true, kOpt, step_ws::kStBF16>(a, s);
    case step_ws::kStNvfp4:
      return LaunchCheck<true, kOpt, step_ws::kStNvfp4>(a, s);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t LaunchStepCheckUpdates(const StepKernelArgs& a, cudaStream_t s) {
  return LaunchCheck<false, step_ws::kOptSgdPlain, step_ws::kStF32>(a, s);
}

cudaError_t LaunchStepCheckFull(const StepKernelArgs& a, int opt, int st, cudaStream_t s) {
  switch (opt) {
    case step_ws::kOptSgdPlain:
      return LaunchCheck<true, step_ws::kOptSgdPlain, step_ws::kStF32>(a, s);
    case step_ws::kOptSgdMomentum:
      return LaunchCheckOpt<step_ws::kOptSgdMomentum>(a, st, s);
    case step_ws::kOptAdamW:
      return LaunchCheckOpt<step_ws::kOptAdamW>(a, st, s);
    case step_ws::kOptAdamWAmsgrad:
      return LaunchCheckOpt<step_ws::kOptAdamWAmsgrad>(a, st, s);
    default:
      return cudaErrorInvalidValue;
  }
}

namespace {

bool InitRangesValid(size_t ff_begin, size_t ff_end, size_t total) {
  static_assert(sizeof(step_ws::Header) % 16 == 0, "Header in 16-byte words");
  return ff_begin % 16 == 0 && ff_end % 16 == 0 && total % 16 == 0 &&
         ff_begin >= sizeof(step_ws::Header) && ff_end >= ff_begin && total >= ff_end;
}

// CTAs for the init's words (at least one a 256 table words).
unsigned InitCtas(size_t ff_begin, size_t total, size_t table_words) {
  const int64_t words = static_cast<int64_t>(sizeof(step_ws::Header) + (total - ff_begin)) / 16;
  const int64_t most = std::max<int64_t>(words, static_cast<int64_t>(table_words));
  return static_cast<unsigned>(std::min<int64_t>((most + kThreads - 1) / kThreads, 1024));
}

template <int kWords>
cudaError_t LaunchInitTable(void* workspace, size_t ff_begin, size_t ff_end, size_t total,
                            const void* table, size_t table_at, size_t table_bytes,
                            cudaStream_t s) {
  InlineTable<kWords> t;
  std::memcpy(t.words, table, table_bytes);
  return StepLaunch(StepInitTableKernel<kWords>, InitCtas(ff_begin, total, table_bytes / 16), 0,
                    s, static_cast<uint4*>(workspace), static_cast<int64_t>(ff_begin / 16),
                    static_cast<int64_t>(ff_end / 16), static_cast<int64_t>(total / 16),
                    static_cast<int64_t>(table_at / 16), static_cast<int>(table_bytes / 16), t);
}

}  // namespace

cudaError_t LaunchStepInit(void* workspace, size_t ff_begin, size_t ff_end, size_t total,
                           cudaStream_t s) {
  if (!InitRangesValid(ff_begin, ff_end, total)) return cudaErrorInvalidValue;
  return StepLaunch(StepInitKernel, InitCtas(ff_begin, total, 0), 0, s,
                    static_cast<uint4*>(workspace), static_cast<int64_t>(ff_begin / 16),
                    static_cast<int64_t>(ff_end / 16), static_cast<int64_t>(total / 16));
}

cudaError_t LaunchStepInitWithTable(void* workspace, size_t ff_begin, size_t ff_end, size_t total,
                                    const void* table, size_t table_at, size_t table_bytes,
                                    cudaStream_t s) {
  if (!InitRangesValid(ff_begin, ff_end, total) || table == nullptr || table_at % 16 != 0 ||
      table_bytes % 16 != 0 || table_bytes > kInlineTableBytes ||
      table_at < sizeof(step_ws::Header) || table_at + table_bytes > ff_begin) {
    return cudaErrorInvalidValue;
  }
  // Three argument sizes, so that a small table does not carry 24 KB through every launch.
  if (table_bytes <= 2048) {
    return LaunchInitTable<128>(workspace, ff_begin, ff_end, total, table, table_at, table_bytes,
                                s);
  }
  if (table_bytes <= 8192) {
    return LaunchInitTable<512>(workspace, ff_begin, ff_end, total, table, table_at, table_bytes,
                                s);
  }
  return LaunchInitTable<kInlineTableBytes / 16>(workspace, ff_begin, ff_end, total, table,
                                                 table_at, table_bytes, s);
}

cudaError_t LaunchStepDecide(const StepDecideArgs& a, cudaStream_t s) {
  return StepLaunch(StepDecideKernel, 1, 0, s, a);
}

cudaError_t LaunchStepFinish(const StepFinishArgs& a, cudaStream_t s) {
  return StepLaunch(StepFinishKernel, 1, 0, s, a);
}

const void* StepCheckModule() { return reinterpret_cast<const void*>(&StepDecideKernel); }

}  // namespace fp4q::kernels::cuda
