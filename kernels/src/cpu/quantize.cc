// The quantization pipeline; see quantize.h.
#include "cpu/quantize.h"

#include "cpu/formats.h"
#include "cpu/mxfp4.h"
#include "cpu/nvfp4.h"
#include "cpu/rht.h"

namespace fp4q::kernels::cpu {

HostQuantized QuantizeMatrix(const Matrix& x, DType input_dtype, const QuantizeOptions& options,
                             bool columnwise) {
  Matrix m = columnwise ? Transpose(x) : x;
  if (options.rht != RhtMode::kOff) {
    RhtRows(&m.values, m.rows, m.cols, RhtSignMask(options.rht, options.rht_seed),
            /*inverse=*/false, input_dtype);
  }
  const float amax = options.has_amax ? options.amax : AbsMax(m.values.data(), m.values.size());
  const ElementRounding rounding{options.rounding, options.seed, options.step};
  if (options.format == Format::kMxfp4) {
    return QuantizeMxfp4(m, amax, options.mx_rule, rounding);
  }
  return QuantizeNvfp4(m, options.block, amax, options.scale_selection, options.four_over_six_emax,
                       rounding);
}

Matrix DequantizeHost(const HostQuantized& q) {
  Matrix out(q.rows, q.cols);
  const int64_t block = BlockElems(q.format);
  const int64_t scale_cols = q.scale_cols();
  const bool mx = q.format == Format::kMxfp4;
  const float s_dec = GlobalDecodeScale(q.s_enc);
  for (int64_t r = 0; r < q.rows; ++r) {
    for (int64_t c0 = 0; c0 < q.cols; c0 += block) {  // one scale per block
      const uint8_t scale = q.scales[static_cast<size_t>(r * scale_cols + c0 / block)];
      const float sf = mx ? E8m0ToFloat(scale) : E4m3ToFloat(scale);
      const uint8_t* codes = &q.codes[static_cast<size_t>((r * q.cols + c0) / 2)];
      float* o = &out.at(r, c0);
      for (int64_t c = 0; c < block; ++c) {  // element c0 + c: byte c / 2, low nibble first
        const float v = E2m1ToFloat(c % 2 == 0 ? codes[c / 2] & 0xF : codes[c / 2] >> 4);
        if (mx) {
          o[c] = v * sf;
        } else {
          const float scaled = v * sf;  // exact
          o[c] = scaled * s_dec;
        }
      }
    }
  }
  return out;
}

}  // namespace fp4q::kernels::cpu
