// The apply of an optimizer step (NUMERICS 10.2 with the plan of the check): one grouped launch
// per variant (optimizer, state dtype, rounding, block shape), gated on the batch flag that the
// decide kernel wrote (a refused batch returns at once: nothing is written).
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

#include "launch.h"
#include "step_device.cuh"
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
};

FP4Q_D void LoadApplyItem(const StepKernelArgs& a, int it, ApplyItem* c) {
  const ItemDesc& d = a.descs[it];
  const step_ws::Plan plan = a.plans[it];
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
}

struct ApplyAcc {
  float v = 0.0f, r = 0.0f, m1 = 0.0f, s2 = 0.0f, svm = 0.0f;
};

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
  // R and O: DQ(W'), the residual, the outputs.
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    dq[i] = __fmul_rn(__fmul_rn(E2M1Value((word >> (4 * i)) & 0xFu), sfv), c.q.g.s_dec);
    acc->v = fmaxf(acc->v, fabsf(v[i]));
  }
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

// Warps own contiguous runs of slots (a slot: half a warp-unit, 256 elements; 16x16: one tile of
// the unit's pair) so that a warp changes item rarely. Within a run in one item each lane keeps
// the slot ring's kDepth - 1 slots ahead in flight, and SGD's also asks L2 for the slot
// prefetch_slots past the ring's newest.
template <int kOpt, int kSt, bool kSr, bool kTile>
__global__ void __launch_bounds__(kThreads, 2) StepApplyKernel(const StepKernelArgs a) {
  if (a.header->checked != step_ws::kCheckedMagic || a.header->ok != 1) return;
  using R = StepRing<kOpt, kSt>;
  constexpr int kD = R::kDepth;
  // SGD's apply asks L2 for the slot past the ring (measured faster on the H200); AdamW's runs
  // faster without it.
  constexpr bool kL2Prefetch = !IsAdamW<kOpt>();
  extern __shared__ uint4 step_smem[];
  const auto ring = R::Ring::Of(reinterpret_cast<unsigned char*>(step_smem));
  const int lane = threadIdx.x & 31;
  const WarpSlots run = WarpSlotsOf(a.total_units);
  int64_t s = run.begin;
  const int64_t s_end = run.end;
  int e = 0;
  int item = -1;
  ApplyItem c;
  ApplyAcc acc;
  while (s < s_end) {
    e = Advance(a.list, a.n_entries, e, s >> 1);
    const int it = a.list[e].item;
    if (it != item) {
      if (item >= 0) FlushApply<kOpt>(a, item, acc);
      acc = ApplyAcc();
      item = it;
      LoadApplyItem(a, it, &c);
    }
    const int64_t u0 = a.list[e].unit_begin;
    const int64_t item_end = 2 * a.list[e + 1].unit_begin;  // the next entry, or the sentinel
    const int64_t run_end = item_end < s_end ? item_end : s_end;
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
      ApplyHalf<kOpt, kSt, kSr, kTile>(a, c, b, ring, stage, scale, &acc);
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
  }
  if (item >= 0) FlushApply<kOpt>(a, item, acc);
}

template <int kOpt, int kSt, bool kSr, bool kTile>
cudaError_t LaunchApply(const StepKernelArgs& a, cudaStream_t s) {
  static std::atomic<int> resident[kMaxStepDevices];
  return LaunchStepGrid(StepApplyKernel<kOpt, kSt, kSr, kTile>, StepRing<kOpt, kSt>::Ring::kBytes,
                        resident, a, s);
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
