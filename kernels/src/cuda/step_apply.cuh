// The apply of an optimizer step (NUMERICS 10.2 with the plan of the check): one grouped launch
// per variant (optimizer, state dtype, rounding, block shape), gated on the batch flag that the
// decide kernel wrote (a refused batch returns at once: nothing is written). A one-pass step's
// apply (StepApplyOnePassKernel) comes before its decision instead: gated only on the step's
// cancellation word, it writes the new state beside the old and the outputs, which a refused
// batch's restore kernel (step_apply_sgd.cu) rewrites, and the CTA that finishes last decides.
//
// Per element it moves exactly what the step must: the updates (2 or 4 bytes per rank), the
// weight's codes and scale (0.5625 bytes, read and written), the residual (4 + 4), each moment
// in its dtype (read and written), each dequantized output (written). For SGD with error
// feedback, bf16 gradients and a bf16 output that is 6.5625 bytes read and 6.5625 written per
// element, the floor. A lane pair owns a 16-element block, eight consecutive elements a lane
// (step_device.cuh's LaneHalf), so a bf16 access is one 16-byte vector a lane and a warp's lanes
// cover contiguous memory (1x16), or 16 rows of one 16x16 tile; block amaxes are shuffles. No
// host synchronization.
#ifndef FP4Q_KERNELS_SRC_CUDA_STEP_APPLY_CUH_
#define FP4Q_KERNELS_SRC_CUDA_STEP_APPLY_CUH_

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <type_traits>

#include "launch.h"
#include "step_decide.cuh"
#include "step_device.cuh"
#include "step_lean_check.cuh"
#include "step_launch.h"

namespace fp4q::kernels::cuda::step_dev {

// What a warp keeps of its current item: the scalars, the scaling, and the item's pointers in
// registers (read once per item; the kernel's byte stores could alias the descriptor table, so
// reading them through it would reload them after every store).
struct ApplyItem {
  Scalars s;
  UnitCtx q;            // the weight's new global scale and the SR key
  float s_dec_old;      // the weight's old decode scale
  NvGlobal mg[3];       // NVFP4 moments: new global scales
  float m_sdec_old[3];  // and old decode scales
  HalfItem p;
  const void* g0;       // rank 0's update and the first output
  int g0_dtype;
  void* o0;
  int o0_dtype;
  int first_update, n_updates, first_out, n_outs;
  void* m_dense[3];
  uint8_t* m_codes[3];
  uint8_t* m_scales[3];
  bool lean;  // a plain SGD item of the common shape (LeanSgdRun)
  // Where the lean run writes the new codes, scales and residual (ItemDesc::*_next).
  uint8_t* codes_out;
  uint8_t* scales_out;
  float* residual_out;
};

// kFused (a one-pass step): no plan has been decided yet. Under delayed scaling (the only
// scaling one pass takes) it is the statistics' NextAmax and the weight's record, which the
// decision after the apply plans the same way.
template <bool kFused = false>
FP4Q_D void LoadApplyItem(const StepKernelArgs& a, int it, ApplyItem* c) {
  const ItemDesc& d = a.descs[it];
  step_ws::Plan plan;
  if constexpr (kFused) {
    plan = step_ws::Plan{};
    plan.amax = d.stats[0];
    plan.s_enc_old = d.global[1];
    for (int j = 0; j < 3; ++j) plan.m_senc_old[j] = 1.0f;
  } else {
    plan = a.plans[it];
  }
  c->s = LoadScalars(d);
  c->q = UnitCtx{};
  c->q.g = MakeNvGlobal(plan.amax, 2688.0f);
  c->q.amax = plan.amax;
  c->q.scale_sel = kSelMapTo6;
  c->q.seed = d.seed;
  c->q.step = d.sr_step;
  c->s_dec_old = __frcp_rn(plan.s_enc_old);
#pragma unroll
  for (int j = 0; j < 3; ++j) {
    c->mg[j] = MakeNvGlobal(plan.m_amax[j], 2688.0f);
    c->m_sdec_old[j] = __frcp_rn(plan.m_senc_old[j]);
    c->m_dense[j] = d.m_dense[j];
    c->m_codes[j] = d.m_codes[j];
    c->m_scales[j] = d.m_scales[j];
  }
  c->p = LoadHalfItem(d);
  c->first_update = d.first_update;
  c->n_updates = d.n_updates;
  c->first_out = d.first_out;
  c->n_outs = d.n_outs;
  const step_ws::UpdateDesc u0 = a.updates[d.first_update];
  c->g0 = u0.data;
  c->g0_dtype = u0.dtype;
  if (d.n_outs > 0) {
    const step_ws::OutDesc o = a.outs[d.first_out];
    c->o0 = o.data;
    c->o0_dtype = o.dtype;
  } else {
    c->o0 = nullptr;
    c->o0_dtype = 0;
  }
  c->lean = LeanSgdItem(d, c->g0_dtype, c->o0_dtype);
  c->codes_out = d.codes_next;
  c->scales_out = d.scales_next;
  c->residual_out = d.residual_next;
}

struct ApplyAcc {
  float v = 0.0f, r = 0.0f, m1 = 0.0f, s2 = 0.0f, svm = 0.0f;
  LeanAcc chk;  // a one-pass apply's check of the update (step_lean_check.cuh)
};

// The one-rank check's view of a lean item (its update's raw words).
FP4Q_D LeanItem LeanItemOf(const ApplyItem& c) {
  return LeanItem{static_cast<const uint8_t*>(c.g0), c.p.blocks * 16, c.first_update,
                  c.g0_dtype == kF32, false};
}

template <int kOpt>
FP4Q_D void FlushApply(const StepKernelArgs& a, int item, const ApplyAcc& c) {
  FlushMax(a.max_acc, item, step_ws::kMaxApplyV, c.v);
  FlushMax(a.max_acc, item, step_ws::kMaxApplyR, c.r);
  if (HasM1<kOpt>()) FlushMax(a.max_acc, item, step_ws::kMaxApplyM1, c.m1);
  if (IsAdamW<kOpt>()) FlushMax(a.max_acc, item, step_ws::kMaxApplyS2, c.s2);
  if (HasMm2<kOpt>()) FlushMax(a.max_acc, item, step_ws::kMaxApplySvm, c.svm);
}

// Max over the lanes sharing the block (the pair; for 16x16 the whole warp: 16 rows x 2 halves).
template <bool kTile>
FP4Q_D float BlockMax(unsigned mask, float m) {
  m = fmaxf(m, __shfl_xor_sync(mask, m, 1));
  if constexpr (kTile) {
#pragma unroll
    for (int d = 2; d <= 16; d <<= 1) m = fmaxf(m, __shfl_xor_sync(mask, m, d));
  }
  return m;
}

FP4Q_D float Max8Abs(const float* v) {
  float m = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) m = fmaxf(m, fabsf(v[i]));
  return m;
}

