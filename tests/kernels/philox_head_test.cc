// The lane quantizers' folded Philox head (kernels/src/cuda/philox_head.h) against Philox4x32-10's
// first two rounds as NUMERICS 4 writes them: for counters (j, 0, lo step, hi step) over random
// and edge seeds, steps and groups j, the state after round 1 must be the same words. Rounds
// 2-9 run the same code either way, so equal states give equal random bits.
#include <cstdint>
#include <random>
#include <vector>

#include "cuda/philox_head.h"
#include "gtest/gtest.h"

namespace fp4q::kernels::cuda {
namespace {

// NUMERICS 4's round keys of a seed.
struct Keys {
  uint64_t seed;
  uint32_t K0(int i) const {
    return static_cast<uint32_t>(seed) + static_cast<uint32_t>(i) * 0x9E3779B9u;
  }
  uint32_t K1(int i) const {
    return static_cast<uint32_t>(seed >> 32) + static_cast<uint32_t>(i) * 0xBB67AE85u;
  }
};

// Rounds 0 and 1 of Philox4x32-10 on (x, y, z, w), written out.
void TwoRounds(uint32_t c[4], const Keys& k) {
  for (int i = 0; i < 2; ++i) {
    const uint64_t p0 = static_cast<uint64_t>(0xD2511F53u) * c[0];
    const uint64_t p1 = static_cast<uint64_t>(0xCD9E8D57u) * c[2];
    const uint32_t next[4] = {static_cast<uint32_t>(p1 >> 32) ^ c[1] ^ k.K0(i),
                              static_cast<uint32_t>(p1),
                              static_cast<uint32_t>(p0 >> 32) ^ c[3] ^ k.K1(i),
                              static_cast<uint32_t>(p0)};
    for (int e = 0; e < 4; ++e) c[e] = next[e];
  }
}

TEST(PhiloxHeadTest, StateAfterRoundOneMatchesTheRoundsAsWritten) {
  std::mt19937_64 rng(20261206);
  std::vector<uint64_t> seeds = {0, 1, ~uint64_t{0}, 0x9E3779B97F4A7C15ull};
  std::vector<uint64_t> steps = {0, 1, 0xFFFFFFFFull, uint64_t{1} << 32, ~uint64_t{0}};
  std::vector<uint32_t> groups = {0, 1, 2, 0x7FFFFFFFu, 0x80000000u, 0xFFFFFFFFu};
  for (int i = 0; i < 20; ++i) {
    seeds.push_back(rng());
    steps.push_back(rng());
    groups.push_back(static_cast<uint32_t>(rng()));
  }
  int checked = 0;
  for (uint64_t seed : seeds) {
    const Keys k{seed};
    for (uint64_t step : steps) {
      const PhiloxHead h = PhiloxHeadOf(k, step);
      for (uint32_t j : groups) {
        uint32_t want[4] = {j, 0u, static_cast<uint32_t>(step), static_cast<uint32_t>(step >> 32)};
        TwoRounds(want, k);
        const PhiloxState s = PhiloxHeadRounds(j, h);
        const uint32_t got[4] = {s.x, s.y, s.z, s.w};
        for (int e = 0; e < 4; ++e) {
          ASSERT_EQ(got[e], want[e]) << "seed " << seed << " step " << step << " j " << j
                                     << " word " << e;
        }
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 24 * 25 * 26);
}

// The head changes with every input it folds: a test that a wrong fold would not pass by chance.
TEST(PhiloxHeadTest, HeadDependsOnSeedAndStep) {
  const PhiloxHead a = PhiloxHeadOf(Keys{1}, 7);
  const PhiloxHead b = PhiloxHeadOf(Keys{2}, 7);
  const PhiloxHead c = PhiloxHeadOf(Keys{1}, 8);
  const PhiloxHead d = PhiloxHeadOf(Keys{1}, 7 + (uint64_t{1} << 32));
  EXPECT_NE(a.f, b.f);
  EXPECT_NE(a.e, c.e);
  EXPECT_NE(a.b, d.b);
  // The high step word only enters through b: the other words stay.
  EXPECT_EQ(a.f, d.f);
  EXPECT_EQ(a.g, d.g);
  EXPECT_EQ(a.e, d.e);
}

}  // namespace
}  // namespace fp4q::kernels::cuda
