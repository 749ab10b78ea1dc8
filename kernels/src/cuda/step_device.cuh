// Device pieces of the optimizer step shared by its check, decide and apply kernels: the
// per-item scalars in registers, the element recurrence of NUMERICS 10.2 (D..V) written with
// explicit _rn intrinsics in the CPU reference's order, 16-element loads and stores of every
// state dtype, the fingerprint hash (10.7), the mapping of warp-units to (item, block) and the
// warp-level flushes of the replicated accumulators.
//
// A warp-unit is 512 elements: lane l owns one 16-element block. 1x16 weights (and every check)
// use the flattened tensor, block 32 * unit + l; 16x16 weights (apply) use two tiles side by
// side, 16 rows x 32 columns, lane l holding row l % 16 of tile l / 16 so that a tile's amax is
// a shuffle over lane bits 0..3.
#ifndef FP4Q_KERNELS_SRC_CUDA_STEP_DEVICE_CUH_
#define FP4Q_KERNELS_SRC_CUDA_STEP_DEVICE_CUH_

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cfloat>
#include <cstdint>

#include "device_numerics.cuh"
#include "quantize_unit.cuh"
#include "step_launch.h"

namespace fp4q::kernels::cuda::step_dev {

using step_ws::ItemDesc;
using step_ws::ListEntry;

constexpr unsigned kFull = 0xFFFFFFFFu;
constexpr uint64_t kNone = ~uint64_t{0};
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

FP4Q_HD uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

FP4Q_D bool Finite(float f) { return fabsf(f) <= FLT_MAX; }  // false for NaN and Inf

FP4Q_D uint64_t WarpMinU64(uint64_t v) {
#pragma unroll
  for (int d = 16; d >= 1; d >>= 1) {
    const uint64_t o = __shfl_xor_sync(kFull, v, d);
    v = o < v ? o : v;
  }
  return v;
}

FP4Q_D uint64_t WarpSumU64(uint64_t v) {
#pragma unroll
  for (int d = 16; d >= 1; d >>= 1) v += __shfl_xor_sync(kFull, v, d);
  return v;
}

// ---------------------------------------------------------------- per-item scalars

struct Scalars {
  float lr, wd, mu, cd, b1, b2, c1, c2, eps, sbc2, alpha, lrwd, kf;
  bool t1;  // t == 1 (SGD's first momentum step)
  bool delta;
  bool nesterov;
  bool has_r;
  bool has_wd;
};

FP4Q_D Scalars LoadScalars(const ItemDesc& d) {
  Scalars s;
  s.lr = d.lr;
  s.wd = d.wd;
  s.mu = d.mu;
  s.cd = d.cd;
  s.b1 = d.b1;
  s.b2 = d.b2;
  s.c1 = d.c1;
  s.c2 = d.c2;
  s.eps = d.eps;
  s.sbc2 = d.sbc2;
  s.alpha = d.alpha;
  s.lrwd = d.lrwd;
  s.kf = d.kf;
  s.t1 = d.t == 1;
  s.delta = d.delta != 0;
  s.nesterov = d.nesterov != 0;
  s.has_r = d.residual != nullptr;
  s.has_wd = d.wd != 0.0f;
  return s;
}

// One element, NUMERICS 10.2 D..V (the CPU reference's StepElement, operation for operation).
struct Elem {
  float x, v, m1, v2, vm;
};

template <int kOpt>
FP4Q_D Elem StepElement(const Scalars& s, float g, float d, float r, float m1, float m2,
                        float mm2) {
  Elem e{0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  const float p = s.has_r ? __fadd_rn(d, r) : d;
  if constexpr (kOpt == step_ws::kOptSgdPlain || kOpt == step_ws::kOptSgdMomentum) {
    if (s.delta) {
      e.x = __fadd_rn(d, g);
    } else {
      float gg = g;
      if (s.has_wd) gg = __fadd_rn(gg, __fmul_rn(s.wd, p));
      if constexpr (kOpt == step_ws::kOptSgdMomentum) {
        const float b = s.t1 ? gg : __fadd_rn(__fmul_rn(s.mu, m1), __fmul_rn(s.cd, gg));
        e.m1 = b;
        gg = s.nesterov ? __fadd_rn(gg, __fmul_rn(s.mu, b)) : b;
      }
      e.x = __fsub_rn(d, __fmul_rn(s.lr, gg));
    }
  } else {
    e.m1 = __fadd_rn(__fmul_rn(s.b1, m1), __fmul_rn(s.c1, g));
    e.v2 = __fadd_rn(__fmul_rn(s.b2, m2), __fmul_rn(__fmul_rn(s.c2, g), g));
    float src = e.v2;
    if constexpr (kOpt == step_ws::kOptAdamWAmsgrad) {
      e.vm = e.v2 > mm2 ? e.v2 : mm2;
      src = e.vm;
    }
    const float den = __fadd_rn(__fdiv_rn(__fsqrt_rn(src), s.sbc2), s.eps);
    const float moved = __fmul_rn(s.alpha, __fdiv_rn(e.m1, den));
    e.x = s.has_wd ? __fsub_rn(d, __fadd_rn(__fmul_rn(s.lrwd, p), moved)) : __fsub_rn(d, moved);
  }
  e.v = s.has_r ? __fadd_rn(e.x, r) : e.x;
  return e;
}

template <int kOpt>
constexpr bool HasM1() {
  return kOpt != step_ws::kOptSgdPlain;
}
template <int kOpt>
constexpr bool IsAdamW() {
  return kOpt == step_ws::kOptAdamW || kOpt == step_ws::kOptAdamWAmsgrad;
}
template <int kOpt>
constexpr bool HasMm2() {
  return kOpt == step_ws::kOptAdamWAmsgrad;
}

// ---------------------------------------------------------------- 16-element loads and stores

// 16 elements at element offset `base` of a dense tensor (16-byte aligned rows of 16).
FP4Q_D void Load16(const void* p, int dtype, int64_t base, float* v) {
  if (dtype == kF32) {
    const float4* q = reinterpret_cast<const float4*>(static_cast<const float*>(p) + base);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float4 f = q[k];
      v[4 * k] = f.x;
      v[4 * k + 1] = f.y;
      v[4 * k + 2] = f.z;
      v[4 * k + 3] = f.w;
    }
  } else {
    const uint4* q = reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(p) + base);
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const uint4 w = q[k];
      const uint32_t u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        v[8 * k + 2 * j] = Bf16Lo(u[j]);
        v[8 * k + 2 * j + 1] = Bf16Hi(u[j]);
      }
    }
  }
}

