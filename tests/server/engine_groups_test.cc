// Engine: replica groups on the CPU backend. A K-rank step equals a one-worker replay of the
// rank-order mean; a group's weights spread over the devices step where they live; a failing,
// late, disagreeing or lost rank applies nothing; bad joins are refused.
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "engine_step_testing.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace fp4q::server {
namespace {

using ::fp4q::testing::StatusIs;
using ::testing::HasSubstr;

TEST_F(EngineStepTest, ReplicaGroupEqualsARankOrderReplay) {
  constexpr int kRanks = 3;
  ASSERT_TRUE(Create("g", 16, 32, 1).ok());
  ASSERT_TRUE(Create("replay", 16, 32, 1).ok());
  std::vector<RequestContext> ctx = JoinRanks(kRanks);
  ASSERT_FALSE(HasFailure());
  for (int64_t step = 1; step <= 3; ++step) {
    std::vector<std::string> grads;
    for (int r = 0; r < kRanks; ++r) {
      grads.push_back(RandomF32(16 * 32, static_cast<uint32_t>(1000 * step + r)));
    }
    std::vector<absl::StatusOr<StepResult>> results(kRanks, absl::UnknownError("unset"));
    std::vector<std::thread> threads;
    for (int r = 0; r < kRanks; ++r) {
      threads.emplace_back([&, r] {
        StepRequest req;
        req.step = step;
        req.groups = {Sgd(0.25f)};
        req.items = {Item("g", grads[r], 16, 32)};
        req.has_replica = true;
        req.replica_group = "dp";
        req.rank = static_cast<uint32_t>(r);
        results[r] = Step(req, ctx[r]);
      });
    }
    for (auto& t : threads) t.join();
    // The replay: f32 adds in rank order, then / K.
    std::vector<float> sum(16 * 32);
    for (int r = 0; r < kRanks; ++r) {
      const std::vector<float> g = testing::AsFloats(grads[r]);
      for (size_t i = 0; i < sum.size(); ++i) sum[i] = r == 0 ? g[i] : sum[i] + g[i];
    }
    for (float& v : sum) v = v / static_cast<float>(kRanks);
    std::string mean(sum.size() * 4, '\0');
    std::memcpy(mean.data(), sum.data(), mean.size());
    StepRequest one;
    one.step = step;
    one.groups = {Sgd(0.25f)};
    one.items = {Item("replay", mean, 16, 32)};
    absl::StatusOr<StepResult> replay = Step(one);
    ASSERT_TRUE(replay.ok()) << replay.status();
    for (int r = 0; r < kRanks; ++r) {
      ASSERT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r].status();
      EXPECT_EQ(results[r]->world_size, 3u);
      EXPECT_TRUE(results[r]->items[0].applied);
      EXPECT_EQ(results[r]->items[0].dequantized.inline_data,
                replay->items[0].dequantized.inline_data);
    }
    Snapshot a = Take("g"), b = Take("replay");
    EXPECT_EQ(a.codes, b.codes);
    EXPECT_EQ(a.residual, b.residual);
  }
  // A rank retrying the applied step alone with the same update: applied=false; with another:
  // refused.
  StepRequest retry;
  retry.step = 3;
  retry.groups = {Sgd(0.25f)};
  retry.items = {Item("g", RandomF32(16 * 32, 3001), 16, 32)};
  retry.has_replica = true;
  retry.replica_group = "dp";
  retry.rank = 1;
  absl::StatusOr<StepResult> same = Step(retry, ctx[1]);
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_FALSE(same->items[0].applied);
  retry.items = {Item("g", RandomF32(16 * 32, 4242), 16, 32)};
  EXPECT_THAT(Step(retry, ctx[1]),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("rank 1's items[0].update: weight 'g' already applied step 3 with a "
                                 "different update")));
}

