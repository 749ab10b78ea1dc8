// Engine: tensors in client regions (the CUDA IPC path), on a fake IPC backend over host memory.
#include <atomic>
#include <cstring>
#include <limits>
#include <thread>
#include <vector>

#include "engine_region_testing.h"
#include "engine_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine.h"
#include "testing/status_matchers.h"

namespace fp4q::server {
namespace {

using ::fp4q::server::testing::InlineF32;
using ::fp4q::server::testing::RandomF32;
using ::fp4q::server::testing::RefQuantize;
using ::fp4q::testing::StatusIs;
using ::testing::HasSubstr;

TEST_F(EngineRegionTest, QuantizeInPlaceMatchesTheInlinePath) {
  const std::string x = RandomF32(32 * 64, 21);
  std::memcpy(memory_.data(), x.data(), x.size());
  QuantizeRequest r;
  r.input = RegionF32(region_, 0, 32, 64);
  r.rowwise_codes = RegionTarget(region_, 16384);
  r.rowwise_scales = RegionTarget(region_, 32768);
  auto q = Quantize(r);
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_TRUE(q->rowwise.codes.in_region);
  EXPECT_TRUE(q->rowwise.codes.inline_data.empty());
  EXPECT_EQ(q->rowwise.codes.region.offset, 16384u);
  const auto ref = RefQuantize(x, 32, 64);
  EXPECT_EQ(std::string(reinterpret_cast<char*>(memory_.data()) + 16384, ref.codes.size()),
            ref.codes);
  EXPECT_EQ(std::string(reinterpret_cast<char*>(memory_.data()) + 32768, ref.scales.size()),
            ref.scales);
  EXPECT_EQ(memory_[16384 + ref.codes.size()], 0xEE) << "wrote past the codes";
  EXPECT_EQ(q->rowwise.global_amax, ref.global[0]);
  EXPECT_EQ(q->meta.device_uuid, "GPU-fake-0");
  // Same input inline: same bytes.
  QuantizeRequest inl;
  inl.input = InlineF32(x, 32, 64);
  auto qi = Quantize(inl);
  ASSERT_TRUE(qi.ok());
  EXPECT_EQ(qi->rowwise.codes.inline_data, ref.codes);
  EXPECT_EQ(engine_->regions().regions(), 1);
}

TEST_F(EngineRegionTest, OffsetPastTheEndIncludingOverflowingSums) {
  QuantizeRequest r;
  r.input = RegionF32(region_, kRegionBytes - 16 * 4 * 2 + 16, 2, 16);  // 128 bytes, 16 over
  EXPECT_THAT(Quantize(r), StatusIs(absl::StatusCode::kInvalidArgument,
                                    HasSubstr("input.region.offset: 65424 + 128 bytes is past the "
                                              "end of the region (65536 bytes)")));
  r.input = RegionF32(region_, std::numeric_limits<uint64_t>::max() - 15, 2, 16);
  EXPECT_THAT(Quantize(r),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("input.region.offset: 18446744073709551600 + 128 bytes is past")));
  r.input = RegionF32(region_, 0, 2, 16);
  r.rowwise_codes = RegionTarget(region_, std::numeric_limits<uint64_t>::max() - 15);
  EXPECT_THAT(Quantize(r),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("rowwise_codes.region.offset: 18446744073709551600")));
  // Dimensions whose byte size overflows 64 bits never reach the region check.
  r.rowwise_codes = OutputTarget{};
  r.input = RegionF32(region_, 0, int64_t{1} << 40, int64_t{1} << 40);
  EXPECT_THAT(Quantize(r), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("input.shape")));
}

TEST_F(EngineRegionTest, OtherSessionsRegionIsNotFoundLikeAnUnknownOne) {
  auto other = engine_->OpenSession("other");
  ASSERT_TRUE(other.ok());
  RequestContext octx;
  octx.session_id = other->session_id;
  QuantizeRequest r;
  r.input = RegionF32(region_, 0, 2, 16);
  absl::Status foreign = Quantize(r, &octx).status();
  EXPECT_THAT(foreign, StatusIs(absl::StatusCode::kNotFound,
                                HasSubstr("input.region.region_id: no region '")));
  r.input = RegionF32("no-such-region", 0, 2, 16);
  EXPECT_THAT(Quantize(r),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("input.region.region_id: no region "
                                                              "'no-such-region' in this session")));
  // Exactly the same answer once the id is unknown to everybody.
  auto un = Await<EmptyResult>([&](auto done) { engine_->UnregisterRegion(ctx_, region_, done); });
  ASSERT_TRUE(un.ok()) << un.status();
  r.input = RegionF32(region_, 0, 2, 16);
  EXPECT_EQ(Quantize(r, &octx).status(), foreign);
  EXPECT_EQ(fake_->closes(), 1);
}

