#include "updaters.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "fp4q/client/tensors.h"
#include "fp4q/common/status_macros.h"

namespace fp4q::examples {
namespace {

using client::Client;

std::vector<int64_t> ShapeOf(const TensorSpec& t) { return {t.rows, t.cols}; }

absl::Status CheckSize(absl::Span<const float> values, const TensorSpec& t,
                       const char* what) {
  if (static_cast<int64_t>(values.size()) != t.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " of '", t.name, "': ", values.size(),
                     " values, expected ", t.size()));
  }
  return absl::OkStatus();
}

v1::Rounding RoundingOf(Variant v) {
  return IsStochastic(v) ? v1::ROUNDING_STOCHASTIC : v1::ROUNDING_NEAREST;
}

class Fp32Updater : public WeightUpdater {
 public:
  explicit Fp32Updater(const UpdaterSpec& spec) : spec_(spec) {}
  absl::StatusOr<std::vector<float>> Start(
      absl::Span<const float> initial) override {
    FP4Q_RETURN_IF_ERROR(CheckSize(initial, spec_.tensor, "initial"));
    w_.assign(initial.begin(), initial.end());
    return w_;
  }
  absl::StatusOr<std::vector<float>> Apply(
      int64_t /*step*/, absl::Span<const float> gradient) override {
    FP4Q_RETURN_IF_ERROR(CheckSize(gradient, spec_.tensor, "gradient"));
    w_ = Fp32Step(w_, gradient, spec_.lr);
    return w_;
  }
  absl::StatusOr<Nvfp4Grid> Grid() override {
    return absl::FailedPreconditionError("the fp32 variant has no 4-bit grid");
  }
  double GridTolerance() const override { return 0; }
  absl::Status Finish() override { return absl::OkStatus(); }

 private:
  UpdaterSpec spec_;
  std::vector<float> w_;
};

// CreateWeight / UpdateWeight / GetWeight(quantized) / DeleteWeight.
class StoredWeightUpdater : public WeightUpdater {
 public:
  StoredWeightUpdater(const Client& client, Transport& transport,
                      const UpdaterSpec& spec)
      : client_(client), transport_(transport), spec_(spec) {}
  ~StoredWeightUpdater() override { (void)Finish(); }

  absl::StatusOr<std::vector<float>> Start(
      absl::Span<const float> initial) override {
    v1::CreateWeightRequest create;
    create.set_name(spec_.name);
    FP4Q_ASSIGN_OR_RETURN(
        *create.mutable_initial(),
        client::InlineTensorF32(initial, ShapeOf(spec_.tensor)));
    v1::WeightOptions* o = create.mutable_options();
    o->set_block(v1::BLOCK_SHAPE_1X16);
    o->set_rounding(RoundingOf(spec_.variant));
    o->set_seed(spec_.seed);
    o->set_error_feedback(HasErrorFeedback(spec_.variant));
    o->set_dtype(v1::DTYPE_F32);
    create.set_step(0);
    FP4Q_RETURN_IF_ERROR(client_.CreateWeight(create).status());
    created_ = true;
    v1::GetWeightRequest get;
    get.set_name(spec_.name);
    get.set_dequantized(true);
    get.set_out_dtype(v1::DTYPE_F32);
    FP4Q_ASSIGN_OR_RETURN(v1::GetWeightReply reply, client_.GetWeight(get));
    FP4Q_ASSIGN_OR_RETURN(std::vector<float> w,
                          client::ResultToF32(reply.dequantized()));
    FP4Q_RETURN_IF_ERROR(CheckResult(reply.dequantized(), w, spec_.tensor.rows,
                                     spec_.tensor.cols, "GetWeight"));
    return w;
  }

  absl::StatusOr<std::vector<float>> Apply(
      int64_t step, absl::Span<const float> gradient) override {
    return transport_.UpdateWeight(spec_.name, step, spec_.lr, gradient,
                                   spec_.tensor.rows, spec_.tensor.cols);
  }

  absl::StatusOr<Nvfp4Grid> Grid() override {
    v1::GetWeightRequest get;
    get.set_name(spec_.name);
    get.set_quantized(true);
    FP4Q_ASSIGN_OR_RETURN(v1::GetWeightReply reply, client_.GetWeight(get));
    return Nvfp4Grid::FromProto(reply.quantized(), spec_.tensor.rows,
                                spec_.tensor.cols);
  }
  double GridTolerance() const override { return 0; }

  absl::Status Finish() override {
    if (!created_) return absl::OkStatus();
    created_ = false;
    v1::DeleteWeightRequest del;
    del.set_name(spec_.name);
    return client_.DeleteWeight(del).status();
  }

