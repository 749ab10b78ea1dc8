// Row-wise and column-wise quantization from one read of x (NUMERICS 2-8, DESIGN "Column-wise
// output"). Each output gets its own transform (the RHT mixes a row-wise block's 16 elements of
// a row of x, a column-wise block's 16 elements of a column) and its own global amax. Two kernels:
//
// Lane tiles (LaneTilesCover: NVFP4 1x16, map-to-6, bf16 x, rows a multiple of 64, columns of
// 256): a CTA task is 64 rows x 256 columns, a warp's part 64 x 32 in four mini tiles of 16 rows.
// In each mini tile lane l loads row l / 2, columns 16 (l % 2) .. + 15 (its row-wise block,
// quantized from the registers as quantize_lanes.cu quantizes a block) and stores those 32
// bytes to the warp's 1 KiB of shared memory; two ldmatrix.trans then give lane l column
// 8 (l % 4) + l / 4 as 8 packed pairs of rows, the form a row block's words have, so its
// column-wise block takes the same code. Each output costs what quantize_lanes.cu's block
// costs, plus four shared-memory instructions a block for the transposition. Both outputs leave
// in whole 32-byte sectors: a lane keeps its column's four blocks (32 bytes of codes, 4 scale
// bytes) to the end of the task and writes the codes with its lane pair, and the row-wise codes
// and scales are staged in shared memory and leave 128 bytes a row. Partial-sector stores cost
// L2 more than the kernel's bytes (on an H100: 361 MB of sectors written for 75 MB of output,
// and 213 us against 167 for RHT + SR; the shared tiles take 263,
// bench/results/h200-quantize/lane-tiles). The next block is in flight while one computes.
//
// Shared tiles (every other request: f32 x, MXFP4, 16x16, four-over-six, other shapes): a CTA
// stages a 64 x 128 tile of x in shared memory as f32, then quantizes its rows (32 elements per
// thread, as in quantize_rows.cu) and its columns (32 rows of one column per thread, i.e. a
// unit of x^T). The shared tile is column-major with a 4-float-group XOR swizzle, so the loading
// warps (8 rows x 4 chunks), the row readers (8 rows x 4 chunks) and the column readers (8
// consecutive columns per 16-byte phase) are all free of bank conflicts.
//
// Budget (8192 x 8192 bf16, both outputs): 2 bytes read + 2 x 0.5625 written per element.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "launch.h"
#include "quantize_lane_block.cuh"
#include "quantize_unit.cuh"

namespace fp4q::kernels::cuda {
namespace {

constexpr int kTR = 64;
constexpr int kTC = 128;
constexpr int kThreads = 256;

FP4Q_D int SwizzleGroup(int c) {
  return ((c & 7) ^ (((c >> 3) & 3) << 1) ^ (((c >> 5) & 3) << 1)) & 15;
}

// Word index of tile element (r, c): column-major, 4-row groups XOR-swizzled per column.
FP4Q_D int TileIndex(int r, int c) {
  return c * kTR + ((((r >> 2) ^ SwizzleGroup(c)) & 15) << 2) + (r & 3);
}

template <typename In>
FP4Q_D void LoadTile(const TileParams& p, int64_t r0, int64_t c0, bool vec_ok, float* tile) {
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int r = warp * 8 + (lane >> 2);
  const int64_t grow = r0 + r;
  const In* x = reinterpret_cast<const In*>(p.x);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int cl = ((lane & 3) + 4 * i) * 8;
    const int64_t gcol = c0 + cl;
    float v[8];
    if (grow < p.rows && gcol + 8 <= p.cols && vec_ok) {
      const In* src = x + grow * p.cols + gcol;
      if (sizeof(In) == 4) {
        const float4 a = reinterpret_cast<const float4*>(src)[0];
        const float4 b = reinterpret_cast<const float4*>(src)[1];
        v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
        v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
      } else {
        const uint4 w = reinterpret_cast<const uint4*>(src)[0];
        v[0] = Bf16Lo(w.x); v[1] = Bf16Hi(w.x); v[2] = Bf16Lo(w.y); v[3] = Bf16Hi(w.y);
        v[4] = Bf16Lo(w.z); v[5] = Bf16Hi(w.z); v[6] = Bf16Lo(w.w); v[7] = Bf16Hi(w.w);
      }
    } else {
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        v[k] = 0.0f;
        if (grow < p.rows && gcol + k < p.cols) {
          const In e = x[grow * p.cols + gcol + k];
          if constexpr (sizeof(In) == 4) {
            v[k] = e;
          } else {
            v[k] = __bfloat162float(e);
          }
        }
      }
    }
#pragma unroll
    for (int k = 0; k < 8; ++k) tile[TileIndex(r, cl + k)] = v[k];
  }
}