TEST_F(EngineRegionTest, OutputsMayNotOverlapOtherSlices) {
  const std::string x = RandomF32(2 * 32, 22);
  std::memcpy(memory_.data(), x.data(), x.size());
  QuantizeRequest r;
  r.input = RegionF32(region_, 0, 2, 32);
  r.rowwise_codes = RegionTarget(region_, 256);   // 32 code bytes
  r.rowwise_scales = RegionTarget(region_, 288);  // 4 scale bytes right after them
  ASSERT_TRUE(Quantize(r).ok());
  r.rowwise_scales = RegionTarget(region_, 272);  // inside the codes
  EXPECT_THAT(Quantize(r), StatusIs(absl::StatusCode::kInvalidArgument,
                                    HasSubstr("rowwise_codes.region: overlaps "
                                              "rowwise_scales.region")));
  r.rowwise_scales = RegionTarget(region_, 288);
  r.rowwise_codes = RegionTarget(region_, 0);  // over the input
  EXPECT_THAT(Quantize(r), StatusIs(absl::StatusCode::kInvalidArgument,
                                    HasSubstr("rowwise_codes.region: overlaps input.region")));
  // QDQ may write over its own input exactly (same dtype).
  QdqRequest q;
  q.input = RegionF32(region_, 0, 2, 32);
  q.out = RegionTarget(region_, 0);
  auto inplace = Await<QdqResult>([&](auto done) { engine_->Qdq(ctx_, q, done); });
  ASSERT_TRUE(inplace.ok()) << inplace.status();
  QdqRequest ref;
  ref.input = InlineF32(x, 2, 32);
  auto inl = Await<QdqResult>([&](auto done) { engine_->Qdq(ctx_, ref, done); });
  ASSERT_TRUE(inl.ok());
  EXPECT_EQ(std::string(reinterpret_cast<char*>(memory_.data()), 2 * 32 * 4),
            inl->output.inline_data);
  q.out = RegionTarget(region_, 16);  // partial overlap
  EXPECT_THAT(
      Await<QdqResult>([&](auto done) { engine_->Qdq(ctx_, q, done); }),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("out.region: overlaps input.region")));
}

TEST_F(EngineRegionTest, StepOutputsMayNotOverlapAnyItemsSlices) {
  // Three 1x16 weights; each item's f32 gradient and DQ(W) output are slices of one region.
  const std::vector<std::string> names = {"a", "b", "c"};
  const std::string init = RandomF32(16, 31);
  for (const std::string& name : names) {
    CreateWeightRequest c;
    c.name = name;
    c.initial = InlineF32(init, 1, 16);
    auto made = Await<CreateWeightResult>([&](auto done) { engine_->CreateWeight(ctx_, c, done); });
    ASSERT_TRUE(made.ok()) << made.status();
  }
  const std::string g = RandomF32(3 * 16, 32);
  std::memcpy(memory_.data(), g.data(), g.size());  // gradients at offsets 0, 64 and 128
  auto step = [&](int64_t n, const std::vector<uint64_t>& outs) {
    StepRequest r;
    r.step = n;
    HyperIn h;
    h.lr = 0.01f;
    r.groups = {h};
    for (size_t i = 0; i < names.size(); ++i) {
      StepItemIn it;
      it.name = names[i];
      it.update = RegionF32(region_, 64 * i, 1, 16);
      it.dequantized_out = RegionTarget(region_, outs[i]);
      r.items.push_back(it);
    }
    return Await<StepResult>([&](auto done) { engine_->Step(ctx_, r, done); });
  };
  ASSERT_TRUE(step(1, {256, 320, 384}).ok());
  // An output over another item's gradient, partly; two outputs over each other.
  EXPECT_THAT(step(2, {256, 320, 32}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "items[2].dequantized_out.region: overlaps items[0].update.region in the "
                       "same client memory"));
  EXPECT_THAT(step(2, {352, 320, 384}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "items[0].dequantized_out.region: overlaps items[1].dequantized_out.region "
                       "in the same client memory"));
  // An output exactly over its own gradient is refused as well.
  EXPECT_THAT(step(2, {256, 64, 384}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "items[1].dequantized_out.region: overlaps items[1].update.region in the "
                       "same client memory"));
  // Nothing was applied by the refusals: step 2 is still new.
  auto ok = step(2, {256, 320, 384});
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE(ok->items[0].applied);
}

