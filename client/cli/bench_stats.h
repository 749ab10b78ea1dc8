// Statistics of `fp4q bench`: latency samples per RPC, percentiles, errors by
// status code, the server's memory from /proc, and the JSON report.
#ifndef FP4Q_CLIENT_CLI_BENCH_STATS_H_
#define FP4Q_CLIENT_CLI_BENCH_STATS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fp4q::client::cli {

// Latency percentiles of a set of samples (microseconds). Nearest-rank: p(q) is
// the sample at rank ceil(q * n) of the sorted samples (so p999 of fewer than
// 1000 samples is the maximum).
struct LatencySummary {
  uint64_t count = 0;
  double p50 = 0, p99 = 0, p999 = 0, max = 0, mean = 0;
};
LatencySummary Summarize(std::vector<double> samples_us);

// What one RPC kind did during the measured interval.
struct RpcStats {
  std::vector<double> latency_us;          // successful calls
  std::vector<double> kernel_us;           // ReplyHeader.kernel_micros of successful calls
  std::map<std::string, uint64_t> errors;  // absl status code name -> count

  void Merge(const RpcStats& o);
  uint64_t ok() const { return latency_us.size(); }
  uint64_t failed() const;
};

// VmRSS and VmHWM of a process, in KiB, from /proc/<pid>/status.
struct ProcessMemory {
  uint64_t rss_kib = 0;
  uint64_t hwm_kib = 0;
};
// NOT_FOUND when the process does not exist; INVALID_ARGUMENT for pid <= 0.
absl::StatusOr<ProcessMemory> ReadProcessMemory(int64_t pid);
// Parses the text of a /proc/<pid>/status file (INVALID_ARGUMENT when VmRSS is
// missing).
absl::StatusOr<ProcessMemory> ParseProcStatus(const std::string& text);

struct BenchReport {
  std::string server;
  std::string backend;
  std::string server_version;
  int clients = 0;
  int channels = 0;
  double duration_s = 0;  // measured interval (after warm-up)
  double warmup_s = 0;
  std::string mix;
  std::string transport = "grpc";  // or "fast_socket" (fp4q bench --fast-socket)
  int64_t rows = 0, cols = 0;
  std::map<std::string, RpcStats> rpcs;
  int64_t server_pid = 0;  // 0: memory not measured
  ProcessMemory memory_before, memory_after;
  std::string host;  // uname -n, -m
  int host_cpus = 0;
  std::string started_at;  // RFC 3339, UTC
};

// The report as JSON (one object; see `fp4q bench --help`).
std::string ReportJson(const BenchReport& r);
// A short table for the terminal.
std::string ReportText(const BenchReport& r);

}  // namespace fp4q::client::cli

#endif  // FP4Q_CLIENT_CLI_BENCH_STATS_H_
