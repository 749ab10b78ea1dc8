// Row-wise quantization (NUMERICS 2, 4, 5, 6, 7, 8) in one pass over the source: Quantize with
// row-wise output only, QDQ, error feedback and UpdateWeight. The general path: requests the
// lane kernels cover (NVFP4 1x16, map-to-6, no UpdateWeight, rows a multiple of 64 long) go to
// quantize_lanes.cu from LaunchQuantizeRows; MXFP4, 16x16 tiles, four-over-six, UpdateWeight and
// other row lengths run here.
//
// Budget (8192 x 8192 bf16 in, NVFP4 out): 2 bytes read + 0.5625 written per element, so at
// 4.2 TB/s about 23 warp instructions per 32 elements per scheduler are available, of which
// integer/min-max ones count double (half-rate pipe on Hopper). A unit is 32 consecutive
// elements of a row (64 bytes of bf16); threads loop over units grid-stride and load the next
// unit before computing the current one (a cp.async ring 2-3 units deep in shared memory measured
// slower: bench/NOTES.md v3). 16x16 tiles map a warp onto 16 rows x 64 columns so
// the tile amax is a shuffle.
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

// The raw 16-byte words of one unit's x and residual, loaded one unit ahead (software
// pipelining: the next unit's loads are in flight while this one is computed).
template <typename In, bool kRes>
struct RawUnit {
  static constexpr int kX = sizeof(In) == 2 ? 4 : 8;
  uint4 x[kX];
  uint4 r[kRes ? 8 : 1];
};

template <typename In, bool kRes>
FP4Q_D void LoadRaw(const RowParams& p, int64_t base, int n, RawUnit<In, kRes>* raw) {
  constexpr int kX = RawUnit<In, kRes>::kX;
  const uint4 z = make_uint4(0u, 0u, 0u, 0u);
  const uint4* xp = reinterpret_cast<const uint4*>(static_cast<const In*>(p.x) + base);
#pragma unroll
  for (int k = 0; k < kX; ++k) raw->x[k] = (n > 0 && (k < kX / 2 || n > 16)) ? xp[k] : z;
  if (kRes) {
    const uint4* rp = reinterpret_cast<const uint4*>(p.residual + base);
#pragma unroll
    for (int k = 0; k < 8; ++k) raw->r[k] = (n > 0 && (k < 4 || n > 16)) ? rp[k] : z;
  }
}

template <typename In, bool kRes>
FP4Q_D void Widen(const RawUnit<In, kRes>& raw, float* v) {
  WidenWords<In>(raw.x, RawUnit<In, kRes>::kX, v);
}

// Where one unit lives. The loop over units is uniform across a warp (every lane runs the same
// number of iterations, lanes past the end with n = 0) so warp shuffles stay legal.
struct Item {
  int64_t next;  // non-tile: the warp's first unit; tile: the warp's tile index
  int64_t row = 0;
  int64_t c0 = 0;
  int n = 0;
};

template <bool kTile>
FP4Q_D bool Locate(const RowParams& p, int64_t index, int lane, Item* it) {
  int64_t total;
  if (kTile) {
    const int64_t groups = (p.cols + 63) >> 6;
    total = (p.rows >> 4) * groups;
    if (index >= total) return false;
    const int64_t rg = index / groups;
    it->row = rg * 16 + (lane >> 1);
    it->c0 = (index - rg * groups) * 64 + (lane & 1) * 32;
  } else {
    const int64_t per_row = (p.cols + 31) >> 5;
    total = p.rows * per_row;
    if (index >= total) return false;
    const int64_t unit = index + lane;
    it->row = unit / per_row;
    it->c0 = (unit - it->row * per_row) * 32;
  }
  const bool in_range = it->row < p.rows && it->c0 < p.cols;
  it->n = in_range ? static_cast<int>(p.cols - it->c0 < 32 ? p.cols - it->c0 : 32) : 0;
  return true;
}

