// Device pieces shared by the direct FP4 GEMM kernels (matmul_small_m.cu for M <= 16,
// matmul_mid_m.cu and matmul_wgmma.cu above it): they read B's 4-bit codes straight from global
// memory into registers in the k order of small_m_layout.h, decode them to bf16 MMA operands
// and multiply them on the tensor cores (mma.sync m16n8k16 or wgmma, f32 accumulation) against
// A in bf16, laid out in fragment order by a prepare kernel (or, for small M, by each CTA).
#ifndef FP4Q_KERNELS_SRC_CUDA_MATMUL_DIRECT_CUH_
#define FP4Q_KERNELS_SRC_CUDA_MATMUL_DIRECT_CUH_

#include <atomic>
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "device_numerics.cuh"
#include "launch.h"
#include "pdl.cuh"
#include "small_m_layout.h"

namespace fp4q::kernels::cuda::direct_gemm {

inline constexpr int kChunk = 128;  // k per lane step: 4 lanes x 32

inline size_t Align256(size_t b) { return (b + 255) / 256 * 256; }

// ---- Host side, shared by the three launchers.

// K slices for `work` output tiles of `total` 128-k chunks: about one wave of `slots` CTAs,
// at most `max_chunks` chunks a slice. Sets *chunks (a slice) and *splits (slices).
inline void SplitK(int64_t work, int64_t total, int64_t slots, int64_t max_chunks, int* chunks,
                   int* splits) {
  int64_t n = work >= slots ? 1 : slots / work;
  n = n < 1 ? 1 : (n > total ? total : n);
  int64_t c = (total + n - 1) / n;
  if (c > max_chunks) c = max_chunks;
  *chunks = static_cast<int>(c);
  *splits = static_cast<int>((total + c - 1) / c);
}

// A direct kernel's workspace: [A prepared: act_rows * total * 256 bytes][split tickets: one
// int an output tile][partial sums: splits * M * N f32], the last two only when K is split.
struct Workspace {
  void* act = nullptr;
  int* tickets = nullptr;
  float* partial = nullptr;
  int64_t n_tickets = 0;
};
inline size_t ActBytes(int64_t act_rows, int64_t total) {
  return Align256(static_cast<size_t>(act_rows * total) * 256);
}
inline size_t WorkspaceBytes(int64_t act_rows, int64_t total, int64_t tiles, int splits,
                             int64_t m, int64_t n) {
  if (splits <= 1) return ActBytes(act_rows, total);
  return ActBytes(act_rows, total) + Align256(static_cast<size_t>(tiles) * sizeof(int)) +
         static_cast<size_t>(splits) * m * n * sizeof(float);
}
inline Workspace CarveWorkspace(void* ws, int64_t act_rows, int64_t total, int64_t tiles,
                                int splits) {
  Workspace w;
  char* base = static_cast<char*>(ws);
  w.act = base;
  if (splits > 1) {
    const size_t act = ActBytes(act_rows, total);
    w.tickets = reinterpret_cast<int*>(base + act);
    w.partial = reinterpret_cast<float*>(base + act +
                                         Align256(static_cast<size_t>(tiles) * sizeof(int)));
    w.n_tickets = tiles;
  }
  return w;
}

// Raises `kernel`'s dynamic shared-memory limit to `bytes` once per device (a bit each in
// `opted`, the caller's static for that kernel; devices past 63 set it every call).
template <typename Kernel>
cudaError_t OptInSharedMemory(Kernel kernel, size_t bytes, std::atomic<uint64_t>& opted) {
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  const uint64_t bit = dev >= 0 && dev < 64 ? uint64_t{1} << dev : 0;
  if (bit != 0 && (opted.load(std::memory_order_acquire) & bit) != 0) return cudaSuccess;
  e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(bytes));
  if (e != cudaSuccess) return e;
  opted.fetch_or(bit, std::memory_order_acq_rel);
  return cudaSuccess;
}

FP4Q_D uint32_t MulBf16x2(uint32_t a, uint32_t b) {
  __nv_bfloat162 x = *reinterpret_cast<__nv_bfloat162*>(&a);
  const __nv_bfloat162 y = *reinterpret_cast<__nv_bfloat162*>(&b);
  x = __hmul2_rn(x, y);
  return *reinterpret_cast<uint32_t*>(&x);
}

