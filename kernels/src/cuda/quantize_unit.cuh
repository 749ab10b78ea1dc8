// Quantization of one "unit": 32 consecutive elements of a row of the tensor being quantized
// (x for row-wise output, x^T for column-wise), held in registers by one thread. A unit is two
// NVFP4 blocks or one MXFP4 block. For 16x16 NVFP4 tiles the 16 rows of a tile live in 16 lanes
// of one warp whose lane bits (kXorShift .. kXorShift + 3) are the row index within the tile;
// every lane of the warp must call QuantizeUnit (invalid lanes with n_valid = 0).
//
// Per element this costs the E2M1 conversion (device_numerics.cuh), one multiply, one max for
// the block amax, and for SR an eighth of a Philox call.
#ifndef FP4Q_KERNELS_SRC_CUDA_QUANTIZE_UNIT_CUH_
#define FP4Q_KERNELS_SRC_CUDA_QUANTIZE_UNIT_CUH_

#include "device_numerics.cuh"
#include "launch.h"

namespace fp4q::kernels::cuda {

// Per-launch quantization constants, computed by every thread from the global amax.
struct UnitCtx {
  NvGlobal g;      // NVFP4 scaling (map-to-6 or four-over-six's own S_enc)
  float amax;      // the global amax (four-over-six error term)
  float err_div;   // 6 * Emax (four-over-six)
  int scale_sel;
  int mx_rule;
  uint64_t seed;    // SR: the step kernels' SeedKeys (quantize launches pass QuantOptions' keys)
  uint64_t step;
};

FP4Q_D UnitCtx MakeUnitCtx(const QuantOptions& q, float amax) {
  UnitCtx c;
  c.amax = amax;
  c.scale_sel = q.scale_sel;
  c.mx_rule = q.mx_rule;
  c.seed = 0;  // quantize launches pass q.sr_keys; the step kernels set the seed
  c.step = q.step;
  c.err_div = __fmul_rn(6.0f, q.emax);
  c.g = MakeNvGlobal(amax, q.scale_sel == kSelMapTo6 ? 2688.0f : c.err_div);
  return c;
}

// The global record's second float: S_enc (NVFP4) or 1 (MXFP4).
FP4Q_D float GlobalSecond(int fmt, const UnitCtx& c) { return fmt == kFmtMx ? 1.0f : c.g.s_enc; }

struct UnitResult {
  uint32_t codes[4];  // word m: elements 8m .. 8m+7, element e in bits 4*(e%8)
  uint32_t sf[2];     // scale bytes (NVFP4 blocks 0 and 1; MXFP4 block in sf[0])
  float sfv[2];       // their values
};

// Max over lanes differing in lane bits kXorShift .. kXorShift+3 (the 16 rows of a 16x16 tile).
template <int kXorShift>
FP4Q_D float TileMax(float m) {
#pragma unroll
  for (int d = 8; d >= 1; d >>= 1) m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, d << kXorShift));
  return m;
}

// Sum in the tree order of NUMERICS 7 (rows 0-7 + 8-15, then 0-3 + 4-7, ...).
template <int kXorShift>
FP4Q_D float TileTreeSum(float e) {
#pragma unroll
  for (int d = 8; d >= 1; d >>= 1) e = __fadd_rn(e, __shfl_xor_sync(0xFFFFFFFFu, e, d << kXorShift));
  return e;
}

FP4Q_D float BlockAmax16(const float* v) {
  float m = 0.0f;
#pragma unroll
  for (int i = 0; i < 16; ++i) m = fmaxf(m, fabsf(v[i]));
  return m;
}

// The block amax as BlockAmax16 gives it, and whether an element is NaN, from one pass of
// NaN-propagating maxima (the same instruction count as fmaxf's); only a block holding a NaN
// takes the second pass.
FP4Q_D float BlockAmax16Flagged(const float* v, bool* any_nan) {
  float m = 0.0f;
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    float r;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(m), "f"(fabsf(v[i])));
    m = r;
  }
  *any_nan = isnan(m);
  return *any_nan ? BlockAmax16(v) : m;
}

