// The FP4 matmul reference; see matmul.h.
#include "cpu/matmul.h"

#include <cmath>
#include <vector>

#include "cpu/formats.h"
#include "cpu/nvfp4.h"

namespace fp4q::kernels::cpu {
namespace {

double ScaleValue(const HostQuantized& q, uint8_t byte) {
  if (q.format == Format::kMxfp4) {
    return byte == 0xFF ? NAN : std::ldexp(1.0, static_cast<int>(byte) - 127);
  }
  return static_cast<double>(E4m3ToFloat(byte));
}

// e2m1(code) * sf for every element, exactly, in f64.
std::vector<double> ScaledElements(const HostQuantized& q) {
  std::vector<double> out(static_cast<size_t>(q.rows * q.cols));
  const int64_t block = BlockElems(q.format);
  for (int64_t r = 0; r < q.rows; ++r) {
    for (int64_t c = 0; c < q.cols; ++c) {
      const uint8_t scale = q.scales[static_cast<size_t>(r * q.scale_cols() + c / block)];
      out[static_cast<size_t>(r * q.cols + c)] =
          static_cast<double>(E2m1ToFloat(q.code(r, c))) * ScaleValue(q, scale);
    }
  }
  return out;
}

double DecodeScale(const HostQuantized& q) {
  if (q.format == Format::kMxfp4) return 1.0;
  return static_cast<double>(GlobalDecodeScale(q.s_enc));
}

}  // namespace

void MatmulReference(const HostQuantized& a, const HostQuantized& b, const MutTensor& c) {
  const std::vector<double> ea = ScaledElements(a);
  const std::vector<double> eb = ScaledElements(b);
  const double s_dec_a = DecodeScale(a);
  const double s_dec_b = DecodeScale(b);
  const int64_t k_dim = a.cols;
  for (int64_t m = 0; m < a.rows; ++m) {
    for (int64_t n = 0; n < b.rows; ++n) {
      double sum = 0.0;
      for (int64_t k = 0; k < k_dim; ++k) {
        sum += ea[static_cast<size_t>(m * k_dim + k)] * eb[static_cast<size_t>(n * k_dim + k)];
      }
      const double value = (sum * s_dec_a) * s_dec_b;
      const size_t at = static_cast<size_t>(m * b.rows + n);
      if (c.dtype == DType::kF32) {
        static_cast<float*>(c.data)[at] = static_cast<float>(value);
      } else {
        static_cast<uint16_t*>(c.data)[at] = DoubleToBf16(value);
      }
    }
  }
}

}  // namespace fp4q::kernels::cpu
