// The lane kernels' division by a launch constant (kernels/src/cuda/div_magic.h) against the
// divide instruction, on the divisors and numerators where a multiply-high division fails
// first: d = 1 and powers of two and their neighbours, d near 2^32, and n at multiples of d,
// one either side and at 2^32 - 1.
#include "cuda/div_magic.h"

#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace fp4q::kernels::cuda {
namespace {

TEST(DivMagicTest, EqualsTheQuotientAtItsEdges) {
  std::vector<uint32_t> divisors = {1, 2, 3, 5, 7, 31, 32, 33, 64, 255, 256, 257, 1000,
                                    4095, 4096, 65535, 65536, 65537, 0x7FFFFFFFu, 0x80000000u,
                                    0x80000001u, 0xFFFFFFFEu, 0xFFFFFFFFu};
  std::mt19937 rng(7);
  for (int i = 0; i < 200; ++i) divisors.push_back(rng() | 1u);
  int checked = 0;
  for (const uint32_t d : divisors) {
    const uint64_t m = DivMagic(d);
    std::vector<uint64_t> ns = {0, 1, 2, d - 1ull, d, d + 1ull, 0xFFFFFFFFull, 0xFFFFFFFEull};
    for (uint64_t k : {2ull, 3ull, 1000ull, 0xFFFFFFFFull / d}) {
      for (int64_t delta : {-1, 0, 1}) ns.push_back(k * d + delta);
    }
    for (int i = 0; i < 50; ++i) ns.push_back(rng());
    for (const uint64_t n : ns) {
      if (n > 0xFFFFFFFFull) continue;
      ASSERT_EQ(DivByMagic(static_cast<uint32_t>(n), m), static_cast<uint32_t>(n / d))
          << n << " / " << d;
      ++checked;
    }
  }
  EXPECT_GT(checked, 10000);
}

// The form it replaced, m + 1, wraps to 0 for d = 1: the quotient would be 0.
TEST(DivMagicTest, OneIsADivisorToo) {
  EXPECT_EQ(DivMagic(1), ~uint64_t{0});
  EXPECT_EQ(DivByMagic(0, DivMagic(1)), 0u);
  EXPECT_EQ(DivByMagic(12345, DivMagic(1)), 12345u);
  EXPECT_EQ(DivByMagic(0xFFFFFFFFu, DivMagic(1)), 0xFFFFFFFFu);
}

}  // namespace
}  // namespace fp4q::kernels::cuda
