// The call layer (call_layer.h) over an engine on the fake IPC backend, with its metrics: what a
// Step's wait for its ready signal does to the reply header and to the request metrics.
#include "server/call_layer.h"

#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine_test_util.h"
#include "fp4q/v1/fp4q.pb.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "server/engine.h"
#include "server/metrics.h"

namespace fp4q::server {
namespace {

using ::fp4q::server::testing::Await;
using ::fp4q::server::testing::FakeIpcBackend;
using ::fp4q::server::testing::FakeIpcEngine;
using ::fp4q::server::testing::InlineF32;
using ::fp4q::server::testing::RandomF32;

// The histogram `name` with label rpc=`rpc` (empty: the one without labels).
const prometheus::ClientMetric::Histogram* FindHistogram(
    const std::vector<prometheus::MetricFamily>& families, const std::string& name,
    const std::string& rpc) {
  for (const prometheus::MetricFamily& f : families) {
    if (f.name != name) continue;
    for (const prometheus::ClientMetric& m : f.metric) {
      bool match = rpc.empty();
      for (const prometheus::ClientMetric::Label& l : m.label) {
        if (l.name == "rpc" && l.value == rpc) match = true;
      }
      if (match) return &m.histogram;
    }
  }
  return nullptr;
}

TEST(CallLayerTest, AStepsWaitForItsReadySignalIsReportedApartFromItsDuration) {
  FakeIpcBackend* fake = nullptr;
  EngineOptions o;
  o.allow_cuda_ipc = true;
  o.cpu_workers = 1;
  auto engine = FakeIpcEngine(o, &fake);
  ASSERT_TRUE(engine.ok()) << engine.status();
  prometheus::Registry registry;
  Metrics metrics(registry, "test", "cuda");
  CallLayer layer(engine->get(), &metrics, CallLayerOptions{});

  std::vector<uint8_t> memory(1 << 16, 0xEE);
  RequestContext ctx;
  auto session = (*engine)->OpenSession("test");
  ASSERT_TRUE(session.ok());
  ctx.session_id = session->session_id;
  ctx.peer.transport = PeerInfo::Transport::kUnix;
  auto region = Await<std::string>([&](auto done) {
    (*engine)->RegisterRegion(ctx, {fake->Export(memory.data()), memory.size(), "GPU-fake-0"},
                              done);
  });
  ASSERT_TRUE(region.ok()) << region.status();
  CreateWeightRequest c;
  c.name = "w";
  const std::string w0 = RandomF32(2 * 32, 61);  // InlineF32 points into it
  c.initial = InlineF32(w0, 2, 32);
  auto created = Await<CreateWeightResult>([&](auto d) { (*engine)->CreateWeight(ctx, c, d); });
  ASSERT_TRUE(created.ok()) << created.status();

  // Step 1 of "w": its f32 gradient at offset 0, DQ(W) to 1024, the ready word at 8192.
  constexpr uint64_t kReady = 8192;
  auto step = [&](int64_t n, uint32_t ready_value) {
    auto req = layer.NewRequest("Step");
    auto* r = static_cast<v1::StepRequest*>(req.get());
    r->set_step(n);
    r->add_groups()->set_lr(0.01f);
    v1::StepItem* it = r->add_items();
    it->set_name("w");
    it->mutable_update()->set_dtype(v1::DTYPE_F32);
    it->mutable_update()->add_shape(2);
    it->mutable_update()->add_shape(32);
    it->mutable_update()->mutable_region()->set_region_id(*region);
    it->mutable_dequantized_out()->mutable_region()->set_region_id(*region);
    it->mutable_dequantized_out()->mutable_region()->set_offset(1024);
    r->set_brief_reply(true);
    if (ready_value != 0) {
      r->mutable_ready_signal()->mutable_region()->set_region_id(*region);
      r->mutable_ready_signal()->mutable_region()->set_offset(kReady);
      r->mutable_ready_signal()->set_value(ready_value);
    }
    IncomingCall call;
    call.method = "Step";
    call.context = ctx;
    call.authenticated = true;
    std::promise<std::pair<absl::Status, v1::ReplyHeader>> answered;
    const size_t bytes = r->ByteSizeLong();
    layer.Run(std::move(call), std::move(req), true, bytes,
              [&](const absl::Status& s, std::unique_ptr<google::protobuf::Message> reply) {
                v1::ReplyHeader h;
                if (reply != nullptr) h = static_cast<v1::StepReply*>(reply.get())->header();
                answered.set_value({s, h});
              });
    return answered.get_future().get();
  };

  const std::string g = RandomF32(2 * 32, 62);
  std::memcpy(memory.data(), g.data(), g.size());
  // Without a ready signal: nothing waited, nothing observed.
  auto [plain, plain_header] = step(1, 0);
  ASSERT_TRUE(plain.ok()) << plain;
  EXPECT_EQ(plain_header.ready_wait_micros(), 0.0);
  auto families = registry.Collect();
  const auto* wait = FindHistogram(families, "fp4q_step_ready_wait_seconds", "");
  ASSERT_NE(wait, nullptr);
  EXPECT_EQ(wait->sample_count, 0u);

  // The worker's stream writes the word 300 ms after the step arrived.
  std::thread worker([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    __atomic_store_n(reinterpret_cast<uint32_t*>(memory.data() + kReady), 1u, __ATOMIC_RELEASE);
  });
  auto [waited, header] = step(2, 1);
  worker.join();
  ASSERT_TRUE(waited.ok()) << waited;
  EXPECT_GE(header.ready_wait_micros(), 280000.0);
  EXPECT_GE(header.server_micros(), header.ready_wait_micros()) << "server_micros includes it";

  families = registry.Collect();
  wait = FindHistogram(families, "fp4q_step_ready_wait_seconds", "");
  ASSERT_NE(wait, nullptr);
  EXPECT_EQ(wait->sample_count, 1u);
  EXPECT_GE(wait->sample_sum, 0.28);
  const auto* duration = FindHistogram(families, "fp4q_request_duration_seconds", "Step");
  ASSERT_NE(duration, nullptr);
  EXPECT_EQ(duration->sample_count, 2u);
  // Both steps' own time (a 2 x 32 weight on the CPU), the 300 ms wait left out.
  EXPECT_LT(duration->sample_sum, 0.2);
}

}  // namespace
}  // namespace fp4q::server