// StepRequest.keep_plan / plan_id: a step names the items an earlier step of its session kept,
// and gets the bytes that step would have written had it sent them; every check runs again; what
// a plan cannot hold, or an id the session does not hold, is refused and changes nothing.
TEST_F(EngineRegionTest, StepPlansStepTheKeptItemsAsIfSentAndCheckThemAgain) {
  // Weights a, b, c stepped through a plan and their twins a2, b2, c2 stepped with items:
  // gradients at 0, 64, 128 (f32 1x16), DQ(W) of the planned ones at 1024 + 64 i (f32), of the
  // twins at 2048 + 64 i.
  const std::vector<std::string> names = {"a", "b", "c"};
  for (const std::string& twin : {"", "2"}) {
    for (size_t i = 0; i < names.size(); ++i) {
      CreateWeightRequest c;
      c.name = names[i] + twin;
      const std::string initial = RandomF32(16, 50 + static_cast<uint32_t>(i));
      c.initial = InlineF32(initial, 1, 16);
      ASSERT_TRUE(
          Await<CreateWeightResult>([&](auto d) { engine_->CreateWeight(ctx_, c, d); }).ok());
    }
  }
  auto request = [&](int64_t n, const std::string& twin, uint64_t out) {
    StepRequest r;
    r.step = n;
    HyperIn h;
    h.lr = 0.25f;
    r.groups = {h};
    r.brief_reply = true;
    for (size_t i = 0; i < names.size(); ++i) {
      StepItemIn it;
      it.name = names[i] + twin;
      it.update = RegionF32(region_, 64 * i, 1, 16);
      it.dequantized_out = RegionTarget(region_, out + 64 * i);
      r.items.push_back(it);
    }
    return r;
  };
  auto run = [&](const StepRequest& r, const RequestContext* ctx = nullptr) {
    return Await<StepResult>([&](auto done) { engine_->Step(ctx ? *ctx : ctx_, r, done); });
  };
  auto planned = [&](int64_t n, uint64_t id) {
    StepRequest r = request(n, "", 1024);
    r.items.clear();
    r.plan_id = id;
    return r;
  };
  StepRequest keep = request(1, "", 1024);
  keep.keep_plan = true;
  absl::StatusOr<StepResult> kept = run(keep);
  ASSERT_TRUE(kept.ok()) << kept.status();
  const uint64_t id = kept->plan_id;
  EXPECT_NE(id, 0u);
  EXPECT_EQ(engine_->step_plans().size(), 1);
  ASSERT_TRUE(run(request(1, "2", 2048)).ok());
  for (int64_t n = 2; n <= 4; ++n) {
    const std::string g = RandomF32(3 * 16, 60 + static_cast<uint32_t>(n));
    std::memcpy(memory_.data(), g.data(), g.size());
    std::memset(memory_.data() + 1024, 0xEE, 3 * 64);  // poison: the step must write them
    absl::StatusOr<StepResult> p = run(planned(n, id));
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(p->plan_id, 0u);  // nothing new kept
    ASSERT_EQ(p->items.size(), 3u);
    EXPECT_TRUE(p->items[2].applied);
    ASSERT_TRUE(run(request(n, "2", 2048)).ok());
    EXPECT_EQ(std::memcmp(memory_.data() + 1024, memory_.data() + 2048, 3 * 64), 0)
        << "step " << n;
  }
  // Every check runs again: the same step is a retry (nothing applied), an older one refused.
  absl::StatusOr<StepResult> retry = run(planned(4, id));
  ASSERT_TRUE(retry.ok()) << retry.status();
  EXPECT_FALSE(retry->items[0].applied);
  EXPECT_THAT(run(planned(3, id)),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       "step: 3 is older than the last step 4 of weight 'a'"));
  // What a planned step may not send with its id.
  StepRequest both = planned(5, id);
  both.items = request(5, "", 1024).items;
  EXPECT_THAT(run(both), StatusIs(absl::StatusCode::kInvalidArgument,
                                  absl::StrCat("items: 3 items with plan_id ", id,
                                               "; send the items or a plan, not both")));
  StepRequest listed = planned(5, id);
  listed.brief_reply = false;
  EXPECT_THAT(run(listed),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       absl::StrCat("brief_reply: false with plan_id ", id,
                                    "; a planned step's reply lists no items (send brief_reply "
                                    "true)")));
  StepRequest again = planned(5, id);
  again.keep_plan = true;
  EXPECT_THAT(run(again), StatusIs(absl::StatusCode::kInvalidArgument,
                                   HasSubstr("keep_plan: true with plan_id")));
  // An id this session does not hold, and another session's, read alike.
  const std::string unknown =
      "plan_id: this session holds no step plan 999 (never kept, or dropped: a session keeps "
      "its 16 last used, fp4qd --max_step_plans); send the items again with keep_plan; nothing "
      "was applied";
  EXPECT_THAT(run(planned(5, 999)), StatusIs(absl::StatusCode::kNotFound, unknown));
  auto other = engine_->OpenSession("other");
  ASSERT_TRUE(other.ok());
  RequestContext other_ctx = ctx_;
  other_ctx.session_id = other->session_id;
  EXPECT_THAT(run(planned(5, id), &other_ctx),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr(absl::StrCat("holds no step plan ", id, " "))));
  // What a plan cannot hold: an inline update, a DQ(W) returned inline; no session.
  StepRequest inline_update = request(5, "", 1024);
  inline_update.keep_plan = true;
  const std::string inline_bytes = RandomF32(16, 70);
  inline_update.items[1].update = InlineF32(inline_bytes, 1, 16);
  EXPECT_THAT(run(inline_update),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "items[1].update: inline data; a step plan keeps region slices only (an "
                       "inline update's bytes change every step)"));
  StepRequest returned = request(5, "", 1024);
  returned.keep_plan = true;
  returned.items[2].dequantized_out = OutputTarget{};
  returned.items[2].return_dequantized = true;
  EXPECT_THAT(run(returned), StatusIs(absl::StatusCode::kInvalidArgument,
                                      HasSubstr("items[2].return_dequantized: true; a planned")));
  RequestContext no_session = ctx_;
  no_session.session_id.clear();
  EXPECT_THAT(run(keep, &no_session),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("keep_plan: a step plan belongs to a session")));
  // A step refused on the device keeps no plan.
  const float inf = std::numeric_limits<float>::infinity();
  std::memcpy(memory_.data() + 64 + 4 * 3, &inf, 4);
  StepRequest bad = request(5, "", 1024);
  bad.keep_plan = true;
  EXPECT_THAT(run(bad), StatusIs(absl::StatusCode::kInvalidArgument,
                                 HasSubstr("items[1].update: element 3 is Inf")));
  EXPECT_THAT(run(planned(5, id)), StatusIs(absl::StatusCode::kInvalidArgument,
                                            HasSubstr("items[1].update: element 3 is Inf")));
  EXPECT_EQ(engine_->step_plans().size(), 1);
  const std::string g = RandomF32(3 * 16, 80);
  std::memcpy(memory_.data(), g.data(), g.size());
  ASSERT_TRUE(run(planned(5, id)).ok());  // nothing of the refusals was applied
  // A deleted weight: the plan's step is refused as the items would be.
  NameRequest del;
  del.name = "c";
  ASSERT_TRUE(Await<EmptyResult>([&](auto d) { engine_->DeleteWeight(ctx_, del, d); }).ok());
  EXPECT_THAT(run(planned(6, id)),
              StatusIs(absl::StatusCode::kNotFound, "items[2].name: no weight 'c'"));
  // A session keeps its 16 last used plans; the session's end drops them.
  StepRequest two = request(6, "2", 2048);
  two.keep_plan = true;
  for (int k = 0; k < 16; ++k) {
    two.step = 6 + k;
    ASSERT_TRUE(run(two).ok());
  }
  EXPECT_EQ(engine_->step_plans().size(), 16);
  EXPECT_THAT(run(planned(30, id)), StatusIs(absl::StatusCode::kNotFound, HasSubstr("plan_id:")));
  ASSERT_TRUE(Await<uint32_t>([&](auto done) { engine_->CloseSession(ctx_, done); }).ok());
  EXPECT_EQ(engine_->step_plans().size(), 0);
}

