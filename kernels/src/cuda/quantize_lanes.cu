// Row-wise NVFP4 1x16 quantization with map-to-6 scales, lane-granular (the fast path of
// LaunchQuantizeRows): Quantize, QDQ and error feedback, RTN or SR, with or without RHT, and
// the amax-only pass of those (for error feedback also the guarded one of a FiniteGuard: first
// non-finite x and v). Other requests (MXFP4, 16x16 tiles, four-over-six, rows whose length is
// not a multiple of 64) take quantize_rows.cu.
//
// The tensor is seen as one flat sequence of granules (a row's length is a multiple of 64, so
// no 16-element block and no group of four blocks crosses a row); lane l of a warp owns granule
// 32 * u + l of each step u, so a warp's loads and stores cover contiguous memory (four
// consecutive blocks of a row have consecutive scale bytes in both layouts). Two granule sizes:
//   - 16 elements (one NVFP4 block per lane: Quantize and QDQ without error feedback). The
//     block amax, the RHT and the scale are computed by the lane alone, which stores its scale
//     byte itself; measured on the H200
//     (bench/NOTES.md v5) this needs fewer instructions per element than lane pairs, and these
//     requests are bound by instruction issue, not by memory.
//   - 8 elements (a lane pair per block: error feedback). The block amax is a shuffle and
//     scales go out as one 32-bit word per 8 lanes. 16-byte lanes keep the f32 residual's
//     12 bytes per element of traffic fully coalesced; this request is bound by memory.
// Each lane holds the next step's granules in registers while it computes the current one
// (software pipelining). A granule of 8 is exactly one Philox group (NUMERICS 4: counter =
// element index / 8); a granule of 16 is two.
//
// Which of these kernels runs a pass (or quantize_rows.cu instead) is kernel_choice.h's
// decision, tuned by the backend's KernelTuning.
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cfloat>

#include "launch.h"
#include "quantize_unit.cuh"

namespace fp4q::kernels::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 256;
constexpr unsigned kFull = 0xFFFFFFFFu;

