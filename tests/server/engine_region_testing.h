// The fixture of the engine's region tests (engine_region_test.cc, engine_region_one_pass_test.cc):
// an engine on a fake IPC backend over host memory, one session, one registered region of
// poisoned host memory.
#ifndef FP4Q_TESTS_SERVER_ENGINE_REGION_TESTING_H_
#define FP4Q_TESTS_SERVER_ENGINE_REGION_TESTING_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine_test_util.h"
#include "gtest/gtest.h"
#include "server/engine.h"

namespace fp4q::server {

using ::fp4q::server::testing::Await;
using ::fp4q::server::testing::FakeIpcBackend;
using ::fp4q::server::testing::FakeIpcEngine;
using ::fp4q::server::testing::RegionF32;
using ::fp4q::server::testing::RegionTarget;

constexpr size_t kRegionBytes = 1 << 16;

class EngineRegionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    EngineOptions o;
    o.allow_cuda_ipc = true;
    o.cpu_workers = 1;
    Tune(&o);
    auto e = FakeIpcEngine(o, &fake_);
    ASSERT_TRUE(e.ok()) << e.status();
    engine_ = std::move(*e);
    memory_.assign(kRegionBytes, 0xEE);  // poison: outputs must overwrite it
    auto s = engine_->OpenSession("test");
    ASSERT_TRUE(s.ok());
    ctx_.session_id = s->session_id;
    ctx_.peer.transport = PeerInfo::Transport::kUnix;  // IPC registration needs the Unix socket
    auto id = Await<std::string>([&](auto done) {
      engine_->RegisterRegion(ctx_, {fake_->Export(memory_.data()), kRegionBytes, "GPU-fake-0"},
                              done);
    });
    ASSERT_TRUE(id.ok()) << id.status();
    region_ = *id;
  }
  absl::StatusOr<QuantizeResult> Quantize(const QuantizeRequest& r,
                                          const RequestContext* ctx = nullptr) {
    return Await<QuantizeResult>([&](auto done) { engine_->Quantize(ctx ? *ctx : ctx_, r, done); });
  }

  // A one-item step (lr 0.01) of weight `name`: its update the 2 x 32 f32 at offset 0 of the
  // region, DQ(W) to offset `out`, the done signal `done_value` at `done_at` of `done_region`
  // (empty: the region).
  StepRequest OneItemStep(int64_t n, const std::string& name, uint64_t out, uint64_t done_at,
                          uint32_t done_value, const std::string& done_region = "") {
    StepRequest r;
    r.step = n;
    HyperIn h;
    h.lr = 0.01f;
    r.groups = {h};
    StepItemIn it;
    it.name = name;
    it.update = RegionF32(region_, 0, 2, 32);
    it.dequantized_out = RegionTarget(region_, out);
    r.items.push_back(it);
    r.has_done_signal = true;
    r.done_signal = RegionSlice{done_region.empty() ? region_ : done_region, done_at};
    r.done_value = done_value;
    return r;
  }

  // A fixture's changes to the engine's options.
  virtual void Tune(EngineOptions*) {}
  // `emulate`: the backend has device-side signals; `device_signals`: the step takes them.
  void ReadySignalHoldsTheStep(bool emulate, bool device_signals);

  FakeIpcBackend* fake_ = nullptr;
  std::unique_ptr<Engine> engine_;
  std::vector<uint8_t> memory_;
  RequestContext ctx_;
  std::string region_;
};

}  // namespace fp4q::server

#endif  // FP4Q_TESTS_SERVER_ENGINE_REGION_TESTING_H_