// A planned step shares its plan's items (not copied, their names not checked again); the
// groups they name are the step's own and are checked at every step.
TEST_F(EngineRegionTest, PlannedStepsCheckTheGroupsTheirItemsName) {
  for (const std::string& name : {"g0", "g1"}) {
    CreateWeightRequest c;
    c.name = name;
    const std::string initial = RandomF32(16, name == "g0" ? 70 : 71);
    c.initial = InlineF32(initial, 1, 16);
    ASSERT_TRUE(Await<CreateWeightResult>([&](auto d) { engine_->CreateWeight(ctx_, c, d); }).ok());
  }
  const std::string g = RandomF32(32, 72);
  std::memcpy(memory_.data(), g.data(), g.size());
  auto run = [&](const StepRequest& r) {
    return Await<StepResult>([&](auto done) { engine_->Step(ctx_, r, done); });
  };
  auto step = [&](int64_t n, int groups) {
    StepRequest r;
    r.step = n;
    for (int k = 0; k < groups; ++k) {
      HyperIn h;
      h.lr = 0.1f * static_cast<float>(k + 1);
      r.groups.push_back(h);
    }
    r.brief_reply = true;
    return r;
  };
  StepRequest keep = step(1, 2);
  for (int i = 0; i < 2; ++i) {
    StepItemIn it;
    it.name = i == 0 ? "g0" : "g1";
    it.group = static_cast<uint32_t>(i);
    it.update = RegionF32(region_, 64 * i, 1, 16);
    it.dequantized_out = RegionTarget(region_, 1024 + 64 * i);
    keep.items.push_back(it);
  }
  keep.keep_plan = true;
  absl::StatusOr<StepResult> kept = run(keep);
  ASSERT_TRUE(kept.ok()) << kept.status();
  StepRequest one_group = step(2, 1);
  one_group.plan_id = kept->plan_id;
  std::memset(memory_.data() + 1024, 0xEE, 128);
  EXPECT_THAT(run(one_group), StatusIs(absl::StatusCode::kInvalidArgument,
                                       "items[1].group: 1 but the step has 1 groups"));
  EXPECT_EQ(memory_[1024], 0xEE);  // nothing written
  StepRequest two_groups = step(2, 2);
  two_groups.plan_id = kept->plan_id;
  absl::StatusOr<StepResult> applied = run(two_groups);
  ASSERT_TRUE(applied.ok()) << applied.status();
  ASSERT_EQ(applied->items.size(), 2u);
  for (const StepItemResult& r : applied->items) {
    EXPECT_TRUE(r.applied) << r.name;  // step 2 was not applied by the refused one
    EXPECT_EQ(r.last_step, 2);
  }
  EXPECT_NE(memory_[1024], 0xEE);
}

