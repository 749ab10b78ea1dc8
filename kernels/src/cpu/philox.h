// Philox4x32-10 (Salmon, Moraes, Dror, Shaw, "Parallel random numbers: as easy as 1, 2, 3",
// SC'11; the generator of Random123 and cuRAND) and the stochastic-rounding bit stream of
// NUMERICS 4. Pure functions, thread-safe.
#ifndef FP4Q_KERNELS_CPU_PHILOX_H_
#define FP4Q_KERNELS_CPU_PHILOX_H_

#include <array>
#include <cstdint>

namespace fp4q::kernels::cpu {

using PhiloxCounter = std::array<uint32_t, 4>;
using PhiloxKey = std::array<uint32_t, 2>;

// Philox4x32 with `rounds` rounds (10 is the standard Philox4x32-10).
PhiloxCounter Philox4x32(PhiloxCounter counter, PhiloxKey key, int rounds = 10);

// Key (lo32(seed), hi32(seed)).
inline PhiloxKey PhiloxKeyFromSeed(uint64_t seed) {
  return {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
}

// The 16 stochastic-rounding bits of element `index` (row-major index in the tensor being
// quantized): counter (lo32(j), hi32(j), lo32(step), hi32(step)) with j = index / 8; word
// (index % 8) / 2 of the output, low half for even index, high half for odd.
uint16_t StochasticBits(uint64_t seed, uint64_t step, uint64_t index);

// The same stream, computing each Philox block once for 8 consecutive indices.
class StochasticBitStream {
 public:
  StochasticBitStream(uint64_t seed, uint64_t step) : key_(PhiloxKeyFromSeed(seed)), step_(step) {}
  uint16_t Bits(uint64_t index);

 private:
  PhiloxKey key_;
  uint64_t step_;
  bool valid_ = false;
  uint64_t block_ = 0;
  PhiloxCounter words_{};
};

}  // namespace fp4q::kernels::cpu

#endif  // FP4Q_KERNELS_CPU_PHILOX_H_