// kRes: error feedback (x and the residual are loaded at the top of each unit, no prefetch:
// 192 bytes a unit in flight from 3 CTAs per SM beat a register prefetch at 1 CTA per SM);
// kUpdate: the UpdateWeight source. Otherwise the next unit's x is prefetched into registers
// (2 CTAs per SM at 128 registers for bf16).
template <typename In, int kFmt, bool kSr, bool kRht, bool kUpdate, bool kRes>
__global__ void __launch_bounds__(kThreads, kRes ? 3 : (sizeof(In) == 4 ? 1 : 2))
    QuantizeRowsKernel(const RowParams p) {
  constexpr bool kPrefetch = !kRes && !kUpdate;
  constexpr bool kTile = kFmt == kFmtNv16x16;
  const int lane = threadIdx.x & 31;
  const int64_t gtid = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  // Index sequences: per warp (tile) or per warp's first unit (rows).
  const int64_t first = kTile ? (gtid >> 5) : (gtid - lane);
  const int64_t step = kTile ? (stride >> 5) : stride;

  const bool amax_only = p.amax_out != nullptr;
  float amax = 0.0f;
  UnitCtx ctx{};
  if (!amax_only) {
    amax = p.out.amax_ptr != nullptr ? *p.out.amax_ptr : p.out.amax_value;
    ctx = MakeUnitCtx(p.q, amax);
    if (gtid == 0 && p.out.global != nullptr) {
      if (p.out.write_amax) p.out.global[0] = amax;
      p.out.global[1] = GlobalSecond(kFmt, ctx);
    }
  }
  float thread_max = 0.0f;  // amax-only pass, and MXFP4's recorded global amax

  Item it;
  RawUnit<In, kRes> raw;
  bool have = Locate<kTile>(p, first, lane, &it);
  it.next = first;
  if (have && kPrefetch) LoadRaw<In, kRes>(p, it.row * p.cols + it.c0, it.n, &raw);
  while (have) {
    // Prefetch the next unit (or, without prefetch, load this one now).
    Item nx;
    RawUnit<In, kRes> nraw;
    const bool have_next = Locate<kTile>(p, it.next + step, lane, &nx);
    nx.next = it.next + step;
    if (kPrefetch && have_next) LoadRaw<In, kRes>(p, nx.row * p.cols + nx.c0, nx.n, &nraw);
    if (!kPrefetch && !kUpdate) LoadRaw<In, kRes>(p, it.row * p.cols + it.c0, it.n, &raw);

    const int n_valid = it.n;
    const int64_t base = it.row * p.cols + it.c0;
    float v[32];
    if (kUpdate) {
#pragma unroll
      for (int e = 0; e < 32; ++e) v[e] = 0.0f;
      if (n_valid > 0) {
        const float s_dec_old = __frcp_rn(*p.w_old_senc);
        if (p.upd_dtype == kF32) {
          LoadUpdateSource<float>(p, it.row, it.c0, n_valid, s_dec_old, v);
        } else {
          LoadUpdateSource<__nv_bfloat16>(p, it.row, it.c0, n_valid, s_dec_old, v);
        }
        if (p.residual != nullptr) {
          float r[32];
          LoadElems<float>(p.residual + base, n_valid, r);
#pragma unroll
          for (int e = 0; e < 32; ++e) v[e] = __fadd_rn(v[e], r[e]);
        }
      }
    } else {
      Widen<In, kRes>(raw, v);
      if (kRes) {
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          v[4 * k] = __fadd_rn(v[4 * k], __uint_as_float(raw.r[k].x));
          v[4 * k + 1] = __fadd_rn(v[4 * k + 1], __uint_as_float(raw.r[k].y));
          v[4 * k + 2] = __fadd_rn(v[4 * k + 2], __uint_as_float(raw.r[k].z));
          v[4 * k + 3] = __fadd_rn(v[4 * k + 3], __uint_as_float(raw.r[k].w));
        }
      }
    }
    if (kRht) {
      Rht16(v, p.q.rht_signs, sizeof(In) == 2);
      Rht16(v + 16, p.q.rht_signs, sizeof(In) == 2);  // zeros stay zeros
    }

    if (amax_only || (kFmt == kFmtMx && p.out.global != nullptr)) {
#pragma unroll
      for (int e = 0; e < 32; ++e) thread_max = fmaxf(thread_max, fabsf(v[e]));
    }
    if (!amax_only) {
      UnitResult r;
      QuantizeUnit<kFmt, kSr, 1>(v, n_valid, ctx, static_cast<uint64_t>(base), &r);
      if (n_valid > 0) {
        if (p.out.codes != nullptr) {
          StoreUnit<kFmt>(p.out, p.rows, p.cols, it.row, it.c0, n_valid, r);
        }
        if (p.dq != nullptr || p.residual != nullptr) {
          // Four elements at a time (few live registers): r <- v - DQ, out <- DQ.
#pragma unroll
          for (int k = 0; k < 8; ++k) {
            if (k >= 4 && n_valid <= 16) break;
            float d[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) d[j] = UnitDq<kFmt>(r, 4 * k + j, ctx);
            if (p.residual != nullptr) {
              reinterpret_cast<float4*>(p.residual + base)[k] =
                  make_float4(__fsub_rn(v[4 * k], d[0]), __fsub_rn(v[4 * k + 1], d[1]),
                              __fsub_rn(v[4 * k + 2], d[2]), __fsub_rn(v[4 * k + 3], d[3]));
            }
            if (p.dq != nullptr) {
              if (p.dq_dtype == kF32) {
                reinterpret_cast<float4*>(static_cast<float*>(p.dq) + base)[k] =
                    make_float4(d[0], d[1], d[2], d[3]);
              } else {
                reinterpret_cast<uint2*>(static_cast<__nv_bfloat16*>(p.dq) + base)[k] =
                    make_uint2(PackBf16x2(d[0], d[1]), PackBf16x2(d[2], d[3]));
              }
            }
          }
        }
      }
    }
    it = nx;
    if (kPrefetch) raw = nraw;
    have = have_next;
  }

  if (amax_only) {
    WarpAtomicMax(p.amax_out, thread_max);
  } else if (kFmt == kFmtMx && p.out.global != nullptr) {
    WarpAtomicMax(p.out.global, thread_max);
  }
}

