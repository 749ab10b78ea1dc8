// bench-step's usage text and options (bench_step_args.h).
#include "bench_step_args.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace fp4q::client::cli::bench_step {
namespace {

bool ValidNameChars(const std::string& s) {
  for (char c : s) {
    const bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-' || c == '/' || c == ':';
    if (!ok) return false;
  }
  return true;
}

}  // namespace

const char kUsage[] =
    "Usage: fp4q [--server ADDR] bench-step [--model gpt2-small|llama3-8b|square8192]\n"
    "           [--layers N] [--shapes RxC,...] [--optimizer sgd|adamw] [--momentum X]\n"
    "           [--ef|--no-ef] [--rounding rtn|sr] [--scaling current|delayed]\n"
    "           [--state-dtype f32|bf16|nvfp4] [--lr X] [--iters N] [--warmup N]\n"
    "           [--init ipc|inline] [--align BYTES]\n"
    "           [--prefix NAME] [--copy-bandwidth GBPS] [--cuda-runtime LIB] [--json FILE]\n"
    "           [--fast-socket PATH [--spin-us N] [--no-heads-up]] [--plan] [--one-pass]\n"
    "           [--gap-us N]\n"
    "\n"
    "The trainer's step: one Step call updates every weight of a model stored in\n"
    "NVFP4 (1x16) on the server. On GPU 0 it allocates one bf16 gradient buffer and one bf16\n"
    "parameter buffer holding every weight back to back, fills the gradients with random\n"
    "non-zero values and the parameters with ~N(0, 0.02) (random blocks tiled over the buffers),\n"
    "registers each buffer once as a CUDA IPC region of one session, creates the weights under\n"
    "--prefix from the parameter buffer, and times --iters steps after --warmup: each item\n"
    "names its gradient slice and its parameter slice as dequantized_out (DQ(W) in bf16), and\n"
    "the reply is brief (brief_reply: every item must count as applied). The weights are\n"
    "deleted at the end. The server must run on this machine with --backend cuda\n"
    "--allow_cuda_ipc; use its Unix socket (--server unix:///path).\n"
    "\n"
    "  --model M          gpt2-small (default: 12 layers of 768x2304, 768x768, 768x3072,\n"
    "                     3072x768, then 50257x768 and 1024x768: 124,318,464 parameters),\n"
    "                     llama3-8b (--layers of q 4096x4096, k and v 1024x4096, o 4096x4096,\n"
    "                     gate and up 14336x4096, down 4096x14336: 6.98e9 for 32), square8192\n"
    "  --layers N         llama3-8b's layers (default 32)\n"
    "  --shapes RxC,...   these matrices instead of --model (C a multiple of 16)\n"
    "  --optimizer O      sgd (default: plain, no momentum) or adamw (betas 0.9/0.999, eps 1e-8,\n"
    "                     weight decay 0.01)\n"
    "  --ef, --no-ef      error feedback (an f32 residual per weight; default --ef)\n"
    "  --rounding R       rtn (default) or sr (stochastic)\n"
    "  --scaling S        current (default) or delayed global scale\n"
    "  --momentum X       SGD's momentum, in [0, 1) (default 0: plain SGD); > 0 keeps a momentum\n"
    "                     buffer per weight, as torch.optim.SGD(momentum=X)\n"
    "  --state-dtype D    AdamW's m and v or SGD's momentum buffer: f32 (default), bf16 or nvfp4\n"
    "                     (with --optimizer adamw or --momentum)\n"
    "  --lr X             learning rate (default 0.001)\n"
    "  --iters N          measured steps (default 100)\n"
    "  --warmup N         unmeasured steps first (default 10)\n"
    "  --init I           initial values by ipc (default: the parameter buffer) or inline\n"
    "  --align BYTES      offset alignment of the slices, a power of two >= 16 (default 16)\n"
    "  --prefix NAME      weight names NAME/<weight> (default bench-step/<pid>)\n"
    "  --copy-bandwidth G the device copy bandwidth in GB/s (read + written) measured in the\n"
    "                     same run (fp4q_bench): also report the floor's time and % of it\n"
    "  --cuda-runtime L   CUDA runtime library (default: libcudart.so.13, libcudart.so)\n"
    "  --json FILE        also write the report there\n"
    "  --fast-socket P    step over fp4qd's --fast_socket P instead of gRPC (the session,\n"
    "                     regions and weights still come from gRPC)\n"
    "  --spin-us N        with --fast-socket: busy-poll each reply N us (0: sleep for it);\n"
    "                     default: the client's automatic spin (FastSocketOptions::spin)\n"
    "  --plan             send the items once, kept as a step plan of the session\n"
    "                     (StepRequest.keep_plan), then each step as its plan_id alone\n"
    "  --one-pass         ask for one-pass steps (StepRequest.one_pass: plain SGD, delayed\n"
    "                     scaling); fails if the server runs a step in two\n"
    "  --gap-us N         sleep N us before each step, as a training loop's forward and\n"
    "                     backward passes leave the server idle between steps (default 0: back\n"
    "                     to back); over the fast socket each step after a gap of 1 ms or more\n"
    "                     starts with a heads-up (FastSocket::HeadsUp) where fp4qd takes them\n"
    "  --no-heads-up      with --fast-socket: send no heads-ups\n"
    "\n"
    "Report (JSON on stdout): the parameter count; wall_us, and the reply header's kernel_us,\n"
    "queue_us and server_us, overhead_us (wall - kernel) and client_and_transport_us (wall -\n"
    "server), each p50/p90/min/max/mean in microseconds per step; the bytes floor (each byte\n"
    "the step must move, read + written, once: codes 0.5 + scales 0.0625 + bf16 gradient 2 +\n"
    "f32 residual 4 read, the same codes, scales and residual and the bf16 DQ(W) 2 written:\n"
    "13.125 B per parameter for SGD with EF; --no-ef drops 8; AdamW adds 16 for f32 m and v,\n"
    "8 for bf16, 2.25 for nvfp4; rounding and scaling add nothing, though current scaling\n"
    "reads the inputs twice) and achieved_gbps = floor bytes / p50 time of the wall and of the\n"
    "kernels; with --copy-bandwidth, floor_us_at_copy_bandwidth and pct_of_copy_bandwidth;\n"
    "spin_us (\"auto\": the automatic spin), replies_polled, replies_polled_then_slept and\n"
    "replies_before_spin (the replies that came while busy-polling, after the spin ran out,\n"
    "and while a reply expected late was slept for before its spin); gap_us and\n"
    "heads_ups (the heads-ups sent; the wall time counts each from its send).\n"
    "Progress goes to stderr.\n"
    "Exit code 0 when every step succeeded; 1 on any error, or without a GPU (said why); 2 on\n"
    "bad usage.\n";