// A group's weights spread over the devices that serve it: each new weight goes to the device
// holding the fewest state bytes unless the caller names one; the group's step updates every
// weight on its holder, and the result equals a one-device engine's, bit for bit.
TEST_F(EngineStepTest, AGroupsWeightsSpreadOverTheDevicesAndStepWhereTheyLive) {
  std::unique_ptr<Engine> single = std::move(engine_);
  {
    std::vector<std::unique_ptr<kernels::Backend>> b;
    b.push_back(std::make_unique<testing::FakeIpcBackend>("GPU-fake-0"));
    b.push_back(std::make_unique<testing::FakeIpcBackend>("GPU-fake-1"));
    EngineOptions o;
    o.state_budget_bytes = uint64_t{1} << 30;
    auto e = Engine::Create(DeviceSet::FromBackends(std::move(b), true), o, nullptr, nullptr);
    ASSERT_TRUE(e.ok()) << e.status();
    engine_ = std::move(*e);
  }
  struct Shape {
    const char* name;
    int64_t rows, cols;
  };
  const std::vector<Shape> shapes = {{"a", 16, 32}, {"b", 32, 32}, {"c", 16, 64}, {"d", 16, 32}};
  std::map<std::string, std::string> placed;
  for (size_t i = 0; i < shapes.size(); ++i) {
    CreateWeightRequest r;
    r.name = shapes[i].name;
    init_[r.name] = RandomF32(shapes[i].rows * shapes[i].cols, 10 + i, 0.05f);
    r.initial = InlineF32(init_[r.name], shapes[i].rows, shapes[i].cols);
    r.options.error_feedback = true;
    r.options.seed = 99;
    if (i == 3) r.device_uuid = "GPU-fake-0";  // the caller's placement
    absl::StatusOr<CreateWeightResult> c =
        Await<CreateWeightResult>([&](auto d) { engine_->CreateWeight({}, r, d); });
    ASSERT_TRUE(c.ok()) << c.status();
    placed[r.name] = c->weight.device_uuid;
  }
  // By state bytes: a (0 vs 0 bytes) on the first, b on the other, c beside the smaller a;
  // d where it was asked for.
  EXPECT_EQ(placed, (std::map<std::string, std::string>{
                        {"a", "GPU-fake-0"}, {"b", "GPU-fake-1"}, {"c", "GPU-fake-0"},
                        {"d", "GPU-fake-0"}}));
  std::vector<RequestContext> ctx = JoinRanks(2);
  ASSERT_FALSE(HasFailure());
  std::vector<std::vector<std::string>> grads;  // [step][rank * 4 + weight]
  for (int64_t step = 1; step <= 2; ++step) {
    grads.emplace_back();
    for (int r = 0; r < 2; ++r) {
      for (size_t i = 0; i < shapes.size(); ++i) {
        grads.back().push_back(RandomF32(shapes[i].rows * shapes[i].cols,
                                         static_cast<uint32_t>(100 * step + 10 * r + i)));
      }
    }
    std::vector<absl::StatusOr<StepResult>> results(2, absl::UnknownError("unset"));
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r) {
      threads.emplace_back([&, r] {
        StepRequest req;
        req.step = step;
        req.groups = {Sgd(0.25f)};
        for (size_t i = 0; i < shapes.size(); ++i) {
          req.items.push_back(Item(shapes[i].name, grads.back()[r * shapes.size() + i],
                                   shapes[i].rows, shapes[i].cols));
        }
        req.has_replica = true;
        req.replica_group = "dp";
        req.rank = static_cast<uint32_t>(r);
        results[r] = Step(req, ctx[r]);
      });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < 2; ++r) ASSERT_TRUE(results[r].ok()) << results[r].status();
  }
  {  // A done signal is written after one device's work: refused for this spread step.
    StepRequest req;
    req.step = 3;
    req.groups = {Sgd(0.25f)};
    for (size_t i = 0; i < shapes.size(); ++i) {
      req.items.push_back(Item(shapes[i].name, grads.back()[i], shapes[i].rows, shapes[i].cols));
    }
    req.has_done_signal = true;
    req.done_signal = RegionSlice{"r", 0};
    EXPECT_THAT(Step(req).status(),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("done_signal: the step's weights are on 2 devices")));
    req.has_done_signal = false;
    req.has_ready_signal = true;
    req.ready_signal = RegionSlice{"r", 0};
    EXPECT_THAT(Step(req).status(),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         "ready_signal: the step's weights are on 2 devices; a ready signal is "
                         "polled on one device (send one step per device, or no ready_signal)"));
  }
  std::map<std::string, Snapshot> spread;
  for (const Shape& w : shapes) spread[w.name] = Take(w.name);
  // The replay on one device: the same weights, each step's two gradients summed in rank
  // order and halved.
  engine_ = std::move(single);
  for (size_t i = 0; i < shapes.size(); ++i) {
    CreateWeightRequest r;
    r.name = shapes[i].name;
    r.initial = InlineF32(init_[r.name], shapes[i].rows, shapes[i].cols);
    r.options.error_feedback = true;
    r.options.seed = 99;
    ASSERT_TRUE(
        Await<CreateWeightResult>([&](auto d) { engine_->CreateWeight({}, r, d); }).ok());
  }
  for (int64_t step = 1; step <= 2; ++step) {
    StepRequest one;
    one.step = step;
    one.groups = {Sgd(0.25f)};
    for (size_t i = 0; i < shapes.size(); ++i) {
      const std::vector<float> g0 = testing::AsFloats(grads[step - 1][i]);
      const std::vector<float> g1 = testing::AsFloats(grads[step - 1][shapes.size() + i]);
      std::string mean(g0.size() * 4, '\0');
      for (size_t k = 0; k < g0.size(); ++k) {
        const float v = (g0[k] + g1[k]) / 2.0f;
        std::memcpy(mean.data() + 4 * k, &v, 4);
      }
      one.items.push_back(Item(shapes[i].name, mean, shapes[i].rows, shapes[i].cols));
    }
    ASSERT_TRUE(Step(one).ok());
  }
  for (const Shape& w : shapes) {
    const Snapshot replay = Take(w.name);
    EXPECT_EQ(spread[w.name].codes, replay.codes) << w.name;
    EXPECT_EQ(spread[w.name].residual, replay.residual) << w.name;
    EXPECT_EQ(spread[w.name].last_step, 2) << w.name;
  }
}