// Stores the lane's half of an NVFP4 moment block (10.5) with the block's amax `bamax` (of the
// stored values: the roots for `squared` moments, which are zero-free).
FP4Q_D void StoreMomentHalf(const ApplyItem& c, int j, const LaneHalf& b, float bamax,
                            bool squared, const float* vals) {
  const uint32_t sf = E4M3Rn(__fmul_rn(bamax, c.mg[j].t));
  UnitCtx q{};
  q.g = c.mg[j];
  uint32_t w = Codes8<false>(vals, InvScale(E4M3Value(sf), c.mg[j].s_dec), q, SeedKeys{0}, 0);
  if (squared) {
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      if (vals[e] > 0.0f && ((w >> (4 * e)) & 0xFu) == 0u) w |= 1u << (4 * e);
    }
  }
  *reinterpret_cast<uint32_t*>(c.m_codes[j] + (b.at >> 1)) = w;
  if (b.h == 0) c.m_scales[j][b.at >> 4] = static_cast<uint8_t>(sf);
}

// One slot: the lane's eight elements of one half block, from the ring's stage (and the scale
// byte of the weight's block).
template <int kOpt, int kSt, bool kSr, bool kTile, typename Ring>
FP4Q_D void ApplyHalf(const StepKernelArgs& a, const ApplyItem& c, const LaneHalf& b,
                      const Ring& ring, int stage, uint32_t scale, ApplyAcc* acc) {
  constexpr bool kDenseState = HasM1<kOpt>() && kSt != step_ws::kStNvfp4;
  constexpr bool kNvState = HasM1<kOpt>() && kSt == step_ws::kStNvfp4;
  constexpr int kStDtype = kSt == step_ws::kStF32 ? kF32 : kBF16;
  const unsigned mask = __ballot_sync(kFull, b.valid);  // pairs (16x16: warps) are valid together
  if (!b.valid) return;
  const bool skip_m1 = kOpt == step_ws::kOptSgdMomentum && c.s.t1;  // b = g at t == 1
  float v[8], dq[8], r[8];
  RingValues8(ring, stage, 0, mask, c.g0_dtype, b.h, v);
  for (int k = 1; k < c.n_updates; ++k) {
    const step_ws::UpdateDesc uk = a.updates[c.first_update + k];
    PairLoad8(mask, uk.data, uk.dtype, b.at, b.h, dq);
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = __fadd_rn(v[i], dq[i]);
  }
  if (c.n_updates > 1) {
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = __fdiv_rn(v[i], c.s.kf);
  }
  {
    DqWord8(*ring.W4(stage, 0), E4M3Value(scale), c.s_dec_old, dq);
  }
  if (c.s.has_r) {
    RingValues8(ring, stage, 2, mask, kF32, b.h, r);
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) r[i] = 0.0f;
  }
  float bamax = 0.0f;
  float m1[kNvState ? 8 : 1], m2[kNvState ? 8 : 1], mm2[kNvState ? 8 : 1];
  if constexpr (kDenseState) {
    // f32 / bf16 moments: loaded, advanced and stored here; v <- the new weight value.
    float a1[8], a2[8], a3[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) a1[i] = a2[i] = a3[i] = 0.0f;
    if (!skip_m1) RingMoment8<kSt>(ring, stage, 0, mask, b, nullptr, 1.0f, false, a1);
    if (IsAdamW<kOpt>()) RingMoment8<kSt>(ring, stage, 1, mask, b, nullptr, 1.0f, false, a2);
    if (HasMm2<kOpt>()) RingMoment8<kSt>(ring, stage, 2, mask, b, nullptr, 1.0f, false, a3);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const Elem el = StepElement<kOpt>(c.s, v[i], dq[i], r[i], a1[i], a2[i], a3[i]);
      v[i] = el.v;
      a1[i] = el.m1;
      a2[i] = el.v2;
      a3[i] = el.vm;
      bamax = fmaxf(bamax, fabsf(el.v));
      acc->m1 = fmaxf(acc->m1, fabsf(el.m1));
      if (IsAdamW<kOpt>()) acc->s2 = fmaxf(acc->s2, __fsqrt_rn(el.v2));
      if (HasMm2<kOpt>()) acc->svm = fmaxf(acc->svm, __fsqrt_rn(el.vm));
    }
    PairStore8(mask, c.m_dense[0], kStDtype, b.at, b.h, a1);
    if (IsAdamW<kOpt>()) PairStore8(mask, c.m_dense[1], kStDtype, b.at, b.h, a2);
    if (HasMm2<kOpt>()) PairStore8(mask, c.m_dense[2], kStDtype, b.at, b.h, a3);
  } else {
    // No moments, or NVFP4 ones: m1 <- b or m, m2 <- sqrt(v2), mm2 <- sqrt(vm) (the stored roots).
    if constexpr (kNvState) {
#pragma unroll
      for (int i = 0; i < 8; ++i) m1[i] = m2[i] = mm2[i] = 0.0f;
      if (!skip_m1) RingMoment8<kSt>(ring, stage, 0, mask, b, c.m_scales[0], c.m_sdec_old[0], false, m1);
      if (IsAdamW<kOpt>()) RingMoment8<kSt>(ring, stage, 1, mask, b, c.m_scales[1], c.m_sdec_old[1], true, m2);
      if (HasMm2<kOpt>()) RingMoment8<kSt>(ring, stage, 2, mask, b, c.m_scales[2], c.m_sdec_old[2], true, mm2);
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float m1i = kNvState ? m1[kNvState ? i : 0] : 0.0f;
      const float m2i = kNvState ? m2[kNvState ? i : 0] : 0.0f;
      const float mm2i = kNvState ? mm2[kNvState ? i : 0] : 0.0f;
      const Elem el = StepElement<kOpt>(c.s, v[i], dq[i], r[i], m1i, m2i, mm2i);
      v[i] = el.v;
      if constexpr (kNvState) {
        m1[i] = el.m1;
        if constexpr (IsAdamW<kOpt>()) m2[i] = __fsqrt_rn(el.v2);
        if constexpr (HasMm2<kOpt>()) mm2[i] = __fsqrt_rn(el.vm);
      }
      bamax = fmaxf(bamax, fabsf(el.v));
    }
  }
  bamax = BlockMax<kTile>(mask, bamax);
  // Q: the new weight block.
  const uint32_t sf = E4M3Rn(__fmul_rn(bamax, c.q.g.t));
  const float sfv = E4M3Value(sf);
  const uint32_t word = Codes8<kSr>(v, InvScale(sfv, c.q.g.s_dec), c.q, SeedKeys{c.q.seed},
                                    static_cast<uint64_t>(b.at) >> 3);
  *reinterpret_cast<uint32_t*>(c.p.codes + (b.at >> 1)) = word;
  if (b.h == 0) c.p.scales[b.scale_at] = static_cast<uint8_t>(sf);
  // R and O: DQ(W'), the residual, the outputs. The block amax is the largest |v| of the
  // lane's elements (and its partners'), so the item's max |v| is kept per block.
  acc->v = fmaxf(acc->v, bamax);
  DqWord8(word, sfv, c.q.g.s_dec, dq);
  if (c.s.has_r) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      r[i] = __fsub_rn(v[i], dq[i]);
      acc->r = fmaxf(acc->r, fabsf(r[i]));
    }
    PairStoreF32(mask, c.p.residual, b.at, b.h, r);
  }
  if (c.o0 != nullptr) PairStore8(mask, c.o0, c.o0_dtype, b.at, b.h, dq);
  for (int k = 1; k < c.n_outs; ++k) {
    const step_ws::OutDesc o = a.outs[c.first_out + k];
    PairStore8(mask, o.data, o.dtype, b.at, b.h, dq);
  }
  // NVFP4 moments (dense ones were stored above): the block amaxes, then the halves.
  if constexpr (kNvState) {
    const float a1 = BlockMax<false>(mask, Max8Abs(m1));
    acc->m1 = fmaxf(acc->m1, a1);
    StoreMomentHalf(c, 0, b, a1, false, m1);
    if constexpr (IsAdamW<kOpt>()) {
      const float a2 = BlockMax<false>(mask, Max8Abs(m2));
      acc->s2 = fmaxf(acc->s2, a2);
      StoreMomentHalf(c, 1, b, a2, true, m2);
    }
    if constexpr (HasMm2<kOpt>()) {
      const float a3 = BlockMax<false>(mask, Max8Abs(mm2));
      acc->svm = fmaxf(acc->svm, a3);
      StoreMomentHalf(c, 2, b, a3, true, mm2);
    }
  }
}

