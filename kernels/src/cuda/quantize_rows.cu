// Row-wise quantization (NUMERICS 2, 4, 5, 6, 7, 8) in one pass over the source: Quantize with
// row-wise output only, QDQ, error feedback and UpdateWeight.
//
// Budget (8192 x 8192 bf16 in, NVFP4 out): 2 bytes read + 0.5625 written per element, so at
// 4.2 TB/s about 23 warp instructions per 32 elements per scheduler are available, of which
// integer/min-max ones count double (half-rate pipe on Hopper). A unit is 32 consecutive
// elements of a row (64 bytes of bf16); threads loop over units grid-stride, with their next
// 2-3 units already copied towards shared memory (cp.async) while the current one is computed.
// 16x16 tiles map a warp onto 16 rows x 64 columns so the tile amax is a shuffle.
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

// Where one unit lives. The loop over units is uniform across a warp (every lane runs the same
// number of iterations, lanes past the end with n = 0) so warp shuffles stay legal.
struct Item {
  int64_t row = 0;
  int64_t c0 = 0;
  int n = 0;
};

template <bool kTile>
FP4Q_D bool Locate(const RowParams& p, int64_t index, int lane, Item* it) {
  if (kTile) {
    const int64_t groups = (p.cols + 63) >> 6;
    if (index >= (p.rows >> 4) * groups) return false;
    const int64_t rg = index / groups;
    it->row = rg * 16 + (lane >> 1);
    it->c0 = (index - rg * groups) * 64 + (lane & 1) * 32;
  } else {
    const int64_t per_row = (p.cols + 31) >> 5;
    if (index >= p.rows * per_row) return false;
    const int64_t unit = index + lane;
    it->row = unit / per_row;
    it->c0 = (unit - it->row * per_row) * 32;
  }
  const bool in_range = it->row < p.rows && it->c0 < p.cols;
  it->n = in_range ? static_cast<int>(p.cols - it->c0 < 32 ? p.cols - it->c0 : 32) : 0;
  return true;
}

// ---- the staging ring: each thread copies its next units' raw words (x, and the residual for
// error feedback) into shared memory with cp.async, kDepth units ahead, so the memory system
// always has 2-3 units per thread in flight while the current one is computed. Layout
// [slot][word][thread] keeps the 16-byte accesses of a warp conflict-free.

FP4Q_D void CpAsync16(void* smem, const void* gmem, bool valid) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem),
               "r"(valid ? 16 : 0));
}
FP4Q_D void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
FP4Q_D void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

template <typename In, bool kRes>
struct Ring {
  static constexpr int kX = sizeof(In) == 2 ? 4 : 8;  // 16-byte words of x per unit
  static constexpr int kWords = kX + (kRes ? 8 : 0);
  static constexpr int kDepth = kWords <= 4 ? 3 : 2;
  static constexpr size_t kBytes = size_t{kDepth} * kWords * 16 * kThreads;
};

template <typename In, bool kRes>
FP4Q_D void IssueUnit(const RowParams& p, const Item& it, bool have, uint4* ring, int slot) {
  using R = Ring<In, kRes>;
  const int64_t base = it.row * p.cols + it.c0;
  const uint4* xp = reinterpret_cast<const uint4*>(static_cast<const In*>(p.x) + base);
#pragma unroll
  for (int k = 0; k < R::kX; ++k) {
    const bool valid = have && it.n > 0 && (k < R::kX / 2 || it.n > 16);
    CpAsync16(&ring[(slot * R::kWords + k) * kThreads + threadIdx.x], valid ? xp + k : p.x,
              valid);
  }
  if (kRes) {
    const uint4* rp = reinterpret_cast<const uint4*>(p.residual + base);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const bool valid = have && it.n > 0 && (k < 4 || it.n > 16);
      CpAsync16(&ring[(slot * R::kWords + R::kX + k) * kThreads + threadIdx.x],
                valid ? rp + k : p.x, valid);
    }
  }
  CpAsyncCommit();
}

