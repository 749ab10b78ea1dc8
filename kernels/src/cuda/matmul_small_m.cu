// C = A * B^T for small M (decode shapes, M <= 16) from NVFP4/MXFP4 operands, reading B's
// 4-bit codes once and dequantizing them in registers: 4.5 bits per weight cross the memory bus
// instead of 16.
//
// Budget (M = 1..16, N = K = 8192): B is 32 MiB of codes + 2 MiB of scales, about 8.5 us at
// 4.2 TB/s. The products go through bf16 tensor-core MMAs (m16n8k16, f32 accumulation) with the
// operands swapped: B's weight rows are the MMA's 16 rows and A's (at most 16) rows one or two n8
// tiles that share the decoded weights, so a lane decodes 8 weights per MMA (small_m_layout.h:
// the k order, the decode and its op count, about 2 ops per weight on two pipes).
//
// Exactness: a decoded pair holds e2m1 * 2^-126 (bf16, subnormal for 0.5); one bf16 multiply by
// sf * 2^64 (NVFP4) gives e2m1 * sf * 2^-62, in [2^-72, 2^-50.6]: normal and exact (at most 6
// significant bits). A is prepared as e2m1 * sf * 2^62, in [2^52, 2^73.4]; so every MMA product
// is the exact e2m1 * sf * e2m1 * sf. MXFP4: e2m1 * 2^(b-127) on both sides (exact while it
// stays in bf16's range; see cuda_matmul.cc), the weights through e2m1 first (times 2^126).
//
// Work split: a CTA = 8 warps x 16 weight rows (128 rows of C^T) and one K slice of `chunks`
// 128-k chunks; the grid is (ceil(N / 128), splits), sized to about one wave of 3 CTAs per SM
// (N = K = 8192: 64 x 6 CTAs of 11 chunks). Each lane keeps two chunks of B loads in flight
// (2 x 2 x 16 bytes) while it decodes a third: 768 threads x 64 bytes = 48 KB per SM. Issue
// budget (ptxas 13.0 SASS, sm_90a): about 240 instructions per lane and chunk (64 weights), of
// which 144 are the decode and its bf16 multiplies, 16 the MMAs and fragment loads.
//
// One launch: each CTA issues its first B loads, then decodes its own A slice from A's codes
// into shared memory in fragment order (DecodeActSlice; rows padded by 32 bytes: the 8-byte
// fragment loads are conflict-free). At M = 16 that is about 6% more instructions than copying
// a slice prepared by another kernel, but no prepare kernel runs before it (a kernel boundary
// and a launch of latency: 2.4-3.6 us of 27.6 at M = 1 on an H100,
// bench/results/h200-gemm/small-m/). With splits > 1 every CTA writes f32 partial sums; the
// last CTA of each row group (an integer ticket) adds the slices in slice order, so the result
// does not depend on timing. The tickets are the caller's (one array per stream), zero before
// the launch and zero after it: the last CTA of a row group puts its ticket back.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "device_numerics.cuh"
#include "launch.h"
#include "matmul_direct.cuh"
#include "small_m_layout.h"

