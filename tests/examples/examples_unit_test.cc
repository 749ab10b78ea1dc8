// Tests of the examples library that need no server: options, the NVFP4 grid
// decode and the half-step measure, the random numbers, the problems' losses
// and gradients, the reports, and the CUDA runtime loader where no GPU is
// usable.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "fp4q/common/json.h"
#include "fp4q/examples/cuda_runtime.h"
#include "fp4q/examples/experiment.h"
#include "fp4q/examples/nvfp4_grid.h"
#include "fp4q/examples/options.h"
#include "fp4q/examples/problems.h"
#include "fp4q/examples/random.h"
#include "fp4q/examples/report.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace fp4q::examples {
namespace {

using ::fp4q::testing::IsOk;
using ::fp4q::testing::StatusIs;
using ::testing::HasSubstr;

// ---------------------------------------------------------------- options

absl::StatusOr<ExampleOptions> Parse(std::vector<std::string> args) {
  args.insert(args.begin(), "prog");
  return ParseExampleOptions(args, ExampleDefaults{123, 0.25});
}

TEST(OptionsTest, DefaultsComeFromTheExampleAndTheEnvironment) {
  setenv("FP4Q_SERVER", "unix:/tmp/fp4q-test.sock", 1);
  absl::StatusOr<ExampleOptions> o = Parse({});
  unsetenv("FP4Q_SERVER");
  ASSERT_THAT(o, IsOk());
  EXPECT_EQ(o->steps, 123);
  EXPECT_EQ(o->lr, 0.25);
  EXPECT_EQ(o->seed, 1u);
  EXPECT_EQ(o->server, "unix:/tmp/fp4q-test.sock");
  EXPECT_EQ(o->transport, TransportKind::kInline);
  EXPECT_EQ(o->csv_path, "");
  EXPECT_EQ(o->json_path, "");
  EXPECT_FALSE(o->help);
  EXPECT_EQ(DefaultServerAddress(), "127.0.0.1:50051");
}

TEST(OptionsTest, EveryOptionIsParsed) {
  absl::StatusOr<ExampleOptions> o =
      Parse({"--steps", "7", "--seed=18446744073709551615", "--lr", "0.5",
             "--server=h:1", "--transport", "cuda_ipc", "--csv", "a.csv",
             "--json=b.json"});
  ASSERT_THAT(o, IsOk());
  EXPECT_EQ(o->steps, 7);
  EXPECT_EQ(o->seed, 18446744073709551615u);
  EXPECT_EQ(o->lr, 0.5);
  EXPECT_EQ(o->server, "h:1");
  EXPECT_EQ(o->transport, TransportKind::kCudaIpc);
  EXPECT_EQ(o->csv_path, "a.csv");
  EXPECT_EQ(o->json_path, "b.json");
  EXPECT_TRUE(Parse({"--help"})->help);
}

TEST(OptionsTest, BadValuesNameTheOptionAndTheValue) {
  const absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;
  EXPECT_THAT(
      Parse({"--steps", "0"}),
      StatusIs(kInvalid, HasSubstr("'--steps': 0 is outside [1, 100000]")));
  EXPECT_THAT(Parse({"--steps", "100001"}),
              StatusIs(kInvalid, HasSubstr("100001 is outside")));
  EXPECT_THAT(Parse({"--steps", "-3"}),
              StatusIs(kInvalid, HasSubstr("got '-3'")));
  EXPECT_THAT(Parse({"--steps", "2x"}),
              StatusIs(kInvalid, HasSubstr("got '2x'")));
  EXPECT_THAT(Parse({"--seed", "18446744073709551616"}),
              StatusIs(kInvalid, HasSubstr("'--seed'")));
  EXPECT_THAT(
      Parse({"--lr", "0"}),
      StatusIs(kInvalid, HasSubstr("'--lr': 0 is not a finite number > 0")));
  EXPECT_THAT(Parse({"--lr", "-0.1"}),
              StatusIs(kInvalid, HasSubstr("-0.1 is not a finite")));
  EXPECT_THAT(Parse({"--lr", "inf"}),
              StatusIs(kInvalid, HasSubstr("inf is not a finite")));
  EXPECT_THAT(Parse({"--lr", "nan"}),
              StatusIs(kInvalid, HasSubstr("nan is not a finite")));
  // Finite as a double, infinite as the f32 the service receives.
  EXPECT_THAT(Parse({"--lr", "1e39"}),
              StatusIs(kInvalid, HasSubstr("1e+39 is not a finite")));
  EXPECT_THAT(
      Parse({"--transport", "tcp"}),
      StatusIs(kInvalid,
               HasSubstr("must be one of inline, cuda_ipc; got 'tcp'")));
  EXPECT_THAT(Parse({"--server="}),
              StatusIs(kInvalid, HasSubstr("'--server': empty")));
  EXPECT_THAT(Parse({"--csv="}),
              StatusIs(kInvalid, HasSubstr("'--csv': empty path")));
  EXPECT_THAT(Parse({"--json="}),
              StatusIs(kInvalid, HasSubstr("'--json': empty path")));
  EXPECT_THAT(Parse({"extra"}),
              StatusIs(kInvalid, HasSubstr("unexpected argument 'extra'")));
  EXPECT_THAT(Parse({"--bogus", "1"}),
              StatusIs(kInvalid, HasSubstr("--bogus")));
  EXPECT_THAT(Parse({"--steps"}), StatusIs(kInvalid, HasSubstr("--steps")));
  EXPECT_THAT(Parse({"--steps", "1", "--steps", "2"}),
              StatusIs(kInvalid, HasSubstr("--steps")));
}

TEST(OptionsTest, UsageListsEveryOptionAndTheDefaults) {
  const std::string u =
      ExampleUsage("prog", "Summary line.", ExampleDefaults{123, 0.25});
  for (const char* s :
       {"usage: prog", "Summary line.", "--steps N", "(default 123)", "--lr X",
        "(default 0.25)", "--seed N", "--server ADDR", "$FP4Q_SERVER",
        "--transport T", "cuda_ipc", "--csv PATH", "--json PATH",
        "77 skipped"}) {
    EXPECT_THAT(u, HasSubstr(s));
  }
}

// ---------------------------------------------------------------- E4M3, E2M1,
// grid

TEST(GridTest, CanonicalCodeMergesTheTwoZeros) {
  EXPECT_EQ(CanonicalCode(0), 0);
  EXPECT_EQ(CanonicalCode(8), 0);
  for (uint8_t c : {1, 7, 9, 15}) EXPECT_EQ(CanonicalCode(c), c);
}

TEST(GridTest, E4m3AndE2m1DecodeHandValues) {
  EXPECT_EQ(E4m3ToFloat(0x00), 0.0f);
  EXPECT_EQ(E4m3ToFloat(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(E4m3ToFloat(0x07), 7 * std::ldexp(1.0f, -9));
  EXPECT_EQ(E4m3ToFloat(0x08), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(E4m3ToFloat(0x38), 1.0f);
  EXPECT_EQ(E4m3ToFloat(0x3D), 1.625f);
  EXPECT_EQ(E4m3ToFloat(0x7E), 448.0f);
  EXPECT_EQ(E4m3ToFloat(0xB8), -1.0f);
  EXPECT_TRUE(std::isnan(E4m3ToFloat(0x7F)));
  EXPECT_TRUE(std::isnan(E4m3ToFloat(0xFF)));
  const float magnitudes[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  for (uint8_t c = 0; c < 16; ++c) {
    EXPECT_EQ(E2m1ToFloat(c), (c & 8) ? -magnitudes[c & 7] : magnitudes[c & 7])
        << int(c);
  }
}

// A [1, 32] tensor: block 0 scale 1.0 (0x38), block 1 scale 2.0 (0x40), s_enc 4
// (S_dec 0.25). Codes: element i of block 0 has code i % 16, block 1 the same.
v1::QuantizedTensor HandTensor() {
  v1::QuantizedTensor q;
  q.set_format(v1::FORMAT_NVFP4);
  q.set_block(v1::BLOCK_SHAPE_1X16);
  q.set_scale_layout(v1::SCALE_LAYOUT_PLAIN);
  q.add_shape(1);
  q.add_shape(32);
  q.set_s_enc(4.0f);
  std::string codes;
  for (int j = 0; j < 16; ++j) {
    const int lo = (2 * j) % 16, hi = (2 * j + 1) % 16;
    codes.push_back(static_cast<char>(lo | (hi << 4)));
  }
  q.set_codes(codes);
  q.set_scales(std::string("\x38\x40", 2));
  return q;
}

TEST(GridTest, DecodesCodesScalesAndTheGlobalScale) {
  absl::StatusOr<Nvfp4Grid> g = Nvfp4Grid::FromProto(HandTensor(), 1, 32);
  ASSERT_THAT(g, IsOk());
  EXPECT_EQ(g->size(), 32);
  const float magnitudes[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  for (int i = 0; i < 32; ++i) {
    const int c = i % 16;
    EXPECT_EQ(g->code(i), c);
    const float sf = i < 16 ? 1.0f : 2.0f;
    const float expected =
        ((c & 8) ? -magnitudes[c & 7] : magnitudes[c & 7]) * sf * 0.25f;
    EXPECT_EQ(g->Value(i), expected) << i;
  }
  std::vector<float> values(32);
  for (int i = 0; i < 32; ++i) values[i] = g->Value(i);
  EXPECT_THAT(g->CheckValues(values, 0), IsOk());
  values[21] = std::nextafter(values[21], 10.0f);
  EXPECT_THAT(g->CheckValues(values, 0),
              StatusIs(absl::StatusCode::kInternal,
                       HasSubstr("element 21 (row 0, col 21)")));
  EXPECT_THAT(g->CheckValues(values, 1e-6), IsOk());
  EXPECT_THAT(
      g->CheckValues(std::vector<float>(31), 0),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("31 elements")));
}

TEST(GridTest, RejectsWhatItCannotDecode) {
  const absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;
  EXPECT_THAT(
      Nvfp4Grid::FromProto(HandTensor(), 2, 16),
      StatusIs(kInvalid, HasSubstr("quantized.shape: [1, 32] is not [2, 16]")));
  EXPECT_THAT(Nvfp4Grid::FromProto(HandTensor(), 1, 24),
              StatusIs(kInvalid, HasSubstr("cols a positive multiple of 16")));
  v1::QuantizedTensor q = HandTensor();
  q.set_format(v1::FORMAT_MXFP4);
  EXPECT_THAT(
      Nvfp4Grid::FromProto(q, 1, 32),
      StatusIs(kInvalid,
               HasSubstr("quantized.format: FORMAT_MXFP4 is not NVFP4")));
  q = HandTensor();
  q.set_scale_layout(v1::SCALE_LAYOUT_SWIZZLED);
  EXPECT_THAT(
      Nvfp4Grid::FromProto(q, 1, 32),
      StatusIs(kInvalid, HasSubstr("SCALE_LAYOUT_SWIZZLED is not PLAIN")));
  q = HandTensor();
  q.set_codes(q.codes().substr(1));
  EXPECT_THAT(
      Nvfp4Grid::FromProto(q, 1, 32),
      StatusIs(kInvalid, HasSubstr("quantized.codes: 15 bytes; expected 16")));
  q = HandTensor();
  q.set_scales("\x38");
  EXPECT_THAT(
      Nvfp4Grid::FromProto(q, 1, 32),
      StatusIs(kInvalid, HasSubstr("quantized.scales: 1 bytes; expected 2")));
  q = HandTensor();
  q.set_scales(std::string("\x38\x7F", 2));
  EXPECT_THAT(Nvfp4Grid::FromProto(q, 1, 32),
              StatusIs(kInvalid, HasSubstr("quantized.scales[1]: byte 0x7f")));
  q = HandTensor();
  q.set_scales(std::string("\xB8\x38", 2));
  EXPECT_THAT(Nvfp4Grid::FromProto(q, 1, 32),
              StatusIs(kInvalid, HasSubstr("quantized.scales[0]: byte 0xb8")));
  for (float s : {0.0f, -1.0f, INFINITY, NAN}) {
    q = HandTensor();
    q.set_s_enc(s);
    EXPECT_THAT(Nvfp4Grid::FromProto(q, 1, 32),
                StatusIs(kInvalid, HasSubstr("quantized.s_enc")));
  }
  q = HandTensor();
  q.mutable_codes_region()->set_region_id("r");
  EXPECT_THAT(Nvfp4Grid::FromProto(q, 1, 32),
              StatusIs(kInvalid, HasSubstr("codes and scales must be inline")));
}

TEST(GridTest, HalfStepIsHalfTheGapToTheNeighbourInTheUpdatesDirection) {
  // Unit 0.25 in block 0 (sf 1, S_dec 0.25), 0.5 in block 1.
  absl::StatusOr<Nvfp4Grid> g = Nvfp4Grid::FromProto(HandTensor(), 1, 32);
  ASSERT_THAT(g, IsOk());
  // Element 0: code 0 (0). Either way the neighbour is 0.5 units = 0.125; half
  // = 0.0625.
  EXPECT_TRUE(g->BelowHalfStep(0, 0.0f));
  EXPECT_TRUE(g->BelowHalfStep(0, 0.0624f));
  EXPECT_FALSE(g->BelowHalfStep(0, 0.0625f));
  EXPECT_TRUE(g->BelowHalfStep(0, -0.0624f));
  EXPECT_FALSE(g->BelowHalfStep(0, -0.0626f));
  // Element 2: code 2 (+1 unit). Outward to 1.5: half gap 0.0625; inward to
  // 0.5: the same.
  EXPECT_TRUE(g->BelowHalfStep(2, 0.0624f));
  EXPECT_FALSE(g->BelowHalfStep(2, 0.0625f));
  EXPECT_FALSE(g->BelowHalfStep(2, -0.0625f));
  // Element 5: code 5 (+3 units). Outward to 4: half gap 0.125; inward to 2:
  // 0.125.
  EXPECT_TRUE(g->BelowHalfStep(5, 0.124f));
  EXPECT_FALSE(g->BelowHalfStep(5, 0.125f));
  // Element 6: code 6 (+4 units). Outward to 6: half gap 0.25; inward to 3:
  // 0.125.
  EXPECT_TRUE(g->BelowHalfStep(6, 0.249f));
  EXPECT_FALSE(g->BelowHalfStep(6, 0.25f));
  EXPECT_FALSE(g->BelowHalfStep(6, -0.125f));
  // Element 7: code 7 (+6 units): no outward neighbour; inward to 4: half gap
  // 0.25.
  EXPECT_TRUE(g->BelowHalfStep(7, 1000.0f));
  EXPECT_TRUE(g->BelowHalfStep(7, -0.249f));
  EXPECT_FALSE(g->BelowHalfStep(7, -0.25f));
  // Element 10: code 10 (-1 unit): outward is negative.
  EXPECT_TRUE(g->BelowHalfStep(10, -0.0624f));
  EXPECT_FALSE(g->BelowHalfStep(10, -0.0625f));
  EXPECT_FALSE(g->BelowHalfStep(10, 0.0625f));
  // Element 8: code 8 (-0) moves outward either way.
  EXPECT_FALSE(g->BelowHalfStep(8, 0.0625f));
  EXPECT_TRUE(g->BelowHalfStep(8, -0.0624f));
  // Element 18: block 1 (unit 0.5), code 2: half gap 0.125.
  EXPECT_TRUE(g->BelowHalfStep(18, 0.124f));
  EXPECT_FALSE(g->BelowHalfStep(18, 0.125f));
}

// ---------------------------------------------------------------- random
// numbers

TEST(RandomTest, SplitMix64MatchesItsReferenceOutputs) {
  // splitmix64.c (Vigna), state 0: the first outputs.
  Rng rng(0);
  EXPECT_EQ(rng.NextBits(), 0xE220A8397B1DCDAFull);
  EXPECT_EQ(rng.NextBits(), 0x6E789E6AA1B965F4ull);
  EXPECT_EQ(rng.NextBits(), 0x06C45D188009454Full);
}

TEST(RandomTest, NormalHasUnitVarianceAndBoundedSupport) {
  Rng rng = StreamRng(5, 1);
  const int n = 200000;
  double sum = 0, sum2 = 0, lo = 0, hi = 0;
  for (int i = 0; i < n; ++i) {
    const double v = rng.Normal();
    sum += v;
    sum2 += v * v;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  EXPECT_NEAR(sum / n, 0.0, 0.01);
  EXPECT_NEAR(sum2 / n, 1.0, 0.02);
  EXPECT_GE(lo, -6.0);
  EXPECT_LE(hi, 6.0);
  EXPECT_LT(lo, -3.0);
  EXPECT_GT(hi, 3.0);
}

TEST(RandomTest, StreamsAreDeterministicAndDistinct) {
  Rng a = StreamRng(9, 1), b = StreamRng(9, 1), c = StreamRng(9, 2),
      d = StreamRng(10, 1);
  const uint64_t va = a.NextBits();
  EXPECT_EQ(va, b.NextBits());
  EXPECT_NE(va, c.NextBits());
  EXPECT_NE(va, d.NextBits());
  Rng e = StreamRng(3, 4);
  const std::vector<float> v = NormalVector(e, 5, 0.5);
  Rng f = StreamRng(3, 4);
  for (float x : v) EXPECT_EQ(x, static_cast<float>(f.Normal() * 0.5));
}

// ---------------------------------------------------------------- problems

// Central differences of the loss in double around an f32 weight vector.
double NumericGrad(const Problem& p, Weights w, size_t t, size_t i, float h) {
  const float x = w[t][i];
  w[t][i] = x + h;
  const double up = *p.LossAndGradient(w, nullptr);
  w[t][i] = x - h;
  const double down = *p.LossAndGradient(w, nullptr);
  return (up - down) /
         (static_cast<double>(x + h) - static_cast<double>(x - h));
}

void CheckProblem(const Problem& p, double rel_tol) {
  const Weights& w0 = p.initial();
  ASSERT_EQ(w0.size(), p.tensors().size());
  Weights g;
  absl::StatusOr<double> l0 = p.LossAndGradient(w0, &g);
  ASSERT_THAT(l0, IsOk());
  EXPECT_GT(*l0, 0.1);
  ASSERT_EQ(g.size(), w0.size());
  for (size_t t = 0; t < w0.size(); ++t) {
    ASSERT_EQ(g[t].size(), w0[t].size());
    for (size_t i :
         {size_t{0}, size_t{17}, w0[t].size() / 2, w0[t].size() - 1}) {
      const double num = NumericGrad(p, w0, t, i, 1.0f / 1024);
      EXPECT_NEAR(g[t][i], num, rel_tol * std::fabs(num) + 1e-6)
          << p.tensors()[t].name << "[" << i << "]";
    }
  }
  // The teacher's weights fit the data exactly.
  Weights gt;
  absl::StatusOr<double> lt = p.LossAndGradient(p.target(), &gt);
  ASSERT_THAT(lt, IsOk());
  EXPECT_LT(std::fabs(*lt), 1e-9 * *l0);
  for (const auto& v : gt) {
    for (float x : v) ASSERT_LT(std::fabs(x), 1e-6f);
  }
}

TEST(ProblemsTest, LinearGradientLossAndDeterminism) {
  auto p = MakeLinearProblem(3);
  ASSERT_EQ(p->tensors().size(), 1u);
  EXPECT_EQ(p->tensors()[0].rows, 64);
  EXPECT_EQ(p->tensors()[0].cols, 256);
  CheckProblem(
      *p, 1e-6);  // quadratic: central differences are exact up to rounding
  auto q = MakeLinearProblem(3);
  EXPECT_EQ(p->initial(), q->initial());
  EXPECT_EQ(p->target(), q->target());
  EXPECT_EQ(*p->LossAndGradient(p->initial(), nullptr),
            *q->LossAndGradient(q->initial(), nullptr));
  EXPECT_NE(MakeLinearProblem(4)->initial(), p->initial());
}

TEST(ProblemsTest, MlpGradientLossAndDeterminism) {
  auto p = MakeMlpProblem(3);
  ASSERT_EQ(p->tensors().size(), 2u);
  EXPECT_EQ(p->tensors()[0].rows, 64);
  EXPECT_EQ(p->tensors()[0].cols, 128);
  EXPECT_EQ(p->tensors()[1].rows, 16);
  EXPECT_EQ(p->tensors()[1].cols, 64);
  CheckProblem(*p, 2e-3);
  EXPECT_EQ(MakeMlpProblem(3)->target(), p->target());
}

TEST(ProblemsTest, WrongWeightsAreRejectedByName) {
  auto p = MakeMlpProblem(1);
  Weights w = p->initial();
  w.pop_back();
  EXPECT_THAT(p->LossAndGradient(w, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("1 tensors, expected 2")));
  w = p->initial();
  w[1].resize(5);
  EXPECT_THAT(p->LossAndGradient(w, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("weights[1] (w2): 5 values, expected 1024")));
}

// ---------------------------------------------------------------- reports

ExperimentResult HandResult(double sr_ef_final) {
  ExperimentResult r;
  r.config.example = "linear";
  r.config.steps = 2;
  r.config.lr = 0.5;
  r.config.seed = 9;
  r.problem = "a \"quoted\" problem";
  r.server = "127.0.0.1:1";
  r.backend = "cpu";
  r.transport = "inline";
  r.below_first = 3;
  r.count_first = 4;
  r.below_all = 7;
  r.count_all = 8;
  r.target_rtn_loss = 0.125;
  const double finals[5] = {0.001, 9.5, 1.0, 0.75, sr_ef_final};
  for (int v = 0; v < 5; ++v) {
    VariantResult vr;
    vr.variant = kAllVariants[v];
    vr.losses = {10.0, 5.0, finals[v]};
    vr.moved = v == 0 ? 0 : v;
    vr.weights = v == 0 ? 0 : 10;
    r.variants.push_back(vr);
  }
  return r;
}

TEST(ReportTest, CsvHasOneRowPerStepAndOneColumnPerVariant) {
  EXPECT_EQ(CsvText(HandResult(0.5)),
            "step,fp32,rtn,sr,rtn_ef,sr_ef\n"
            "0,10,10,10,10,10\n"
            "1,5,5,5,5,5\n"
            "2,0.001,9.5,1,0.75,0.5\n");
}

TEST(ReportTest, JsonCarriesEveryNumberExactly) {
  absl::StatusOr<common::JsonValue> j =
      common::ParseJson(JsonText(HandResult(0.5)));
  ASSERT_THAT(j, IsOk());
  EXPECT_EQ(j->Find("example")->text(), "linear");
  EXPECT_EQ(j->Find("problem")->text(), "a \"quoted\" problem");
  EXPECT_EQ(*j->Find("steps")->AsInt64(), 2);
  EXPECT_EQ(*j->Find("seed")->AsUint64(), 9u);
  EXPECT_EQ(*j->Find("lr")->AsDouble(), 0.5);
  EXPECT_EQ(*j->Find("below_half_step_first")->AsDouble(), 0.75);
  EXPECT_EQ(*j->Find("below_half_step_all")->AsDouble(), 0.875);
  EXPECT_EQ(*j->Find("target_rtn_loss")->AsDouble(), 0.125);
  const common::JsonValue* v = j->Find("variants");
  ASSERT_NE(v, nullptr);
  EXPECT_TRUE(v->Find("fp32")->Find("moved_fraction")->is_null());
  EXPECT_EQ(*v->Find("rtn")->Find("final_loss")->AsDouble(), 9.5);
  EXPECT_EQ(*v->Find("sr_ef")->Find("moved_fraction")->AsDouble(), 0.4);
  EXPECT_EQ(*v->Find("fp32")->Find("final_loss")->AsDouble(), 0.001);
  ASSERT_EQ(j->Find("checks")->items().size(), 7u);
}

TEST(ReportTest, ShapeChecksFollowTheNumbers) {
  std::vector<ShapeCheck> ok = ExpectedShapeChecks(HandResult(0.5));
  ASSERT_EQ(ok.size(), 7u);
  for (const ShapeCheck& c : ok) EXPECT_TRUE(c.passed) << c.text;
  for (int i = 0; i < 6; ++i) EXPECT_TRUE(ok[i].asserted) << ok[i].text;
  EXPECT_FALSE(ok[6].asserted);
  // SR+EF 4.9: above 0.5 x RTN (4.75) and above 1.1 x SR (1.1).
  std::vector<ShapeCheck> bad = ExpectedShapeChecks(HandResult(4.9));
  EXPECT_EQ(bad[3].text, "SR+EF final <= 0.5 x RTN final");
  EXPECT_FALSE(bad[3].passed);
  EXPECT_EQ(bad[3].lhs, 4.9);
  EXPECT_EQ(bad[3].rhs, 4.75);
  EXPECT_EQ(bad[6].text, "SR+EF final <= 1.1 x SR final");
  EXPECT_FALSE(bad[6].passed);
  for (int i : {0, 1, 2, 4, 5}) EXPECT_TRUE(bad[i].passed) << bad[i].text;
  // fp32 not the lowest.
  std::vector<ShapeCheck> low = ExpectedShapeChecks(HandResult(0.0005));
  EXPECT_EQ(low[5].text, "fp32 final < every quantized final");
  EXPECT_FALSE(low[5].passed);
  EXPECT_EQ(low[5].rhs, 0.0005);
}

TEST(ReportTest, AMissingVariantReadsAsNanAndFailsItsChecks) {
  ExperimentResult r = HandResult(0.5);
  r.variants.pop_back();  // no SR+EF
  EXPECT_TRUE(std::isnan(r.Get(Variant::kSrEf).final_loss()));
  EXPECT_TRUE(std::isnan(r.Get(Variant::kSrEf).moved_fraction()));
  std::vector<ShapeCheck> checks = ExpectedShapeChecks(r);
  EXPECT_FALSE(checks[3].passed);  // SR+EF final <= 0.5 x RTN final
  EXPECT_FALSE(checks[6].passed);  // SR+EF final <= 1.1 x SR final
}

TEST(ReportTest, TableShowsEveryVariantAndCheck) {
  std::ostringstream out;
  PrintTable(HandResult(0.5), out);
  const std::string t = out.str();
  for (const char* s :
       {"== linear: a \"quoted\" problem ==", "75.00% (3 of 4) at step 1",
        "87.50% (7 of 8) over all steps", "RTN(W*)", "SR+EF", "RTN+EF",
        "10.00%", "40.00%", "RTN final >= 0.9 x RTN start", "yes",
        "also measured (not asserted", "SR+EF final <= 1.1 x SR final"}) {
    EXPECT_THAT(t, HasSubstr(s));
  }
}

TEST(ReportTest, WriteErrorsNameThePath) {
  EXPECT_THAT(WriteCsv(HandResult(0.5), "/nonexistent-dir/x.csv"),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("/nonexistent-dir/x.csv.tmp")));
}

// ---------------------------------------------------------------- CUDA runtime

TEST(CudaRuntimeTest, MissingLibraryIsFailedPreconditionNamingEachCandidate) {
  EXPECT_THAT(
      CudaRuntime::Load(
          {"libfp4q-no-such-cudart.so", "/nonexistent/libcudart.so"}),
      StatusIs(absl::StatusCode::kFailedPrecondition,
               AllOf(HasSubstr("no CUDA runtime (tried libfp4q-no-such-cudart.so: "),
                     HasSubstr("/nonexistent/libcudart.so: "))));
}

#ifdef FP4Q_FAKE_CUDART
TEST(CudaRuntimeTest, RuntimeWithoutTheNeededCallsIsFailedPrecondition) {
  // The client tests' stand-in runtime has the IPC calls but no
  // cudaGetDeviceCount.
  EXPECT_THAT(CudaRuntime::Load({FP4Q_FAKE_CUDART}),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr(" lacks cuda")));
}
#endif

TEST(CudaRuntimeTest, NoUsableDeviceHereIsFailedPrecondition) {
  absl::StatusOr<std::unique_ptr<CudaRuntime>> cuda = CudaRuntime::Load();
  if (cuda.ok())
    GTEST_SKIP() << "a CUDA device is usable here (" << (*cuda)->library()
                 << ")";
  EXPECT_THAT(cuda, StatusIs(absl::StatusCode::kFailedPrecondition,
                             AnyOf(HasSubstr("no CUDA runtime"),
                                   HasSubstr("no usable CUDA device"))));
}

}  // namespace
}  // namespace fp4q::examples