FP4Q_D void Mma16816(float* d, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

FP4Q_D void GridDependencyWait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

FP4Q_D void GridDependentsLaunch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// The scale multipliers of one row's chunk: s[0] for words 0-1 (block 2t or the MX block),
// s[1] for words 2-3, as bf16 splats.
template <bool kMx>
FP4Q_D void ScaleSplats(uint32_t x, bool check_nan, uint32_t s[2]) {
  if (kMx) {
    const uint32_t b = small_m::E8m0Bf16Bits(x);
    s[0] = s[1] = b | (b << 16);
    return;
  }
  uint32_t h = small_m::E4m3PairBits(x);  // sf * 2^-120
  h = MulBf16x2(h, 0x7F007F00u);          // * 2^127
  h = MulBf16x2(h, 0x5C005C00u);          // * 2^57: sf * 2^64, exact
  if (check_nan) {  // rare: the chunk has a NaN scale byte somewhere
    if ((x & 0x7Fu) == 0x7Fu) h = (h & 0xFFFF0000u) | 0x7FC0u;
    if ((x & 0x7F00u) == 0x7F00u) h = (h & 0x0000FFFFu) | 0x7FC00000u;
  }
  s[0] = __byte_perm(h, h, 0x1010);
  s[1] = __byte_perm(h, h, 0x3232);
}

// Loads row data at `codes` (this lane's 16 code bytes of the chunk) and `scales` (its scale
// bytes), for k = lane's first k of the chunk (< K).
template <bool kMx, bool kK32>
FP4Q_D void LoadRow(const uint8_t* codes, const uint8_t* scales, int64_t k, int64_t K, uint4& w,
                    uint32_t& x) {
  if (kK32) {
    w = __ldg(reinterpret_cast<const uint4*>(codes));
    x = kMx ? __ldg(scales) : __ldg(reinterpret_cast<const uint16_t*>(scales));
  } else {  // K % 32 == 16 (NVFP4 only): rows are 8-byte aligned, the second half may be past K
    const uint2 lo = __ldg(reinterpret_cast<const uint2*>(codes));
    const bool hi_ok = k + 16 < K;
    const uint2 hi = hi_ok ? __ldg(reinterpret_cast<const uint2*>(codes + 8)) : make_uint2(0, 0);
    w = make_uint4(lo.x, lo.y, hi.x, hi.y);
    x = __ldg(scales) | (hi_ok ? static_cast<uint32_t>(__ldg(scales + 1)) << 8 : 0u);
  }
}

// One lane's B data for one chunk: 32 codes and their scale byte(s) for rows g + 8j, j < kRows.
template <int kRows>
struct BChunk {
  uint4 w[kRows];
  uint32_t x[kRows];
};

// Each row's scale splats of a chunk (ScaleSplats); NaN scale bytes (0x7F, 0xFF) of any row are
// tested once (the quantizers never write them).
template <bool kMx, int kRows>
FP4Q_D void ChunkScales(const BChunk<kRows>& d, uint32_t (&s)[kRows][2]) {
  static_assert(kRows == 2 || kRows == 4, "rows in pairs");
  const bool nan =
      !kMx && (small_m::E4m3PairHasNan(d.x[0] | (d.x[1] << 16)) ||
               (kRows == 4 && small_m::E4m3PairHasNan(d.x[kRows - 2] | (d.x[kRows - 1] << 16))));
#pragma unroll
  for (int j = 0; j < kRows; ++j) ScaleSplats<kMx>(d.x[j], nan, s[j]);
}

// Word u (0..3) of each row's codes in a chunk as 4 bf16 pairs (small_m::DecodeWord), scaled.
template <bool kMx, int kRows>
FP4Q_D void DecodeChunkWord(const BChunk<kRows>& d, const uint32_t (&s)[kRows][2], int u,
                            const small_m::SignShifts& sh, uint32_t (&pw)[kRows][4]) {
#pragma unroll
  for (int j = 0; j < kRows; ++j) {
    const uint32_t w = u == 0 ? d.w[j].x : u == 1 ? d.w[j].y : u == 2 ? d.w[j].z : d.w[j].w;
    small_m::DecodeWord(w, pw[j], sh);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      if (kMx) pw[j][q] = MulBf16x2(pw[j][q], 0x7E807E80u);  // * 2^126: e2m1
      pw[j][q] = MulBf16x2(pw[j][q], s[j][u >> 1]);
    }
  }
}

// 16 bytes global -> shared, bypassing L1.
FP4Q_D void CpAsync16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
FP4Q_D void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int kPending>
FP4Q_D void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// C's scale: S_dec_a * S_dec_b = RN(1 / S_enc_a) * RN(1 / S_enc_b) for NVFP4 (global[1] is an
// operand's S_enc), 1 for MXFP4.
FP4Q_D float OutputAlpha(const SmallMParams& p) {
  return p.mx ? 1.0f : __fmul_rn(__frcp_rn(p.a.global[1]), __frcp_rn(p.b.global[1]));
}

FP4Q_D void StoreC(const SmallMParams& p, float alpha, int64_t m, int64_t n, float v) {
  const int64_t N = p.b.rows;
  if (p.c_dtype == kF32) {
    static_cast<float*>(p.c)[m * N + n] = __fmul_rn(v, alpha);
  } else {
    static_cast<__nv_bfloat16*>(p.c)[m * N + n] = __float2bfloat16_rn(__fmul_rn(v, alpha));
  }
}

