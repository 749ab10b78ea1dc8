// Test pieces for the optimizer step (step.h): one item's state held in plain host vectors
// (copyable, compared byte for byte), the StepItem viewing it, and an independent reference of
// NUMERICS 10.2 written here from the spec. The reference does its own optimizer arithmetic and
// moment storage and uses only the public Quantize / Dequantize of a backend for the NVFP4 steps
// (those are pinned by the golden and format tests), never the backend's step code.
#ifndef FP4Q_TESTS_KERNELS_STEP_TEST_UTIL_H_
#define FP4Q_TESTS_KERNELS_STEP_TEST_UTIL_H_

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "fp4q/kernels/backend.h"
#include "fp4q/kernels/step.h"
#include "gtest/gtest.h"

namespace fp4q::kernels::step_testing {

inline constexpr uint8_t kPoison = 0xA5;

inline uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// bf16 round-to-nearest-even (finite and Inf inputs).
inline uint16_t ToBf16(float f) {
  const uint32_t u = Bits(f);
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
inline float FromBf16(uint16_t b) { return FromBits(static_cast<uint32_t>(b) << 16); }

// The optimizer variants the step kernels template over, for the sweeps of step_test.cc (CPU)
// and cuda_step_test.cc (CUDA, against the CPU backend).
struct SweepOptimizer {
  OptimizerKind kind;
  bool momentum, amsgrad, nesterov, delta;
};
inline constexpr SweepOptimizer kSweepOptimizers[] = {
    {OptimizerKind::kSgd, false, false, false, false},
    {OptimizerKind::kSgd, false, false, false, true},
    {OptimizerKind::kSgd, true, false, false, false},
    {OptimizerKind::kSgd, true, false, true, false},
    {OptimizerKind::kAdamW, false, false, false, false},
    {OptimizerKind::kAdamW, false, true, false, false}};

// The sweeps' hyperparameters for case number `id`: the cheap choices (dampening, weight
// decay, eps) spread over the cases.
inline StepHyper SweepHyper(const SweepOptimizer& opt, int id) {
  StepHyper h;
  h.lr = 0.05f;
  if (opt.kind == OptimizerKind::kSgd) {
    h.momentum = opt.momentum ? 0.9f : 0.0f;
    h.dampening = opt.momentum && !opt.nesterov && id % 2 ? 0.1f : 0.0f;
    h.nesterov = opt.nesterov;
    h.weight_decay = !opt.delta && id % 3 == 1 ? 0.01f : 0.0f;
  } else {
    h.beta1 = 0.9f;
    h.beta2 = 0.999f;
    h.eps = id % 2 ? 1e-8f : 1e-3f;
    h.weight_decay = id % 3 == 2 ? 0.0f : 0.01f;
  }
  return h;
}

// What one item keeps and how it is stepped.
struct StepCase {
  int64_t rows = 32;
  int64_t cols = 48;
  BlockShape block = BlockShape::k1x16;
  ScaleLayout layout = ScaleLayout::kPlain;
  Rounding rounding = Rounding::kNearest;
  Scaling scaling = Scaling::kCurrent;
  OptimizerKind opt = OptimizerKind::kSgd;
  bool momentum = false;
  bool amsgrad = false;
  StateDType dtype = StateDType::kF32;
  bool residual = false;
  UpdateKind kind = UpdateKind::kGradient;
  std::vector<DType> update_dtypes = {DType::kF32};  // one per rank
  std::vector<DType> out_dtypes = {DType::kF32};
  StepHyper hyper;
  uint64_t seed = 0x1234;
  uint64_t step = 1;

  bool adamw() const { return opt == OptimizerKind::kAdamW; }
  bool has_m1() const { return adamw() || momentum; }
  bool has_m2() const { return adamw(); }
  bool has_mm2() const { return adamw() && amsgrad; }
  size_t n() const { return static_cast<size_t>(rows * cols); }
  std::string Name() const;
};

struct QBytes {
  std::vector<uint8_t> codes, scales;
  std::vector<float> global;
  bool operator==(const QBytes& o) const {
    return codes == o.codes && scales == o.scales &&
           std::memcmp(global.data(), o.global.data(), global.size() * 4) == 0 &&
           global.size() == o.global.size();
  }
};

// Every byte an item's step may write.
struct StepState {
  QBytes weight;
  std::vector<float> residual;  // empty: no error feedback
  std::vector<float> stats;     // kStepStatFloats
  std::array<std::vector<float>, 3> m_f32;
  std::array<std::vector<uint16_t>, 3> m_bf16;
  std::array<QBytes, 3> m_q;
  std::vector<std::vector<uint8_t>> outs;
};

// The raw update tensors of one step (bytes of f32 or bf16).
using Updates = std::vector<std::vector<uint8_t>>;

// A fresh item: the weight quantized (by `backend`, with the case's block and layout) from
// N(0, 0.5) values, a small residual when the case keeps one, zeroed optimizer state (NVFP4
// record [0, 1]), statistics as weight creation sets them (10.3), poisoned outputs.
StepState MakeState(Backend& backend, const StepCase& c, uint32_t seed);
// Updates of the case's dtypes, values N(0, sigma) (bf16: rounded).
Updates MakeUpdates(const StepCase& c, uint32_t seed, float sigma = 0.5f);
// The item viewing `st` and `u`.
StepItem MakeItem(const StepCase& c, StepState* st, const Updates& u);
// Refills every output with kPoison.
void PoisonOutputs(StepState* st);

// The reference: rewrites *st as one applied step of `c` with updates `u` leaves it
// (NUMERICS 10.2, 10.5, stats), using `backend` only for Quantize / Dequantize.
void ReferenceStep(Backend& backend, const StepCase& c, const Updates& u, StepState* st);

// NUMERICS 10.7, written from the spec.
uint64_t ReferenceFingerprint(const void* data, DType dtype, int64_t rows, int64_t cols);

// Byte-for-byte comparison, naming the first part that differs.
::testing::AssertionResult SameState(const StepState& got, const StepState& want);

// Runs check, apply and report of `items` on `backend` with a workspace of the right size.
absl::Status RunStep(Backend& backend, const std::vector<StepItem>& items, StepReport* report);

// ---------------------------------------------------------------- implementation

namespace detail {

inline constexpr float kFltMax = std::numeric_limits<float>::max();

inline const char* DTypeTag(DType d) { return d == DType::kF32 ? "f32" : "bf16"; }

inline QBytes MakeQBytes(int64_t rows, int64_t cols, ScaleLayout layout) {
  QBytes q;
  q.codes.assign(static_cast<size_t>(rows * cols / 2), 0);
  q.scales.assign(ScaleBytes(rows, cols, Format::kNvfp4, layout, "q").value(), 0);
  q.global = {0.0f, 1.0f};
  return q;
}

inline QuantizedTensor View(QBytes* q, BlockShape block, ScaleLayout layout, int64_t rows,
                            int64_t cols) {
  return QuantizedTensor{Format::kNvfp4,
                         block,
                         layout,
                         rows,
                         cols,
                         q->codes.data(),
                         q->codes.size(),
                         q->scales.data(),
                         q->scales.size(),
                         q->global.data()};
}

inline std::vector<float> Dequantize(Backend& b, QBytes q, BlockShape block, ScaleLayout layout,
                                     int64_t rows, int64_t cols) {
  std::vector<float> out(static_cast<size_t>(rows * cols));
  const QuantizedTensor v = View(&q, block, layout, rows, cols);
  const absl::Status s = b.Dequantize(
      AsConst(v), MutTensor{out.data(), DType::kF32, rows, cols, out.size() * 4}, nullptr);
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

inline QBytes Quantize(Backend& b, const std::vector<float>& x, int64_t rows, int64_t cols,
                       BlockShape block, ScaleLayout layout, Rounding rounding, uint64_t seed,
                       uint64_t step, float amax) {
  QBytes q = MakeQBytes(rows, cols, layout);
  QuantizedTensor v = View(&q, block, layout, rows, cols);
  QuantizeOptions o;
  o.block = block;
  o.scale_layout = layout;
  o.rounding = rounding;
  o.seed = seed;
  o.step = step;
  o.has_amax = true;
  o.amax = amax;
  const absl::Status s =
      b.Quantize(ConstTensor{x.data(), DType::kF32, rows, cols}, o, nullptr, &v, nullptr, nullptr);
  EXPECT_TRUE(s.ok()) << s;
  return q;
}

inline float AbsMaxOf(const std::vector<float>& v) {
  float m = 0.0f;
  for (float x : v) m = std::fmax(m, std::fabs(x));
  return m;
}

inline std::vector<float> Widen(const std::vector<uint8_t>& raw, DType dtype, size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    if (dtype == DType::kF32) {
      std::memcpy(&v[i], raw.data() + 4 * i, 4);
    } else {
      uint16_t b;
      std::memcpy(&b, raw.data() + 2 * i, 2);
      v[i] = FromBf16(b);
    }
  }
  return v;
}

inline uint64_t Mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

inline float S_enc(float amax) {  // NUMERICS 2 G2, map-to-6
  if (amax == 0.0f || std::isinf(amax)) return 1.0f;
  const float s = std::min(2688.0f / amax, kFltMax);
  return s == 0.0f ? 1.0f : s;
}

}  // namespace detail

using detail::AbsMaxOf;
using detail::Dequantize;
using detail::MakeQBytes;
using detail::Quantize;
using detail::View;
using detail::Widen;

inline std::string StepCase::Name() const {
  std::string s = absl::StrCat(rows, "x", cols, block == BlockShape::k16x16 ? "_16x16" : "_1x16",
                               layout == ScaleLayout::kSwizzled ? "_swz" : "",
                               rounding == Rounding::kStochastic ? "_sr" : "_rtn",
                               scaling == Scaling::kDelayed ? "_delayed" : "_current");
  if (kind == UpdateKind::kDelta) {
    absl::StrAppend(&s, "_delta");
  } else if (adamw()) {
    absl::StrAppend(&s, "_adamw", amsgrad ? "_amsgrad" : "");
  } else {
    absl::StrAppend(&s, "_sgd", momentum ? "_momentum" : "", hyper.nesterov ? "_nesterov" : "");
  }
  if (has_m1()) {
    absl::StrAppend(&s, dtype == StateDType::kF32    ? "_f32"
                        : dtype == StateDType::kBF16 ? "_bf16"
                                                     : "_nvfp4");
  }
  if (hyper.weight_decay != 0.0f) absl::StrAppend(&s, "_wd");
  absl::StrAppend(&s, residual ? "_ef" : "", "_k", update_dtypes.size());
  for (DType d : update_dtypes) absl::StrAppend(&s, "_", detail::DTypeTag(d));
  absl::StrAppend(&s, "_out");
  for (DType d : out_dtypes) absl::StrAppend(&s, "_", detail::DTypeTag(d));
  return s;
}

inline StepState MakeState(Backend& backend, const StepCase& c, uint32_t seed) {
  StepState st;
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 0.5f);
  std::vector<float> w0(c.n());
  for (float& x : w0) x = normal(gen);
  const float amax0 = AbsMaxOf(w0);
  st.weight =
      Quantize(backend, w0, c.rows, c.cols, c.block, c.layout, Rounding::kNearest, 0, 0, amax0);
  st.stats.assign(kStepStatFloats, 0.0f);
  st.stats[kStatNextAmax] = amax0;
  if (c.residual) {
    st.residual.resize(c.n());
    std::uniform_real_distribution<float> small(-0.01f, 0.01f);
    for (float& r : st.residual) r = small(gen);
    st.stats[kStatMaxResidual] = AbsMaxOf(st.residual);
  }
  const bool want[3] = {c.has_m1(), c.has_m2(), c.has_mm2()};
  for (int j = 0; j < 3; ++j) {
    if (!want[j]) continue;
    if (c.dtype == StateDType::kF32) st.m_f32[j].assign(c.n(), 0.0f);
    if (c.dtype == StateDType::kBF16) st.m_bf16[j].assign(c.n(), 0);
    if (c.dtype == StateDType::kNvfp4) st.m_q[j] = MakeQBytes(c.rows, c.cols, ScaleLayout::kPlain);
  }
  st.outs.resize(c.out_dtypes.size());
  for (size_t k = 0; k < c.out_dtypes.size(); ++k) {
    st.outs[k].assign(c.n() * (c.out_dtypes[k] == DType::kF32 ? 4 : 2), kPoison);
  }
  return st;
}

inline void PoisonOutputs(StepState* st) {
  for (auto& o : st->outs) std::fill(o.begin(), o.end(), kPoison);
}

inline Updates MakeUpdates(const StepCase& c, uint32_t seed, float sigma) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, sigma);
  Updates u;
  for (DType d : c.update_dtypes) {
    std::vector<uint8_t> raw(c.n() * (d == DType::kF32 ? 4 : 2));
    for (size_t i = 0; i < c.n(); ++i) {
      const float x = normal(gen);
      if (d == DType::kF32) {
        std::memcpy(raw.data() + 4 * i, &x, 4);
      } else {
        const uint16_t b = ToBf16(x);
        std::memcpy(raw.data() + 2 * i, &b, 2);
      }
    }
    u.push_back(std::move(raw));
  }
  return u;
}