// Byte k of the word: byte `b` of a[k] (k = 0..3), by three byte permutes.
FP4Q_D uint32_t GatherBytes(uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b) {
  const uint32_t sel = b | ((b + 4u) << 4);  // lo byte from the first operand, next from the second
  return __byte_perm(__byte_perm(a0, a1, sel), __byte_perm(a2, a3, sel), 0x5410);
}

// The 8 codes of a granule as one word (element e in bits 4e .. 4e+3); SR draws Philox group
// `group`. Packing by byte permutes: one byte of each element's rounding word is its code (byte
// 0 of the RTN magnitude's float bits, byte 3 of the SR code word) and byte 3 of y carries its
// sign, so the even and the odd elements' bytes are gathered into two words each and merged with
// one shift (8 ALU-pipe operations per 8 elements for the codes, 8 for the signs). A NaN element
// must get code 0x7 whatever its sign: `any_nan` flags the rare granule that needs the fix-up.
// `keys`: Philox round keys (PhiloxKeys from the launch's parameters, read as constant
// operands, or SeedKeys).
template <bool kSr, typename Keys>
FP4Q_D uint32_t Codes8(const float* v, float inv, const UnitCtx& c, const Keys& keys,
                       uint64_t group, bool any_nan) {
  constexpr uint32_t kCodeByte = kSr ? 3u : 0u;
  uint4 r = make_uint4(0u, 0u, 0u, 0u);
  if (kSr) r = SrBits(group, keys, c.step);
  uint32_t m[8], y[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const float ye = __fmul_rn(v[e], inv);
    y[e] = __float_as_uint(ye);
    m[e] = kSr ? E2M1SrCodeWord(ye, SrNoise(r, e)) : __float_as_uint(E2M1RnMagnitude(ye));
  }
  const uint32_t codes = GatherBytes(m[0], m[2], m[4], m[6], kCodeByte) +
                         GatherBytes(m[1], m[3], m[5], m[7], kCodeByte) * 16u;
  const uint32_t signs_even = GatherBytes(y[0], y[2], y[4], y[6], 3);  // sign of 2k at bit 8k+7
  const uint32_t signs_odd = GatherBytes(y[1], y[3], y[5], y[7], 3);   // sign of 2k+1 at 8k+7
  uint32_t acc = codes | ((signs_even >> 4) & 0x08080808u) | (signs_odd & 0x80808080u);
  if (any_nan) {  // NaN elements: code 0x7, no sign
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      if (isnan(v[e])) acc &= ~(8u << (4 * e));
    }
  }
  return acc;
}

// The same where no block amax flagged the NaN: the sum of |v| (NaN if any element is).
template <bool kSr, typename Keys>
FP4Q_D uint32_t Codes8(const float* v, float inv, const UnitCtx& c, const Keys& keys,
                       uint64_t group) {
  float probe = 0.0f;
#pragma unroll
  for (int e = 0; e < 8; ++e) probe = __fadd_rn(probe, fabsf(v[e]));
  return Codes8<kSr>(v, inv, c, keys, group, isnan(probe));
}

// Codes of 16 values with one multiplier: two granules, SR groups sr_group0 and sr_group0 + 1;
// any_nan: one of the 16 is NaN (BlockAmax16Flagged).
template <bool kSr>
FP4Q_D void Codes16(const float* v, float inv, const UnitCtx& c, const PhiloxKeys& keys,
                    uint64_t sr_group0, bool any_nan, uint32_t* w0, uint32_t* w1) {
  *w0 = Codes8<kSr>(v, inv, c, keys, sr_group0, any_nan);
  *w1 = Codes8<kSr>(v + 8, inv, c, keys, sr_group0 + 1, any_nan);
}

