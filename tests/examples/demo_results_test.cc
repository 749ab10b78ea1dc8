// Checks the results of the short demo (scripts/demo.sh on the CPU backend, run
// by the ctest fixture examples.demo) against the shape each example must show, per
// example:
//   RTN final >= 0.9 x RTN start;
//   SR, RTN+EF and SR+EF final <= 0.5 x RTN final;
//   EF (round-to-nearest with error feedback, RTN+EF) final <= 1.1 x SR final;
//   fp32 final below every other final;
// and what the examples promise besides: most per-step updates below half a
// grid step, RTN barely changes any 4-bit code while SR and EF change most, and
// example 3 (QDQ with a client-held weight) reproduces example 1 (stored
// weight) bit for bit. SR+EF against SR is reported in docs/TRAINING.md, not
// asserted: the MLP measures it above SR.
//
// The directory comes from $FP4Q_EXAMPLES_DEMO_DIR; each example left NAME.json
// and NAME.csv.
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "fp4q/common/json.h"
#include "gtest/gtest.h"

namespace {

using fp4q::common::JsonValue;

const char* const kVariants[] = {"fp32", "rtn", "sr", "rtn_ef", "sr_ef"};

struct Variant {
  double start = NAN;
  double final = NAN;
  double moved = NAN;  // NaN for fp32 (null)
};

struct Results {
  std::string example, backend, path;
  int64_t steps = 0;
  double below_first = NAN, below_all = NAN, target_rtn = NAN;
  std::map<std::string, Variant> v;
  std::vector<std::vector<double>>
      csv;  // rows: step, then one loss per variant
};

std::string DemoDir() {
  const char* d = std::getenv("FP4Q_EXAMPLES_DEMO_DIR");
  return d != nullptr ? d : "";
}

std::string Slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

double Number(const JsonValue* v, const std::string& what) {
  EXPECT_NE(v, nullptr) << what;
  if (v == nullptr) return NAN;
  if (v->is_null()) return NAN;
  absl::StatusOr<double> d = v->AsDouble();
  EXPECT_TRUE(d.ok()) << what << ": " << d.status();
  return d.ok() ? *d : NAN;
}

Results Load(const std::string& name) {
  Results r;
  const std::string dir = DemoDir();
  const std::string text = Slurp(dir + "/" + name + ".json");
  absl::StatusOr<JsonValue> j = fp4q::common::ParseJson(text);
  EXPECT_TRUE(j.ok()) << dir << "/" << name << ".json: " << j.status();
  if (!j.ok()) return r;
  r.example = j->Find("example")->text();
  r.backend = j->Find("backend")->text();
  r.path = j->Find("path")->text();
  r.steps = *j->Find("steps")->AsInt64();
  r.below_first =
      Number(j->Find("below_half_step_first"), "below_half_step_first");
  r.below_all = Number(j->Find("below_half_step_all"), "below_half_step_all");
  r.target_rtn = Number(j->Find("target_rtn_loss"), "target_rtn_loss");
  const JsonValue* vs = j->Find("variants");
  EXPECT_NE(vs, nullptr);
  for (const char* k : kVariants) {
    const JsonValue* v = vs != nullptr ? vs->Find(k) : nullptr;
    EXPECT_NE(v, nullptr) << k;
    if (v == nullptr) continue;
    r.v[k] = {Number(v->Find("start_loss"), k),
              Number(v->Find("final_loss"), k),
              Number(v->Find("moved_fraction"), k)};
  }
  const std::string csv = Slurp(dir + "/" + name + ".csv");
  std::vector<std::string> lines = absl::StrSplit(csv, '\n', absl::SkipEmpty());
  EXPECT_FALSE(lines.empty());
  if (!lines.empty()) {
    EXPECT_EQ(lines[0], "step,fp32,rtn,sr,rtn_ef,sr_ef");
  }
  for (size_t i = 1; i < lines.size(); ++i) {
    std::vector<double> row;
    for (absl::string_view f : absl::StrSplit(lines[i], ',')) {
      double d = NAN;
      EXPECT_TRUE(absl::SimpleAtod(f, &d)) << lines[i];
      row.push_back(d);
    }
    r.csv.push_back(row);
  }
  return r;
}

class DemoResultsTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    if (DemoDir().empty()) GTEST_FAIL() << "FP4Q_EXAMPLES_DEMO_DIR is not set";
  }
};