template <typename In, int kFmt, bool kSr, bool kRht, bool kUpdate, bool kRes>
cudaError_t Launch(const RowParams& p, cudaStream_t s) {
  int64_t threads;
  if (kFmt == kFmtNv16x16) {
    threads = (p.rows >> 4) * ((p.cols + 63) >> 6) * 32;
  } else {
    threads = p.rows * ((p.cols + 31) >> 5);
  }
  int64_t blocks = (threads + kThreads - 1) / kThreads;
  if (blocks == 0) return cudaSuccess;
  // With prefetch: a grid-stride loop, a few CTAs per SM, each thread several units. Without:
  // one unit per thread (many CTAs in flight instead).
  if (!kRes && !kUpdate) {
    const int64_t cap = static_cast<int64_t>(SmCount()) * 4;
    if (blocks > cap) blocks = cap;
  }
  if (blocks > 0x7FFFFFFF) return cudaErrorInvalidConfiguration;
  QuantizeRowsKernel<In, kFmt, kSr, kRht, kUpdate, kRes>
      <<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(p);
  return cudaGetLastError();
}

template <typename In, int kFmt>
cudaError_t DispatchRounding(const RowParams& p, cudaStream_t s) {
  if (p.update) {
    // UpdateWeight: NVFP4, no RHT (the residual is loaded, not prefetched).
    if constexpr (kFmt != kFmtMx && sizeof(In) == 4) {
      return p.q.sr ? Launch<In, kFmt, true, false, true, false>(p, s)
                    : Launch<In, kFmt, false, false, true, false>(p, s);
    }
    return cudaErrorInvalidValue;
  }
  if (p.residual != nullptr) {  // error feedback: never with RHT
    return p.q.sr ? Launch<In, kFmt, true, false, false, true>(p, s)
                  : Launch<In, kFmt, false, false, false, true>(p, s);
  }
  if (p.q.rht) {
    return p.q.sr ? Launch<In, kFmt, true, true, false, false>(p, s)
                  : Launch<In, kFmt, false, true, false, false>(p, s);
  }
  return p.q.sr ? Launch<In, kFmt, true, false, false, false>(p, s)
                : Launch<In, kFmt, false, false, false, false>(p, s);
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
  if (QuantizeLanesEligible(p)) return LaunchQuantizeLanes(p, s);
  // The UpdateWeight source carries its own dtype (upd_dtype); x_dtype selects the kernel.
  if (p.update) return DispatchFormat<float>(p, s);
  return p.x_dtype == kF32 ? DispatchFormat<float>(p, s) : DispatchFormat<__nv_bfloat16>(p, s);
}

}  // namespace fp4q::kernels::cuda
