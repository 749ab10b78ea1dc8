#include "server/regions.h"

#include <cstdint>
#include <future>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "engine_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace fp4q::server {
namespace {

using ::fp4q::server::testing::FakeIpcBackend;
using ::fp4q::testing::StatusIs;
using ::testing::HasSubstr;

class RegionsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto backend = std::make_unique<FakeIpcBackend>("GPU-fake-0");
    fake_ = backend.get();
    std::vector<std::unique_ptr<kernels::Backend>> backends;
    backends.push_back(std::move(backend));
    devices_ = DeviceSet::FromBackends(std::move(backends), /*host_memory=*/true);
    Make(/*allow=*/true, /*max_handles=*/3);
  }
  void Make(bool allow, int max_handles) {
    RegionsOptions o;
    o.allow_cuda_ipc = allow;
    o.max_open_handles = max_handles;
    o.lease = absl::Seconds(30);
    o.now = [this] { return now_; };
    regions_ = std::make_unique<RegionManager>(devices_.get(), o, nullptr);
  }
  RegisterRegionRequest Req(void* base, uint64_t size) {
    return RegisterRegionRequest{fake_->Export(base), size, "GPU-fake-0"};
  }

  absl::Time now_ = absl::FromUnixSeconds(1000000);
  FakeIpcBackend* fake_ = nullptr;
  std::unique_ptr<DeviceSet> devices_;
  std::unique_ptr<RegionManager> regions_;
  alignas(64) uint8_t memory_[4096] = {};
};

TEST_F(RegionsTest, SessionIdsAreRandom128BitHex) {
  OpenSessionResult a = regions_->OpenSession("a");
  OpenSessionResult b = regions_->OpenSession("b");
  EXPECT_EQ(a.session_id.size(), 32u);
  EXPECT_NE(a.session_id, b.session_id);
  EXPECT_EQ(a.session_id.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_EQ(a.lease_seconds, 30u);
  EXPECT_EQ(regions_->sessions(), 2);
}

TEST_F(RegionsTest, RegionIdsAreFifteenUrlSafeCharactersAndDistinct) {
  const std::string s = regions_->OpenSession("a").session_id;
  std::set<std::string> ids;
  const RegisterRegionRequest r = Req(memory_, 64);  // one handle, one mapping
  for (int i = 0; i < 64; ++i) {
    absl::StatusOr<std::string> id = regions_->Register(s, r);
    ASSERT_TRUE(id.ok()) << id.status();
    EXPECT_EQ(id->size(), 15u);
    EXPECT_EQ(id->find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                    "0123456789-_"),
              std::string::npos)
        << *id;
    ids.insert(*id);
  }
  EXPECT_EQ(ids.size(), 64u);
}

TEST_F(RegionsTest, HandleOfTheWrongSizeIsInvalidArgument) {
  const std::string s = regions_->OpenSession("c").session_id;
  RegisterRegionRequest r = Req(memory_, 4096);
  r.ipc_handle.resize(63);
  EXPECT_THAT(regions_->Register(s, r), StatusIs(absl::StatusCode::kInvalidArgument,
                                                 HasSubstr("ipc_handle: 63 bytes, expected 64")));
  r.ipc_handle.assign(65, 'x');
  EXPECT_THAT(regions_->Register(s, r), StatusIs(absl::StatusCode::kInvalidArgument,
                                                 HasSubstr("ipc_handle: 65 bytes, expected 64")));
  EXPECT_EQ(regions_->regions(), 0);
  EXPECT_EQ(fake_->opens(), 0);
}

TEST_F(RegionsTest, UnknownDeviceAndDisabledIpc) {
  const std::string s = regions_->OpenSession("c").session_id;
  RegisterRegionRequest r = Req(memory_, 4096);
  r.device_uuid = "GPU-other";
  EXPECT_THAT(regions_->Register(s, r),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("device_uuid: 'GPU-other' is not a device this server serves")));
  Make(/*allow=*/false, 3);
  const std::string s2 = regions_->OpenSession("c").session_id;
  EXPECT_THAT(regions_->Register(s2, Req(memory_, 4096)),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("--allow_cuda_ipc")));
  EXPECT_EQ(fake_->opens(), 0);
}