FP4Q_D void Store16(void* p, int dtype, int64_t base, const float* v) {
  if (dtype == kF32) {
    float4* q = reinterpret_cast<float4*>(static_cast<float*>(p) + base);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      q[k] = make_float4(v[4 * k], v[4 * k + 1], v[4 * k + 2], v[4 * k + 3]);
    }
  } else {
    uint4* q = reinterpret_cast<uint4*>(static_cast<uint16_t*>(p) + base);
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      q[k] = make_uint4(PackBf16x2(v[8 * k], v[8 * k + 1]), PackBf16x2(v[8 * k + 2], v[8 * k + 3]),
                        PackBf16x2(v[8 * k + 4], v[8 * k + 5]),
                        PackBf16x2(v[8 * k + 6], v[8 * k + 7]));
    }
  }
}

// 8 elements at element offset `base` (a multiple of 8) of a dense f32 / bf16 tensor.
FP4Q_D void Load8(const void* p, int dtype, int64_t base, float* v) {
  if (dtype == kF32) {
    const float4* q = reinterpret_cast<const float4*>(static_cast<const float*>(p) + base);
    const float4 a = q[0], b = q[1];
    v[0] = a.x;
    v[1] = a.y;
    v[2] = a.z;
    v[3] = a.w;
    v[4] = b.x;
    v[5] = b.y;
    v[6] = b.z;
    v[7] = b.w;
  } else {
    const uint4 w = *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(p) + base);
    const uint32_t u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      v[2 * j] = Bf16Lo(u[j]);
      v[2 * j + 1] = Bf16Hi(u[j]);
    }
  }
}

FP4Q_D void Store8(void* p, int dtype, int64_t base, const float* v) {
  if (dtype == kF32) {
    float4* q = reinterpret_cast<float4*>(static_cast<float*>(p) + base);
    q[0] = make_float4(v[0], v[1], v[2], v[3]);
    q[1] = make_float4(v[4], v[5], v[6], v[7]);
  } else {
    *reinterpret_cast<uint4*>(static_cast<uint16_t*>(p) + base) =
        make_uint4(PackBf16x2(v[0], v[1]), PackBf16x2(v[2], v[3]), PackBf16x2(v[4], v[5]),
                   PackBf16x2(v[6], v[7]));
  }
}

