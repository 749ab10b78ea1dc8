#include "bench_step.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace fp4q::client::cli::bench_step {
namespace {

constexpr int64_t kMaxSide = int64_t{1} << 20;

std::vector<WeightShape> Gpt2Small() {
  std::vector<WeightShape> w;
  for (int i = 0; i < 12; ++i) {
    const std::string h = absl::StrCat("h.", i, ".");
    w.push_back({h + "attn.c_attn", 768, 2304});
    w.push_back({h + "attn.c_proj", 768, 768});
    w.push_back({h + "mlp.c_fc", 768, 3072});
    w.push_back({h + "mlp.c_proj", 3072, 768});
  }
  w.push_back({"wte", 50257, 768});
  w.push_back({"wpe", 1024, 768});
  return w;
}

std::vector<WeightShape> Llama3_8b(int layers) {
  std::vector<WeightShape> w;
  for (int i = 0; i < layers; ++i) {
    const std::string l = absl::StrCat("layers.", i, ".");
    w.push_back({l + "self_attn.q_proj", 4096, 4096});
    w.push_back({l + "self_attn.k_proj", 1024, 4096});
    w.push_back({l + "self_attn.v_proj", 1024, 4096});
    w.push_back({l + "self_attn.o_proj", 4096, 4096});
    w.push_back({l + "mlp.gate_proj", 14336, 4096});
    w.push_back({l + "mlp.up_proj", 14336, 4096});
    w.push_back({l + "mlp.down_proj", 4096, 14336});
  }
  return w;
}

std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += absl::StrFormat("\\u%04x", static_cast<unsigned char>(c));
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string Us(double v) { return absl::StrFormat("%.1f", v); }

std::string StatsJson(const SampleStats& s) {
  return absl::StrCat("{\"p50\": ", Us(s.p50), ", \"p90\": ", Us(s.p90), ", \"min\": ", Us(s.min),
                      ", \"max\": ", Us(s.max), ", \"mean\": ", Us(s.mean), "}");
}

double Rank(const std::vector<double>& sorted, double q) {
  size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(sorted.size())));
  rank = std::clamp<size_t>(rank, 1, sorted.size());
  return sorted[rank - 1];
}

}  // namespace

const std::vector<std::string>& ModelNames() {
  static const std::vector<std::string> names = {"gpt2-small", "llama3-8b", "square8192"};
  return names;
}

absl::StatusOr<std::vector<WeightShape>> ModelShapes(const std::string& model, int layers) {
  if (model == "gpt2-small") return Gpt2Small();
  if (model == "llama3-8b") {
    if (layers < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("option '--layers': ", layers, " (llama3-8b needs >= 1)"));
    }
    return Llama3_8b(layers);
  }
  if (model == "square8192") return std::vector<WeightShape>{{"w", 8192, 8192}};
  return absl::InvalidArgumentError(absl::StrCat(
      "option '--model' must be one of gpt2-small, llama3-8b, square8192; got '", model, "'"));
}

absl::StatusOr<std::vector<WeightShape>> ParseShapes(const std::string& list) {
  std::vector<WeightShape> out;
  for (absl::string_view entry : absl::StrSplit(list, ',')) {
    std::vector<std::string> rc = absl::StrSplit(entry, 'x');
    int64_t rows = 0, cols = 0;
    if (rc.size() != 2 || !absl::SimpleAtoi(rc[0], &rows) || !absl::SimpleAtoi(rc[1], &cols) ||
        rows < 1 || cols < 16 || cols % 16 != 0 || rows > kMaxSide || cols > kMaxSide) {
      return absl::InvalidArgumentError(absl::StrCat(
          "option '--shapes': '", entry,
          "' is not RxC with R in [1, 1048576] and C a multiple of 16 in [16, 1048576]"));
    }
    out.push_back({absl::StrCat("w", out.size()), rows, cols});
  }
  return out;
}

uint64_t ParameterCount(const std::vector<WeightShape>& shapes) {
  uint64_t n = 0;
  for (const WeightShape& s : shapes) n += s.elements();
  return n;
}

const char* OptimizerName(Optimizer o) { return o == Optimizer::kAdamW ? "adamw" : "sgd"; }

