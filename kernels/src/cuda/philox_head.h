// The first two rounds of Philox4x32-10 on the stochastic-rounding counter (j, 0, lo step, hi
// step) with every part that does not depend on j folded into four words (NUMERICS 4 keeps the
// bits; only the operation count changes). Plain C++ shared by the lane quantizers
// (device_numerics.cuh's SrBits for HeadedKeys) and a host test (tests/kernels/
// philox_head_test.cc) that checks the state after round 1 against the rounds as written.
//
// With hi j = 0, round 0 of (j, 0, s, t) gives (A, C, mulhi(M0, j) ^ b, M0 j) where A = mulhi(M1,
// s) ^ K0(0), C = M1 s and b = t ^ K1(0). Round 1 multiplies A, a constant, by M0: its state is
// (mulhi(M1, z) ^ f, M1 z, w ^ g, e) with z, w round 0's third and fourth words, f = C ^ K0(1),
// g = mulhi(M0, A) ^ K1(1) and e = M0 A. So the two rounds take 2 wide multiplies and 3 XORs
// instead of 4 and 4.
#ifndef FP4Q_KERNELS_SRC_CUDA_PHILOX_HEAD_H_
#define FP4Q_KERNELS_SRC_CUDA_PHILOX_HEAD_H_

#include <cstdint>

#ifdef __CUDACC__
#define FP4Q_PHILOX_HD __host__ __device__ __forceinline__
#else
#define FP4Q_PHILOX_HD inline
#endif

namespace fp4q::kernels::cuda {

inline constexpr uint32_t kPhiloxM0 = 0xD2511F53u;
inline constexpr uint32_t kPhiloxM1 = 0xCD9E8D57u;

FP4Q_PHILOX_HD uint32_t PhiloxMulHi(uint32_t a, uint32_t b) {
#ifdef __CUDA_ARCH__
  return __umulhi(a, b);
#else
  return static_cast<uint32_t>((static_cast<uint64_t>(a) * b) >> 32);
#endif
}

struct PhiloxHead {
  uint32_t b = 0, f = 0, g = 0, e = 0;
};

// The head of one launch: its round keys k.K0(i), k.K1(i) and its step.
template <typename Keys>
FP4Q_PHILOX_HD PhiloxHead PhiloxHeadOf(const Keys& k, uint64_t step) {
  const uint32_t s = static_cast<uint32_t>(step);
  const uint32_t a = PhiloxMulHi(kPhiloxM1, s) ^ k.K0(0);
  PhiloxHead h;
  h.b = static_cast<uint32_t>(step >> 32) ^ k.K1(0);
  h.f = (kPhiloxM1 * s) ^ k.K0(1);
  h.g = PhiloxMulHi(kPhiloxM0, a) ^ k.K1(1);
  h.e = kPhiloxM0 * a;
  return h;
}

// Philox's four counter words.
struct PhiloxState {
  uint32_t x, y, z, w;
};

// The state after rounds 0 and 1 of counter (j, 0, lo step, hi step).
FP4Q_PHILOX_HD PhiloxState PhiloxHeadRounds(uint32_t j, const PhiloxHead& h) {
  const uint32_t z = PhiloxMulHi(kPhiloxM0, j) ^ h.b;
  const uint32_t w = kPhiloxM0 * j;
  return PhiloxState{PhiloxMulHi(kPhiloxM1, z) ^ h.f, kPhiloxM1 * z, w ^ h.g, h.e};
}

}  // namespace fp4q::kernels::cuda

#endif  // FP4Q_KERNELS_SRC_CUDA_PHILOX_HEAD_H_