TEST_F(RegionsTest, SliceBoundsInSixtyFourBitsWithoutOverflow) {
  const std::string s = regions_->OpenSession("c").session_id;
  auto id = regions_->Register(s, Req(memory_, 4096));
  ASSERT_TRUE(id.ok()) << id.status();
  auto pin = regions_->Acquire(s, *id, "input.region");
  ASSERT_TRUE(pin.ok()) << pin.status();
  EXPECT_EQ(*pin->Slice(0, 4096, "input.region"), memory_);
  EXPECT_EQ(*pin->Slice(4080, 16, "input.region"), memory_ + 4080);
  EXPECT_EQ(*pin->Slice(4096, 0, "input.region"), memory_ + 4096);
  EXPECT_THAT(pin->Slice(4080, 17, "input.region"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("input.region.offset: 4080 + 17 bytes is past the end of the "
                                 "region (4096 bytes)")));
  const uint64_t huge = std::numeric_limits<uint64_t>::max() - 15;  // aligned; huge + 32 wraps
  EXPECT_THAT(pin->Slice(huge, 32, "out.region"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("out.region.offset: 18446744073709551600 + 32 bytes is past")));
  EXPECT_THAT(pin->Slice(16, std::numeric_limits<uint64_t>::max(), "out.region"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("past the end")));
  EXPECT_THAT(pin->Slice(8, 4, "input.region"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("input.region.offset: 8 is not a multiple of 16")));
}

TEST_F(RegionsTest, AnotherSessionsRegionReadsExactlyLikeAnUnknownOne) {
  const std::string a = regions_->OpenSession("a").session_id;
  const std::string b = regions_->OpenSession("b").session_id;
  auto id = regions_->Register(a, Req(memory_, 4096));
  ASSERT_TRUE(id.ok());
  absl::Status foreign = regions_->Acquire(b, *id, "input.region").status();
  EXPECT_THAT(foreign, StatusIs(absl::StatusCode::kNotFound,
                                HasSubstr("input.region.region_id: no region '")));
  EXPECT_THAT(regions_->Unregister(b, *id),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("region_id: no region '")));
  EXPECT_EQ(regions_->regions(), 1) << "another session cannot unregister it";
  ASSERT_TRUE(regions_->Unregister(a, *id).ok());
  absl::Status unknown = regions_->Acquire(b, *id, "input.region").status();
  EXPECT_EQ(foreign, unknown);  // same code, same message
  EXPECT_THAT(regions_->Acquire("", "r1", "input.region"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no 'fp4q-session' metadata")));
}

TEST_F(RegionsTest, MappingsAreCachedByHandleAndClosedWithTheLastRegion) {
  const std::string a = regions_->OpenSession("a").session_id;
  const std::string b = regions_->OpenSession("b").session_id;
  RegisterRegionRequest r = Req(memory_, 4096);
  auto r1 = regions_->Register(a, r);
  auto r2 = regions_->Register(b, r);  // same handle, another session
  ASSERT_TRUE(r1.ok() && r2.ok());
  EXPECT_NE(*r1, *r2);
  EXPECT_EQ(fake_->opens(), 1);
  EXPECT_EQ(regions_->open_handles(), 1);
  EXPECT_EQ(regions_->regions(), 2);
  ASSERT_TRUE(regions_->Unregister(a, *r1).ok());
  EXPECT_EQ(fake_->closes(), 0);
  ASSERT_TRUE(regions_->Unregister(b, *r2).ok());
  EXPECT_EQ(fake_->closes(), 1);
  EXPECT_EQ(regions_->open_handles(), 0);
}

// One allocation registered for two GPUs: the second registration names the GPU it was first
// opened on (the CUDA runtime reports the opening GPU for a peer mapping, so nothing else tells).
TEST(RegionsTwoDevicesTest, AHandleOpenOnOneGpuIsRefusedForAnother) {
  auto b0 = std::make_unique<FakeIpcBackend>("GPU-fake-0");
  auto b1 = std::make_unique<FakeIpcBackend>("GPU-fake-1");
  FakeIpcBackend* fake0 = b0.get();
  FakeIpcBackend* fake1 = b1.get();
  std::vector<std::unique_ptr<kernels::Backend>> backends;
  backends.push_back(std::move(b0));
  backends.push_back(std::move(b1));
  auto devices = DeviceSet::FromBackends(std::move(backends), /*host_memory=*/true);
  RegionsOptions o;
  o.allow_cuda_ipc = true;
  o.max_open_handles = 4;
  RegionManager regions(devices.get(), o, nullptr);
  alignas(64) static uint8_t memory[4096] = {};
  const std::string handle = fake0->Export(memory);
  const std::string s = regions.OpenSession("two").session_id;
  ASSERT_TRUE(regions.Register(s, RegisterRegionRequest{handle, 4096, "GPU-fake-0"}).ok());
  EXPECT_THAT(regions.Register(s, RegisterRegionRequest{handle, 4096, "GPU-fake-1"}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("ipc_handle: already registered on GPU-fake-0; the allocation "
                                 "lives there, not on GPU-fake-1 (device_uuid: 'GPU-fake-1')")));
  EXPECT_EQ(fake1->opens(), 0);
  EXPECT_EQ(regions.regions(), 1);
  EXPECT_EQ(regions.open_handles(), 1);
  // The same GPU again is fine (one mapping, two regions).
  EXPECT_TRUE(regions.Register(s, RegisterRegionRequest{handle, 1024, "GPU-fake-0"}).ok());
  EXPECT_EQ(fake0->opens(), 1);
}

TEST_F(RegionsTest, OpenHandleCap) {
  const std::string a = regions_->OpenSession("a").session_id;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(regions_->Register(a, Req(memory_ + 64 * i, 64)).ok());
  EXPECT_THAT(regions_->Register(a, Req(memory_ + 1024, 64)),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("3 open IPC handles, its cap (--max_open_handles)")));
  EXPECT_EQ(fake_->opens(), 3);
}