struct LaneParams {
  RowParams p;
  uint64_t n_gran = 0;     // 8-element granules (elements / 8)
  uint32_t n_blocks = 0;   // 16-element blocks (elements / 16 < 2^31)
  // Non-null: compute the global amax in the launch itself (see QuantizeBlocksKernel).
  float* fused_amax = nullptr;
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
  WidenWords<In>(gr.x, sizeof(In) == 2 ? 1 : 2, v);
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

// ---------------------------------------------------------------- one block per lane

template <typename In>
struct Block16 {
  uint4 x[sizeof(In) == 2 ? 2 : 4];
};

template <typename In>
FP4Q_D void LoadBlock(const void* x, uint32_t b, bool valid, Block16<In>* out) {
  constexpr int kW = sizeof(In) == 2 ? 2 : 4;
  const uint4 z = make_uint4(0u, 0u, 0u, 0u);
  const uint4* src = reinterpret_cast<const uint4*>(x) + static_cast<uint64_t>(b) * kW;
#pragma unroll
  for (int k = 0; k < kW; ++k) out->x[k] = valid ? src[k] : z;
}

template <typename In>
FP4Q_D void WidenBlock(const Block16<In>& b, float* v) {
  WidenWords<In>(b.x, sizeof(In) == 2 ? 2 : 4, v);
}

// Quantize and QDQ without error feedback, and their amax-only pass: lane l of a warp owns
// block 32 * u + l of each step (kU blocks a lane per step, the next step's loads in flight).
// kCtas: CTAs per SM the registers allow (launch bounds); with 4, one block a lane per step.
template <typename In, bool kSr, bool kRht, int kCtas>
__global__ void __launch_bounds__(kThreads, kCtas) QuantizeBlocksKernel(const LaneParams lp) {
  constexpr int kU = (sizeof(In) == 2 && kCtas < 4) ? 2 : 1;
  const RowParams& p = lp.p;
  const int lane = threadIdx.x & 31;
  const uint32_t n_blocks = lp.n_blocks;
  const uint32_t gtid = blockIdx.x * kThreads + threadIdx.x;
  const uint32_t warps = gridDim.x * (kThreads / 32);
  const uint32_t steps = (n_blocks + 32 * kU - 1) / (32 * kU);

  const bool amax_only = p.amax_out != nullptr;
  UnitCtx ctx{};
  if (!amax_only) {
    float amax;
    if (lp.fused_amax != nullptr) {
      // The global amax in this launch (a cooperative one, one wave): every lane reduces its
      // blocks, then two grid barriers around the atomic max into *fused_amax, which this
      // launch zeroes itself. Small tensors only (the data is read twice, the second time from
      // L2), to save the separate reduction's launches.
      float m = 0.0f;
      for (uint32_t st = gtid >> 5; st < steps; st += warps) {
#pragma unroll
        for (int u = 0; u < kU; ++u) {
          const uint32_t b = (st * kU + u) * 32 + lane;
          Block16<In> blk;
          LoadBlock<In>(p.x, b, b < n_blocks, &blk);
          float v[16];
          WidenBlock<In>(blk, v);
          if (kRht) Rht16(v, p.q.rht_signs, sizeof(In) == 2);
          m = fmaxf(m, BlockAmax16(v));
        }
      }
      cg::grid_group grid = cg::this_grid();
      if (gtid == 0) *lp.fused_amax = 0.0f;
      grid.sync();
      WarpAtomicMax(lp.fused_amax, m);
      grid.sync();
      amax = __ldcg(lp.fused_amax);
    } else {
      amax = p.out.amax_ptr != nullptr ? *p.out.amax_ptr : p.out.amax_value;
    }
    ctx = MakeUnitCtx(p.q, amax);
    if (gtid == 0 && p.out.global != nullptr) {
      if (p.out.write_amax) p.out.global[0] = amax;
      p.out.global[1] = ctx.g.s_enc;
    }
  }
  const bool want_codes = !amax_only && p.out.codes != nullptr;
  const bool want_dq = !amax_only && p.dq != nullptr;
  float thread_max = 0.0f;

  uint32_t step = gtid >> 5;  // warp-uniform
  Block16<In> cur[kU];
  if (step < steps) {
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const uint32_t b = (step * kU + u) * 32 + lane;
      LoadBlock<In>(p.x, b, b < n_blocks, &cur[u]);
    }
  }
  for (; step < steps; step += warps) {
    const uint32_t next = step + warps;
    Block16<In> nxt[kU];
    if (next < steps) {
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const uint32_t b = (next * kU + u) * 32 + lane;
        LoadBlock<In>(p.x, b, b < n_blocks, &nxt[u]);
      }
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const uint32_t b = (step * kU + u) * 32 + lane;
      // Groups of four lanes are valid together (the block count is a multiple of 4).
      const bool valid = b < n_blocks;
      float v[16];
      WidenBlock<In>(cur[u], v);
      if (kRht) Rht16(v, p.q.rht_signs, sizeof(In) == 2);
      if (amax_only) {
        thread_max = fmaxf(thread_max, BlockAmax16(v));
        continue;
      }
      bool any_nan;
      const uint32_t sf = E4M3Rn(__fmul_rn(BlockAmax16Flagged(v, &any_nan), ctx.g.t));
      const float sfv = E4M3Value(sf);
      const float inv = InvScale(sfv, ctx.g.s_dec);
      const uint32_t w0 = Codes8<kSr>(v, inv, ctx, p.q.sr_keys, uint64_t{b} * 2, any_nan);
      const uint32_t w1 = Codes8<kSr>(v + 8, inv, ctx, p.q.sr_keys, uint64_t{b} * 2 + 1, any_nan);
      if (want_codes && valid) {
        reinterpret_cast<uint2*>(p.out.codes)[b] = make_uint2(w0, w1);
        // One byte a lane: a warp's 32 scale bytes are contiguous in the plain layout (one
        // 32-byte store) and four runs of 8 in the swizzled one.
        uint64_t at = b;
        if (p.out.swizzled) {
          const uint64_t row = __umul64hi(lp.row_magic, uint64_t{b});
          at = static_cast<uint64_t>(SwizzleOffset(static_cast<int64_t>(row),
                                                   static_cast<int64_t>(b - row * lp.scale_cols),
                                                   lp.scale_cols / 4));
        }
        p.out.scales[at] = static_cast<uint8_t>(sf);
      }
      if (want_dq && valid) {
        float d[16];
#pragma unroll
        for (int e = 0; e < 16; ++e) {
          const uint32_t code = ((e < 8 ? w0 : w1) >> (4 * (e & 7))) & 0xFu;
          d[e] = __fmul_rn(__fmul_rn(E2M1Value(code), sfv), ctx.g.s_dec);
        }
        if (p.dq_dtype == kF32) {
          float4* q = reinterpret_cast<float4*>(p.dq) + uint64_t{b} * 4;
#pragma unroll
          for (int k = 0; k < 4; ++k) q[k] = make_float4(d[4 * k], d[4 * k + 1], d[4 * k + 2], d[4 * k + 3]);
        } else {
          uint4* q = reinterpret_cast<uint4*>(p.dq) + uint64_t{b} * 2;
#pragma unroll
          for (int k = 0; k < 2; ++k) {
            q[k] = make_uint4(PackBf16x2(d[8 * k], d[8 * k + 1]), PackBf16x2(d[8 * k + 2], d[8 * k + 3]),
                              PackBf16x2(d[8 * k + 4], d[8 * k + 5]),
                              PackBf16x2(d[8 * k + 6], d[8 * k + 7]));
          }
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) cur[u] = nxt[u];
  }
  if (amax_only) WarpAtomicMax(p.amax_out, thread_max);
}

// CTAs per SM the kernel reaches (registers), asked once per kernel; the grid is one wave.
template <typename Kernel>
int ResidentCtas(Kernel k) {
  int n = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k, kThreads, 0) != cudaSuccess || n < 1) {
    cudaGetLastError();
    n = 2;
  }
  return n;
}