namespace fp4q::kernels::cuda {
namespace direct_gemm {
namespace {

// Scale value of block (r, kb) of an operand.
FP4Q_D float OperandScale(const GemmOperand& o, bool mx, int64_t r, int64_t kb) {
  const int64_t sc = mx ? (o.cols >> 5) : (o.cols >> 4);
  const uint32_t b = o.scales[ScaleOffset(r, kb, sc, o.swizzled)];
  return mx ? E8M0Value(b) : E4M3Value(b);
}

// A's value (m, k) as prepared bf16 bits: e2m1 * sf (times 2^62 for NVFP4); 0 past M or K.
FP4Q_D uint32_t ActBits(const SmallMParams& p, int64_t m, int64_t k) {
  const int64_t K = p.a.cols;
  float v = 0.0f;
  if (k < K && m < p.a.rows) {
    const uint32_t code = (p.a.codes[(m * K + k) >> 1] >> ((k & 1) * 4)) & 0xFu;
    v = __fmul_rn(E2M1Value(code), OperandScale(p.a, p.mx, m, p.mx ? (k >> 5) : (k >> 4)));
    if (!p.mx) v = __fmul_rn(v, 0x1p62f);
  }
  const __nv_bfloat16 b = __float2bfloat16_rn(v);
  return *reinterpret_cast<const uint16_t*>(&b);
}

// One thread per 4-value fragment of LaunchPrepareGemmAct's workspace.
__global__ void __launch_bounds__(256)
    PrepareActKernel(const SmallMParams p, int64_t chunks, int64_t m_rows, uint2* act,
                     int* tickets, int64_t n_tickets) {
  GridDependentsLaunch();
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * 256 + threadIdx.x;
  if (idx < n_tickets) tickets[idx] = 0;
  const int64_t per_row = chunks * 32;
  if (idx >= m_rows * per_row) return;
  const int64_t m = idx / per_row;
  const int64_t rem = idx - m * per_row;
  const int64_t c = rem >> 5;
  const int i = static_cast<int>(rem >> 2) & 7;
  const int t = static_cast<int>(rem) & 3;
  uint32_t h[4];
#pragma unroll
  for (int s = 0; s < 4; ++s) h[s] = ActBits(p, m, c * kChunk + small_m::ActSlotK(i, t, s));
  act[idx] = make_uint2(h[0] | (h[1] << 16), h[2] | (h[3] << 16));
}

// The scale of A's block kb for token m as a bf16x2 splat: sf * 2^62 (NVFP4) or 2^(b - 127)
// (MX). A decoded pair (e2m1 * 2^-126) times 2^126 and then this is e2m1 * sf (* 2^62) exactly,
// the value ActBits rounds to (at most 6 significant bits, within bf16's range).
template <bool kMx>
FP4Q_D uint32_t ActScaleSplat(const SmallMParams& p, int64_t m, int64_t kb) {
  const float sv = OperandScale(p.a, kMx, m, kb);
  const __nv_bfloat16 sb = __float2bfloat16_rn(kMx ? sv : __fmul_rn(sv, 0x1p62f));
  const uint32_t h = *reinterpret_cast<const uint16_t*>(&sb);
  return h | (h << 16);
}

// One thread per 32-bit word of A's codes (8 consecutive k of one token) of
// LaunchPrepareGemmActCore's workspace: [tile][chunk][i][group][half][row][8 bf16], token
// m = tile * tile_rows + 8 group + row (small_m::CoreWordAt). Word (t, u) of a chunk holds
// k = 32 t + 8 u .. + 7; DecodeWord's pair j of it is columns 2t, 2t + 1 of step 2u + j / 2,
// half j % 2 (small_m::CorePairStep, CorePairHalf). A warp's store of pair j fills 8 consecutive
// 16-byte core-matrix rows (128 bytes). One code load and one scale a thread for 8 values.
template <bool kMx>
__global__ void __launch_bounds__(256)
    PrepareActCoreKernel(const SmallMParams p, int64_t chunks, int tile_rows, int64_t m_rows,
                         uint4* act, int* tickets, int64_t n_tickets,
                         const small_m::SignShifts sh) {
  GridDependentsLaunch();
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * 256 + threadIdx.x;
  if (idx < n_tickets) tickets[idx] = 0;
  if (idx >= m_rows * chunks * 16) return;
  const small_m::CoreWord cw = small_m::CoreWordAt(idx, tile_rows);
  const int64_t tile = cw.tc / chunks;
  const int64_t m = tile * tile_rows + 8 * cw.group + cw.row;
  const int64_t K = p.a.cols;
  // K % 16 == 0: a word is all in or all out.
  const int64_t k0 = (cw.tc - tile * chunks) * kChunk + 32 * cw.t + 8 * cw.u;
  uint32_t pair[4] = {0u, 0u, 0u, 0u};
  if (m < p.a.rows && k0 < K) {
    const uint32_t w = __ldg(reinterpret_cast<const uint32_t*>(p.a.codes) + ((m * K + k0) >> 3));
    const uint32_t mult = ActScaleSplat<kMx>(p, m, kMx ? (k0 >> 5) : (k0 >> 4));
    small_m::DecodeWord(w, pair, sh);
#pragma unroll
    for (int j = 0; j < 4; ++j) pair[j] = MulBf16x2(MulBf16x2(pair[j], 0x7E807E80u), mult);
  }
  uint8_t* base =
      reinterpret_cast<uint8_t*>(act) + cw.tc * (static_cast<int64_t>(tile_rows) * 256);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int at = small_m::CoreRowByte(small_m::CorePairStep(cw.u, j), cw.group,
                                        small_m::CorePairHalf(j), cw.row, tile_rows) + 4 * cw.t;
    *reinterpret_cast<uint32_t*>(base + at) = pair[j];
  }
}

// The small-M kernel's A slice, straight from A's codes into the CTA's shared memory, in
// PrepareActKernel's order and with its values. One 32-bit word of A's codes is 8 consecutive
// k of one block, k = 128 c + 32 t + 8 u: DecodeWord's pairs 0, 1 are lane t's fragment of
// MMA 2u and pairs 2, 3 that of MMA 2u + 1 (small_m_layout.h). The pairs
// hold e2m1 * 2^-126; times 2^126 and then the scale as bf16 (NVFP4: sf * 2^62) they are
// e2m1 * sf (* 2^62) exactly, as ActBits rounds them (at most 6 significant bits, within bf16's
// range). Words past K are zero; rows past M are the caller's.
template <bool kMx>
FP4Q_D void DecodeActSlice(const SmallMParams& p, int64_t c0, int nch, int row_u2, uint2* dst,
                           int tid, int nthreads) {
  const int64_t M = p.a.rows;
  const int64_t K = p.a.cols;
  // A thread takes 32 k of a row (lane t's four words of a chunk): one index computation and
  // one or two scales for four words.
  const int per_row = nch * 4;
  const int units = static_cast<int>(M) * per_row;
  for (int q = tid; q < units; q += nthreads) {
    const int m = q / per_row;
    const int r = q - m * per_row;
    const int c = r >> 2;
    const int t = r & 3;
    const int64_t k0 = (c0 + c) * kChunk + 32 * t;
    auto mult_of = [&](int64_t kb) { return ActScaleSplat<kMx>(p, m, kb); };
    uint32_t mult[2] = {0u, 0u};
    if (k0 < K) {
      mult[0] = mult_of(kMx ? (k0 >> 5) : (k0 >> 4));
      mult[1] = kMx ? mult[0] : (k0 + 16 < K ? mult_of((k0 >> 4) + 1) : 0u);
    }
    const uint32_t* codes = reinterpret_cast<const uint32_t*>(p.a.codes + ((m * K + k0) >> 1));
    uint2* row = dst + m * row_u2 + c * 32;
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      uint32_t pair[4] = {0u, 0u, 0u, 0u};
      if (k0 + 8 * u < K) {
        small_m::DecodeWord(__ldg(codes + u), pair);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          pair[j] = MulBf16x2(MulBf16x2(pair[j], 0x7E807E80u), mult[u >> 1]);
        }
      }
      row[(2 * u) * 4 + t] = make_uint2(pair[0], pair[1]);
      row[(2 * u + 1) * 4 + t] = make_uint2(pair[2], pair[3]);
    }
  }
}

}  // namespace

