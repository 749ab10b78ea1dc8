// The small-M GEMM kernel's integer side (kernels/src/cuda/small_m_layout.h), checked on the host
// without a GPU: the E2M1 pair decode for every nibble value at every position, the E4M3 / E8M0
// scale multipliers for every byte (subnormals included) and the exactness and normality of
// their bf16 products, and the k permutation: a host emulation of the kernel's lanes, fragment
// registers and mma.sync m16n8k16 (PTX ISA fragment layouts) computes C for small shapes through
// the same index maps and must equal the plain product.
#include "cuda/small_m_layout.h"

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "cpu/formats.h"
#include "gtest/gtest.h"

namespace fp4q::kernels {
namespace {

namespace sm = cuda::small_m;
using cpu::E2m1ToFloat;
using cpu::E4m3ToFloat;
using cpu::FloatBits;
using cpu::FloatFromBits;

float Bf16(uint32_t bits16) { return FloatFromBits((bits16 & 0xFFFFu) << 16); }
float Lo(uint32_t w) { return Bf16(w); }
float Hi(uint32_t w) { return Bf16(w >> 16); }

// The kernel's bf16 multiply (RN) where the product is exact: asserts it is.
uint32_t MulExact(uint32_t a, uint32_t b) {
  uint32_t out = 0;
  for (int h = 0; h < 2; ++h) {
    const float p = Bf16(a >> (16 * h)) * Bf16(b >> (16 * h));
    const uint32_t bits = FloatBits(p);
    EXPECT_EQ(bits & 0xFFFFu, 0u) << "inexact bf16 product " << p;
    out |= (bits >> 16) << (16 * h);
  }
  return out;
}

uint32_t ScaleMultiplier(uint32_t x16, int half) {  // as ScaleSplats (without NaN)
  uint32_t h = sm::E4m3PairBits(x16);
  h = MulExact(h, 0x7F007F00u);
  h = MulExact(h, 0x5C005C00u);
  const uint32_t v = (h >> (16 * half)) & 0xFFFFu;
  return v | (v << 16);
}

TEST(SmallMLayoutTest, DecodeWordGivesEveryNibbleTimes2PowMinus126) {
  std::mt19937 rng(1);
  for (uint32_t x = 0; x < 65536; ++x) {
    for (int place = 0; place < 2; ++place) {
      const uint32_t other = rng() & 0xFFFFu;
      const uint32_t w = place == 0 ? (x | (other << 16)) : (other | (x << 16));
      uint32_t pair[4];
      sm::DecodeWord(w, pair);
      for (int e = 0; e < 8; ++e) {
        const uint8_t code = (w >> (4 * e)) & 0xFu;
        const uint32_t reg = pair[e & 3];
        const float got = e < 4 ? Lo(reg) : Hi(reg);
        const float want = std::ldexp(E2m1ToFloat(code), -126);
        ASSERT_EQ(FloatBits(got), FloatBits(want)) << "word " << std::hex << w << " element " << e;
      }
    }
  }
}

TEST(SmallMLayoutTest, E4m3MultipliersAndWeightProductsAreExactAndNormal) {
  for (uint32_t x16 = 0; x16 < 65536; ++x16) {
    const bool nan_lo = (x16 & 0x7Fu) == 0x7Fu, nan_hi = ((x16 >> 8) & 0x7Fu) == 0x7Fu;
    ASSERT_EQ(sm::E4m3PairHasNan(x16), nan_lo || nan_hi) << x16;
    ASSERT_EQ(sm::E4m3PairHasNan(x16 << 16 | 0x7E00u), nan_lo || nan_hi) << x16;
    if (nan_lo || nan_hi) continue;
    for (int half = 0; half < 2; ++half) {
      const uint8_t byte = ((x16 >> (8 * half)) & 0x7Fu);
      const float want = std::ldexp(E4m3ToFloat(byte), 64);
      ASSERT_EQ(Lo(ScaleMultiplier(x16, half)), want) << "scale byte " << int(byte);
    }
  }
  // Every code times every scale byte: e2m1 * sf * 2^-62, exact, normal or zero.
  for (uint32_t byte = 0; byte < 0x7F; ++byte) {
    const uint32_t s = ScaleMultiplier(byte, 0);
    for (uint32_t code = 0; code < 16; ++code) {
      uint32_t pair[4];
      sm::DecodeWord(code | (code << 16), pair);  // nibbles 0 and 4
      const float got = Lo(MulExact(pair[0], s));
      const double want = std::ldexp(double{E2m1ToFloat(code)} * E4m3ToFloat(byte), -62);
      ASSERT_EQ(double{got}, want) << "code " << code << " scale " << byte;
      ASSERT_TRUE(got == 0.0f || std::fabs(got) >= std::ldexp(1.0f, -126));
      if (want != 0.0) ASSERT_EQ(std::signbit(got), code >= 8);
    }
  }
}

TEST(SmallMLayoutTest, E8m0MultipliersTimesE2m1AreExact) {
  for (uint32_t b = 0; b < 255; ++b) {
    const uint32_t s = sm::E8m0Bf16Bits(b);
    ASSERT_EQ(double{Bf16(s)}, std::ldexp(1.0, static_cast<int>(b) - 127)) << b;
    if (b > 251) continue;  // beyond bf16 for 6 (cuda_matmul.cc's documented limit)
    for (uint32_t code = 0; code < 16; ++code) {
      uint32_t pair[4];
      sm::DecodeWord(code, pair);
      const uint32_t e = MulExact(pair[0], 0x7E807E80u);
      const float got = Lo(MulExact(e, s | (s << 16)));
      ASSERT_EQ(double{got}, std::ldexp(double{E2m1ToFloat(code)}, static_cast<int>(b) - 127));
    }
  }
  EXPECT_TRUE(std::isnan(Bf16(sm::E8m0Bf16Bits(255))));
}

// C = A * B^T through the kernel's maps: B rows in 16-row warp tiles, lanes (g, t) holding 32 k
// of rows g and g + 8 per chunk, the pairs of DecodeWord as A-fragment registers, A's prepared
// values at ActSlotK as B-fragment registers, and mma.sync's documented fragment layouts.
// With `core`, A's side is instead read as wgmma reads its shared-memory operand from the
// workspace of LaunchPrepareGemmActCore: token n, logical k 8 half + cc of step i at the
// descriptor's address start + (n / 8) * 256 (stride byte offset) + half * 128 (leading byte
// offset) + (n % 8) * 16 + cc * 2. The workspace is filled as the prepare kernel's threads fill
// it (CoreWordAt, DecodeWord, CorePairStep / CorePairHalf, CoreRowByte), each 2-byte slot
// written once; it must hold the value of k = CoreSlotK(i, half, cc) at CoreRowByte(i, n / 8,
// half, n % 8) + cc * 2 for the product to come out right.
void EmulateAndCompare(int64_t M, int64_t N, int64_t K, std::mt19937& rng, bool core = false) {
  std::vector<uint8_t> a((M * K + 1) / 2), b((N * K + 1) / 2), sa(M * K / 16), sb(N * K / 16);
  for (auto& v : a) v = rng() & 0xFF;
  for (auto& v : b) v = rng() & 0xFF;
  for (auto& v : sa) v = rng() % 0x7F;  // E4M3 bytes, NaN excluded
  for (auto& v : sb) v = rng() % 0x7F;
  auto code = [](const std::vector<uint8_t>& c, int64_t i) { return (c[i / 2] >> (4 * (i % 2))) & 0xF; };
  auto a_val = [&](int64_t m, int64_t k) {  // prepared A: e2m1 * sf * 2^62
    return k < K ? std::ldexp(double{E2m1ToFloat(code(a, m * K + k))} * E4m3ToFloat(sa[m * K / 16 + k / 16]), 62)
                 : 0.0;
  };
  std::vector<double> got(M * N, 0.0);
  const int64_t chunks = (K + 127) / 128;
  for (int64_t n0 = 0; n0 < N; n0 += 16) {
    for (int64_t c = 0; c < chunks; ++c) {
      // Each lane's registers for this chunk: weights wreg[lane][mma i][4], activations
      // areg[lane][tile][i][2].
      double tile_a[8][16][16] = {};  // [i][row][logical k]
      double tile_b[2][8][16][8] = {};  // [tile][i][logical k][col]
      for (int lane = 0; lane < 32; ++lane) {
        const int g = lane / 4, t = lane % 4;
        const int64_t k = c * 128 + 32 * t;
        for (int half = 0; half < 2; ++half) {
          const int64_t n = n0 + g + 8 * half;
          uint32_t words[4] = {0, 0, 0, 0}, x16 = 0;
          if (n < N && k < K) {
            for (int u = 0; u < 4; ++u) {
              if (k + 8 * u >= K) continue;  // the K % 32 == 16 tail: zero
              for (int byte = 0; byte < 4; ++byte) words[u] |= uint32_t{b[(n * K + k) / 2 + 4 * u + byte]} << (8 * byte);
            }
            x16 = sb[n * K / 16 + k / 16] | (k + 16 < K ? uint32_t{sb[n * K / 16 + k / 16 + 1]} << 8 : 0u);
          }
          for (int u = 0; u < 4; ++u) {
            uint32_t pair[4];
            sm::DecodeWord(words[u], pair);
            const uint32_t s = ScaleMultiplier(x16, u >> 1);
            for (int j = 0; j < 4; ++j) pair[j] = MulExact(pair[j], s);
            for (int h = 0; h < 2; ++h) {
              const int i = 2 * u + h;
              const int row = g + 8 * half;
              // a0/a1: (row, 2t, 2t+1) = pair 2h; a2/a3: (row, 2t+8, 2t+9) = pair 2h+1.
              tile_a[i][row][2 * t] = Lo(pair[2 * h]);
              tile_a[i][row][2 * t + 1] = Hi(pair[2 * h]);
              tile_a[i][row][2 * t + 8] = Lo(pair[2 * h + 1]);
              tile_a[i][row][2 * t + 9] = Hi(pair[2 * h + 1]);
            }
          }
        }
        for (int tl = 0; tl < 2; ++tl) {
          const int64_t m = 8 * tl + g;
          for (int i = 0; i < 8; ++i) {
            double v[4] = {0, 0, 0, 0};
            for (int s = 0; s < 4; ++s) {
              if (m < M) v[s] = a_val(m, c * 128 + sm::ActSlotK(i, t, s));
            }
            // b0: (k 2t, 2t+1; col g), b1: (k 2t+8, 2t+9; col g).
            tile_b[tl][i][2 * t][g] = v[0];
            tile_b[tl][i][2 * t + 1][g] = v[1];
            tile_b[tl][i][2 * t + 8][g] = v[2];
            tile_b[tl][i][2 * t + 9][g] = v[3];
          }
        }
      }
      if (core) {
        constexpr int kTile = 16;  // tokens a tile: two token groups
        std::vector<double> ws(8 * kTile * 16, 0.0);  // one chunk, indexed in bf16 units
        std::vector<int> writes(ws.size(), 0);
        for (int64_t idx = 0; idx < kTile * chunks * 16; ++idx) {  // one tile: tc is the chunk
          const sm::CoreWord cw = sm::CoreWordAt(idx, kTile);
          if (cw.tc != c) continue;
          const int64_t m = 8 * cw.group + cw.row;
          const int64_t k0 = c * 128 + 32 * cw.t + 8 * cw.u;
          uint32_t pair[4] = {0, 0, 0, 0};
          if (m < M && k0 < K) {
            uint32_t w = 0;
            for (int byte = 0; byte < 4; ++byte) {
              w |= uint32_t{a[(m * K + k0) / 2 + byte]} << (8 * byte);
            }
            const uint32_t h = FloatBits(std::ldexp(E4m3ToFloat(sa[m * K / 16 + k0 / 16]), 62));
            EXPECT_EQ(h & 0xFFFFu, 0u);
            sm::DecodeWord(w, pair);
            for (int j = 0; j < 4; ++j) {
              pair[j] = MulExact(MulExact(pair[j], 0x7E807E80u), (h >> 16) | (h & 0xFFFF0000u));
            }
          }
          for (int j = 0; j < 4; ++j) {
            const int at = (sm::CoreRowByte(sm::CorePairStep(cw.u, j), cw.group,
                                            sm::CorePairHalf(j), cw.row, kTile) + 4 * cw.t) / 2;
            ws[at] = Lo(pair[j]);
            ws[at + 1] = Hi(pair[j]);
            ++writes[at];
            ++writes[at + 1];
          }
        }
        for (size_t q = 0; q < ws.size(); ++q) ASSERT_EQ(writes[q], 1) << "slot " << q;
        for (int i = 0; i < 8; ++i) {
          for (int n = 0; n < kTile; ++n) {
            for (int half = 0; half < 2; ++half) {
              for (int cc = 0; cc < 8; ++cc) {
                const int at = sm::CoreRowByte(i, n / 8, half, n % 8, kTile) / 2 + cc;
                ASSERT_EQ(ws[at], n < M ? a_val(n, c * 128 + sm::CoreSlotK(i, half, cc)) : 0.0)
                    << "step " << i << " token " << n << " half " << half << " column " << cc;
              }
            }
          }
        }
        for (int i = 0; i < 8; ++i) {
          const int start = i * kTile * 32;  // the descriptor of step i, in bytes
          for (int n = 0; n < kTile; ++n) {
            for (int kk = 0; kk < 16; ++kk) {
              const int byte = start + (n / 8) * 256 + (kk / 8) * 128 + (n % 8) * 16 + (kk % 8) * 2;
              tile_b[n / 8][i][kk][n % 8] = ws[byte / 2];
            }
          }
        }
      }
      for (int tl = 0; tl < 2; ++tl) {
        for (int i = 0; i < 8; ++i) {
          for (int row = 0; row < 16; ++row) {
            for (int col = 0; col < 8; ++col) {
              const int64_t n = n0 + row, m = 8 * tl + col;
              if (n >= N || m >= M) continue;
              for (int kk = 0; kk < 16; ++kk) got[m * N + n] += tile_a[i][row][kk] * tile_b[tl][i][kk][col];
            }
          }
        }
      }
    }
  }
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      double want = 0.0;
      for (int64_t k = 0; k < K; ++k) {
        want += double{E2m1ToFloat(code(a, m * K + k))} * E4m3ToFloat(sa[m * K / 16 + k / 16]) *
                E2m1ToFloat(code(b, n * K + k)) * E4m3ToFloat(sb[n * K / 16 + k / 16]);
      }
      ASSERT_NEAR(got[m * N + n], want, 1e-9 * (std::fabs(want) + 1.0))
          << "M=" << M << " N=" << N << " K=" << K << " m=" << m << " n=" << n;
    }
  }
}

TEST(SmallMLayoutTest, FragmentMapsReproduceThePlainProduct) {
  std::mt19937 rng(7);
  for (int64_t m : {1, 3, 8, 9, 16}) {
    for (int64_t n : {16, 23}) {
      for (int64_t k : {16, 48, 128, 272, 384}) EmulateAndCompare(m, n, k, rng);
    }
  }
}

// The wgmma kernel's A side (CoreSlotK in CoreRowByte's layout, read through its descriptors)
// against the same weight fragments.
TEST(SmallMLayoutTest, CoreMatrixMapsReproduceThePlainProduct) {
  std::mt19937 rng(11);
  for (int64_t m : {1, 7, 9, 16}) {
    for (int64_t n : {16, 23}) {
      for (int64_t k : {16, 48, 128, 272, 384}) EmulateAndCompare(m, n, k, rng, true);
    }
  }
}

}  // namespace
}  // namespace fp4q::kernels
