#include "fp4q/examples/experiment.h"

#include <chrono>
#include <cmath>
#include <limits>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "fp4q/client/tensors.h"
#include "fp4q/common/status_macros.h"
#include "fp4q/examples/random.h"
#include "updaters.h"

namespace fp4q::examples {
namespace {

using client::Client;

std::string RunId() {
  std::random_device rd;
  const uint64_t id = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  return absl::StrFormat("%016x", id);
}

// The stochastic-rounding seed of tensor t: its own stream, so two tensors
// never share bits.
uint64_t TensorSeed(uint64_t seed, size_t t) {
  return StreamRng(seed, 100 + t).NextBits();
}

// Loss at the teacher's weights quantized with round-to-nearest (through the
// service).
absl::StatusOr<double> TargetRtnLoss(const Client& client,
                                     const Problem& problem) {
  Weights q;
  for (size_t t = 0; t < problem.tensors().size(); ++t) {
    const TensorSpec& spec = problem.tensors()[t];
    v1::QdqRequest req;
    FP4Q_ASSIGN_OR_RETURN(
        *req.mutable_input(),
        client::InlineTensorF32(problem.target()[t], {spec.rows, spec.cols}));
    req.mutable_options()->set_format(v1::FORMAT_NVFP4);
    req.mutable_options()->set_block(v1::BLOCK_SHAPE_1X16);
    req.mutable_options()->set_rounding(v1::ROUNDING_NEAREST);
    req.set_out_dtype(v1::DTYPE_F32);
    FP4Q_ASSIGN_OR_RETURN(v1::QdqReply reply, client.Qdq(req));
    FP4Q_ASSIGN_OR_RETURN(std::vector<float> w,
                          client::ResultToF32(reply.output()));
    FP4Q_RETURN_IF_ERROR(
        CheckResult(reply.output(), w, spec.rows, spec.cols, "Qdq"));
    q.push_back(std::move(w));
  }
  return problem.LossAndGradient(q, nullptr);
}

class VariantRun {
 public:
  VariantRun(const Client& client, Transport& transport, const Problem& problem,
             const ExperimentConfig& config, const std::string& run_id,
             Variant variant, ExperimentResult* result)
      : client_(client),
        transport_(transport),
        problem_(problem),
        config_(config),
        run_id_(run_id),
        variant_(variant),
        result_(result) {}

  // Runs the variant; its server state is deleted at the end, also after an
  // error.
  absl::StatusOr<VariantResult> Run() {
    absl::StatusOr<VariantResult> r = Train();
    for (auto& u : updaters_) {
      absl::Status s = u->Finish();
      if (r.ok() && !s.ok()) r = s;
    }
    return r;
  }

 private:
  absl::StatusOr<VariantResult> Train() {
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<TensorSpec>& specs = problem_.tensors();
    const float lr = static_cast<float>(config_.lr);
    VariantResult out;
    out.variant = variant_;
    Weights w(specs.size());
    std::vector<Nvfp4Grid> grids;
    std::vector<std::vector<uint8_t>> moved(specs.size());
    for (size_t t = 0; t < specs.size(); ++t) {
      UpdaterSpec us;
      us.variant = variant_;
      us.path = config_.path;
      us.name = absl::StrCat("fp4q-examples/", config_.example, "/", run_id_,
                             "/", VariantKey(variant_), "/", specs[t].name);
      us.tensor = specs[t];
      us.lr = lr;
      us.seed = TensorSeed(config_.seed, t);
      FP4Q_ASSIGN_OR_RETURN(std::unique_ptr<WeightUpdater> u,
                            MakeUpdater(client_, transport_, us));
      updaters_.push_back(std::move(u));
      FP4Q_ASSIGN_OR_RETURN(w[t], updaters_[t]->Start(problem_.initial()[t]));
      if (IsQuantized(variant_)) {
        FP4Q_ASSIGN_OR_RETURN(Nvfp4Grid g, Grid(t, w[t]));
        grids.push_back(std::move(g));
        moved[t].assign(static_cast<size_t>(specs[t].size()), 0);
      }
    }
    std::vector<std::vector<uint8_t>> start_codes;
    for (const Nvfp4Grid& g : grids) start_codes.push_back(g.codes());

    Weights grads;
    for (int64_t step = 0;; ++step) {
      const bool last = step == config_.steps;
      FP4Q_ASSIGN_OR_RETURN(const double loss, problem_.LossAndGradient(
                                                   w, last ? nullptr : &grads));
      if (!std::isfinite(loss)) {
        return absl::InternalError(absl::StrCat(
            VariantLabel(variant_), ": loss ", loss, " at step ", step));
      }
      out.losses.push_back(loss);
      if (last) break;
      if (variant_ == Variant::kRtn)
        CountBelowHalfStep(grids, grads, lr, step == 0);
      for (size_t t = 0; t < specs.size(); ++t) {
        FP4Q_ASSIGN_OR_RETURN(w[t], updaters_[t]->Apply(step + 1, grads[t]));
        if (!IsQuantized(variant_)) continue;
        FP4Q_ASSIGN_OR_RETURN(grids[t], Grid(t, w[t]));
        const std::vector<uint8_t>& codes = grids[t].codes();
        for (size_t i = 0; i < codes.size(); ++i) {
          if (CanonicalCode(codes[i]) != CanonicalCode(start_codes[t][i]))
            moved[t][i] = 1;
        }
      }
    }
    for (const auto& m : moved) {
      for (uint8_t b : m) out.moved += b;
      out.weights += static_cast<int64_t>(m.size());
    }
    out.seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
            .count();
    return out;
  }

