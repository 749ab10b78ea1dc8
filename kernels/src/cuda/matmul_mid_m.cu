// C = A * B^T for 16 < M <= kMidMMax from NVFP4/MXFP4 operands, with B's 4-bit codes decoded in
// registers feeding the tensor cores: no dequantized copy of B is written or read.
//
// The same operand swap, k order, decode and exactness argument as matmul_small_m.cu (B's
// weight rows are the rows of m16n8k16 MMAs, A's rows their n8 columns; every product exact,
// f32 sums), with two changes for larger M:
//  - a warp owns 32 weight rows (two m16 tiles) against all of its CTA's 32 or 64 A rows (4 or
//    8 n8 tiles), so each decoded weight feeds 4-8 MMAs and each A fragment loaded from shared
//    memory feeds 2;
//  - A's fragments stream through a 4-stage cp.async ring of 128-k chunks (one chunk of 64 rows
//    is 18 KB with padding) instead of sitting whole in shared memory.
//
// Work split: a CTA = 8 warps x 32 weight rows (256 rows of C^T) x one tile of A rows x one K
// slice; grid (ceil(N / 256), ceil(M / rows), splits), the slices chosen to fill about one wave
// (N = K = 8192, M = 64: 32 x 1 x 4 CTAs of 16 chunks). Each lane keeps two chunks of B loads in
// flight in registers (4 rows x 16 bytes each) while it decodes a third. With splits > 1 every
// CTA writes f32 partial sums and the last CTA of each output tile adds them in slice order.
//
// Per 128-k chunk a warp issues 8 x 2 x tiles MMAs against 4 x 4 decoded words (about 144
// decode and scale instructions a lane) and 8 x tiles fragment loads.
//
// Why M stops at 64 (kMidMMax): with one CTA of 8 warps an SM, two warps a scheduler, the
// kernel is bound by latency, not by the tensor pipe. At M = 128 (two A tiles, every weight
// decoded twice) Nsight Compute counted the tensor pipe 34% busy, issue 34%, 0.57 eligible
// warps a scheduler, 94.7 us: no faster than dequantizing both operands for cuBLAS
// (bench/results/h200-gemm/). More warps need fewer than 128 registers a thread (two CTAs an
// SM), which spills at 8 n8 tiles; Hopper's wgmma (a warpgroup's MMA with the decoded weights
// in registers and A in shared memory) is the path for larger M.
#include <atomic>
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "device_numerics.cuh"
#include "launch.h"
#include "matmul_direct.cuh"
#include "small_m_layout.h"