// The rest of one unit of 32 elements, the same for both outputs: the 16-point transforms, then
// either its part of the amax pass or its quantization and store. The unit is elements
// [inner, inner + n_valid) of row `outer` of the quantized matrix [outer_dim, inner_dim] (x for
// the row-wise output, x^T for the column-wise one).
template <int kFmt, bool kSr, bool kRht, bool kBf16, int kRowwise>
FP4Q_D void FinishUnit(float (&v)[32], int n_valid, const TileParams& p, const QOut& out,
                       float* amax_out, int64_t outer, int64_t inner, int64_t outer_dim,
                       int64_t inner_dim) {
  if (kRht) {
    Rht16(v, p.q.rht_signs, kBf16);
    Rht16(v + 16, p.q.rht_signs, kBf16);
    if (n_valid <= 16) {
#pragma unroll
      for (int e = 16; e < 32; ++e) v[e] = 0.0f;
    }
  }
  if (p.amax_only) {
    float m = 0.0f;
#pragma unroll
    for (int e = 0; e < 32; ++e) m = fmaxf(m, fabsf(v[e]));
    if (amax_out != nullptr) WarpAtomicMax(amax_out, m);
    return;
  }
  const float amax = out.amax_ptr != nullptr ? *out.amax_ptr : out.amax_value;
  const UnitCtx ctx = MakeUnitCtx(p.q, amax);
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    if (out.write_amax) out.global[0] = amax;
    out.global[1] = GlobalSecond(kFmt, ctx);
  }
  if (kFmt == kFmtMx) {
    float m = 0.0f;
#pragma unroll
    for (int e = 0; e < 32; ++e) m = fmaxf(m, fabsf(v[e]));
    WarpAtomicMax(out.global, m);
  }
  UnitResult res;
  QuantizeUnit<kFmt, kSr, kRowwise>(v, n_valid, ctx, p.q.sr_keys,
                                    static_cast<uint64_t>(outer * inner_dim + inner), &res);
  if (n_valid > 0) StoreUnit<kFmt>(out, outer_dim, inner_dim, outer, inner, n_valid, res);
}