// ---------------------------------------------------------------- the lean SGD run
//
// Plain SGD items of the common shape (ApplyItem::lean: one update that is a gradient, no weight
// decay, 1x16 blocks with row-major scales, the update and the output both of dtype kDt) take
// this path: ApplyHalf's arithmetic operation for operation, with every per-item choice fixed at
// compile time (kR: error feedback, kOut: a dequantized output) and the lane's addresses moved
// by one slot's stride instead of located afresh. Slot t of an item whose first warp-unit is u0
// holds elements 256 (t - 2 u0) + 8 lane .. + 7 (LocateHalf's 1x16 mapping); a lane is valid
// while its first element is in the item (pairs are valid together).

// One 16-byte store, as one instruction: written so, because the compiler split the lean
// slot's stores (PairStoreF32's selects turned into branches) into four each.
FP4Q_D void StoreV4(void* p, uint32_t x, uint32_t y, uint32_t z, uint32_t w) {
  asm volatile("st.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(x), "r"(y), "r"(z), "r"(w));
}
FP4Q_D void StoreV4(void* p, float x, float y, float z, float w) {
  StoreV4(p, __float_as_uint(x), __float_as_uint(y), __float_as_uint(z), __float_as_uint(w));
}

// PairStoreF32's stores (the same words to the same places) for the lean slot.
FP4Q_D void LeanPairStoreF32(unsigned mask, float* p, int64_t at, int h, const float* v) {
  float send[4], recv[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    send[i] = h ? v[i] : v[4 + i];
    recv[i] = __shfl_xor_sync(mask, send[i], 1);
  }
  float lo[4], hi[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    lo[i] = h ? recv[i] : v[i];
    hi[i] = h ? v[4 + i] : recv[i];
  }
  float* blk = p + (at - 8 * h);
  StoreV4(blk + 4 * h, lo[0], lo[1], lo[2], lo[3]);
  StoreV4(blk + 8 + 4 * h, hi[0], hi[1], hi[2], hi[3]);
}

// One slot of the lean run at element offset `at` (n: the item's elements). kFused: a one-pass
// step's slot, which also checks the update's words (as the one-rank check does) and writes the
// new state to the item's *_out pointers.
template <int kDt, bool kSr, bool kR, bool kOut, bool kFused, typename Ring>
FP4Q_D void LeanSgdSlot(const ApplyItem& c, const Ring& ring, int stage, int64_t at, int h,
                        int64_t n, uint32_t scale, ApplyAcc* acc) {
  const bool valid = at < n;
  const unsigned mask = __ballot_sync(kFull, valid);
  if (!valid) return;
  uint8_t* const codes_out = kFused ? c.codes_out : c.p.codes;
  uint8_t* const scales_out = kFused ? c.scales_out : c.p.scales;
  float* const residual_out = kFused ? c.residual_out : c.p.residual;
  float v[8], dq[8], r[8];
  RingValues8(ring, stage, 0, mask, kDt, h, v);
  DqWord8(*ring.W4(stage, 0), E4M3Value(scale), c.s_dec_old, dq);
  if constexpr (kR) {
    RingValues8(ring, stage, 2, mask, kF32, h, r);
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) r[i] = 0.0f;
  }
  float bamax = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    v[i] = StepElementF<step_ws::kOptSgdPlain, kR ? kFR : 0u>(c.s, v[i], dq[i], r[i], 0.0f, 0.0f,
                                                              0.0f).v;
    bamax = fmaxf(bamax, fabsf(v[i]));
  }
  bamax = BlockMax<false>(mask, bamax);
  acc->v = fmaxf(acc->v, bamax);
  const uint32_t sf = E4M3Rn(__fmul_rn(bamax, c.q.g.t));
  const float sfv = E4M3Value(sf);
  const uint32_t word = Codes8<kSr>(v, InvScale(sfv, c.q.g.s_dec), c.q, SeedKeys{c.q.seed},
                                    static_cast<uint64_t>(at) >> 3);
  *reinterpret_cast<uint32_t*>(codes_out + (at >> 1)) = word;
  if (h == 0) scales_out[at >> 4] = static_cast<uint8_t>(sf);
  DqWord8(word, sfv, c.q.g.s_dec, dq);
  if constexpr (kR) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      r[i] = __fsub_rn(v[i], dq[i]);
      acc->r = fmaxf(acc->r, fabsf(r[i]));
    }
    LeanPairStoreF32(mask, residual_out, at, h, r);
  }
  if constexpr (kOut) {
    if constexpr (kDt == kF32) {
      LeanPairStoreF32(mask, static_cast<float*>(c.o0), at, h, dq);
    } else {
      StoreV4(static_cast<uint16_t*>(c.o0) + at, PackBf16x2(dq[0], dq[1]),
              PackBf16x2(dq[2], dq[3]), PackBf16x2(dq[4], dq[5]), PackBf16x2(dq[6], dq[7]));
    }
  }
  if constexpr (kFused) {
    // The check of the update's words, read again from the ring once the slot's values are
    // dead (fewer registers live at once).
    if constexpr (kDt == kF32) {  // the lane's words: elements 4h..4h+3 and 8+4h.. of the block
      LeanChunk<true>(*ring.W16(stage, 0), at - 4 * h, &acc->chk);
      LeanChunk<true>(*ring.W16(stage, 1), at - 4 * h + 8, &acc->chk);
    } else {
      LeanChunk<false>(*ring.W16(stage, 0), at, &acc->chk);
    }
  }
}