const char* StateDTypeName(StateDType d) {
  switch (d) {
    case StateDType::kBf16:
      return "bf16";
    case StateDType::kNvfp4:
      return "nvfp4";
    case StateDType::kF32:
      break;
  }
  return "f32";
}

FloorBytes FloorFor(const std::vector<WeightShape>& shapes, const StepOptions& options) {
  FloorBytes f;
  for (const WeightShape& s : shapes) {
    const uint64_t n = s.elements();  // a multiple of 16
    f.codes += n;                     // n / 2 read + n / 2 written
    f.scales += n / 8;                // n / 16 read + n / 16 written
    f.gradient += 2 * n;
    f.dequantized += 2 * n;
    if (options.error_feedback) f.residual += 8 * n;
    const uint64_t moments = options.optimizer == Optimizer::kAdamW ? 2  // m and v
                             : options.momentum > 0.0f                ? 1  // the momentum buffer
                                                                      : 0;
    switch (options.state_dtype) {  // each moment read + written
      case StateDType::kF32:
        f.optimizer_state += moments * 8 * n;
        break;
      case StateDType::kBf16:
        f.optimizer_state += moments * 4 * n;
        break;
      case StateDType::kNvfp4:
        f.optimizer_state += moments * 2 * (n / 2 + n / 16);
        break;
    }
  }
  return f;
}

double FloorBytesPerParameter(const std::vector<WeightShape>& shapes, const StepOptions& options) {
  const uint64_t n = ParameterCount(shapes);
  return n == 0 ? 0.0
                : static_cast<double>(FloorFor(shapes, options).total()) / static_cast<double>(n);
}

uint64_t EstimatedStateBytes(const std::vector<WeightShape>& shapes, const StepOptions& options) {
  uint64_t bytes = 0;
  for (const WeightShape& s : shapes) {
    const uint64_t n = s.elements();
    bytes += n / 2 + n / 16;
    if (options.error_feedback) bytes += 4 * n;
    const uint64_t moments = options.optimizer == Optimizer::kAdamW ? 2
                             : options.momentum > 0.0f                ? 1
                                                                      : 0;
    bytes += moments * (options.state_dtype == StateDType::kF32    ? 4 * n
                        : options.state_dtype == StateDType::kBf16 ? 2 * n
                                                                   : n / 2 + n / 16);
  }
  return bytes;
}

uint64_t OnePassCopyBytes(const std::vector<WeightShape>& shapes, const StepOptions& options) {
  uint64_t bytes = 0;
  for (const WeightShape& s : shapes) {
    const uint64_t n = s.elements();
    bytes += n / 2 + n / 16 + 8 + 32 + (options.error_feedback ? 4 * n : 0);
  }
  return bytes;
}

Layout PackBf16(const std::vector<WeightShape>& shapes, uint64_t align) {
  Layout l;
  uint64_t at = 0;
  for (const WeightShape& s : shapes) {
    at = (at + align - 1) / align * align;
    l.offsets.push_back(at);
    at += 2 * s.elements();
  }
  l.total_bytes = at;
  return l;
}

v1::CreateWeightRequest CreateRequest(const WeightShape& shape, size_t index,
                                      const StepOptions& options, const std::string& device_uuid) {
  v1::CreateWeightRequest req;
  req.set_name(shape.name);
  req.mutable_initial()->set_dtype(v1::DTYPE_BF16);
  req.mutable_initial()->add_shape(shape.rows);
  req.mutable_initial()->add_shape(shape.cols);
  v1::WeightOptions* o = req.mutable_options();
  o->set_block(v1::BLOCK_SHAPE_1X16);
  o->set_rounding(options.stochastic_rounding ? v1::ROUNDING_STOCHASTIC : v1::ROUNDING_NEAREST);
  o->set_seed(options.seed + index);
  o->set_error_feedback(options.error_feedback);
  o->set_dtype(v1::DTYPE_BF16);
  o->set_scaling(options.delayed_scaling ? v1::SCALING_DELAYED : v1::SCALING_CURRENT);
  v1::OptimizerSpec* spec = o->mutable_optimizer();
  if (options.optimizer == Optimizer::kAdamW) {
    spec->set_kind(v1::OPTIMIZER_KIND_ADAMW);
    spec->set_state_dtype(options.state_dtype == StateDType::kBf16    ? v1::STATE_DTYPE_BF16
                          : options.state_dtype == StateDType::kNvfp4 ? v1::STATE_DTYPE_NVFP4
                                                                      : v1::STATE_DTYPE_F32);
  } else {
    spec->set_kind(v1::OPTIMIZER_KIND_SGD);
    if (options.momentum > 0.0f) {
      spec->set_momentum(true);
      spec->set_state_dtype(options.state_dtype == StateDType::kBf16    ? v1::STATE_DTYPE_BF16
                            : options.state_dtype == StateDType::kNvfp4 ? v1::STATE_DTYPE_NVFP4
                                                                        : v1::STATE_DTYPE_F32);
    }
  }
  req.set_device_uuid(device_uuid);
  return req;
}

