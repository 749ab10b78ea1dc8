// Device pieces of the optimizer step shared by its check, decide and apply kernels: the
// per-item scalars in registers, the element recurrence of NUMERICS 10.2 (D..V) written with
// explicit _rn intrinsics in the CPU reference's order, 16-element loads and stores of every
// state dtype, the fingerprint hash (10.7), the mapping of warp-units to (item, block) and the
// warp-level flushes of the replicated accumulators.
//
// A warp-unit is 512 elements. The checks give lane l one 16-element block of the flattened
// tensor, block 32 * unit + l (Locate); the apply gives a lane pair a block, in two slots of
// 256 elements (LocateHalf; 16x16 weights: two tiles side by side, one a slot).
#ifndef FP4Q_KERNELS_SRC_CUDA_STEP_DEVICE_CUH_
#define FP4Q_KERNELS_SRC_CUDA_STEP_DEVICE_CUH_

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cfloat>
#include <cstdint>
#include <type_traits>

#include "device_numerics.cuh"
#include "launch.h"
#include "pdl.cuh"
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

// One element, NUMERICS 10.2 D..V (the CPU reference's StepElement, operation for operation),
// with the item's uniform choices as the bits of kF (kFDelta .. kFT1: an update that is a delta,
// weight decay, a residual, Nesterov, the first momentum step) so that it holds no branch.
struct Elem {
  float x, v, m1, v2, vm;
};

enum : unsigned { kFDelta = 1u, kFWd = 2u, kFR = 4u, kFNest = 8u, kFT1 = 16u };