// Slots [s, run_end) of one lean item (StepApplyKernel's slot loop with LeanSgdSlot): the ring
// keeps kD - 1 slots ahead in flight, and `prefetch_slots` past them are asked of L2.
template <int kDt, bool kSr, bool kR, bool kOut, int kD, bool kFused, typename Ring>
FP4Q_D void LeanSgdRun(const ApplyItem& c, const Ring& ring, int64_t s, int64_t run_end,
                       int64_t u0, int lane, int prefetch_slots, ApplyAcc* acc) {
  constexpr int kEl = kDt == kF32 ? 4 : 2;  // bytes of an update or output element
  const int h = lane & 1;
  const int64_t n = c.p.blocks * 16;
  const char* g = static_cast<const char*>(c.g0);
  const auto issue = [&](int stage, int64_t at) {
    if (at < n) {
      RingCopy8(ring, stage, 0, g, kDt, at, h);
      CpAsync4(ring.W4(stage, 0), c.p.codes + (at >> 1));
      if constexpr (kR) RingCopy8(ring, stage, 2, c.p.residual, kF32, at, h);
    }
    CpAsyncCommit();
  };
  // The element offset of slot t for this lane, recomputed from t so that the compiler sees
  // its alignment (a multiple of 8) and keeps every access one 16-byte vector.
  const int lane8 = 8 * lane;
  const auto at_of = [&](int64_t t) { return (t - 2 * u0) * 256 + lane8; };
#pragma unroll
  for (int j = 0; j + 1 < kD; ++j) {
    if (s + j < run_end) {
      issue(j, at_of(s + j));
    } else {
      CpAsyncCommit();
    }
  }
  uint32_t scale = at_of(s) < n ? c.p.scales[at_of(s) >> 4] : 0u;
  int stage = 0;
  for (; s < run_end; ++s) {
    const int64_t at = at_of(s);
    const int64_t ahead = at_of(s + kD - 1);
    const int st_t = stage == 0 ? kD - 1 : stage - 1;
    if (s + kD - 1 < run_end) {
      issue(st_t, ahead);
    } else {
      CpAsyncCommit();
    }
    const int64_t next = at_of(s + 1);
    const uint32_t scale_n = s + 1 < run_end && next < n ? c.p.scales[next >> 4] : 0u;
    CpAsyncWait<kD - 1>();
    LeanSgdSlot<kDt, kSr, kR, kOut, kFused>(c, ring, stage, at, h, n, scale, acc);
    // As the generic loop: the slot prefetch_slots past the ring's newest, within the run.
    const int64_t tp = at_of(s + kD - 1 + prefetch_slots);
    if (prefetch_slots > 0 && s + kD - 1 + prefetch_slots < run_end && tp < n) {
      PrefetchL2(g + tp * kEl);
      PrefetchL2(c.p.codes + (tp >> 1));
      if constexpr (kR) PrefetchL2(c.p.residual + tp);
    }
    scale = scale_n;
    stage = stage + 1 == kD ? 0 : stage + 1;
  }
}