// The unit in ring slot `slot` as f32 values (x, plus the residual when kRes).
template <typename In, bool kRes>
FP4Q_D void ReadUnit(const uint4* ring, int slot, float* v) {
  using R = Ring<In, kRes>;
#pragma unroll
  for (int k = 0; k < R::kX; ++k) {
    const uint4 q = ring[(slot * R::kWords + k) * kThreads + threadIdx.x];
    const uint32_t w[4] = {q.x, q.y, q.z, q.w};
    if constexpr (sizeof(In) == 2) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        v[8 * k + 2 * j] = Bf16Lo(w[j]);
        v[8 * k + 2 * j + 1] = Bf16Hi(w[j]);
      }
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) v[4 * k + j] = __uint_as_float(w[j]);
    }
  }
  if (kRes) {
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const uint4 q = ring[(slot * R::kWords + R::kX + k) * kThreads + threadIdx.x];
      v[4 * k] = __fadd_rn(v[4 * k], __uint_as_float(q.x));
      v[4 * k + 1] = __fadd_rn(v[4 * k + 1], __uint_as_float(q.y));
      v[4 * k + 2] = __fadd_rn(v[4 * k + 2], __uint_as_float(q.z));
      v[4 * k + 3] = __fadd_rn(v[4 * k + 3], __uint_as_float(q.w));
    }
  }
}