template <typename In, bool kSr, bool kRht, int kCtas>
cudaError_t LaunchBlocksWith(const LaneParams& lp, cudaStream_t s) {
  constexpr int kU = (sizeof(In) == 2 && kCtas < 4) ? 2 : 1;
  static const int per_sm = ResidentCtas(QuantizeBlocksKernel<In, kSr, kRht, kCtas>);
  const uint64_t steps = (uint64_t{lp.n_blocks} + 32 * kU - 1) / (32 * kU);
  uint64_t ctas = (steps + kThreads / 32 - 1) / (kThreads / 32);
  const uint64_t cap = static_cast<uint64_t>(SmCount()) * per_sm;
  if (ctas > cap) ctas = cap;
  if (ctas == 0) return cudaSuccess;
  if (lp.fused_amax != nullptr) {
    // Every CTA must be resident at once for the grid barriers: the caller checked that the
    // tensor needs no more than one wave (FusedAmaxFits), and the launch refuses otherwise.
    if (steps > cap * (kThreads / 32)) return cudaErrorCooperativeLaunchTooLarge;
    LaneParams copy = lp;
    void* args[] = {&copy};
    const cudaError_t e = cudaLaunchCooperativeKernel(
        reinterpret_cast<const void*>(&QuantizeBlocksKernel<In, kSr, kRht, kCtas>),
        dim3(static_cast<unsigned>(ctas)), dim3(kThreads), args, 0, s);
    if (e != cudaSuccess) return e;
    return cudaGetLastError();
  }
  QuantizeBlocksKernel<In, kSr, kRht, kCtas><<<static_cast<unsigned>(ctas), kThreads, 0, s>>>(lp);
  return cudaGetLastError();
}