TEST_F(EngineStepTest, ReplicaGroupFailuresApplyNothing) {
  ASSERT_TRUE(Create("g", 16, 32, 1).ok());
  const Snapshot before = Take("g");
  std::vector<RequestContext> ctx = JoinRanks(2, /*deadline_ms=*/200);
  ASSERT_FALSE(HasFailure());
  auto req = [&](int rank, const std::string& name, int64_t step) {
    StepRequest s;
    s.step = step;
    s.groups = {Sgd(0.1f)};
    s.items = {Item(name, RandomF32(16 * 32, static_cast<uint32_t>(rank)), 16, 32)};
    s.has_replica = true;
    s.replica_group = "dp";
    s.rank = static_cast<uint32_t>(rank);
    return s;
  };
  // A missing rank: the deadline names it.
  EXPECT_THAT(Step(req(0, "g", 1), ctx[0]),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       HasSubstr("replica: ranks [1] of group 'dp' did not send step 1 within "
                                 "200 ms; nothing was applied")));
  EXPECT_TRUE(Take("g") == before);
  // Ranks disagreeing on the names.
  ASSERT_TRUE(Create("h", 16, 32, 2).ok());
  absl::StatusOr<StepResult> first = absl::UnknownError("unset");
  std::thread t([&] { first = Step(req(0, "g", 1), ctx[0]); });
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_THAT(Step(req(1, "h", 1), ctx[1]),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("replica: rank 1's items[0].name ('h' vs 'g') differs from "
                                 "rank 0's")));
  t.join();
  EXPECT_THAT(first, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("differs")));
  EXPECT_TRUE(Take("g") == before);
  // Ranks disagreeing on the step number, a shape or the hyperparameters: rank 1's contribution
  // is refused naming the field, rank 0's fails with it, and nothing is applied.
  auto disagree = [&](StepRequest second, const std::string& message) {
    absl::StatusOr<StepResult> rank0 = absl::UnknownError("unset");
    std::thread r0([&] { rank0 = Step(req(0, "g", 1), ctx[0]); });
    absl::SleepFor(absl::Milliseconds(50));
    EXPECT_THAT(Step(second, ctx[1]),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(message)));
    r0.join();
    EXPECT_THAT(rank0, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(message)));
    EXPECT_TRUE(Take("g") == before) << message;
  };
  disagree(req(1, "g", 2),
           "replica: rank 1 sent step 2 while group 'dp' collects step 1 (ranks must step "
           "together); nothing was applied");
  StepRequest transposed = req(1, "g", 1);
  transposed.items = {Item("g", RandomF32(16 * 32, 1), 32, 16)};
  disagree(transposed,
           "replica: rank 1's items[0].update.shape ([32, 16] vs [16, 32]) differs from rank "
           "0's; nothing was applied");
  StepRequest faster = req(1, "g", 1);
  faster.groups = {Sgd(0.2f)};
  disagree(faster,
           "replica: rank 1's groups[0] hyperparameters differs from rank 0's; nothing was "
           "applied");
  // A session of another namespace cannot reach this namespace's group, and may not name it.
  RequestContext stranger;
  stranger.session_id = engine_->OpenSession(RequestContext{}, "stranger", "job-x")->session_id;
  EXPECT_THAT(Step(req(0, "g", 1), stranger),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("replica.group: no group 'dp' (JoinGroup first)")));
  EXPECT_TRUE(Take("g") == before);
  // A rank whose session ends during the step: named, nothing applied, the rank is free.
  std::thread u([&] { first = Step(req(0, "g", 1), ctx[0]); });
  absl::SleepFor(absl::Milliseconds(50));
  ASSERT_TRUE(Await<uint32_t>([&](auto d) { engine_->CloseSession(ctx[1], d); }).ok());
  u.join();
  EXPECT_THAT(first, StatusIs(absl::StatusCode::kUnavailable,
                              HasSubstr("rank 1 of group 'dp' lost its session")));
  EXPECT_TRUE(Take("g") == before);
  // Bad joins.
  RequestContext other;
  other.session_id = engine_->OpenSession("late")->session_id;
  JoinGroupRequest j;
  j.group = "dp";
  j.world_size = 3;
  j.rank = 1;
  EXPECT_THAT(Await<JoinGroupResult>([&](auto d) { engine_->JoinGroup(other, j, d); }),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("world_size: 3 but group 'dp' has 2 ranks")));
  j.world_size = 2;
  j.rank = 0;
  EXPECT_THAT(Await<JoinGroupResult>([&](auto d) { engine_->JoinGroup(other, j, d); }),
              StatusIs(absl::StatusCode::kAlreadyExists,
                       HasSubstr("rank: 0 of group 'dp' is held by another session")));
  j.rank = 2;
  EXPECT_THAT(Await<JoinGroupResult>([&](auto d) { engine_->JoinGroup(other, j, d); }),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rank: 2 is not in [0, 2)")));
  j.world_size = 0;
  EXPECT_THAT(Await<JoinGroupResult>([&](auto d) { engine_->JoinGroup(other, j, d); }),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("world_size: 0 is not in [1, 64]")));
  j.group = "big";
  j.world_size = 65;  // over --max_world_size (64)
  j.rank = 0;
  EXPECT_THAT(Await<JoinGroupResult>([&](auto d) { engine_->JoinGroup(other, j, d); }),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("world_size: 65 is not in [1, 64]")));
  j.group = "dp";
  j.world_size = 2;
  j.rank = 1;  // freed by the closed session
  EXPECT_TRUE(Await<JoinGroupResult>([&](auto d) { engine_->JoinGroup(other, j, d); }).ok());
}

}  // namespace
}  // namespace fp4q::server
