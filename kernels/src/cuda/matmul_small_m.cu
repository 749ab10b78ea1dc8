// C = A * B^T for small M (decode shapes, M <= 128) from NVFP4/MXFP4 operands, reading B's
// 4-bit codes once and dequantizing them in registers: 4.5 bits per weight cross the memory bus
// instead of 16.
//
// Budget (M = 1..16, N = K = 8192): B is 32 MiB of codes + 4 MiB of scales, ~8.5 us at 4.3 TB/s;
// the products go through bf16 tensor-core MMAs (m16n8k16, f32 accumulation), which are exact
// for e2m1 x e4m3 values. A is dequantized once into a bf16 workspace (scaled by 2^62 so that
// B's values can carry 2^-62: both stay normal in bf16) in the lanes' k order.
//
// k order: an MMA's logical k positions may be any permutation of actual k as long as A and B
// agree. Lane (g, t) owns 32 consecutive k of B row n0 + g (a 16-byte load); for MMA i it feeds
// elements (j, j+4) and (j+1, j+5) of 8-element group i/2, j = 2 (i & 1), which is what one
// shift-and-mask turns a code word into. A is stored with each 8-group permuted the same way
// ([0, 4, 1, 5, 2, 6, 3, 7]) so the lane reads its A values contiguously.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "device_numerics.cuh"
#include "launch.h"

namespace fp4q::kernels::cuda {
namespace {

constexpr int kWarps = 8;             // n-tiles of 8 per CTA
constexpr int kThreads = kWarps * 32;
constexpr int kChunk = 128;           // k per warp iteration (4 lanes x 32)
constexpr int kUnroll = 4;

int64_t PadM(int64_t m) { return (m + 15) / 16 * 16; }
int64_t PadK(int64_t k) { return (k + kChunk - 1) / kChunk * kChunk; }

// Scale value of block (r, kb) of an operand.
FP4Q_D float OperandScale(const GemmOperand& o, bool mx, int64_t r, int64_t kb) {
  const int64_t sc = mx ? (o.cols >> 5) : (o.cols >> 4);
  const uint32_t b = o.scales[ScaleOffset(r, kb, sc, o.swizzled)];
  return mx ? E8M0Value(b) : E4M3Value(b);
}

// A -> bf16 workspace [Mp, Kp], permuted within 8-groups, NVFP4 values times 2^62.
__global__ void __launch_bounds__(256) PrepareAKernel(const SmallMParams p, int64_t mp,
                                                      int64_t kp) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * 256 + threadIdx.x;
  if (i >= mp * kp) return;
  const int64_t m = i / kp;
  const int64_t pos = i - m * kp;
  constexpr int kPerm[8] = {0, 4, 1, 5, 2, 6, 3, 7};
  const int64_t k = (pos & ~int64_t{7}) + kPerm[pos & 7];
  float v = 0.0f;
  if (m < p.a.rows && k < p.a.cols) {
    const uint32_t code = (p.a.codes[(m * p.a.cols + k) >> 1] >> ((k & 1) * 4)) & 0xFu;
    const float sf = OperandScale(p.a, p.mx, m, p.mx ? (k >> 5) : (k >> 4));
    v = __fmul_rn(E2M1Value(code), sf);
    if (!p.mx) v = __fmul_rn(v, 0x1p62f);
  }
  reinterpret_cast<__nv_bfloat16*>(p.workspace)[i] = __float2bfloat16_rn(v);
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

template <int kMt>  // M tiles of 16
__global__ void __launch_bounds__(kThreads) SmallMKernel(const SmallMParams p, int64_t kp) {
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int64_t n0 = (static_cast<int64_t>(blockIdx.x) * kWarps + warp) * 8;
  if (n0 >= p.b.rows) return;  // warp-uniform
  const int64_t n = n0 + g;
  const bool n_ok = n < p.b.rows;
  const int64_t K = p.b.cols;
  const bool k32 = (K & 31) == 0;
  const __nv_bfloat16* aw = reinterpret_cast<const __nv_bfloat16*>(p.workspace);
  const int64_t m_rows = p.a.rows;

  float acc[kMt][4];
#pragma unroll
  for (int mt = 0; mt < kMt; ++mt) acc[mt][0] = acc[mt][1] = acc[mt][2] = acc[mt][3] = 0.0f;

  const uint32_t c126 = SplatBf16(0x1p126f);
  for (int64_t kc = 0; kc < kp; kc += kChunk * kUnroll) {
    uint32_t w[kUnroll][4];
    float sf[kUnroll][2];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t kk = kc + u * kChunk + t * 32;
      w[u][0] = w[u][1] = w[u][2] = w[u][3] = 0u;
      sf[u][0] = sf[u][1] = 0.0f;
      if (n_ok && kk < K) {
        const uint8_t* src = p.b.codes + ((n * K + kk) >> 1);
        if (k32) {
          const uint4 q = *reinterpret_cast<const uint4*>(src);
          w[u][0] = q.x; w[u][1] = q.y; w[u][2] = q.z; w[u][3] = q.w;
        } else {
          const uint2 q = *reinterpret_cast<const uint2*>(src);
          w[u][0] = q.x; w[u][1] = q.y;
          if (kk + 16 < K) {
            const uint2 r = *reinterpret_cast<const uint2*>(src + 8);
            w[u][2] = r.x; w[u][3] = r.y;
          }
        }
        if (p.mx) {
          sf[u][0] = sf[u][1] = OperandScale(p.b, true, n, kk >> 5);
        } else {
          sf[u][0] = OperandScale(p.b, false, n, kk >> 4);
          sf[u][1] = kk + 16 < K ? OperandScale(p.b, false, n, (kk >> 4) + 1) : 0.0f;
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t kk = kc + u * kChunk + t * 32;
      if (kc + u * kChunk >= kp) break;
      uint32_t s2[2];
      if (p.mx) {
        s2[0] = s2[1] = SplatBf16(sf[u][0]);
      } else {
        s2[0] = SplatBf16(__fmul_rn(sf[u][0], 0x1p64f));
        s2[1] = SplatBf16(__fmul_rn(sf[u][1], 0x1p64f));
      }
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const uint32_t word = w[u][i >> 1];
        const int j = 2 * (i & 1);
        uint32_t b0 = RawPair(word, j);
        uint32_t b1 = RawPair(word, j + 1);
        if (p.mx) {
          b0 = MulBf16x2(b0, c126);
          b1 = MulBf16x2(b1, c126);
        }
        b0 = MulBf16x2(b0, s2[i >> 2]);
        b1 = MulBf16x2(b1, s2[i >> 2]);
#pragma unroll
        for (int mt = 0; mt < kMt; ++mt) {
          const int64_t r_lo = mt * 16 + g;
          uint2 la = make_uint2(0u, 0u);
          uint2 lb = make_uint2(0u, 0u);
          if (r_lo < m_rows) la = *reinterpret_cast<const uint2*>(aw + r_lo * kp + kk + 4 * i);
          if (r_lo + 8 < m_rows) {
            lb = *reinterpret_cast<const uint2*>(aw + (r_lo + 8) * kp + kk + 4 * i);
          }
          const uint32_t a[4] = {la.x, lb.x, la.y, lb.y};
          Mma16816(acc[mt], a, b0, b1);
        }
      }
    }
  }

  const float alpha =
      p.mx ? 1.0f : __fmul_rn(__frcp_rn(p.a.global[1]), __frcp_rn(p.b.global[1]));
#pragma unroll
  for (int mt = 0; mt < kMt; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t m = mt * 16 + g + 8 * h;
      if (m >= m_rows) continue;
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        const int64_t col = n0 + 2 * t + q;
        if (col >= p.b.rows) continue;
        const float val = __fmul_rn(acc[mt][2 * h + q], alpha);
        if (p.c_dtype == kF32) {
          static_cast<float*>(p.c)[m * p.b.rows + col] = val;
        } else {
          static_cast<__nv_bfloat16*>(p.c)[m * p.b.rows + col] = __float2bfloat16_rn(val);
        }
      }
    }
  }
}

