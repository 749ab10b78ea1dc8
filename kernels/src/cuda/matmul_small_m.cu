// C = A * B^T for small M (decode shapes, M <= 16) from NVFP4/MXFP4 operands, reading B's
// 4-bit codes once and dequantizing them in registers: 4.5 bits per weight cross the memory bus
// instead of 16.
//
// Budget (M = 1..16, N = K = 8192): B is 32 MiB of codes + 2 MiB of scales, about 8 us at
// 4.2 TB/s; the products go through bf16 tensor-core MMAs (m16n8k16, f32 accumulation), exact
// for e2m1 x e4m3 values. Work split: a CTA owns 64 columns of C (8 warps x 8) and one slice of
// K (at most 1024); the slices' partial sums go to a workspace and a second kernel adds them in
// slice order (deterministic), times S_dec_a * S_dec_b. A is dequantized once (bf16, NVFP4 values
// times 2^62 so that B's values can carry 2^-62 and both stay normal) into a workspace in the
// lanes' order; each CTA copies its slice of A's M rows into shared memory, and every lane issues
// all its B loads for the slice before the first MMA.
//
// k order: an MMA's logical k positions may be any permutation of actual k as long as A and B
// agree. Lane (g, t) owns 32 consecutive k of B row n0 + g per 128-k chunk (one 16-byte load); for
// MMA i it feeds elements (j, j+4) and (j+1, j+5) of 8-element group i/2, j = 2 (i & 1), which
// one shift-and-mask turns a code word into. A sits in shared memory in the matching order
// ([i][t][s] per chunk), so a lane reads its 4 values with one 8-byte load, without bank
// conflicts (rows padded to 8 words mod 32).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "device_numerics.cuh"
#include "launch.h"