template <int kOpt, unsigned kF>
FP4Q_D Elem StepElementF(const Scalars& s, float g, float d, float r, float m1, float m2,
                         float mm2) {
  constexpr bool kR = (kF & kFR) != 0;
  constexpr bool kWd = (kF & kFWd) != 0;
  Elem e{0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  const float p = kR ? __fadd_rn(d, r) : d;
  if constexpr (kOpt == step_ws::kOptSgdPlain || kOpt == step_ws::kOptSgdMomentum) {
    if constexpr ((kF & kFDelta) != 0) {
      e.x = __fadd_rn(d, g);
    } else {
      float gg = g;
      if constexpr (kWd) gg = __fadd_rn(gg, __fmul_rn(s.wd, p));
      if constexpr (kOpt == step_ws::kOptSgdMomentum) {
        const float b = (kF & kFT1) != 0 ? gg : __fadd_rn(__fmul_rn(s.mu, m1), __fmul_rn(s.cd, gg));
        e.m1 = b;
        gg = (kF & kFNest) != 0 ? __fadd_rn(gg, __fmul_rn(s.mu, b)) : b;
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
    e.x = kWd ? __fsub_rn(d, __fadd_rn(__fmul_rn(s.lrwd, p), moved)) : __fsub_rn(d, moved);
  }
  e.v = kR ? __fadd_rn(e.x, r) : e.x;
  return e;
}

// Calls f(std::integral_constant<unsigned, kF>{}) with kF the choices of `s` that optimizer kOpt
// reads (one uniform branch per choice, taken once per call rather than per element).
template <int kOpt, unsigned kF = 0u, int kBit = 0, typename F>
FP4Q_D void WithItemFlags(const Scalars& s, F&& f) {
  if constexpr (kBit == 5) {
    f(std::integral_constant<unsigned, kF>{});
  } else {
    constexpr unsigned kB = 1u << kBit;
    constexpr bool kSgd = kOpt == step_ws::kOptSgdPlain || kOpt == step_ws::kOptSgdMomentum;
    constexpr bool kDelta = (kF & kFDelta) != 0;  // a delta reads the residual choice only
    constexpr bool kUsed =
        kB == kFR || (kB == kFDelta && kSgd) || (!kDelta && kB == kFWd) ||
        (!kDelta && kOpt == step_ws::kOptSgdMomentum && (kB == kFNest || kB == kFT1));
    if constexpr (!kUsed) {
      WithItemFlags<kOpt, kF, kBit + 1>(s, f);
    } else {
      const bool on = kB == kFDelta ? s.delta
                      : kB == kFWd  ? s.has_wd
                      : kB == kFR   ? s.has_r
                      : kB == kFNest ? s.nesterov
                                     : s.t1;
      if (on) {
        WithItemFlags<kOpt, kF | kB, kBit + 1>(s, f);
      } else {
        WithItemFlags<kOpt, kF, kBit + 1>(s, f);
      }
    }
  }
}

template <int kOpt>
FP4Q_D Elem StepElement(const Scalars& s, float g, float d, float r, float m1, float m2,
                        float mm2) {
  Elem e;
  WithItemFlags<kOpt>(s, [&](auto f) {
    e = StepElementF<kOpt, decltype(f)::value>(s, g, d, r, m1, m2, mm2);
  });
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
// Moments the optimizer keeps per element.
template <int kOpt>
constexpr int MomentsOf() {
  return HasMm2<kOpt>() ? 3 : IsAdamW<kOpt>() ? 2 : HasM1<kOpt>() ? 1 : 0;
}

// ---------------------------------------------------------------- 16-element loads and stores

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

// f32 arrays under the apply's mapping (a lane pair per 16-element block, lane h holding elements
// 8h .. 8h + 7): each of the pair's two 16-byte accesses covers one whole 32-byte sector (lane h
// reads elements 4h .. 4h + 3, then 8 + 4h .. 11 + 4h), and one shuffle of four values swaps the
// quarters each lane read for its partner. `mask`: the valid lanes (pairs are valid together).
FP4Q_D void PairSwapF32(unsigned mask, int h, const float4& a, const float4& b, float* v) {
  const float4 send = h ? a : b;
  float4 recv;
  recv.x = __shfl_xor_sync(mask, send.x, 1);
  recv.y = __shfl_xor_sync(mask, send.y, 1);
  recv.z = __shfl_xor_sync(mask, send.z, 1);
  recv.w = __shfl_xor_sync(mask, send.w, 1);
  const float4 lo = h ? recv : a;
  const float4 hi = h ? b : recv;
  v[0] = lo.x;
  v[1] = lo.y;
  v[2] = lo.z;
  v[3] = lo.w;
  v[4] = hi.x;
  v[5] = hi.y;
  v[6] = hi.z;
  v[7] = hi.w;
}

// The two raw 16-byte words PairSwapF32 takes, of the block holding element `at` (lane h).
FP4Q_D void PairLoadF32Raw(const float* p, int64_t at, int h, float4* a, float4* b) {
  const float* blk = p + (at - 8 * h);
  *a = *reinterpret_cast<const float4*>(blk + 4 * h);
  *b = *reinterpret_cast<const float4*>(blk + 8 + 4 * h);
}

FP4Q_D void PairStoreF32(unsigned mask, float* p, int64_t at, int h, const float* v) {
  const float4 own_lo = make_float4(v[0], v[1], v[2], v[3]);
  const float4 own_hi = make_float4(v[4], v[5], v[6], v[7]);
  const float4 send = h ? own_lo : own_hi;
  float4 recv;
  recv.x = __shfl_xor_sync(mask, send.x, 1);
  recv.y = __shfl_xor_sync(mask, send.y, 1);
  recv.z = __shfl_xor_sync(mask, send.z, 1);
  recv.w = __shfl_xor_sync(mask, send.w, 1);
  float* blk = p + (at - 8 * h);
  *reinterpret_cast<float4*>(blk + 4 * h) = h ? recv : own_lo;
  *reinterpret_cast<float4*>(blk + 8 + 4 * h) = h ? own_hi : recv;
}

// Load8 / Store8 under the apply's mapping (f32 through the pair, bf16 one 16-byte word a lane).
FP4Q_D void PairLoad8(unsigned mask, const void* p, int dtype, int64_t at, int h, float* v) {
  if (dtype == kF32) {
    float4 a, b;
    PairLoadF32Raw(static_cast<const float*>(p), at, h, &a, &b);
    PairSwapF32(mask, h, a, b, v);
  } else {
    Load8(p, dtype, at, v);
  }
}

FP4Q_D void PairStore8(unsigned mask, void* p, int dtype, int64_t at, int h, const float* v) {
  if (dtype == kF32) {
    PairStoreF32(mask, static_cast<float*>(p), at, h, v);
  } else {
    Store8(p, dtype, at, v);
  }
}

// The eight values of a dense update's raw words under the apply's mapping: 8 bf16 in g[0], or
// f32 as PairLoadF32Raw's two words (`mask`: the valid lanes, for the f32 swap).
FP4Q_D void UpdateValues(unsigned mask, int dtype, int h, const uint4* g, float* v) {
  if (dtype == kF32) {
    const float4 x = make_float4(__uint_as_float(g[0].x), __uint_as_float(g[0].y),
                                 __uint_as_float(g[0].z), __uint_as_float(g[0].w));
    const float4 y = make_float4(__uint_as_float(g[1].x), __uint_as_float(g[1].y),
                                 __uint_as_float(g[1].z), __uint_as_float(g[1].w));
    PairSwapF32(mask, h, x, y, v);
  } else {
    const uint32_t u[4] = {g[0].x, g[0].y, g[0].z, g[0].w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      v[2 * j] = Bf16Lo(u[j]);
      v[2 * j + 1] = Bf16Hi(u[j]);
    }
  }
}

// Sum over the 64-bit words w_j of elements base .. base + 7 of mix64(j * 0x9E3779B97F4A7C15 +
// w_j) (NUMERICS 10.7): the little-endian words of the update's bytes, four bf16 elements
// (j = base / 4 ..) or two f32 (j = base / 2 ..) each; `u` holds the loaded values (bf16
// exactly widened).
FP4Q_D uint64_t FingerprintPart8(const float* u, int dtype, int64_t base) {
  constexpr uint64_t kG = 0x9E3779B97F4A7C15ull;
  uint64_t sum = 0;
  if (dtype == kF32) {
    uint64_t h = static_cast<uint64_t>(base >> 1) * kG;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint64_t w = static_cast<uint64_t>(__float_as_uint(u[2 * k])) |
                         (static_cast<uint64_t>(__float_as_uint(u[2 * k + 1])) << 32);
      sum += Mix64(h + w);
      h += kG;
    }
  } else {
    uint64_t h = static_cast<uint64_t>(base >> 2) * kG;
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const uint32_t lo = __byte_perm(__float_as_uint(u[4 * k]), __float_as_uint(u[4 * k + 1]), 0x7632);
      const uint32_t hi =
          __byte_perm(__float_as_uint(u[4 * k + 2]), __float_as_uint(u[4 * k + 3]), 0x7632);
      sum += Mix64(h + (static_cast<uint64_t>(hi) << 32 | lo));
      h += kG;
    }
  }
  return sum;
}

// PTX prmt in its default mode: byte n of the result is byte (c >> 4n) & 7 of {b, a} (a's bytes
// 0-3, b's 4-7), or, when bit 3 of that nibble is set, that byte's top bit copied into all 8.
FP4Q_D uint32_t Prmt(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// The f32 values of the eight E2M1 codes of a word (code e in bits 4e .. 4e + 3; exact, code 8
// is -0.0), by byte permutes: the magnitudes' top and second bytes looked up by the codes' low
// three bits (the values 0, 0.5, 1, 1.5, 2, 3, 4, 6 are bf16 values: 0000, 3F00, 3F80, 3FC0,
// 4000, 4040, 4080, 40C0), the sign bits (the top bits of bytes of w and of w << 4) replicated
// and merged into the top bytes, then pairs laid out as bf16 and widened. 22 integer operations
// for 8 values, where placing each code's bits and scaling by 2^126 took 4 and a multiply each.
FP4Q_D void E2M1Values8(uint32_t w, float* v) {
  constexpr uint32_t kTopLo = 0x3F3F3F00u, kTopHi = 0x40404040u;  // magnitudes 0-3, 4-7
  constexpr uint32_t kSecLo = 0xC0800000u, kSecHi = 0xC0804000u;
  const uint32_t m = w & 0x77777777u;
  const uint32_t w4 = w << 4;
  const uint32_t top[2] = {Prmt(kTopLo, kTopHi, m) | (Prmt(w, w4, 0x9D8Cu) & 0x80808080u),
                           Prmt(kTopLo, kTopHi, m >> 16) | (Prmt(w, w4, 0xBFAEu) & 0x80808080u)};
  const uint32_t sec[2] = {Prmt(kSecLo, kSecHi, m), Prmt(kSecLo, kSecHi, m >> 16)};
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint32_t p01 = Prmt(sec[h], top[h], 0x5140u);  // bf16 of elements 4h, 4h + 1
    const uint32_t p23 = Prmt(sec[h], top[h], 0x7362u);  // and 4h + 2, 4h + 3
    v[4 * h] = Bf16Lo(p01);
    v[4 * h + 1] = Bf16Hi(p01);
    v[4 * h + 2] = Bf16Lo(p23);
    v[4 * h + 3] = Bf16Hi(p23);
  }
}

// DQ of eight NVFP4 elements at element offset `at` (a multiple of 8): their codes are the
// 32-bit word at byte at / 2; scale value sfv, decode scale s_dec.
FP4Q_D void DqWord8(uint32_t w, float sfv, float s_dec, float* v) {
  float e[8];
  E2M1Values8(w, e);
#pragma unroll
  for (int i = 0; i < 8; ++i) v[i] = __fmul_rn(__fmul_rn(e[i], sfv), s_dec);
}
FP4Q_D void Dq8(const uint8_t* codes, int64_t at, float sfv, float s_dec, float* v) {
  DqWord8(*reinterpret_cast<const uint32_t*>(codes + (at >> 1)), sfv, s_dec, v);
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

// ---------------------------------------------------------------- warp-units

// The apply's mapping: a lane pair per 16-element block, eight consecutive elements a lane.
// Slot `sp` (0 or 1) of a warp-unit is, for 1x16 weights, blocks 32 * unit + 16 * sp .. + 15 of
// the flattened tensor (lanes 2p, 2p + 1 hold block 32 * unit + 16 * sp + p); for 16x16 weights
// tile sp of the unit's pair, lane pair p holding its row p, so a tile is the whole warp.
struct HalfItem {
  uint8_t* codes;
  uint8_t* scales;
  float* residual;
  int64_t cols;
  int64_t blocks;  // n / 16
  uint32_t sc;     // blocks per row
  bool swizzled;
};

FP4Q_D HalfItem LoadHalfItem(const ItemDesc& d) {
  HalfItem p;
  p.codes = d.codes;
  p.scales = d.scales;
  p.residual = d.residual;
  p.cols = d.cols;
  p.blocks = d.n >> 4;
  p.sc = static_cast<uint32_t>(d.cols >> 4);
  p.swizzled = d.swizzled != 0;
  return p;
}

struct LaneHalf {
  bool valid;
  int h;             // which half of the block
  int64_t at;        // row-major index of the lane's first element
  int64_t scale_at;  // the byte offset of the weight's scale of the block
};

// Block rows and columns fit 32 bits (the host refuses weights of 2^36 elements or more).
template <bool kTile>
FP4Q_D LaneHalf LocateHalf(const HalfItem& p, int64_t unit, int sp, int lane) {
  LaneHalf b;
  b.h = lane & 1;
  const uint32_t pr = static_cast<uint32_t>(lane >> 1);
  uint32_t row, cb;
  if constexpr (kTile) {
    const uint32_t pairs = (p.sc + 1u) >> 1;
    const uint32_t rg = static_cast<uint32_t>(unit) / pairs;
    row = rg * 16u + pr;
    cb = (static_cast<uint32_t>(unit) - rg * pairs) * 2u + static_cast<uint32_t>(sp);
    b.valid = cb < p.sc;
    b.at = static_cast<int64_t>(row) * p.cols + static_cast<int64_t>(cb) * 16 + 8 * b.h;
  } else {
    const int64_t blk = unit * 32 + sp * 16 + pr;
    b.valid = blk < p.blocks;
    b.at = blk * 16 + 8 * b.h;
    row = 0;
    cb = 0;
    if (p.swizzled && b.valid) {
      row = static_cast<uint32_t>(blk) / p.sc;
      cb = static_cast<uint32_t>(blk) - row * p.sc;
    }
  }
  b.scale_at = p.swizzled ? ScaleOffset(row, cb, p.sc, true) : (b.at >> 4);
  return b;
}

// Asks L2 for the line holding `p`, holding no register and waiting for nothing: how the step
// kernels keep the slots ahead of a warp in flight (StepKernelArgs::prefetch_slots).
FP4Q_D void PrefetchL2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

// The L2 prefetch of what a step kernel reads for the lane's eight elements at `at` (in an item of
// `blocks` blocks: nothing past its end): rank 0's update of dtype `g_dtype`, and with `weight`
// the weight's codes, the residual, and the moments the optimizer kOpt keeps in state dtype kSt.
template <int kOpt, int kSt>
FP4Q_D void PrefetchSlot(const void* g0, int g_dtype, const HalfItem& p, void* const* m_dense,
                         uint8_t* const* m_codes, bool weight, int64_t at) {
  if ((at >> 4) >= p.blocks) return;
  PrefetchL2(static_cast<const char*>(g0) + at * (g_dtype == kF32 ? 4 : 2));
  if (!weight) return;
  PrefetchL2(p.codes + (at >> 1));
  if (p.residual != nullptr) PrefetchL2(p.residual + at);
#pragma unroll
  for (int j = 0; j < MomentsOf<kOpt>(); ++j) {
    if constexpr (kSt == step_ws::kStNvfp4) {
      PrefetchL2(m_codes[j] + (at >> 1));
    } else {
      PrefetchL2(static_cast<const char*>(m_dense[j]) + at * (kSt == step_ws::kStF32 ? 4 : 2));
    }
  }
}

// ---------------------------------------------------------------- the slot ring

// The words a lane reads for the slots ahead of the one it works on, in flight as its own
// asynchronous copies into shared memory (cp.async): the step kernels keep kDepth - 1 slots of
// every lane's reads on their way without holding a register for them. A lane reads back only
// what it copied, so no barrier is needed, only cp.async.wait_group (per thread). A stage holds
// kW16 16-byte words and kW4 4-byte words a lane, laid out [stage][word][thread] so that a warp's
// accesses to one word are conflict-free.
FP4Q_D void CpAsync16(void* smem, const void* g) {
  const unsigned sa = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(sa), "l"(g) : "memory");
}
FP4Q_D void CpAsync4(void* smem, const void* g) {
  const unsigned sa = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(sa), "l"(g) : "memory");
}
FP4Q_D void CpAsyncCommit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int kPending>
FP4Q_D void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}