inline StepItem MakeItem(const StepCase& c, StepState* st, const Updates& u) {
  StepItem item;
  item.weight = View(&st->weight, c.block, c.layout, c.rows, c.cols);
  item.residual = c.residual ? st->residual.data() : nullptr;
  item.stats = st->stats.data();
  item.scaling = c.scaling;
  item.rounding = c.rounding;
  item.seed = c.seed;
  item.step = c.step;
  item.state.kind = c.opt;
  item.state.dtype = c.dtype;
  item.state.momentum = c.momentum;
  item.state.amsgrad = c.amsgrad;
  MomentTensor* m[3] = {&item.state.moment1, &item.state.moment2, &item.state.max_moment2};
  const bool want[3] = {c.has_m1(), c.has_m2(), c.has_mm2()};
  for (int j = 0; j < 3; ++j) {
    if (!want[j]) continue;
    if (c.dtype == StateDType::kF32) m[j]->dense = st->m_f32[j].data();
    if (c.dtype == StateDType::kBF16) m[j]->dense = st->m_bf16[j].data();
    if (c.dtype == StateDType::kNvfp4) {
      m[j]->quantized = View(&st->m_q[j], BlockShape::k1x16, ScaleLayout::kPlain, c.rows, c.cols);
    }
  }
  item.hyper = c.hyper;
  item.kind = c.kind;
  for (size_t k = 0; k < u.size(); ++k) {
    item.updates.push_back(ConstTensor{u[k].data(), c.update_dtypes[k], c.rows, c.cols});
  }
  for (size_t k = 0; k < st->outs.size(); ++k) {
    item.dequantized_out.push_back(
        MutTensor{st->outs[k].data(), c.out_dtypes[k], c.rows, c.cols, st->outs[k].size()});
  }
  return item;
}