// Four-over-six error of one candidate over 16 values (NUMERICS 7), sequential f32 sum.
FP4Q_D float FourOverSixError(const float* v, uint32_t w0, uint32_t w1, float sfv,
                              const UnitCtx& c) {
  float err = 0.0f;
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const uint32_t code = ((i < 8 ? w0 : w1) >> (4 * (i & 7))) & 0xFu;
    const float dq = __fdiv_rn(__fmul_rn(__fmul_rn(E2M1Value(code), sfv), c.amax), c.err_div);
    const float d = __fsub_rn(dq, v[i]);
    err = __fadd_rn(err, c.scale_sel == kSelMse ? __fmul_rn(d, d) : fabsf(d));
  }
  return err;
}

// One NVFP4 block of 16 values with block amax `bamax` (already tile-reduced for 16x16);
// any_nan: one of the 16 values is NaN.
template <bool kSr, bool kTile, int kXorShift>
FP4Q_D void QuantizeNvBlock(const float* v, float bamax, bool any_nan, const UnitCtx& c,
                            const PhiloxKeys& keys, uint64_t sr_group0, uint32_t* w0,
                            uint32_t* w1, uint32_t* sf, float* sfv) {
  if (c.scale_sel == kSelMapTo6) {
    *sf = E4M3Rn(__fmul_rn(bamax, c.g.t));
    *sfv = E4M3Value(*sf);
    Codes16<kSr>(v, InvScale(*sfv, c.g.s_dec), c, keys, sr_group0, any_nan, w0, w1);
    return;
  }
  // Four-over-six (round-to-nearest only).
  const float base = __fmul_rn(__fdiv_rn(bamax, 6.0f), c.g.s_enc);
  const uint32_t sf6 = E4M3Rn(fminf(base, 448.0f));
  const uint32_t sf4 = E4M3Rn(fminf(__fmul_rn(base, 1.5f), 448.0f));
  const float v6 = E4M3Value(sf6);
  const float v4 = E4M3Value(sf4);
  uint32_t a0, a1, b0, b1;
  Codes16<false>(v, InvScale(v6, c.g.s_dec), c, keys, 0, any_nan, &a0, &a1);
  Codes16<false>(v, InvScale(v4, c.g.s_dec), c, keys, 0, any_nan, &b0, &b1);
  float e6 = FourOverSixError(v, a0, a1, v6, c);
  float e4 = FourOverSixError(v, b0, b1, v4, c);
  if (kTile) {
    e6 = TileTreeSum<kXorShift>(e6);
    e4 = TileTreeSum<kXorShift>(e4);
  }
  const bool four = e4 < e6;
  *w0 = four ? b0 : a0;
  *w1 = four ? b1 : a1;
  *sf = four ? sf4 : sf6;
  *sfv = four ? v4 : v6;
}

// Quantizes a unit. sr_index0 is the linear index of v[0] in the tensor being quantized
// (a multiple of 16). kFmt: kFmtNv1x16, kFmtNv16x16 or kFmtMx.
template <int kFmt, bool kSr, int kXorShift>
FP4Q_D void QuantizeUnit(const float* v, int n_valid, const UnitCtx& c, const PhiloxKeys& keys,
                         uint64_t sr_index0, UnitResult* r) {
  const uint64_t g0 = sr_index0 >> 3;
  if (kFmt == kFmtMx) {
    bool nan0, nan1;
    const float bamax = fmaxf(BlockAmax16Flagged(v, &nan0), BlockAmax16Flagged(v + 16, &nan1));
    const uint32_t b = MxScaleByte(bamax, c.mx_rule);
    const float mul = E8M0Inverse(b);
    r->sf[0] = b;
    r->sfv[0] = E8M0Value(b);
    r->sf[1] = 0u;
    r->sfv[1] = 0.0f;
    Codes16<kSr>(v, mul, c, keys, g0, nan0, &r->codes[0], &r->codes[1]);
    Codes16<kSr>(v + 16, mul, c, keys, g0 + 2, nan1, &r->codes[2], &r->codes[3]);
    return;
  }
  constexpr bool kTile = kFmt == kFmtNv16x16;
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    bool any_nan = false;
    float bamax = n_valid > 16 * j ? BlockAmax16Flagged(v + 16 * j, &any_nan) : 0.0f;
    if (kTile) bamax = TileMax<kXorShift>(bamax);
    if (!kTile && n_valid <= 16 * j) {
      r->codes[2 * j] = r->codes[2 * j + 1] = 0u;
      r->sf[j] = 0u;
      r->sfv[j] = 0.0f;
      continue;
    }
    QuantizeNvBlock<kSr, kTile, kXorShift>(v + 16 * j, bamax, any_nan, c, keys, g0 + 2 * j,
                                           &r->codes[2 * j], &r->codes[2 * j + 1], &r->sf[j],
                                           &r->sfv[j]);
  }
}