// fp4qd --max_step_plans 0: no "step_plans" in ServerInfo, and keep_plan is refused before
// anything runs.
TEST(EngineStepPlanOffTest, NoPlansAreOfferedOrKept) {
  FakeIpcBackend* fake = nullptr;
  EngineOptions o;
  o.allow_cuda_ipc = true;
  o.cpu_workers = 1;
  o.max_step_plans = 0;
  auto e = FakeIpcEngine(o, &fake);
  ASSERT_TRUE(e.ok()) << e.status();
  Engine& engine = **e;
  const ServerInfoResult info = engine.ServerInfo();
  EXPECT_THAT(info.supported_modes, ::testing::Contains("step_ready_signal"));
  EXPECT_THAT(info.supported_modes, ::testing::Not(::testing::Contains("step_plans")));
  EXPECT_EQ(info.max_step_plans, 0u);
  auto session = engine.OpenSession("test");
  ASSERT_TRUE(session.ok());
  RequestContext ctx;
  ctx.session_id = session->session_id;
  ctx.peer.transport = PeerInfo::Transport::kUnix;
  std::vector<uint8_t> memory(4096, 0);
  auto region = Await<std::string>([&](auto done) {
    engine.RegisterRegion(ctx, {fake->Export(memory.data()), memory.size(), "GPU-fake-0"}, done);
  });
  ASSERT_TRUE(region.ok()) << region.status();
  CreateWeightRequest c;
  c.name = "w";
  const std::string initial = RandomF32(16, 3);
  c.initial = InlineF32(initial, 1, 16);
  ASSERT_TRUE(Await<CreateWeightResult>([&](auto d) { engine.CreateWeight(ctx, c, d); }).ok());
  StepRequest r;
  r.step = 1;
  r.groups = {HyperIn{}};
  r.brief_reply = true;
  r.keep_plan = true;
  StepItemIn it;
  it.name = "w";
  it.update = RegionF32(*region, 0, 1, 16);
  r.items.push_back(it);
  EXPECT_THAT(Await<StepResult>([&](auto done) { engine.Step(ctx, r, done); }),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       "keep_plan: this server keeps no step plans (fp4qd --max_step_plans 0)"));
  r.keep_plan = false;
  absl::StatusOr<StepResult> sent = Await<StepResult>([&](auto done) { engine.Step(ctx, r, done); });
  ASSERT_TRUE(sent.ok()) << sent.status();
  EXPECT_TRUE(sent->items[0].applied);  // step 1 was still new: the refusal changed nothing
}

