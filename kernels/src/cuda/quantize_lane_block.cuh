// One NVFP4 1x16 (or half an MXFP4) block a lane: the block-level pieces of the lane kernels
// that quantize 16 elements a lane without error feedback, shared by quantize_lanes.cu (row-wise
// output) and quantize_tile.cu (row-wise and column-wise output from one read). Device code,
// and LaneParamsOf for the launchers.
#ifndef FP4Q_KERNELS_SRC_CUDA_QUANTIZE_LANE_BLOCK_CUH_
#define FP4Q_KERNELS_SRC_CUDA_QUANTIZE_LANE_BLOCK_CUH_

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "launch.h"
#include "quantize_lanes.cuh"
#include "quantize_unit.cuh"

namespace fp4q::kernels::cuda {

using lanes::LaneParams;

template <typename In>
struct Block16 {
  uint4 x[sizeof(In) == 2 ? 2 : 4];
};

template <typename In>
FP4Q_D void WidenBlock(const Block16<In>& b, float* v) {
  WidenWords<In>(b.x, sizeof(In) == 2 ? 2 : 4, v);
}

// Max of |element| over a bf16 block's 16 elements from its packed words: 7 two-lane maxima of
// magnitudes (max.xorsign.abs: the magnitude of the larger, a sign nobody reads; before sm_86
// the signs are cleared first) and one f32 max of the two halves, where 16 f32 maxima were
// needed. kNaN: a NaN element makes the result
// NaN (max.NaN); otherwise NaN elements are ignored as fmaxf ignores them (BlockAmax16).
template <bool kNaN>
FP4Q_D float Bf16BlockAbsMax(const uint32_t* w) {
  uint32_t m[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) m[i] = w[i];
#if __CUDA_ARCH__ < 860  // no .xorsign.abs before sm_86: clear the signs first
#pragma unroll
  for (int i = 0; i < 8; ++i) m[i] &= 0x7FFF7FFFu;
#endif
#pragma unroll
  for (int width = 4; width >= 1; width >>= 1) {
#pragma unroll
    for (int i = 0; i < width; ++i) {
#if __CUDA_ARCH__ >= 860
      if constexpr (kNaN) {
        asm("max.NaN.xorsign.abs.bf16x2 %0, %1, %2;" : "=r"(m[i]) : "r"(m[i]), "r"(m[i + width]));
      } else {
        asm("max.xorsign.abs.bf16x2 %0, %1, %2;" : "=r"(m[i]) : "r"(m[i]), "r"(m[i + width]));
      }
#else
      if constexpr (kNaN) {
        asm("max.NaN.bf16x2 %0, %1, %2;" : "=r"(m[i]) : "r"(m[i]), "r"(m[i + width]));
      } else {
        asm("max.bf16x2 %0, %1, %2;" : "=r"(m[i]) : "r"(m[i]), "r"(m[i + width]));
      }
#endif
    }
  }
  const float lo = fabsf(Bf16Lo(m[0]));
  const float hi = fabsf(Bf16Hi(m[0]));
  if constexpr (kNaN) {
    float r;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(lo), "f"(hi));
    return r;
  }
  return fmaxf(fmaxf(lo, hi), 0.0f);
}

// A lane block's 16 values as the quantizer takes them, in v: x widened, then its RHT if any.
// For bf16 x also as 8 packed bf16 pairs in `pairs` (the RHT of bf16 x is rounded back to bf16),
// from which the block amax is taken two elements at a time. The RHT's signs flip the sign bits
// of the packed input (one XOR for two elements where Rht16 multiplies each by +-1; both exact,
// and a NaN input gives the canonical NaN out of the butterfly either way).
template <typename In, bool kRht>
FP4Q_D void LaneBlockValues(const LaneParams& lp, const Block16<In>& blk, float* v,
                            uint32_t* pairs) {
  if constexpr (sizeof(In) == 2) {
    const uint32_t x[8] = {blk.x[0].x, blk.x[0].y, blk.x[0].z, blk.x[0].w,
                           blk.x[1].x, blk.x[1].y, blk.x[1].z, blk.x[1].w};
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const uint32_t w = kRht ? x[k] ^ lp.rht_sign_words[k] : x[k];
      v[2 * k] = Bf16Lo(w);
      v[2 * k + 1] = Bf16Hi(w);
      pairs[k] = w;
    }
    if constexpr (kRht) {
      Butterfly16(v);
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        pairs[k] = PackBf16x2(v[2 * k], v[2 * k + 1]);
        v[2 * k] = Bf16Lo(pairs[k]);
        v[2 * k + 1] = Bf16Hi(pairs[k]);
      }
    }
  } else {
    WidenBlock<In>(blk, v);
    if (kRht) Rht16(v, lp.p.q.rht_signs, false);
  }
}

