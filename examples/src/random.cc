#include "fp4q/examples/random.h"

#include <cstddef>

namespace fp4q::examples {

uint64_t Rng::NextBits() {
  state_ += 0x9E3779B97F4A7C15ull;
  uint64_t z = state_;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double Rng::Uniform() {
  return static_cast<double>(NextBits() >> 11) * (1.0 / 9007199254740992.0);
}

double Rng::Normal() {
  double sum = 0.0;
  for (int i = 0; i < 12; ++i) sum += Uniform();
  return sum - 6.0;
}

Rng StreamRng(uint64_t seed, uint64_t stream) {
  // Two SplitMix64 outputs mix the pair; the stream index is spread by an odd
  // constant.
  Rng mix(seed ^ (stream * 0xD1B54A32D192ED03ull));
  const uint64_t a = mix.NextBits();
  return Rng(a ^ mix.NextBits());
}

std::vector<float> NormalVector(Rng& rng, int64_t count, double scale) {
  std::vector<float> out(static_cast<size_t>(count));
  for (float& v : out) v = static_cast<float>(rng.Normal() * scale);
  return out;
}

}  // namespace fp4q::examples
