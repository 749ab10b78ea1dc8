// Philox4x32 and the stochastic-rounding bit stream; see philox.h.
#include "cpu/philox.h"

namespace fp4q::kernels::cpu {
namespace {

constexpr uint32_t kMultiplier0 = 0xD2511F53u;
constexpr uint32_t kMultiplier1 = 0xCD9E8D57u;
constexpr uint32_t kWeyl0 = 0x9E3779B9u;  // golden ratio
constexpr uint32_t kWeyl1 = 0xBB67AE85u;  // sqrt(3) - 1

PhiloxCounter Round(const PhiloxCounter& c, const PhiloxKey& k) {
  const uint64_t p0 = static_cast<uint64_t>(kMultiplier0) * c[0];
  const uint64_t p1 = static_cast<uint64_t>(kMultiplier1) * c[2];
  const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
  const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
  return {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
}

PhiloxCounter Block(uint64_t j, uint64_t step, const PhiloxKey& key) {
  return Philox4x32({static_cast<uint32_t>(j), static_cast<uint32_t>(j >> 32),
                     static_cast<uint32_t>(step), static_cast<uint32_t>(step >> 32)},
                    key);
}

uint16_t Pick(const PhiloxCounter& words, uint64_t index) {
  const uint32_t word = words[(index % 8) / 2];
  return static_cast<uint16_t>(index % 2 == 0 ? word : word >> 16);
}

}  // namespace

PhiloxCounter Philox4x32(PhiloxCounter counter, PhiloxKey key, int rounds) {
  for (int r = 0; r < rounds; ++r) {
    if (r > 0) {  // the key is bumped before every round but the first
      key[0] += kWeyl0;
      key[1] += kWeyl1;
    }
    counter = Round(counter, key);
  }
  return counter;
}

uint16_t StochasticBits(uint64_t seed, uint64_t step, uint64_t index) {
  return Pick(Block(index / 8, step, PhiloxKeyFromSeed(seed)), index);
}

uint16_t StochasticBitStream::Bits(uint64_t index) {
  const uint64_t block = index / 8;
  if (!valid_ || block != block_) {
    words_ = Block(block, step_, key_);
    block_ = block;
    valid_ = true;
  }
  return Pick(words_, index);
}

}  // namespace fp4q::kernels::cpu