v1::StepRequest BuildStepRequest(const std::vector<WeightShape>& shapes, const Layout& layout,
                                 const v1::RegionSlice& grads, const v1::RegionSlice& params,
                                 const StepOptions& options) {
  v1::StepRequest req;
  v1::Hyperparameters* g = req.add_groups();
  g->set_lr(options.lr);
  if (options.optimizer == Optimizer::kAdamW) {
    v1::AdamWHyperparameters* a = g->mutable_adamw();
    a->set_beta1(0.9f);
    a->set_beta2(0.999f);
    a->set_eps(1e-8f);
    a->set_weight_decay(0.01f);
  } else {
    g->mutable_sgd()->set_momentum(options.momentum);  // no weight decay
  }
  req.set_kind(v1::UPDATE_KIND_GRADIENT);
  req.set_brief_reply(true);  // DQ(W) goes to regions: nothing to read per item (as fp4q.optim)
  for (size_t i = 0; i < shapes.size(); ++i) {
    v1::StepItem* it = req.add_items();
    it->set_name(shapes[i].name);
    v1::Tensor* u = it->mutable_update();
    u->set_dtype(v1::DTYPE_BF16);
    u->add_shape(shapes[i].rows);
    u->add_shape(shapes[i].cols);
    u->mutable_region()->set_region_id(grads.region_id());
    u->mutable_region()->set_offset(grads.offset() + layout.offsets[i]);
    v1::RegionSlice* out = it->mutable_dequantized_out()->mutable_region();
    out->set_region_id(params.region_id());
    out->set_offset(params.offset() + layout.offsets[i]);
    it->set_group(0);
  }
  return req;
}

SampleStats Describe(std::vector<double> samples) {
  SampleStats s;
  s.count = samples.size();
  if (samples.empty()) return s;
  std::sort(samples.begin(), samples.end());
  s.p50 = Rank(samples, 0.50);
  s.p90 = Rank(samples, 0.90);
  s.min = samples.front();
  s.max = samples.back();
  s.mean = std::accumulate(samples.begin(), samples.end(), 0.0) / static_cast<double>(s.count);
  return s;
}

double GigabytesPerSecond(uint64_t bytes, double micros) {
  return micros > 0 ? static_cast<double>(bytes) / micros / 1e3 : 0.0;
}