// LeanSgdRun with the item's dtype, error feedback and output as template arguments.
template <bool kSr, int kD, bool kFused = false, typename Ring>
FP4Q_D void LeanSgdDispatch(const ApplyItem& c, const Ring& ring, int64_t s, int64_t run_end,
                            int64_t u0, int lane, int prefetch_slots, ApplyAcc* acc) {
  const auto run = [&](auto dt, auto r, auto out) {
    LeanSgdRun<decltype(dt)::value, kSr, decltype(r)::value, decltype(out)::value, kD, kFused>(
        c, ring, s, run_end, u0, lane, prefetch_slots, acc);
  };
  using T = std::true_type;
  using F = std::false_type;
  using Bf = std::integral_constant<int, kBF16>;
  using Fl = std::integral_constant<int, kF32>;
  const bool out = c.o0 != nullptr;
  if (c.g0_dtype == kBF16) {
    if (c.s.has_r) {
      out ? run(Bf{}, T{}, T{}) : run(Bf{}, T{}, F{});
    } else {
      out ? run(Bf{}, F{}, T{}) : run(Bf{}, F{}, F{});
    }
  } else {
    if (c.s.has_r) {
      out ? run(Fl{}, T{}, T{}) : run(Fl{}, T{}, F{});
    } else {
      out ? run(Fl{}, F{}, T{}) : run(Fl{}, F{}, F{});
    }
  }
}

