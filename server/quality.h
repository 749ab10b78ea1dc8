// Quantization quality of one sampled request (the fp4q_quant_* histograms).
#ifndef FP4Q_SERVER_QUALITY_H_
#define FP4Q_SERVER_QUALITY_H_

#include <cstdint>
#include <vector>

#include "fp4q/kernels/types.h"

namespace fp4q::server {

inline constexpr double kMaxSqnrDb = 200.0;  // reported when the error is exactly zero

struct QualityStats {
  bool valid = false;            // false when x has no finite nonzero element (nothing is reported)
  double sqnr_db = 0.0;          // 10 log10(sum x^2 / sum (x - DQ)^2) over finite x, capped
  double clipped_ratio = 0.0;    // elements with code +-6 whose |x| exceeds |DQ|, over all
  double underflow_ratio = 0.0;  // finite nonzero x with DQ == 0, over finite nonzero x
};

// x: rows * cols input values (f32); dq: their dequantized values; codes: the row-wise packed
// E2M1 codes (element 2j in the low nibble of byte j of a row).
QualityStats ComputeQuality(const float* x, const float* dq, const uint8_t* codes, int64_t rows,
                            int64_t cols);

// Widens a host f32/bf16 buffer to f32.
std::vector<float> ToF32(const void* data, kernels::DType dtype, int64_t count);

}  // namespace fp4q::server

#endif  // FP4Q_SERVER_QUALITY_H_
