// Host working representations; see host_tensor.h.
#include "cpu/host_tensor.h"

#include <cstring>

#include "cpu/formats.h"

namespace fp4q::kernels::cpu {

Matrix LoadDense(const ConstTensor& x) {
  Matrix m(x.rows, x.cols);
  const size_t n = m.values.size();
  if (x.dtype == DType::kF32) {
    std::memcpy(m.values.data(), x.data, n * sizeof(float));
  } else {
    const auto* bits = static_cast<const uint16_t*>(x.data);
    for (size_t i = 0; i < n; ++i) m.values[i] = Bf16ToFloat(bits[i]);
  }
  return m;
}

Matrix LoadF32(const float* values, int64_t rows, int64_t cols) {
  Matrix m(rows, cols);
  std::memcpy(m.values.data(), values, m.values.size() * sizeof(float));
  return m;
}

void StoreDense(const Matrix& m, const MutTensor& out) {
  const size_t n = m.values.size();
  if (out.dtype == DType::kF32) {
    std::memcpy(out.data, m.values.data(), n * sizeof(float));
  } else {
    auto* bits = static_cast<uint16_t*>(out.data);
    for (size_t i = 0; i < n; ++i) bits[i] = FloatToBf16(m.values[i]);
  }
}

Matrix Transpose(const Matrix& m) {
  Matrix t(m.cols, m.rows);
  for (int64_t r = 0; r < m.rows; ++r) {
    for (int64_t c = 0; c < m.cols; ++c) t.at(c, r) = m.at(r, c);
  }
  return t;
}

void WriteScales(const std::vector<uint8_t>& plain, int64_t rows, int64_t scale_cols,
                 ScaleLayout layout, uint8_t* dst) {
  if (layout == ScaleLayout::kPlain) {
    std::memcpy(dst, plain.data(), plain.size());
    return;
  }
  const int64_t padded_rows = (rows + 127) / 128 * 128;
  const int64_t padded_cols = (scale_cols + 3) / 4 * 4;
  std::memset(dst, 0, static_cast<size_t>(padded_rows * padded_cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < scale_cols; ++c) {
      dst[SwizzledScaleOffset(r, c, scale_cols)] = plain[static_cast<size_t>(r * scale_cols + c)];
    }
  }
}

std::vector<uint8_t> ReadScales(const uint8_t* src, int64_t rows, int64_t scale_cols,
                                ScaleLayout layout) {
  std::vector<uint8_t> plain(static_cast<size_t>(rows * scale_cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < scale_cols; ++c) {
      const size_t at = layout == ScaleLayout::kPlain ? static_cast<size_t>(r * scale_cols + c)
                                                      : SwizzledScaleOffset(r, c, scale_cols);
      plain[static_cast<size_t>(r * scale_cols + c)] = src[at];
    }
  }
  return plain;
}

HostQuantized LoadQuantized(const ConstQuantizedTensor& q) {
  HostQuantized h;
  h.format = q.format;
  h.block = q.block;
  h.rows = q.rows;
  h.cols = q.cols;
  h.codes.assign(q.codes, q.codes + q.rows * q.cols / 2);
  h.scales = ReadScales(q.scales, q.rows, h.scale_cols(), q.scale_layout);
  h.amax = q.global[0];
  h.s_enc = q.global[1];
  return h;
}

void StoreQuantized(const HostQuantized& h, const QuantizedTensor& dst) {
  std::memcpy(dst.codes, h.codes.data(), h.codes.size());
  WriteScales(h.scales, h.rows, h.scale_cols(), dst.scale_layout, dst.scales);
  dst.global[0] = h.amax;
  dst.global[1] = h.s_enc;
}

}  // namespace fp4q::kernels::cpu
