// Row-wise NVFP4 1x16 quantization with map-to-6 scales, lane-granular (the fast path of
// LaunchQuantizeRows): Quantize, QDQ and error feedback, RTN or SR, with or without RHT, and
// the amax-only pass of those. Other requests (MXFP4, 16x16 tiles, four-over-six,
// UpdateWeight, rows whose length is not a multiple of 64) take quantize_rows.cu.
//
// Layout: the tensor is seen as one flat sequence of 8-element granules (a row's length is a
// multiple of 64, so no 16-element block and no group of four blocks crosses a row). Lane l of a
// warp owns granule 32 * u + l of each 256-granule step u: every load instruction of the warp
// reads 512 contiguous bytes of bf16 (16 bytes a lane), every code store writes 128 contiguous
// bytes (one 32-bit word a lane: a granule's 8 codes). An NVFP4 block is a lane pair: its amax is
// one shuffle, the RHT's last butterfly stage (width 8) is one shuffle per element, and the
// granule is exactly one Philox group (NUMERICS 4: counter = element index / 8). Scales go out as
// one 32-bit word per 8 lanes (four consecutive blocks of a row are consecutive bytes in both
// scale layouts).
//
// Each lane holds kU granules of the next step in registers while it computes the current one
// (software pipelining), so about 2 x kU x 16 bytes a lane are in flight.
//
// FP4Q_ROW_KERNEL=legacy in the environment sends every request to quantize_rows.cu instead
// (for A/B measurements; read once per process).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>

#include "launch.h"
#include "quantize_unit.cuh"

namespace fp4q::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr unsigned kFull = 0xFFFFFFFFu;

struct LaneParams {
  RowParams p;
  uint64_t n_gran = 0;     // granules (elements / 8)
  uint64_t row_magic = 0;  // floor((2^64 - 1) / scale_cols) + 1: block -> row (swizzled)
  uint32_t scale_cols = 0;
};

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
  if constexpr (sizeof(In) == 2) {
    const uint32_t w[4] = {gr.x[0].x, gr.x[0].y, gr.x[0].z, gr.x[0].w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      v[2 * j] = Bf16Lo(w[j]);
      v[2 * j + 1] = Bf16Hi(w[j]);
    }
  } else {
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      v[4 * k] = __uint_as_float(gr.x[k].x);
      v[4 * k + 1] = __uint_as_float(gr.x[k].y);
      v[4 * k + 2] = __uint_as_float(gr.x[k].z);
      v[4 * k + 3] = __uint_as_float(gr.x[k].w);
    }
  }
  if constexpr (kRes) {
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      v[4 * k] = __fadd_rn(v[4 * k], __uint_as_float(gr.r[k].x));
      v[4 * k + 1] = __fadd_rn(v[4 * k + 1], __uint_as_float(gr.r[k].y));
      v[4 * k + 2] = __fadd_rn(v[4 * k + 2], __uint_as_float(gr.r[k].z));
      v[4 * k + 3] = __fadd_rn(v[4 * k + 3], __uint_as_float(gr.r[k].w));
    }
  }
}

// The 16-point RHT of a block split over a lane pair: this lane holds elements 8h .. 8h + 7
// (h = lane & 1). Same operations in the same order as Rht16: signs, butterfly stages 1, 2, 4
// in the lane, stage 8 across the pair, * 0.25, then the bf16 rounding.
FP4Q_D void RhtPair(float* v, uint32_t signs, int h, bool round_bf16) {
  const uint32_t s = signs >> (8 * h);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    v[i] = __fmul_rn(v[i], __uint_as_float(0x3F800000u | ((s << (31 - i)) & 0x80000000u)));
  }
#pragma unroll
  for (int w = 1; w < 8; w <<= 1) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      if ((i & w) == 0) {
        const float a = v[i];
        const float b = v[i + w];
        v[i] = __fadd_rn(a, b);
        v[i + w] = __fsub_rn(a, b);
      }
    }
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const float other = __shfl_xor_sync(kFull, v[i], 1);
    v[i] = h == 0 ? __fadd_rn(v[i], other) : __fsub_rn(other, v[i]);
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) v[i] = __fmul_rn(v[i], 0.25f);
  if (round_bf16) {
#pragma unroll
    for (int i = 0; i < 8; i += 2) {
      const uint32_t pair = PackBf16x2(v[i], v[i + 1]);
      v[i] = Bf16Lo(pair);
      v[i + 1] = Bf16Hi(pair);
    }
  }
}