cudaError_t LaunchPrepareGemmActCore(const SmallMParams& p, int64_t total, int tile_rows,
                                     int64_t m_rows, uint4* act, int* tickets, int64_t n_tickets,
                                     cudaStream_t s) {
  const int64_t words = m_rows * total * 16;  // a thread each
  const int64_t threads = words > n_tickets ? words : n_tickets;
  if ((threads + 255) / 256 > 0x7FFFFFFF || tile_rows < 8 || tile_rows % 8 != 0 ||
      m_rows % tile_rows != 0) {
    return cudaErrorInvalidConfiguration;
  }
  const unsigned blocks = static_cast<unsigned>((threads + 255) / 256);
  if (p.mx) {
    PrepareActCoreKernel<true><<<blocks, 256, 0, s>>>(p, total, tile_rows, m_rows, act, tickets,
                                                      n_tickets, small_m::SignShifts());
  } else {
    PrepareActCoreKernel<false><<<blocks, 256, 0, s>>>(p, total, tile_rows, m_rows, act, tickets,
                                                       n_tickets, small_m::SignShifts());
  }
  return cudaGetLastError();
}

cudaError_t LaunchPrepareGemmAct(const SmallMParams& p, int64_t total, int64_t m_rows, uint2* act,
                                 int* tickets, int64_t n_tickets, cudaStream_t s) {
  const int64_t frags = m_rows * total * 32;
  const int64_t threads = frags > n_tickets ? frags : n_tickets;
  if ((threads + 255) / 256 > 0x7FFFFFFF) return cudaErrorInvalidConfiguration;
  PrepareActKernel<<<static_cast<unsigned>((threads + 255) / 256), 256, 0, s>>>(
      p, total, m_rows, act, tickets, n_tickets);
  return cudaGetLastError();
}

}  // namespace direct_gemm

