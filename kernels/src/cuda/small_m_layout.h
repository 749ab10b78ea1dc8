// The integer side of matmul_small_m.cu, shared with a host test (tests/kernels/
// small_m_layout_test.cc) that checks it without a GPU: how a lane turns a 32-bit word of B's
// E2M1 codes into bf16x2 MMA operands, how scale bytes become bf16 multipliers, and which k each
// MMA fragment register holds. Plain C++ (no CUDA headers), usable from host and device.
//
// Fragment map (mma.sync m16n8k16, "swap AB": B's rows are the MMA's M dimension, A's rows its
// n8 columns). Per 128-k chunk, lane (g = lane / 4, t = lane % 4) owns k = 32t .. 32t + 31 of
// weight rows g and g + 8 (one 16-byte load each), i.e. code words u = 0..3 of 8 codes. Word u
// feeds MMAs i = 2u and 2u + 1; MMA i's weight registers for a row are the pairs
// j0 = 2 (i & 1) and j0 + 1 of that word, where pair j holds nibbles j (low half) and j + 4
// (high half). The activation operand of lane (g, t) for MMA i holds column m = g at the same k:
// b0 = (k of pair j0), b1 = (k of pair j0 + 1), i.e. the four k of ActSlotK(i, t, 0..3).
#ifndef FP4Q_KERNELS_SRC_CUDA_SMALL_M_LAYOUT_H_
#define FP4Q_KERNELS_SRC_CUDA_SMALL_M_LAYOUT_H_

#include <cstdint>

#ifdef __CUDACC__
#define FP4Q_SMALL_M_HD __host__ __device__ __forceinline__
#else
#define FP4Q_SMALL_M_HD inline
#endif

namespace fp4q::kernels::cuda::small_m {

// The bits of pair j that come from the magnitudes (e1 e0 m at bf16 bits [8:6], [24:22]).
inline constexpr uint32_t kMagMask = 0x01C001C0u;

FP4Q_SMALL_M_HD uint32_t BytePerm(uint32_t x, uint32_t y, uint32_t s) {
#ifdef __CUDA_ARCH__
  return __byte_perm(x, y, s);
#else
  const uint64_t v = (static_cast<uint64_t>(y) << 32) | x;
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) {
    const uint32_t sel = (s >> (4 * i)) & 7u;  // no sign-replicate mode used here
    r |= static_cast<uint32_t>((v >> (8 * sel)) & 0xFFu) << (8 * i);
  }
  return r;
#endif
}

// The four pairs of a code word as bf16x2 bits, each value times 2^-126: magnitude bits e1 e0 m
// land on bf16 bits [8:6] (exponent e, top mantissa bit m: 2^(e-127) (1 + m/2) = e2m1 * 2^-126
// for e > 0, and the subnormal m * 2^-127 for e = 0), the sign on bit 15 (31 in the high half).
// One shifted copy of the word supplies the magnitude bits and one shifted sign-only copy the
// signs; the sign copies carry other nibbles' signs only inside kMagMask (bits 7 and 23) or
// shifted out, so a single select (one LOP3) merges them. Per word: 7 logic ops (2 sign masks,
// 1 byte permute, 4 selects) and 7 shifts (IMAD-able), for 8 elements.
// (a & kMagMask) | (b & ~kMagMask) in one LOP3. Written as PTX on the device: given plain C,
// ptxas folds the sign masks into the select and emits two LOP3s per pair instead.
FP4Q_SMALL_M_HD uint32_t SelectMag(uint32_t a, uint32_t b) {
#ifdef __CUDA_ARCH__
  uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, 0xE4;" : "=r"(r) : "r"(a), "r"(b), "r"(kMagMask));
  return r;
#else
  return (a & kMagMask) | (b & ~kMagMask);
#endif
}

// The sign words' shifts are multiplications by `sh.m4` = 16, `sh.m8` = 256, `sh.m12` = 4096,
// which the kernel takes as arguments so that the compiler cannot see their values: with
// constant shifts ptxas moves each sign mask behind its shift (one mask per pair instead of one
// per two pairs).
struct SignShifts {
  uint32_t m4 = 16u, m8 = 256u, m12 = 4096u;
};

FP4Q_SMALL_M_HD void DecodeWord(uint32_t w, uint32_t pair[4], SignShifts sh = SignShifts()) {
  const uint32_t s02 = w & 0x08080808u;            // signs of nibbles 0, 2, 4, 6
  const uint32_t s13 = w & 0x80808080u;            // signs of nibbles 1, 3, 5, 7
  const uint32_t x = BytePerm(w, 0u, 0x2301u);     // bytes 1 0 3 2: nibbles 2, 3, 6, 7 -> 0, 1, 4, 5
  pair[0] = SelectMag(w << 6, s02 * sh.m12);
  pair[1] = SelectMag(w << 2, s13 * sh.m8);
  pair[2] = SelectMag(x << 6, s02 * sh.m4);
  pair[3] = SelectMag(x << 2, s13);
}

