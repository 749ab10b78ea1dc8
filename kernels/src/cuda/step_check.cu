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
//   StepDecideKernel         one CTA: per item the outcome (first failing check in the order of
//                            10.4, the value at the first index recomputed from the inputs), the
//                            bounds of 10.6 in double, the plan of the apply, the fingerprints,
//                            and the batch flag.
//   StepFinishKernel         one CTA, gated on the batch flag: global records and statistics.
// Each grouped launch covers every item of its variant: warps walk the launch's warp-units
// grid-stride, per-item partial results stay in registers until the warp's item changes and are
// then flushed with one atomic per warp into one of kAccCopies replicas (no hot address).
//
// The fingerprint hashes 64-bit words (four bf16 or two f32 elements): about 25 integer
// operations a word. Lanes own eight consecutive elements (step_device.cuh's LocateHalf), so a
// warp's bf16 loads cover 512 contiguous bytes.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cfloat>

#include "launch.h"
#include "step_device.cuh"
#include "step_launch.h"

namespace fp4q::kernels::cuda {
namespace {

using namespace step_dev;  // NOLINT: the step's device vocabulary
using step_ws::ItemDesc;
using step_ws::Plan;
using step_ws::ReportPod;

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

// ---------------------------------------------------------------- the decide kernel

FP4Q_D float UpdateAt(const step_ws::UpdateDesc& u, int64_t i) {
  if (u.dtype == kF32) return static_cast<const float*>(u.data)[i];
  return Bf16Lo(static_cast<const uint16_t*>(u.data)[i]);
}

// g at element i: the rank sum in order, divided by K when K > 1.
FP4Q_D float GAt(const StepDecideArgs& a, const ItemDesc& d, int64_t i) {
  float g = UpdateAt(a.updates[d.first_update], i);
  for (int k = 1; k < d.n_updates; ++k)
    g = __fadd_rn(g, UpdateAt(a.updates[d.first_update + k], i));
  if (d.n_updates > 1) g = __fdiv_rn(g, d.kf);
  return g;
}

// The whole recurrence at element i (for the value of a first non-finite index).
template <int kOpt, int kSt>
FP4Q_D Elem ElementAt(const StepDecideArgs& a, const ItemDesc& d, const Plan& plan, int64_t i) {
  const Scalars s = LoadScalars(d);
  const int64_t sc = d.cols >> 4;
  const int64_t row = i / d.cols;
  const int64_t cb = (i - row * d.cols) >> 4;
  const uint8_t byte = d.codes[i >> 1];
  const uint32_t code = (i & 1) ? (byte >> 4) : (byte & 0xFu);
  const float sfv = E4M3Value(d.scales[ScaleOffset(row, cb, sc, d.swizzled != 0)]);
  const float dq = __fmul_rn(__fmul_rn(E2M1Value(code), sfv), __frcp_rn(plan.s_enc_old));
  const float r = s.has_r ? d.residual[i] : 0.0f;
  float m1 = 0.0f, m2 = 0.0f, mm2 = 0.0f;
  if (HasM1<kOpt>() && !(kOpt == step_ws::kOptSgdMomentum && s.t1)) {
    m1 = MomentAt<kSt>(d, 0, __frcp_rn(plan.m_senc_old[0]), i, false);
  }
  if (IsAdamW<kOpt>()) m2 = MomentAt<kSt>(d, 1, __frcp_rn(plan.m_senc_old[1]), i, true);
  if (HasMm2<kOpt>()) mm2 = MomentAt<kSt>(d, 2, __frcp_rn(plan.m_senc_old[2]), i, true);
  return StepElement<kOpt>(s, GAt(a, d, i), dq, r, m1, m2, mm2);
}

template <int kOpt>
FP4Q_D Elem ElementAtOpt(const StepDecideArgs& a, const ItemDesc& d, const Plan& plan, int64_t i) {
  switch (d.state_dtype) {
    case step_ws::kStBF16:
      return ElementAt<kOpt, step_ws::kStBF16>(a, d, plan, i);
    case step_ws::kStNvfp4:
      return ElementAt<kOpt, step_ws::kStNvfp4>(a, d, plan, i);
    default:
      return ElementAt<kOpt, step_ws::kStF32>(a, d, plan, i);
  }
}

FP4Q_D Elem ElementAtAny(const StepDecideArgs& a, const ItemDesc& d, const Plan& plan, int64_t i) {
  switch (d.opt) {
    case step_ws::kOptSgdMomentum:
      return ElementAtOpt<step_ws::kOptSgdMomentum>(a, d, plan, i);
    case step_ws::kOptAdamW:
      return ElementAtOpt<step_ws::kOptAdamW>(a, d, plan, i);
    case step_ws::kOptAdamWAmsgrad:
      return ElementAtOpt<step_ws::kOptAdamWAmsgrad>(a, d, plan, i);
    default:
      return ElementAt<step_ws::kOptSgdPlain, step_ws::kStF32>(a, d, plan, i);
  }
}

FP4Q_D void FailAt(ReportPod* r, int32_t outcome, int32_t quantity, int64_t index, float value) {
  r->outcome = outcome;
  r->quantity = quantity;
  r->index = index;
  r->value = value;
}

FP4Q_D void FailBound(ReportPod* r, int32_t quantity, double bound) {
  r->outcome = step_ws::kOutOfRange;
  r->quantity = quantity;
  r->bound = bound;
}

FP4Q_D bool BelowLimit(double b) { return b < step_ws::kTwoPow127; }

// NUMERICS 10.6 and 10.5 under delayed scaling (the CPU reference's CheckDelayed, operation
// for operation, in double).
FP4Q_D bool DecideDelayed(const ItemDesc& d, ReportPod* rep, Plan* plan, double* vb_out) {
  const float* stats = d.stats;
  const float a = stats[0];
  if (!(a >= 0.0f && a <= FLT_MAX)) {
    FailBound(rep, step_ws::kQWeight, static_cast<double>(a));
    return false;
  }
  const bool has_r = d.residual != nullptr;
  const double g = plan->gmax;
  const double dold = __dmul_rn(2688.0, static_cast<double>(__frcp_rn(plan->s_enc_old)));
  const double r = has_r ? static_cast<double>(stats[1]) : 0.0;
  const double p = __dadd_rn(dold, r);
  const double s1 = stats[2];
  const double s2 = stats[3];
  if (!BelowLimit(g)) {
    FailBound(rep, step_ws::kQUpdateSum, g);
    return false;
  }
  const bool adamw = d.opt == step_ws::kOptAdamW || d.opt == step_ws::kOptAdamWAmsgrad;
  double xb;
  if (d.delta) {
    xb = __dadd_rn(dold, g);
  } else if (!adamw) {
    const double gp = __dadd_rn(g, __dmul_rn(static_cast<double>(d.wd), p));
    double gpp = gp;
    if (d.opt == step_ws::kOptSgdMomentum) {
      const double mu = fabs(static_cast<double>(d.mu));
      double b = gp;
      if (d.t != 1)
        b = __dadd_rn(__dmul_rn(mu, s1), __dmul_rn(fabs(static_cast<double>(d.cd)), gp));
      if (!BelowLimit(b)) {
        FailBound(rep, step_ws::kQMoment1, b);
        return false;
      }
      gpp = d.nesterov ? __dadd_rn(gp, __dmul_rn(mu, b)) : b;
    }
    xb = __dadd_rn(dold, __dmul_rn(fabs(static_cast<double>(d.lr)), gpp));
  } else {
    const double m = __dadd_rn(__dmul_rn(static_cast<double>(d.b1), s1),
                               __dmul_rn(static_cast<double>(d.c1), g));
    if (!BelowLimit(m)) {
      FailBound(rep, step_ws::kQMoment1, m);
      return false;
    }
    const double v = __dadd_rn(__dmul_rn(static_cast<double>(d.b2), __dmul_rn(s2, s2)),
                               __dmul_rn(static_cast<double>(d.c2), __dmul_rn(g, g)));
    if (!BelowLimit(v)) {
      FailBound(rep, step_ws::kQMoment2, v);
      return false;
    }
    const double decay =
        __dmul_rn(__dmul_rn(static_cast<double>(d.lr), static_cast<double>(d.wd)), p);
    xb = __dadd_rn(__dadd_rn(dold, decay), __ddiv_rn(__dmul_rn(static_cast<double>(d.alpha), m),
                                                     static_cast<double>(d.eps)));
  }
  if (!BelowLimit(xb)) {
    FailBound(rep, step_ws::kQWeight, xb);
    return false;
  }
  const double vb = __dadd_rn(xb, r);
  if (!BelowLimit(vb)) {
    FailBound(rep, step_ws::kQWeight, vb);
    return false;
  }
  *vb_out = vb;
  plan->amax = a;
  const float gm = plan->gmax;
  if (adamw) {
    plan->m_amax[0] = __fadd_rn(__fmul_rn(d.b1, stats[2]), __fmul_rn(d.c1, gm));
    const float sq = __fmul_rn(stats[3], stats[3]);
    const float v_sum = __fadd_rn(__fmul_rn(d.b2, sq), __fmul_rn(__fmul_rn(d.c2, gm), gm));
    plan->m_amax[1] = __fsqrt_rn(v_sum);
    const float prev = stats[4];
    plan->m_amax[2] = prev > plan->m_amax[1] ? prev : plan->m_amax[1];
  } else if (d.opt == step_ws::kOptSgdMomentum) {
    plan->m_amax[0] =
        d.t == 1 ? gm : __fadd_rn(__fmul_rn(fabsf(d.mu), stats[2]), __fmul_rn(fabsf(d.cd), gm));
  }
  return true;
}

FP4Q_D void DecideItem(const StepDecideArgs& a, int i, ReportPod* rep, Plan* plan) {
  const ItemDesc& d = a.descs[i];
  const int64_t u0 = d.first_update;
  const uint64_t code_shape = (static_cast<uint64_t>(d.rows) << 28) ^ static_cast<uint64_t>(d.cols);
  for (int k = 0; k < d.n_updates; ++k) {
    const uint64_t sum = SumCopies(a.fp_acc + (u0 + k) * step_ws::kAccCopies);
    const uint64_t c = a.updates[u0 + k].dtype == kF32 ? 1 : 2;
    a.fingerprints[u0 + k] = Mix64(sum ^ Mix64((c << 56) ^ code_shape));
  }
  if (d.check_only) {
    for (int k = 0; k < d.n_updates; ++k) {
      if (a.fingerprints[u0 + k] != a.updates[u0 + k].expect) {
        rep->outcome = step_ws::kFingerprintMismatch;
        rep->rank = k;
        return;
      }
    }
    return;
  }
  for (int k = 0; k < d.n_updates; ++k) {
    const uint64_t idx = MinCopies(a.upd_idx_acc + (u0 + k) * step_ws::kAccCopies);
    if (idx != kNone) {
      FailAt(rep, step_ws::kNonFiniteUpdate, step_ws::kQNone, static_cast<int64_t>(idx),
             UpdateAt(a.updates[u0 + k], static_cast<int64_t>(idx)));
      rep->rank = k;
      return;
    }
  }
  const uint64_t* idx_acc =
      a.idx_acc + static_cast<int64_t>(i) * step_ws::kIdxSlots * step_ws::kAccCopies;
  const uint32_t* max_acc =
      a.max_acc + static_cast<int64_t>(i) * step_ws::kMaxSlots * step_ws::kAccCopies;
  const uint64_t gbad = MinCopies(idx_acc + step_ws::kIdxG * step_ws::kAccCopies);
  if (gbad != kNone) {
    FailAt(rep, step_ws::kNonFiniteResult, step_ws::kQUpdateSum, static_cast<int64_t>(gbad),
           GAt(a, d, static_cast<int64_t>(gbad)));
    return;
  }
  plan->gmax = MaxCopies(max_acc + step_ws::kMaxG * step_ws::kAccCopies);
  plan->s_enc_old = d.global[1];
  for (int j = 0; j < 3; ++j) {
    plan->m_senc_old[j] =
        (d.state_dtype == step_ws::kStNvfp4 && d.m_global[j] != nullptr) ? d.m_global[j][1] : 1.0f;
  }
  double vbound = 0.0;
  if (!d.delayed) {
    const int slots[3] = {step_ws::kIdxM1, step_ws::kIdxM2, step_ws::kIdxW};
    const int32_t quantity[3] = {step_ws::kQMoment1, step_ws::kQMoment2, step_ws::kQWeight};
    for (int q = 0; q < 3; ++q) {
      const uint64_t bad = MinCopies(idx_acc + slots[q] * step_ws::kAccCopies);
      if (bad == kNone) continue;
      const Elem el = ElementAtAny(a, d, *plan, static_cast<int64_t>(bad));
      const float value = q == 0   ? el.m1
                          : q == 1 ? (!Finite(el.v2) ? el.v2 : el.vm)
                                   : (!Finite(el.x) ? el.x : el.v);
      FailAt(rep, step_ws::kNonFiniteResult, quantity[q], static_cast<int64_t>(bad), value);
      return;
    }
    plan->amax = MaxCopies(max_acc + step_ws::kMaxV * step_ws::kAccCopies);
    plan->m_amax[0] = MaxCopies(max_acc + step_ws::kMaxM1 * step_ws::kAccCopies);
    plan->m_amax[1] = MaxCopies(max_acc + step_ws::kMaxS2 * step_ws::kAccCopies);
    plan->m_amax[2] = MaxCopies(max_acc + step_ws::kMaxSvm * step_ws::kAccCopies);
    vbound = plan->amax;
  } else if (!DecideDelayed(d, rep, plan, &vbound)) {
    return;
  }
  for (int j = 0; j < 3; ++j) plan->m_senc_new[j] = SEncOf(plan->m_amax[j], 2688.0f);
  // 10.4.4.
  plan->s_enc = SEncOf(plan->amax, 2688.0f);
  rep->amax = plan->amax;
  const double dmax = __dmul_rn(2688.0, static_cast<double>(__frcp_rn(plan->s_enc)));
  if (!BelowLimit(dmax)) {
    FailBound(rep, step_ws::kQWeight, dmax);
    return;
  }
  if (d.bf16_out && !(dmax < step_ws::kBf16Max)) {
    FailBound(rep, step_ws::kQDequantized, dmax);
    return;
  }
  if (d.residual != nullptr) {
    const double rb = __dmul_rn(2.0, vbound > dmax ? vbound : dmax);
    if (!BelowLimit(rb)) FailBound(rep, step_ws::kQResidual, rb);
  }
}

__global__ void __launch_bounds__(kThreads) StepDecideKernel(const StepDecideArgs a) {
  bool ok = true;
  for (int i = threadIdx.x; i < a.n_items; i += kThreads) {
    ReportPod rep{step_ws::kOk, step_ws::kQNone, -1, 0, -1, 0.0f, 0.0f, 0.0};
    Plan plan{};
    for (int j = 0; j < 3; ++j) plan.m_senc_old[j] = 1.0f;
    DecideItem(a, i, &rep, &plan);
    a.reports[i] = rep;
    a.plans[i] = plan;
    ok = ok && rep.outcome == step_ws::kOk;
  }
  // Read once the items are decided, as late as the kernel can: a cancellation written while
  // it ran (the host timed out a ready signal the queued waits then saw) still refuses the batch.
  const bool cancelled =
      __syncthreads_or(a.cancel_word != nullptr &&
                       *static_cast<const volatile uint32_t*>(a.cancel_word) ==
                           a.cancel_token) != 0;
  ok = __syncthreads_and(ok && !cancelled) != 0;
  if (threadIdx.x == 0) {  // the fields it decides (QueueTable zeroed the header; a one-pass
                           // apply before it may have set one_pass_ran, which the restore reads)
    step_ws::Header* h = a.header;
    h->cancelled = cancelled ? 1 : 0;
    h->ok = ok ? 1 : 0;
    h->checked = step_ws::kCheckedMagic;
    h->n_items = a.n_items;
    h->n_updates = a.n_updates;
  }
}

// ---------------------------------------------------------------- the apply's epilogue

__global__ void __launch_bounds__(kThreads) StepFinishKernel(const StepFinishArgs a) {
  if (a.header->checked != step_ws::kCheckedMagic || a.header->ok != 1) return;
  for (int i = threadIdx.x; i < a.n_items; i += kThreads) {
    const ItemDesc& d = a.descs[i];
    if (d.check_only) continue;
    const Plan& plan = a.plans[i];
    d.global_next[0] = plan.amax;
    d.global_next[1] = plan.s_enc;
    if (d.state_dtype == step_ws::kStNvfp4) {
      for (int j = 0; j < 3; ++j) {
        if (d.m_global[j] == nullptr) continue;
        d.m_global[j][0] = plan.m_amax[j];
        d.m_global[j][1] = plan.m_senc_new[j];
      }
    }
    if (d.stats == nullptr) continue;
    const uint32_t* m =
        a.max_acc + static_cast<int64_t>(i) * step_ws::kMaxSlots * step_ws::kAccCopies;
    float* stats = d.stats_next;  // a one-pass step's: the others carried over first
    if (stats != d.stats) {
      for (int k = 0; k < step_ws::kStatFloats; ++k) stats[k] = d.stats[k];
    }
    stats[0] = MaxCopies(m + step_ws::kMaxApplyV * step_ws::kAccCopies);
    stats[1] =
        d.residual != nullptr ? MaxCopies(m + step_ws::kMaxApplyR * step_ws::kAccCopies) : 0.0f;
    if (d.opt != step_ws::kOptSgdPlain) {
      stats[2] = MaxCopies(m + step_ws::kMaxApplyM1 * step_ws::kAccCopies);
    }
    if (d.opt == step_ws::kOptAdamW || d.opt == step_ws::kOptAdamWAmsgrad) {
      stats[3] = MaxCopies(m + step_ws::kMaxApplyS2 * step_ws::kAccCopies);
    }
    if (d.opt == step_ws::kOptAdamWAmsgrad) {
      stats[4] = MaxCopies(m + step_ws::kMaxApplySvm * step_ws::kAccCopies);
    }
  }
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

cudaError_t LaunchStepDecide(const StepDecideArgs& a, cudaStream_t s) {
  StepDecideKernel<<<1, kThreads, 0, s>>>(a);
  return cudaGetLastError();
}

cudaError_t LaunchStepFinish(const StepFinishArgs& a, cudaStream_t s) {
  StepFinishKernel<<<1, kThreads, 0, s>>>(a);
  return cudaGetLastError();
}

const void* StepCheckModule() { return reinterpret_cast<const void*>(&StepDecideKernel); }

}  // namespace fp4q::kernels::cuda