template <typename In, bool kSr, bool kRht>
cudaError_t LaunchBlocks(const LaneParams& lp, bool four_ctas, cudaStream_t s) {
  if constexpr (sizeof(In) == 2) {
    if (four_ctas) return LaunchBlocksWith<In, kSr, kRht, 4>(lp, s);
  }
  return LaunchBlocksWith<In, kSr, kRht, 3>(lp, s);
}

template <typename In, bool kSr, bool kTrack = false>
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

template <typename In>
cudaError_t Dispatch(const LaneParams& lp, RowKernel k, cudaStream_t s) {
  const QuantOptions& q = lp.p.q;
  switch (k) {
    case RowKernel::kLanesGuardedAmax:
      return LaunchLanes<In, false, true>(lp, s);  // no rounding
    case RowKernel::kLanesResidual:
      return q.sr ? LaunchLanes<In, true>(lp, s) : LaunchLanes<In, false>(lp, s);
    case RowKernel::kLanesBlocks:
    case RowKernel::kLanesBlocksFourCtas: {
      const bool four = k == RowKernel::kLanesBlocksFourCtas;
      if (q.rht) {
        return q.sr ? LaunchBlocks<In, true, true>(lp, four, s)
                    : LaunchBlocks<In, false, true>(lp, four, s);
      }
      return q.sr ? LaunchBlocks<In, true, false>(lp, four, s)
                  : LaunchBlocks<In, false, false>(lp, four, s);
    }
    case RowKernel::kRows:
      break;
  }
  return cudaErrorInvalidValue;
}

LaneParams LaneParamsOf(const RowParams& p) {
  LaneParams lp;
  lp.p = p;
  lp.n_gran = static_cast<uint64_t>(p.rows) * static_cast<uint64_t>(p.cols) / 8;
  lp.n_blocks = static_cast<uint32_t>(lp.n_gran / 2);
  lp.scale_cols = static_cast<uint32_t>(p.cols / 16);
  lp.row_magic = ~uint64_t{0} / lp.scale_cols + 1;
  return lp;
}

}  // namespace

cudaError_t LaunchQuantizeFusedAmax(const RowParams& p, float* amax, cudaStream_t s) {
  if (!FusedAmaxFits(RowPassOf(p), p.tuning) || amax == nullptr) return cudaErrorInvalidValue;
  LaneParams lp = LaneParamsOf(p);
  lp.p.out.amax_ptr = nullptr;
  lp.fused_amax = amax;
  const QuantOptions& q = p.q;
  const bool four = ChooseRowKernel(RowPassOf(p), p.tuning) == RowKernel::kLanesBlocksFourCtas;
  if (p.x_dtype == kF32) {
    if (q.rht) {
      return q.sr ? LaunchBlocks<float, true, true>(lp, four, s)
                  : LaunchBlocks<float, false, true>(lp, four, s);
    }
    return q.sr ? LaunchBlocks<float, true, false>(lp, four, s)
                : LaunchBlocks<float, false, false>(lp, four, s);
  }
  if (q.rht) {
    return q.sr ? LaunchBlocks<__nv_bfloat16, true, true>(lp, four, s)
                : LaunchBlocks<__nv_bfloat16, false, true>(lp, four, s);
  }
  return q.sr ? LaunchBlocks<__nv_bfloat16, true, false>(lp, four, s)
              : LaunchBlocks<__nv_bfloat16, false, false>(lp, four, s);
}

cudaError_t LaunchQuantizeLanes(const RowParams& p, RowKernel k, cudaStream_t s) {
  if (k == RowKernel::kRows) return cudaErrorInvalidValue;
  const LaneParams lp = LaneParamsOf(p);
  return p.x_dtype == kF32 ? Dispatch<float>(lp, k, s) : Dispatch<__nv_bfloat16>(lp, k, s);
}

namespace {
__global__ void ModuleAnchorKernel() {}  // names this file's CUDA module (QuantizeLanesModule)
}  // namespace

const void* QuantizeLanesModule() { return reinterpret_cast<const void*>(&ModuleAnchorKernel); }

}  // namespace fp4q::kernels::cuda