template <typename In, int kFmt, bool kSr, bool kRht>
__global__ void __launch_bounds__(kThreads, kSr && kRht ? 3 : 0)
    QuantizeTileKernel(const TileParams p, bool vec_ok) {
  __shared__ __align__(16) float tile[kTC * kTR];
  constexpr bool kTile = kFmt == kFmtNv16x16;
  constexpr bool kBf16 = sizeof(In) == 2;
  const int64_t tiles_c = (p.cols + kTC - 1) / kTC;
  const int64_t r0 = (blockIdx.x / tiles_c) * kTR;
  const int64_t c0 = (blockIdx.x % tiles_c) * kTC;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;

  LoadTile<In>(p, r0, c0, vec_ok, tile);
  __syncthreads();

  // ---- row-wise: units along x's rows
  if (p.row.codes != nullptr || p.row_amax_out != nullptr) {
    int r, cl;
    if (kTile) {
      r = (warp >> 1) * 16 + (lane >> 1);
      cl = (warp & 1) * 64 + (lane & 1) * 32;
    } else {
      r = threadIdx.x >> 2;
      cl = (threadIdx.x & 3) * 32;
    }
    const int64_t grow = r0 + r;
    const int64_t gcol = c0 + cl;
    int n_valid = 0;
    if (grow < p.rows && gcol < p.cols) n_valid = p.cols - gcol < 32 ? int(p.cols - gcol) : 32;
    float v[32];
#pragma unroll
    for (int e = 0; e < 32; ++e) v[e] = tile[TileIndex(r, cl + e)];
    FinishUnit<kFmt, kSr, kRht, kBf16, 1>(v, n_valid, p, p.row, p.row_amax_out, grow, gcol,
                                          p.rows, p.cols);
  }

  // ---- column-wise: units along x's columns (rows of x^T)
  if (p.col.codes != nullptr || p.col_amax_out != nullptr) {
    const int cl = threadIdx.x & (kTC - 1);
    const int rl = (threadIdx.x >> 7) * 32;
    const int64_t gcol = c0 + cl;
    const int64_t grow = r0 + rl;
    int n_valid = 0;
    if (gcol < p.cols && grow < p.rows) n_valid = p.rows - grow < 32 ? int(p.rows - grow) : 32;
    float v[32];
    const int sg = SwizzleGroup(cl);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float4 f = *reinterpret_cast<const float4*>(
          &tile[cl * kTR + ((((rl >> 2) + j) ^ sg) & 15) * 4]);
      v[4 * j] = f.x;
      v[4 * j + 1] = f.y;
      v[4 * j + 2] = f.z;
      v[4 * j + 3] = f.w;
    }
    FinishUnit<kFmt, kSr, kRht, kBf16, 0>(v, n_valid, p, p.col, p.col_amax_out, gcol, grow,
                                          p.cols, p.rows);
  }
}

template <typename In, int kFmt, bool kSr, bool kRht>
cudaError_t Launch(const TileParams& p, cudaStream_t s) {
  const int64_t tiles = ((p.rows + kTR - 1) / kTR) * ((p.cols + kTC - 1) / kTC);
  if (tiles == 0) return cudaSuccess;
  if (tiles > 0x7FFFFFFF) return cudaErrorInvalidConfiguration;
  const size_t es = sizeof(In);
  const bool vec_ok = (reinterpret_cast<uintptr_t>(p.x) % 16 == 0) && ((p.cols * es) % 16 == 0);
  QuantizeTileKernel<In, kFmt, kSr, kRht><<<static_cast<unsigned>(tiles), kThreads, 0, s>>>(
      p, vec_ok);
  return cudaGetLastError();
}

template <typename In, int kFmt>
cudaError_t DispatchModes(const TileParams& p, cudaStream_t s) {
  if (p.q.rht) {
    return p.q.sr ? Launch<In, kFmt, true, true>(p, s) : Launch<In, kFmt, false, true>(p, s);
  }
  return p.q.sr ? Launch<In, kFmt, true, false>(p, s) : Launch<In, kFmt, false, false>(p, s);
}

template <typename In>
cudaError_t DispatchFormat(const TileParams& p, cudaStream_t s) {
  switch (p.q.fmt) {
    case kFmtNv1x16:
      return DispatchModes<In, kFmtNv1x16>(p, s);
    case kFmtNv16x16:
      return DispatchModes<In, kFmtNv16x16>(p, s);
    case kFmtMx:
      return DispatchModes<In, kFmtMx>(p, s);
    default:
      return cudaErrorInvalidValue;
  }
}

// ---------------------------------------------------------------- lane tiles

constexpr int kMiniRows = 16;   // one transposition: 16 rows x 32 columns
constexpr int kTaskMinis = 4;   // a warp's task: 64 rows x 32 columns
constexpr int kTaskRows = kMiniRows * kTaskMinis;
constexpr int kWarpCols = 32;
constexpr int kWarps = kThreads / 32;
constexpr int kCtaCols = kWarpCols * kWarps;  // a CTA's task: 64 rows x 256 columns
static_assert(kThreads == 2 * kScaleBytes, "one multiplier table per output, one entry a thread");