template <int kMt>
cudaError_t LaunchMain(const SmallMParams& p, int64_t kp, cudaStream_t s) {
  const int64_t blocks = (p.b.rows + kWarps * 8 - 1) / (kWarps * 8);
  if (blocks > 0x7FFFFFFF) return cudaErrorInvalidConfiguration;
  SmallMKernel<kMt><<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(p, kp);
  return cudaGetLastError();
}

}  // namespace

size_t SmallMWorkspaceBytes(int64_t m, int64_t k) {
  return static_cast<size_t>(PadM(m) * PadK(k) * 2);
}

cudaError_t LaunchSmallMMatmul(const SmallMParams& p, cudaStream_t s) {
  if (p.a.rows < 1 || p.a.rows > kSmallMMax) return cudaErrorInvalidValue;
  const int64_t mp = PadM(p.a.rows);
  const int64_t kp = PadK(p.a.cols);
  const int64_t n = mp * kp;
  PrepareAKernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, s>>>(p, mp, kp);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  switch (mp / 16) {
    case 1: return LaunchMain<1>(p, kp, s);
    case 2: return LaunchMain<2>(p, kp, s);
    case 3: return LaunchMain<3>(p, kp, s);
    case 4: return LaunchMain<4>(p, kp, s);
    case 5: return LaunchMain<5>(p, kp, s);
    case 6: return LaunchMain<6>(p, kp, s);
    case 7: return LaunchMain<7>(p, kp, s);
    case 8: return LaunchMain<8>(p, kp, s);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace fp4q::kernels::cuda