absl::Status ParseConfig(const ParsedArgs& args, Config* c) {
  auto choice = [&](const char* name, const std::vector<std::string>& choices,
                    const char* fallback) { return GetChoice(args, name, choices, fallback); };
  const bool shapes_given = args.values.count("shapes") != 0;
  if (shapes_given && args.values.count("model") != 0) {
    return absl::InvalidArgumentError("options '--shapes' and '--model' exclude each other");
  }
  absl::StatusOr<std::string> model = choice("model", bench_step::ModelNames(), "gpt2-small");
  if (!model.ok()) return model.status();
  absl::StatusOr<uint64_t> layers = GetUint64(args, "layers", 32);
  if (!layers.ok()) return layers.status();
  if (args.values.count("layers") != 0 && (shapes_given || *model != "llama3-8b")) {
    return absl::InvalidArgumentError("option '--layers' needs --model llama3-8b");
  }
  if (*layers < 1 || *layers > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("option '--layers' must be in [1, 1024], got ", *layers));
  }
  absl::StatusOr<std::vector<WeightShape>> shapes =
      shapes_given ? bench_step::ParseShapes(GetString(args, "shapes", ""))
                   : bench_step::ModelShapes(*model, static_cast<int>(*layers));
  if (!shapes.ok()) return shapes.status();
  c->shapes = *std::move(shapes);
  c->model = shapes_given ? "custom" : *model;
  c->layers = !shapes_given && *model == "llama3-8b" ? static_cast<int>(*layers) : 0;

  absl::StatusOr<std::string> optimizer = choice("optimizer", {"sgd", "adamw"}, "sgd");
  absl::StatusOr<std::string> rounding = choice("rounding", {"rtn", "sr"}, "rtn");
  absl::StatusOr<std::string> scaling = choice("scaling", {"current", "delayed"}, "current");
  absl::StatusOr<std::string> state = choice("state-dtype", {"f32", "bf16", "nvfp4"}, "f32");
  absl::StatusOr<std::string> init = choice("init", {"ipc", "inline"}, "ipc");
  for (const auto* s : {&optimizer, &rounding, &scaling, &state, &init}) {
    if (!s->ok()) return s->status();
  }
  if (args.flags.count("ef") != 0 && args.flags.count("no-ef") != 0) {
    return absl::InvalidArgumentError("options '--ef' and '--no-ef' exclude each other");
  }
  double momentum = 0.0;
  if (args.values.count("momentum") != 0) {
    if (*optimizer != "sgd") {
      return absl::InvalidArgumentError("option '--momentum' needs --optimizer sgd");
    }
    absl::StatusOr<double> m = GetDouble(args, "momentum", 0.0);
    if (!m.ok()) return m.status();
    if (!std::isfinite(*m) || *m < 0.0 || *m >= 1.0) {
      return absl::InvalidArgumentError(absl::StrCat("option '--momentum' must be in [0, 1), got ",
                                                     GetString(args, "momentum", "")));
    }
    momentum = *m;
  }
  if (args.values.count("state-dtype") != 0 && *optimizer != "adamw" && momentum <= 0.0) {
    return absl::InvalidArgumentError(
        "option '--state-dtype' needs --optimizer adamw or --momentum > 0");
  }
  StepOptions& o = c->options;
  o.optimizer = *optimizer == "adamw" ? bench_step::Optimizer::kAdamW : bench_step::Optimizer::kSgd;
  o.error_feedback = args.flags.count("no-ef") == 0;
  o.stochastic_rounding = *rounding == "sr";
  o.delayed_scaling = *scaling == "delayed";
  o.momentum = static_cast<float>(momentum);
  o.state_dtype = *state == "bf16"    ? bench_step::StateDType::kBf16
                  : *state == "nvfp4" ? bench_step::StateDType::kNvfp4
                                      : bench_step::StateDType::kF32;
  c->init = *init;

  absl::StatusOr<double> lr = GetDouble(args, "lr", 1e-3);
  if (!lr.ok()) return lr.status();
  if (!std::isfinite(*lr) || *lr < 0 || *lr > 1e30) {
    return absl::InvalidArgumentError(
        absl::StrCat("option '--lr' must be finite and >= 0, got ", GetString(args, "lr", "")));
  }
  o.lr = static_cast<float>(*lr);
  absl::StatusOr<uint64_t> iters = GetUint64(args, "iters", 100);
  absl::StatusOr<uint64_t> warmup = GetUint64(args, "warmup", 10);
  if (!iters.ok()) return iters.status();
  if (!warmup.ok()) return warmup.status();
  if (*iters < 1 || *iters > 1000000 || *warmup > 1000000) {
    return absl::InvalidArgumentError(
        "options '--iters' (1-1000000) and '--warmup' (0-1000000) are counts of steps");
  }
  c->iters = *iters;
  c->warmup = *warmup;
  absl::StatusOr<uint64_t> align = GetUint64(args, "align", 16);
  if (!align.ok()) return align.status();
  if (*align < 16 || *align > 4096 || (*align & (*align - 1)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("option '--align' must be a power of two in [16, 4096], got ", *align));
  }
  c->align = *align;
  c->prefix = GetString(args, "prefix", absl::StrCat("bench-step/", ::getpid()));
  if (c->prefix.empty() || c->prefix.size() > 200 || !ValidNameChars(c->prefix)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "option '--prefix': '", c->prefix, "' must be 1-200 bytes of A-Z a-z 0-9 . _ - / :"));
  }
  if (args.values.count("copy-bandwidth") != 0) {
    absl::StatusOr<double> bw = GetDouble(args, "copy-bandwidth", 0);
    if (!bw.ok()) return bw.status();
    if (!std::isfinite(*bw) || *bw <= 0 || *bw > 1e6) {
      return absl::InvalidArgumentError(
          absl::StrCat("option '--copy-bandwidth' must be in (0, 1e6] GB/s, got ",
                       GetString(args, "copy-bandwidth", "")));
    }
    c->copy_bandwidth = *bw;
  }
  c->json = GetString(args, "json", "");
  c->fast_socket = GetString(args, "fast-socket", "");
  c->cuda_runtime = GetString(args, "cuda-runtime", "");
  if (args.values.count("spin-us") != 0) {
    absl::StatusOr<uint64_t> spin = GetUint64(args, "spin-us", 0);
    if (!spin.ok() || *spin > 1000000 || c->fast_socket.empty()) {
      return absl::InvalidArgumentError("option '--spin-us': 0-1000000, with --fast-socket");
    }
    c->spin_us = *spin;
  }
  if (args.values.count("gap-us") != 0) {
    absl::StatusOr<uint64_t> gap = GetUint64(args, "gap-us", 0);
    if (!gap.ok() || *gap > 1000000) {
      return absl::InvalidArgumentError(absl::StrCat(
          "option '--gap-us' must be in [0, 1000000], got '", GetString(args, "gap-us", ""), "'"));
    }
    c->gap_us = *gap;
  }
  c->heads_up = args.flags.count("no-heads-up") == 0;
  if (!c->heads_up && c->fast_socket.empty()) {
    return absl::InvalidArgumentError("option '--no-heads-up' needs --fast-socket");
  }
  c->plan = args.flags.count("plan") != 0;
  c->one_pass = args.flags.count("one-pass") != 0;
  if (c->one_pass && (o.optimizer != bench_step::Optimizer::kSgd || o.momentum > 0.0f ||
                      !o.delayed_scaling)) {
    return absl::InvalidArgumentError(
        "option '--one-pass' needs plain SGD (--optimizer sgd, no --momentum) and --scaling "
        "delayed");
  }
  for (WeightShape& s : c->shapes) s.name = absl::StrCat(c->prefix, "/", s.name);
  return absl::OkStatus();
}

}  // namespace fp4q::client::cli::bench_step
