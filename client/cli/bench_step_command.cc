// fp4q bench-step: the trainer's step from C++. One Step call updates every
// weight of a model stored in NVFP4 on the server, its gradients and DQ(W) outputs in this
// process's GPU memory by CUDA IPC, as a training worker does.
//
// It loads the CUDA runtime with dlopen (client::CudaRuntime: the CLI links no CUDA), allocates
// on GPU 0 one bf16 gradient buffer and one bf16 parameter buffer holding every weight back to
// back, fills them with random values through the runtime (gradients never zero; parameters
// ~N(0, 0.02), the weights' initial values), registers each buffer once as an IPC region of one
// session, creates the weights (CreateWeight), and times --iters Step calls after --warmup,
// each one step of the whole model with the step number increasing. The parts that need no GPU
// are in bench_step.h.
//
// Without a CUDA runtime, a GPU, or a server that offers cuda_ipc it exits 1 with the reason:
// it never reports figures it did not measure.
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "args.h"
#include "bench_cuda.h"
#include "bench_step.h"
#include "bench_step_args.h"
#include "commands.h"
#include "fp4q/client/cuda_ipc.h"
#include "fp4q/client/cuda_runtime.h"
#include "fp4q/client/fast_socket.h"
#include "fp4q/client/session.h"

namespace fp4q::client::cli {
namespace {

using bench_step::Config;
using bench_step::kUsage;
using bench_step::ParseConfig;
using bench_step::StepOptions;
using bench_step::WeightShape;

constexpr char kName[] = "bench-step";

// A block of bf16 normal values (|v| >= floor, so none is zero when floor > 0), tiled over a
// buffer by Tile and by the inline initial values alike.
std::vector<uint16_t> RandomBlock(size_t n, uint32_t seed, float stddev, float floor) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, stddev);
  std::vector<uint16_t> block(n);
  for (uint16_t& b : block) {
    float v = normal(gen);
    if (std::fabs(v) < floor) v = v < 0 ? -floor : floor;
    b = ToBf16(v);
  }
  return block;
}