struct LaneTileParams {
  LaneParams lp;  // lp.p: x, rows, cols, q; lp.p.out: the row-wise output (codes null: none)
  QOut col;       // the column-wise output ([cols, rows] of x^T; codes null: none)
  uint32_t tasks = 0;           // CTA tasks: (rows / 64) * (cols / 256)
  uint32_t tasks_per_band = 0;  // cols / 256
  uint64_t band_magic = 0;      // DivMagic(tasks_per_band): task -> band of 64 rows
  uint32_t col_scale_cols = 0;  // rows / 16
  // Amax-only pass (kAmaxOnly): max |RHT(block)| of each output into these (either may be null).
  float* row_amax_out = nullptr;
  float* col_amax_out = nullptr;
};

// A warp's part of a CTA task: rows 64 band .. + 63, columns 32 tc .. + 31.
struct WarpTask {
  uint32_t band, tc;
};

FP4Q_D WarpTask WarpTaskOf(const LaneTileParams& tp, uint32_t task, int warp) {
  const uint32_t band = DivByMagic(task, tp.band_magic);
  return {band, (task - band * tp.tasks_per_band) * kWarps + warp};
}

// Row of x of lane `lane`'s row block in mini tile `mini` (0..3), and that block's index.
FP4Q_D uint32_t MiniRow(const WarpTask& t, int mini, int lane) {
  return (t.band * kTaskMinis + mini) * kMiniRows + (lane >> 1);
}

FP4Q_D uint32_t MiniRowBlock(const LaneTileParams& tp, const WarpTask& t, int mini, int lane) {
  return MiniRow(t, mini, lane) * tp.lp.scale_cols + t.tc * 2 + (lane & 1);
}

FP4Q_D void LoadMiniBlock(const LaneTileParams& tp, const WarpTask& t, int mini, int lane,
                          Block16<__nv_bfloat16>* out) {
  const uint4* src =
      reinterpret_cast<const uint4*>(tp.lp.p.x) + uint64_t{MiniRowBlock(tp, t, mini, lane)} * 2;
  out->x[0] = src[0];
  out->x[1] = src[1];
}

// The warp's transposition buffer, 16 rows x 64 bytes: 16-byte segment j of row r is stored at
// segment j ^ ((r >> 1) & 1), so the lanes' 16-byte stores (rows 4k..4k+3 a phase) and each
// ldmatrix phase (rows 2m, 2m + 1) touch 8 distinct 16-byte bank groups.
FP4Q_D int StageSlot(int row, int seg) { return row * 4 + (seg ^ ((row >> 1) & 1)); }

// ldmatrix.x4.trans from the warp's buffer: matrix q of instruction i is rows 2m, 2m + 1
// (m = 4i + q), segments 0..3; lane 8q + 2j + h gives row 2m + h, segment j. Lane l receives,
// for each m, the pair (x[2m][c], x[2m + 1][c]) of column c = 8 (l % 4) + l / 4.
FP4Q_D void LoadColumnPairs(uint32_t addr, uint4* out) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(out->x), "=r"(out->y), "=r"(out->z), "=r"(out->w)
               : "r"(addr)
               : "memory");
}

// The CTA's row-wise output of one task, staged so that it goes out in whole sectors: the codes
// of row r (128 bytes, warp w's 16 at chunk w ^ (r % 8), so a mini tile's 16 rows spread over
// the banks) and its 16 scale bytes.
struct RowStage {
  uint4 codes[kTaskRows * 8];
  uint32_t scales[kTaskRows * 4];
};

FP4Q_D int RowStageChunk(int row, int chunk) { return row * 8 + (chunk ^ (row & 7)); }

