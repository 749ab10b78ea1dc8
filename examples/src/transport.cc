#include "fp4q/examples/transport.h"

#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "fp4q/client/session.h"
#include "fp4q/client/tensors.h"
#include "fp4q/common/status_macros.h"

namespace fp4q::examples {
namespace {

using client::Client;

v1::UpdateWeightRequest UpdateRequest(const std::string& name, int64_t step,
                                      float lr) {
  v1::UpdateWeightRequest req;
  req.set_name(name);
  req.set_step(step);
  req.set_lr(lr);
  req.set_kind(v1::UPDATE_KIND_GRADIENT);
  return req;
}

// The reply of an UpdateWeight that must have applied `step` now.
absl::Status CheckApplied(const client::UpdateWeightResult& result,
                          const std::string& name, int64_t step) {
  if (result.outcome == client::UpdateOutcome::kAlreadyApplied) {
    return absl::FailedPreconditionError(
        absl::StrCat("UpdateWeight: step ", step, " of weight '", name,
                     "' had already been applied before this run (is another "
                     "client using the name?)"));
  }
  if (result.reply.last_step() != step) {
    return absl::InternalError(absl::StrCat("UpdateWeight: reply last_step ",
                                            result.reply.last_step(),
                                            " is not step ", step));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int64_t>> Shape2(int64_t rows, int64_t cols) {
  if (rows < 1 || cols < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shape [", rows, ", ", cols, "]: dimensions must be >= 1"));
  }
  return std::vector<int64_t>{rows, cols};
}

absl::Status CheckCount(absl::Span<const float> values, int64_t rows,
                        int64_t cols, const char* what) {
  if (static_cast<int64_t>(values.size()) != rows * cols) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", values.size(),
                                                   " values for shape [", rows,
                                                   ", ", cols, "]"));
  }
  return absl::OkStatus();
}

class InlineTransport : public Transport {
 public:
  explicit InlineTransport(const Client& client) : client_(client) {}
  TransportKind kind() const override { return TransportKind::kInline; }

  absl::StatusOr<std::vector<float>> UpdateWeight(
      const std::string& name, int64_t step, float lr,
      absl::Span<const float> gradient, int64_t rows, int64_t cols) override {
    FP4Q_ASSIGN_OR_RETURN(const std::vector<int64_t> shape, Shape2(rows, cols));
    FP4Q_RETURN_IF_ERROR(CheckCount(gradient, rows, cols, "gradient"));
    v1::UpdateWeightRequest req = UpdateRequest(name, step, lr);
    FP4Q_ASSIGN_OR_RETURN(*req.mutable_update(),
                          client::InlineTensorF32(gradient, shape));
    req.set_return_dequantized(true);
    FP4Q_ASSIGN_OR_RETURN(client::UpdateWeightResult result,
                          client_.UpdateWeight(req));
    FP4Q_RETURN_IF_ERROR(CheckApplied(result, name, step));
    FP4Q_ASSIGN_OR_RETURN(std::vector<float> dq,
                          client::ResultToF32(result.reply.dequantized()));
    FP4Q_RETURN_IF_ERROR(
        CheckResult(result.reply.dequantized(), dq, rows, cols, "dequantized"));
    return dq;
  }

  absl::StatusOr<std::vector<float>> Qdq(
      absl::Span<const float> x, int64_t rows, int64_t cols,
      const v1::QuantOptions& options) override {
    FP4Q_ASSIGN_OR_RETURN(const std::vector<int64_t> shape, Shape2(rows, cols));
    FP4Q_RETURN_IF_ERROR(CheckCount(x, rows, cols, "x"));
    v1::QdqRequest req;
    FP4Q_ASSIGN_OR_RETURN(*req.mutable_input(),
                          client::InlineTensorF32(x, shape));
    *req.mutable_options() = options;
    req.set_out_dtype(v1::DTYPE_F32);
    FP4Q_ASSIGN_OR_RETURN(v1::QdqReply reply, client_.Qdq(req));
    FP4Q_ASSIGN_OR_RETURN(std::vector<float> out,
                          client::ResultToF32(reply.output()));
    FP4Q_RETURN_IF_ERROR(
        CheckResult(reply.output(), out, rows, cols, "output"));
    return out;
  }

 private:
  const Client& client_;
};

class CudaIpcTransport : public Transport {
 public:
  CudaIpcTransport(const Client& client, std::unique_ptr<CudaRuntime> cuda,
                   std::unique_ptr<client::Session> session,
                   DeviceBuffer buffer, uint64_t out_offset)
      : client_(client),
        cuda_(std::move(cuda)),
        session_(std::move(session)),
        buffer_(std::move(buffer)),
        out_offset_(out_offset) {}

  ~CudaIpcTransport() override {
    // Unregister before the memory is freed (best effort), then end the
    // session.
    if (session_ != nullptr) {
      (void)session_->ReleaseAllocation(buffer_.data());
      (void)session_->Close();
    }
  }

  TransportKind kind() const override { return TransportKind::kCudaIpc; }

  absl::StatusOr<std::vector<float>> UpdateWeight(
      const std::string& name, int64_t step, float lr,
      absl::Span<const float> gradient, int64_t rows, int64_t cols) override {
    FP4Q_ASSIGN_OR_RETURN(const std::vector<int64_t> shape, Shape2(rows, cols));
    FP4Q_RETURN_IF_ERROR(CheckCount(gradient, rows, cols, "gradient"));
    FP4Q_ASSIGN_OR_RETURN(Slices slices, Stage(gradient));
    v1::UpdateWeightRequest req = UpdateRequest(name, step, lr);
    FP4Q_ASSIGN_OR_RETURN(
        *req.mutable_update(),
        client::RegionTensor(v1::DTYPE_F32, shape, slices.in));
    *req.mutable_dequantized_out() = client::RegionTarget(slices.out);
    FP4Q_ASSIGN_OR_RETURN(client::UpdateWeightResult result,
                          client_.UpdateWeight(req, session_->call_options()));
    FP4Q_RETURN_IF_ERROR(CheckApplied(result, name, step));
    FP4Q_ASSIGN_OR_RETURN(std::vector<float> dq, Fetch(gradient.size()));
    FP4Q_RETURN_IF_ERROR(
        CheckResult(result.reply.dequantized(), dq, rows, cols, "dequantized"));
    return dq;
  }

