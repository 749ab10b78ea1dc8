// Engine: one-pass steps (StepRequest.one_pass) whose tensors are client regions (the CUDA IPC
// path, on the fake IPC backend over host memory): planned one-pass steps write the bytes
// two-pass steps write; a refused one-pass step rewrites every output with DQ(W) of the
// unchanged weight (where a refused two-pass step leaves the outputs as they were) and its done
// signal is written after that, with fp4qd polling the signals on the host and with device-side
// signals.
#include <cstring>
#include <limits>
#include <string>
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
using ::fp4q::testing::StatusIs;
using ::testing::HasSubstr;

// Gradients at 0 and 64 (f32, 1 x 16 each); the one-pass weights' DQ(W) at 1024 and 1088, the
// two-pass twins' at 2048 and 2112; the done signal at 4096.
constexpr uint64_t kOnePassOut = 1024, kTwinOut = 2048, kSignal = 4096;

class EngineRegionOnePassTest : public EngineRegionTest {
 protected:
  void CreateDelayed(const std::string& name, uint32_t seed) {
    CreateWeightRequest c;
    c.name = name;
    const std::string initial = RandomF32(16, seed);
    c.initial = InlineF32(initial, 1, 16);
    c.options.error_feedback = true;
    c.options.scaling = kernels::Scaling::kDelayed;
    ASSERT_TRUE(Await<CreateWeightResult>([&](auto d) { engine_->CreateWeight(ctx_, c, d); }).ok());
  }
  StepRequest Request(int64_t n, const std::string& suffix, uint64_t out, bool one_pass) {
    StepRequest r;
    r.step = n;
    HyperIn h;
    h.lr = 0.25f;
    r.groups = {h};
    r.brief_reply = true;
    r.one_pass = one_pass;
    for (int i = 0; i < 2; ++i) {
      StepItemIn it;
      it.name = std::string(i == 0 ? "a" : "b") + suffix;
      it.update = RegionF32(region_, 64 * i, 1, 16);
      it.dequantized_out = RegionTarget(region_, out + 64 * i);
      r.items.push_back(it);
    }
    r.has_done_signal = true;
    r.done_signal = RegionSlice{region_, kSignal};
    r.done_value = static_cast<uint32_t>(n);
    return r;
  }
  absl::StatusOr<StepResult> Run(const StepRequest& r) {
    return Await<StepResult>([&](auto done) { engine_->Step(ctx_, r, done); });
  }
  uint32_t Signal() const {
    uint32_t v;
    std::memcpy(&v, memory_.data() + kSignal, 4);
    return v;
  }
  void Poison(uint64_t at) { std::memset(memory_.data() + at, 0xEE, 128); }
  bool SameOutputs() const {
    return std::memcmp(memory_.data() + kOnePassOut, memory_.data() + kTwinOut, 128) == 0;
  }

  void Check(bool device_signals) {
    if (device_signals) fake_->EmulateDeviceSignals();
    for (const char* suffix : {"", "2"}) {
      CreateDelayed(std::string("a") + suffix, 70);
      CreateDelayed(std::string("b") + suffix, 71);
    }
    // Planned one-pass steps (kept at step 1) beside two-pass steps of the twins.
    uint64_t plan = 0;
    for (int64_t n = 1; n <= 3; ++n) {
      const std::string g = RandomF32(2 * 16, 80 + static_cast<uint32_t>(n));
      std::memcpy(memory_.data(), g.data(), g.size());
      Poison(kOnePassOut);
      StepRequest one = Request(n, "", kOnePassOut, true);
      if (plan == 0) {
        one.keep_plan = true;
      } else {
        one.items.clear();
        one.plan_id = plan;
      }
      absl::StatusOr<StepResult> r = Run(one);
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_TRUE(r->one_pass) << "step " << n;
      if (plan == 0) plan = r->plan_id;
      EXPECT_EQ(Signal(), static_cast<uint32_t>(n));  // the twins' step writes it again
      absl::StatusOr<StepResult> twin = Run(Request(n, "2", kTwinOut, false));
      ASSERT_TRUE(twin.ok()) << twin.status();
      EXPECT_FALSE(twin->one_pass);
      EXPECT_TRUE(SameOutputs()) << "step " << n;
    }
    // A NaN in b's gradient. One pass: refused, the outputs rewritten with DQ(W) of the
    // unchanged weights (the twins' outputs of step 3), then the done signal.
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::memcpy(memory_.data() + 64 + 4 * 3, &nan, 4);
    Poison(kOnePassOut);
    StepRequest bad = Request(4, "", kOnePassOut, true);
    bad.items.clear();
    bad.plan_id = plan;
    EXPECT_THAT(Run(bad), StatusIs(absl::StatusCode::kInvalidArgument,
                                   HasSubstr("items[1].update: element 3 is NaN")));
    EXPECT_TRUE(SameOutputs());
    EXPECT_EQ(Signal(), 4u);
    // Two passes: refused, the outputs left as they were.
    Poison(kTwinOut);
    EXPECT_THAT(Run(Request(4, "2", kTwinOut, false)),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("element 3 is NaN")));
    EXPECT_EQ(memory_[kTwinOut], 0xEE);
    // Step 4 again, finite: both apply, the same bytes.
    const std::string g = RandomF32(2 * 16, 90);
    std::memcpy(memory_.data(), g.data(), g.size());
    bad.done_value = 5;
    absl::StatusOr<StepResult> r = Run(bad);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->one_pass);
    EXPECT_EQ(Signal(), 5u);
    ASSERT_TRUE(Run(Request(4, "2", kTwinOut, false)).ok());
    EXPECT_TRUE(SameOutputs());
  }
};

TEST_F(EngineRegionOnePassTest, HostPolledSignals) { Check(false); }

TEST_F(EngineRegionOnePassTest, DeviceSideSignals) { Check(true); }

}  // namespace
}  // namespace fp4q::server
