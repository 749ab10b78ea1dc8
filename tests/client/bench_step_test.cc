// `fp4q bench-step` without a server or GPU (client/cli/bench_step.h): the model shape tables,
// the bytes floor of each option set, the buffer layout, the requests, the statistics and the
// report.
#include "bench_step.h"

#include <set>
#include <string>
#include <vector>

#include "fp4q/common/json.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace fp4q::client::cli::bench_step {
namespace {

using ::fp4q::testing::IsOk;
using ::fp4q::testing::StatusIs;
using ::testing::HasSubstr;

std::vector<WeightShape> Model(const std::string& name, int layers = 32) {
  absl::StatusOr<std::vector<WeightShape>> m = ModelShapes(name, layers);
  EXPECT_THAT(m, IsOk());
  return m.ok() ? *m : std::vector<WeightShape>{};
}

TEST(BenchStepModels, Gpt2SmallIsFiftyMatricesOf124_3MParameters) {
  const std::vector<WeightShape> m = Model("gpt2-small");
  ASSERT_EQ(m.size(), 50u);
  // 12 x (768*2304 + 768*768 + 768*3072 + 3072*768) + 50257*768 + 1024*768. GPT-2's "124.4M"
  // adds its biases and LayerNorm parameters (124,439,808), which are not matrices.
  EXPECT_EQ(ParameterCount(m), 124318464u);
  EXPECT_EQ(m[0].name, "h.0.attn.c_attn");
  EXPECT_EQ(m[0].rows, 768);
  EXPECT_EQ(m[0].cols, 2304);
  EXPECT_EQ(m[47].name, "h.11.mlp.c_proj");
  EXPECT_EQ(m[47].rows, 3072);
  EXPECT_EQ(m[47].cols, 768);
  EXPECT_EQ(m[48].name, "wte");
  EXPECT_EQ(m[48].rows, 50257);
  EXPECT_EQ(m[49].name, "wpe");
  EXPECT_EQ(m[49].rows, 1024);
}

TEST(BenchStepModels, Llama3_8bIsSevenMatricesALayerAbout6_98e9) {
  const std::vector<WeightShape> one = Model("llama3-8b", 1);
  ASSERT_EQ(one.size(), 7u);
  EXPECT_EQ(ParameterCount(one), 218103808u);
  const std::vector<std::pair<std::string, std::pair<int64_t, int64_t>>> expect = {
      {"layers.0.self_attn.q_proj", {4096, 4096}}, {"layers.0.self_attn.k_proj", {1024, 4096}},
      {"layers.0.self_attn.v_proj", {1024, 4096}}, {"layers.0.self_attn.o_proj", {4096, 4096}},
      {"layers.0.mlp.gate_proj", {14336, 4096}},   {"layers.0.mlp.up_proj", {14336, 4096}},
      {"layers.0.mlp.down_proj", {4096, 14336}}};
  for (size_t i = 0; i < expect.size(); ++i) {
    EXPECT_EQ(one[i].name, expect[i].first);
    EXPECT_EQ(one[i].rows, expect[i].second.first) << one[i].name;
    EXPECT_EQ(one[i].cols, expect[i].second.second) << one[i].name;
  }
  const std::vector<WeightShape> full = Model("llama3-8b", 32);
  ASSERT_EQ(full.size(), 224u);
  EXPECT_EQ(ParameterCount(full), 6979321856u);
  EXPECT_NEAR(static_cast<double>(ParameterCount(full)), 6.98e9, 0.005e9);
  EXPECT_EQ(full.back().name, "layers.31.mlp.down_proj");
}

TEST(BenchStepModels, Square8192AndRefusals) {
  const std::vector<WeightShape> m = Model("square8192");
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(ParameterCount(m), 67108864u);
  EXPECT_THAT(ModelShapes("gpt3", 32),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("option '--model' must be one of gpt2-small, llama3-8b, "
                                 "square8192; got 'gpt3'")));
  EXPECT_THAT(ModelShapes("llama3-8b", 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("option '--layers': 0")));
}