// Element e of a tiled buffer is block[e % block.size()].
absl::Status Tile(const CudaRuntime& cuda, const DeviceBuffer& buffer,
                  const std::vector<uint16_t>& block) {
  const uint64_t step = 2 * block.size();
  for (uint64_t at = 0; at < buffer.bytes(); at += step) {
    const uint64_t n = std::min<uint64_t>(step, buffer.bytes() - at);
    if (absl::Status s = cuda.CopyToDevice(buffer, at, block.data(), n); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// The bytes [offset, offset + bytes) of a buffer Tile filled with `block`.
std::string TiledBytes(const std::vector<uint16_t>& block, uint64_t offset, uint64_t bytes) {
  std::string out(bytes, '\0');
  size_t at = static_cast<size_t>((offset / 2) % block.size());
  for (uint64_t e = 0; e < bytes / 2;) {
    const uint64_t run = std::min<uint64_t>(bytes / 2 - e, block.size() - at);
    std::memcpy(&out[2 * e], &block[at], 2 * run);
    e += run;
    at = 0;
  }
  return out;
}

// Deletes the weights it was told of, at the latest when it goes out of scope.
class CreatedWeights {
 public:
  CreatedWeights(const Client& client, CallOptions call)
      : client_(client), call_(std::move(call)) {}
  ~CreatedWeights() { (void)DeleteAll(); }
  void Add(const std::string& name) { names_.push_back(name); }
  absl::Status DeleteAll() {
    absl::Status first;
    for (const std::string& name : names_) {
      v1::DeleteWeightRequest del;
      del.set_name(name);
      absl::Status s = client_.DeleteWeight(del, call_).status();
      if (!s.ok() && first.ok()) {
        first = absl::Status(s.code(), absl::StrCat("deleting '", name, "': ", s.message()));
      }
    }
    names_.clear();
    return first;
  }

 private:
  const Client& client_;
  const CallOptions call_;
  std::vector<std::string> names_;
};

absl::Status WithContext(const absl::Status& s, const std::string& what) {
  return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
}

double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int RunBenchStep(const CommandContext& context) {
  ArgSpec spec;
  spec.valued = {"model",   "layers",      "shapes", "optimizer",      "rounding",
                 "scaling", "state-dtype", "lr",     "iters",          "warmup",
                 "init",    "align",       "prefix", "copy-bandwidth", "cuda-runtime",
                 "json",    "fast-socket", "spin-us",        "momentum",
                 "gap-us"};
  spec.boolean = {"ef", "no-ef", "plan", "one-pass", "no-heads-up"};
  absl::StatusOr<ParsedArgs> args = ParseArgs(context.args, 0, spec);
  if (!args.ok()) return UsageFailure(kName, std::string(args.status().message()));
  if (args->help) {
    std::fputs(kUsage, stdout);
    return kExitOk;
  }
  if (!args->positional.empty()) {
    return UsageFailure(kName, absl::StrCat("unexpected argument '", args->positional[0], "'"));
  }
  Config c;
  if (absl::Status s = ParseConfig(*args, &c); !s.ok()) {
    return UsageFailure(kName, std::string(s.message()));
  }
  const auto t_setup = std::chrono::steady_clock::now();
  const uint64_t params_total = bench_step::ParameterCount(c.shapes);
  const bench_step::FloorBytes floor = bench_step::FloorFor(c.shapes, c.options);
  const bench_step::Layout layout = bench_step::PackBf16(c.shapes, c.align);

  absl::StatusOr<std::unique_ptr<CudaRuntime>> loaded = LoadBenchCuda(c.cuda_runtime);
  if (!loaded.ok()) return Failure(kName, loaded.status());
  const CudaRuntime& cuda = **loaded;
  absl::StatusOr<std::unique_ptr<Client>> connected = Client::Connect(context.client);
  if (!connected.ok()) return UsageFailure(kName, std::string(connected.status().message()));
  const Client& client = **connected;
  absl::StatusOr<v1::ServerInfoReply> info = client.ServerInfo();
  if (!info.ok()) return Failure(kName, info.status());
  bool ipc = false;
  for (const std::string& m : info->supported_modes()) ipc = ipc || m == "cuda_ipc";
  if (!ipc) {
    return Failure(kName, absl::FailedPreconditionError(absl::StrCat(
                              "the server (backend ", info->backend(),
                              ") does not offer cuda_ipc to this caller: run fp4qd --backend cuda "
                              "--allow_cuda_ipc and connect through its --unix_socket")));
  }
  const uint32_t max_items = info->limits().max_step_items();
  if (max_items != 0 && c.shapes.size() > max_items) {
    return Failure(kName,
                   absl::FailedPreconditionError(absl::StrCat(
                       "the model has ", c.shapes.size(), " weights but the server takes at most ",
                       max_items, " items in one Step (fp4qd --max_step_items)")));
  }
  std::fprintf(stderr,
               "fp4q %s: %s: %zu weights, %llu parameters, floor %.4f B/parameter, "
               "2 x %.1f MiB on GPU 0\n",
               kName, c.model.c_str(), c.shapes.size(),
               static_cast<unsigned long long>(params_total),
               static_cast<double>(floor.total()) / static_cast<double>(params_total),
               static_cast<double>(layout.total_bytes) / (1 << 20));

  // Buffers before the session: the session (closed first) releases the server's mappings of
  // them before they are freed.
  DeviceBuffer grads, params;
  for (DeviceBuffer* b : {&grads, &params}) {
    absl::StatusOr<DeviceBuffer> got = cuda.Allocate(layout.total_bytes);
    if (!got.ok()) {
      return Failure(kName, WithContext(got.status(),
                                        absl::StrCat("allocating 2 x ", layout.total_bytes,
                                                     " bytes (gradients, parameters) on GPU 0")));
    }
    *b = *std::move(got);
  }
  const size_t block_elems =
      static_cast<size_t>(std::min<uint64_t>(uint64_t{1} << 24, layout.total_bytes / 2));
  const std::vector<uint16_t> grad_block = RandomBlock(block_elems, 13, 1.0f, 1e-3f);
  const std::vector<uint16_t> init_block = RandomBlock(block_elems, 8, 0.02f, 0.0f);
  for (auto [buffer, block] : {std::pair{&grads, &grad_block}, std::pair{&params, &init_block}}) {
    if (absl::Status s = Tile(cuda, *buffer, *block); !s.ok()) {
      return Failure(kName, WithContext(s, "filling the buffers"));
    }
  }
  absl::StatusOr<std::unique_ptr<CudaIpc>> ipc_api = CudaIpc::Load({cuda.library()});
  if (!ipc_api.ok()) return Failure(kName, ipc_api.status());
  absl::StatusOr<CudaIpcExport> exported = (*ipc_api)->Export(grads.data());
  if (!exported.ok()) return Failure(kName, exported.status());
  const std::string device_uuid = exported->device_uuid;
  if (info->gpus_size() > 0) {
    bool found = false;
    std::string theirs;
    for (const v1::GpuInfo& g : info->gpus()) {
      found = found || g.uuid() == device_uuid;
      absl::StrAppend(&theirs, theirs.empty() ? "" : ", ", g.uuid());
    }
    if (!found) {
      return Failure(kName, absl::FailedPreconditionError(
                                absl::StrCat("GPU 0 here (", device_uuid,
                                             ") is not one of the server's GPUs (", theirs, ")")));
    }
  }

  SessionOptions so;
  so.client_name = "fp4q bench-step";
  so.cuda_runtime_candidates = {cuda.library()};
  absl::StatusOr<std::unique_ptr<Session>> session = Session::Open(client, so);
  if (!session.ok()) return Failure(kName, session.status());
  const CallOptions call = (*session)->call_options();
  absl::StatusOr<v1::RegionSlice> grad_slice = (*session)->RegionFor(grads.data(), grads.bytes());
  if (!grad_slice.ok()) return Failure(kName, WithContext(grad_slice.status(), "gradients"));
  absl::StatusOr<v1::RegionSlice> param_slice =
      (*session)->RegionFor(params.data(), params.bytes());
  if (!param_slice.ok()) return Failure(kName, WithContext(param_slice.status(), "parameters"));

  CreatedWeights created(client, call);
  uint64_t state_bytes = 0;
  for (size_t i = 0; i < c.shapes.size(); ++i) {
    const WeightShape& w = c.shapes[i];
    v1::CreateWeightRequest req = bench_step::CreateRequest(w, i, c.options, device_uuid);
    if (c.init == "inline") {
      req.mutable_initial()->set_inline_data(
          TiledBytes(init_block, layout.offsets[i], 2 * w.elements()));
    } else {
      v1::RegionSlice* r = req.mutable_initial()->mutable_region();
      r->set_region_id(param_slice->region_id());
      r->set_offset(param_slice->offset() + layout.offsets[i]);
    }
    absl::StatusOr<v1::CreateWeightReply> rep = client.CreateWeight(req, call);
    if (!rep.ok()) {
      std::string hint;
      if (rep.status().code() == absl::StatusCode::kResourceExhausted) {
        hint = absl::StrCat(" (the model needs about ",
                            bench_step::EstimatedStateBytes(c.shapes, c.options),
                            " bytes of server state; fp4qd --state_budget_bytes is ",
                            info->limits().state_budget_bytes(), ")");
      }
      return Failure(kName, absl::Status(rep.status().code(),
                                         absl::StrCat("CreateWeight '", w.name,
                                                      "': ", rep.status().message(), hint)));
    }
    created.Add(w.name);
    state_bytes += rep->weight().bytes();
  }

  std::unique_ptr<FastSocket> fast;
  if (!c.fast_socket.empty()) {
    FastSocketOptions fo;
    fo.path = c.fast_socket;
    fo.auth_token = context.client.bearer_token;
    if (c.spin_us.has_value()) fo.spin = absl::Microseconds(static_cast<int64_t>(*c.spin_us));
    absl::StatusOr<std::unique_ptr<FastSocket>> f = FastSocket::Connect(fo, (*session)->id());
    if (!f.ok()) return Failure(kName, WithContext(f.status(), "--fast-socket"));
    fast = *std::move(f);
    if (c.gap_us > 0 && c.heads_up) {
      // HeadsUp() sends only where a ServerInfo reply on this connection said the server takes
      // heads-ups.
      absl::StatusOr<v1::ServerInfoReply> fast_info = fast->ServerInfo();
      if (!fast_info.ok()) return Failure(kName, WithContext(fast_info.status(), "--fast-socket"));
    }
  }
  const double setup_s = SecondsSince(t_setup);
  std::fprintf(stderr, "fp4q %s: set up in %.1f s; %llu + %llu steps\n", kName, setup_s,
               static_cast<unsigned long long>(c.warmup), static_cast<unsigned long long>(c.iters));

  v1::StepRequest req =
      bench_step::BuildStepRequest(c.shapes, layout, *grad_slice, *param_slice, c.options);
  const int items = req.items_size();
  req.set_keep_plan(c.plan);  // --plan: the first step keeps its items, the others name them
  req.set_one_pass(c.one_pass);
  std::vector<double> wall, kernel, queue, server, overhead, client_side;
  for (uint64_t i = 0; i < c.warmup + c.iters; ++i) {
    const int64_t step = static_cast<int64_t>(i) + 1;  // the weights were created at step 0
    req.set_step(step);
    if (c.gap_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(c.gap_us));
    const auto t0 = std::chrono::steady_clock::now();
    if (fast != nullptr && c.heads_up && c.gap_us > 0) fast->HeadsUp();
    absl::StatusOr<v1::StepReply> rep = fast != nullptr ? fast->Step(req) : client.Step(req, call);
    const double us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    if (!rep.ok()) return Failure(kName, WithContext(rep.status(), absl::StrCat("step ", step)));
    // A brief reply (BuildStepRequest): the items are counted, not listed.
    if (rep->items_size() != 0 || rep->applied_items() != static_cast<uint32_t>(items)) {
      return Failure(kName, absl::InternalError(absl::StrCat(
                                "step ", step, ": the reply lists ", rep->items_size(),
                                " items and counts ", rep->applied_items(), " applied of ",
                                items, " (a brief reply lists none and applies all)")));
    }
    if (c.one_pass && !rep->one_pass()) {
      return Failure(kName, absl::FailedPreconditionError(absl::StrCat(
          "--one-pass: step ", step, " ran in two passes (fp4qd's reason: \"",
          rep->one_pass_outcome(), "\"; one pass takes plain SGD under --scaling delayed, and "
          "room in fp4qd's --state_budget_bytes, ", info->limits().state_budget_bytes(),
          ", and in the GPU's memory for a second copy of each weight: ",
          bench_step::OnePassCopyBytes(c.shapes, c.options), " more bytes)")));
    }
    if (req.keep_plan()) {
      if (rep->plan_id() == 0) {
        return Failure(kName, absl::FailedPreconditionError(absl::StrCat(
                                  "--plan: step ", step, " asked to keep a plan and the server "
                                  "kept none (a server without \"step_plans\")")));
      }
      req.clear_items();
      req.set_keep_plan(false);
      req.set_plan_id(rep->plan_id());
    }
    if (i < c.warmup) continue;
    const v1::ReplyHeader& h = rep->header();
    wall.push_back(us);
    kernel.push_back(h.kernel_micros());
    queue.push_back(h.queue_micros());
    server.push_back(h.server_micros());
    overhead.push_back(us - h.kernel_micros());
    client_side.push_back(us - h.server_micros());
  }
  const FastSocketStats polled = fast != nullptr ? fast->stats() : FastSocketStats{};
  fast.reset();
  if (absl::Status s = created.DeleteAll(); !s.ok()) return Failure(kName, s);
  absl::StatusOr<uint32_t> closed = (*session)->Close();
  if (!closed.ok()) return Failure(kName, closed.status());

  bench_step::Report r;
  r.server = context.client.address;
  r.transport = c.fast_socket.empty() ? "grpc" : "fast_socket";
  r.spin_us = c.spin_us;
  r.polled = polled.polled;
  r.polled_then_slept = polled.polled_then_slept;
  r.replied_before_spin = polled.replied_before_spin;
  r.heads_ups = polled.heads_ups;
  r.gap_us = c.gap_us;
  r.plan = c.plan;
  r.one_pass = c.one_pass;
  r.backend = info->backend();
  r.server_version = info->version();
  for (const v1::GpuInfo& g : info->gpus()) r.gpus.emplace_back(g.uuid(), g.name());
  r.device_uuid = device_uuid;
  utsname u;
  r.host = ::uname(&u) == 0 ? u.nodename : "";
  r.cuda_runtime = cuda.library();
  r.model = c.model;
  r.layers = c.layers;
  r.weights = c.shapes.size();
  r.parameters = params_total;
  r.options = c.options;
  r.init = c.init;
  r.align = c.align;
  r.iters = c.iters;
  r.warmup = c.warmup;
  r.floor = floor;
  r.state_bytes = state_bytes;
  r.setup_s = setup_s;
  r.wall = bench_step::Describe(wall);
  r.kernel = bench_step::Describe(kernel);
  r.queue = bench_step::Describe(queue);
  r.server_time = bench_step::Describe(server);
  r.overhead = bench_step::Describe(overhead);
  r.client_side = bench_step::Describe(client_side);
  r.copy_bandwidth_gbps = c.copy_bandwidth;
  std::fprintf(stderr,
               "fp4q %s: p50 wall %.1f us, kernels %.1f us; floor %.1f MB: %.1f GB/s by wall, "
               "%.1f GB/s by kernels\n",
               kName, r.wall.p50, r.kernel.p50, static_cast<double>(floor.total()) / 1e6,
               bench_step::GigabytesPerSecond(floor.total(), r.wall.p50),
               bench_step::GigabytesPerSecond(floor.total(), r.kernel.p50));
  if (!c.fast_socket.empty()) {
    std::fprintf(stderr,
                 "fp4q %s: replies busy-polled for %llu, slept for after a spin %llu, arrived "
                 "before the spin %llu (%s); heads-ups %llu\n",
                 kName, static_cast<unsigned long long>(r.polled),
                 static_cast<unsigned long long>(r.polled_then_slept),
                 static_cast<unsigned long long>(r.replied_before_spin),
                 c.spin_us.has_value() ? absl::StrCat("--spin-us ", *c.spin_us).c_str()
                                       : "the automatic spin",
                 static_cast<unsigned long long>(r.heads_ups));
  }
  const std::string text = bench_step::ReportJson(r);
  std::fputs(text.c_str(), stdout);
  if (!c.json.empty()) {
    std::ofstream f(c.json);
    f << text;
    if (!f) return Failure(kName, absl::InternalError(absl::StrCat("cannot write ", c.json)));
  }
  return kExitOk;
}

}  // namespace fp4q::client::cli
