// Random Hadamard transform; see rht.h.
#include "cpu/rht.h"

#include "cpu/formats.h"
#include "cpu/philox.h"

namespace fp4q::kernels::cpu {
namespace {

void Butterfly16(float* v) {
  for (int width = 1; width < 16; width *= 2) {
    for (int start = 0; start < 16; start += 2 * width) {
      for (int i = start; i < start + width; ++i) {
        const float a = v[i];
        const float b = v[i + width];
        v[i] = a + b;
        v[i + width] = a - b;
      }
    }
  }
}

void ApplySigns(float* v, uint16_t signs) {
  for (int i = 0; i < 16; ++i) {
    if ((signs >> i) & 1u) v[i] = -v[i];
  }
}

}  // namespace

uint16_t RhtSignMask(RhtMode mode, uint64_t rht_seed) {
  switch (mode) {
    case RhtMode::kDefaultSigns:
      return kDefaultRhtSigns;
    case RhtMode::kSeeded:
      return static_cast<uint16_t>(Philox4x32({0, 0, 0, 0}, PhiloxKeyFromSeed(rht_seed))[0]);
    case RhtMode::kOff:
      break;
  }
  return 0;
}

void RhtForward16(float* v, uint16_t signs) {
  ApplySigns(v, signs);
  Butterfly16(v);
  for (int i = 0; i < 16; ++i) v[i] = v[i] * 0.25f;
}

void RhtInverse16(float* v, uint16_t signs) {
  Butterfly16(v);
  for (int i = 0; i < 16; ++i) v[i] = v[i] * 0.25f;
  ApplySigns(v, signs);
}

void RhtRows(std::vector<float>* m, int64_t rows, int64_t cols, uint16_t signs, bool inverse,
             DType round_to) {
  float* data = m->data();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; c += 16) {
      float* group = data + r * cols + c;
      if (inverse) {
        RhtInverse16(group, signs);
      } else {
        RhtForward16(group, signs);
      }
    }
  }
  if (round_to == DType::kBF16) {
    for (float& x : *m) x = Bf16ToFloat(FloatToBf16(x));
  }
}

}  // namespace fp4q::kernels::cpu