TEST(BenchStepModels, EveryMatrixHasWholeBlocksAndAUniqueName) {
  for (const std::string& name : ModelNames()) {
    std::set<std::string> names;
    for (const WeightShape& w : Model(name, 2)) {
      EXPECT_EQ(w.cols % 16, 0) << w.name;
      EXPECT_GT(w.rows, 0) << w.name;
      EXPECT_TRUE(names.insert(w.name).second) << w.name;
    }
  }
}

TEST(BenchStepModels, ShapesList) {
  absl::StatusOr<std::vector<WeightShape>> s = ParseShapes("32x64,1x16");
  ASSERT_THAT(s, IsOk());
  ASSERT_EQ(s->size(), 2u);
  EXPECT_EQ((*s)[0].name, "w0");
  EXPECT_EQ((*s)[1].name, "w1");
  EXPECT_EQ(ParameterCount(*s), 32u * 64 + 16);
  for (const char* bad : {"", "32x64,", "8x7", "0x16", "16", "4x4x16", "2x2097152", "ax16"}) {
    EXPECT_THAT(ParseShapes(bad),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("option '--shapes': '")))
        << bad;
  }
}

StepOptions Options(Optimizer o, bool ef, StateDType d = StateDType::kF32) {
  StepOptions s;
  s.optimizer = o;
  s.error_feedback = ef;
  s.state_dtype = d;
  return s;
}

TEST(BenchStepFloor, BytesPerParameterForEachOptionSet) {
  const std::vector<WeightShape> m = Model("gpt2-small");
  struct Case {
    StepOptions options;
    double bytes_per_parameter;
  };
  StepOptions sr_delayed = Options(Optimizer::kSgd, true);
  sr_delayed.stochastic_rounding = true;
  sr_delayed.delayed_scaling = true;
  const std::vector<Case> cases = {
      // codes 0.5 + scales 0.0625 + grad 2 + residual 4 read; codes, scales, residual, DQ 2
      // written.
      {Options(Optimizer::kSgd, true), 13.125},
      {sr_delayed, 13.125},  // rounding and scaling move no other bytes
      {Options(Optimizer::kSgd, false), 5.125},
      {Options(Optimizer::kAdamW, true, StateDType::kF32), 29.125},
      {Options(Optimizer::kAdamW, true, StateDType::kBf16), 21.125},
      {Options(Optimizer::kAdamW, true, StateDType::kNvfp4), 15.375},
      {Options(Optimizer::kAdamW, false, StateDType::kF32), 21.125},
      {Options(Optimizer::kAdamW, false, StateDType::kNvfp4), 7.375},
  };
  for (const Case& c : cases) {
    EXPECT_DOUBLE_EQ(FloorBytesPerParameter(m, c.options), c.bytes_per_parameter)
        << OptimizerName(c.options.optimizer) << " ef=" << c.options.error_feedback << " "
        << StateDTypeName(c.options.state_dtype);
  }
  // State dtype means nothing without AdamW or SGD's momentum buffer.
  EXPECT_DOUBLE_EQ(FloorBytesPerParameter(m, Options(Optimizer::kSgd, true, StateDType::kBf16)),
                   13.125);
  // SGD with momentum: its buffer read + written.
  StepOptions mom = Options(Optimizer::kSgd, true);
  mom.momentum = 0.9f;
  EXPECT_DOUBLE_EQ(FloorBytesPerParameter(m, mom), 21.125);
  mom.state_dtype = StateDType::kBf16;
  EXPECT_DOUBLE_EQ(FloorBytesPerParameter(m, mom), 17.125);
  mom.state_dtype = StateDType::kNvfp4;
  EXPECT_DOUBLE_EQ(FloorBytesPerParameter(m, mom), 14.25);
}

