// Row-wise and column-wise quantization from one read of x (NUMERICS 2-8, DESIGN "Column-wise
// output"): a CTA stages a 64 x 128 tile of x in shared memory as f32, then quantizes its rows
// (32 elements per thread, as in quantize_rows.cu) and its columns (32 rows of one column per
// thread, i.e. a unit of x^T). Each output gets its own transform (RHT along x's columns for
// the row-wise output, along x's rows for the column-wise one) and its own global amax.
//
// Budget (8192 x 8192 bf16, both outputs): 2 bytes read + 2 x 0.5625 written per element. The
// shared tile is column-major with a 4-float-group XOR swizzle, so the loading warps (8 rows x
// 4 chunks), the row readers (8 rows x 4 chunks) and the column readers (8 consecutive columns
// per 16-byte phase) are all free of bank conflicts.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "launch.h"
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

}  // namespace

cudaError_t LaunchQuantizeTile(const TileParams& p, cudaStream_t s) {
  return p.x_dtype == kF32 ? DispatchFormat<float>(p, s) : DispatchFormat<__nv_bfloat16>(p, s);
}

namespace {
__global__ void ModuleAnchorKernel() {}  // names this file's CUDA module (QuantizeTileModule)
}  // namespace

const void* QuantizeTileModule() { return reinterpret_cast<const void*>(&ModuleAnchorKernel); }

}  // namespace fp4q::kernels::cuda