template <int kW16, int kW4, int kDepth>
struct SlotRing {
  static constexpr int kStageBytes = (16 * kW16 + 4 * kW4) * kThreads;
  static constexpr int kBytes = kDepth * kStageBytes;
  uint4* w16;     // this thread's first word
  uint32_t* w4;
  FP4Q_D static SlotRing Of(unsigned char* smem) {
    SlotRing r;
    r.w16 = reinterpret_cast<uint4*>(smem) + threadIdx.x;
    r.w4 = reinterpret_cast<uint32_t*>(smem + 16 * kW16 * kThreads * kDepth) + threadIdx.x;
    return r;
  }
  FP4Q_D uint4* W16(int stage, int j) const { return w16 + (stage * kW16 + j) * kThreads; }
  FP4Q_D uint32_t* W4(int stage, int j) const { return w4 + (stage * kW4 + j) * kThreads; }
};

// CTAs of the step kernel `k` (kThreads threads) that an SM of the current device holds with
// `smem` bytes of dynamic shared memory, 0 when none fits or the query fails. The first call on
// a device sets the kernel's dynamic shared memory limit there; `cache` (kMaxStepDevices
// entries, one per kernel) keeps the answer.
constexpr int kMaxStepDevices = 64;
template <typename Kernel>
int StepResidentCtas(Kernel k, int smem, std::atomic<int>* cache) {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxStepDevices) {
    cudaGetLastError();
    return 0;
  }
  int n = cache[dev].load(std::memory_order_relaxed);
  if (n > 0) return n;
  if (cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k, kThreads, smem) != cudaSuccess ||
      n < 1) {
    cudaGetLastError();
    return 0;
  }
  cache[dev].store(n, std::memory_order_relaxed);
  return n;
}

