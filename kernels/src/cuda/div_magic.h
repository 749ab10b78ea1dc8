// Division of a 32-bit index by a launch constant without a divide instruction (the lane
// kernels' step -> tile row, task -> band): floor(m (n + 1) / 2^64) with m = DivMagic(d) =
// floor((2^64 - 1) / d) is floor(n / d) for every n < 2^32 and 1 <= d < 2^32. With
// n = q d + s (0 <= s < d) and 2^64 - 1 = m d + r (0 <= r < d), m (n + 1) / 2^64 is
// q + (s + 1) / d - (n + 1)(r + 1) / (d 2^64); the last term is positive and below 2^-32, and
// (s + 1) / d lies in [1 / d, 1] with 1 / d > 2^-32, so the floor is q. d = 1 included (the
// form with m = floor((2^64 - 1) / d) + 1 wraps to 0 there). Host code for its test
// (tests/kernels/div_magic_test.cc).
#ifndef FP4Q_KERNELS_SRC_CUDA_DIV_MAGIC_H_
#define FP4Q_KERNELS_SRC_CUDA_DIV_MAGIC_H_

#include <cstdint>

#ifdef __CUDACC__
#define FP4Q_DIV_HD __host__ __device__ __forceinline__
#else
#define FP4Q_DIV_HD inline
#endif

namespace fp4q::kernels::cuda {

inline uint64_t DivMagic(uint32_t d) { return ~uint64_t{0} / d; }

FP4Q_DIV_HD uint32_t DivByMagic(uint32_t n, uint64_t magic) {
#ifdef __CUDA_ARCH__
  return static_cast<uint32_t>(__umul64hi(magic, uint64_t{n} + 1));
#else
  return static_cast<uint32_t>((static_cast<unsigned __int128>(magic) * (uint64_t{n} + 1)) >> 64);
#endif
}

}  // namespace fp4q::kernels::cuda

#endif  // FP4Q_KERNELS_SRC_CUDA_DIV_MAGIC_H_