std::string ReportJson(const Report& r) {
  const uint64_t floor = r.floor.total();
  const bool stateful =
      r.options.optimizer == Optimizer::kAdamW || r.options.momentum > 0.0f;
  const double per_param =
      r.parameters == 0 ? 0.0 : static_cast<double>(floor) / static_cast<double>(r.parameters);
  const double wall_gbps = GigabytesPerSecond(floor, r.wall.p50);
  const double kernel_gbps = GigabytesPerSecond(floor, r.kernel.p50);
  std::string gpus;
  for (const auto& [uuid, name] : r.gpus) {
    absl::StrAppend(&gpus, gpus.empty() ? "" : ", ", "{\"uuid\": ", Quote(uuid),
                    ", \"name\": ", Quote(name), "}");
  }
  std::string out = absl::StrCat(
      "{\n  \"tool\": \"fp4q bench-step\",\n  \"server\": ", Quote(r.server),
      ",\n  \"transport\": ", Quote(r.transport), ",\n  \"spin_us\": ",
      r.spin_us.has_value() ? absl::StrCat(*r.spin_us) : std::string("\"auto\""),
      ",\n  \"replies_polled\": ", r.polled,
      ",\n  \"replies_polled_then_slept\": ", r.polled_then_slept,
      ",\n  \"replies_before_spin\": ", r.replied_before_spin,
      ",\n  \"gap_us\": ", r.gap_us, ",\n  \"heads_ups\": ", r.heads_ups,
      ",\n  \"step_plan\": ", r.plan ? "true" : "false",
      ",\n  \"one_pass\": ", r.one_pass ? "true" : "false",
      ",\n  \"backend\": ", Quote(r.backend), ",\n  \"server_version\": ", Quote(r.server_version),
      ",\n  \"gpus\": [", gpus, "],\n  \"device_uuid\": ", Quote(r.device_uuid),
      ",\n  \"host\": ", Quote(r.host), ",\n  \"cuda_runtime\": ", Quote(r.cuda_runtime),
      ",\n  \"model\": ", Quote(r.model), ",\n  \"layers\": ", r.layers,
      ",\n  \"weights\": ", r.weights, ",\n  \"parameters\": ", r.parameters,
      ",\n  \"optimizer\": \"", OptimizerName(r.options.optimizer),
      "\",\n  \"error_feedback\": ", r.options.error_feedback ? "true" : "false",
      ",\n  \"rounding\": \"", r.options.stochastic_rounding ? "sr" : "rtn",
      "\",\n  \"scaling\": \"", r.options.delayed_scaling ? "delayed" : "current",
      "\",\n  \"momentum\": ", absl::StrFormat("%g", r.options.momentum),
      ",\n  \"state_dtype\": \"", stateful ? StateDTypeName(r.options.state_dtype) : "none",
      "\",\n  \"lr\": ", absl::StrFormat("%g", r.options.lr), ",\n  \"init\": ", Quote(r.init),
      ",\n  \"align\": ", r.align, ",\n  \"iters\": ", r.iters, ",\n  \"warmup\": ", r.warmup,
      ",\n  \"setup_s\": ", absl::StrFormat("%.2f", r.setup_s),
      ",\n  \"floor\": {\"bytes_per_parameter\": ", absl::StrFormat("%.4f", per_param),
      ", \"bytes\": ", floor, ", \"codes\": ", r.floor.codes, ", \"scales\": ", r.floor.scales,
      ", \"gradient\": ", r.floor.gradient, ", \"dequantized\": ", r.floor.dequantized,
      ", \"residual\": ", r.floor.residual, ", \"optimizer_state\": ", r.floor.optimizer_state,
      "},\n  \"server_state_bytes\": ", r.state_bytes, ",\n  \"wall_us\": ", StatsJson(r.wall),
      ",\n  \"kernel_us\": ", StatsJson(r.kernel), ",\n  \"queue_us\": ", StatsJson(r.queue),
      ",\n  \"server_us\": ", StatsJson(r.server_time),
      ",\n  \"overhead_us\": ", StatsJson(r.overhead),
      ",\n  \"client_and_transport_us\": ", StatsJson(r.client_side),
      ",\n  \"achieved_gbps\": {\"wall_p50\": ", absl::StrFormat("%.1f", wall_gbps),
      ", \"kernel_p50\": ", absl::StrFormat("%.1f", kernel_gbps), "}");
  if (r.copy_bandwidth_gbps.has_value()) {
    const double copy = *r.copy_bandwidth_gbps;
    absl::StrAppend(&out, ",\n  \"copy_bandwidth_gbps\": ", absl::StrFormat("%.1f", copy),
                    ",\n  \"floor_us_at_copy_bandwidth\": ",
                    absl::StrFormat("%.1f", static_cast<double>(floor) / copy / 1e3),
                    ",\n  \"pct_of_copy_bandwidth\": {\"wall_p50\": ",
                    absl::StrFormat("%.1f", 100.0 * wall_gbps / copy),
                    ", \"kernel_p50\": ", absl::StrFormat("%.1f", 100.0 * kernel_gbps / copy), "}");
  }
  absl::StrAppend(&out, "\n}\n");
  return out;
}

}  // namespace fp4q::client::cli::bench_step