// Every step kernel is a programmatic dependent launch where the device takes one (StepPdl,
// pdl.cuh): it calls StepGridEnter before it reads or writes anything.
FP4Q_D void StepGridEnter() { PdlGridEnter(); }

// Launches step kernel `kernel` (which calls StepGridEnter first) on `ctas` CTAs of kThreads
// threads with `smem` bytes of dynamic shared memory.
template <typename... Params, typename... Args>
cudaError_t StepLaunch(void (*kernel)(Params...), unsigned ctas, int smem, cudaStream_t s,
                       const Args&... args) {
  return LaunchMaybePdl(kernel, dim3(ctas), dim3(kThreads), static_cast<size_t>(smem), s,
                        StepPdl(), args...);
}

// A launch of step kernel `kernel` with `smem` bytes of dynamic shared memory and parameters
// `args` over `units` warp-units: a warp per warp-unit, at most as many CTAs as the device holds
// at once (the warps walk the rest, WarpSlotsOf); none when `units` is 0. `resident`: the
// kernel's StepResidentCtas cache. LaunchStepGrid: a launch of StepKernelArgs a.total_units.
template <typename Kernel, typename Args>
cudaError_t LaunchStepGridOf(Kernel kernel, int smem, std::atomic<int>* resident, int64_t units,
                             const Args& args, cudaStream_t s) {
  const int per_sm = StepResidentCtas(kernel, smem, resident);
  if (per_sm == 0) return cudaErrorInvalidConfiguration;  // the ring does not fit the device
  int64_t ctas = (units + kWarps - 1) / kWarps;
  const int64_t cap = static_cast<int64_t>(SmCount()) * per_sm;
  if (ctas > cap) ctas = cap;
  if (ctas == 0) return cudaSuccess;
  return StepLaunch(kernel, static_cast<unsigned>(ctas), smem, s, args);
}
template <typename Kernel>
cudaError_t LaunchStepGrid(Kernel kernel, int smem, std::atomic<int>* resident,
                           const StepKernelArgs& a, cudaStream_t s) {
  return LaunchStepGridOf(kernel, smem, resident, a.total_units, a, s);
}