namespace fp4q::kernels::cuda {
namespace {

using direct_gemm::BChunk;
using direct_gemm::ChunkScales;
using direct_gemm::CpAsync16;
using direct_gemm::CpAsyncCommit;
using direct_gemm::CpAsyncWait;
using direct_gemm::DecodeChunkWord;
using direct_gemm::GridDependencyWait;
using direct_gemm::kChunk;
using direct_gemm::LoadRow;
using direct_gemm::Mma16816;

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kRowsPerWarp = 32;                      // two m16 tiles
constexpr int kRowsPerCta = kWarps * kRowsPerWarp;    // 256 weight rows
constexpr int kStages = 4;                            // A chunks in the ring
constexpr int kActRowBytes = kChunk * 2 + 32;         // one chunk of an A row, 32 bytes of padding
// One CTA per SM (ptxas 13.0: about 224 registers at 8 n8 tiles; at 4 tiles two CTAs an SM
// would cap it at 128 and spill).
constexpr int kCtasPerSm = 1;
constexpr int StageBytes(int tiles) { return 8 * tiles * kActRowBytes; }

using Chunk4 = BChunk<4>;

// grid = (ceil(N / 256), m_rows / (8 kTiles), splits); dynamic shared memory kStages x
// StageBytes(kTiles). kK32: K % 32 == 0. `act` holds m_rows >= M rows (LaunchPrepareGemmAct).
template <bool kMx, bool kK32, int kTiles>
__global__ void __launch_bounds__(kThreads, kCtasPerSm)
    MidMKernel(const SmallMParams p, int chunks, int64_t total_chunks, const uint2* act,
               float* partial, int* tickets, const small_m::SignShifts sh) {
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ int last_cta;
  constexpr int kActRows = 8 * kTiles;
  constexpr int kStage = StageBytes(kTiles);
  const int64_t N = p.b.rows;
  const int64_t K = p.b.cols;
  const int64_t M = p.a.rows;
  const int64_t c0 = static_cast<int64_t>(blockIdx.z) * chunks;
  const int nch = static_cast<int>(total_chunks - c0 < chunks ? total_chunks - c0 : chunks);
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kActRows;

  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kRowsPerCta + warp * kRowsPerWarp;
  const int64_t kl = c0 * kChunk + 32 * t;  // this lane's first k
  const int64_t sc = kMx ? (K >> 5) : (K >> 4);
  const int64_t kb = kMx ? (kl >> 5) : (kl >> 4);
  // Row g's addresses (computed even past N, then never dereferenced); rows g + 8j are fixed
  // distances away: 8j rows of codes, 8j plain scale rows, or 128j bytes in the swizzled layout
  // (n0 is a multiple of 32, so the four rows share their 32-row group).
  const int64_t r0 = n0 + g;
  const uint8_t* code0 = p.b.codes + ((r0 * K + kl) >> 1);
  const uint8_t* scale0 = p.b.scales + ScaleOffset(r0, kb, sc, p.b.swizzled);
  const int64_t code_step = 4 * K;
  const int64_t scale_step = p.b.swizzled ? 128 : 8 * sc;
  // Per chunk the block index grows by 8 (NVFP4) or 4 (MX), within the same 4-block group.
  const int sstep = p.b.swizzled ? (kMx ? 512 : 1024) : (kMx ? 4 : 8);
  bool valid[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) valid[j] = r0 + 8 * j < N;

  const int lane_chunks = kl >= K ? 0
                          : static_cast<int>((K - kl + kChunk - 1) / kChunk < nch
                                                 ? (K - kl + kChunk - 1) / kChunk
                                                 : nch);
  const uint8_t* ld_c = code0;
  const uint8_t* ld_s = scale0;
  int64_t ld_k = kl;
  int ld_left = lane_chunks;
  auto load_next = [&](Chunk4& d) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      d.w[j] = make_uint4(0u, 0u, 0u, 0u);
      d.x[j] = 0u;
      if (ld_left > 0 && valid[j]) {
        LoadRow<kMx, kK32>(ld_c + j * code_step, ld_s + j * scale_step, ld_k, K, d.w[j], d.x[j]);
      }
    }
    --ld_left;
    ld_c += 64;
    ld_s += sstep;
    ld_k += kChunk;
  };

  // A's chunk c of this slice into ring stage c % kStages: kActRows rows x 16 pieces of 16 bytes.
  const uint32_t s_base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const uint2* act_tile = act + (m0 * total_chunks + c0) * 32;
  auto copy_chunk = [&](int c) {
    if (c < nch) {
      const uint32_t dst0 = s_base + (c % kStages) * kStage;
#pragma unroll
      for (int r = 0; r < kActRows * 16 / kThreads; ++r) {
        const int q = r * kThreads + static_cast<int>(threadIdx.x);
        const int m = q >> 4;
        const int piece = q & 15;
        CpAsync16(dst0 + m * kActRowBytes + piece * 16,
                  act_tile + (m * total_chunks + c) * 32 + piece * 2);
      }
    }
    CpAsyncCommit();  // an empty group past the slice keeps the wait counts uniform
  };