 private:
  const Client& client_;
  Transport& transport_;
  UpdaterSpec spec_;
  bool created_ = false;
};

// The client holds W; W <- Qdq(W - lr * g) with the residual key for error
// feedback.
class QdqUpdater : public WeightUpdater {
 public:
  QdqUpdater(const Client& client, Transport& transport,
             const UpdaterSpec& spec)
      : client_(client), transport_(transport), spec_(spec) {}
  ~QdqUpdater() override { (void)Finish(); }

  absl::StatusOr<std::vector<float>> Start(
      absl::Span<const float> initial) override {
    return Qdq(initial, 0);
  }

  absl::StatusOr<std::vector<float>> Apply(
      int64_t step, absl::Span<const float> gradient) override {
    FP4Q_RETURN_IF_ERROR(CheckSize(gradient, spec_.tensor, "gradient"));
    return Qdq(Fp32Step(w_, gradient, spec_.lr), step);
  }

  absl::StatusOr<Nvfp4Grid> Grid() override {
    v1::QuantizeRequest req;
    FP4Q_ASSIGN_OR_RETURN(*req.mutable_input(),
                          client::InlineTensorF32(w_, ShapeOf(spec_.tensor)));
    v1::QuantOptions* o = req.mutable_options();
    o->set_format(v1::FORMAT_NVFP4);
    o->set_block(v1::BLOCK_SHAPE_1X16);
    o->set_rounding(v1::ROUNDING_NEAREST);
    o->set_outputs(v1::OUTPUTS_ROWWISE);
    FP4Q_ASSIGN_OR_RETURN(v1::QuantizeReply reply, client_.Quantize(req));
    return Nvfp4Grid::FromProto(reply.rowwise(), spec_.tensor.rows,
                                spec_.tensor.cols);
  }
  // Quantize(W) recomputes the global scale from W's largest element, whose
  // dequantized value may differ from the original amax in its last bits: codes
  // agree, values within a few ulps.
  double GridTolerance() const override { return 1e-6; }

  absl::Status Finish() override {
    if (!residual_created_) return absl::OkStatus();
    residual_created_ = false;
    v1::DeleteWeightRequest del;
    del.set_name(spec_.name);
    return client_.DeleteWeight(del).status();
  }

 private:
  absl::StatusOr<std::vector<float>> Qdq(absl::Span<const float> x,
                                         int64_t step) {
    v1::QuantOptions o;
    o.set_format(v1::FORMAT_NVFP4);
    o.set_block(v1::BLOCK_SHAPE_1X16);
    o.set_rounding(RoundingOf(spec_.variant));
    o.set_seed(spec_.seed);
    o.set_step(static_cast<uint64_t>(step));
    o.set_outputs(v1::OUTPUTS_ROWWISE);
    if (HasErrorFeedback(spec_.variant)) o.set_residual_key(spec_.name);
    FP4Q_ASSIGN_OR_RETURN(
        w_, transport_.Qdq(x, spec_.tensor.rows, spec_.tensor.cols, o));
    if (HasErrorFeedback(spec_.variant)) residual_created_ = true;
    return w_;
  }

  const Client& client_;
  Transport& transport_;
  UpdaterSpec spec_;
  std::vector<float> w_;
  bool residual_created_ = false;
};

}  // namespace

std::vector<float> Fp32Step(absl::Span<const float> w,
                            absl::Span<const float> gradient, float lr) {
  std::vector<float> out(std::min(w.size(), gradient.size()));
  for (size_t i = 0; i < out.size(); ++i) {
    const float u = lr * gradient[i];
    out[i] = w[i] - u;
  }
  return out;
}

absl::StatusOr<std::unique_ptr<WeightUpdater>> MakeUpdater(
    const Client& client, Transport& transport, const UpdaterSpec& spec) {
  if (spec.tensor.rows < 1 || spec.tensor.cols < 16 ||
      spec.tensor.cols % 16 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", spec.tensor.name, "': shape [", spec.tensor.rows, ", ",
        spec.tensor.cols, "] is not [>= 1, a multiple of 16]"));
  }
  if (!IsQuantized(spec.variant))
    return std::unique_ptr<WeightUpdater>(new Fp32Updater(spec));
  if (spec.path == UpdatePath::kQdq) {
    return std::unique_ptr<WeightUpdater>(
        new QdqUpdater(client, transport, spec));
  }
  return std::unique_ptr<WeightUpdater>(
      new StoredWeightUpdater(client, transport, spec));
}

}  // namespace fp4q::examples
