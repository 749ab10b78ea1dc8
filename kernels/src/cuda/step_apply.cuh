// The apply of an optimizer step (NUMERICS 10.2 with the plan of the check): one grouped launch
// per variant (optimizer, state dtype, rounding, block shape), gated on the batch flag that the
// decide kernel wrote (a refused batch returns at once: nothing is written).
//
// Per element it moves exactly what the step must: the updates (2 or 4 bytes per rank), the
// weight's codes and scale (0.5625 bytes, read and written), the residual (4 + 4), each moment
// in its dtype (read and written), each dequantized output (written). For SGD with error
// feedback, bf16 gradients and a bf16 output that is 6.5625 bytes read and 6.5625 written per
// element, the floor. Lanes own 16-element blocks; every access is a 16-byte vector (8 bytes for
// a block's codes, 1 for its scale) and a warp's lanes cover contiguous memory (1x16), or
// 16 rows x 64 bytes of codes (16x16 tiles). Grid-stride over the launch's warp-units, no host
// synchronization. Dense (f32 / bf16) moments are advanced eight elements at a time to keep
// few registers live; NVFP4 moments need a whole block for its amax.
#ifndef FP4Q_KERNELS_SRC_CUDA_STEP_APPLY_CUH_
#define FP4Q_KERNELS_SRC_CUDA_STEP_APPLY_CUH_

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "launch.h"
#include "step_device.cuh"
#include "step_launch.h"