TEST(BenchStepFloor, ExactBytesByPart) {
  const std::vector<WeightShape> one = {{"w", 16, 32}};  // 512 parameters
  const FloorBytes f = FloorFor(one, Options(Optimizer::kAdamW, true, StateDType::kNvfp4));
  EXPECT_EQ(f.codes, 512u);  // 256 read + 256 written
  EXPECT_EQ(f.scales, 64u);  // 32 + 32
  EXPECT_EQ(f.gradient, 1024u);
  EXPECT_EQ(f.dequantized, 1024u);
  EXPECT_EQ(f.residual, 4096u);
  EXPECT_EQ(f.optimizer_state, 1152u);  // (256 + 32) x 2 moments x 2 directions
  EXPECT_EQ(f.total(), 512u + 64 + 1024 + 1024 + 4096 + 1152);
  // The whole Llama-3-8B-shaped model at 13.125 B a parameter, in integers.
  const std::vector<WeightShape> llama = Model("llama3-8b");
  EXPECT_EQ(FloorFor(llama, Options(Optimizer::kSgd, true)).total(), 6979321856ull * 105 / 8);
}

TEST(BenchStepFloor, EstimatedServerState) {
  const std::vector<WeightShape> one = {{"w", 16, 32}};
  EXPECT_EQ(EstimatedStateBytes(one, Options(Optimizer::kSgd, false)), 256u + 32);
  EXPECT_EQ(EstimatedStateBytes(one, Options(Optimizer::kSgd, true)), 256u + 32 + 2048);
  EXPECT_EQ(EstimatedStateBytes(one, Options(Optimizer::kAdamW, true, StateDType::kF32)),
            256u + 32 + 2048 + 4096);
  EXPECT_EQ(EstimatedStateBytes(one, Options(Optimizer::kAdamW, false, StateDType::kNvfp4)),
            256u + 32 + 576);
  StepOptions mom = Options(Optimizer::kSgd, true);
  mom.momentum = 0.5f;
  EXPECT_EQ(EstimatedStateBytes(one, mom), 256u + 32 + 2048 + 2048);
  // One-pass steps' second copy: codes, scales, record, statistics, residual.
  EXPECT_EQ(OnePassCopyBytes(one, Options(Optimizer::kSgd, true)), 256u + 32 + 8 + 32 + 2048);
  EXPECT_EQ(OnePassCopyBytes(one, Options(Optimizer::kSgd, false)), 256u + 32 + 8 + 32);
}

TEST(BenchStepLayout, BackToBackAlignedSlices) {
  const std::vector<WeightShape> shapes = {{"a", 1, 16}, {"b", 3, 48}, {"c", 2, 16}};
  const Layout packed = PackBf16(shapes, 16);
  EXPECT_EQ(packed.offsets, (std::vector<uint64_t>{0, 32, 320}));
  EXPECT_EQ(packed.total_bytes, 384u);
  const Layout wide = PackBf16(shapes, 256);
  EXPECT_EQ(wide.offsets, (std::vector<uint64_t>{0, 256, 768}));
  EXPECT_EQ(wide.total_bytes, 832u);
  // A real model: every offset 16-aligned, no overlap, nothing lost.
  const std::vector<WeightShape> m = Model("gpt2-small");
  const Layout l = PackBf16(m, 16);
  for (size_t i = 0; i < m.size(); ++i) {
    EXPECT_EQ(l.offsets[i] % 16, 0u);
    const uint64_t end = l.offsets[i] + 2 * m[i].elements();
    EXPECT_LE(end, i + 1 < m.size() ? l.offsets[i + 1] : l.total_bytes);
  }
  EXPECT_EQ(l.total_bytes, 2 * ParameterCount(m));
}