// StepRequest.done_signal: its value lands in the region after the step's device work, applied
// or refused on the device; a request refused before that leaves it unwritten, names the field
// and changes nothing.
TEST_F(EngineRegionTest, StepDoneSignalIsWrittenAfterTheDeviceWorkWhateverItsOutcome) {
  CreateWeightRequest c;
  c.name = "w";
  const std::string initial = RandomF32(2 * 32, 41);
  c.initial = InlineF32(initial, 2, 32);
  ASSERT_TRUE(Await<CreateWeightResult>([&](auto d) { engine_->CreateWeight(ctx_, c, d); }).ok());
  const std::string g = RandomF32(2 * 32, 42);
  std::memcpy(memory_.data(), g.data(), g.size());
  constexpr uint64_t kSignal = 4096;
  auto signal = [&] {
    uint32_t v;
    std::memcpy(&v, memory_.data() + kSignal, 4);
    return v;
  };
  auto step = [&](int64_t n, uint64_t at, uint32_t value, const std::string& name = "w",
                  const std::string& region = "") {
    StepRequest r = OneItemStep(n, name, 1024, at, value, region);
    return Await<StepResult>([&](auto done) { engine_->Step(ctx_, r, done); });
  };
  EXPECT_THAT(engine_->ServerInfo().supported_modes, ::testing::Contains("step_done_signal"));
  EXPECT_EQ(signal(), 0xEEEEEEEEu);  // poisoned
  // Refused before any device work: unwritten, named, nothing applied.
  EXPECT_THAT(step(1, kSignal + 8, 7),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "done_signal.region.offset: 4104 is not a multiple of 16"));
  EXPECT_THAT(step(1, kRegionBytes - 2, 7),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("done_signal.region.offset: 65534 is not a multiple of 16")));
  EXPECT_THAT(step(1, kRegionBytes, 7),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "done_signal.region.offset: 65536 + 4 bytes is past the end of the "
                       "region (65536 bytes)"));
  EXPECT_THAT(step(1, kSignal, 7, "w", "nope"),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("done_signal.region.region_id: no region 'nope'")));
  EXPECT_THAT(step(1, kSignal, 7, "missing"),
              StatusIs(absl::StatusCode::kNotFound, "items[0].name: no weight 'missing'"));
  EXPECT_EQ(signal(), 0xEEEEEEEEu);
  EXPECT_EQ(memory_[1024], 0xEE) << "a refused step wrote its DQ(W)";
  // Applied: DQ(W) written, then the signal.
  auto ok = step(1, kSignal, 7);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE(ok->items[0].applied);
  EXPECT_EQ(signal(), 7u);
  EXPECT_NE(memory_[1024], 0xEE);
  EXPECT_EQ(memory_[kSignal + 4], 0xEE) << "wrote past the signal's 4 bytes";
  // A retry of the applied step: answered "already applied", signalled again.
  auto again = step(1, kSignal, 8);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(again->items[0].applied);
  EXPECT_EQ(signal(), 8u);
  // Refused on the device (a NaN gradient): signalled, nothing applied.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(memory_.data() + 4 * 5, &nan, 4);
  EXPECT_THAT(step(2, kSignal, 9), StatusIs(absl::StatusCode::kInvalidArgument,
                                            HasSubstr("items[0].update: element 5 is NaN")));
  EXPECT_EQ(signal(), 9u);
  std::memcpy(memory_.data(), g.data(), g.size());
  auto next = step(2, kSignal, 10);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_TRUE(next->items[0].applied) << "the refused step 2 changed the weight's last step";
  EXPECT_EQ(signal(), 10u);
}

}  // namespace