// DQ of element e of a quantized unit (f32), NUMERICS 2 "Dequantize".
template <int kFmt>
FP4Q_D float UnitDq(const UnitResult& r, int e, const UnitCtx& c) {
  const uint32_t code = (r.codes[e >> 3] >> (4 * (e & 7))) & 0xFu;
  const float p = __fmul_rn(E2M1Value(code), r.sfv[kFmt == kFmtMx ? 0 : (e >> 4)]);
  return kFmt == kFmtMx ? p : __fmul_rn(p, c.g.s_dec);
}

// ---------------------------------------------------------------- loads and stores

// n (16 or 32) elements at p (16-byte aligned) widened to f32.
template <typename T>
FP4Q_D void LoadElems(const T* p, int n, float* v);

template <>
FP4Q_D void LoadElems<float>(const float* p, int n, float* v) {
  const float4* q = reinterpret_cast<const float4*>(p);
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    if (k < 4 || n > 16) {
      const float4 f = q[k];
      v[4 * k] = f.x;
      v[4 * k + 1] = f.y;
      v[4 * k + 2] = f.z;
      v[4 * k + 3] = f.w;
    } else {
      v[4 * k] = v[4 * k + 1] = v[4 * k + 2] = v[4 * k + 3] = 0.0f;
    }
  }
}

template <>
FP4Q_D void LoadElems<__nv_bfloat16>(const __nv_bfloat16* p, int n, float* v) {
  const uint4* q = reinterpret_cast<const uint4*>(p);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    uint4 w = make_uint4(0u, 0u, 0u, 0u);
    if (k < 2 || n > 16) w = q[k];
    v[8 * k] = Bf16Lo(w.x);
    v[8 * k + 1] = Bf16Hi(w.x);
    v[8 * k + 2] = Bf16Lo(w.y);
    v[8 * k + 3] = Bf16Hi(w.y);
    v[8 * k + 4] = Bf16Lo(w.z);
    v[8 * k + 5] = Bf16Hi(w.z);
    v[8 * k + 6] = Bf16Lo(w.w);
    v[8 * k + 7] = Bf16Hi(w.w);
  }
}

// The `count` 16-byte words at w widened to f32 at v (8 bf16 or 4 f32 values per word).
template <typename T>
FP4Q_D void WidenWords(const uint4* w, int count, float* v) {
#pragma unroll
  for (int k = 0; k < count; ++k) {
    const uint32_t u[4] = {w[k].x, w[k].y, w[k].z, w[k].w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if constexpr (sizeof(T) == 2) {
        v[8 * k + 2 * j] = Bf16Lo(u[j]);
        v[8 * k + 2 * j + 1] = Bf16Hi(u[j]);
      } else {
        v[4 * k + j] = __uint_as_float(u[j]);
      }
    }
  }
}

// v[i] += the f32 residual word i of the `count` 16-byte words at r (4 values a word; one
// rounding each, the sum error feedback quantizes).
FP4Q_D void AddResidualWords(const uint4* r, int count, float* v) {
#pragma unroll
  for (int k = 0; k < count; ++k) {
    v[4 * k] = __fadd_rn(v[4 * k], __uint_as_float(r[k].x));
    v[4 * k + 1] = __fadd_rn(v[4 * k + 1], __uint_as_float(r[k].y));
    v[4 * k + 2] = __fadd_rn(v[4 * k + 2], __uint_as_float(r[k].z));
    v[4 * k + 3] = __fadd_rn(v[4 * k + 3], __uint_as_float(r[k].w));
  }
}

