// fp4q bench-ipc: the latency of one big Quantize by CUDA IPC, from C++ (what
// bench/ipc_quantize_latency.py measures from Python, without Python's own cost).
//
// It loads the CUDA runtime with dlopen (client::CudaRuntime: the CLI links no CUDA),
// allocates a bf16 (or f32) RxC tensor with random non-zero values and the row-wise
// codes/scales outputs on GPU 0, registers them as IPC regions of one session, and calls
// Quantize in place --iters times (after --warmup calls). Per call it records the wall time and
// the reply header's kernel_micros, queue_micros and server_micros, and reports p50/p99 of each
// and of wall - kernel (the service overhead) and wall - server (client + transport).
//
// Without a CUDA runtime, a GPU, or a server that offers cuda_ipc it exits 1 with the reason:
// it never reports figures it did not measure.
#include <sys/utsname.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "args.h"
#include "bench_cuda.h"
#include "bench_stats.h"
#include "commands.h"
#include "fp4q/client/cuda_runtime.h"
#include "fp4q/client/fast_socket.h"
#include "fp4q/client/session.h"

namespace fp4q::client::cli {
namespace {

constexpr char kUsage[] =
    "Usage: fp4q [--server ADDR] bench-ipc [--shape RxC] [--dtype bf16|f32] [--iters N]\n"
    "                                      [--warmup N] [--cuda-runtime LIB] [--json FILE]\n"
    "                                      [--fast-socket PATH [--spin-us N]]\n"
    "\n"
    "Latency of Quantize by CUDA IPC (goal: p50 <= kernel time + 100 us): allocates an RxC\n"
    "tensor of random non-zero values on GPU 0 and its row-wise NVFP4 outputs, registers them\n"
    "as regions of one session and quantizes in place --iters times. Reports p50/p99/min/max/\n"
    "mean (microseconds) of the wall time, the server's kernel_micros, queue_micros and\n"
    "server_micros (ReplyHeader), wall - kernel and wall - server. The server must run on this\n"
    "machine with --allow_cuda_ipc; use its Unix socket (--server unix:///path).\n"
    "\n"
    "  --shape RxC        tensor shape (default 8192x8192; C a multiple of 16)\n"
    "  --dtype D          bf16 (default) or f32\n"
    "  --iters N          measured calls (default 200)\n"
    "  --warmup N         unmeasured calls first (default 10)\n"
    "  --cuda-runtime L   CUDA runtime library (default: libcudart.so.13, libcudart.so)\n"
    "  --json FILE        also write the report there\n"
    "  --fast-socket P    call over fp4qd's --fast_socket P instead of gRPC (the session and\n"
    "                     regions still come from gRPC); also times --iters KeepAlive calls\n"
    "                     there (the small-RPC floor of that transport)\n"
    "  --spin-us N        with --fast-socket: busy-poll each reply this long (default 0)\n"
    "Exit code 0 when every call succeeded; 1 on any error, or without a GPU (said why).\n";

std::string SummaryJson(const LatencySummary& s, const std::vector<double>& v) {
  double lo = v.empty() ? 0 : v[0];
  for (double x : v) lo = std::min(lo, x);
  return absl::StrCat("{\"p50\": ", s.p50, ", \"p99\": ", s.p99, ", \"min\": ", lo,
                      ", \"max\": ", s.max, ", \"mean\": ", s.mean, "}");
}

}  // namespace

int RunBenchIpc(const CommandContext& context) {
  ArgSpec spec;
  spec.valued = {"shape", "dtype", "iters", "warmup", "cuda-runtime", "json", "fast-socket",
                 "spin-us"};
  absl::StatusOr<ParsedArgs> args = ParseArgs(context.args, 0, spec);
  if (!args.ok()) return UsageFailure("bench-ipc", std::string(args.status().message()));
  if (args->help) {
    std::fputs(kUsage, stdout);
    return kExitOk;
  }
  if (!args->positional.empty()) {
    return UsageFailure("bench-ipc",
                        absl::StrCat("unexpected argument '", args->positional[0], "'"));
  }
  int64_t rows = 0, cols = 0;
  const std::string shape = GetString(*args, "shape", "8192x8192");
  std::vector<std::string> rc = absl::StrSplit(shape, 'x');
  if (rc.size() != 2 || !absl::SimpleAtoi(rc[0], &rows) || !absl::SimpleAtoi(rc[1], &cols) ||
      rows < 1 || cols < 16 || cols % 16 != 0 || rows > 65536 || cols > 65536) {
    return UsageFailure("bench-ipc", absl::StrCat("option '--shape': '", shape,
                                                  "' is not RxC with C a multiple of 16"));
  }
  const std::string dtype = GetString(*args, "dtype", "bf16");
  if (dtype != "bf16" && dtype != "f32") {
    return UsageFailure("bench-ipc", "option '--dtype': bf16 or f32");
  }
  absl::StatusOr<uint64_t> iters = GetUint64(*args, "iters", 200);
  absl::StatusOr<uint64_t> warmup = GetUint64(*args, "warmup", 10);
  if (!iters.ok() || !warmup.ok() || *iters < 1 || *iters > 1000000 || *warmup > 1000000) {
    return UsageFailure("bench-ipc", "options '--iters' (>= 1) and '--warmup' are counts");
  }
  const std::string json = GetString(*args, "json", "");
  const std::string fast_path = GetString(*args, "fast-socket", "");
  absl::StatusOr<uint64_t> spin_us = GetUint64(*args, "spin-us", 0);
  if (!spin_us.ok() || *spin_us > 1000000 || (*spin_us > 0 && fast_path.empty())) {
    return UsageFailure("bench-ipc", "option '--spin-us': 0-1000000, with --fast-socket");
  }

  absl::StatusOr<std::unique_ptr<CudaRuntime>> loaded =
      LoadBenchCuda(GetString(*args, "cuda-runtime", ""));
  if (!loaded.ok()) return Failure("bench-ipc", loaded.status());
  const CudaRuntime& cuda = **loaded;
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(context.client);
  if (!client.ok()) return UsageFailure("bench-ipc", std::string(client.status().message()));
  absl::StatusOr<v1::ServerInfoReply> info = (*client)->ServerInfo();
  if (!info.ok()) return Failure("bench-ipc", info.status());
  bool ipc = false;
  for (const std::string& m : info->supported_modes()) ipc = ipc || m == "cuda_ipc";
  if (!ipc) {
    return Failure("bench-ipc",
                   absl::FailedPreconditionError(absl::StrCat(
                       "the server (backend ", info->backend(),
                       ") does not offer cuda_ipc to this caller: run fp4qd --backend cuda "
                       "--allow_cuda_ipc and connect through its --unix_socket")));
  }
  SessionOptions so;
  so.client_name = "fp4q bench-ipc";
  absl::StatusOr<std::unique_ptr<Session>> session = Session::Open(**client, so);
  if (!session.ok()) return Failure("bench-ipc", session.status());

  // The input: random normal values, none of them zero.
  const size_t n = static_cast<size_t>(rows * cols);
  const size_t elem = dtype == "bf16" ? 2 : 4;
  std::vector<uint8_t> host(n * elem);
  {
    std::mt19937 gen(8);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (size_t i = 0; i < n; ++i) {
      float v = normal(gen);
      if (std::fabs(v) < 1e-3f) v = v < 0 ? -1e-3f : 1e-3f;
      if (elem == 2) {
        const uint16_t b = ToBf16(v);
        std::memcpy(&host[i * 2], &b, 2);
      } else {
        std::memcpy(&host[i * 4], &v, 4);
      }
    }
  }
  const size_t codes_bytes = n / 2;
  const size_t scales_bytes = n / 16;  // NVFP4 1x16, plain layout: one E4M3 per 16 elements
  DeviceBuffer x, codes, scales;
  for (auto [m, bytes] : {std::pair{&x, n * elem}, std::pair{&codes, codes_bytes},
                          std::pair{&scales, scales_bytes}}) {
    absl::StatusOr<DeviceBuffer> b = cuda.Allocate(bytes);
    if (!b.ok()) return Failure("bench-ipc", b.status());
    *m = *std::move(b);
  }
  if (absl::Status s = cuda.CopyToDevice(x, 0, host.data(), host.size()); !s.ok()) {
    return Failure("bench-ipc", s);
  }

  v1::QuantizeRequest req;
  req.mutable_input()->set_dtype(elem == 2 ? v1::DTYPE_BF16 : v1::DTYPE_F32);
  req.mutable_input()->add_shape(rows);
  req.mutable_input()->add_shape(cols);
  struct Slot {
    const void* ptr;
    size_t bytes;
    v1::RegionSlice* slice;
  } slots[] = {{x.data(), n * elem, req.mutable_input()->mutable_region()},
               {codes.data(), codes_bytes, req.mutable_rowwise_codes()->mutable_region()},
               {scales.data(), scales_bytes, req.mutable_rowwise_scales()->mutable_region()}};
  for (const Slot& s : slots) {
    absl::StatusOr<v1::RegionSlice> r = (*session)->RegionFor(s.ptr, s.bytes);
    if (!r.ok()) return Failure("bench-ipc", r.status());
    *s.slice = *r;
  }

  std::unique_ptr<FastSocket> fast;
  if (!fast_path.empty()) {
    FastSocketOptions fo;
    fo.path = fast_path;
    fo.auth_token = context.client.bearer_token;
    fo.spin = absl::Microseconds(static_cast<int64_t>(*spin_us));
    absl::StatusOr<std::unique_ptr<FastSocket>> f = FastSocket::Connect(fo, (*session)->id());
    if (!f.ok()) return Failure("bench-ipc", f.status());
    fast = *std::move(f);
  }

  std::vector<double> wall, kernel, queue, server, overhead, client_side, keepalive;
  const CallOptions call = (*session)->call_options();
  for (uint64_t i = 0; i < *warmup + *iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    absl::StatusOr<v1::QuantizeReply> rep =
        fast != nullptr ? fast->Quantize(req) : (*client)->Quantize(req, call);
    const double us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    if (!rep.ok()) {
      return Failure("bench-ipc", absl::Status(rep.status().code(),
                                               absl::StrCat("call ", i, ": ",
                                                            rep.status().message())));
    }
    if (!rep->rowwise().has_codes_region() || !rep->rowwise().has_scales_region()) {
      return Failure("bench-ipc", absl::InternalError(
                                      "the reply did not write the outputs into the regions"));
    }
    if (i < *warmup) continue;
    const v1::ReplyHeader& h = rep->header();
    wall.push_back(us);
    kernel.push_back(h.kernel_micros());
    queue.push_back(h.queue_micros());
    server.push_back(h.server_micros());
    overhead.push_back(us - h.kernel_micros());
    client_side.push_back(us - h.server_micros());
  }
  for (uint64_t i = 0; fast != nullptr && i < *warmup + *iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    absl::StatusOr<v1::KeepAliveReply> rep = fast->KeepAlive();
    const double us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    if (!rep.ok()) return Failure("bench-ipc", rep.status());
    if (i >= *warmup) keepalive.push_back(us);
  }
  fast.reset();
  absl::StatusOr<uint32_t> closed = (*session)->Close();
  if (!closed.ok()) return Failure("bench-ipc", closed.status());

  const LatencySummary sw = Summarize(wall), sk = Summarize(kernel), sq = Summarize(queue),
                       ss = Summarize(server), so2 = Summarize(overhead),
                       sc = Summarize(client_side);
  std::string gpus;
  for (const auto& g : info->gpus()) gpus += absl::StrCat(gpus.empty() ? "" : ", ", "\"", g.name(), "\"");
  utsname u;
  const std::string host_name = ::uname(&u) == 0 ? u.nodename : "";
  const std::string text = absl::StrCat(
      "{\n  \"tool\": \"fp4q bench-ipc\",\n  \"server\": \"", context.client.address,
      "\",\n  \"transport\": \"", fast_path.empty() ? "grpc" : "fast_socket",
      "\",\n  \"spin_us\": ", *spin_us, ",\n  \"backend\": \"", info->backend(), "\",\n  \"server_version\": \"", info->version(),
      "\",\n  \"gpus\": [", gpus, "],\n  \"host\": \"", host_name, "\",\n  \"cuda_runtime\": \"",
      cuda.library(), "\",\n  \"shape\": [", rows, ", ", cols, "],\n  \"dtype\": \"", dtype,
      "\",\n  \"iters\": ", *iters, ",\n  \"warmup\": ", *warmup,
      ",\n  \"wall_us\": ", SummaryJson(sw, wall), ",\n  \"kernel_us\": ", SummaryJson(sk, kernel),
      ",\n  \"queue_us\": ", SummaryJson(sq, queue), ",\n  \"server_us\": ",
      SummaryJson(ss, server), ",\n  \"overhead_us\": ", SummaryJson(so2, overhead),
      ",\n  \"client_and_transport_us\": ", SummaryJson(sc, client_side),
      keepalive.empty() ? std::string()
                        : absl::StrCat(",\n  \"fast_keepalive_us\": ",
                                       SummaryJson(Summarize(keepalive), keepalive)),
      ",\n  \"goal_p50_wall_le_kernel_plus_100us\": ", sw.p50 <= sk.p50 + 100.0 ? "true" : "false",
      "\n}\n");
  std::fputs(text.c_str(), stdout);
  if (!json.empty()) {
    std::ofstream f(json);
    f << text;
    if (!f) return Failure("bench-ipc", absl::InternalError(absl::StrCat("cannot write ", json)));
  }
  return kExitOk;
}

}  // namespace fp4q::client::cli