// The 8 codes of a granule as one word (element e in bits 4e .. 4e+3), as Codes16 does for 16.
template <bool kSr>
FP4Q_D uint32_t Codes8(const float* v, float inv, const UnitCtx& c, uint64_t group) {
  constexpr uint32_t kBase = kSr ? kSrMagBase : kRnMagBase;
  constexpr uint32_t kBias = kBase * 0x11111111u;
  uint4 r = make_uint4(0u, 0u, 0u, 0u);
  if (kSr) r = SrBits(group, c.seed, c.step);
  uint32_t acc = 0u - kBias;
  float probe = 0.0f;
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    probe = __fadd_rn(probe, fabsf(v[e]));
    const float y = __fmul_rn(v[e], inv);
    const float m = kSr ? E2M1SrMagnitude(y, SrOperand(r, e)) : E2M1RnMagnitude(y);
    acc += __float_as_uint(m) * (1u << (4 * e));
    acc += __umulhi(__float_as_uint(y), 2u) * (8u << (4 * e));  // sign bit
  }
  if (isnan(probe)) {  // NaN elements: code 0x7, no sign
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      if (isnan(v[e])) acc &= ~(8u << (4 * e));
    }
  }
  return acc;
}

template <typename In, bool kSr, bool kRht, bool kRes>
__global__ void __launch_bounds__(kThreads, 2) QuantizeLanesKernel(const LaneParams lp) {
  constexpr int kU = StepGranules<In, kRes>();
  const RowParams& p = lp.p;
  const int lane = threadIdx.x & 31;
  const int h = lane & 1;
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
      if (kRht) RhtPair(v, p.q.rht_signs, h, sizeof(In) == 2);
      if (amax_only) {
#pragma unroll
        for (int e = 0; e < 8; ++e) thread_max = fmaxf(thread_max, fabsf(v[e]));
        continue;
      }
      float bamax = 0.0f;
#pragma unroll
      for (int e = 0; e < 8; ++e) bamax = fmaxf(bamax, fabsf(v[e]));
      bamax = fmaxf(bamax, __shfl_xor_sync(kFull, bamax, 1));
      const uint32_t sf = E4M3Rn(__fmul_rn(bamax, ctx.g.t));
      const float sfv = E4M3Value(sf);
      const uint32_t word = Codes8<kSr>(v, InvScale(sfv, ctx.g.s_dec), ctx, g);
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
}

template <typename In, bool kSr, bool kRht, bool kRes>
cudaError_t Launch(const LaneParams& lp, cudaStream_t s) {
  constexpr int kU = StepGranules<In, kRes>();
  const uint64_t steps = (lp.n_gran + 32 * kU - 1) / (32 * kU);
  uint64_t blocks = (steps + kThreads / 32 - 1) / (kThreads / 32);
  const uint64_t cap = static_cast<uint64_t>(SmCount()) * 2;  // one wave at 2 CTAs per SM
  if (blocks > cap) blocks = cap;
  if (blocks == 0) return cudaSuccess;
  QuantizeLanesKernel<In, kSr, kRht, kRes><<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(lp);
  return cudaGetLastError();
}

template <typename In>
cudaError_t Dispatch(const LaneParams& lp, cudaStream_t s) {
  const QuantOptions& q = lp.p.q;
  if (lp.p.residual != nullptr) {  // error feedback: never with RHT (checked by the caller)
    return q.sr ? Launch<In, true, false, true>(lp, s) : Launch<In, false, false, true>(lp, s);
  }
  if (q.rht) {
    return q.sr ? Launch<In, true, true, false>(lp, s) : Launch<In, false, true, false>(lp, s);
  }
  return q.sr ? Launch<In, true, false, false>(lp, s) : Launch<In, false, false, false>(lp, s);
}

bool LegacyRequested() {
  static const bool legacy = [] {
    const char* v = std::getenv("FP4Q_ROW_KERNEL");
    return v != nullptr && std::strcmp(v, "legacy") == 0;
  }();
  return legacy;
}

}  // namespace

bool QuantizeLanesEligible(const RowParams& p) {
  if (p.update || p.q.fmt != kFmtNv1x16 || p.q.scale_sel != kSelMapTo6) return false;
  if (p.residual != nullptr && p.q.rht) return false;
  if (p.rows <= 0 || p.cols <= 0 || p.cols % 64 != 0) return false;
  // Block indices stay below 2^32 (the swizzled layout's row division).
  if (static_cast<uint64_t>(p.rows) * static_cast<uint64_t>(p.cols) / 16 >= (uint64_t{1} << 32)) {
    return false;
  }
  return !LegacyRequested();
}

cudaError_t LaunchQuantizeLanes(const RowParams& p, cudaStream_t s) {
  if (!QuantizeLanesEligible(p)) return cudaErrorInvalidValue;
  LaneParams lp;
  lp.p = p;
  lp.n_gran = static_cast<uint64_t>(p.rows) * static_cast<uint64_t>(p.cols) / 8;
  lp.scale_cols = static_cast<uint32_t>(p.cols / 16);
  lp.row_magic = ~uint64_t{0} / lp.scale_cols + 1;
  return p.x_dtype == kF32 ? Dispatch<float>(lp, s) : Dispatch<__nv_bfloat16>(lp, s);
}

}  // namespace fp4q::kernels::cuda