  // The grid of tensor t, checked against the value the client holds (the RTN
  // run's grid also measures the update sizes, so its decode must reproduce the
  // weight).
  absl::StatusOr<Nvfp4Grid> Grid(size_t t, const std::vector<float>& value) {
    FP4Q_ASSIGN_OR_RETURN(Nvfp4Grid g, updaters_[t]->Grid());
    if (config_.path == UpdatePath::kStoredWeight ||
        variant_ == Variant::kRtn || variant_ == Variant::kRtnEf) {
      absl::Status s = g.CheckValues(value, updaters_[t]->GridTolerance());
      if (!s.ok()) {
        return absl::Status(
            s.code(),
            absl::StrCat(VariantLabel(variant_), " tensor '",
                         problem_.tensors()[t].name, "': ", s.message()));
      }
    }
    return g;
  }

  void CountBelowHalfStep(const std::vector<Nvfp4Grid>& grids,
                          const Weights& grads, float lr, bool first) {
    for (size_t t = 0; t < grids.size(); ++t) {
      int64_t below = 0;
      for (int64_t i = 0; i < grids[t].size(); ++i) {
        const float u = lr * grads[t][static_cast<size_t>(i)];
        if (grids[t].BelowHalfStep(i, -u)) ++below;
      }
      result_->below_all += below;
      result_->count_all += grids[t].size();
      if (first) {
        result_->below_first += below;
        result_->count_first += grids[t].size();
      }
    }
  }

  const Client& client_;
  Transport& transport_;
  const Problem& problem_;
  const ExperimentConfig& config_;
  const std::string& run_id_;
  const Variant variant_;
  ExperimentResult* result_;
  std::vector<std::unique_ptr<WeightUpdater>> updaters_;
};

}  // namespace

const char* VariantKey(Variant v) {
  switch (v) {
    case Variant::kFp32:
      return "fp32";
    case Variant::kRtn:
      return "rtn";
    case Variant::kSr:
      return "sr";
    case Variant::kRtnEf:
      return "rtn_ef";
    case Variant::kSrEf:
      return "sr_ef";
  }
  return "?";
}

const char* VariantLabel(Variant v) {
  switch (v) {
    case Variant::kFp32:
      return "fp32";
    case Variant::kRtn:
      return "RTN";
    case Variant::kSr:
      return "SR";
    case Variant::kRtnEf:
      return "RTN+EF";
    case Variant::kSrEf:
      return "SR+EF";
  }
  return "?";
}

bool IsQuantized(Variant v) { return v != Variant::kFp32; }
bool IsStochastic(Variant v) {
  return v == Variant::kSr || v == Variant::kSrEf;
}
bool HasErrorFeedback(Variant v) {
  return v == Variant::kRtnEf || v == Variant::kSrEf;
}

double VariantResult::moved_fraction() const {
  if (weights == 0) return std::numeric_limits<double>::quiet_NaN();
  return static_cast<double>(moved) / static_cast<double>(weights);
}

const VariantResult& ExperimentResult::Get(Variant v) const {
  for (const VariantResult& r : variants) {
    if (r.variant == v) return r;
  }
  static const VariantResult* const kEmpty = new VariantResult();
  return *kEmpty;
}

absl::StatusOr<ExperimentResult> RunExperiment(const Client& client,
                                               Transport& transport,
                                               const Problem& problem,
                                               const ExperimentConfig& config,
                                               std::ostream* progress) {
  if (config.steps < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("steps: ", config.steps, " < 1"));
  }
  if (!std::isfinite(config.lr) || !(config.lr > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("lr: ", config.lr, " is not > 0"));
  }
  ExperimentResult result;
  result.config = config;
  result.problem = problem.Describe();
  result.server = client.options().address;
  result.transport = TransportName(transport.kind());
  FP4Q_ASSIGN_OR_RETURN(const v1::ServerInfoReply info, client.ServerInfo());
  result.backend = info.backend();
  FP4Q_ASSIGN_OR_RETURN(result.target_rtn_loss, TargetRtnLoss(client, problem));
  const std::string run_id = RunId();
  for (Variant v : kAllVariants) {
    VariantRun run(client, transport, problem, config, run_id, v, &result);
    FP4Q_ASSIGN_OR_RETURN(VariantResult r, run.Run());
    if (progress != nullptr) {
      *progress << absl::StrFormat(
          "  %-7s %d steps in %.1f s: loss %.6g -> %.6g\n", VariantLabel(v),
          config.steps, r.seconds, r.start_loss(), r.final_loss());
      progress->flush();
    }
    result.variants.push_back(std::move(r));
  }
  return result;
}

}  // namespace fp4q::examples
