// The fuzz targets' fixture: a fresh engine on the fake IPC backend over host memory (the
// engine tests' FakeIpcBackend) with weights "w" (error feedback) and "plain" ([16, 32], last
// step 5), residual key "r" ([2, 16], step 3), and a 64 KiB region in the caller's session
// ("mine") and one in another session. Used by fuzz_request.cc and fuzz_fast_socket.cc.
#ifndef FP4Q_TESTS_FUZZ_FUZZ_FIXTURE_H_
#define FP4Q_TESTS_FUZZ_FUZZ_FIXTURE_H_

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "server/engine.h"
#include "server/engine_test_util.h"

namespace fp4q::server::fuzzing {

using ::fp4q::server::testing::Await;
using ::fp4q::server::testing::FakeIpcBackend;

constexpr size_t kRegionBytes = 1 << 16;

struct Fixture {
  FakeIpcBackend* fake = nullptr;
  std::unique_ptr<Engine> engine;
  RequestContext mine, none;
  std::string region, other_region;
  std::string other_session;  // the session holding other_region
  std::vector<uint8_t> memory = std::vector<uint8_t>(kRegionBytes, 0xA5);
  std::vector<uint8_t> other_memory = std::vector<uint8_t>(kRegionBytes, 0x5A);
};

inline void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz: invariant broken: %s\n", what);
    std::abort();
  }
}

inline std::unique_ptr<Fixture> MakeFixture() {
  auto f = std::make_unique<Fixture>();
  auto backend = std::make_unique<FakeIpcBackend>("GPU-fake-0");
  f->fake = backend.get();
  std::vector<std::unique_ptr<kernels::Backend>> b;
  b.push_back(std::move(backend));
  EngineOptions o;
  o.state_budget_bytes = 1 << 20;
  o.cpu_workers = 1;
  o.allow_cuda_ipc = true;
  o.quality_sample_every = 1;
  o.step_ready_timeout = absl::Milliseconds(2);  // a ready word never written ends the step soon
  auto e = Engine::Create(DeviceSet::FromBackends(std::move(b), true), o, nullptr, nullptr);
  Check(e.ok(), "engine");
  f->engine = std::move(*e);
  Engine& engine = *f->engine;
  for (auto* ctx : {&f->mine, &f->none}) ctx->peer.transport = PeerInfo::Transport::kUnix;
  RequestContext other = f->mine;
  f->mine.session_id = engine.OpenSession("fuzz")->session_id;
  other.session_id = engine.OpenSession("other")->session_id;
  f->other_session = other.session_id;
  auto reg = [&](const RequestContext& ctx, std::vector<uint8_t>& mem) {
    auto id = Await<std::string>([&](auto done) {
      engine.RegisterRegion(ctx, {f->fake->Export(mem.data()), kRegionBytes, "GPU-fake-0"}, done);
    });
    Check(id.ok(), "register");
    return *id;
  };
  f->region = reg(f->mine, f->memory);
  f->other_region = reg(other, f->other_memory);
  const std::string x = testing::RandomF32(16 * 32, 1);
  for (const char* name : {"w", "plain"}) {
    CreateWeightRequest c;
    c.name = name;
    c.initial = testing::InlineF32(x, 16, 32);
    c.options.error_feedback = std::string(name) == "w";
    c.step = 5;
    Check(Await<CreateWeightResult>([&](auto d) { engine.CreateWeight(f->none, c, d); }).ok(),
          "create");
  }
  // Weights with optimizer state, so Step reaches AdamW (NVFP4 moments, delayed scaling) and
  // SGD momentum (16x16 blocks, stochastic rounding) as well.
  {
    CreateWeightRequest c;
    c.name = "adam";
    c.initial = testing::InlineF32(x, 16, 32);
    c.options.error_feedback = true;
    c.options.scaling = kernels::Scaling::kDelayed;
    c.options.optimizer.set = true;
    c.options.optimizer.kind = kernels::OptimizerKind::kAdamW;
    c.options.optimizer.dtype = kernels::StateDType::kNvfp4;
    c.step = 5;
    Check(Await<CreateWeightResult>([&](auto d) { engine.CreateWeight(f->none, c, d); }).ok(),
          "create adam");
    c.name = "mom";
    c.options = WeightOptionsIn();
    c.options.block = kernels::BlockShape::k16x16;
    c.options.rounding = kernels::Rounding::kStochastic;
    c.options.optimizer.set = true;
    c.options.optimizer.momentum = true;
    Check(Await<CreateWeightResult>([&](auto d) { engine.CreateWeight(f->none, c, d); }).ok(),
          "create mom");
  }
  const std::string r = testing::RandomF32(32, 2);
  QdqRequest q;
  q.input = testing::InlineF32(r, 2, 16);
  q.options.residual_key = "r";
  q.options.quant.step = 3;
  Check(Await<QdqResult>([&](auto d) { engine.Qdq(f->none, q, d); }).ok(), "residual");
  return f;
}

// "R" -> the caller's region, "S" -> the other session's.
}  // namespace fp4q::server::fuzzing

#endif  // FP4Q_TESTS_FUZZ_FUZZ_FIXTURE_H_
