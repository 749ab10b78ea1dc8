// Engine: who may register CUDA IPC regions (the peer's transport), and what a
// client that goes away leaves behind: its session's lease lapses, its regions
// and IPC mappings are released (the mappings only once no request uses them),
// and every gauge returns to zero. On the fake IPC backend over host memory.
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "engine_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine.h"
#include "testing/status_matchers.h"

namespace fp4q::server {
namespace {

using ::fp4q::server::testing::Await;
using ::fp4q::server::testing::FakeIpcBackend;
using ::fp4q::server::testing::FakeIpcEngine;
using ::fp4q::server::testing::RandomF32;
using ::fp4q::server::testing::RegionF32;
using ::fp4q::testing::StatusIs;
using ::testing::HasSubstr;

// The gauges the engine reports, as Prometheus would show them.
class GaugeObserver final : public EngineObserver {
 public:
  void Sessions(int64_t n) override { sessions = n; }
  void CudaRegions(int64_t n) override { regions = n; }
  void CudaOpenHandles(int64_t n) override { handles = n; }
  std::atomic<int64_t> sessions{-1}, regions{-1}, handles{-1};
};

class EngineReliabilityTest : public ::testing::Test {
 protected:
  void Make(bool allow_ipc, bool ipc_over_tcp) {
    EngineOptions o;
    o.allow_cuda_ipc = allow_ipc;
    o.cuda_ipc_over_tcp = ipc_over_tcp;
    o.cpu_workers = 2;
    o.session_lease = absl::Seconds(30);
    o.maintenance_period = absl::Milliseconds(5);
    o.clock = [this] {
      std::lock_guard<std::mutex> lock(clock_mu_);
      return now_;
    };
    auto e = FakeIpcEngine(o, &fake_, &gauges_);
    ASSERT_TRUE(e.ok()) << e.status();
    engine_ = std::move(*e);
  }
  void Advance(absl::Duration d) {
    std::lock_guard<std::mutex> lock(clock_mu_);
    now_ += d;
  }
  absl::StatusOr<std::string> Register(const RequestContext& ctx, void* memory, uint64_t bytes) {
    return Await<std::string>([&](auto done) {
      engine_->RegisterRegion(ctx, {fake_->Export(memory), bytes, "GPU-fake-0"}, done);
    });
  }
  absl::StatusOr<std::string> RegisterHandle(const RequestContext& ctx, const std::string& handle,
                                             uint64_t bytes) {
    return Await<std::string>([&](auto done) {
      engine_->RegisterRegion(ctx, {handle, bytes, "GPU-fake-0"}, done);
    });
  }
  RequestContext Ctx(PeerInfo::Transport transport) {
    auto s = engine_->OpenSession("client");
    EXPECT_TRUE(s.ok());
    RequestContext ctx;
    ctx.session_id = s->session_id;
    ctx.peer.transport = transport;
    ctx.peer.uid = 1000;
    ctx.peer.pid = 4242;
    return ctx;
  }
  // Polls until `pred` holds (maintenance runs every 5 ms); false after 5 s.
  template <typename P>
  bool Eventually(P pred) {
    for (int i = 0; i < 1000; ++i) {
      if (pred()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return pred();
  }

  std::mutex clock_mu_;
  absl::Time now_ = absl::FromUnixSeconds(2000000);
  GaugeObserver gauges_;
  FakeIpcBackend* fake_ = nullptr;
  std::unique_ptr<Engine> engine_;
  std::vector<uint8_t> memory_ = std::vector<uint8_t>(1 << 16, 0);
  std::vector<uint8_t> memory2_ = std::vector<uint8_t>(1 << 16, 0);
};

TEST_F(EngineReliabilityTest, RegistrationOnlyFromUnixSocketPeersUnlessAllowedOverTcp) {
  Make(/*allow_ipc=*/true, /*ipc_over_tcp=*/false);
  for (auto transport : {PeerInfo::Transport::kTcp, PeerInfo::Transport::kUnknown}) {
    EXPECT_THAT(Register(Ctx(transport), memory_.data(), memory_.size()),
                StatusIs(absl::StatusCode::kPermissionDenied,
                         HasSubstr("RegisterCudaRegion: CUDA IPC is accepted only on the Unix "
                                   "socket (--unix_socket, peers checked by uid); this call came "
                                   "over TCP (fp4qd --cuda_ipc_over_tcp allows it)")));
  }
  EXPECT_EQ(fake_->opens(), 0) << "a refused peer must not open a handle";
  EXPECT_EQ(engine_->regions().regions(), 0);
  auto ok = Register(Ctx(PeerInfo::Transport::kUnix), memory_.data(), memory_.size());
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(engine_->regions().regions(), 1);

  Make(/*allow_ipc=*/true, /*ipc_over_tcp=*/true);
  EXPECT_TRUE(Register(Ctx(PeerInfo::Transport::kTcp), memory_.data(), memory_.size()).ok());

  // IPC off (the default): refused on every transport, saying how to enable it.
  Make(/*allow_ipc=*/false, /*ipc_over_tcp=*/true);
  for (auto transport : {PeerInfo::Transport::kTcp, PeerInfo::Transport::kUnix}) {
    EXPECT_THAT(Register(Ctx(transport), memory_.data(), memory_.size()),
                StatusIs(absl::StatusCode::kFailedPrecondition,
                         HasSubstr("client shared memory is disabled on this server "
                                   "(start fp4qd with --allow_cuda_ipc)")));
  }
  EXPECT_EQ(fake_->opens(), 0);
  EXPECT_EQ(EngineOptions().allow_cuda_ipc, false);
  EXPECT_EQ(EngineOptions().cuda_ipc_over_tcp, false);
}

TEST_F(EngineReliabilityTest, LapsedLeaseReleasesRegionsAndHandlesOnceNoRequestUsesThem) {
  Make(/*allow_ipc=*/true, /*ipc_over_tcp=*/false);
  engine_->StartMaintenance();
  const RequestContext ctx = Ctx(PeerInfo::Transport::kUnix);
  const std::string handle = fake_->Export(memory_.data());
  auto a = RegisterHandle(ctx, handle, memory_.size());
  auto b = Register(ctx, memory2_.data(), memory2_.size());
  auto c = RegisterHandle(ctx, handle, 4096);  // same allocation: shares a's mapping
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(gauges_.sessions.load(), 1);
  EXPECT_EQ(gauges_.regions.load(), 3);
  EXPECT_EQ(gauges_.handles.load(), 2);
  EXPECT_EQ(fake_->opens(), 2);
  // A request still holds region `a` when the client goes silent (it died
  // mid-request).
  absl::StatusOr<RegionPin> pin = engine_->regions().Acquire(ctx.session_id, *a, "input.region");
  ASSERT_TRUE(pin.ok()) << pin.status();

  Advance(absl::Seconds(31));  // past the lease: the next maintenance pass ends the session
  ASSERT_TRUE(Eventually([&] { return gauges_.sessions.load() == 0; }));
  // a's mapping (shared with c) waits for the request that pins a (b's may
  // close meanwhile).
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_LE(fake_->closes(), 1) << "a mapping was closed under a running request";
  EXPECT_GE(gauges_.handles.load(), 1);
  EXPECT_EQ(gauges_.regions.load(), 0) << "regions are unregistered at once";
  pin = RegionPin();  // the request finishes
  ASSERT_TRUE(Eventually([&] { return gauges_.handles.load() == 0; }));
  EXPECT_EQ(fake_->closes(), fake_->opens());
  EXPECT_EQ(engine_->regions().sessions(), 0);
  EXPECT_EQ(engine_->regions().regions(), 0);
  EXPECT_EQ(engine_->regions().open_handles(), 0);
  // The dead client's ids are unknown now, like any other.
  QuantizeRequest r;
  r.input = RegionF32(*b, 0, 2, 16);
  EXPECT_THAT(Await<QuantizeResult>([&](auto done) { engine_->Quantize(ctx, r, done); }),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("fp4q-session: unknown or expired session")));
  EXPECT_THAT(engine_->KeepAlive(ctx),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("unknown or expired session")));
  EXPECT_EQ(engine_->in_flight(), 0);
}

TEST_F(EngineReliabilityTest, ManyClientsComingAndGoingLeaveNothingBehind) {
  Make(/*allow_ipc=*/true, /*ipc_over_tcp=*/false);
  engine_->StartMaintenance();
  const std::string x = RandomF32(2 * 16, 7);
  std::memcpy(memory_.data(), x.data(), x.size());
  std::vector<std::thread> clients;
  std::atomic<int> failures{0};
  for (int t = 0; t < 8; ++t) {
    clients.emplace_back([&, t] {
      for (int i = 0; i < 25; ++i) {
        const RequestContext ctx = Ctx(PeerInfo::Transport::kUnix);
        auto id = Register(ctx, memory_.data(), memory_.size());
        if (!id.ok()) {
          ++failures;
          continue;
        }
        QuantizeRequest r;
        r.input = RegionF32(*id, 0, 2, 16);
        auto q = Await<QuantizeResult>([&](auto done) { engine_->Quantize(ctx, r, done); });
        if (!q.ok()) ++failures;
        // Half the clients close their session; the others just vanish (lease
        // lapses).
        if ((t + i) % 2 == 0) {
          auto n = Await<uint32_t>([&](auto done) { engine_->CloseSession(ctx, done); });
          if (!n.ok() || *n != 1) ++failures;
        }
      }
    });
  }
  for (auto& c : clients) c.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(gauges_.sessions.load(),
            100);  // the vanished ones, until their lease lapses
  Advance(absl::Seconds(31));
  ASSERT_TRUE(Eventually([&] { return gauges_.sessions.load() == 0; }));
  ASSERT_TRUE(Eventually([&] { return gauges_.handles.load() == 0; }));
  EXPECT_EQ(gauges_.regions.load(), 0);
  EXPECT_EQ(fake_->closes(), fake_->opens());
  EXPECT_EQ(engine_->in_flight(), 0);
}

}  // namespace
}  // namespace fp4q::server