// The calling warp's contiguous run of slots (WarpSlotsOf: a slot is half a warp-unit, 256
// elements; 16x16: one tile of the unit's pair), item by item, so that a warp changes item
// rarely: `run(c, s, run_end, u0, acc)` does the slots [s, run_end) of the item whose registers
// `c` holds (u0: its first warp-unit in the launch) into its maxima `acc`, which are flushed
// when the warp leaves the item.
template <int kOpt, bool kFused = false, typename Run>
FP4Q_D void WalkApplyRuns(const StepKernelArgs& a, Run&& run) {
  const WarpSlots slots = WarpSlotsOf(a.total_units);
  int64_t s = slots.begin;
  const int64_t s_end = slots.end;
  int e = 0;
  int item = -1;
  ApplyItem c;
  ApplyAcc acc;
  const auto flush = [&] {  // the warp leaves `item`
    FlushApply<kOpt>(a, item, acc);
    if constexpr (kFused) LeanFlush(a, item, LeanItemOf(c), acc.chk);
  };
  while (s < s_end) {
    e = Advance(a.list, a.n_entries, e, s >> 1);
    const int it = a.list[e].item;
    if (it != item) {
      if (item >= 0) flush();
      acc = ApplyAcc();
      item = it;
      LoadApplyItem<kFused>(a, it, &c);
    }
    const int64_t u0 = a.list[e].unit_begin;
    const int64_t item_end = 2 * a.list[e + 1].unit_begin;  // the next entry, or the sentinel
    const int64_t run_end = item_end < s_end ? item_end : s_end;
    run(c, s, run_end, u0, &acc);
    s = run_end;
  }
  if (item >= 0) flush();
}

