// Row-wise quantization (NUMERICS 2, 4, 5, 6, 7, 8) in one pass over the source: Quantize with
// row-wise output only, QDQ, error feedback and UpdateWeight.
//
// Budget (8192 x 8192 bf16 in, NVFP4 out): 2 bytes read + 0.5625 written per element, so at
// 4.3 TB/s about 20 ALU instructions per element are available; RTN uses about 14, SR about 22.
// One thread owns 32 consecutive elements of a row (64 bytes of bf16: four 16-byte loads in
// flight), 16x16 tiles map a warp onto 16 rows x 64 columns so the tile amax is a shuffle.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "launch.h"
#include "quantize_unit.cuh"

namespace fp4q::kernels::cuda {
namespace {

constexpr int kThreads = 256;

template <typename T>
FP4Q_D const T* Elem(const void* base, int64_t i) {
  return reinterpret_cast<const T*>(base) + i;
}

// v = DQ(W) -/+ update for the unit (UpdateWeight source).
template <typename U>
FP4Q_D void LoadUpdateSource(const RowParams& p, int64_t row, int64_t c0, int n, float s_dec_old,
                             float* v) {
  const int64_t sc = p.cols >> 4;
  const uint2* cp = reinterpret_cast<const uint2*>(p.out.codes + ((row * p.cols + c0) >> 1));
  uint32_t w[4] = {0u, 0u, 0u, 0u};
  const uint2 a = cp[0];
  w[0] = a.x;
  w[1] = a.y;
  if (n > 16) {
    const uint2 b = cp[1];
    w[2] = b.x;
    w[3] = b.y;
  }
  float sfv[2];
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    sfv[j] = (n > 16 * j)
                 ? E4M3Value(p.out.scales[ScaleOffset(row, (c0 >> 4) + j, sc, p.out.swizzled)])
                 : 0.0f;
  }
  float u[32];
  LoadElems<U>(Elem<U>(p.upd, row * p.cols + c0), n, u);
#pragma unroll
  for (int e = 0; e < 32; ++e) {
    const uint32_t code = (w[e >> 3] >> (4 * (e & 7))) & 0xFu;
    const float d = __fmul_rn(__fmul_rn(E2M1Value(code), sfv[e >> 4]), s_dec_old);
    v[e] = p.upd_gradient ? __fsub_rn(d, __fmul_rn(p.lr, u[e])) : __fadd_rn(d, u[e]);
  }
}

template <typename In, int kFmt, bool kSr, bool kRht, bool kUpdate>
__global__ void __launch_bounds__(kThreads) QuantizeRowsKernel(const RowParams p) {
  constexpr bool kTile = kFmt == kFmtNv16x16;
  const int lane = threadIdx.x & 31;
  int64_t row;
  int64_t c0;
  if (kTile) {
    // A warp covers 16 rows x 64 columns: lane = (row in tile) * 2 + (32-column half).
    const int64_t warp = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) >> 5;
    const int64_t groups = (p.cols + 63) >> 6;
    const int64_t rg = warp / groups;
    if (rg >= (p.rows >> 4)) return;  // warp-uniform
    row = rg * 16 + (lane >> 1);
    c0 = (warp - rg * groups) * 64 + (lane & 1) * 32;
  } else {
    const int64_t unit = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
    const int64_t per_row = (p.cols + 31) >> 5;
    row = unit / per_row;
    c0 = (unit - row * per_row) * 32;
    // A warp wholly past the end leaves; a partial warp keeps its lanes for the warp
    // reductions below, with n_valid = 0.
    if (__all_sync(0xFFFFFFFFu, row >= p.rows)) return;
  }
  const bool in_range = row < p.rows && c0 < p.cols;
  const int n_valid = in_range ? static_cast<int>(p.cols - c0 < 32 ? p.cols - c0 : 32) : 0;
  const int64_t base = row * p.cols + c0;

  // ---- source values v (f32)
  float v[32];
#pragma unroll
  for (int e = 0; e < 32; ++e) v[e] = 0.0f;
  if (n_valid > 0) {
    if (kUpdate) {
      const float s_dec_old = __frcp_rn(*p.w_old_senc);
      if (p.upd_dtype == kF32) {
        LoadUpdateSource<float>(p, row, c0, n_valid, s_dec_old, v);
      } else {
        LoadUpdateSource<__nv_bfloat16>(p, row, c0, n_valid, s_dec_old, v);
      }
    } else {
      LoadElems<In>(Elem<In>(p.x, base), n_valid, v);
    }
    if (p.residual != nullptr) {
      float r[32];
      LoadElems<float>(p.residual + base, n_valid, r);
#pragma unroll
      for (int e = 0; e < 32; ++e) v[e] = __fadd_rn(v[e], r[e]);
    }
    if (kRht) {
      Rht16(v, p.q.rht_signs, sizeof(In) == 2);
      if (n_valid > 16) Rht16(v + 16, p.q.rht_signs, sizeof(In) == 2);
    }
  }

