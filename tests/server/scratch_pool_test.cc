#include "server/scratch_pool.h"

#include "fp4q/kernels/backend.h"
#include "gtest/gtest.h"

namespace fp4q::server {
namespace {

TEST(ScratchPoolTest, SizeClassesArePowersOfTwoFrom256) {
  EXPECT_EQ(ScratchPool::RoundUp(1), 256u);
  EXPECT_EQ(ScratchPool::RoundUp(256), 256u);
  EXPECT_EQ(ScratchPool::RoundUp(257), 512u);
  EXPECT_EQ(ScratchPool::RoundUp(size_t{3} << 20), size_t{4} << 20);
}

TEST(ScratchPoolTest, GivenBuffersAreReusedAndTheCacheIsBounded) {
  auto cpu = kernels::CreateCpuBackend();
  ScratchPool pool(cpu.get(), /*max_cached_bytes=*/8192);
  auto a = pool.Take(100);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_GE(a->size(), 100u);
  void* p = a->data();
  pool.Give(*std::move(a));
  EXPECT_EQ(pool.cached_bytes(), 256u);
  auto b = pool.Take(200);  // same size class
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->data(), p);
  EXPECT_EQ(pool.hits(), 1u);
  EXPECT_EQ(pool.misses(), 1u);
  EXPECT_EQ(pool.cached_bytes(), 0u);
  // Larger than a quarter of the cache: freed, not cached.
  auto big = pool.Take(4096);
  ASSERT_TRUE(big.ok());
  pool.Give(*std::move(big));
  EXPECT_EQ(pool.cached_bytes(), 0u);
  // The total stays under the bound.
  for (int i = 0; i < 20; ++i) {
    auto c = pool.Take(2048);
    ASSERT_TRUE(c.ok());
    pool.Give(*std::move(c));
  }
  std::vector<DeviceBuffer> held;
  for (int i = 0; i < 6; ++i) held.push_back(*pool.Take(2048));
  for (auto& h : held) pool.Give(std::move(h));
  EXPECT_LE(pool.cached_bytes(), 8192u);
  EXPECT_EQ(pool.cached_bytes(), 4u * 2048);
}

TEST(ScratchPoolTest, ZeroBoundCachesNothing) {
  auto cpu = kernels::CreateCpuBackend();
  ScratchPool pool(cpu.get(), 0);
  auto a = pool.Take(64);
  ASSERT_TRUE(a.ok());
  pool.Give(*std::move(a));
  EXPECT_EQ(pool.cached_bytes(), 0u);
}

}  // namespace
}  // namespace fp4q::server
