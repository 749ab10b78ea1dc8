// fp4q bench: a load generator. N client threads, each with its own weight,
// session and (by default) its own connection, call a weighted mix of small
// RPCs back to back for a bounded time; the report gives throughput, latency
// percentiles and kernel time per RPC, errors by status code, and the server's
// memory before and after (with --server-pid).
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "args.h"
#include "bench_stats.h"
#include "commands.h"
#include "fp4q/client/fast_socket.h"
#include "fp4q/client/tensors.h"

namespace fp4q::client::cli {

namespace {

constexpr char kBenchUsage[] =
    "Usage: fp4q [--server ADDR] bench [--clients N] [--channels M] "
    "[--duration S]\n"
    "                                  [--warmup S] [--mix RPC=W,...] [--shape "
    "RxC]\n"
    "                                  [--server-pid PID] [--json FILE] "
    "[--quiet]\n"
    "\n"
    "Load generator: N client threads call a weighted mix of RPCs back to back "
    "for --duration\n"
    "seconds (after --warmup seconds not measured) and report, per RPC, calls "
    "per second,\n"
    "latency p50/p99/p999 (microseconds, client side), the server's kernel "
    "time p50\n"
    "(ReplyHeader.kernel_micros) and errors by status code; with --server-pid, "
    "the server's\n"
    "VmRSS before and after (/proc/PID/status, so the same machine). Progress "
    "goes to stderr\n"
    "every second; the table to stdout; --json FILE writes the full report.\n"
    "Each client creates its own weight bench/<pid>/<i> of --shape (f32, error "
    "feedback) and\n"
    "session, and deletes and closes them at the end.\n"
    "\n"
    "  --clients N       concurrent clients (default 8)\n"
    "  --channels M      gRPC connections shared round-robin by the clients "
    "(default N)\n"
    "  --duration S      measured seconds (default 10)\n"
    "  --warmup S        unmeasured seconds first (default 1)\n"
    "  --mix LIST        RPC=weight list; RPCs: quantize qdq dequantize update "
    "get list info\n"
    "                    keepalive health (grpc.health.v1 Check: the cheapest RPC, a "
    "floor)\n"
    "                    (default "
    "quantize=4,qdq=2,dequantize=1,update=2,get=1,\n"
    "                    list=1,info=1,keepalive=1)\n"
    "  --shape RxC       tensor shape of quantize/qdq/update/get (default "
    "16x256)\n"
    "  --fast-socket P   send quantize, qdq, dequantize, update, keepalive, list and info over\n"
    "                    fp4qd's --fast_socket P (one connection per client) instead\n"
    "                    of gRPC; the other RPCs stay on gRPC\n"
    "  --spin-us N       with --fast-socket: busy-poll each reply this long (default 0)\n"
    "  --server-pid PID  measure this process's memory\n"
    "  --json FILE       write the report as JSON\n"
    "  --quiet           no progress lines\n"
    "Exit code 0 when every call succeeded, 1 when any failed (the report is "
    "written anyway).\n";

constexpr char kDefaultMix[] =
    "quantize=4,qdq=2,dequantize=1,update=2,get=1,list=1,info=1,keepalive=1";
const std::vector<std::string> kRpcs = {"quantize", "qdq",  "dequantize", "update", "get",
                                        "list",     "info", "keepalive",  "health"};

struct Options {
  int clients = 8;
  int channels = 8;
  double duration_s = 10;
  double warmup_s = 1;
  std::string mix = kDefaultMix;
  std::vector<std::pair<std::string, int>> weights;
  int64_t rows = 16, cols = 256;
  int64_t server_pid = 0;
  std::string json;
  bool quiet = false;
  std::string fast_socket;
  int64_t spin_us = 0;
};

absl::Status ParseMix(const std::string& text, Options* o) {
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    std::vector<std::string> kv = absl::StrSplit(item, '=');
    int w = 0;
    if (kv.size() != 2 || std::find(kRpcs.begin(), kRpcs.end(), kv[0]) == kRpcs.end() ||
        !absl::SimpleAtoi(kv[1], &w) || w < 0 || w > 1000) {
      return absl::InvalidArgumentError(
          absl::StrCat("option '--mix': '", item,
                       "' is not RPC=WEIGHT (0..1000) with RPC one of "
                       "quantize qdq dequantize update get list info keepalive health"));
    }
    if (w > 0) o->weights.emplace_back(kv[0], w);
  }
  if (o->weights.empty())
    return absl::InvalidArgumentError("option '--mix': no RPC has weight > 0");
  return absl::OkStatus();
}

absl::StatusOr<Options> ParseOptions(const ParsedArgs& args) {
  Options o;
  auto count = [&](const char* name, int fallback, int max) -> absl::StatusOr<int> {
    absl::StatusOr<uint64_t> v = GetUint64(args, name, static_cast<uint64_t>(fallback));
    if (!v.ok()) return v.status();
    if (*v < 1 || *v > static_cast<uint64_t>(max)) {
      return absl::InvalidArgumentError(
          absl::StrCat("option '--", name, "' must be in [1, ", max, "], got ", *v));
    }
    return static_cast<int>(*v);
  };
  absl::StatusOr<int> clients = count("clients", 8, 4096);
  if (!clients.ok()) return clients.status();
  o.clients = *clients;
  absl::StatusOr<int> channels = count("channels", o.clients, 4096);
  if (!channels.ok()) return channels.status();
  o.channels = std::min(*channels, o.clients);
  for (auto [name, field, max] : {std::tuple{"duration", &o.duration_s, 86400.0},
                                  std::tuple{"warmup", &o.warmup_s, 3600.0}}) {
    absl::StatusOr<double> v = GetDouble(args, name, *field);
    if (!v.ok()) return v.status();
    if (!(*v >= 0) || *v > max || (std::string(name) == "duration" && *v <= 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("option '--", name, "' out of range: ", GetString(args, name, "")));
    }
    *field = *v;
  }
  o.mix = GetString(args, "mix", kDefaultMix);
  if (absl::Status s = ParseMix(o.mix, &o); !s.ok()) return s;
  const std::string shape = GetString(args, "shape", "16x256");
  std::vector<std::string> rc = absl::StrSplit(shape, 'x');
  if (rc.size() != 2 || !absl::SimpleAtoi(rc[0], &o.rows) || !absl::SimpleAtoi(rc[1], &o.cols) ||
      o.rows < 1 || o.cols < 16 || o.cols % 16 != 0 || o.rows > 65536 || o.cols > 65536) {
    return absl::InvalidArgumentError(absl::StrCat(
        "option '--shape': '", shape, "' is not RxC with R in [1, 65536], C a multiple of 16"));
  }
  absl::StatusOr<uint64_t> pid = GetUint64(args, "server-pid", 0);
  if (!pid.ok()) return pid.status();
  o.server_pid = static_cast<int64_t>(*pid);
  o.json = GetString(args, "json", "");
  o.quiet = args.flags.count("quiet") != 0;
  o.fast_socket = GetString(args, "fast-socket", "");
  absl::StatusOr<uint64_t> spin = GetUint64(args, "spin-us", 0);
  if (!spin.ok() || *spin > 1000000 || (*spin > 0 && o.fast_socket.empty())) {
    return absl::InvalidArgumentError("option '--spin-us': 0-1000000, with --fast-socket");
  }
  o.spin_us = static_cast<int64_t>(*spin);
  return o;
}

// One client: its connection, weight, session and the state of its calls.
struct Worker {
  const Client* client = nullptr;
  int index = 0;
  std::string weight;
  std::string session;
  int64_t step = 0;
  v1::QuantizeRequest quantize;
  v1::QdqRequest qdq;
  v1::DequantizeRequest dequantize;
  v1::UpdateWeightRequest update;
  v1::GetWeightRequest get;
  std::unique_ptr<FastSocket> fast;  // --fast-socket
  std::map<std::string, RpcStats> stats;
};

absl::Status Setup(Worker& w, const Options& o) {
  std::mt19937 gen(static_cast<uint32_t>(w.index + 1));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(o.rows * o.cols));
  for (float& v : x) v = normal(gen);
  absl::StatusOr<v1::Tensor> t = InlineTensorF32(x, {o.rows, o.cols});
  if (!t.ok()) return t.status();
  *w.quantize.mutable_input() = *t;
  *w.qdq.mutable_input() = *t;
  v1::CreateWeightRequest create;
  create.set_name(w.weight);
  *create.mutable_initial() = *t;
  create.mutable_options()->set_error_feedback(true);
  absl::StatusOr<v1::CreateWeightReply> created = w.client->CreateWeight(create);
  if (!created.ok()) return created.status();
  for (float& v : x) v *= 0.01f;
  absl::StatusOr<v1::Tensor> delta = InlineTensorF32(x, {o.rows, o.cols});
  if (!delta.ok()) return delta.status();
  w.update.set_name(w.weight);
  w.update.set_kind(v1::UPDATE_KIND_DELTA);
  *w.update.mutable_update() = *delta;
  w.get.set_name(w.weight);
  w.get.set_dequantized(true);
  absl::StatusOr<v1::QuantizeReply> q = w.client->Quantize(w.quantize);
  if (!q.ok()) return q.status();
  *w.dequantize.mutable_input()->mutable_tensor() = q->rowwise();
  v1::OpenSessionRequest open;
  open.set_client_name(absl::StrCat("fp4q-bench-", w.index));
  absl::StatusOr<v1::OpenSessionReply> session = w.client->OpenSession(open);
  if (!session.ok()) return session.status();
  w.session = session->session_id();
  if (!o.fast_socket.empty()) {
    FastSocketOptions fo;
    fo.path = o.fast_socket;
    fo.auth_token = w.client->options().bearer_token;
    fo.spin = absl::Microseconds(o.spin_us);
    absl::StatusOr<std::unique_ptr<FastSocket>> f = FastSocket::Connect(fo, w.session);
    if (!f.ok()) return f.status();
    w.fast = *std::move(f);
  }
  return absl::OkStatus();
}

