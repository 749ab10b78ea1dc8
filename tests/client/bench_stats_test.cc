// fp4q bench's statistics: nearest-rank percentiles, /proc status parsing, the JSON report.
#include "bench_stats.h"

#include <unistd.h>

#include <string>
#include <vector>

#include "fp4q/common/json.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace fp4q::client::cli {
namespace {

using ::fp4q::testing::StatusIs;
using ::testing::HasSubstr;

TEST(BenchStatsTest, NearestRankPercentiles) {
  std::vector<double> v;
  for (int i = 1000; i >= 1; --i) v.push_back(i);  // unsorted on purpose
  LatencySummary s = Summarize(v);
  EXPECT_EQ(s.count, 1000u);
  EXPECT_EQ(s.p50, 500);
  EXPECT_EQ(s.p99, 990);
  EXPECT_EQ(s.p999, 999);
  EXPECT_EQ(s.max, 1000);
  EXPECT_DOUBLE_EQ(s.mean, 500.5);
  s = Summarize({5, 1, 3});
  EXPECT_EQ(s.p50, 3);  // rank ceil(1.5) = 2
  EXPECT_EQ(s.p99, 5);
  EXPECT_EQ(s.p999, 5);
  EXPECT_DOUBLE_EQ(s.mean, 3);
  s = Summarize({});
  EXPECT_EQ(s.count, 0u);
  EXPECT_EQ(s.p999, 0);
}

TEST(BenchStatsTest, ProcStatus) {
  auto m =
      ParseProcStatus("Name:\tfp4qd\nVmPeak:\t  900 kB\nVmHWM:\t  81234 kB\nVmRSS:\t   70000 kB\n");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->rss_kib, 70000u);
  EXPECT_EQ(m->hwm_kib, 81234u);
  EXPECT_THAT(ParseProcStatus("Name:\tx\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no VmRSS line")));
  EXPECT_THAT(ParseProcStatus("VmRSS:\t12 MB\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bad VmRSS: line")));
  auto self = ReadProcessMemory(::getpid());
  ASSERT_TRUE(self.ok()) << self.status();
  EXPECT_GT(self->rss_kib, 100u);
  EXPECT_GE(self->hwm_kib, self->rss_kib);
  EXPECT_THAT(ReadProcessMemory(0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--server-pid: 0 <= 0")));
  EXPECT_THAT(ReadProcessMemory(999999999),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no process 999999999")));
}

TEST(BenchStatsTest, JsonReportParsesAndCarriesTheFigures) {
  BenchReport r;
  r.server = "unix:/run/\"x\".sock";
  r.backend = "cpu";
  r.clients = 3;
  r.channels = 2;
  r.duration_s = 2.0;
  r.mix = "quantize=1";
  r.rows = 16;
  r.cols = 64;
  r.rpcs["quantize"].latency_us = {100, 200, 300, 400};
  r.rpcs["quantize"].kernel_us = {10, 20, 30, 40};
  r.rpcs["update"].latency_us = {50};
  r.rpcs["update"].kernel_us = {5};
  r.rpcs["update"].errors["UNAVAILABLE"] = 2;
  r.server_pid = 77;
  r.memory_before.rss_kib = 1000;
  r.memory_after.rss_kib = 1100;
  r.memory_after.hwm_kib = 1500;
  auto doc = common::ParseJson(ReportJson(r));
  ASSERT_TRUE(doc.ok()) << doc.status() << "\n" << ReportJson(r);
  EXPECT_EQ(doc->Find("server")->text(), "unix:/run/\"x\".sock");
  const common::JsonValue* total = doc->Find("total");
  ASSERT_NE(total, nullptr);
  EXPECT_EQ(*total->Find("calls")->AsInt64(), 7);
  EXPECT_EQ(*total->Find("ok")->AsInt64(), 5);
  EXPECT_EQ(*total->Find("errors")->AsInt64(), 2);
  EXPECT_EQ(*total->Find("ok_per_s")->AsDouble(), 2.5);
  const common::JsonValue* q = doc->Find("rpcs")->Find("quantize");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(*q->Find("p50_us")->AsDouble(), 200);
  EXPECT_EQ(*q->Find("p99_us")->AsDouble(), 400);
  EXPECT_EQ(*q->Find("kernel_p50_us")->AsDouble(), 20);
  EXPECT_EQ(*q->Find("ok_per_s")->AsDouble(), 2);
  EXPECT_EQ(*doc->Find("rpcs")->Find("update")->Find("errors")->Find("UNAVAILABLE")->AsInt64(), 2);
  EXPECT_EQ(*doc->Find("server_memory")->Find("rss_after_kib")->AsInt64(), 1100);
  r.server_pid = 0;
  auto no_memory = common::ParseJson(ReportJson(r));
  ASSERT_TRUE(no_memory.ok());
  EXPECT_TRUE(no_memory->Find("server_memory")->is_null());
  EXPECT_THAT(ReportText(r), HasSubstr("UNAVAILABLE=2"));
}

}  // namespace
}  // namespace fp4q::client::cli