inline void ReferenceStep(Backend& backend, const StepCase& c, const Updates& u, StepState* st) {
  const size_t n = c.n();
  const StepHyper& h = c.hyper;
  // Host scalars.
  const float cd = 1.0f - h.dampening;
  const float c1 = 1.0f - h.beta1;
  const float c2 = 1.0f - h.beta2;
  const float lrwd = h.lr * h.weight_decay;
  const double t = static_cast<double>(h.t);
  const float sbc2 = static_cast<float>(std::sqrt(1.0 - std::pow(static_cast<double>(h.beta2), t)));
  const float alpha = static_cast<float>(static_cast<double>(h.lr) /
                                         (1.0 - std::pow(static_cast<double>(h.beta1), t)));

  // U.
  std::vector<float> g = Widen(u[0], c.update_dtypes[0], n);
  for (size_t k = 1; k < u.size(); ++k) {
    const std::vector<float> uk = Widen(u[k], c.update_dtypes[k], n);
    for (size_t i = 0; i < n; ++i) g[i] = g[i] + uk[i];
  }
  if (u.size() > 1) {
    const float kf = static_cast<float>(u.size());
    for (float& x : g) x = x / kf;
  }
  float gmax = 0.0f;
  for (float x : g) gmax = std::fmax(gmax, std::fabs(x));

  // D and the loaded state.
  const std::vector<float> d = Dequantize(backend, st->weight, c.block, c.layout, c.rows, c.cols);
  std::vector<float> r = c.residual ? st->residual : std::vector<float>(n, 0.0f);
  std::array<std::vector<float>, 3> m;
  const bool want[3] = {c.has_m1(), c.has_m2(), c.has_mm2()};
  for (int j = 0; j < 3; ++j) {
    m[j].assign(n, 0.0f);
    if (!want[j]) continue;
    for (size_t i = 0; i < n; ++i) {
      if (c.dtype == StateDType::kF32) m[j][i] = st->m_f32[j][i];
      if (c.dtype == StateDType::kBF16) m[j][i] = FromBf16(st->m_bf16[j][i]);
    }
    if (c.dtype == StateDType::kNvfp4) {
      const std::vector<float> dq =
          Dequantize(backend, st->m_q[j], BlockShape::k1x16, ScaleLayout::kPlain, c.rows, c.cols);
      for (size_t i = 0; i < n; ++i) m[j][i] = j == 0 ? dq[i] : dq[i] * dq[i];
    }
  }

  // The optimizer, element by element.
  std::vector<float> v(n), nm1(n, 0.0f), nv2(n, 0.0f), nvm(n, 0.0f);
  for (size_t i = 0; i < n; ++i) {
    const float p = c.residual ? d[i] + r[i] : d[i];
    float x;
    if (c.kind == UpdateKind::kDelta) {
      x = d[i] + g[i];
    } else if (!c.adamw()) {
      float gi = g[i];
      if (h.weight_decay != 0.0f) gi = gi + h.weight_decay * p;
      if (c.momentum) {
        const float b = h.t == 1 ? gi : h.momentum * m[0][i] + cd * gi;
        nm1[i] = b;
        gi = h.nesterov ? gi + h.momentum * b : b;
      }
      x = d[i] - h.lr * gi;
    } else {
      nm1[i] = h.beta1 * m[0][i] + c1 * g[i];
      nv2[i] = h.beta2 * m[1][i] + (c2 * g[i]) * g[i];
      float src = nv2[i];
      if (c.amsgrad) {
        nvm[i] = std::max(m[2][i], nv2[i]);
        src = nvm[i];
      }
      const float den = std::sqrt(src) / sbc2 + h.eps;
      const float dir = nm1[i] / den;
      if (h.weight_decay != 0.0f) {
        x = d[i] - (lrwd * p + alpha * dir);
      } else {
        x = d[i] - alpha * dir;
      }
    }
    v[i] = c.residual ? x + r[i] : x;
  }

  // Q, R, O.
  const float a = c.scaling == Scaling::kCurrent ? AbsMaxOf(v) : st->stats[kStatNextAmax];
  st->weight =
      Quantize(backend, v, c.rows, c.cols, c.block, c.layout, c.rounding, c.seed, c.step, a);
  const std::vector<float> dq = Dequantize(backend, st->weight, c.block, c.layout, c.rows, c.cols);
  std::vector<float> nr(n, 0.0f);
  if (c.residual) {
    for (size_t i = 0; i < n; ++i) nr[i] = v[i] - dq[i];
    st->residual = nr;
  }
  for (size_t k = 0; k < st->outs.size(); ++k) {
    for (size_t i = 0; i < n; ++i) {
      if (c.out_dtypes[k] == DType::kF32) {
        std::memcpy(st->outs[k].data() + 4 * i, &dq[i], 4);
      } else {
        const uint16_t b = ToBf16(dq[i]);
        std::memcpy(st->outs[k].data() + 2 * i, &b, 2);
      }
    }
  }

  // The moments (10.5).
  std::vector<float> s2(n), svm(n);
  for (size_t i = 0; i < n; ++i) {
    s2[i] = std::sqrt(nv2[i]);
    svm[i] = std::sqrt(nvm[i]);
  }
  const std::vector<float>* stored[3] = {&nm1, &s2, &svm};  // NVFP4 stores sqrt of v, max v
  const std::vector<float>* values[3] = {&nm1, &nv2, &nvm};
  float m_amax[3] = {AbsMaxOf(nm1), AbsMaxOf(s2), AbsMaxOf(svm)};
  if (c.scaling == Scaling::kDelayed) {
    const float* s = st->stats.data();
    if (c.adamw()) {
      m_amax[0] = h.beta1 * s[kStatMaxMoment1] + c1 * gmax;
      m_amax[1] = std::sqrt(h.beta2 * (s[kStatMaxSqrtMoment2] * s[kStatMaxSqrtMoment2]) +
                            (c2 * gmax) * gmax);
      m_amax[2] = std::max(m_amax[1], s[kStatMaxSqrtMaxMoment2]);
    } else {
      m_amax[0] =
          h.t == 1 ? gmax : std::fabs(h.momentum) * s[kStatMaxMoment1] + std::fabs(cd) * gmax;
    }
  }
  for (int j = 0; j < 3; ++j) {
    if (!want[j]) continue;
    if (c.dtype == StateDType::kF32) st->m_f32[j] = *values[j];
    if (c.dtype == StateDType::kBF16) {
      for (size_t i = 0; i < n; ++i) st->m_bf16[j][i] = ToBf16((*values[j])[i]);
    }
    if (c.dtype == StateDType::kNvfp4) {
      QBytes q = Quantize(backend, *stored[j], c.rows, c.cols, BlockShape::k1x16,
                          ScaleLayout::kPlain, Rounding::kNearest, 0, 0, m_amax[j]);
      if (j > 0) {  // zero-free rounding of the roots
        for (size_t i = 0; i < n; ++i) {
          uint8_t& byte = q.codes[i / 2];
          const int shift = (i % 2) * 4;
          if ((*stored[j])[i] > 0.0f && ((byte >> shift) & 0xF) == 0) {
            byte = static_cast<uint8_t>(byte | (1 << shift));
          }
        }
      }
      EXPECT_EQ(q.global[1], detail::S_enc(m_amax[j]));
      st->m_q[j] = q;
    }
  }

  // S.
  st->stats[kStatNextAmax] = AbsMaxOf(v);
  st->stats[kStatMaxResidual] = AbsMaxOf(nr);
  if (c.has_m1()) st->stats[kStatMaxMoment1] = AbsMaxOf(nm1);
  if (c.has_m2()) st->stats[kStatMaxSqrtMoment2] = AbsMaxOf(s2);
  if (c.has_mm2()) st->stats[kStatMaxSqrtMaxMoment2] = AbsMaxOf(svm);
}