TEST(BenchStepRequests, CreateWeightCarriesTheOptions) {
  StepOptions o = Options(Optimizer::kAdamW, false, StateDType::kNvfp4);
  o.stochastic_rounding = true;
  o.delayed_scaling = true;
  o.seed = 100;
  const v1::CreateWeightRequest r = CreateRequest({"p/w3", 32, 64}, 3, o, "GPU-1234");
  EXPECT_EQ(r.name(), "p/w3");
  EXPECT_EQ(r.initial().dtype(), v1::DTYPE_BF16);
  EXPECT_THAT(r.initial().shape(), ::testing::ElementsAre(32, 64));
  EXPECT_EQ(r.options().block(), v1::BLOCK_SHAPE_1X16);
  EXPECT_EQ(r.options().rounding(), v1::ROUNDING_STOCHASTIC);
  EXPECT_EQ(r.options().seed(), 103u);
  EXPECT_FALSE(r.options().error_feedback());
  EXPECT_EQ(r.options().dtype(), v1::DTYPE_BF16);
  EXPECT_EQ(r.options().scaling(), v1::SCALING_DELAYED);
  EXPECT_EQ(r.options().optimizer().kind(), v1::OPTIMIZER_KIND_ADAMW);
  EXPECT_EQ(r.options().optimizer().state_dtype(), v1::STATE_DTYPE_NVFP4);
  EXPECT_EQ(r.device_uuid(), "GPU-1234");
  EXPECT_EQ(r.step(), 0);

  const v1::CreateWeightRequest s = CreateRequest({"w", 16, 16}, 0, StepOptions{}, "");
  EXPECT_EQ(s.options().rounding(), v1::ROUNDING_NEAREST);
  EXPECT_TRUE(s.options().error_feedback());
  EXPECT_EQ(s.options().scaling(), v1::SCALING_CURRENT);
  EXPECT_EQ(s.options().optimizer().kind(), v1::OPTIMIZER_KIND_SGD);
  EXPECT_FALSE(s.options().optimizer().momentum());

  StepOptions m;
  m.momentum = 0.9f;
  m.state_dtype = StateDType::kBf16;
  const v1::CreateWeightRequest b = CreateRequest({"w", 16, 16}, 0, m, "");
  EXPECT_EQ(b.options().optimizer().kind(), v1::OPTIMIZER_KIND_SGD);
  EXPECT_TRUE(b.options().optimizer().momentum());
  EXPECT_EQ(b.options().optimizer().state_dtype(), v1::STATE_DTYPE_BF16);
}

TEST(BenchStepRequests, StepNamesEveryGradientAndParameterSlice) {
  const std::vector<WeightShape> shapes = {{"p/a", 1, 16}, {"p/b", 3, 48}};
  const Layout l = PackBf16(shapes, 16);
  v1::RegionSlice grads, params;
  grads.set_region_id("g");
  grads.set_offset(512);
  params.set_region_id("p");
  params.set_offset(0);
  StepOptions o;
  o.lr = 0.25f;
  const v1::StepRequest r = BuildStepRequest(shapes, l, grads, params, o);
  ASSERT_EQ(r.groups_size(), 1);
  EXPECT_FLOAT_EQ(r.groups(0).lr(), 0.25f);
  EXPECT_TRUE(r.groups(0).has_sgd());
  EXPECT_EQ(r.groups(0).sgd().momentum(), 0.0f);
  EXPECT_EQ(r.kind(), v1::UPDATE_KIND_GRADIENT);
  EXPECT_FALSE(r.has_replica());
  ASSERT_EQ(r.items_size(), 2);
  for (int i = 0; i < 2; ++i) {
    const v1::StepItem& it = r.items(i);
    EXPECT_EQ(it.name(), shapes[i].name);
    EXPECT_EQ(it.group(), 0u);
    EXPECT_EQ(it.update().dtype(), v1::DTYPE_BF16);
    EXPECT_THAT(it.update().shape(), ::testing::ElementsAre(shapes[i].rows, shapes[i].cols));
    EXPECT_EQ(it.update().region().region_id(), "g");
    EXPECT_EQ(it.update().region().offset(), 512 + l.offsets[i]);
    EXPECT_EQ(it.dequantized_out().region().region_id(), "p");
    EXPECT_EQ(it.dequantized_out().region().offset(), l.offsets[i]);
    EXPECT_FALSE(it.return_dequantized());
  }
  o.momentum = 0.9f;
  EXPECT_FLOAT_EQ(BuildStepRequest(shapes, l, grads, params, o).groups(0).sgd().momentum(), 0.9f);
  const v1::StepRequest a = BuildStepRequest(shapes, l, grads, params,
                                             Options(Optimizer::kAdamW, true, StateDType::kBf16));
  ASSERT_TRUE(a.groups(0).has_adamw());
  EXPECT_FLOAT_EQ(a.groups(0).adamw().beta1(), 0.9f);
  EXPECT_FLOAT_EQ(a.groups(0).adamw().beta2(), 0.999f);
  EXPECT_FLOAT_EQ(a.groups(0).adamw().eps(), 1e-8f);
  EXPECT_FLOAT_EQ(a.groups(0).adamw().weight_decay(), 0.01f);
}