TEST_P(DemoResultsTest, ShowsTheStallOfRoundToNearestAndTheRescueBySrAndEf) {
  const Results r = Load(GetParam());
  ASSERT_EQ(r.example, GetParam());
  EXPECT_EQ(r.backend, "cpu");
  ASSERT_GE(r.steps, 100);
  const Variant& fp32 = r.v.at("fp32");
  const Variant& rtn = r.v.at("rtn");
  const Variant& sr = r.v.at("sr");
  const Variant& rtn_ef = r.v.at("rtn_ef");
  const Variant& sr_ef = r.v.at("sr_ef");

  // The assertions.
  EXPECT_GE(rtn.final, 0.9 * rtn.start);
  EXPECT_LE(sr.final, 0.5 * rtn.final);
  EXPECT_LE(rtn_ef.final, 0.5 * rtn.final);
  EXPECT_LE(sr_ef.final, 0.5 * rtn.final);
  EXPECT_LE(rtn_ef.final, 1.1 * sr.final);
  for (const Variant* q : {&rtn, &sr, &rtn_ef, &sr_ef})
    EXPECT_LT(fp32.final, q->final);

  // The regime: most updates are below half a grid step, so RTN keeps almost
  // every code while SR and EF change most of them; everyone starts near the
  // same loss.
  EXPECT_GE(r.below_first, 0.9);
  EXPECT_GE(r.below_all, 0.9);
  EXPECT_LT(rtn.moved, 0.1);
  for (const Variant* q : {&sr, &rtn_ef, &sr_ef}) EXPECT_GT(q->moved, 0.5);
  EXPECT_TRUE(std::isnan(fp32.moved));
  for (const Variant* q : {&rtn, &sr, &rtn_ef, &sr_ef}) {
    EXPECT_NEAR(q->start, fp32.start, 0.2 * fp32.start);
  }
  EXPECT_EQ(rtn.start, rtn_ef.start);
  EXPECT_EQ(sr.start, sr_ef.start);
  EXPECT_GT(r.target_rtn, 0);

  // The curves: steps + 1 rows, each step in order, the ends equal to the
  // JSON's (9 digits).
  ASSERT_EQ(r.csv.size(), static_cast<size_t>(r.steps + 1));
  for (size_t s = 0; s < r.csv.size(); ++s) {
    ASSERT_EQ(r.csv[s].size(), 6u);
    EXPECT_EQ(r.csv[s][0], static_cast<double>(s));
  }
  for (int k = 0; k < 5; ++k) {
    const Variant& v = r.v.at(kVariants[k]);
    EXPECT_NEAR(r.csv.front()[k + 1], v.start, 1e-8 * v.start) << kVariants[k];
    EXPECT_NEAR(r.csv.back()[k + 1], v.final, 1e-8 * v.final) << kVariants[k];
  }
}

INSTANTIATE_TEST_SUITE_P(Examples, DemoResultsTest,
                         ::testing::Values("linear", "mlp", "linear_qdq"));

TEST(DemoResultsQdqTest,
     QdqWithAClientHeldWeightReproducesTheStoredWeightBitForBit) {
  if (DemoDir().empty()) GTEST_FAIL() << "FP4Q_EXAMPLES_DEMO_DIR is not set";
  const Results stored = Load("linear");
  const Results qdq = Load("linear_qdq");
  EXPECT_EQ(stored.path, "stored_weight");
  EXPECT_EQ(qdq.path, "qdq");
  ASSERT_EQ(stored.steps, qdq.steps);
  for (const char* k : kVariants) {
    EXPECT_EQ(stored.v.at(k).start, qdq.v.at(k).start) << k;
    EXPECT_EQ(stored.v.at(k).final, qdq.v.at(k).final) << k;
  }
  EXPECT_EQ(stored.csv, qdq.csv);
  EXPECT_EQ(stored.below_all, qdq.below_all);
}

}  // namespace