inline uint64_t ReferenceFingerprint(const void* data, DType dtype, int64_t rows, int64_t cols) {
  const auto* bytes = static_cast<const uint8_t*>(data);
  const uint64_t elem = dtype == DType::kF32 ? 4 : 2;
  uint64_t sum = 0;
  for (uint64_t j = 0; j < static_cast<uint64_t>(rows * cols) * elem / 8; ++j) {
    uint64_t w = 0;
    std::memcpy(&w, bytes + 8 * j, 8);  // little-endian hosts only (as the server)
    sum += detail::Mix(j * 0x9E3779B97F4A7C15ull + w);
  }
  const uint64_t code = dtype == DType::kF32 ? 1 : 2;
  return detail::Mix(sum ^ detail::Mix((code << 56) ^ (static_cast<uint64_t>(rows) << 28) ^
                                       static_cast<uint64_t>(cols)));
}

namespace detail {

template <typename T>
inline ::testing::AssertionResult SameVec(const std::vector<T>& a, const std::vector<T>& b,
                                          const std::string& what) {
  if (a.size() != b.size()) {
    return ::testing::AssertionFailure()
           << what << ": " << a.size() << " vs " << b.size() << " elements";
  }
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) {
      return ::testing::AssertionFailure() << what << ": first difference at element " << i
                                           << " (got " << +a[i] << ", want " << +b[i] << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

inline ::testing::AssertionResult SameQ(const QBytes& a, const QBytes& b, const std::string& what) {
  if (auto r = SameVec(a.codes, b.codes, what + ".codes"); !r) return r;
  if (auto r = SameVec(a.scales, b.scales, what + ".scales"); !r) return r;
  return SameVec(a.global, b.global, what + ".global");
}

}  // namespace detail

inline ::testing::AssertionResult SameState(const StepState& got, const StepState& want) {
  using detail::SameQ;
  using detail::SameVec;
  if (auto r = SameQ(got.weight, want.weight, "weight"); !r) return r;
  if (auto r = SameVec(got.residual, want.residual, "residual"); !r) return r;
  if (auto r = SameVec(got.stats, want.stats, "stats"); !r) return r;
  for (int j = 0; j < 3; ++j) {
    const std::string m = absl::StrCat("moment[", j, "]");
    if (auto r = SameVec(got.m_f32[j], want.m_f32[j], m + ".f32"); !r) return r;
    if (auto r = SameVec(got.m_bf16[j], want.m_bf16[j], m + ".bf16"); !r) return r;
    if (auto r = SameQ(got.m_q[j], want.m_q[j], m + ".nvfp4"); !r) return r;
  }
  if (got.outs.size() != want.outs.size()) return ::testing::AssertionFailure() << "outs count";
  for (size_t k = 0; k < got.outs.size(); ++k) {
    if (auto r = SameVec(got.outs[k], want.outs[k], absl::StrCat("dequantized_out[", k, "]")); !r) {
      return r;
    }
  }
  return ::testing::AssertionSuccess();
}

inline absl::Status RunStep(Backend& backend, const std::vector<StepItem>& items,
                            StepReport* report) {
  const size_t bytes = StepWorkspaceBytes(items);
  absl::StatusOr<void*> ws = backend.Allocate(bytes);
  if (!ws.ok()) return ws.status();
  absl::Status s = backend.StepCheck(items, *ws, bytes, nullptr);
  if (s.ok()) s = backend.StepApply(items, *ws, nullptr);
  if (s.ok()) s = backend.StepReadReport(items, *ws, report, nullptr);
  backend.Free(*ws);
  return s;
}

// Points `item`'s StepNext at `next`'s buffers (a StepState of the item's case: MakeState's
// sizes), making it a one-pass item.
inline void SetNext(StepItem* item, StepState* next) {
  item->next.codes = next->weight.codes.data();
  item->next.scales = next->weight.scales.data();
  item->next.global = next->weight.global.data();
  item->next.stats = next->stats.data();
  item->next.residual = item->residual != nullptr ? next->residual.data() : nullptr;
}

// Every byte of `st`'s weight, residual and statistics set to kPoison.
inline void PoisonState(StepState* st) {
  const auto poison = [](auto* v) {
    std::memset(v->data(), kPoison, v->size() * sizeof((*v)[0]));
  };
  poison(&st->weight.codes);
  poison(&st->weight.scales);
  poison(&st->weight.global);
  poison(&st->residual);
  poison(&st->stats);
}

// One-pass items (OnePassItem) for sweep case `i` of 16: rounding, error feedback, f32 or bf16
// gradient and output (or none), and awkward shapes.
inline StepCase OnePassCase(int i) {
  StepCase c;
  const int64_t shapes[4][2] = {{1, 16}, {7, 48}, {33, 80}, {217, 256}};
  c.rows = shapes[i % 4][0];
  c.cols = shapes[i % 4][1];
  c.scaling = Scaling::kDelayed;
  c.rounding = i % 2 ? Rounding::kStochastic : Rounding::kNearest;
  c.residual = (i / 2) % 2 == 0;
  const DType d = (i / 4) % 2 ? DType::kBF16 : DType::kF32;
  c.update_dtypes = {d};
  c.out_dtypes = i / 8 ? std::vector<DType>{} : std::vector<DType>{d};
  c.hyper.lr = 0.05f;
  c.seed = 0x5EED + static_cast<uint64_t>(i);
  return c;
}

// The bytes DQ(W) of `st`'s weight takes in an output of dtype `d`.
inline std::vector<uint8_t> DequantizedBytes(Backend& b, const StepCase& c, const StepState& st,
                                             DType d) {
  const std::vector<float> dq =
      detail::Dequantize(b, st.weight, c.block, c.layout, c.rows, c.cols);
  std::vector<uint8_t> out(dq.size() * (d == DType::kF32 ? 4 : 2));
  for (size_t i = 0; i < dq.size(); ++i) {
    if (d == DType::kF32) {
      std::memcpy(out.data() + 4 * i, &dq[i], 4);
    } else {
      const uint16_t h = ToBf16(dq[i]);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

// A one-pass step of `items` (each with a StepNext): StepCheckAndApply and the report.
inline absl::Status RunOnePassStep(Backend& backend, const std::vector<StepItem>& items,
                                   StepReport* report, const StepCancel& cancel = {}) {
  absl::StatusOr<ValidatedStep> step = ValidatedStep::Check(items);
  if (!step.ok()) return step.status();
  const size_t bytes = StepWorkspaceBytes(items);
  absl::StatusOr<void*> ws = backend.Allocate(bytes);
  if (!ws.ok()) return ws.status();
  absl::Status s = backend.StepCheckAndApply(*step, *ws, bytes, nullptr, cancel);
  if (s.ok()) s = backend.StepReadReport(items, *ws, report, nullptr);
  backend.Free(*ws);
  return s;
}

// Element i of update k of `u` (case `c`) set to x (exact in bf16 for the values tests use).
inline void Set(Updates* u, const StepCase& c, size_t k, size_t i, float x) {
  if (c.update_dtypes[k] == DType::kF32) {
    std::memcpy((*u)[k].data() + 4 * i, &x, 4);
  } else {
    const uint16_t b = static_cast<uint16_t>(Bits(x) >> 16);  // exact for these
    std::memcpy((*u)[k].data() + 2 * i, &b, 2);
  }
}

inline void SetAll(Updates* u, const StepCase& c, size_t k, float x) {
  for (size_t i = 0; i < c.n(); ++i) Set(u, c, k, i, x);
}

// Five items of different kinds; `bad` ones get a NaN update (or a wrong fingerprint).
struct Batch {
  std::vector<StepCase> cases;
  std::vector<StepState> states;
  std::vector<Updates> updates;
  std::vector<StepItem> Items() {
    std::vector<StepItem> items;
    for (size_t i = 0; i < cases.size(); ++i) {
      items.push_back(MakeItem(cases[i], &states[i], updates[i]));
    }
    return items;
  }
};

inline Batch MakeBatch(Backend& cpu) {
  Batch b;
  for (int i = 0; i < 5; ++i) {
    StepCase c;
    c.rows = 16 * (1 + i % 2);
    c.cols = 32 + 16 * i;
    c.block = i % 2 ? BlockShape::k16x16 : BlockShape::k1x16;
    c.opt = i >= 3 ? OptimizerKind::kAdamW : OptimizerKind::kSgd;
    c.momentum = i == 1;
    c.hyper.momentum = i == 1 ? 0.9f : 0.0f;
    c.dtype = i == 4 ? StateDType::kNvfp4 : StateDType::kF32;
    c.residual = i % 3 == 0;
    c.scaling = i == 2 ? Scaling::kDelayed : Scaling::kCurrent;
    c.update_dtypes = {i % 2 ? DType::kBF16 : DType::kF32};
    c.hyper.lr = 0.1f;
    b.cases.push_back(c);
    b.states.push_back(MakeState(cpu, c, 30 + i));
    b.updates.push_back(MakeUpdates(c, 40 + i));
  }
  return b;
}

}  // namespace fp4q::kernels::step_testing

#endif  // FP4Q_TESTS_KERNELS_STEP_TEST_UTIL_H_