// The largest model's step over the fast socket: the request and its reply fit in one frame
// (65536 bytes), with region ids as long as fp4qd's (32 hex digits) and a long prefix.
TEST(BenchStepRequests, Llama3_8bStepFitsInOneFastSocketFrame) {
  std::vector<WeightShape> m = Model("llama3-8b");
  for (WeightShape& w : m) w.name = "bench-step/4194304/" + w.name;
  v1::RegionSlice grads, params;
  grads.set_region_id(std::string(32, 'a'));
  params.set_region_id(std::string(32, 'b'));
  const Layout l = PackBf16(m, 16);
  v1::StepRequest req = BuildStepRequest(m, l, grads, params, StepOptions{});
  req.set_step(int64_t{1} << 40);
  v1::FastRequest frame;
  frame.set_call_id(~uint64_t{0});
  frame.set_timeout_micros(~uint64_t{0});
  frame.set_method("Step");
  frame.set_request(req.SerializeAsString());
  EXPECT_LT(frame.ByteSizeLong(), size_t{v1::FAST_SOCKET_MAX_FRAME_BYTES});
  v1::StepReply reply;
  reply.mutable_header()->set_backend("cuda");
  reply.mutable_header()->set_device_uuid("GPU-00000000-0000-0000-0000-000000000000");
  for (const WeightShape& w : m) {
    v1::StepItemResult* r = reply.add_items();
    r->set_name(w.name);
    r->set_applied(true);
    r->set_last_step(int64_t{1} << 40);
    r->set_global_amax(1.5f);
  }
  EXPECT_LT(reply.ByteSizeLong() + v1::FAST_SOCKET_REPLY_MARGIN_BYTES,
            size_t{v1::FAST_SOCKET_MAX_FRAME_BYTES});
}