TEST_F(RegionsTest, LeaseExpiryReleasesRegionsAndRenewalKeepsThem) {
  const std::string a = regions_->OpenSession("a").session_id;
  const std::string b = regions_->OpenSession("b").session_id;
  ASSERT_TRUE(regions_->Register(a, Req(memory_, 64)).ok());
  auto rb = regions_->Register(b, Req(memory_ + 64, 64));
  ASSERT_TRUE(rb.ok());
  now_ += absl::Seconds(20);
  ASSERT_TRUE(regions_->KeepAlive(b).ok());
  now_ += absl::Seconds(15);  // a: 35 s since renewal; b: 15 s
  EXPECT_THAT(regions_->KeepAlive(a),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("unknown or expired session")));
  EXPECT_EQ(regions_->ExpireSessions(), 1);
  EXPECT_EQ(regions_->sessions(), 1);
  EXPECT_EQ(regions_->regions(), 1);
  EXPECT_EQ(regions_->open_handles(), 1);
  EXPECT_EQ(fake_->closes(), 1);
  // Using a region renews its session.
  now_ += absl::Seconds(10);  // b: 25 s since its renewal
  ASSERT_TRUE(regions_->Acquire(b, *rb, "input.region").ok());
  now_ += absl::Seconds(25);
  EXPECT_EQ(regions_->ExpireSessions(), 0);
  now_ += absl::Seconds(31);
  EXPECT_EQ(regions_->ExpireSessions(), 1);
  EXPECT_EQ(regions_->regions(), 0);
  EXPECT_EQ(fake_->closes(), 2);
}

TEST_F(RegionsTest, UnregisterWaitsForPinnedRegions) {
  const std::string a = regions_->OpenSession("a").session_id;
  auto id = regions_->Register(a, Req(memory_, 64));
  ASSERT_TRUE(id.ok());
  auto pin = std::make_unique<RegionPin>(*regions_->Acquire(a, *id, "input.region"));
  auto done = std::async(std::launch::async, [&] { return regions_->Unregister(a, *id); });
  EXPECT_EQ(done.wait_for(std::chrono::milliseconds(200)), std::future_status::timeout);
  // Hidden at once, though still pinned.
  EXPECT_THAT(regions_->Acquire(a, *id, "input.region"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no region")));
  EXPECT_EQ(fake_->closes(), 0);
  pin.reset();
  EXPECT_TRUE(done.get().ok());
  EXPECT_EQ(fake_->closes(), 1);
}

TEST_F(RegionsTest, CloseSessionReleasesItsRegions) {
  const std::string a = regions_->OpenSession("a").session_id;
  ASSERT_TRUE(regions_->Register(a, Req(memory_, 64)).ok());
  ASSERT_TRUE(regions_->Register(a, Req(memory_ + 64, 64)).ok());
  EXPECT_EQ(*regions_->CloseSession(a), 2u);
  EXPECT_EQ(regions_->regions(), 0);
  EXPECT_EQ(regions_->open_handles(), 0);
  EXPECT_THAT(regions_->CloseSession(a),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("unknown or expired session")));
}

}  // namespace
}  // namespace fp4q::server
