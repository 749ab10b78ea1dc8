// Element-level numerics of docs/NUMERICS.md for the CUDA kernels: E2M1 rounding (nearest and
// stochastic), E4M3/E8M0 scales, Philox4x32-10, the 16-point Hadamard butterfly and the
// swizzled scale layout. Every f32 operation is written with an explicit _rn intrinsic (the
// module is built with --fmad=false as well), so the CPU reference's operation order is kept.
//
// Cost notes (Hopper has no E2M1 convert): the E2M1 magnitude takes 3 FMA-pipe operations and
// 3 min/max per element (RTN); with stochastic rounding 3 FMA-pipe operations, 2 min/max, a
// byte permute and an add, plus an eighth of a Philox4x32-10 call (about 43 instructions per 8
// elements).
#ifndef FP4Q_KERNELS_SRC_CUDA_DEVICE_NUMERICS_CUH_
#define FP4Q_KERNELS_SRC_CUDA_DEVICE_NUMERICS_CUH_

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cfloat>
#include <cstdint>

#include "cuda/launch.h"

namespace fp4q::kernels::cuda {

#define FP4Q_HD __host__ __device__ __forceinline__
#define FP4Q_D __device__ __forceinline__

constexpr float kC6 = 0x1.555556p-3f;  // RN(1/6), bits 0x3E2AAAAB
constexpr uint32_t kDefaultRhtSigns = 0xD7E8u;

// ---------------------------------------------------------------- Philox4x32-10

// Rounds kFirst..9 of Random123 / cuRAND Philox4x32-10 on counter state c; the round keys
// k.K0(i), k.K1(i) (PhiloxKeys or SeedKeys, launch.h).
template <int kFirst, typename Keys>
FP4Q_HD uint4 PhiloxRounds(uint4 c, const Keys& k) {
#pragma unroll
  for (int i = kFirst; i < 10; ++i) {
    const uint32_t hi0 = PhiloxMulHi(kPhiloxM0, c.x);
    const uint32_t lo0 = kPhiloxM0 * c.x;
    const uint32_t hi1 = PhiloxMulHi(kPhiloxM1, c.z);
    const uint32_t lo1 = kPhiloxM1 * c.z;
    c = make_uint4(hi1 ^ c.y ^ k.K0(i), lo1, hi0 ^ c.w ^ k.K1(i), lo0);
  }
  return c;
}

// Philox4x32-10 with 10 rounds. ctr = (c0, c1, c2, c3).
template <typename Keys>
FP4Q_HD uint4 Philox4x32_10(uint4 c, const Keys& k) {
  return PhiloxRounds<0>(c, k);
}

// The 8 x 16 random bits of elements 8j .. 8j+7 (NUMERICS 4): counter (lo j, hi j, lo step,
// hi step), key (lo seed, hi seed) given by its round keys.
template <typename Keys>
FP4Q_HD uint4 SrBits(uint64_t j, const Keys& keys, uint64_t step) {
  return Philox4x32_10(make_uint4(static_cast<uint32_t>(j), static_cast<uint32_t>(j >> 32),
                                  static_cast<uint32_t>(step), static_cast<uint32_t>(step >> 32)),
                       keys);
}

// SrBits for j < 2^32 with the step and round keys of one launch, whose first two rounds'
// parts that do not depend on j are folded into four words (philox_head.h, computed once on the
// host): the same bits as SrBits.
struct HeadedKeys {
  const PhiloxKeys& keys;
  const PhiloxHead& head;
};

FP4Q_HD uint4 SrBits(uint64_t j, const HeadedKeys& k, uint64_t /*step: in k.head*/) {
  const PhiloxState c = PhiloxHeadRounds(static_cast<uint32_t>(j), k.head);
  return PhiloxRounds<2>(make_uint4(c.x, c.y, c.z, c.w), k.keys);
}

// ---------------------------------------------------------------- E2M1
//
// The per-element hot path, in as few operations as each rounding allows.
//
// Round-to-nearest: Hopper issues FADD/FMUL/FFMA/IMAD at twice the rate of the integer/logic
// pipe (LOP3, IADD3, SHF, FMNMX), so it rounds with float adds instead of bit manipulation. For
// a = min(|y|, 6) the three candidates
//   RN(2a) (step 0.5 below 2), 2 + RN(a) (step 1 in [2, 4)), 4 + RN(a / 2) (step 2 from 4)
// each computed as a magic add onto 2^23 (whose ulp is 1), have as their minimum exactly the
// E2M1 magnitude code of NUMERICS 1 (the right binade's candidate is never larger than the
// others; ties to even are preserved by the even offsets). The float returned has bits
// kRnMagBase + code.
inline constexpr uint32_t kRnMagBase = 0x4B000000u;  // bits of 2^23
FP4Q_D float E2M1RnMagnitude(float y) {
  const float a = fminf(fabsf(y), 6.0f);  // NaN -> 6
  const float s1 = __fmaf_rn(a, 2.0f, 0x1p23f);
  const float s2 = __fadd_rn(a, 0x1p23f + 2.0f);
  const float s3 = __fmaf_rn(a, 0.5f, 0x1p23f + 4.0f);
  return fminf(fminf(s1, s2), s3);
}

// Stochastic rounding (NUMERICS 4) on the f32 bits, with integer adds. For a = min(|y|, 6) let
// lo be the code of the largest grid value <= a. Then m = max(2a, RU(1 + a)) has bits
// 0x3F800000 + K, K = lo * 2^22 + n, where the element rounds up iff 64 * r16 < n:
//   a >= 1: m = 2a, K = bits(a) - 0x3F000000 and n is a's lower 22 mantissa bits (E2M1 keeps
//           the top one), f = n / 2^22, so "r16 < f * 65536" is "64 * r16 < n";
//   a < 1:  m = RU(1 + a), K = ceil(a * 2^23) (step 0.5 from 0), n = ceil(f * 2^22), and
//           64 * r16 < f * 2^22 iff 64 * r16 < n.
// (2a is exact; RU(1 + a) <= 2a from 1 up and > 2a below.) Adding 2^22 - 1 - 64 * r16 to K
// carries into bit 22 exactly when the element rounds up: the code is (K + 2^22 - 1 - 64 r16)
// >> 22. The word returned is that sum times 4, the code in byte 3 and bits 27-31 zero:
// 4 * bits(m) + kSrCodeBias - (r16 << 8), computed as 4 * bits(m) - noise with noise =
// (r16 << 8) - kSrCodeBias from SrNoise (one IMAD with a negated addend). NaN gives code 7.
inline constexpr uint32_t kSrCodeBias = 4u * (0x3FFFFFu - 0x3F800000u);  // 0x02FFFFFC (wraps)
FP4Q_D uint32_t E2M1SrCodeWord(float y, uint32_t noise) {
  const float a = fminf(fabsf(y), 6.0f);
  const float m = fmaxf(__fmul_rn(a, 2.0f), __fadd_ru(a, 1.0f));
  return __float_as_uint(m) * 4u - noise;
}

// (r16 << 8) - kSrCodeBias (mod 2^32) for element e of a Philox group, from the group's words
// w: -kSrCodeBias is 0xFD000004, bytes 04 00 00 FD from the low end, and r16 << 8 fills the two
// zero bytes without a carry, so the noise is one PRMT of w into that frame.
inline constexpr uint32_t kSrNoiseFrame = 0xFD000004u;
static_assert(kSrNoiseFrame + kSrCodeBias == 0u, "SrNoise frame");
FP4Q_HD uint32_t SrNoise(const uint4& w, int e) {
  const uint32_t word = (e >> 1) == 0 ? w.x : (e >> 1) == 1 ? w.y : (e >> 1) == 2 ? w.z : w.w;
#ifdef __CUDA_ARCH__
  return __byte_perm(word, kSrNoiseFrame, (e & 1) ? 0x7324 : 0x7104);
#else
  return kSrNoiseFrame | (((e & 1) ? (word >> 16) : (word & 0xFFFFu)) << 8);
#endif
}

// Value of an E2M1 code (0..15), exact: the 3 magnitude bits placed as an f32 with exponent
// field e and mantissa bit m are the value times 2^-126.
FP4Q_D float E2M1Value(uint32_t code) {
  const uint32_t bits = ((code & 7u) << 22) | ((code & 8u) << 28);
  return __fmul_rn(__uint_as_float(bits), 0x1p126f);
}

// ---------------------------------------------------------------- scales

// E4M3 round-to-nearest-even, saturating at 448; u >= 0 (NUMERICS 2 B3).
FP4Q_D uint32_t E4M3Rn(float u) {
  return static_cast<uint32_t>(__nv_cvt_float_to_fp8(u, __NV_SATFINITE, __NV_E4M3));
}

// Value of an E4M3 byte; 0x7F/0xFF give NaN.
FP4Q_D float E4M3Value(uint32_t b) {
  const uint32_t bits = ((b & 0x80u) << 24) | ((b & 0x7Fu) << 20);
  const float v = __fmul_rn(__uint_as_float(bits), 0x1p120f);
  return (b & 0x7Fu) == 0x7Fu ? __uint_as_float(0x7FC00000u) : v;
}

// 2^(b-127) of an E8M0 byte; 255 gives NaN.
FP4Q_D float E8M0Value(uint32_t b) {
  if (b == 255u) return __uint_as_float(0x7FC00000u);
  return __uint_as_float(b == 0u ? 0x00400000u : (b << 23));
}

// 2^(127-b) for b in 0..254 (the MXFP4 element multiplier).
FP4Q_D float E8M0Inverse(uint32_t b) {
  return __uint_as_float(b == 254u ? 0x00400000u : ((254u - b) << 23));
}

// MXFP4 scale byte of a block amax (DESIGN "MXFP4 RCEIL" / "FLOOR"), bamax >= 0 or NaN (a max
// of magnitudes), without branches: the byte is the clamped exponent + 127.
//   RCEIL: ceil(log2 p) of p = RN(bamax / 6) is the f32 exponent field of p's bits plus one
//     unless the mantissa is zero, which adding 0x7FFFFF to the bits carries in (infinity and
//     NaN land at 255 or 256, clamped to 254); every p <= 2^-127 (zero and the subnormals up
//     to it) clamps to byte 0, the subnormals above it give 2^-126 (byte 1), as the carry does.
//   FLOOR: floor(log2 bamax) - 2 is the exponent field - 129 for normal bamax; zero and the
//     subnormals clamp to byte 0, infinity and NaN give 253.
// The host reference (cpu::MxScaleByte: floor(log2), a power-of-two test) gives the same byte
// for every such input: tests/kernels/mx_scale_bits_test.cc, which writes this form out in
// host arithmetic (all 2^31 of them with FP4Q_MX_EXHAUSTIVE=1).
FP4Q_D uint32_t MxScaleByte(float bamax, int rule) {
  if (rule == 0) {  // RCEIL
    const uint32_t bits = __float_as_uint(__fmul_rn(bamax, kC6)) & 0x7FFFFFFFu;
    const uint32_t up = (bits + 0x7FFFFFu) >> 23;
    return bits <= 0x400000u ? 0u : min(up, 254u);
  }
  const int e = static_cast<int>((__float_as_uint(bamax) & 0x7FFFFFFFu) >> 23) - 2;  // FLOOR
  return static_cast<uint32_t>(max(e, 0));
}

// NVFP4 global scale (NUMERICS 2 G2/G3, and 7 for four-over-six with emax6 = 6 * Emax).
struct NvGlobal {
  float s_enc;
  float s_dec;
  float t;  // RN(S_enc * c6)
};

FP4Q_D float SEncOf(float amax, float emax6) {
  float s = fminf(__fdiv_rn(emax6, amax), FLT_MAX);
  if (amax == 0.0f || s == 0.0f || isinf(amax)) s = 1.0f;
  return s;
}

FP4Q_D NvGlobal MakeNvGlobal(float amax, float emax6) {
  NvGlobal g;
  g.s_enc = SEncOf(amax, emax6);
  g.s_dec = __frcp_rn(g.s_enc);
  g.t = __fmul_rn(g.s_enc, kC6);
  return g;
}

// inv = min(RN(1 / RN(float(sf) * S_dec)), FLT_MAX) (B4).
FP4Q_D float InvScale(float sf, float s_dec) {
  return fminf(__frcp_rn(__fmul_rn(sf, s_dec)), FLT_MAX);
}

// Byte offset of scale (r, c) in the swizzled layout (NUMERICS 3); scale_cols4 = C' / 4.
FP4Q_HD int64_t SwizzleOffset(int64_t r, int64_t c, int64_t scale_cols4) {
  return ((r >> 7) * scale_cols4 + (c >> 2)) * 512 + (r & 31) * 16 + ((r >> 5) & 3) * 4 + (c & 3);
}

FP4Q_HD int64_t ScaleOffset(int64_t r, int64_t c, int64_t scale_cols, bool swizzled) {
  return swizzled ? SwizzleOffset(r, c, (scale_cols + 3) / 4) : r * scale_cols + c;
}

// ---------------------------------------------------------------- bf16 and RHT

FP4Q_D float Bf16Lo(uint32_t w) { return __uint_as_float(w << 16); }
FP4Q_D float Bf16Hi(uint32_t w) { return __uint_as_float(w & 0xFFFF0000u); }
FP4Q_D float RoundBf16(float f) { return __bfloat162float(__float2bfloat16_rn(f)); }
FP4Q_D uint32_t PackBf16x2(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// 16-point Hadamard butterfly (stages of width 1, 2, 4, 8), then * 0.25 (NUMERICS 6).
FP4Q_D void Butterfly16(float* v) {
#pragma unroll
  for (int w = 1; w < 16; w <<= 1) {
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      if ((i & w) == 0) {
        const float a = v[i];
        const float b = v[i + w];
        v[i] = __fadd_rn(a, b);
        v[i + w] = __fsub_rn(a, b);
      }
    }
  }
#pragma unroll
  for (int i = 0; i < 16; ++i) v[i] = __fmul_rn(v[i], 0.25f);
}

// Multiplies by the signs (exact); a multiply by +-1 issues on the FMA pipe, an XOR would not.
FP4Q_D void ApplySigns16(float* v, uint32_t signs) {
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    v[i] = __fmul_rn(v[i], __uint_as_float(0x3F800000u | ((signs << (31 - i)) & 0x80000000u)));
  }
}

// Forward transform of 16 values in place; bf16 inputs are rounded back to bf16 (RN, two
// values per convert).
FP4Q_D void Rht16(float* v, uint32_t signs, bool round_bf16) {
  ApplySigns16(v, signs);
  Butterfly16(v);
  if (round_bf16) {
#pragma unroll
    for (int i = 0; i < 16; i += 2) {
      const uint32_t pair = PackBf16x2(v[i], v[i + 1]);
      v[i] = Bf16Lo(pair);
      v[i + 1] = Bf16Hi(pair);
    }
  }
}

}  // namespace fp4q::kernels::cuda

#endif  // FP4Q_KERNELS_SRC_CUDA_DEVICE_NUMERICS_CUH_