// Split K, called by every thread of the CTA once it has written its f32 partial sums: whether
// this CTA is the last of the output tile's `splits` to arrive (an integer ticket, zero before
// the first arrives; with reset_ticket zero again when the call returns in every CTA). The last
// one sees every other CTA's partial sums.
FP4Q_D bool LastOfSlices(int* ticket, unsigned splits, int* last_cta, bool reset_ticket) {
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    const bool last = atomicAdd(ticket, 1) == static_cast<int>(splits) - 1;
    // Every other slice has counted: the ticket is this CTA's alone, zero for the next launch.
    if (last && reset_ticket) *ticket = 0;
    *last_cta = last;
  }
  __syncthreads();
  if (!*last_cta) return false;
  __threadfence();
  return true;
}

// Split K: every CTA has written its f32 partial sums partial[(slice * M + m) * N + n]; the last
// CTA of the output tile [m0, m0 + m_rows) x [n0, n0 + kNRows) to arrive (an integer ticket)
// adds the slices in slice order, so the result does not depend on timing, and stores C. Called
// by every thread of the CTA; *ticket is zero before the first CTA of the tile arrives, and with
// reset_ticket zero again when the call returns in every CTA.
template <int kNRows, int kThreads>
FP4Q_D void SumSlicesInOrder(const SmallMParams& p, const float* partial, int* ticket,
                             unsigned splits, int64_t m0, int m_rows, int64_t n0, int* last_cta,
                             bool reset_ticket = false) {
  if (!LastOfSlices(ticket, splits, last_cta, reset_ticket)) return;
  const int64_t M = p.a.rows;
  const int64_t N = p.b.rows;
  const float alpha = OutputAlpha(p);
  // Each thread sums up to kQ outputs, with up to 8 slices x kQ outputs of loads in flight (one
  // L2 round trip per batch instead of one per slice), adding the slices in slice order.
  constexpr int kQ = 2;
  const int outputs = m_rows * kNRows;
  for (int e0 = threadIdx.x; e0 < outputs; e0 += kQ * kThreads) {
    float sum[kQ] = {};
    for (unsigned s0 = 0; s0 < splits; s0 += 8) {
      float v[kQ][8];
#pragma unroll
      for (int q = 0; q < kQ; ++q) {
        const int e = e0 + q * kThreads;
        const int64_t m = m0 + e / kNRows;
        const int64_t n = n0 + e % kNRows;
        const bool ok = e < outputs && n < N;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          v[q][j] = ok && s0 + j < splits ? __ldcg(partial + ((s0 + j) * M + m) * N + n) : 0.0f;
        }
      }
#pragma unroll
      for (int q = 0; q < kQ; ++q) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          if (s0 + j < splits) sum[q] = __fadd_rn(sum[q], v[q][j]);
        }
      }
    }
#pragma unroll
    for (int q = 0; q < kQ; ++q) {
      const int e = e0 + q * kThreads;
      const int64_t n = n0 + e % kNRows;
      if (e < outputs && n < N) StoreC(p, alpha, m0 + e / kNRows, n, sum[q]);
    }
  }
}

// Launches a direct GEMM kernel on `s` after LaunchPrepareGemmAct, under programmatic dependent
// launch when p.pdl (the kernel waits for the prepare kernel with GridDependencyWait).
template <typename... Params, typename... Args>
cudaError_t LaunchAfterPrepare(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                               bool pdl, cudaStream_t s, Args... args) {
  return LaunchMaybePdl(kernel, grid, block, smem, s, pdl, args...);
}

// A -> bf16 workspace [m_rows][total][i][t][4] (small_m::ActSlotK order; m_rows >= M, rows past M
// and k past K zero), NVFP4 values times 2^62; also zeroes n_tickets split tickets. The GEMM
// kernel launched after it on the stream waits for it (griddepcontrol.wait) under programmatic
// dependent launch.
cudaError_t LaunchPrepareGemmAct(const SmallMParams& p, int64_t total, int64_t m_rows, uint2* act,
                                 int* tickets, int64_t n_tickets, cudaStream_t s);
// The same values for the wgmma kernel: [m_rows / tile_rows][total][8 k16 steps] blocks of
// tile_rows x 16 bf16 in core-matrix order (small_m::CoreRowByte, small_m::CoreSlotK).
cudaError_t LaunchPrepareGemmActCore(const SmallMParams& p, int64_t total, int tile_rows,
                                     int64_t m_rows, uint4* act, int* tickets, int64_t n_tickets,
                                     cudaStream_t s);

}  // namespace fp4q::kernels::cuda::direct_gemm

#endif  // FP4Q_KERNELS_SRC_CUDA_MATMUL_DIRECT_CUH_
