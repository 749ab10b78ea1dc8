#include "server/optimizer_state.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "fp4q/common/status_macros.h"

namespace fp4q::server {
namespace {

const char* DTypeLabel(kernels::StateDType d) {
  switch (d) {
    case kernels::StateDType::kF32:
      return "F32";
    case kernels::StateDType::kBF16:
      return "BF16";
    case kernels::StateDType::kNvfp4:
      return "NVFP4";
  }
  return "?";
}

}  // namespace

std::string OptimizerSpec::ToString() const {
  if (kind == kernels::OptimizerKind::kAdamW) {
    return absl::StrCat("AdamW", amsgrad ? " with amsgrad" : "", " (", DTypeLabel(dtype),
                        " moments)");
  }
  if (!momentum) return "SGD";
  return absl::StrCat("SGD with momentum (", DTypeLabel(dtype), " buffer)");
}

const char* MomentName(const OptimizerSpec& spec, int i) {
  if (spec.kind != kernels::OptimizerKind::kAdamW) return "momentum_buffer";
  static const char* const kNames[] = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
  return kNames[i];
}

absl::StatusOr<uint64_t> OptimizerStorage::BytesFor(const OptimizerSpec& spec, int64_t rows,
                                                    int64_t cols) {
  uint64_t per = 0;
  switch (spec.dtype) {
    case kernels::StateDType::kF32: {
      FP4Q_ASSIGN_OR_RETURN(per, kernels::DenseBytes(rows, cols, kernels::DType::kF32, "shape"));
      break;
    }
    case kernels::StateDType::kBF16: {
      FP4Q_ASSIGN_OR_RETURN(per, kernels::DenseBytes(rows, cols, kernels::DType::kBF16, "shape"));
      break;
    }
    case kernels::StateDType::kNvfp4: {
      FP4Q_ASSIGN_OR_RETURN(const size_t codes, kernels::CodeBytes(rows, cols, "shape"));
      FP4Q_ASSIGN_OR_RETURN(const size_t scales,
                            kernels::ScaleBytes(rows, cols, kernels::Format::kNvfp4,
                                                kernels::ScaleLayout::kPlain, "shape"));
      per = codes + scales + kernels::kGlobalFloats * sizeof(float);
      break;
    }
  }
  return per * static_cast<uint64_t>(spec.moments());
}

absl::StatusOr<OptimizerStorage> OptimizerStorage::Create(kernels::Backend* backend,
                                                          kernels::Stream stream,
                                                          const OptimizerSpec& spec, int64_t rows,
                                                          int64_t cols) {
  OptimizerStorage s;
  s.spec_ = spec;
  s.rows_ = rows;
  s.cols_ = cols;
  FP4Q_ASSIGN_OR_RETURN(s.bytes_, BytesFor(spec, rows, cols));
  for (int i = 0; i < spec.moments(); ++i) {
    Moment m;
    if (spec.dtype == kernels::StateDType::kNvfp4) {
      FP4Q_ASSIGN_OR_RETURN(const size_t codes, kernels::CodeBytes(rows, cols, "shape"));
      FP4Q_ASSIGN_OR_RETURN(const size_t scales,
                            kernels::ScaleBytes(rows, cols, kernels::Format::kNvfp4,
                                                kernels::ScaleLayout::kPlain, "shape"));
      FP4Q_ASSIGN_OR_RETURN(m.codes, DeviceBuffer::Allocate(backend, codes));
      FP4Q_ASSIGN_OR_RETURN(m.scales, DeviceBuffer::Allocate(backend, scales));
      FP4Q_ASSIGN_OR_RETURN(m.global,
                            DeviceBuffer::Allocate(backend, kernels::kGlobalFloats * sizeof(float)));
      FP4Q_RETURN_IF_ERROR(backend->Memset(m.codes.data(), 0, codes, stream));
      FP4Q_RETURN_IF_ERROR(backend->Memset(m.scales.data(), 0, scales, stream));
      // A zeroed NVFP4 tensor: record [amax 0, S_enc 1] (NUMERICS G2 for amax 0).
      const float record[kernels::kGlobalFloats] = {0.0f, 1.0f};
      FP4Q_RETURN_IF_ERROR(backend->CopyFromHost(m.global.data(), record, sizeof(record), stream));
    } else {
      const kernels::DType d = spec.dtype == kernels::StateDType::kF32 ? kernels::DType::kF32
                                                                        : kernels::DType::kBF16;
      FP4Q_ASSIGN_OR_RETURN(const size_t bytes, kernels::DenseBytes(rows, cols, d, "shape"));
      FP4Q_ASSIGN_OR_RETURN(m.dense, DeviceBuffer::Allocate(backend, bytes));
      FP4Q_RETURN_IF_ERROR(backend->Memset(m.dense.data(), 0, bytes, stream));
    }
    s.moments_.push_back(std::move(m));
  }
  FP4Q_RETURN_IF_ERROR(backend->Synchronize(stream));
  return s;
}

kernels::QuantizedTensor OptimizerStorage::QuantizedView(int i) const {
  const Moment& m = moments_[static_cast<size_t>(i)];
  kernels::QuantizedTensor q;
  q.format = kernels::Format::kNvfp4;
  q.block = kernels::BlockShape::k1x16;
  q.scale_layout = kernels::ScaleLayout::kPlain;
  q.rows = rows_;
  q.cols = cols_;
  q.codes = m.codes.as<uint8_t>();
  q.codes_capacity = m.codes.size();
  q.scales = m.scales.as<uint8_t>();
  q.scales_capacity = m.scales.size();
  q.global = m.global.as<float>();
  return q;
}

kernels::OptimizerState OptimizerStorage::View() const {
  kernels::OptimizerState v;
  v.kind = spec_.kind;
  v.dtype = spec_.dtype;
  v.momentum = spec_.momentum;
  v.amsgrad = spec_.amsgrad;
  kernels::MomentTensor* out[3] = {&v.moment1, &v.moment2, &v.max_moment2};
  for (size_t i = 0; i < moments_.size(); ++i) {
    if (spec_.dtype == kernels::StateDType::kNvfp4) {
      out[i]->quantized = QuantizedView(static_cast<int>(i));
    } else {
      out[i]->dense = moments_[i].dense.data();
    }
  }
  return v;
}

}  // namespace fp4q::server