namespace {

using direct_gemm::kChunk;
using direct_gemm::LoadRow;
using direct_gemm::Mma16816;
using direct_gemm::MulBf16x2;
using direct_gemm::ScaleSplats;
using small_m::DecodeWord;

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kRowsPerCta = kWarps * 16;
// CTAs per SM the launch bounds ask for: up to 85 registers. At 4 (64 registers) ptxas
// recomputes addresses in the loop (1 n8 tile) or spills (2).
constexpr int kCtasPerSm = 3;
constexpr int kPad = 16;              // bf16 of padding per shared row (32 bytes)
// Chunks of B loads a lane has in flight (3 was slower: bench/results/h200-gemm/small-m/).
constexpr int kStages = 2;
constexpr int kSmemBudget = 48 * 1024;

// One lane's B data for one chunk: 32 codes and their scale byte(s) per row.
struct Chunk {
  uint4 wa, wb;   // rows g, g + 8
  uint32_t xa, xb;
};

// grid = (ceil(N / 128), splits); dynamic shared memory: 8 kTiles rows x (chunks * 128 + kPad)
// bf16. kK32: K % 32 == 0. kTiles: n8 tiles of A rows (1: M <= 8, 2: M <= 16).
template <bool kMx, bool kK32, int kTiles>
__global__ void __launch_bounds__(kThreads, kCtasPerSm)
    SmallMKernel(const SmallMParams p, int chunks, int64_t total_chunks, float* partial,
                 int* tickets, const small_m::SignShifts sh) {
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ int last_cta;
  const int stride = chunks * kChunk + kPad;  // bf16 per shared row
  const int64_t N = p.b.rows;
  const int64_t K = p.b.cols;
  const int64_t M = p.a.rows;
  const int64_t c0 = static_cast<int64_t>(blockIdx.y) * chunks;
  const int nch = static_cast<int>(total_chunks - c0 < chunks ? total_chunks - c0 : chunks);

  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kRowsPerCta + warp * 16;
  const bool va = n0 + g < N;
  const bool vb = n0 + g + 8 < N;
  const int64_t kl = c0 * kChunk + 32 * t;  // this lane's first k
  const int64_t sc = kMx ? (K >> 5) : (K >> 4);
  const int64_t kb = kMx ? (kl >> 5) : (kl >> 4);
  // Row g's addresses (computed even past N, then never dereferenced); row g + 8 is a fixed
  // distance away: 8 rows of codes, 8 plain scale rows, or 8 x 16 bytes in the swizzled layout
  // (rows g and g + 8 of a 16-aligned tile share their 32-row group).
  const int64_t ra = n0 + g;
  const uint8_t* code_a = p.b.codes + ((ra * K + kl) >> 1);
  const uint8_t* scale_a = p.b.scales + ScaleOffset(ra, kb, sc, p.b.swizzled);
  const int64_t code_b_off = 4 * K;
  const int64_t scale_b_off = p.b.swizzled ? 128 : 8 * sc;
  // Per chunk the block index grows by 8 (NVFP4) or 4 (MX), within the same 4-block group.
  const int sstep = p.b.swizzled ? (kMx ? 512 : 1024) : (kMx ? 4 : 8);

  // Chunks of this CTA's slice that hold k < K for this lane.
  const int lane_chunks = kl >= K ? 0
                          : static_cast<int>((K - kl + kChunk - 1) / kChunk < nch
                                                 ? (K - kl + kChunk - 1) / kChunk
                                                 : nch);
  // The loader walks the lane's chunks in order with running pointers (cheaper to keep live
  // than to recompute from the chunk index).
  const uint8_t* ld_ca = code_a;
  const uint8_t* ld_cb = code_a + code_b_off;
  const uint8_t* ld_sa = scale_a;
  const uint8_t* ld_sb = scale_a + scale_b_off;
  int64_t ld_k = kl;
  int ld_left_a = va ? lane_chunks : 0;  // chunks left to load for row g / row g + 8
  int ld_left_b = vb ? lane_chunks : 0;
  auto load_next = [&](Chunk& d) {
    d.wa = d.wb = make_uint4(0u, 0u, 0u, 0u);
    d.xa = d.xb = 0u;
    if (ld_left_a > 0) LoadRow<kMx, kK32>(ld_ca, ld_sa, ld_k, K, d.wa, d.xa);
    if (ld_left_b > 0) LoadRow<kMx, kK32>(ld_cb, ld_sb, ld_k, K, d.wb, d.xb);
    --ld_left_a;
    --ld_left_b;
    ld_ca += 64;
    ld_cb += 64;
    ld_sa += sstep;
    ld_sb += sstep;
    ld_k += kChunk;
  };

  // ---- the first chunks of B loads, then A's slice.
  Chunk buf[kStages];
#pragma unroll
  for (int q = 0; q < kStages; ++q) load_next(buf[q]);
  direct_gemm::DecodeActSlice<kMx>(p, c0, nch, stride / 4, reinterpret_cast<uint2*>(smem),
                                   threadIdx.x, kThreads);
  // Rows M .. 8 kTiles - 1 feed MMA columns whose results are dropped; zero them anyway.
  const int zero_pieces = (8 * kTiles - static_cast<int>(M)) * (stride / 8);
  for (int q = threadIdx.x; q < zero_pieces; q += kThreads) {
    reinterpret_cast<uint4*>(smem)[static_cast<int>(M) * (stride / 8) + q] =
        make_uint4(0u, 0u, 0u, 0u);
  }
  __syncthreads();

  float acc[kTiles][4];
#pragma unroll
  for (int tl = 0; tl < kTiles; ++tl) acc[tl][0] = acc[tl][1] = acc[tl][2] = acc[tl][3] = 0.0f;

  const __nv_bfloat16* act_s = reinterpret_cast<const __nv_bfloat16*>(smem) + g * stride + t * 4;
  auto compute = [&](const Chunk& d, const __nv_bfloat16* act_c) {
    uint32_t sa[2], sb[2];
    // NaN scale bytes (0x7F, 0xFF) of either row, tested once (the quantizers never write them).
    const bool nan = !kMx && small_m::E4m3PairHasNan(d.xa | (d.xb << 16));
    ScaleSplats<kMx>(d.xa, nan, sa);
    ScaleSplats<kMx>(d.xb, nan, sb);
    const uint32_t wa[4] = {d.wa.x, d.wa.y, d.wa.z, d.wa.w};
    const uint32_t wb[4] = {d.wb.x, d.wb.y, d.wb.z, d.wb.w};
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      uint32_t pa[4], pb[4];
      DecodeWord(wa[u], pa, sh);
      DecodeWord(wb[u], pb, sh);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if (kMx) {
          pa[j] = MulBf16x2(pa[j], 0x7E807E80u);  // * 2^126: e2m1
          pb[j] = MulBf16x2(pb[j], 0x7E807E80u);
        }
        pa[j] = MulBf16x2(pa[j], sa[u >> 1]);
        pb[j] = MulBf16x2(pb[j], sb[u >> 1]);
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int i = 2 * u + h;
        const uint32_t a[4] = {pa[2 * h], pb[2 * h], pa[2 * h + 1], pb[2 * h + 1]};
#pragma unroll
        for (int tl = 0; tl < kTiles; ++tl) {
          const uint2 b = *reinterpret_cast<const uint2*>(act_c + tl * 8 * stride + i * 16);
          Mma16816(acc[tl], a, b.x, b.y);
        }
      }
    }
  };

  if (n0 < N) {  // warp-uniform
    const __nv_bfloat16* act_c = act_s;
    for (int c = 0; c < nch; c += kStages) {
#pragma unroll
      for (int q = 0; q < kStages; ++q) {
        if (q == 0 || c + q < nch) {
          const Chunk cur = buf[q];
          load_next(buf[q]);
          compute(cur, act_c);
          act_c += kChunk;
        }
      }
    }
  }

  // ---- results: acc[tl][2h + q] is C[m = 8 tl + 2t + q][n = n0 + g + 8h].
  const float alpha = direct_gemm::OutputAlpha(p);
  const bool split = gridDim.y > 1;