// The raw bits NUMERICS 10.7 hashes: f32 bits, or the bf16 bits of an exactly widened value.
FP4Q_D uint64_t ElemBits(float v, int dtype) {
  const uint32_t b = __float_as_uint(v);
  return dtype == kF32 ? b : (b >> 16);
}

// Sum over the block of mix64(i * 0x9E3779B97F4A7C15 + e_i), i = base .. base + 15.
FP4Q_D uint64_t FingerprintPart(const float* u, int dtype, int64_t base) {
  uint64_t h = static_cast<uint64_t>(base) * 0x9E3779B97F4A7C15ull;
  uint64_t sum = 0;
#pragma unroll
  for (int e = 0; e < 16; ++e) {
    sum += Mix64(h + ElemBits(u[e], dtype));
    h += 0x9E3779B97F4A7C15ull;
  }
  return sum;
}

// DQ of a 16-element NVFP4 block: codes at byte base / 2, scale value sfv, decode scale s_dec.
FP4Q_D void Dq16(const uint8_t* codes, int64_t base, float sfv, float s_dec, float* v) {
  const uint2 w = *reinterpret_cast<const uint2*>(codes + (base >> 1));
#pragma unroll
  for (int e = 0; e < 16; ++e) {
    const uint32_t code = ((e < 8 ? w.x : w.y) >> (4 * (e & 7))) & 0xFu;
    v[e] = __fmul_rn(__fmul_rn(E2M1Value(code), sfv), s_dec);
  }
}

// A moment of the block as f32 values (NUMERICS 10.5 load); `squared`: NVFP4 stores sqrt.
template <int kSt>
FP4Q_D void LoadMoment(const ItemDesc& d, int j, float s_dec_old, int64_t base, bool squared,
                       float* m) {
  if constexpr (kSt == step_ws::kStNvfp4) {
    Dq16(d.m_codes[j], base, E4M3Value(d.m_scales[j][base >> 4]), s_dec_old, m);
    if (squared) {
#pragma unroll
      for (int e = 0; e < 16; ++e) m[e] = __fmul_rn(m[e], m[e]);
    }
  } else {
    Load16(d.m_dense[j], kSt == step_ws::kStF32 ? kF32 : kBF16, base, m);
  }
}

// One element of a moment (the decide kernel's recomputation at a first index).
template <int kSt>
FP4Q_D float MomentAt(const ItemDesc& d, int j, float s_dec_old, int64_t i, bool squared) {
  if constexpr (kSt == step_ws::kStNvfp4) {
    const uint8_t byte = d.m_codes[j][i >> 1];
    const uint32_t code = (i & 1) ? (byte >> 4) : (byte & 0xFu);
    const float s =
        __fmul_rn(__fmul_rn(E2M1Value(code), E4M3Value(d.m_scales[j][i >> 4])), s_dec_old);
    return squared ? __fmul_rn(s, s) : s;
  } else if constexpr (kSt == step_ws::kStF32) {
    return static_cast<const float*>(d.m_dense[j])[i];
  } else {
    return Bf16Lo(static_cast<const uint16_t*>(d.m_dense[j])[i]);
  }
}

// NVFP4 1x16 of 16 f32 values with global scale g (NUMERICS 2, RTN); zero-free: a positive value
// never gets code 0 (10.5).
FP4Q_D void QuantizeMoment16(const float* vals, const NvGlobal& g, bool zero_free, uint32_t* w0,
                             uint32_t* w1, uint32_t* sf) {
  *sf = E4M3Rn(__fmul_rn(BlockAmax16(vals), g.t));
  UnitCtx c{};
  c.g = g;
  Codes16<false>(vals, InvScale(E4M3Value(*sf), g.s_dec), c, 0, w0, w1);
  if (zero_free) {
#pragma unroll
    for (int e = 0; e < 16; ++e) {
      uint32_t& w = e < 8 ? *w0 : *w1;
      const int sh = 4 * (e & 7);
      if (vals[e] > 0.0f && ((w >> sh) & 0xFu) == 0u) w |= 1u << sh;
    }
  }
}

// ---------------------------------------------------------------- warp-units

