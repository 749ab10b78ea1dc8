#include "fp4q/examples/nvfp4_grid.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace fp4q::examples {
namespace {

// E2M1 magnitudes of codes 0..7.
constexpr float kE2m1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

bool SameValue(float a, float b, double rel_tol) {
  if (rel_tol == 0.0) return a == b;  // -0 == +0
  return std::fabs(static_cast<double>(a) - b) <=
         rel_tol * std::fabs(static_cast<double>(b));
}

}  // namespace

float E4m3ToFloat(uint8_t byte) {
  if ((byte & 0x7F) == 0x7F) return std::numeric_limits<float>::quiet_NaN();
  const int exp = (byte >> 3) & 0xF;
  const int man = byte & 0x7;
  // Exact in f32: at most 4 significant bits, exponents -9..8.
  const float mag = exp == 0
                        ? std::ldexp(static_cast<float>(man), -9)
                        : std::ldexp(static_cast<float>(8 + man), exp - 10);
  return (byte & 0x80) ? -mag : mag;
}

float E2m1ToFloat(uint8_t code) {
  const float mag = kE2m1[code & 7];
  return (code & 8) ? -mag : mag;
}

absl::StatusOr<Nvfp4Grid> Nvfp4Grid::FromProto(const v1::QuantizedTensor& q,
                                               int64_t rows, int64_t cols) {
  if (rows < 1 || cols < 16 || cols % 16 != 0 ||
      rows > (int64_t{1} << 30) / cols) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected shape [", rows, ", ", cols,
                     "]: rows >= 1, cols a positive multiple of 16"));
  }
  if (q.format() != v1::FORMAT_NVFP4 && q.format() != v1::FORMAT_UNSPECIFIED) {
    return absl::InvalidArgumentError(absl::StrCat(
        "quantized.format: ", v1::Format_Name(q.format()), " is not NVFP4"));
  }
  if (q.scale_layout() != v1::SCALE_LAYOUT_PLAIN &&
      q.scale_layout() != v1::SCALE_LAYOUT_UNSPECIFIED) {
    return absl::InvalidArgumentError(absl::StrCat(
        "quantized.scale_layout: ", v1::ScaleLayout_Name(q.scale_layout()),
        " is not PLAIN"));
  }
  if (q.shape_size() != 2 || q.shape(0) != rows || q.shape(1) != cols) {
    std::string got = "[";
    for (int i = 0; i < q.shape_size(); ++i)
      absl::StrAppend(&got, i ? ", " : "", q.shape(i));
    return absl::InvalidArgumentError(absl::StrCat(
        "quantized.shape: ", got, "] is not [", rows, ", ", cols, "]"));
  }
  if (q.codes_data_case() != v1::QuantizedTensor::kCodes ||
      q.scales_data_case() != v1::QuantizedTensor::kScales) {
    return absl::InvalidArgumentError(
        "quantized: codes and scales must be inline");
  }
  const size_t n = static_cast<size_t>(rows * cols);
  if (q.codes().size() != n / 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "quantized.codes: ", q.codes().size(), " bytes; expected ", n / 2));
  }
  if (q.scales().size() != n / 16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "quantized.scales: ", q.scales().size(), " bytes; expected ", n / 16));
  }
  if (!std::isfinite(q.s_enc()) || !(q.s_enc() > 0)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "quantized.s_enc: %g is not a finite number > 0", q.s_enc()));
  }
  Nvfp4Grid g;
  g.rows_ = rows;
  g.cols_ = cols;
  g.s_dec_ = 1.0f / q.s_enc();
  g.codes_.resize(n);
  for (size_t j = 0; j < n / 2; ++j) {
    const uint8_t b = static_cast<uint8_t>(q.codes()[j]);
    g.codes_[2 * j] = b & 0xF;
    g.codes_[2 * j + 1] = b >> 4;
  }
  g.scales_.resize(n / 16);
  for (size_t b = 0; b < n / 16; ++b) {
    const uint8_t byte = static_cast<uint8_t>(q.scales()[b]);
    const float sf = E4m3ToFloat(byte);
    if (std::isnan(sf) || sf < 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "quantized.scales[%d]: byte 0x%02x is not a non-negative E4M3 scale",
          b, byte));
    }
    g.scales_[b] = sf;
  }
  return g;
}

float Nvfp4Grid::Value(int64_t i) const {
  const float sf = scales_[static_cast<size_t>(i / 16)];
  const float t = E2m1ToFloat(code(i)) * sf;  // exact
  return t * s_dec_;
}

bool Nvfp4Grid::BelowHalfStep(int64_t i, float delta) const {
  if (delta == 0.0f) return true;
  const uint8_t c = code(i);
  const int m = c & 7;
  const bool negative = (c & 8) != 0 && m != 0;
  // Outward: the update increases the magnitude (zero moves outward either
  // way).
  const bool outward = m == 0 || (delta > 0) != negative;
  double gap;  // distance to the neighbour in units of the block's scale
  if (outward) {
    if (m == 7) return true;
    gap = kE2m1[m + 1] - kE2m1[m];
  } else {
    gap = kE2m1[m] - kE2m1[m - 1];
  }
  const double unit =
      static_cast<double>(scales_[static_cast<size_t>(i / 16)]) * s_dec_;
  return std::fabs(static_cast<double>(delta)) < 0.5 * gap * unit;
}

absl::Status Nvfp4Grid::CheckValues(absl::Span<const float> values,
                                    double rel_tol) const {
  if (static_cast<int64_t>(values.size()) != size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "values: ", values.size(), " elements; the grid has ", size()));
  }
  for (int64_t i = 0; i < size(); ++i) {
    const float v = Value(i);
    if (!SameValue(v, values[static_cast<size_t>(i)], rel_tol)) {
      return absl::InternalError(
          absl::StrFormat("element %d (row %d, col %d): code 0x%x with scale "
                          "%g decodes to %.9g, but the "
                          "weight's value is %.9g",
                          i, i / cols_, i % cols_, code(i),
                          scales_[static_cast<size_t>(i / 16)], v,
                          values[static_cast<size_t>(i)]));
    }
  }
  return absl::OkStatus();
}

}  // namespace fp4q::examples