#pragma unroll
  for (int tl = 0; tl < kTiles; ++tl) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int64_t m = 8 * tl + 2 * t + (e & 1);
      const int64_t n = n0 + g + 8 * (e >> 1);
      if (m >= M || n >= N) continue;
      if (split) {
        partial[(static_cast<int64_t>(blockIdx.y) * M + m) * N + n] = acc[tl][e];
      } else {
        direct_gemm::StoreC(p, alpha, m, n, acc[tl][e]);
      }
    }
  }
  if (!split) return;
  direct_gemm::SumSlicesInOrder<kRowsPerCta, kThreads>(
      p, partial, &tickets[blockIdx.x], gridDim.y, 0, static_cast<int>(M),
      static_cast<int64_t>(blockIdx.x) * kRowsPerCta, &last_cta, /*reset_ticket=*/true);
}

struct Plan {
  int tiles;          // n8 tiles of A rows
  int chunks;         // 128-k chunks per CTA
  int splits;         // K slices
  int64_t total;      // 128-k chunks of K
  int64_t groups;     // row groups of 128
};

Plan MakePlan(int64_t m, int64_t n, int64_t k) {
  Plan pl;
  pl.tiles = m > 8 ? 2 : 1;
  pl.total = (k + kChunk - 1) / kChunk;
  pl.groups = (n + kRowsPerCta - 1) / kRowsPerCta;
  const int64_t max_chunks = (kSmemBudget / (16 * pl.tiles) - kPad) / kChunk;  // 23 or 11
  direct_gemm::SplitK(pl.groups, pl.total, static_cast<int64_t>(SmCount()) * kCtasPerSm,
                      max_chunks, &pl.chunks, &pl.splits);
  return pl;
}