// One call of `rpc`; the reply header's kernel time in *kernel_us.
absl::Status CallOnce(Worker& w, const std::string& rpc, double* kernel_us) {
  auto header = [&](const v1::ReplyHeader& h) { *kernel_us = h.kernel_micros(); };
  if (w.fast != nullptr) {
    if (rpc == "quantize") {
      auto r = w.fast->Quantize(w.quantize);
      if (r.ok()) header(r->header());
      return r.status();
    }
    if (rpc == "qdq") {
      auto r = w.fast->Qdq(w.qdq);
      if (r.ok()) header(r->header());
      return r.status();
    }
    if (rpc == "dequantize") {
      auto r = w.fast->Dequantize(w.dequantize);
      if (r.ok()) header(r->header());
      return r.status();
    }
    if (rpc == "update") {
      w.update.set_step(++w.step);
      auto r = w.fast->UpdateWeight(w.update);
      if (r.ok()) header(r->header());
      if (r.ok() && !r->applied()) return absl::InternalError("update: step not applied");
      return r.status();
    }
    if (rpc == "keepalive") return w.fast->KeepAlive().status();
    if (rpc == "list") return w.fast->ListTensors().status();
    if (rpc == "info") return w.fast->ServerInfo().status();
  }
  if (rpc == "quantize") {
    auto r = w.client->Quantize(w.quantize);
    if (r.ok()) header(r->header());
    return r.status();
  }
  if (rpc == "qdq") {
    auto r = w.client->Qdq(w.qdq);
    if (r.ok()) header(r->header());
    return r.status();
  }
  if (rpc == "dequantize") {
    auto r = w.client->Dequantize(w.dequantize);
    if (r.ok()) header(r->header());
    return r.status();
  }
  if (rpc == "update") {
    w.update.set_step(++w.step);
    auto r = w.client->UpdateWeightOnce(w.update);
    if (r.ok()) header(r->header());
    if (r.ok() && !r->applied()) return absl::InternalError("update: step not applied");
    return r.status();
  }
  if (rpc == "get") {
    auto r = w.client->GetWeight(w.get);
    if (r.ok()) header(r->header());
    return r.status();
  }
  if (rpc == "list") return w.client->ListTensors().status();
  if (rpc == "info") return w.client->ServerInfo().status();
  if (rpc == "health") return w.client->CheckHealth("").status();
  CallOptions c;
  c.session_id = w.session;
  return w.client->KeepAlive(v1::KeepAliveRequest(), c).status();
}