  // ---- amax-only pass
  if (p.amax_out != nullptr) {
    float m = 0.0f;
#pragma unroll
    for (int e = 0; e < 32; ++e) m = fmaxf(m, fabsf(v[e]));  // zeros beyond n_valid
    WarpAtomicMax(p.amax_out, m);
    return;
  }

  // ---- quantize
  const float amax = p.out.amax_ptr != nullptr ? *p.out.amax_ptr : p.out.amax_value;
  const UnitCtx ctx = MakeUnitCtx(p.q, amax);
  if (blockIdx.x == 0 && threadIdx.x == 0 && p.out.global != nullptr) {
    if (p.out.write_amax) p.out.global[0] = amax;
    p.out.global[1] = GlobalSecond(kFmt, ctx);
  }
  if (kFmt == kFmtMx && p.out.global != nullptr) {
    float m = 0.0f;
#pragma unroll
    for (int e = 0; e < 32; ++e) m = fmaxf(m, fabsf(v[e]));
    WarpAtomicMax(p.out.global, m);
  }
  UnitResult r;
  QuantizeUnit<kFmt, kSr, 1>(v, n_valid, ctx, static_cast<uint64_t>(base), &r);
  if (n_valid == 0) return;
  if (p.out.codes != nullptr) StoreUnit<kFmt>(p.out, p.rows, p.cols, row, c0, n_valid, r);
  if (p.dq != nullptr || p.residual != nullptr) {
    float dq[32];
#pragma unroll
    for (int e = 0; e < 32; ++e) dq[e] = UnitDq<kFmt>(r, e, ctx);
    if (p.residual != nullptr) {
      float nr[32];
#pragma unroll
      for (int e = 0; e < 32; ++e) nr[e] = __fsub_rn(v[e], dq[e]);
      StoreElems(p.residual + base, kF32, n_valid, nr);
    }
    if (p.dq != nullptr) {
      const size_t es = p.dq_dtype == kF32 ? 4 : 2;
      StoreElems(static_cast<char*>(p.dq) + base * es, p.dq_dtype, n_valid, dq);
    }
  }
}

template <typename In, int kFmt, bool kSr, bool kRht, bool kUpdate>
cudaError_t Launch(const RowParams& p, cudaStream_t s) {
  int64_t threads;
  if (kFmt == kFmtNv16x16) {
    threads = (p.rows >> 4) * ((p.cols + 63) >> 6) * 32;
  } else {
    threads = p.rows * ((p.cols + 31) >> 5);
  }
  const int64_t blocks = (threads + kThreads - 1) / kThreads;
  if (blocks == 0) return cudaSuccess;
  if (blocks > 0x7FFFFFFF) return cudaErrorInvalidConfiguration;
  QuantizeRowsKernel<In, kFmt, kSr, kRht, kUpdate>
      <<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(p);
  return cudaGetLastError();
}

template <typename In, int kFmt>
cudaError_t DispatchRounding(const RowParams& p, cudaStream_t s) {
  if (p.update) {
    // UpdateWeight: NVFP4, no RHT.
    if constexpr (kFmt != kFmtMx && sizeof(In) == 4) {
      return p.q.sr ? Launch<In, kFmt, true, false, true>(p, s)
                    : Launch<In, kFmt, false, false, true>(p, s);
    }
    return cudaErrorInvalidValue;
  }
  if (p.q.rht) {
    return p.q.sr ? Launch<In, kFmt, true, true, false>(p, s)
                  : Launch<In, kFmt, false, true, false>(p, s);
  }
  return p.q.sr ? Launch<In, kFmt, true, false, false>(p, s)
                : Launch<In, kFmt, false, false, false>(p, s);
}

template <typename In>
cudaError_t DispatchFormat(const RowParams& p, cudaStream_t s) {
  switch (p.q.fmt) {
    case kFmtNv1x16:
      return DispatchRounding<In, kFmtNv1x16>(p, s);
    case kFmtNv16x16:
      return DispatchRounding<In, kFmtNv16x16>(p, s);
    case kFmtMx:
      return DispatchRounding<In, kFmtMx>(p, s);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t LaunchQuantizeRows(const RowParams& p, cudaStream_t s) {
  // The UpdateWeight source carries its own dtype (upd_dtype); x_dtype selects the kernel.
  if (p.update) return DispatchFormat<float>(p, s);
  return p.x_dtype == kF32 ? DispatchFormat<float>(p, s) : DispatchFormat<__nv_bfloat16>(p, s);
}

}  // namespace fp4q::kernels::cuda