// n (16 or 32) f32 values to p, as f32 or RN bf16.
FP4Q_D void StoreElems(void* p, int dtype, int n, const float* v) {
  if (dtype == kF32) {
    float4* q = reinterpret_cast<float4*>(p);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      if (k < 4 || n > 16) q[k] = make_float4(v[4 * k], v[4 * k + 1], v[4 * k + 2], v[4 * k + 3]);
    }
  } else {
    uint4* q = reinterpret_cast<uint4*>(p);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if (k < 2 || n > 16) {
        q[k] = make_uint4(PackBf16x2(v[8 * k], v[8 * k + 1]), PackBf16x2(v[8 * k + 2], v[8 * k + 3]),
                          PackBf16x2(v[8 * k + 4], v[8 * k + 5]),
                          PackBf16x2(v[8 * k + 6], v[8 * k + 7]));
      }
    }
  }
}

// Writes the unit's codes and scales for row `row`, first element `c0`, of a quantized
// [rows, cols] tensor. Codes go out as one 16-byte store when the row length keeps them aligned
// (cols % 32 == 0), else as 8-byte stores; an NVFP4 unit's two scale bytes are adjacent in both
// layouts and go out as one 2-byte store when aligned.
template <int kFmt>
FP4Q_D void StoreUnit(const QOut& o, int64_t rows, int64_t cols, int64_t row, int64_t c0,
                      int n_valid, const UnitResult& r) {
  (void)rows;
  uint8_t* cp = o.codes + ((row * cols + c0) >> 1);
  if (n_valid > 16 && (cols & 31) == 0) {
    *reinterpret_cast<uint4*>(cp) = make_uint4(r.codes[0], r.codes[1], r.codes[2], r.codes[3]);
  } else {
    reinterpret_cast<uint2*>(cp)[0] = make_uint2(r.codes[0], r.codes[1]);
    if (n_valid > 16) reinterpret_cast<uint2*>(cp)[1] = make_uint2(r.codes[2], r.codes[3]);
  }
  if (kFmt == kFmtMx) {
    const int64_t sc = cols >> 5;
    o.scales[ScaleOffset(row, c0 >> 5, sc, o.swizzled)] = static_cast<uint8_t>(r.sf[0]);
  } else {
    const int64_t sc = cols >> 4;
    const int64_t at = ScaleOffset(row, c0 >> 4, sc, o.swizzled);
    if (n_valid > 16 && (at & 1) == 0) {
      *reinterpret_cast<uint16_t*>(o.scales + at) = static_cast<uint16_t>(r.sf[0] | (r.sf[1] << 8));
    } else {
      o.scales[at] = static_cast<uint8_t>(r.sf[0]);
      if (n_valid > 16) {
        o.scales[ScaleOffset(row, (c0 >> 4) + 1, sc, o.swizzled)] = static_cast<uint8_t>(r.sf[1]);
      }
    }
  }
}

FP4Q_D float WarpMax(float m) {
#pragma unroll
  for (int d = 16; d >= 1; d >>= 1) m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, d));
  return m;
}

// Max of non-negative floats into *dst (zeroed before the launch).
FP4Q_D void AtomicMaxNonNegative(float* dst, float m) {
  atomicMax(reinterpret_cast<unsigned int*>(dst), __float_as_uint(m));
}

// Warp-reduced max of m, one atomic per warp (every lane of the warp must call it).
FP4Q_D void WarpAtomicMax(float* dst, float m) {
  m = WarpMax(m);
  if ((threadIdx.x & 31) == 0 && m > 0.0f) AtomicMaxNonNegative(dst, m);
}

}  // namespace fp4q::kernels::cuda

#endif  // FP4Q_KERNELS_SRC_CUDA_QUANTIZE_UNIT_CUH_