// Within a run in one item each lane keeps the slot ring's kDepth - 1 slots ahead in flight, and
// SGD's also asks L2 for the slot prefetch_slots past the ring's newest. Plain SGD items of the
// common shape take the lean run.
template <int kOpt, int kSt, bool kSr, bool kTile>
__global__ void __launch_bounds__(kThreads, 2) StepApplyKernel(const StepKernelArgs a) {
  StepGridEnter();
  if (a.header->checked != step_ws::kCheckedMagic || a.header->ok != 1) return;
  using R = StepRing<kOpt, kSt>;
  constexpr int kD = R::kDepth;
  // SGD's apply asks L2 for the slot past the ring (measured faster on the H200); AdamW's runs
  // faster without it.
  constexpr bool kL2Prefetch = !IsAdamW<kOpt>();
  extern __shared__ uint4 step_smem[];
  const auto ring = R::Ring::Of(reinterpret_cast<unsigned char*>(step_smem));
  const int lane = threadIdx.x & 31;
  WalkApplyRuns<kOpt>(a, [&](const ApplyItem& c, int64_t s, int64_t run_end, int64_t u0,
                             ApplyAcc* acc) {
    if constexpr (kOpt == step_ws::kOptSgdPlain && !kTile) {
      if (c.lean) {
        LeanSgdDispatch<kSr, kD>(c, ring, s, run_end, u0, lane, a.prefetch_slots, acc);
        return;
      }
    }
    const auto at_slot = [&](int64_t t) {
      return LocateHalf<kTile>(c.p, (t >> 1) - u0, static_cast<int>(t & 1), lane);
    };
#pragma unroll
    for (int j = 0; j + 1 < kD; ++j) {
      if (s + j < run_end) {
        IssueSlot<kOpt, kSt, true>(ring, j, c, at_slot(s + j));
      } else {
        CpAsyncCommit();
      }
    }
    LaneHalf b = at_slot(s);
    uint32_t scale = b.valid ? c.p.scales[b.scale_at] : 0u;
    int stage = 0;
    for (; s < run_end; ++s) {
      const int64_t t = s + kD - 1;
      const int st_t = stage == 0 ? kD - 1 : stage - 1;
      if (t < run_end) {
        IssueSlot<kOpt, kSt, true>(ring, st_t, c, at_slot(t));
      } else {
        CpAsyncCommit();
      }
      LaneHalf bn{};
      uint32_t scale_n = 0u;
      if (s + 1 < run_end) {
        bn = at_slot(s + 1);
        if (bn.valid) scale_n = c.p.scales[bn.scale_at];
      }
      CpAsyncWait<kD - 1>();
      ApplyHalf<kOpt, kSt, kSr, kTile>(a, c, b, ring, stage, scale, acc);
      // The slot prefetch_slots past the ring's newest, when it is in the item and the run
      // (issued after the slot's work, so that none of its values is live across it).
      const int64_t tp = t + a.prefetch_slots;
      if (kL2Prefetch && a.prefetch_slots > 0 && tp < run_end) {
        const LaneHalf bt = at_slot(tp);
        if (bt.valid) {
          PrefetchSlot<kOpt, kSt>(c.g0, c.g0_dtype, c.p, c.m_dense, c.m_codes, true, bt.at);
        }
      }
      b = bn;
      scale = scale_n;
      stage = stage + 1 == kD ? 0 : stage + 1;
    }
  });
}

// The lean run over a launch's warp-units: every CTA's work in a launch whose every item is
// LeanSgdItem.
template <bool kSr, bool kFused>
FP4Q_D void LeanApplyWork(const StepKernelArgs& a) {
  using R = StepRing<step_ws::kOptSgdPlain, step_ws::kStF32>;
  extern __shared__ uint4 step_smem[];
  const auto ring = R::Ring::Of(reinterpret_cast<unsigned char*>(step_smem));
  const int lane = threadIdx.x & 31;
  WalkApplyRuns<step_ws::kOptSgdPlain, kFused>(
      a, [&](const ApplyItem& c, int64_t s, int64_t run_end, int64_t u0, ApplyAcc* acc) {
        LeanSgdDispatch<kSr, R::kDepth, kFused>(c, ring, s, run_end, u0, lane, a.prefetch_slots,
                                                acc);
      });
}

// A launch whose every item is LeanSgdItem (the host decides it by the same function): the lean
// run alone, gated on the batch flag. Without the generic loop's registers, RTN fits three CTAs
// an SM (80 registers); SR keeps two (its Philox state would spill).
template <bool kSr>
__global__ void __launch_bounds__(kThreads, kSr ? 2 : 3)
    StepApplyLeanKernel(const StepKernelArgs a) {
  StepGridEnter();
  if (a.header->checked != step_ws::kCheckedMagic || a.header->ok != 1) return;
  LeanApplyWork<kSr, false>(a);
}