TEST(BenchStepStats, NearestRankPercentiles) {
  const SampleStats s = Describe({10, 9, 8, 7, 6, 5, 4, 3, 2, 1});
  EXPECT_EQ(s.count, 10u);
  EXPECT_EQ(s.p50, 5);
  EXPECT_EQ(s.p90, 9);
  EXPECT_EQ(s.min, 1);
  EXPECT_EQ(s.max, 10);
  EXPECT_DOUBLE_EQ(s.mean, 5.5);
  const SampleStats one = Describe({7});
  EXPECT_EQ(one.p50, 7);
  EXPECT_EQ(one.p90, 7);
  EXPECT_EQ(Describe({}).count, 0u);
  EXPECT_DOUBLE_EQ(GigabytesPerSecond(4'000'000'000ull, 1e6), 4.0);  // 4 GB in 1 s
  EXPECT_DOUBLE_EQ(GigabytesPerSecond(100, 0), 0.0);
}

TEST(BenchStepReport, JsonCarriesTheFloorTheTimesAndTheCopyShare) {
  Report r;
  r.server = "unix:///run/fp4q \"x\".sock";
  r.transport = "fast_socket";
  r.backend = "cuda";
  r.model = "square8192";
  const std::vector<WeightShape> m = Model("square8192");
  r.weights = m.size();
  r.parameters = ParameterCount(m);
  r.floor = FloorFor(m, r.options);  // 13.125 B x 67108864 = 880803840 B
  r.wall = Describe({400, 500, 600});
  r.kernel = Describe({200, 220, 240});
  r.iters = 3;
  absl::StatusOr<common::JsonValue> doc = common::ParseJson(ReportJson(r));
  ASSERT_THAT(doc, IsOk());
  EXPECT_EQ(doc->Find("server")->text(), "unix:///run/fp4q \"x\".sock");
  EXPECT_EQ(*doc->Find("parameters")->AsInt64(), 67108864);
  EXPECT_EQ(doc->Find("optimizer")->text(), "sgd");
  EXPECT_EQ(doc->Find("state_dtype")->text(), "none");
  EXPECT_EQ(doc->Find("rounding")->text(), "rtn");
  EXPECT_EQ(doc->Find("scaling")->text(), "current");
  EXPECT_DOUBLE_EQ(*doc->Find("floor")->Find("bytes_per_parameter")->AsDouble(), 13.125);
  EXPECT_EQ(*doc->Find("floor")->Find("bytes")->AsInt64(), 880803840);
  EXPECT_DOUBLE_EQ(*doc->Find("wall_us")->Find("p50")->AsDouble(), 500);
  EXPECT_DOUBLE_EQ(*doc->Find("wall_us")->Find("min")->AsDouble(), 400);
  EXPECT_DOUBLE_EQ(*doc->Find("kernel_us")->Find("p90")->AsDouble(), 240);
  // 880803840 B / 500 us = 1761.6 GB/s; / 220 us = 4003.7 GB/s.
  EXPECT_DOUBLE_EQ(*doc->Find("achieved_gbps")->Find("wall_p50")->AsDouble(), 1761.6);
  EXPECT_DOUBLE_EQ(*doc->Find("achieved_gbps")->Find("kernel_p50")->AsDouble(), 4003.7);
  EXPECT_EQ(doc->Find("copy_bandwidth_gbps"), nullptr);
  EXPECT_FALSE(doc->Find("one_pass")->bool_value());
  EXPECT_EQ(*doc->Find("gap_us")->AsInt64(), 0);
  EXPECT_EQ(*doc->Find("heads_ups")->AsInt64(), 0);
  EXPECT_EQ(*doc->Find("replies_before_spin")->AsInt64(), 0);

  r.copy_bandwidth_gbps = 4000.0;
  r.gap_us = 5000;
  r.heads_ups = 13;
  r.replied_before_spin = 4;
  r.one_pass = true;
  doc = common::ParseJson(ReportJson(r));
  ASSERT_THAT(doc, IsOk());
  EXPECT_DOUBLE_EQ(*doc->Find("copy_bandwidth_gbps")->AsDouble(), 4000.0);
  EXPECT_TRUE(doc->Find("one_pass")->bool_value());
  EXPECT_EQ(*doc->Find("gap_us")->AsInt64(), 5000);
  EXPECT_EQ(*doc->Find("heads_ups")->AsInt64(), 13);
  EXPECT_EQ(*doc->Find("replies_before_spin")->AsInt64(), 4);
  EXPECT_DOUBLE_EQ(*doc->Find("floor_us_at_copy_bandwidth")->AsDouble(), 220.2);
  EXPECT_DOUBLE_EQ(*doc->Find("pct_of_copy_bandwidth")->Find("wall_p50")->AsDouble(), 44.0);
  EXPECT_DOUBLE_EQ(*doc->Find("pct_of_copy_bandwidth")->Find("kernel_p50")->AsDouble(), 100.1);
}

}  // namespace
}  // namespace fp4q::client::cli::bench_step