// Quantizes one unit whose source values are in v and writes its outputs.
template <typename In, int kFmt, bool kSr, bool kRht>
FP4Q_D void ProcessUnit(const RowParams& p, const Item& it, const UnitCtx& ctx, bool amax_only,
                        float* v, float* thread_max) {
  const int n_valid = it.n;
  const int64_t base = it.row * p.cols + it.c0;
  if (kRht) {
    Rht16(v, p.q.rht_signs, sizeof(In) == 2);
    Rht16(v + 16, p.q.rht_signs, sizeof(In) == 2);  // zeros stay zeros
  }
  if (amax_only || (kFmt == kFmtMx && p.out.global != nullptr)) {
#pragma unroll
    for (int e = 0; e < 32; ++e) *thread_max = fmaxf(*thread_max, fabsf(v[e]));
  }
  if (amax_only) return;
  UnitResult r;
  QuantizeUnit<kFmt, kSr, 1>(v, n_valid, ctx, static_cast<uint64_t>(base), &r);
  if (n_valid == 0) return;
  if (p.out.codes != nullptr) StoreUnit<kFmt>(p.out, p.rows, p.cols, it.row, it.c0, n_valid, r);
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

// kRes: error feedback (the residual travels through the ring with x); kUpdate: the UpdateWeight
// source (loaded directly, no ring).
template <typename In, int kFmt, bool kSr, bool kRht, bool kUpdate, bool kRes>
__global__ void __launch_bounds__(kThreads, 2) QuantizeRowsKernel(const RowParams p) {
  extern __shared__ uint4 ring[];
  constexpr bool kTile = kFmt == kFmtNv16x16;
  const int lane = threadIdx.x & 31;
  const int64_t gtid = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  // Index sequences: per warp (tile) or per warp's first unit (rows).
  const int64_t first = kTile ? (gtid >> 5) : (gtid - lane);
  const int64_t step = kTile ? (stride >> 5) : stride;

  const bool amax_only = p.amax_out != nullptr;
  UnitCtx ctx{};
  if (!amax_only) {
    const float amax = p.out.amax_ptr != nullptr ? *p.out.amax_ptr : p.out.amax_value;
    ctx = MakeUnitCtx(p.q, amax);
    if (gtid == 0 && p.out.global != nullptr) {
      if (p.out.write_amax) p.out.global[0] = amax;
      p.out.global[1] = GlobalSecond(kFmt, ctx);
    }
  }
  float thread_max = 0.0f;  // amax-only pass, and MXFP4's recorded global amax

  if constexpr (kUpdate) {
    Item it;
    for (int64_t index = first; Locate<kTile>(p, index, lane, &it); index += step) {
      float v[32];
#pragma unroll
      for (int e = 0; e < 32; ++e) v[e] = 0.0f;
      if (it.n > 0) {
        const float s_dec_old = __frcp_rn(*p.w_old_senc);
        if (p.upd_dtype == kF32) {
          LoadUpdateSource<float>(p, it.row, it.c0, it.n, s_dec_old, v);
        } else {
          LoadUpdateSource<__nv_bfloat16>(p, it.row, it.c0, it.n, s_dec_old, v);
        }
        if (p.residual != nullptr) {
          float r[32];
          LoadElems<float>(p.residual + it.row * p.cols + it.c0, it.n, r);
#pragma unroll
          for (int e = 0; e < 32; ++e) v[e] = __fadd_rn(v[e], r[e]);
        }
      }
      ProcessUnit<In, kFmt, kSr, false>(p, it, ctx, amax_only, v, &thread_max);
    }
  } else {
    using R = Ring<In, kRes>;
    // Prologue: the first kDepth units in flight (empty groups past the end keep the count).
    Item q0, q1, q2;
    int64_t i1 = first + step, i2 = first + 2 * step;
    bool h0 = Locate<kTile>(p, first, lane, &q0);
    bool h1 = Locate<kTile>(p, i1, lane, &q1);
    bool h2 = R::kDepth > 2 && Locate<kTile>(p, i2, lane, &q2);
    IssueUnit<In, kRes>(p, q0, h0, ring, 0);
    IssueUnit<In, kRes>(p, q1, h1, ring, 1);
    if (R::kDepth > 2) IssueUnit<In, kRes>(p, q2, h2, ring, 2);
    int slot = 0;
    while (h0) {
      CpAsyncWait<R::kDepth - 1>();
      float v[32];
      ReadUnit<In, kRes>(ring, slot, v);
      // Refill this slot with the unit kDepth ahead.
      Item qn;
      const int64_t in = (R::kDepth > 2 ? i2 : i1) + step;
      const bool hn = Locate<kTile>(p, in, lane, &qn);
      IssueUnit<In, kRes>(p, qn, hn, ring, slot);
      ProcessUnit<In, kFmt, kSr, kRht>(p, q0, ctx, amax_only, v, &thread_max);
      // Rotate.
      if (R::kDepth > 2) {
        q0 = q1; h0 = h1;
        q1 = q2; h1 = h2; i1 = i2;
        q2 = qn; h2 = hn; i2 = in;
      } else {
        q0 = q1; h0 = h1;
        q1 = qn; h1 = hn; i1 = in;
      }
      slot = slot + 1 == R::kDepth ? 0 : slot + 1;
    }
    CpAsyncWait<0>();
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
  // A grid-stride loop over units: a couple of CTAs per SM, each thread several units.
  const int64_t cap = static_cast<int64_t>(SmCount()) * 2;
  if (blocks > cap) blocks = cap;
  const size_t smem = kUpdate ? 0 : Ring<In, kRes>::kBytes;
  auto kernel = QuantizeRowsKernel<In, kFmt, kSr, kRht, kUpdate, kRes>;
  if (smem > 48 * 1024) {  // per device and function, so set on every such launch
    const cudaError_t e = cudaFuncSetAttribute(
        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (e != cudaSuccess) return e;
  }
  kernel<<<static_cast<unsigned>(blocks), kThreads, smem, s>>>(p);
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
  // The UpdateWeight source carries its own dtype (upd_dtype); x_dtype selects the kernel.
  if (p.update) return DispatchFormat<float>(p, s);
  return p.x_dtype == kF32 ? DispatchFormat<float>(p, s) : DispatchFormat<__nv_bfloat16>(p, s);
}

}  // namespace fp4q::kernels::cuda
