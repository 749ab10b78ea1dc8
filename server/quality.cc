#include "server/quality.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace fp4q::server {

QualityStats ComputeQuality(const float* x, const float* dq, const uint8_t* codes, int64_t rows,
                            int64_t cols) {
  QualityStats q;
  double signal = 0.0;
  double noise = 0.0;
  int64_t nonzero = 0;
  int64_t underflow = 0;
  int64_t clipped = 0;
  const int64_t n = rows * cols;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t i = r * cols + c;
      const double xv = x[i];
      const double dv = dq[i];
      const uint8_t byte = codes[r * (cols / 2) + c / 2];
      const uint8_t code = (c % 2 == 0) ? (byte & 0x0F) : (byte >> 4);
      if (!std::isfinite(xv)) continue;
      signal += xv * xv;
      noise += (xv - dv) * (xv - dv);
      if (xv != 0.0) {
        ++nonzero;
        if (dv == 0.0) ++underflow;
      }
      if ((code & 0x7) == 0x7 && std::fabs(xv) > std::fabs(dv)) ++clipped;
    }
  }
  if (nonzero == 0 || signal == 0.0) return q;
  q.valid = true;
  q.sqnr_db = noise == 0.0 ? kMaxSqnrDb : std::min(kMaxSqnrDb, 10.0 * std::log10(signal / noise));
  q.clipped_ratio = static_cast<double>(clipped) / static_cast<double>(n);
  q.underflow_ratio = static_cast<double>(underflow) / static_cast<double>(nonzero);
  return q;
}

std::vector<float> ToF32(const void* data, kernels::DType dtype, int64_t count) {
  std::vector<float> out(static_cast<size_t>(count));
  if (dtype == kernels::DType::kF32) {
    std::memcpy(out.data(), data, out.size() * sizeof(float));
    return out;
  }
  const auto* p = static_cast<const uint8_t*>(data);
  for (int64_t i = 0; i < count; ++i) {
    uint16_t h;
    std::memcpy(&h, p + 2 * i, 2);
    const uint32_t u = static_cast<uint32_t>(h) << 16;
    std::memcpy(&out[i], &u, 4);
  }
  return out;
}

}  // namespace fp4q::server