// Offset (0..127) in its 128-k chunk of activation slot s (0..3) of lane t for MMA i: slots 0, 1
// are b0 (low, high half), slots 2, 3 are b1.
FP4Q_SMALL_M_HD int ActSlotK(int i, int t, int s) {
  const int j0 = 2 * (i & 1);
  const int j = j0 + (s >> 1);          // pair
  return 32 * t + 8 * (i >> 1) + j + 4 * (s & 1);
}

// The same k order for wgmma (matmul_wgmma.cu), whose activation operand sits in shared memory
// as 8 x 8 core matrices of bf16: step i's 16 k of a token are two core-matrix rows, k column
// c = 8 half + cc holding the k that lane t = cc / 2 pairs with in its weight registers (the
// m16n8k16 B fragment's slot 2 half + cc % 2).
FP4Q_SMALL_M_HD int CoreSlotK(int i, int half, int cc) {
  return ActSlotK(i, cc >> 1, 2 * half + (cc & 1));
}

// Where DecodeWord's pair j of lane t's word u (k = 32 t + 8 u + j and + j + 4) lands in that
// workspace: step CorePairStep(u, j), half CorePairHalf(j), columns cc = 2t (the low half) and
// 2t + 1 (the high half). So CoreSlotK(CorePairStep(u, j), CorePairHalf(j), 2t + h) is
// 32 t + 8 u + j + 4 h.
FP4Q_SMALL_M_HD int CorePairStep(int u, int j) { return 2 * u + (j >> 1); }
FP4Q_SMALL_M_HD int CorePairHalf(int j) { return j & 1; }

// The word of A's codes that thread idx of the prepare kernel (LaunchPrepareGemmActCore) decodes:
// tile-and-chunk tc = tile * chunks + chunk, token 8 group + row of the tile, word (t, u) of the
// chunk. t varies fastest, then row: a warp covers one group's 8 tokens for one u.
struct CoreWord {
  int64_t tc;
  int group, row, u, t;
};
FP4Q_SMALL_M_HD CoreWord CoreWordAt(int64_t idx, int tile_rows) {
  CoreWord w;
  w.t = static_cast<int>(idx & 3);
  w.row = static_cast<int>((idx >> 2) & 7);
  w.u = static_cast<int>((idx >> 5) & 3);
  const int64_t rest = idx >> 7;  // tc * groups + group
  const int groups = tile_rows >> 3;
  w.tc = rest / groups;
  w.group = static_cast<int>(rest - w.tc * groups);
  return w;
}

// Byte offset, within one token tile's 128-k chunk of that workspace, of the core-matrix row
// holding token 8 group + row's k columns 8 half .. 8 half + 7 of step i: the layout the wgmma
// descriptors describe (128 bytes from one half to the other, 256 from one group of 8 tokens
// to the next, tile_rows * 32 bytes a step).
FP4Q_SMALL_M_HD int CoreRowByte(int i, int group, int half, int row, int tile_rows) {
  return i * tile_rows * 32 + group * 256 + half * 128 + row * 16;
}

// Two NVFP4 scale bytes (low byte: block 2t, next byte: block 2t + 1) as bf16x2 bits of
// sf * 2^-120 (exact, subnormal for E4M3 subnormals); the kernel multiplies by 2^127 and 2^57.
// Sign bits are ignored (stored scales have none).
FP4Q_SMALL_M_HD uint32_t E4m3PairBits(uint32_t x16) {
  return (BytePerm(x16, 0u, 0x4140u) & 0x007F007Fu) << 4;
}

// True when any byte of x is a NaN scale (0x7F / 0xFF); bytes do not carry into each other.
FP4Q_SMALL_M_HD bool E4m3PairHasNan(uint32_t x) {
  return (((x & 0x7F7F7F7Fu) + 0x01010101u) & 0x80808080u) != 0u;
}

// bf16 bits of 2^(b - 127) for an E8M0 byte (255: NaN).
FP4Q_SMALL_M_HD uint32_t E8m0Bf16Bits(uint32_t b) {
  return b == 255u ? 0x7FC0u : (b == 0u ? 0x0040u : (b << 7));
}

}  // namespace fp4q::kernels::cuda::small_m

#endif  // FP4Q_KERNELS_SRC_CUDA_SMALL_M_LAYOUT_H_