// Copies the raw words of a dense f32 / bf16 array's eight elements at `at` (lane h of its pair)
// into words j.. of a stage: f32 as PairLoadF32Raw's two words, bf16 as one.
template <typename Ring>
FP4Q_D void RingCopy8(const Ring& ring, int stage, int j, const void* p, int dtype, int64_t at,
                      int h) {
  if (dtype == kF32) {
    const float* blk = static_cast<const float*>(p) + (at - 8 * h);
    CpAsync16(ring.W16(stage, j), blk + 4 * h);
    CpAsync16(ring.W16(stage, j + 1), blk + 8 + 4 * h);
  } else {
    CpAsync16(ring.W16(stage, j), static_cast<const uint16_t*>(p) + at);
  }
}

// The eight values of RingCopy8's words (`mask`: the valid lanes, for the f32 swap).
template <typename Ring>
FP4Q_D void RingValues8(const Ring& ring, int stage, int j, unsigned mask, int dtype, int h,
                        float* v) {
  uint4 g[2];
  g[0] = *ring.W16(stage, j);
  if (dtype == kF32) g[1] = *ring.W16(stage, j + 1);
  UpdateValues(mask, dtype, h, g, v);
}

// The step kernels' slot ring (SlotRing): per lane and slot, rank 0's update (16-byte words 0-1),
// the residual (2-3), the dense moments (from 4, one word each in bf16, two in f32), the weight's
// codes (4-byte word 0) and the NVFP4 moments' codes (from 1). The depth keeps a CTA's ring
// within ~100 KiB (two CTAs an SM).
template <int kOpt, int kSt>
struct StepRing {
  static constexpr int kMoments = MomentsOf<kOpt>();
  static constexpr int kPer = kSt == step_ws::kStNvfp4 ? 0 : kSt == step_ws::kStF32 ? 2 : 1;
  static constexpr int kW16 = 4 + kMoments * kPer;
  static constexpr int kW4 = 1 + (kSt == step_ws::kStNvfp4 ? kMoments : 0);
  static constexpr int kStage = (16 * kW16 + 4 * kW4) * kThreads;
  static constexpr int kFit = 100 * 1024 / kStage;
  static constexpr int kDepth = kFit < 2 ? 2 : kFit > 4 ? 4 : kFit;
  using Ring = SlotRing<kW16, kW4, kDepth>;
};