namespace fp4q::kernels::cuda::step_dev {

// What a warp keeps of its current item.
struct ApplyItem {
  Scalars s;
  UnitCtx q;            // the weight's new global scale and the SR key
  float s_dec_old;      // the weight's old decode scale
  NvGlobal mg[3];       // NVFP4 moments: new global scales
  float m_sdec_old[3];  // and old decode scales
};

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

// Stores an NVFP4 moment block (10.5): codes + scale (`squared`: the roots, zero-free).
FP4Q_D void StoreMomentNv(const ItemDesc& d, int j, const NvGlobal& g, int64_t base, bool squared,
                          float* vals) {
  if (squared) {
#pragma unroll
    for (int e = 0; e < 16; ++e) vals[e] = __fsqrt_rn(vals[e]);
  }
  uint32_t w0, w1, sf;
  QuantizeMoment16(vals, g, squared, &w0, &w1, &sf);
  *reinterpret_cast<uint2*>(d.m_codes[j] + (base >> 1)) = make_uint2(w0, w1);
  d.m_scales[j][base >> 4] = static_cast<uint8_t>(sf);
}

template <int kOpt, int kSt, bool kSr, bool kTile>
__global__ void __launch_bounds__(kThreads, 2) StepApplyKernel(const StepKernelArgs a) {
  if (a.header->checked != step_ws::kCheckedMagic || a.header->ok != 1) return;
  constexpr bool kDenseState = HasM1<kOpt>() && kSt != step_ws::kStNvfp4;
  constexpr bool kNvState = HasM1<kOpt>() && kSt == step_ws::kStNvfp4;
  constexpr int kStDtype = kSt == step_ws::kStF32 ? kF32 : kBF16;
  const int lane = threadIdx.x & 31;
  const int64_t gw = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) >> 5;
  const int64_t nw = (static_cast<int64_t>(gridDim.x) * kThreads) >> 5;
  int e = 0;
  int item = -1;
  const ItemDesc* d = nullptr;
  ApplyItem c{};
  ApplyAcc acc;
  for (int64_t u = gw; u < a.total_units; u += nw) {
    e = Advance(a.list, a.n_entries, e, u);
    const int it = a.list[e].item;
    if (it != item) {
      if (item >= 0) FlushApply<kOpt>(a, item, acc);
      acc = ApplyAcc();
      item = it;
      d = &a.descs[it];
      const step_ws::Plan plan = a.plans[it];
      c.s = LoadScalars(*d);
      c.q = UnitCtx{};
      c.q.g = MakeNvGlobal(plan.amax, 2688.0f);
      c.q.amax = plan.amax;
      c.q.scale_sel = kSelMapTo6;
      c.q.seed = d->seed;
      c.q.step = d->sr_step;
      c.s_dec_old = __frcp_rn(plan.s_enc_old);
#pragma unroll
      for (int j = 0; j < 3; ++j) {
        c.mg[j] = MakeNvGlobal(plan.m_amax[j], 2688.0f);
        c.m_sdec_old[j] = __frcp_rn(plan.m_senc_old[j]);
      }
    }
    const LaneBlock b = Locate<kTile>(*d, u - a.list[e].unit_begin, lane);
    const bool skip_m1 = kOpt == step_ws::kOptSgdMomentum && c.s.t1;  // b = g at t == 1
    // Loads: the block's updates, weight and residual first (all in flight together).
    float v[16], dq[16], r[16];
    float m1[kNvState ? 16 : 1], m2[kNvState ? 16 : 1], mm2[kNvState ? 16 : 1];
    const int64_t w_scale = b.valid ? WeightScaleAt(*d, b) : 0;
    float bamax = 0.0f;
    if (b.valid) {
      const step_ws::UpdateDesc u0 = a.updates[d->first_update];
      Load16(u0.data, u0.dtype, b.base, v);
      for (int k = 1; k < d->n_updates; ++k) {
        const step_ws::UpdateDesc uk = a.updates[d->first_update + k];
        Load16(uk.data, uk.dtype, b.base, dq);
#pragma unroll
        for (int i = 0; i < 16; ++i) v[i] = __fadd_rn(v[i], dq[i]);
      }
      if (d->n_updates > 1) {
#pragma unroll
        for (int i = 0; i < 16; ++i) v[i] = __fdiv_rn(v[i], c.s.kf);
      }
      Dq16(d->codes, b.base, E4M3Value(d->scales[w_scale]), c.s_dec_old, dq);
      if (c.s.has_r) {
        Load16(d->residual, kF32, b.base, r);
      } else {
#pragma unroll
        for (int i = 0; i < 16; ++i) r[i] = 0.0f;
      }
      if constexpr (kDenseState) {
        // f32 / bf16 moments: eight elements at a time, loaded, advanced and stored; v <- the
        // new weight value.
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int64_t at = b.base + 8 * h;
          float a1[8], a2[8], a3[8];
#pragma unroll
          for (int i = 0; i < 8; ++i) a1[i] = a2[i] = a3[i] = 0.0f;
          if (!skip_m1) Load8(d->m_dense[0], kStDtype, at, a1);
          if (IsAdamW<kOpt>()) Load8(d->m_dense[1], kStDtype, at, a2);
          if (HasMm2<kOpt>()) Load8(d->m_dense[2], kStDtype, at, a3);
#pragma unroll
          for (int i = 0; i < 8; ++i) {
            const int k = 8 * h + i;
            const Elem el = StepElement<kOpt>(c.s, v[k], dq[k], r[k], a1[i], a2[i], a3[i]);
            v[k] = el.v;
            a1[i] = el.m1;
            a2[i] = el.v2;
            a3[i] = el.vm;
            bamax = fmaxf(bamax, fabsf(el.v));
            acc.m1 = fmaxf(acc.m1, fabsf(el.m1));
            if (IsAdamW<kOpt>()) acc.s2 = fmaxf(acc.s2, __fsqrt_rn(el.v2));
            if (HasMm2<kOpt>()) acc.svm = fmaxf(acc.svm, __fsqrt_rn(el.vm));
          }
          Store8(d->m_dense[0], kStDtype, at, a1);
          if (IsAdamW<kOpt>()) Store8(d->m_dense[1], kStDtype, at, a2);
          if (HasMm2<kOpt>()) Store8(d->m_dense[2], kStDtype, at, a3);
        }
      } else {
        // No moments, or NVFP4 ones: in place, m1 <- b or m, m2 <- v2, mm2 <- vm.
        if constexpr (kNvState) {
#pragma unroll
          for (int i = 0; i < 16; ++i) m1[i] = m2[i] = mm2[i] = 0.0f;
          if (!skip_m1) LoadMoment<kSt>(*d, 0, c.m_sdec_old[0], b.base, false, m1);
          if (IsAdamW<kOpt>()) LoadMoment<kSt>(*d, 1, c.m_sdec_old[1], b.base, true, m2);
          if (HasMm2<kOpt>()) LoadMoment<kSt>(*d, 2, c.m_sdec_old[2], b.base, true, mm2);
        }
#pragma unroll
        for (int i = 0; i < 16; ++i) {
          const float m1i = kNvState ? m1[kNvState ? i : 0] : 0.0f;
          const float m2i = kNvState ? m2[kNvState ? i : 0] : 0.0f;
          const float mm2i = kNvState ? mm2[kNvState ? i : 0] : 0.0f;
          const Elem el = StepElement<kOpt>(c.s, v[i], dq[i], r[i], m1i, m2i, mm2i);
          v[i] = el.v;
          if constexpr (kNvState) {
            m1[i] = el.m1;
            m2[i] = el.v2;
            mm2[i] = el.vm;
          }
          bamax = fmaxf(bamax, fabsf(el.v));
        }
      }
    }
    if constexpr (kTile) bamax = TileMax<0>(bamax);  // every lane: the 16 rows of its tile
    if (!b.valid) continue;
    // Q: the new weight block.
    const uint32_t sf = E4M3Rn(__fmul_rn(bamax, c.q.g.t));
    const float sfv = E4M3Value(sf);
    uint32_t w0, w1;
    Codes16<kSr>(v, InvScale(sfv, c.q.g.s_dec), c.q, static_cast<uint64_t>(b.base) >> 3, &w0, &w1);
    *reinterpret_cast<uint2*>(d->codes + (b.base >> 1)) = make_uint2(w0, w1);
    d->scales[w_scale] = static_cast<uint8_t>(sf);
    // R and O: DQ(W'), the residual, the outputs.
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const uint32_t code = ((i < 8 ? w0 : w1) >> (4 * (i & 7))) & 0xFu;
      dq[i] = __fmul_rn(__fmul_rn(E2M1Value(code), sfv), c.q.g.s_dec);
      acc.v = fmaxf(acc.v, fabsf(v[i]));
    }
    if (c.s.has_r) {
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        r[i] = __fsub_rn(v[i], dq[i]);
        acc.r = fmaxf(acc.r, fabsf(r[i]));
      }
      Store16(d->residual, kF32, b.base, r);
    }
    for (int k = 0; k < d->n_outs; ++k) {
      const step_ws::OutDesc o = a.outs[d->first_out + k];
      Store16(o.data, o.dtype, b.base, dq);
    }
    // NVFP4 moments (dense ones were stored above).
    if constexpr (kNvState) {
#pragma unroll
      for (int i = 0; i < 16; ++i) acc.m1 = fmaxf(acc.m1, fabsf(m1[i]));
      StoreMomentNv(*d, 0, c.mg[0], b.base, false, m1);
      if constexpr (IsAdamW<kOpt>()) {
#pragma unroll
        for (int i = 0; i < 16; ++i) acc.s2 = fmaxf(acc.s2, __fsqrt_rn(m2[i]));
        StoreMomentNv(*d, 1, c.mg[1], b.base, true, m2);
      }
      if constexpr (HasMm2<kOpt>()) {
#pragma unroll
        for (int i = 0; i < 16; ++i) acc.svm = fmaxf(acc.svm, __fsqrt_rn(mm2[i]));
        StoreMomentNv(*d, 2, c.mg[2], b.base, true, mm2);
      }
    }
  }
  if (item >= 0) FlushApply<kOpt>(a, item, acc);
}

template <typename Kernel>
int ApplyResidentCtas(Kernel k) {
  int n = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k, kThreads, 0) != cudaSuccess || n < 1) {
    cudaGetLastError();
    n = 2;
  }
  return n;
}

template <int kOpt, int kSt, bool kSr, bool kTile>
cudaError_t LaunchApply(const StepKernelArgs& a, cudaStream_t s) {
  static const int per_sm = ApplyResidentCtas(StepApplyKernel<kOpt, kSt, kSr, kTile>);
  int64_t ctas = (a.total_units + kWarps - 1) / kWarps;
  const int64_t cap = static_cast<int64_t>(SmCount()) * per_sm;
  if (ctas > cap) ctas = cap;
  if (ctas == 0) return cudaSuccess;
  StepApplyKernel<kOpt, kSt, kSr, kTile><<<static_cast<unsigned>(ctas), kThreads, 0, s>>>(a);
  return cudaGetLastError();
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