// The lane's 16-element block of warp-unit `unit` of an item.
struct LaneBlock {
  bool valid;
  int64_t base;  // row-major index of the block's first element
  int64_t row;   // its row and block column (for the weight's swizzled scales)
  int64_t cb;
};

template <bool kTile>
FP4Q_D LaneBlock Locate(const ItemDesc& d, int64_t unit, int lane) {
  LaneBlock b;
  const int64_t sc = d.cols >> 4;
  if constexpr (kTile) {
    const int64_t pairs = (sc + 1) >> 1;
    const int64_t rg = unit / pairs;
    b.row = rg * 16 + (lane & 15);
    b.cb = (unit - rg * pairs) * 2 + (lane >> 4);
    b.valid = b.cb < sc;
    b.base = b.row * d.cols + b.cb * 16;
  } else {
    const int64_t blk = unit * 32 + lane;
    b.valid = blk < (d.n >> 4);
    b.base = blk * 16;
    b.row = 0;
    b.cb = blk;
    if (d.swizzled && b.valid) {
      b.row = blk / sc;
      b.cb = blk - b.row * sc;
    }
  }
  return b;
}

// Warp-units of an item under a mapping (host and device agree: cuda_step.cc uses it).
FP4Q_HD int64_t UnitsOf(int64_t rows, int64_t cols, bool tile) {
  if (tile) return (rows >> 4) * (((cols >> 4) + 1) >> 1);
  return (rows * cols + step_ws::kUnitElems - 1) / step_ws::kUnitElems;
}

// The byte offset of the weight's scale of a block.
FP4Q_D int64_t WeightScaleAt(const ItemDesc& d, const LaneBlock& b) {
  return d.swizzled ? ScaleOffset(b.row, b.cb, d.cols >> 4, true) : (b.base >> 4);
}

// Walks a launch's list: the entry holding warp-unit u (u only grows).
FP4Q_D int Advance(const ListEntry* list, int n_entries, int e, int64_t u) {
  while (e + 1 <= n_entries && list[e + 1].unit_begin <= u) ++e;
  return e;
}

FP4Q_D int Copy() {
  return static_cast<int>(((blockIdx.x * kThreads + threadIdx.x) >> 5) % step_ws::kAccCopies);
}

// Warp-reduced flushes into the replicated accumulators (every lane of the warp calls them).
FP4Q_D void FlushMax(uint32_t* acc, int item, int slot, float m) {
  m = WarpMax(m);
  if ((threadIdx.x & 31) == 0 && m > 0.0f) {
    atomicMax(acc + (static_cast<int64_t>(item) * step_ws::kMaxSlots + slot) * step_ws::kAccCopies +
                  Copy(),
              __float_as_uint(m));
  }
}

FP4Q_D void FlushMin(uint64_t* slot_base, uint64_t v) {
  if (!__any_sync(kFull, v != kNone)) return;
  v = WarpMinU64(v);
  if ((threadIdx.x & 31) == 0) {
    atomicMin(reinterpret_cast<unsigned long long*>(slot_base + Copy()),
              static_cast<unsigned long long>(v));
  }
}

FP4Q_D void FlushSum(uint64_t* slot_base, uint64_t v) {
  v = WarpSumU64(v);
  if ((threadIdx.x & 31) == 0) {
    atomicAdd(reinterpret_cast<unsigned long long*>(slot_base + Copy()),
              static_cast<unsigned long long>(v));
  }
}

// Reductions of the replicas (decide and finish kernels).
FP4Q_D uint64_t MinCopies(const uint64_t* p) {
  uint64_t m = kNone;
  for (int c = 0; c < step_ws::kAccCopies; ++c) m = p[c] < m ? p[c] : m;
  return m;
}
FP4Q_D uint64_t SumCopies(const uint64_t* p) {
  uint64_t s = 0;
  for (int c = 0; c < step_ws::kAccCopies; ++c) s += p[c];
  return s;
}
FP4Q_D float MaxCopies(const uint32_t* p) {
  uint32_t m = 0;
  for (int c = 0; c < step_ws::kAccCopies; ++c) m = p[c] > m ? p[c] : m;
  return __uint_as_float(m);
}

}  // namespace fp4q::kernels::cuda::step_dev

#endif  // FP4Q_KERNELS_SRC_CUDA_STEP_DEVICE_CUH_