// The decision of a one-pass step, by the CTA of its last apply launch that arrives last
// (Header::arrived counts the CTAs that are done): the decide kernel's work and, for an
// accepted batch, the finish kernel's (step_decide.cuh). Called by every thread of every CTA of
// the launch. (Inlined: as a call, its parameters' copy took a 256-byte stack frame and the
// kernel 116 and 128 registers, RTN and SR, against 105 and 125 inlined; ptxas -v.)
FP4Q_D void OnePassDecideOnce(const StepDecideArgs& d) {
  __threadfence();  // this thread's flushes (atomics into the accumulators) before the arrival
  __syncthreads();  // every warp of the CTA has flushed
  bool last = false;
  if (threadIdx.x == 0) last = atomicAdd(&d.header->arrived, 1u) == gridDim.x - 1;
  if (!__syncthreads_or(last)) return;
  __threadfence();  // every other CTA's flushes before this CTA reads them
  if (!DecideBatch(d)) return;
  __syncthreads();
  FinishBatch(StepFinishArgs{d.header, d.descs, d.n_items, d.plans, d.max_acc});
}

// A one-pass step's apply (step_launch.h LaunchStepApplySgdOnePass): not gated on a decision
// but on the step's cancellation word, and in the step's last apply launch followed by its
// decision (OnePassDecideOnce). The check's accumulators take registers, so it runs two CTAs an
// SM (three spilled under RTN).
template <bool kSr>
__global__ void __launch_bounds__(kThreads, 2) StepApplyOnePassKernel(const StepOnePassArgs a) {
  StepGridEnter();
  // One read for the CTA (every thread reaches this barrier), so that no warp's full-mask
  // shuffles miss a lane that saw the word otherwise. A cancelled CTA still arrives below.
  const bool cancelled = threadIdx.x == 0 && a.apply.cancel_word != nullptr &&
                         *static_cast<const volatile uint32_t*>(a.apply.cancel_word) ==
                             a.apply.cancel_token;
  if (!__syncthreads_or(cancelled)) {
    if (threadIdx.x == 0 && a.apply.ran != nullptr) {
      *static_cast<volatile int32_t*>(a.apply.ran) = 1;
    }
    LeanApplyWork<kSr, true>(a.apply);
  }
  if (a.decide_last) OnePassDecideOnce(a.decide);
}

template <int kOpt, int kSt, bool kSr, bool kTile>
cudaError_t LaunchApply(const StepKernelArgs& a, cudaStream_t s) {
  static std::atomic<int> resident[kMaxStepDevices];
  return LaunchStepGrid(StepApplyKernel<kOpt, kSt, kSr, kTile>, StepRing<kOpt, kSt>::Ring::kBytes,
                        resident, a, s);
}

template <bool kSr>
cudaError_t LaunchApplyLean(const StepKernelArgs& a, cudaStream_t s) {
  static std::atomic<int> resident[kMaxStepDevices];
  using R = StepRing<step_ws::kOptSgdPlain, step_ws::kStF32>;
  return LaunchStepGrid(StepApplyLeanKernel<kSr>, R::Ring::kBytes, resident, a, s);
}

template <bool kSr>
cudaError_t LaunchApplyOnePass(const StepOnePassArgs& a, cudaStream_t s) {
  static std::atomic<int> resident[kMaxStepDevices];
  using R = StepRing<step_ws::kOptSgdPlain, step_ws::kStF32>;
  return LaunchStepGridOf(StepApplyOnePassKernel<kSr>, R::Ring::kBytes, resident,
                          a.apply.total_units, a, s);
}

template <int kOpt, int kSt>
cudaError_t LaunchApplyRounding(const StepKernelArgs& a, bool sr, bool tile, cudaStream_t s) {
  if (sr) {
    return tile ? LaunchApply<kOpt, kSt, true, true>(a, s)
                : LaunchApply<kOpt, kSt, true, false>(a, s);
  }
  return tile ? LaunchApply<kOpt, kSt, false, true>(a, s)
              : LaunchApply<kOpt, kSt, false, false>(a, s);
}

template <int kOpt>
cudaError_t LaunchApplyState(const StepKernelArgs& a, int st, bool sr, bool tile, cudaStream_t s) {
  switch (st) {
    case step_ws::kStF32:
      return LaunchApplyRounding<kOpt, step_ws::kStF32>(a, sr, tile, s);
    case step_ws::kStBF16:
      return LaunchApplyRounding<kOpt, step_ws::kStBF16>(a, sr, tile, s);
    case step_ws::kStNvfp4:
      return LaunchApplyRounding<kOpt, step_ws::kStNvfp4>(a, sr, tile, s);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace fp4q::kernels::cuda::step_dev

#endif  // FP4Q_KERNELS_SRC_CUDA_STEP_APPLY_CUH_