// Writes the staged row-wise output of task t (its band; tc of warp 0) to global memory: 16
// bytes of codes a thread twice (8 threads a 128-byte row), then 4 scale bytes a thread (a
// group of four scale columns, adjacent in both layouts).
FP4Q_D void StoreRowStage(const LaneTileParams& tp, const RowStage& st, const WarpTask& t0) {
  const RowParams& p = tp.lp.p;
  const uint64_t row0 = uint64_t{t0.band} * kTaskRows;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int k = threadIdx.x + i * kThreads;
    const int r = k >> 3, chunk = k & 7;
    const uint64_t byte = ((row0 + r) * static_cast<uint64_t>(p.cols) + t0.tc * kWarpCols) / 2;
    reinterpret_cast<uint4*>(p.out.codes + byte)[chunk] = st.codes[RowStageChunk(r, chunk)];
  }
  const int r = threadIdx.x >> 2, g = threadIdx.x & 3;
  const int64_t sc = tp.lp.scale_cols;
  *reinterpret_cast<uint32_t*>(p.out.scales + ScaleOffset(row0 + r, t0.tc * 2 + 4 * g, sc,
                                                          p.out.swizzled)) = st.scales[r * 4 + g];
}

// Stores lane l's column (x^T's row c, four blocks from 4 band: 32 bytes of codes in w[0..7])
// with its lane pair, so that each 16-byte store of the pair fills one sector: the even lane
// writes bytes 0-15 and the odd lane bytes 16-31 of the even lane's column, then of the odd's.
FP4Q_D void StoreColumnCodes(const LaneTileParams& tp, uint32_t c, uint32_t band,
                             const uint32_t* w) {
  const bool odd = threadIdx.x & 1;
  uint32_t recv[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) recv[k] = __shfl_xor_sync(lanes::kFull, odd ? w[k] : w[4 + k], 1);
  const uint32_t partner = __shfl_xor_sync(lanes::kFull, c, 1);
  const uint32_t c_even = odd ? partner : c, c_odd = odd ? c : partner;
  const uint4 first = odd ? make_uint4(recv[0], recv[1], recv[2], recv[3])
                          : make_uint4(w[0], w[1], w[2], w[3]);
  const uint4 second = odd ? make_uint4(w[4], w[5], w[6], w[7])
                           : make_uint4(recv[0], recv[1], recv[2], recv[3]);
  uint4* codes = reinterpret_cast<uint4*>(tp.col.codes);
  const uint32_t at = band * kTaskMinis / 2 + (odd ? 1 : 0);  // 16-byte units
  codes[uint64_t{c_even} * (tp.col_scale_cols / 2) + at] = first;
  codes[uint64_t{c_odd} * (tp.col_scale_cols / 2) + at] = second;
}

