// Deterministic random numbers for the examples' synthetic data.
//
// The examples promise the same numbers on every machine for a given seed (the
// CPU table and the GPU table must agree bit for bit), so nothing here uses a
// library distribution (their algorithms are implementation-defined) or a
// transcendental function (libm's last bit may differ between C libraries):
// SplitMix64 for the bits, exact conversions to doubles, and the Irwin-Hall sum
// of twelve uniforms for bell-shaped values.
//
// Thread safety: a Rng is a value; use one per thread.
#ifndef FP4Q_EXAMPLES_RANDOM_H_
#define FP4Q_EXAMPLES_RANDOM_H_

#include <cstdint>
#include <vector>

namespace fp4q::examples {

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}

  // SplitMix64 (Steele, Lea, Flood 2014): the next 64 random bits.
  uint64_t NextBits();
  // Uniform in [0, 1): the top 53 bits times 2^-53 (exact).
  double Uniform();
  // Mean 0, variance 1, bell-shaped on [-6, 6]: (sum of 12 uniforms) - 6,
  // summed in order.
  double Normal();

 private:
  uint64_t state_;
};

// A stream for one purpose: seeds derived from (seed, stream) differ for
// different streams, so adding a stream never changes the numbers of another.
Rng StreamRng(uint64_t seed, uint64_t stream);

// `count` values of Normal() * scale, each rounded once to f32.
std::vector<float> NormalVector(Rng& rng, int64_t count, double scale);

}  // namespace fp4q::examples

#endif  // FP4Q_EXAMPLES_RANDOM_H_
