// Error feedback on the lane-granular path (LaunchQuantizeLanes, kLanesResidual and
// kLanesGuardedAmax): x and its f32 residual v, a lane pair per NVFP4 1x16 block with map-to-6
// scales, rows a multiple of 64 long (quantize_lanes.cu's comment: the flat granule order).
// A lane owns 8 elements (one Philox group, NUMERICS 4: counter = element index / 8); the block
// amax is a shuffle and scales go out as one 32-bit word per 8 lanes. 16-byte lanes keep the f32
// residual's 12 bytes per element of traffic fully coalesced; this request is bound by memory.
// Each lane holds the next step's granules in registers while it computes the current one.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cfloat>

#include "launch.h"
#include "quantize_lanes.cuh"
#include "quantize_unit.cuh"

namespace fp4q::kernels::cuda {
namespace {

using lanes::kFull;
using lanes::kThreads;
using lanes::LaneParams;
using lanes::ResidentCtas;

// Granules per lane per step: 4 for bf16 x; 2 when each granule is 32 bytes of f32 x or carries
// its 32-byte f32 residual (register budget of 2 CTAs per SM).
template <typename In, bool kRes>
constexpr int StepGranules() {
  return (kRes || sizeof(In) == 4) ? 2 : 4;
}

template <typename In, bool kRes>
struct Gran {
  uint4 x[sizeof(In) == 2 ? 1 : 2];
  uint4 r[kRes ? 2 : 1];
};

template <typename In, bool kRes>
FP4Q_D void LoadGran(const RowParams& p, uint64_t g, bool valid, Gran<In, kRes>* out) {
  const uint4 z = make_uint4(0u, 0u, 0u, 0u);
  const uint4* xp = reinterpret_cast<const uint4*>(p.x) + g * (sizeof(In) == 2 ? 1 : 2);
  out->x[0] = valid ? xp[0] : z;
  if constexpr (sizeof(In) == 4) out->x[1] = valid ? xp[1] : z;
  if constexpr (kRes) {
    const uint4* rp = reinterpret_cast<const uint4*>(p.residual) + g * 2;
    out->r[0] = valid ? rp[0] : z;
    out->r[1] = valid ? rp[1] : z;
  }
}

template <typename In, bool kRes>
FP4Q_D void WidenGran(const Gran<In, kRes>& gr, float* v) {
  WidenWords<In>(gr.x, sizeof(In) == 2 ? 1 : 2, v);
  if constexpr (kRes) AddResidualWords(gr.r, 2, v);
}

// Error feedback (and its amax-only pass): x and the f32 residual, a lane pair per block.
// kTrack: the guarded amax-only pass (its own instantiation).
template <typename In, bool kSr, bool kTrack = false>
__global__ void __launch_bounds__(kThreads, 2) QuantizeLanesKernel(const LaneParams lp) {
  constexpr bool kRes = true;
  constexpr int kU = StepGranules<In, kRes>();
  const RowParams& p = lp.p;
  if (p.gate != nullptr && *p.gate != 0) return;  // a refused guarded call writes nothing
  const int lane = threadIdx.x & 31;
  const uint64_t gtid = static_cast<uint64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const uint64_t warps = (static_cast<uint64_t>(gridDim.x) * kThreads) >> 5;
  const uint64_t steps = (lp.n_gran + 32 * kU - 1) / (32 * kU);

  const bool amax_only = p.amax_out != nullptr;
  UnitCtx ctx{};
  if (!amax_only) {
    const float amax = p.out.amax_ptr != nullptr ? *p.out.amax_ptr : p.out.amax_value;
    ctx = MakeUnitCtx(p.q, amax);
    if (gtid == 0 && p.out.global != nullptr) {
      if (p.out.write_amax) p.out.global[0] = amax;
      p.out.global[1] = ctx.g.s_enc;
    }
  }
  const bool want_codes = !amax_only && p.out.codes != nullptr;
  const bool want_dq = !amax_only && (p.dq != nullptr || kRes);
  float thread_max = 0.0f;
  constexpr bool track = kTrack;  // the guarded amax pass (amax_only is set)
  uint64_t bad_x = ~uint64_t{0};
  uint64_t bad_v = ~uint64_t{0};

  uint64_t step = gtid >> 5;  // warp-uniform
  Gran<In, kRes> cur[kU];
  if (step < steps) {
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const uint64_t g = (step * kU + u) * 32 + lane;
      LoadGran<In, kRes>(p, g, g < lp.n_gran, &cur[u]);
    }
  }
  for (; step < steps; step += warps) {
    const uint64_t next = step + warps;
    Gran<In, kRes> nxt[kU];
    if (next < steps) {
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const uint64_t g = (next * kU + u) * 32 + lane;
        LoadGran<In, kRes>(p, g, g < lp.n_gran, &nxt[u]);
      }
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const uint64_t g = (step * kU + u) * 32 + lane;
      // Lane pairs and 8-lane groups are valid together (the element count is a multiple of 64).
      const bool valid = g < lp.n_gran;
      float v[8];
      WidenGran<In, kRes>(cur[u], v);
      if (kTrack || amax_only) {
#pragma unroll
        for (int e = 0; e < 8; ++e) thread_max = fmaxf(thread_max, fabsf(v[e]));
        if (track && valid) {
          float x[8];
          WidenWords<In>(cur[u].x, sizeof(In) == 2 ? 1 : 2, x);
#pragma unroll
          for (int e = 7; e >= 0; --e) {
            const uint64_t i = g * 8 + e;
            if (!(fabsf(x[e]) <= FLT_MAX) && i < bad_x) bad_x = i;
            if (!(fabsf(v[e]) <= FLT_MAX) && i < bad_v) bad_v = i;
          }
        }
        continue;
      }
      float bamax = 0.0f;
#pragma unroll
      for (int e = 0; e < 8; ++e) bamax = fmaxf(bamax, fabsf(v[e]));
      bamax = fmaxf(bamax, __shfl_xor_sync(kFull, bamax, 1));
      const uint32_t sf = E4M3Rn(__fmul_rn(bamax, ctx.g.t));
      const float sfv = E4M3Value(sf);
      const uint32_t word = Codes8<kSr>(v, InvScale(sfv, ctx.g.s_dec), ctx, p.q.sr_keys, g);
      if (want_codes) {
        const uint32_t b1 = __shfl_down_sync(kFull, sf, 2);
        const uint32_t b2 = __shfl_down_sync(kFull, sf, 4);
        const uint32_t b3 = __shfl_down_sync(kFull, sf, 6);
        if (valid) {
          reinterpret_cast<uint32_t*>(p.out.codes)[g] = word;
          if ((lane & 7) == 0) {
            const uint64_t blk = g >> 1;  // a multiple of 4
            uint64_t at = blk;
            if (p.out.swizzled) {
              const uint64_t row = __umul64hi(lp.row_magic, blk);
              at = static_cast<uint64_t>(
                  SwizzleOffset(static_cast<int64_t>(row), static_cast<int64_t>(blk - row * lp.scale_cols),
                                lp.scale_cols / 4));
            }
            *reinterpret_cast<uint32_t*>(p.out.scales + at) =
                sf | (b1 << 8) | (b2 << 16) | (b3 << 24);
          }
        }
      }
      if (want_dq && valid) {
        float d[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          d[e] = __fmul_rn(__fmul_rn(E2M1Value((word >> (4 * e)) & 0xFu), sfv), ctx.g.s_dec);
        }
        if (kRes) {
          float4* rp = reinterpret_cast<float4*>(p.residual) + g * 2;
          rp[0] = make_float4(__fsub_rn(v[0], d[0]), __fsub_rn(v[1], d[1]), __fsub_rn(v[2], d[2]),
                              __fsub_rn(v[3], d[3]));
          rp[1] = make_float4(__fsub_rn(v[4], d[4]), __fsub_rn(v[5], d[5]), __fsub_rn(v[6], d[6]),
                              __fsub_rn(v[7], d[7]));
        }
        if (p.dq != nullptr) {
          if (p.dq_dtype == kF32) {
            float4* q = reinterpret_cast<float4*>(p.dq) + g * 2;
            q[0] = make_float4(d[0], d[1], d[2], d[3]);
            q[1] = make_float4(d[4], d[5], d[6], d[7]);
          } else {
            reinterpret_cast<uint4*>(p.dq)[g] =
                make_uint4(PackBf16x2(d[0], d[1]), PackBf16x2(d[2], d[3]),
                           PackBf16x2(d[4], d[5]), PackBf16x2(d[6], d[7]));
          }
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) cur[u] = nxt[u];
  }
  if (amax_only) WarpAtomicMax(p.amax_out, thread_max);
  if constexpr (track) {
#pragma unroll
    for (int m = 0; m < 2; ++m) {
      uint64_t b = m == 0 ? bad_x : bad_v;
      if (!__any_sync(kFull, b != ~uint64_t{0})) continue;
#pragma unroll
      for (int d = 16; d >= 1; d >>= 1) {
        const uint64_t o = __shfl_xor_sync(kFull, b, d);
        b = o < b ? o : b;
      }
      if (lane == 0) {
        atomicMin(reinterpret_cast<unsigned long long*>(m == 0 ? p.first_bad_x : p.first_bad_v),
                  static_cast<unsigned long long>(b));
      }
    }
  }
}

template <typename In, bool kSr, bool kTrack>
cudaError_t LaunchLanes(const LaneParams& lp, cudaStream_t s) {
  constexpr int kU = StepGranules<In, true>();
  const uint64_t steps = (lp.n_gran + 32 * kU - 1) / (32 * kU);
  uint64_t blocks = (steps + kThreads / 32 - 1) / (kThreads / 32);
  static const int per_sm = ResidentCtas(QuantizeLanesKernel<In, kSr, kTrack>);
  const uint64_t cap = static_cast<uint64_t>(SmCount()) * per_sm;  // one wave
  if (blocks > cap) blocks = cap;
  if (blocks == 0) return cudaSuccess;
  QuantizeLanesKernel<In, kSr, kTrack><<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(lp);
  return cudaGetLastError();
}

__global__ void ModuleAnchorKernel() {}  // names this file's CUDA module (QuantizeLanePairsModule)

}  // namespace

namespace lanes {

template <typename In>
cudaError_t LaunchLanePairs(const LaneParams& lp, bool sr, bool track, cudaStream_t s) {
  if (track) return LaunchLanes<In, false, true>(lp, s);
  return sr ? LaunchLanes<In, true, false>(lp, s) : LaunchLanes<In, false, false>(lp, s);
}

template cudaError_t LaunchLanePairs<float>(const LaneParams&, bool, bool, cudaStream_t);
template cudaError_t LaunchLanePairs<__nv_bfloat16>(const LaneParams&, bool, bool, cudaStream_t);

}  // namespace lanes

const void* QuantizeLanePairsModule() {
  return reinterpret_cast<const void*>(&ModuleAnchorKernel);
}

}  // namespace fp4q::kernels::cuda