  float acc[2][kTiles][4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int tl = 0; tl < kTiles; ++tl) {
      acc[mt][tl][0] = acc[mt][tl][1] = acc[mt][tl][2] = acc[mt][tl][3] = 0.0f;
    }
  }

  auto compute = [&](const Chunk4& d, const uint8_t* stage) {
    uint32_t s[4][2];
    ChunkScales<kMx>(d, s);
    // Lane (g, t) reads A row 8 tl + g, fragment (i, t): 8 bytes at (4 i + t) * 8.
    const uint8_t* act_l = stage + g * kActRowBytes + t * 8;
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      uint32_t pw[4][4];
      DecodeChunkWord<kMx>(d, s, u, sh, pw);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int i = 2 * u + h;
        uint2 b[kTiles];
#pragma unroll
        for (int tl = 0; tl < kTiles; ++tl) {
          b[tl] = *reinterpret_cast<const uint2*>(act_l + tl * 8 * kActRowBytes + i * 32);
        }
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          const uint32_t a[4] = {pw[2 * mt][2 * h], pw[2 * mt + 1][2 * h],
                                 pw[2 * mt][2 * h + 1], pw[2 * mt + 1][2 * h + 1]};
#pragma unroll
          for (int tl = 0; tl < kTiles; ++tl) Mma16816(acc[mt][tl], a, b[tl].x, b[tl].y);
        }
      }
    }
  };

  // ---- the first two chunks of B loads, then the ring's first stages of A (written by the
  // prepare kernel this launch may overlap).
  Chunk4 buf0, buf1;
  load_next(buf0);
  load_next(buf1);
  GridDependencyWait();
#pragma unroll
  for (int c = 0; c < kStages - 1; ++c) copy_chunk(c);

  const bool active = n0 < N;  // warp-uniform; inactive warps still copy and synchronize
  auto step = [&](int c, Chunk4& buf) {
    CpAsyncWait<kStages - 2>();  // chunk c has landed (this thread's copies)...
    __syncthreads();             // ...everyone's, and stage (c - 1) % kStages is free again
    copy_chunk(c + kStages - 1);
    const Chunk4 cur = buf;
    load_next(buf);
    if (active) compute(cur, smem + (c % kStages) * kStage);
  };
  for (int c = 0; c < nch; c += 2) {
    step(c, buf0);
    if (c + 1 < nch) step(c + 1, buf1);
  }
  CpAsyncWait<0>();

  // ---- results: acc[mt][tl][2h + q] is C[m = m0 + 8 tl + 2t + q][n = n0 + 16 mt + g + 8h].
  const float alpha = direct_gemm::OutputAlpha(p);
  const bool split = gridDim.z > 1;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int tl = 0; tl < kTiles; ++tl) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t m = m0 + 8 * tl + 2 * t + (e & 1);
        const int64_t n = n0 + 16 * mt + g + 8 * (e >> 1);
        if (m >= M || n >= N) continue;
        if (split) {
          partial[(static_cast<int64_t>(blockIdx.z) * M + m) * N + n] = acc[mt][tl][e];
        } else {
          direct_gemm::StoreC(p, alpha, m, n, acc[mt][tl][e]);
        }
      }
    }
  }
  if (!split) return;
  const int m_rows = static_cast<int>(M - m0 < kActRows ? M - m0 : kActRows);
  direct_gemm::SumSlicesInOrder<kRowsPerCta, kThreads>(
      p, partial, &tickets[blockIdx.y * gridDim.x + blockIdx.x], gridDim.z, m0, m_rows,
      static_cast<int64_t>(blockIdx.x) * kRowsPerCta, &last_cta);
}

struct Plan {
  int tiles;          // n8 tiles of A rows per CTA
  int chunks;         // 128-k chunks per CTA
  int splits;         // K slices
  int64_t total;      // 128-k chunks of K
  int64_t groups;     // weight row groups of 256
  int64_t act_tiles;  // A row tiles of 8 * tiles
  int64_t m_rows;     // A rows in the workspace: act_tiles * 8 * tiles
};

Plan MakePlan(int64_t m, int64_t n, int64_t k) {
  Plan pl;
  pl.tiles = m <= 32 ? 4 : 8;
  pl.total = (k + kChunk - 1) / kChunk;
  pl.groups = (n + kRowsPerCta - 1) / kRowsPerCta;
  pl.act_tiles = (m + 8 * pl.tiles - 1) / (8 * pl.tiles);
  pl.m_rows = pl.act_tiles * 8 * pl.tiles;
  direct_gemm::SplitK(pl.groups * pl.act_tiles, pl.total,
                      static_cast<int64_t>(SmCount()) * kCtasPerSm, pl.total, &pl.chunks,
                      &pl.splits);
  return pl;
}