template <bool kMx, bool kK32, int kTiles>
cudaError_t LaunchMain(const SmallMParams& p, const Plan& pl, float* partial, int* tickets,
                       cudaStream_t s) {
  // At most 48 KB of shared memory (kSmemBudget): no opt-in. The sign shifts as kernel
  // arguments: ptxas cannot fold them (small_m_layout.h).
  SmallMKernel<kMx, kK32, kTiles>
      <<<dim3(static_cast<unsigned>(pl.groups), static_cast<unsigned>(pl.splits)), kThreads,
         static_cast<size_t>(8 * kTiles) * (pl.chunks * kChunk + kPad) * 2, s>>>(
          p, pl.chunks, pl.total, partial, tickets, small_m::SignShifts());
  return cudaGetLastError();
}

}  // namespace

// The workspace: the f32 partial sums of the K slices, [splits][M][N]; a ticket a row group.
size_t SmallMWorkspaceBytes(int64_t m, int64_t n, int64_t k) {
  const Plan pl = MakePlan(m, n, k);
  return pl.splits <= 1 ? 0 : static_cast<size_t>(pl.splits) * m * n * sizeof(float);
}

int64_t SmallMTickets(int64_t m, int64_t n, int64_t k) {
  const Plan pl = MakePlan(m, n, k);
  return pl.splits <= 1 ? 0 : pl.groups;
}

cudaError_t LaunchSmallMMatmul(const SmallMParams& p, cudaStream_t s) {
  const int64_t m = p.a.rows;
  if (m < 1 || m > kSmallMMax || (p.a.cols & 15) != 0 || (p.mx && (p.a.cols & 31) != 0)) {
    return cudaErrorInvalidValue;
  }
  const Plan pl = MakePlan(m, p.b.rows, p.b.cols);
  if (pl.splits > 65535 || pl.groups > 0x7FFFFFFF) return cudaErrorInvalidConfiguration;
  float* partial = static_cast<float*>(p.workspace);
  int* tickets = p.zeroed_tickets;
  if (pl.splits > 1 && (partial == nullptr || tickets == nullptr)) return cudaErrorInvalidValue;
  const bool k32 = (p.b.cols & 31) == 0;
  if (p.mx) {  // K % 32 == 0
    return pl.tiles == 1 ? LaunchMain<true, true, 1>(p, pl, partial, tickets, s)
                         : LaunchMain<true, true, 2>(p, pl, partial, tickets, s);
  }
  if (pl.tiles == 1) {
    return k32 ? LaunchMain<false, true, 1>(p, pl, partial, tickets, s)
               : LaunchMain<false, false, 1>(p, pl, partial, tickets, s);
  }
  return k32 ? LaunchMain<false, true, 2>(p, pl, partial, tickets, s)
             : LaunchMain<false, false, 2>(p, pl, partial, tickets, s);
}

namespace {
__global__ void ModuleAnchorKernel() {}  // names this file's CUDA module (MatmulSmallMModule)
}  // namespace

const void* MatmulSmallMModule() { return reinterpret_cast<const void*>(&ModuleAnchorKernel); }

}  // namespace fp4q::kernels::cuda