namespace fp4q::kernels::cuda {
namespace {

constexpr int kWarps = 8;              // n-tiles of 8 per CTA
constexpr int kThreads = kWarps * 32;
constexpr int kNPerCta = kWarps * 8;
constexpr int kChunk = 128;            // k per warp step (4 lanes x 32)
constexpr int kMaxChunks = 8;          // k slice of a CTA: at most 1024
constexpr int kPad = 16;               // bf16 elements of padding per shared row

// Scale value of block (r, kb) of an operand.
FP4Q_D float OperandScale(const GemmOperand& o, bool mx, int64_t r, int64_t kb) {
  const int64_t sc = mx ? (o.cols >> 5) : (o.cols >> 4);
  const uint32_t b = o.scales[ScaleOffset(r, kb, sc, o.swizzled)];
  return mx ? E8M0Value(b) : E4M3Value(b);
}

// Two codes (nibbles j and j+4 of w) as bf16x2 with value * 2^-126 (em bits at [8:6], sign 15).
FP4Q_D uint32_t RawPair(uint32_t w, int j) {
  const uint32_t q = w << (12 - 4 * j);
  return (q & 0x80008000u) | ((q & 0x70007000u) >> 6);
}

FP4Q_D uint32_t MulBf16x2(uint32_t a, uint32_t b) {
  __nv_bfloat162 x = *reinterpret_cast<__nv_bfloat162*>(&a);
  const __nv_bfloat162 y = *reinterpret_cast<__nv_bfloat162*>(&b);
  x = __hmul2_rn(x, y);
  return *reinterpret_cast<uint32_t*>(&x);
}

FP4Q_D uint32_t SplatBf16(float f) { return PackBf16x2(f, f); }

FP4Q_D void Mma16816(float* d, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// A -> bf16 workspace [16][Kp] in the lanes' k order within each 128-k chunk ([i][t][s]),
// NVFP4 values times 2^62; rows >= M are never read.
__global__ void __launch_bounds__(256) PrepareAKernel(const SmallMParams p, int64_t kp) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * 256 + threadIdx.x;
  if (idx >= p.a.rows * kp) return;
  const int64_t m = idx / kp;
  const int64_t pos = idx - m * kp;
  const int w = static_cast<int>(pos & 127);
  const int i = w >> 4, t = (w >> 2) & 3, s = w & 3;
  constexpr int kPerm[8] = {0, 4, 1, 5, 2, 6, 3, 7};
  const int64_t k = (pos & ~int64_t{127}) + t * 32 + 8 * (i >> 1) + kPerm[4 * (i & 1) + s];
  const int64_t K = p.a.cols;
  float v = 0.0f;
  if (k < K) {
    const uint32_t code = (p.a.codes[(m * K + k) >> 1] >> ((k & 1) * 4)) & 0xFu;
    v = __fmul_rn(E2M1Value(code), OperandScale(p.a, p.mx, m, p.mx ? (k >> 5) : (k >> 4)));
    if (!p.mx) v = __fmul_rn(v, 0x1p62f);
  }
  reinterpret_cast<__nv_bfloat16*>(p.workspace)[idx] = __float2bfloat16_rn(v);
}

// grid = (ceil(N / 64), splits); dynamic shared memory: 16 rows x (chunks * 128 + kPad) bf16.
__global__ void __launch_bounds__(kThreads) SmallMKernel(const SmallMParams p, int chunks,
                                                         int64_t kp, float* partial) {
  extern __shared__ __align__(16) __nv_bfloat16 a_s[];
  const int stride = chunks * kChunk + kPad;
  const int64_t K = p.b.cols;
  const int64_t k0 = static_cast<int64_t>(blockIdx.y) * chunks * kChunk;
  const int64_t m_rows = p.a.rows;

  // ---- this K slice of A's prepared rows -> shared memory (16-byte copies).
  {
    const int per_row = chunks * kChunk / 8;  // uint4 per row
    const uint4* src = reinterpret_cast<const uint4*>(p.workspace);
    for (int idx = threadIdx.x; idx < m_rows * per_row; idx += kThreads) {
      const int m = idx / per_row;
      const int q = idx - m * per_row;
      const int64_t from = (m * kp + k0) / 8 + q;
      *reinterpret_cast<uint4*>(a_s + m * stride + q * 8) =
          k0 + q * 8 < kp ? src[from] : make_uint4(0u, 0u, 0u, 0u);
    }
  }
  __syncthreads();

  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kNPerCta + warp * 8;
  if (n0 >= p.b.rows) return;  // warp-uniform; no barrier follows
  const int64_t n = n0 + g;
  const bool n_ok = n < p.b.rows;
  const bool k32 = (K & 31) == 0;

  // ---- all of this lane's B loads for the slice first.
  uint32_t w[kMaxChunks][4];
  float sf[kMaxChunks][2];
#pragma unroll
  for (int c = 0; c < kMaxChunks; ++c) {
    const int64_t kk = k0 + c * kChunk + t * 32;
    w[c][0] = w[c][1] = w[c][2] = w[c][3] = 0u;
    sf[c][0] = sf[c][1] = 0.0f;
    if (c < chunks && n_ok && kk < K) {
      const uint8_t* src = p.b.codes + ((n * K + kk) >> 1);
      if (k32) {
        const uint4 q = *reinterpret_cast<const uint4*>(src);
        w[c][0] = q.x; w[c][1] = q.y; w[c][2] = q.z; w[c][3] = q.w;
      } else {
        const uint2 q = *reinterpret_cast<const uint2*>(src);
        w[c][0] = q.x; w[c][1] = q.y;
        if (kk + 16 < K) {
          const uint2 r = *reinterpret_cast<const uint2*>(src + 8);
          w[c][2] = r.x; w[c][3] = r.y;
        }
      }
      if (p.mx) {
        sf[c][0] = sf[c][1] = OperandScale(p.b, true, n, kk >> 5);
      } else {
        sf[c][0] = OperandScale(p.b, false, n, kk >> 4);
        sf[c][1] = kk + 16 < K ? OperandScale(p.b, false, n, (kk >> 4) + 1) : 0.0f;
      }
    }
  }

  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  const uint32_t c126 = SplatBf16(0x1p126f);
  const __nv_bfloat16* row_lo = a_s + g * stride + t * 4;
  const __nv_bfloat16* row_hi = row_lo + 8 * stride;
#pragma unroll
  for (int c = 0; c < kMaxChunks; ++c) {
    if (c >= chunks) break;
    uint32_t s2[2];
    if (p.mx) {
      s2[0] = s2[1] = SplatBf16(sf[c][0]);
    } else {
      s2[0] = SplatBf16(__fmul_rn(sf[c][0], 0x1p64f));
      s2[1] = SplatBf16(__fmul_rn(sf[c][1], 0x1p64f));
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const uint32_t word = w[c][i >> 1];
      const int j = 2 * (i & 1);
      uint32_t b0 = RawPair(word, j);
      uint32_t b1 = RawPair(word, j + 1);
      if (p.mx) {
        b0 = MulBf16x2(b0, c126);
        b1 = MulBf16x2(b1, c126);
      }
      b0 = MulBf16x2(b0, s2[i >> 2]);
      b1 = MulBf16x2(b1, s2[i >> 2]);
      const int off = c * kChunk + i * 16;
      uint2 la = make_uint2(0u, 0u), lb = make_uint2(0u, 0u);
      if (g < m_rows) la = *reinterpret_cast<const uint2*>(row_lo + off);
      if (g + 8 < m_rows) lb = *reinterpret_cast<const uint2*>(row_hi + off);
      const uint32_t a[4] = {la.x, lb.x, la.y, lb.y};
      Mma16816(acc, a, b0, b1);
    }
  }

  // ---- results: rows g and g + 8, columns n0 + 2t, +1.
  const float alpha =
      p.mx ? 1.0f : __fmul_rn(__frcp_rn(p.a.global[1]), __frcp_rn(p.b.global[1]));
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t m = g + 8 * h;
    if (m >= m_rows) continue;
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      const int64_t col = n0 + 2 * t + q;
      if (col >= p.b.rows) continue;
      const float sum = acc[2 * h + q];
      if (partial != nullptr) {
        partial[(static_cast<int64_t>(blockIdx.y) * m_rows + m) * p.b.rows + col] = sum;
      } else if (p.c_dtype == kF32) {
        static_cast<float*>(p.c)[m * p.b.rows + col] = __fmul_rn(sum, alpha);
      } else {
        static_cast<__nv_bfloat16*>(p.c)[m * p.b.rows + col] =
            __float2bfloat16_rn(__fmul_rn(sum, alpha));
      }
    }
  }
}