template <bool kSr, bool kRht, bool kAmaxOnly>
__global__ void __launch_bounds__(kThreads, 3) QuantizeLaneTilesKernel(const LaneTileParams tp) {
  using Bf = __nv_bfloat16;
  __shared__ __align__(16) uint4 stage[kWarps][kMiniRows * 4];
  __shared__ float inv_of_sf[2][kScaleBytes];  // row-wise, column-wise (BuildInvScaleTable)
  __shared__ RowStage row_stage;
  const LaneParams& lp = tp.lp;
  const RowParams& p = lp.p;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const bool want_row = p.out.codes != nullptr;
  const bool want_col = tp.col.codes != nullptr;
  UnitCtx row_ctx{}, col_ctx{};
  if constexpr (!kAmaxOnly) {
    const float ra = p.out.amax_ptr != nullptr ? *p.out.amax_ptr : p.out.amax_value;
    const float ca = tp.col.amax_ptr != nullptr ? *tp.col.amax_ptr : tp.col.amax_value;
    row_ctx = MakeUnitCtx(p.q, ra);
    col_ctx = MakeUnitCtx(p.q, ca);
    if (blockIdx.x == 0 && threadIdx.x == 0) {
      if (want_row) {
        if (p.out.write_amax) p.out.global[0] = ra;
        p.out.global[1] = row_ctx.g.s_enc;
      }
      if (want_col) {
        if (tp.col.write_amax) tp.col.global[0] = ca;
        tp.col.global[1] = col_ctx.g.s_enc;
      }
    }
    const int k = threadIdx.x & (kScaleBytes - 1);
    const float s_dec = threadIdx.x < kScaleBytes ? row_ctx.g.s_dec : col_ctx.g.s_dec;
    inv_of_sf[threadIdx.x / kScaleBytes][k] = InvScale(E4M3Value(k), s_dec);
    __syncthreads();
  }

  uint4* const buf = stage[warp];
  uint4* const st0 = buf + StageSlot(lane >> 1, 2 * (lane & 1));
  uint4* const st1 = buf + StageSlot(lane >> 1, 2 * (lane & 1) + 1);
  uint32_t ldsm[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int m = 4 * i + (lane >> 3);
    ldsm[i] = static_cast<uint32_t>(
        __cvta_generic_to_shared(buf + StageSlot(2 * m + (lane & 1), (lane >> 1) & 3)));
  }
  const uint32_t col_in = 8 * (lane & 3) + (lane >> 2);

  float row_max = 0.0f, col_max = 0.0f;
  uint32_t task = blockIdx.x;  // CTA-uniform: every warp runs every task
  WarpTask t = WarpTaskOf(tp, task, warp);
  Block16<Bf> cur, next;
  if (task < tp.tasks) LoadMiniBlock(tp, t, 0, lane, &cur);
  while (task < tp.tasks) {
    const uint32_t following = task + gridDim.x;
    const WarpTask tn = WarpTaskOf(tp, following, warp);
    const uint32_t c = t.tc * kWarpCols + col_in;  // this lane's column (a row of x^T)
    // The column-wise blocks of the task's four mini tiles (x^T's blocks c, 4 band .. + 3):
    // their codes shift down two words a mini tile, their scale bytes one byte.
    uint32_t col_codes[2 * kTaskMinis];
    uint32_t col_scales = 0;
#pragma unroll 1
    for (int mini = 0; mini < kTaskMinis; ++mini) {
      if (mini + 1 < kTaskMinis) {
        LoadMiniBlock(tp, t, mini + 1, lane, &next);
      } else if (following < tp.tasks) {
        LoadMiniBlock(tp, tn, 0, lane, &next);
      }
      __syncwarp();  // the previous mini tile's ldmatrix reads are done
      *st0 = cur.x[0];
      *st1 = cur.x[1];
      __syncwarp();
      Block16<Bf> colb;
      LoadColumnPairs(ldsm[0], &colb.x[0]);
      LoadColumnPairs(ldsm[1], &colb.x[1]);
      if constexpr (kAmaxOnly) {
        row_max = fmaxf(row_max, LaneAbsMax<Bf, kRht>(lp, cur));
        col_max = fmaxf(col_max, LaneAbsMax<Bf, kRht>(lp, colb));
      } else {
        uint32_t w0, w1;
        if (want_row) {
          const uint32_t sf = LaneBlockCodes<Bf, false, kSr, kRht>(
              lp, row_ctx, inv_of_sf[0], cur, MiniRowBlock(tp, t, mini, lane), &w0, &w1, nullptr);
          const int r = mini * kMiniRows + (lane >> 1);
          reinterpret_cast<uint2*>(&row_stage.codes[RowStageChunk(r, warp)])[lane & 1] =
              make_uint2(w0, w1);
          reinterpret_cast<uint8_t*>(row_stage.scales)[r * 16 + warp * 2 + (lane & 1)] =
              static_cast<uint8_t>(sf);
        }
        if (want_col) {
          const uint32_t b = c * tp.col_scale_cols + t.band * kTaskMinis + mini;
          const uint32_t sf = LaneBlockCodes<Bf, false, kSr, kRht>(lp, col_ctx, inv_of_sf[1],
                                                                   colb, b, &w0, &w1, nullptr);
#pragma unroll
          for (int k = 0; k + 2 < 2 * kTaskMinis; ++k) col_codes[k] = col_codes[k + 2];
          col_codes[2 * kTaskMinis - 2] = w0;
          col_codes[2 * kTaskMinis - 1] = w1;
          col_scales = (col_scales >> 8) | (sf << 24);
        }
      }
      cur = next;
    }
    if constexpr (!kAmaxOnly) {
      if (want_col) {
        // rows % 64 == 0: 32-byte aligned codes, and the four scale bytes 4-byte aligned and
        // adjacent in the swizzled layout too.
        StoreColumnCodes(tp, c, t.band, col_codes);
        *reinterpret_cast<uint32_t*>(
            tp.col.scales +
            ScaleOffset(c, t.band * kTaskMinis, tp.col_scale_cols, tp.col.swizzled)) = col_scales;
      }
      if (want_row) {
        __syncthreads();  // every warp's part staged
        StoreRowStage(tp, row_stage, WarpTaskOf(tp, task, 0));
        __syncthreads();  // read out before the next task stages
      }
    }
    task = following;
    t = tn;
  }
  if constexpr (kAmaxOnly) {
    if (tp.row_amax_out != nullptr) WarpAtomicMax(tp.row_amax_out, row_max);
    if (tp.col_amax_out != nullptr) WarpAtomicMax(tp.col_amax_out, col_max);
  }
}