// Starts the copies of what a step kernel reads for a lane's slot into `stage` (with kWeight the
// weight's codes, residual and moments too, else rank 0's update only) and commits them as one
// group: an empty one for an invalid lane, so that every lane counts the same groups. `Item`:
// the kernel's per-item registers (g0, g0_dtype, p, s, m_dense, m_codes).
template <int kOpt, int kSt, bool kWeight, typename Ring, typename Item>
FP4Q_D void IssueSlot(const Ring& ring, int stage, const Item& c, const LaneHalf& b) {
  using R = StepRing<kOpt, kSt>;
  if (b.valid) {
    RingCopy8(ring, stage, 0, c.g0, c.g0_dtype, b.at, b.h);
    if constexpr (kWeight) {
      CpAsync4(ring.W4(stage, 0), c.p.codes + (b.at >> 1));
      if (c.s.has_r) RingCopy8(ring, stage, 2, c.p.residual, kF32, b.at, b.h);
      const bool skip_m1 = kOpt == step_ws::kOptSgdMomentum && c.s.t1;  // b = g at t == 1
#pragma unroll
      for (int j = 0; j < R::kMoments; ++j) {
        if (j == 0 && skip_m1) continue;
        if constexpr (kSt == step_ws::kStNvfp4) {
          CpAsync4(ring.W4(stage, 1 + j), c.m_codes[j] + (b.at >> 1));
        } else {
          RingCopy8(ring, stage, 4 + j * R::kPer, c.m_dense[j],
                    kSt == step_ws::kStF32 ? kF32 : kBF16, b.at, b.h);
        }
      }
    }
  }
  CpAsyncCommit();
}

