#include "bench_stats.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <numeric>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "fp4q/common/json.h"

namespace fp4q::client::cli {
namespace {

double Rank(const std::vector<double>& sorted, double q) {
  const size_t n = sorted.size();
  size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(n)));
  rank = std::clamp<size_t>(rank, 1, n);
  return sorted[rank - 1];
}

std::string Num(double v) { return absl::StrFormat("%.1f", v); }

void AppendSummary(std::string* out, const char* prefix, const LatencySummary& s) {
  absl::StrAppend(out, "\"", prefix, "p50_us\": ", Num(s.p50), ", \"", prefix,
                  "p99_us\": ", Num(s.p99), ", \"", prefix, "p999_us\": ", Num(s.p999), ", \"",
                  prefix, "max_us\": ", Num(s.max), ", \"", prefix, "mean_us\": ", Num(s.mean));
}

}  // namespace

LatencySummary Summarize(std::vector<double> samples) {
  LatencySummary s;
  s.count = samples.size();
  if (samples.empty()) return s;
  std::sort(samples.begin(), samples.end());
  s.p50 = Rank(samples, 0.50);
  s.p99 = Rank(samples, 0.99);
  s.p999 = Rank(samples, 0.999);
  s.max = samples.back();
  s.mean = std::accumulate(samples.begin(), samples.end(), 0.0) / static_cast<double>(s.count);
  return s;
}

void RpcStats::Merge(const RpcStats& o) {
  latency_us.insert(latency_us.end(), o.latency_us.begin(), o.latency_us.end());
  kernel_us.insert(kernel_us.end(), o.kernel_us.begin(), o.kernel_us.end());
  for (const auto& [code, n] : o.errors) errors[code] += n;
}

uint64_t RpcStats::failed() const {
  uint64_t n = 0;
  for (const auto& [code, count] : errors) n += count;
  return n;
}

absl::StatusOr<ProcessMemory> ParseProcStatus(const std::string& text) {
  ProcessMemory m;
  bool rss = false;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    for (auto [key, field] : {std::pair{"VmRSS:", &m.rss_kib}, std::pair{"VmHWM:", &m.hwm_kib}}) {
      if (!absl::ConsumePrefix(&line, key)) continue;
      absl::string_view v = absl::StripAsciiWhitespace(line);
      if (!absl::ConsumeSuffix(&v, " kB") || !absl::SimpleAtoi(v, field)) {
        return absl::InvalidArgumentError(absl::StrCat("/proc status: bad ", key, " line"));
      }
      rss = rss || field == &m.rss_kib;
    }
  }
  if (!rss) return absl::InvalidArgumentError("/proc status: no VmRSS line");
  return m;
}

absl::StatusOr<ProcessMemory> ReadProcessMemory(int64_t pid) {
  if (pid <= 0) return absl::InvalidArgumentError(absl::StrCat("--server-pid: ", pid, " <= 0"));
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  if (!in) return absl::NotFoundError(absl::StrCat("--server-pid: no process ", pid));
  std::stringstream ss;
  ss << in.rdbuf();
  return ParseProcStatus(ss.str());
}

std::string ReportJson(const BenchReport& r) {
  using common::JsonQuote;
  uint64_t calls = 0, ok = 0;
  for (const auto& [name, s] : r.rpcs) {
    ok += s.ok();
    calls += s.ok() + s.failed();
  }
  const double d = r.duration_s > 0 ? r.duration_s : 1;
  std::string out = "{\n";
  absl::StrAppend(
      &out, "  \"tool\": \"fp4q bench\",\n  \"started_at\": ", JsonQuote(r.started_at),
      ",\n  \"host\": ", JsonQuote(r.host), ",\n  \"host_cpus\": ", r.host_cpus,
      ",\n  \"server\": ", JsonQuote(r.server), ",\n  \"backend\": ", JsonQuote(r.backend),
      ",\n  \"server_version\": ", JsonQuote(r.server_version), ",\n  \"clients\": ", r.clients,
      ",\n  \"channels\": ", r.channels, ",\n  \"warmup_s\": ", Num(r.warmup_s),
      ",\n  \"duration_s\": ", absl::StrFormat("%.3f", r.duration_s),
      ",\n  \"mix\": ", JsonQuote(r.mix), ",\n  \"transport\": ", JsonQuote(r.transport), ",\n  \"shape\": [", r.rows, ", ", r.cols, "],\n");
  absl::StrAppend(&out, "  \"total\": {\"calls\": ", calls, ", \"ok\": ", ok,
                  ", \"errors\": ", calls - ok, ", \"ok_per_s\": ", Num(ok / d), "},\n");
  out += "  \"rpcs\": {";
  bool first = true;
  for (const auto& [name, s] : r.rpcs) {
    absl::StrAppend(&out, first ? "\n" : ",\n", "    ", JsonQuote(name), ": {\"ok\": ", s.ok(),
                    ", \"ok_per_s\": ", Num(s.ok() / d), ", ");
    first = false;
    AppendSummary(&out, "", Summarize(s.latency_us));
    out += ", ";
    AppendSummary(&out, "kernel_", Summarize(s.kernel_us));
    out += ", \"errors\": {";
    bool first_error = true;
    for (const auto& [code, n] : s.errors) {
      absl::StrAppend(&out, first_error ? "" : ", ", JsonQuote(code), ": ", n);
      first_error = false;
    }
    out += "}}";
  }
  out += "\n  },\n";
  if (r.server_pid > 0) {
    absl::StrAppend(&out, "  \"server_memory\": {\"pid\": ", r.server_pid,
                    ", \"rss_before_kib\": ", r.memory_before.rss_kib,
                    ", \"rss_after_kib\": ", r.memory_after.rss_kib,
                    ", \"hwm_after_kib\": ", r.memory_after.hwm_kib, "}\n");
  } else {
    out += "  \"server_memory\": null\n";
  }
  out += "}\n";
  return out;
}

std::string ReportText(const BenchReport& r) {
  std::string out = absl::StrFormat("%-12s %10s %10s %10s %10s %10s %12s  %s\n", "RPC", "OK",
                                    "OK/S", "P50_US", "P99_US", "P999_US", "KERNEL_P50", "ERRORS");
  const double d = r.duration_s > 0 ? r.duration_s : 1;
  uint64_t ok = 0, failed = 0;
  for (const auto& [name, s] : r.rpcs) {
    const LatencySummary l = Summarize(s.latency_us);
    const LatencySummary k = Summarize(s.kernel_us);
    std::string errors;
    for (const auto& [code, n] : s.errors) absl::StrAppend(&errors, code, "=", n, " ");
    absl::StrAppendFormat(&out, "%-12s %10d %10.0f %10.1f %10.1f %10.1f %12.1f  %s\n", name, s.ok(),
                          s.ok() / d, l.p50, l.p99, l.p999, k.p50, errors.empty() ? "-" : errors);
    ok += s.ok();
    failed += s.failed();
  }
  absl::StrAppendFormat(&out, "total: %d ok (%.0f/s), %d errors in %.1f s, %d clients\n", ok,
                        ok / d, failed, r.duration_s, r.clients);
  if (r.server_pid > 0) {
    absl::StrAppendFormat(&out, "server pid %d RSS: %d KiB before, %d KiB after (peak %d KiB)\n",
                          r.server_pid, r.memory_before.rss_kib, r.memory_after.rss_kib,
                          r.memory_after.hwm_kib);
  }
  return out;
}

}  // namespace fp4q::client::cli
