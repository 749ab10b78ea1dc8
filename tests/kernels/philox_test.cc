// Philox4x32 against the published Random123 known-answer vectors, and the stochastic-rounding
// bit layout of NUMERICS 4.
#include "cpu/philox.h"

#include <cstdint>

#include "cpu/rht.h"
#include "gtest/gtest.h"

namespace fp4q::kernels::cpu {
namespace {

struct Kat {
  int rounds;
  PhiloxCounter counter;
  PhiloxKey key;
  PhiloxCounter expected;
};

// Source: Random123 (D. E. Shaw Research), file tests/kat_vectors, lines "philox4x32 7" and
// "philox4x32 10" (https://github.com/DEShawResearch/random123, commit 9545ff64); format
// `name rounds counter[4] key[2] expected[4]`.
constexpr Kat kKats[] = {
    {7,
     {0x00000000, 0x00000000, 0x00000000, 0x00000000},
     {0x00000000, 0x00000000},
     {0x5f6fb709, 0x0d893f64, 0x4f121f81, 0x4f730a48}},
    {7,
     {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
     {0xffffffff, 0xffffffff},
     {0x5207ddc2, 0x45165e59, 0x4d8ee751, 0x8c52f662}},
    {7,
     {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
     {0xa4093822, 0x299f31d0},
     {0x4dfccaba, 0x190a87f0, 0xc47362ba, 0xb6b5242a}},
    {10,
     {0x00000000, 0x00000000, 0x00000000, 0x00000000},
     {0x00000000, 0x00000000},
     {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
    {10,
     {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
     {0xffffffff, 0xffffffff},
     {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
    {10,
     {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
     {0xa4093822, 0x299f31d0},
     {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
};

TEST(PhiloxTest, MatchesRandom123KnownAnswers) {
  for (const Kat& k : kKats) {
    EXPECT_EQ(Philox4x32(k.counter, k.key, k.rounds), k.expected) << "rounds " << k.rounds;
  }
  // The default is 10 rounds.
  EXPECT_EQ(Philox4x32(kKats[5].counter, kKats[5].key), kKats[5].expected);
}

TEST(PhiloxTest, KeyIsLowThenHighHalfOfTheSeed) {
  EXPECT_EQ(PhiloxKeyFromSeed(0x299f31d0a4093822ull), (PhiloxKey{0xa4093822, 0x299f31d0}));
}

TEST(StochasticBitsTest, LayoutOfCounterAndWords) {
  // Seed 0, step 0, indices 0..7 (j = 0): the all-zero KAT output 6627e8d5 e169c58d bc57ac4c
  // 9b00dbd8; element i takes word (i % 8) / 2, low half for even i, high half for odd i.
  const uint16_t want[8] = {0xe8d5, 0x6627, 0xc58d, 0xe169, 0xac4c, 0xbc57, 0xdbd8, 0x9b00};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(StochasticBits(0, 0, i), want[i]) << "index " << i;

  // Counter (lo32(j), hi32(j), lo32(step), hi32(step)) and key (lo32(seed), hi32(seed)):
  // index 8 * j + 5 with 64-bit j and step takes the high half of word 2.
  const uint64_t seed = 0x299f31d0a4093822ull;
  const uint64_t j = 0x1a3308d3243f6a88ull;
  const uint64_t step = 0x0370734413198a2eull;
  const PhiloxCounter words =
      Philox4x32({0x243f6a88, 0x1a3308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0});
  EXPECT_EQ(StochasticBits(seed, step, 8 * j + 5), words[2] >> 16);
  EXPECT_EQ(StochasticBits(seed, step, 8 * j + 0), words[0] & 0xFFFF);
  EXPECT_EQ(StochasticBits(seed, step, 8 * j + 7), words[3] >> 16);
}

TEST(StochasticBitsTest, StreamAgreesWithDirectComputation) {
  StochasticBitStream stream(12345, 678);
  for (uint64_t i : {0ull, 1ull, 7ull, 8ull, 9ull, 100ull, 99ull, 1000000007ull, 3ull}) {
    EXPECT_EQ(stream.Bits(i), StochasticBits(12345, 678, i)) << "index " << i;
  }
  EXPECT_NE(StochasticBits(12345, 678, 5), StochasticBits(12345, 679, 5));
  EXPECT_NE(StochasticBits(12345, 678, 5), StochasticBits(12346, 678, 5));
}

TEST(RhtSignsTest, DefaultAndSeeded) {
  EXPECT_EQ(RhtSignMask(RhtMode::kDefaultSigns, 99), 0xD7E8);
  // Seed 0: word 0 of Philox4x32-10(key 0, counter 0) is 0x6627e8d5 (KAT): low 16 bits.
  EXPECT_EQ(RhtSignMask(RhtMode::kSeeded, 0), 0xe8d5);
  // Seed 0x299f31d0a4093822 with counter 0 differs from seed 0.
  EXPECT_NE(RhtSignMask(RhtMode::kSeeded, 0x299f31d0a4093822ull), 0xe8d5);
}

}  // namespace
}  // namespace fp4q::kernels::cpu