std::string Now3339() {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::Now(), absl::UTCTimeZone());
}

}  // namespace

int RunBench(const CommandContext& context) {
  ArgSpec spec;
  spec.valued = {"clients",    "channels", "duration",    "warmup",     "mix",
                 "shape",      "server-pid", "json",      "fast-socket", "spin-us"};
  spec.boolean = {"quiet"};
  absl::StatusOr<ParsedArgs> args = ParseArgs(context.args, 0, spec);
  if (!args.ok()) return UsageFailure("bench", std::string(args.status().message()));
  if (args->help) {
    std::fputs(kBenchUsage, stdout);
    return kExitOk;
  }
  if (!args->positional.empty()) {
    return UsageFailure("bench", absl::StrCat("unexpected argument '", args->positional[0], "'"));
  }
  absl::StatusOr<Options> o = ParseOptions(*args);
  if (!o.ok()) return UsageFailure("bench", std::string(o.status().message()));

  BenchReport report;
  report.server = context.client.address;
  report.clients = o->clients;
  report.channels = o->channels;
  report.mix = o->mix;
  report.rows = o->rows;
  report.transport = o->fast_socket.empty() ? "grpc" : "fast_socket";
  report.cols = o->cols;
  report.warmup_s = o->warmup_s;
  report.started_at = Now3339();
  report.host_cpus = static_cast<int>(std::thread::hardware_concurrency());
  utsname u;
  if (::uname(&u) == 0) report.host = absl::StrCat(u.nodename, " ", u.machine);

  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < o->channels; ++i) {
    absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(context.client);
    if (!c.ok()) return UsageFailure("bench", std::string(c.status().message()));
    clients.push_back(*std::move(c));
  }
  absl::StatusOr<v1::ServerInfoReply> info = clients[0]->ServerInfo();
  if (!info.ok()) return Failure("bench", info.status());
  report.backend = info->backend();
  report.server_version = info->version();

  std::vector<Worker> workers(static_cast<size_t>(o->clients));
  for (int i = 0; i < o->clients; ++i) {
    Worker& w = workers[static_cast<size_t>(i)];
    w.client = clients[static_cast<size_t>(i % o->channels)].get();
    w.index = i;
    w.weight = absl::StrCat("bench/", ::getpid(), "/", i);
    if (absl::Status s = Setup(w, *o); !s.ok()) return Failure("bench", s);
  }
  if (o->server_pid > 0) {
    absl::StatusOr<ProcessMemory> m = ReadProcessMemory(o->server_pid);
    if (!m.ok()) return UsageFailure("bench", std::string(m.status().message()));
    report.server_pid = o->server_pid;
    report.memory_before = *m;
  }

  // The schedule: each worker draws RPCs by weight, back to back, until the
  // end.
  std::vector<std::string> wheel;
  for (const auto& [rpc, weight] : o->weights) wheel.insert(wheel.end(), weight, rpc);
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  const Clock::time_point measure_from = start + std::chrono::duration_cast<Clock::duration>(
                                                     std::chrono::duration<double>(o->warmup_s));
  const Clock::time_point end = measure_from + std::chrono::duration_cast<Clock::duration>(
                                                   std::chrono::duration<double>(o->duration_s));
  std::atomic<uint64_t> done{0}, failed{0};
  std::vector<std::thread> threads;
  for (Worker& w : workers) {
    threads.emplace_back([&w, &wheel, measure_from, end, &done, &failed] {
      std::mt19937 gen(static_cast<uint32_t>(w.index * 7919 + 1));
      std::uniform_int_distribution<size_t> pick(0, wheel.size() - 1);
      while (true) {
        const std::string& rpc = wheel[pick(gen)];
        const Clock::time_point t0 = Clock::now();
        if (t0 >= end) break;
        double kernel_us = 0;
        absl::Status s = CallOnce(w, rpc, &kernel_us);
        const Clock::time_point t1 = Clock::now();
        if (t0 < measure_from) continue;
        RpcStats& st = w.stats[rpc];
        if (s.ok()) {
          st.latency_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
          st.kernel_us.push_back(kernel_us);
        } else {
          ++st.errors[absl::StatusCodeToString(s.code())];
          ++failed;
        }
        ++done;
      }
    });
  }
  if (!o->quiet) {
    uint64_t last = 0;
    for (int second = 1; Clock::now() < end; ++second) {
      std::this_thread::sleep_until(start + std::chrono::seconds(second));
      const uint64_t n = done.load();
      std::fprintf(stderr, "fp4q bench: t=%ds %s calls=%llu (+%llu/s) errors=%llu\n", second,
                   Clock::now() <= measure_from ? "warmup" : "measure",
                   static_cast<unsigned long long>(n), static_cast<unsigned long long>(n - last),
                   static_cast<unsigned long long>(failed.load()));
      last = n;
    }
  }
  for (auto& t : threads) t.join();
  report.duration_s = std::chrono::duration<double>(end - measure_from).count();
  for (Worker& w : workers) {
    for (const auto& [rpc, st] : w.stats) report.rpcs[rpc].Merge(st);
  }
  // Teardown, then the memory after (the state the run created is gone again).
  for (Worker& w : workers) {
    v1::DeleteWeightRequest del;
    del.set_name(w.weight);
    absl::Status s = w.client->DeleteWeight(del).status();
    CallOptions c;
    c.session_id = w.session;
    absl::Status closed = w.client->CloseSession(v1::CloseSessionRequest(), c).status();
    if (!s.ok() || !closed.ok()) {
      std::fprintf(stderr, "fp4q bench: cleanup of client %d: %s %s\n", w.index,
                   s.ToString().c_str(), closed.ToString().c_str());
    }
  }
  if (report.server_pid > 0) {
    absl::StatusOr<ProcessMemory> m = ReadProcessMemory(report.server_pid);
    if (m.ok()) report.memory_after = *m;
  }
  std::fputs(ReportText(report).c_str(), stdout);
  if (!o->json.empty()) {
    std::ofstream out(o->json, std::ios::binary | std::ios::trunc);
    out << ReportJson(report);
    if (!out) {
      return Failure("bench", absl::UnavailableError(absl::StrCat("cannot write ", o->json)));
    }
  }
  return failed.load() == 0 ? kExitOk : kExitError;
}

}  // namespace fp4q::client::cli