// C = alpha * sum over slices (in slice order) of the partial sums.
__global__ void __launch_bounds__(256) ReduceSlicesKernel(const SmallMParams p, int splits,
                                                          const float* partial) {
  const int64_t mn = p.a.rows * p.b.rows;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * 256 + threadIdx.x;
  if (i >= mn) return;
  float sum = 0.0f;
  for (int s = 0; s < splits; ++s) sum = __fadd_rn(sum, partial[s * mn + i]);
  const float alpha =
      p.mx ? 1.0f : __fmul_rn(__frcp_rn(p.a.global[1]), __frcp_rn(p.b.global[1]));
  const float v = __fmul_rn(sum, alpha);
  if (p.c_dtype == kF32) {
    static_cast<float*>(p.c)[i] = v;
  } else {
    static_cast<__nv_bfloat16*>(p.c)[i] = __float2bfloat16_rn(v);
  }
}

struct Plan {
  int chunks;  // 128-k chunks per slice
  int splits;  // slices of K
};

Plan MakePlan(int64_t n, int64_t k) {
  const int64_t total_chunks = (k + kChunk - 1) / kChunk;
  const int64_t ctas_n = (n + kNPerCta - 1) / kNPerCta;
  // Aim for about 8 CTAs per multiprocessor, with slices of at most kMaxChunks chunks.
  int64_t splits = (8 * static_cast<int64_t>(SmCount()) + ctas_n - 1) / ctas_n;
  splits = splits < 1 ? 1 : (splits > total_chunks ? total_chunks : splits);
  int64_t chunks = (total_chunks + splits - 1) / splits;
  if (chunks > kMaxChunks) chunks = kMaxChunks;
  splits = (total_chunks + chunks - 1) / chunks;
  return Plan{static_cast<int>(chunks), static_cast<int>(splits)};
}

int64_t PaddedK(int64_t k) { return (k + kChunk - 1) / kChunk * kChunk; }

size_t PartialOffset(int64_t m, int64_t k) {
  return static_cast<size_t>((m * PaddedK(k) * 2 + 255) / 256 * 256);
}

}  // namespace

size_t SmallMWorkspaceBytes(int64_t m, int64_t n, int64_t k) {
  const Plan plan = MakePlan(n, k);
  return PartialOffset(m, k) +
         (plan.splits > 1 ? static_cast<size_t>(plan.splits) * m * n * sizeof(float) : 0);
}

cudaError_t LaunchSmallMMatmul(const SmallMParams& p, cudaStream_t s) {
  if (p.a.rows < 1 || p.a.rows > kSmallMMax || p.workspace == nullptr) {
    return cudaErrorInvalidValue;
  }
  const Plan plan = MakePlan(p.b.rows, p.b.cols);
  if (plan.splits > 65535) return cudaErrorInvalidConfiguration;
  const int64_t kp = PaddedK(p.a.cols);
  PrepareAKernel<<<static_cast<unsigned>((p.a.rows * kp + 255) / 256), 256, 0, s>>>(p, kp);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  float* partial =
      plan.splits > 1
          ? reinterpret_cast<float*>(static_cast<char*>(p.workspace) + PartialOffset(p.a.rows, p.a.cols))
          : nullptr;
  const dim3 grid(static_cast<unsigned>((p.b.rows + kNPerCta - 1) / kNPerCta),
                  static_cast<unsigned>(plan.splits));
  const size_t smem = 16 * (plan.chunks * kChunk + kPad) * sizeof(__nv_bfloat16);
  SmallMKernel<<<grid, kThreads, smem, s>>>(p, plan.chunks, kp, partial);
  e = cudaGetLastError();
  if (e != cudaSuccess || partial == nullptr) return e;
  const int64_t mn = p.a.rows * p.b.rows;
  ReduceSlicesKernel<<<static_cast<unsigned>((mn + 255) / 256), 256, 0, s>>>(p, plan.splits,
                                                                            partial);
  return cudaGetLastError();
}

}  // namespace fp4q::kernels::cuda
