#include "fp4q/client/tensors.h"

#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "fp4q/common/status_macros.h"

namespace fp4q::client {

size_t DTypeSize(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_F32: return 4;
    case v1::DTYPE_BF16: return 2;
    case v1::DTYPE_U8:
    case v1::DTYPE_F8_E4M3:
    case v1::DTYPE_F8_E8M0: return 1;
    default: return 0;
  }
}

std::string DTypeName(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_F32: return "F32";
    case v1::DTYPE_BF16: return "BF16";
    case v1::DTYPE_U8: return "U8";
    case v1::DTYPE_F8_E4M3: return "F8_E4M3";
    case v1::DTYPE_F8_E8M0: return "F8_E8M0";
    case v1::DTYPE_UNSPECIFIED: return "DTYPE_UNSPECIFIED";
    default: return absl::StrCat("DType(", static_cast<int>(dtype), ")");
  }
}

std::string ShapeString(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::StatusOr<int64_t> NumElements(absl::Span<const int64_t> shape, absl::string_view what) {
  int64_t n = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    const int64_t d = shape[i];
    if (d < 0) {
      return absl::InvalidArgumentError(absl::StrCat(what, "[", i, "] = ", d, " is negative"));
    }
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / d) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " ", ShapeString(shape), " has more than 2^63-1 elements"));
    }
    n *= d;
  }
  return n;
}

absl::StatusOr<uint64_t> DenseBytes(v1::DType dtype, absl::Span<const int64_t> shape) {
  const size_t elem = DTypeSize(dtype);
  if (elem == 0) {
    return absl::InvalidArgumentError(absl::StrCat("dtype ", DTypeName(dtype), " has no size"));
  }
  FP4Q_ASSIGN_OR_RETURN(const int64_t n, NumElements(shape));
  const uint64_t un = static_cast<uint64_t>(n);
  if (un > std::numeric_limits<uint64_t>::max() / elem) {
    return absl::InvalidArgumentError(
        absl::StrCat("shape ", ShapeString(shape), " of ", DTypeName(dtype), " overflows"));
  }
  return un * elem;
}

absl::StatusOr<v1::Tensor> InlineTensor(v1::DType dtype, absl::Span<const int64_t> shape,
                                        absl::string_view bytes) {
  FP4Q_ASSIGN_OR_RETURN(const uint64_t need, DenseBytes(dtype, shape));
  if (bytes.size() != need) {
    return absl::InvalidArgumentError(absl::StrCat("inline_data has ", bytes.size(),
                                                   " bytes; dtype ", DTypeName(dtype),
                                                   " shape ", ShapeString(shape), " needs ",
                                                   need));
  }
  v1::Tensor t;
  t.set_dtype(dtype);
  for (int64_t d : shape) t.add_shape(d);
  t.set_inline_data(bytes.data(), bytes.size());
  return t;
}

absl::StatusOr<v1::Tensor> InlineTensorF32(absl::Span<const float> values,
                                           absl::Span<const int64_t> shape) {
  return InlineTensor(v1::DTYPE_F32, shape,
                      absl::string_view(reinterpret_cast<const char*>(values.data()),
                                        values.size() * sizeof(float)));
}

absl::StatusOr<v1::Tensor> InlineTensorBF16(absl::Span<const uint16_t> bits,
                                            absl::Span<const int64_t> shape) {
  return InlineTensor(v1::DTYPE_BF16, shape,
                      absl::string_view(reinterpret_cast<const char*>(bits.data()),
                                        bits.size() * sizeof(uint16_t)));
}

absl::StatusOr<v1::Tensor> RegionTensor(v1::DType dtype, absl::Span<const int64_t> shape,
                                        const v1::RegionSlice& slice) {
  FP4Q_RETURN_IF_ERROR(DenseBytes(dtype, shape).status());
  if (slice.region_id().empty()) {
    return absl::InvalidArgumentError("region.region_id is empty");
  }
  v1::Tensor t;
  t.set_dtype(dtype);
  for (int64_t d : shape) t.add_shape(d);
  *t.mutable_region() = slice;
  return t;
}

v1::OutputTarget RegionTarget(const v1::RegionSlice& slice) {
  v1::OutputTarget target;
  *target.mutable_region() = slice;
  return target;
}

absl::StatusOr<std::vector<float>> ResultToF32(const v1::TensorResult& result) {
  const std::vector<int64_t> shape(result.shape().begin(), result.shape().end());
  if (result.has_region() && result.inline_data().empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("result was written to region \"", result.region().region_id(),
                     "\" at offset ", result.region().offset(), "; it has no inline data"));
  }
  if (result.dtype() != v1::DTYPE_F32 && result.dtype() != v1::DTYPE_BF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("result dtype ", DTypeName(result.dtype()), " is not F32 or BF16"));
  }
  FP4Q_ASSIGN_OR_RETURN(const uint64_t need, DenseBytes(result.dtype(), shape));
  const std::string& data = result.inline_data();
  if (data.size() != need) {
    return absl::InvalidArgumentError(absl::StrCat(
        "result inline_data has ", data.size(), " bytes; dtype ", DTypeName(result.dtype()),
        " shape ", ShapeString(shape), " needs ", need));
  }
  if (result.dtype() == v1::DTYPE_F32) return BytesToF32(data);
  std::vector<float> out(data.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) {
    uint16_t bits;
    std::memcpy(&bits, data.data() + 2 * i, 2);
    out[i] = Bf16ToF32(bits);
  }
  return out;
}

float Bf16ToF32(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

float F16ToF32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  uint32_t u;
  if (exp == 0x1F) {
    u = sign | 0x7F800000u | (mant << 13);  // Inf / NaN (payload kept)
  } else if (exp != 0) {
    u = sign | ((exp + 112) << 23) | (mant << 13);  // rebias 15 -> 127
  } else if (mant == 0) {
    u = sign;  // +-0
  } else {
    // Subnormal: value = mant * 2^-24; normalise.
    int e = -1;
    do {
      mant <<= 1;
      ++e;
    } while ((mant & 0x400u) == 0);
    mant &= 0x3FFu;
    u = sign | (static_cast<uint32_t>(112 - e) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t F32ToBf16(float value) {
  uint32_t u;
  std::memcpy(&u, &value, 4);
  if ((u & 0x7F800000u) == 0x7F800000u && (u & 0x007FFFFFu) != 0) {
    return static_cast<uint16_t>((u >> 16) | 0x0040u);  // quiet NaN, sign kept
  }
  const uint32_t lsb = (u >> 16) & 1u;
  u += 0x7FFFu + lsb;
  return static_cast<uint16_t>(u >> 16);
}

std::string F32Bytes(absl::Span<const float> values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * 4);
}

std::vector<float> BytesToF32(absl::string_view bytes) {
  std::vector<float> out(bytes.size() / 4);
  if (!out.empty()) std::memcpy(out.data(), bytes.data(), out.size() * 4);
  return out;
}

}  // namespace fp4q::client