// A lane's block amax as BlockAmax16 gives it over v (LaneBlockValues), and whether an element
// is NaN; from the packed pairs for bf16 x.
template <typename In>
FP4Q_D float LaneBlockAmax(const float* v, const uint32_t* pairs, bool* any_nan) {
  if constexpr (sizeof(In) == 2) {
    const float m = Bf16BlockAbsMax<true>(pairs);
    *any_nan = isnan(m);
    return *any_nan ? BlockAmax16(v) : m;
  } else {
    return BlockAmax16Flagged(v, any_nan);
  }
}

// Codes 0x7 without a sign for the NaN elements of a block (Codes8's fix-up, once a block).
FP4Q_D void ClearNanSigns(const float* v, uint32_t* w0, uint32_t* w1) {
#pragma unroll
  for (int e = 0; e < 16; ++e) {
    if (isnan(v[e])) *(e < 8 ? w0 : w1) &= ~(8u << (4 * (e & 7)));
  }
}

// The element multiplier InvScale(E4M3Value(sf), s_dec) of every scale byte a non-negative
// block amax can round to (E4M3Rn gives 0..0x7E, 0x7F for NaN), built by a CTA's first 128
// threads: a block then looks its multiplier up instead of decoding its scale and rounding a
// reciprocal (about 18 instructions a block with the range check of __frcp_rn).
constexpr int kScaleBytes = 128;

FP4Q_D void BuildInvScaleTable(const UnitCtx& ctx, float* table) {
  if (threadIdx.x < kScaleBytes) table[threadIdx.x] = InvScale(E4M3Value(threadIdx.x), ctx.g.s_dec);
  __syncthreads();
}

// Max of |element| over lane block `blk` (after the RHT if any), as BlockAmax16 gives it.
template <typename In, bool kRht>
FP4Q_D float LaneAbsMax(const LaneParams& lp, const Block16<In>& blk) {
  float v[16];
  uint32_t pairs[8];
  LaneBlockValues<In, kRht>(lp, blk, v, pairs);
  if constexpr (sizeof(In) == 2) return Bf16BlockAbsMax<false>(pairs);
  return BlockAmax16(v);
}

// The codes (two words: elements 0-7, 8-15) and scale byte of lane block b, whose 16 elements
// are in `blk` (SR draws Philox groups 2b and 2b + 1). NVFP4 1x16: the multiplier from
// inv_of_sf (BuildInvScaleTable). kMx: lanes 2m and 2m + 1 hold the halves of one 32-element
// MXFP4 block, whose amax is one shuffle; thread_max takes the max of |v| (the global amax
// MXFP4 records).
template <typename In, bool kMx, bool kSr, bool kRht>
FP4Q_D uint32_t LaneBlockCodes(const LaneParams& lp, const UnitCtx& ctx, const float* inv_of_sf,
                               const Block16<In>& blk, uint32_t b, uint32_t* w0, uint32_t* w1,
                               float* thread_max) {
  const RowParams& p = lp.p;
  float v[16];
  uint32_t pairs[8];
  LaneBlockValues<In, kRht>(lp, blk, v, pairs);
  bool any_nan;
  float bamax = LaneBlockAmax<In>(v, pairs, &any_nan);
  uint32_t sf;
  float mul;
  if constexpr (kMx) {
    *thread_max = fmaxf(*thread_max, bamax);
    bamax = fmaxf(bamax, __shfl_xor_sync(lanes::kFull, bamax, 1));
    sf = MxScaleByte(bamax, ctx.mx_rule);
    mul = E8M0Inverse(sf);
  } else {
    sf = E4M3Rn(__fmul_rn(bamax, ctx.g.t));
    mul = inv_of_sf[sf & (kScaleBytes - 1)];
  }
  const HeadedKeys keys{p.q.sr_keys, lp.sr_head};
  uint32_t lo = Codes8<kSr>(v, mul, ctx, keys, uint64_t{b} * 2, false);
  uint32_t hi = Codes8<kSr>(v + 8, mul, ctx, keys, uint64_t{b} * 2 + 1, false);
  if (any_nan) ClearNanSigns(v, &lo, &hi);
  *w0 = lo;
  *w1 = hi;
  return sf;
}

// The lane kernels' parameters for a row pass.
inline LaneParams LaneParamsOf(const RowParams& p) {
  LaneParams lp;
  lp.p = p;
  lp.n_gran = static_cast<uint64_t>(p.rows) * static_cast<uint64_t>(p.cols) / 8;
  lp.n_blocks = static_cast<uint32_t>(lp.n_gran / 2);
  lp.scale_cols = static_cast<uint32_t>(p.cols / (p.q.fmt == kFmtMx ? 32 : 16));
  lp.row_magic = ~uint64_t{0} / lp.scale_cols + 1;
  for (int k = 0; k < 8; ++k) {
    const uint32_t signs = p.q.rht_signs >> (2 * k);
    lp.rht_sign_words[k] = ((signs & 1u) << 15) | ((signs & 2u) << 30);
  }
  lp.sr_head = PhiloxHeadOf(p.q.sr_keys, p.q.step);
  return lp;
}

}  // namespace fp4q::kernels::cuda

#endif  // FP4Q_KERNELS_SRC_CUDA_QUANTIZE_LANE_BLOCK_CUH_