  absl::StatusOr<std::vector<float>> Qdq(
      absl::Span<const float> x, int64_t rows, int64_t cols,
      const v1::QuantOptions& options) override {
    FP4Q_ASSIGN_OR_RETURN(const std::vector<int64_t> shape, Shape2(rows, cols));
    FP4Q_RETURN_IF_ERROR(CheckCount(x, rows, cols, "x"));
    FP4Q_ASSIGN_OR_RETURN(Slices slices, Stage(x));
    v1::QdqRequest req;
    FP4Q_ASSIGN_OR_RETURN(
        *req.mutable_input(),
        client::RegionTensor(v1::DTYPE_F32, shape, slices.in));
    *req.mutable_options() = options;
    req.set_out_dtype(v1::DTYPE_F32);
    *req.mutable_out() = client::RegionTarget(slices.out);
    FP4Q_ASSIGN_OR_RETURN(v1::QdqReply reply,
                          client_.Qdq(req, session_->call_options()));
    FP4Q_ASSIGN_OR_RETURN(std::vector<float> out, Fetch(x.size()));
    FP4Q_RETURN_IF_ERROR(
        CheckResult(reply.output(), out, rows, cols, "output"));
    return out;
  }

 private:
  struct Slices {
    v1::RegionSlice in;
    v1::RegionSlice out;
  };

  // Copies `values` to the input slice, poisons the output slice, and names
  // both.
  absl::StatusOr<Slices> Stage(absl::Span<const float> values) {
    const uint64_t bytes = values.size() * sizeof(float);
    if (bytes > out_offset_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor of ", values.size(), " elements exceeds the transport's ",
          out_offset_ / sizeof(float)));
    }
    FP4Q_RETURN_IF_ERROR(cuda_->CopyToDevice(buffer_, 0, values.data(), bytes));
    FP4Q_RETURN_IF_ERROR(cuda_->Fill(buffer_, out_offset_, 0xFF, bytes));
    Slices s;
    char* base = static_cast<char*>(buffer_.data());
    FP4Q_ASSIGN_OR_RETURN(s.in, session_->RegionFor(base, bytes));
    FP4Q_ASSIGN_OR_RETURN(s.out,
                          session_->RegionFor(base + out_offset_, bytes));
    return s;
  }

  absl::StatusOr<std::vector<float>> Fetch(size_t count) {
    std::vector<float> out(count);
    FP4Q_RETURN_IF_ERROR(cuda_->CopyToHost(out.data(), buffer_, out_offset_,
                                           count * sizeof(float)));
    return out;
  }

  const Client& client_;
  std::unique_ptr<CudaRuntime> cuda_;
  std::unique_ptr<client::Session> session_;
  DeviceBuffer buffer_;
  const uint64_t out_offset_;
};

}  // namespace

absl::Status CheckResult(const v1::TensorResult& result,
                         absl::Span<const float> values, int64_t rows,
                         int64_t cols, const char* what) {
  if (result.dtype() != v1::DTYPE_F32) {
    return absl::InternalError(absl::StrCat(
        what, ": dtype ", client::DTypeName(result.dtype()), ", expected F32"));
  }
  if (result.shape_size() != 2 || result.shape(0) != rows ||
      result.shape(1) != cols) {
    return absl::InternalError(
        absl::StrCat(what, ": shape ",
                     client::ShapeString(std::vector<int64_t>(
                         result.shape().begin(), result.shape().end())),
                     ", expected [", rows, ", ", cols, "]"));
  }
  if (static_cast<int64_t>(values.size()) != rows * cols) {
    return absl::InternalError(absl::StrCat(what, ": ", values.size(),
                                            " values, expected ", rows * cols));
  }
  for (size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i])) {
      return absl::InternalError(
          absl::StrCat(what, ": element ", i, " is ", values[i],
                       " (the output was not written?)"));
    }
  }
  return absl::OkStatus();
}

std::unique_ptr<Transport> MakeInlineTransport(const Client& client) {
  return std::make_unique<InlineTransport>(client);
}

absl::StatusOr<std::unique_ptr<Transport>> MakeCudaIpcTransport(
    const Client& client, std::unique_ptr<CudaRuntime> cuda,
    int64_t max_elements) {
  if (cuda == nullptr) return absl::InvalidArgumentError("cuda: null runtime");
  if (max_elements < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_elements: ", max_elements, " < 1"));
  }
  // Input at offset 0, output at the next multiple of 256 bytes.
  const uint64_t half =
      (static_cast<uint64_t>(max_elements) * sizeof(float) + 255) / 256 * 256;
  FP4Q_ASSIGN_OR_RETURN(DeviceBuffer buffer, cuda->Allocate(2 * half));
  client::SessionOptions so;
  so.client_name = "fp4q-examples";
  FP4Q_ASSIGN_OR_RETURN(std::unique_ptr<client::Session> session,
                        client::Session::Open(client, so));
  return std::unique_ptr<Transport>(new CudaIpcTransport(
      client, std::move(cuda), std::move(session), std::move(buffer), half));
}

}  // namespace fp4q::examples