// StepRequest.ready_signal: the step reads no update before the worker's stream has written the
// value (or a later one, modulo 2^32); a signal that does not come in time refuses the step with
// nothing changed, and its done signal is still written.
// The ready signal's contract, on a backend without device-side signals (fp4qd polls the word,
// then runs the step) and on one with them (the step is queued behind a device-side wait, the
// host watches the word and past the timeout cancels the step and releases the wait).
void EngineRegionTest::ReadySignalHoldsTheStep(bool emulate, bool device_signals) {
  if (emulate) fake_->EmulateDeviceSignals();
  const std::string w0 = RandomF32(2 * 32, 51);
  for (const char* name : {"w", "ref"}) {
    CreateWeightRequest c;
    c.name = name;
    c.initial = InlineF32(w0, 2, 32);
    ASSERT_TRUE(Await<CreateWeightResult>([&](auto d) { engine_->CreateWeight(ctx_, c, d); }).ok());
  }
  const std::string g = RandomF32(2 * 32, 52);
  constexpr uint64_t kReady = 8192, kDone = 4096, kOut = 1024, kRefOut = 2048;
  uint32_t* ready = reinterpret_cast<uint32_t*>(memory_.data() + kReady);
  auto done_value = [&] {
    uint32_t v;
    std::memcpy(&v, memory_.data() + kDone, 4);
    return v;
  };
  auto step = [&](const std::string& name, int64_t n, uint64_t out, bool with_ready,
                  uint64_t at, uint32_t value, uint32_t timeout_ms, const RequestContext& ctx) {
    StepRequest r = OneItemStep(n, name, out, kDone, value);
    r.has_ready_signal = with_ready;
    r.ready_signal = RegionSlice{region_, at};
    r.ready_value = value;
    r.ready_timeout_ms = timeout_ms;
    return Await<StepResult>([&](auto d) { engine_->Step(ctx, r, d); });
  };
  EXPECT_THAT(engine_->ServerInfo().supported_modes, ::testing::Contains("step_ready_signal"));
  // The reference: the same step with the gradient in place up front.
  std::memcpy(memory_.data(), g.data(), g.size());
  {
    auto ref = step("ref", 1, kRefOut, false, 0, 1, 0, ctx_);
    ASSERT_TRUE(ref.ok()) << ref.status();
    EXPECT_FALSE(ref->meta.ready_waited);
    EXPECT_EQ(ref->meta.ready_wait_micros, 0.0);
  }
  // Poisoned gradient (0xEE bytes: -3.7e28, finite) and signal: a step that read early differs.
  std::memset(memory_.data(), 0xEE, g.size());
  std::memset(memory_.data() + kDone, 0xEE, 4);
  EXPECT_THAT(step("w", 1, kOut, true, kReady + 8, 5, 0, ctx_),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "ready_signal.region.offset: 8200 is not a multiple of 16"));
  EXPECT_THAT(step("w", 1, kOut, true, kReady, 5, 60000, ctx_),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "ready_signal.timeout_ms: 60000 is over this server's most, 5000 "
                       "(--step_ready_timeout_ms)"));
  EXPECT_EQ(done_value(), 0xEEEEEEEEu) << "refused before the device work: unwritten";
  EXPECT_THAT(step("w", 1, kOut, true, kReady, 5, 30, ctx_),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       "ready_signal: the worker's stream did not write 5 within 30 ms (it "
                       "holds 4008636142); the step changed nothing"));
  EXPECT_EQ(done_value(), 5u) << "a step refused on its ready signal still signals done";
  // Device-side, the cancelled step's wait was released by writing its value into the word.
  EXPECT_EQ(__atomic_load_n(ready, __ATOMIC_ACQUIRE), device_signals ? 5u : 0xEEEEEEEEu);
  RequestContext soon = ctx_;
  soon.deadline = absl::Now() + absl::Milliseconds(30);
  EXPECT_THAT(step("w", 1, kOut, true, kReady, 6, 0, soon),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       HasSubstr(absl::StrCat("ready_signal: still waiting for 6 (it holds ",
                                              device_signals ? 5u : 4008636142u, "): "))));
  EXPECT_EQ(memory_[kOut], 0xEE) << "a refused step wrote its DQ(W)";
  // The worker writes the gradient, then the signal, 50 ms after the step arrived.
  std::thread worker([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::memcpy(memory_.data(), g.data(), g.size());
    __atomic_store_n(ready, 7u, __ATOMIC_RELEASE);
  });
  auto ok = step("w", 1, kOut, true, kReady, 7, 0, ctx_);
  worker.join();
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE(ok->items[0].applied) << "the refused tries changed the weight's last step";
  // The wait is reported apart (the reply header's ready_wait_micros; the metrics leave it out
  // of the request's duration): at least the worker's 50 ms, and not the reference step's.
  EXPECT_TRUE(ok->meta.ready_waited);
  EXPECT_GE(ok->meta.ready_wait_micros, 45000.0);
  EXPECT_EQ(done_value(), 7u);
  EXPECT_EQ(0, std::memcmp(memory_.data() + kOut, memory_.data() + kRefOut, 2 * 32 * 4))
      << "the step read the gradient before its ready signal";
  // Modulo 2^32: a later value (wrapped) is ready too; the retry answers "already applied".
  __atomic_store_n(ready, 3u, __ATOMIC_RELEASE);
  auto wrapped = step("w", 1, kOut, true, kReady, 0xFFFFFFFEu, 30, ctx_);
  ASSERT_TRUE(wrapped.ok()) << wrapped.status();
  EXPECT_FALSE(wrapped->items[0].applied);
  EXPECT_TRUE(wrapped->meta.ready_waited);
  EXPECT_LT(wrapped->meta.ready_wait_micros, 30000.0) << "the word was ready at once";
  EXPECT_EQ(done_value(), 0xFFFFFFFEu) << "a retry signals done too (from the host)";
  // Device-side: every step with a ready signal that got past validation queued its wait (the
  // 30 ms timeout, the 30 ms deadline, the worker's, the wrapped retry).
  EXPECT_EQ(fake_->device_waits(), device_signals ? 4 : 0);
}