template <bool kSr, bool kRht, bool kAmaxOnly>
cudaError_t LaunchLaneTilesWith(const LaneTileParams& tp, cudaStream_t s) {
  static const int per_sm = lanes::ResidentCtas(QuantizeLaneTilesKernel<kSr, kRht, kAmaxOnly>);
  const uint64_t ctas = std::min(uint64_t{tp.tasks}, static_cast<uint64_t>(SmCount()) * per_sm);
  if (ctas == 0) return cudaSuccess;
  QuantizeLaneTilesKernel<kSr, kRht, kAmaxOnly>
      <<<static_cast<unsigned>(ctas), kThreads, 0, s>>>(tp);
  return cudaGetLastError();
}

cudaError_t LaunchLaneTiles(const TileParams& p, cudaStream_t s) {
  RowParams rp;
  rp.q = p.q;
  rp.rows = p.rows;
  rp.cols = p.cols;
  rp.x = p.x;
  rp.x_dtype = p.x_dtype;
  rp.out = p.row;
  LaneTileParams tp;
  tp.lp = LaneParamsOf(rp);
  tp.col = p.col;
  tp.tasks_per_band = static_cast<uint32_t>(p.cols / kCtaCols);
  tp.tasks = static_cast<uint32_t>(p.rows / kTaskRows) * tp.tasks_per_band;
  tp.band_magic = DivMagic(tp.tasks_per_band);
  tp.col_scale_cols = static_cast<uint32_t>(p.rows / 16);
  if (p.amax_only) {  // the RHT's amax (without it LaunchAmax reduces x itself)
    if (!p.q.rht) return cudaErrorInvalidValue;
    tp.row_amax_out = p.row_amax_out;
    tp.col_amax_out = p.col_amax_out;
    return LaunchLaneTilesWith<false, true, true>(tp, s);
  }
  if (p.q.rht) {
    return p.q.sr ? LaunchLaneTilesWith<true, true, false>(tp, s)
                  : LaunchLaneTilesWith<false, true, false>(tp, s);
  }
  return p.q.sr ? LaunchLaneTilesWith<true, false, false>(tp, s)
                : LaunchLaneTilesWith<false, false, false>(tp, s);
}

}  // namespace

cudaError_t LaunchQuantizeTile(const TileParams& p, cudaStream_t s) {
  if (LaneTilesCover(TilePassOf(p), p.tuning)) return LaunchLaneTiles(p, s);
  return p.x_dtype == kF32 ? DispatchFormat<float>(p, s) : DispatchFormat<__nv_bfloat16>(p, s);
}

namespace {
__global__ void ModuleAnchorKernel() {}  // names this file's CUDA module (QuantizeTileModule)
}  // namespace

const void* QuantizeTileModule() { return reinterpret_cast<const void*>(&ModuleAnchorKernel); }

}  // namespace fp4q::kernels::cuda