template <bool kMx, bool kK32, int kTiles>
cudaError_t LaunchMain(const SmallMParams& p, const Plan& pl, const uint2* act, float* partial,
                       int* tickets, cudaStream_t s) {
  auto* kernel = MidMKernel<kMx, kK32, kTiles>;
  const size_t smem = static_cast<size_t>(kStages) * StageBytes(kTiles);
  static std::atomic<uint64_t> opted{0};
  const cudaError_t e = direct_gemm::OptInSharedMemory(kernel, smem, opted);
  if (e != cudaSuccess) return e;
  // The sign shifts as kernel arguments: ptxas cannot fold them (small_m_layout.h).
  return direct_gemm::LaunchAfterPrepare(
      kernel,
      dim3(static_cast<unsigned>(pl.groups), static_cast<unsigned>(pl.act_tiles),
           static_cast<unsigned>(pl.splits)),
      dim3(kThreads), smem, p.pdl, s, p, pl.chunks, pl.total, act, partial, tickets,
      small_m::SignShifts());
}

}  // namespace

// The workspace (matmul_direct.cuh): A's m_rows rows, a split ticket an output tile.
size_t MidMWorkspaceBytes(int64_t m, int64_t n, int64_t k) {
  const Plan pl = MakePlan(m, n, k);
  return direct_gemm::WorkspaceBytes(pl.m_rows, pl.total, pl.groups * pl.act_tiles, pl.splits,
                                     m, n);
}

cudaError_t LaunchMidMMatmul(const SmallMParams& p, cudaStream_t s) {
  const int64_t m = p.a.rows;
  if (m <= kSmallMMax || m > kMidMMax || p.workspace == nullptr || (p.a.cols & 15) != 0 ||
      (p.mx && (p.a.cols & 31) != 0)) {
    return cudaErrorInvalidValue;
  }
  const Plan pl = MakePlan(m, p.b.rows, p.b.cols);
  if (pl.splits > 65535 || pl.act_tiles > 65535 || pl.groups > 0x7FFFFFFF) {
    return cudaErrorInvalidConfiguration;
  }
  const direct_gemm::Workspace ws = direct_gemm::CarveWorkspace(
      p.workspace, pl.m_rows, pl.total, pl.groups * pl.act_tiles, pl.splits);
  uint2* act = static_cast<uint2*>(ws.act);
  const cudaError_t e = direct_gemm::LaunchPrepareGemmAct(p, pl.total, pl.m_rows, act,
                                                          ws.tickets, ws.n_tickets, s);
  if (e != cudaSuccess) return e;
  const bool k32 = (p.b.cols & 31) == 0;
  if (p.mx) {  // K % 32 == 0
    return pl.tiles == 4 ? LaunchMain<true, true, 4>(p, pl, act, ws.partial, ws.tickets, s)
                         : LaunchMain<true, true, 8>(p, pl, act, ws.partial, ws.tickets, s);
  }
  if (pl.tiles == 4) {
    return k32 ? LaunchMain<false, true, 4>(p, pl, act, ws.partial, ws.tickets, s)
               : LaunchMain<false, false, 4>(p, pl, act, ws.partial, ws.tickets, s);
  }
  return k32 ? LaunchMain<false, true, 8>(p, pl, act, ws.partial, ws.tickets, s)
             : LaunchMain<false, false, 8>(p, pl, act, ws.partial, ws.tickets, s);
}

namespace {
__global__ void ModuleAnchorKernel() {}  // names this file's CUDA module (MatmulMidMModule)
}  // namespace

const void* MatmulMidMModule() { return reinterpret_cast<const void*>(&ModuleAnchorKernel); }

}  // namespace fp4q::kernels::cuda