namespace {

TEST_F(EngineRegionTest, StepReadySignalHoldsTheStepUntilTheWorkerWritesIt) {
  ReadySignalHoldsTheStep(false, false);
}

TEST_F(EngineRegionTest, StepReadySignalHoldsADeviceQueuedStepUntilTheWorkerWritesIt) {
  ReadySignalHoldsTheStep(true, true);
}

// --step_device_signals=false: a backend that has them is polled from the host all the same.
class EngineRegionHostSignalsTest : public EngineRegionTest {
 protected:
  void Tune(EngineOptions* o) override { o->step_device_signals = false; }
};

TEST_F(EngineRegionHostSignalsTest, StepDeviceSignalsOffPollsFromTheHost) {
  ReadySignalHoldsTheStep(true, false);
}

TEST_F(EngineRegionTest, RegionLargerThanItsAllocationIsRefused) {
  std::vector<uint8_t> small(4096, 0xEE);
  const std::string handle = fake_->Export(small.data(), small.size());
  const int closes = fake_->closes();
  auto too_big = Await<std::string>([&](auto done) {
    engine_->RegisterRegion(ctx_, {handle, small.size() + 1, "GPU-fake-0"}, done);
  });
  EXPECT_THAT(too_big.status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("size: 4097 bytes is larger than the allocation behind "
                                 "ipc_handle (4096 bytes)")));
  // The mapping opened to measure it was closed again; nothing was registered.
  EXPECT_EQ(fake_->closes(), closes + 1);
  EXPECT_EQ(engine_->regions().regions(), 1);
  EXPECT_EQ(engine_->regions().open_handles(), 1);
  auto fits = Await<std::string>([&](auto done) {
    engine_->RegisterRegion(ctx_, {handle, small.size(), "GPU-fake-0"}, done);
  });
  ASSERT_TRUE(fits.ok()) << fits.status();
  EXPECT_EQ(engine_->regions().regions(), 2);
  EXPECT_EQ(engine_->regions().open_handles(), 2);
}

TEST_F(EngineRegionTest, CloseSessionReleasesRegionsAndHandles) {
  auto n = Await<uint32_t>([&](auto done) { engine_->CloseSession(ctx_, done); });
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 1u);
  EXPECT_EQ(engine_->regions().regions(), 0);
  EXPECT_EQ(engine_->regions().open_handles(), 0);
  QuantizeRequest r;
  r.input = RegionF32(region_, 0, 2, 16);
  // The session is gone, and with it the namespace its names lived in.
  EXPECT_THAT(Quantize(r), StatusIs(absl::StatusCode::kNotFound,
                                    HasSubstr("fp4q-session: unknown or expired session")));
}

TEST_F(EngineRegionTest, StickyDeviceErrorPoisonsTheEngineOnce) {
  std::atomic<int> calls{0};
  absl::Status seen;
  engine_->SetPoisonHandler([&](const absl::Status& s) {
    seen = s;
    ++calls;
  });
  QuantizeRequest r;
  const std::string x = RandomF32(2 * 16, 3);
  r.input = InlineF32(x, 2, 16);
  ASSERT_TRUE(Quantize(r).ok());
  EXPECT_TRUE(engine_->poisoned().ok());
  fake_->Poison();
  Quantize(r).IgnoreError();
  Quantize(r).IgnoreError();
  EXPECT_EQ(calls.load(), 1);
  EXPECT_THAT(seen, StatusIs(absl::StatusCode::kInternal, HasSubstr("illegal memory access")));
  EXPECT_THAT(engine_->poisoned(),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("illegal memory access")));
}

}  // namespace
}  // namespace fp4q::server