// Eight elements of moment j as f32 values from the ring (NUMERICS 10.5 load): a dense moment's
// words, or an NVFP4 moment's codes word with its block's scale from `scales` and decode scale
// `s_dec` (`squared`: NVFP4 stores roots).
template <int kSt, typename Ring>
FP4Q_D void RingMoment8(const Ring& ring, int stage, int j, unsigned mask, const LaneHalf& b,
                        const uint8_t* scales, float s_dec, bool squared, float* m) {
  if constexpr (kSt == step_ws::kStNvfp4) {
    DqWord8(*ring.W4(stage, 1 + j), E4M3Value(scales[b.at >> 4]), s_dec, m);
    if (squared) {
#pragma unroll
      for (int e = 0; e < 8; ++e) m[e] = __fmul_rn(m[e], m[e]);
    }
  } else {
    RingValues8(ring, stage, 4 + j * StepRing<0, kSt>::kPer, mask,
                kSt == step_ws::kStF32 ? kF32 : kBF16, b.h, m);
  }
}

// Warp-units of an item under a mapping (host and device agree: cuda_step.cc uses it).
FP4Q_HD int64_t UnitsOf(int64_t rows, int64_t cols, bool tile) {
  if (tile) return (rows >> 4) * (((cols >> 4) + 1) >> 1);
  return (rows * cols + step_ws::kUnitElems - 1) / step_ws::kUnitElems;
}

// Walks a launch's list: the entry holding warp-unit u (u only grows).
FP4Q_D int Advance(const ListEntry* list, int n_entries, int e, int64_t u) {
  while (e + 1 <= n_entries && list[e + 1].unit_begin <= u) ++e;
  return e;
}

// The slots [begin, end) of the calling warp in a launch of `total_units` warp-units (two
// slots each): every warp owns one contiguous run, so that it changes item rarely.
struct WarpSlots {
  int64_t begin, end;
};
FP4Q_D WarpSlots WarpSlotsOf(int64_t total_units) {
  const int64_t gw = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) >> 5;
  const int64_t nw = (static_cast<int64_t>(gridDim.x) * kThreads) >> 5;
  const int64_t slots = 2 * total_units;
  const int64_t per = (slots + nw - 1) / nw;
  const int64_t begin = gw * per;
  return WarpSlots{begin, begin + per < slots ? begin + per : slots};
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

// Reductions of the replicas (step_decide.cuh), read through L2: in a one-pass step's apply
// (whose last CTA decides) other CTAs' atomics wrote them during the same kernel.
FP4Q_D uint64_t MinCopies(const uint64_t* p) {
  uint64_t m = kNone;
  for (int c = 0; c < step_ws::kAccCopies; ++c) {
    const uint64_t v = __ldcg(p + c);
    m = v < m ? v : m;
  }
  return m;
}
FP4Q_D uint64_t SumCopies(const uint64_t* p) {
  uint64_t s = 0;
  for (int c = 0; c < step_ws::kAccCopies; ++c) s += __ldcg(p + c);
  return s;
}
FP4Q_D float MaxCopies(const uint32_t* p) {
  uint32_t m = 0;
  for (int c = 0; c < step_ws::kAccCopies; ++c) {
    const uint32_t v = __ldcg(p + c);
    m = v > m ? v : m;
  }
  return __uint_as_float(m);
}

}  // namespace fp4q::kernels::cuda::step_dev

#endif  // FP4Q_KERNELS_SRC_CUDA_STEP_DEVICE_CUH_
