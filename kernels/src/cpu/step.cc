// The optimizer step on the host; see step.h. Every f32 operation is one statement in the order
// of NUMERICS 10.2 (this file is compiled with -ffp-contract=off: no FMA); the bounds of 10.4 and
// 10.6 are computed in double.
#include "cpu/step.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cpu/formats.h"
#include "cpu/host_tensor.h"
#include "cpu/nvfp4.h"
#include "cpu/parallel.h"
#include "cpu/quantize.h"
#include "step_layout.h"
#include "step_report.h"
#include "step_scalars.h"

namespace fp4q::kernels::cpu {
namespace {

using step_ws::Plan;
using step_ws::ReportPod;

bool Finite(float f) { return std::isfinite(f); }

uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

bool HasMoment1(const OptimizerState& st) {
  return st.kind == OptimizerKind::kAdamW || st.momentum;
}
bool IsAdamW(const OptimizerState& st) { return st.kind == OptimizerKind::kAdamW; }

// ---------------------------------------------------------------- loads and stores

// 10.5 load: the moment's f32 values; `squared` (v, max v): stored as sqrt under NVFP4.
std::vector<float> LoadMoment(const MomentTensor& m, StateDType dtype, int64_t rows, int64_t cols,
                              bool squared) {
  const size_t n = static_cast<size_t>(rows * cols);
  std::vector<float> out(n);
  if (dtype == StateDType::kF32) {
    std::memcpy(out.data(), m.dense, n * sizeof(float));
  } else if (dtype == StateDType::kBF16) {
    const auto* bits = static_cast<const uint16_t*>(m.dense);
    for (size_t i = 0; i < n; ++i) out[i] = Bf16ToFloat(bits[i]);
  } else {
    const Matrix dq = DequantizeHost(LoadQuantized(AsConst(m.quantized)));
    for (size_t i = 0; i < n; ++i) {
      const float s = dq.values[i];
      out[i] = squared ? s * s : s;
    }
  }
  return out;
}

// 10.5 store of the f32 values `values`; NVFP4 quantizes them (or, `squared`, their square roots
// with zero-free rounding) with global amax `amax`.
void StoreMoment(const MomentTensor& m, StateDType dtype, int64_t rows, int64_t cols,
                 const std::vector<float>& values, bool squared, float amax) {
  const size_t n = values.size();
  if (dtype == StateDType::kF32) {
    std::memcpy(m.dense, values.data(), n * sizeof(float));
    return;
  }
  if (dtype == StateDType::kBF16) {
    auto* bits = static_cast<uint16_t*>(m.dense);
    for (size_t i = 0; i < n; ++i) bits[i] = FloatToBf16(values[i]);
    return;
  }
  Matrix stored(rows, cols);
  for (size_t i = 0; i < n; ++i) stored.values[i] = squared ? std::sqrt(values[i]) : values[i];
  HostQuantized q = QuantizeNvfp4(stored, BlockShape::k1x16, amax, ScaleSelection::kMapTo6, 256.0f,
                                  ElementRounding());
  if (squared) {  // zero-free rounding: a positive root never becomes 0
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        if (stored.at(r, c) > 0.0f && q.code(r, c) == 0) q.set_code(r, c, 1);
      }
    }
  }
  StoreQuantized(q, m.quantized);
}

// U: g = u_0; g = RN(g + u_k) for k = 1..K-1; RN(g / K) when K > 1.
Matrix UpdateSum(const std::vector<Matrix>& u, float k) {
  Matrix g = u[0];
  for (size_t j = 1; j < u.size(); ++j) {
    for (size_t i = 0; i < g.values.size(); ++i) g.values[i] = g.values[i] + u[j].values[i];
  }
  if (u.size() > 1) {
    for (float& x : g.values) x = x / k;
  }
  return g;
}

// ---------------------------------------------------------------- one element (10.2 D..V)

struct ElemIn {
  float g;
  float d;
  float r;    // 0 without error feedback
  float m1;   // b or m as loaded (0 when absent)
  float m2;   // v as loaded
  float mm2;  // max v as loaded
};

struct ElemOut {
  float x = 0.0f;
  float v = 0.0f;
  float m1 = 0.0f;  // the new b or m
  float v2 = 0.0f;  // the new v
  float vm = 0.0f;  // the new max v
};

ElemOut StepElement(const StepItem& item, const StepScalars& s, const ElemIn& in) {
  const bool has_r = item.residual != nullptr;
  const OptimizerState& st = item.state;
  ElemOut e;
  float p = in.d;
  if (has_r) p = in.d + in.r;
  if (item.kind == UpdateKind::kDelta) {
    e.x = in.d + in.g;
  } else if (!IsAdamW(st)) {
    float g = in.g;
    if (s.wd != 0.0f) {
      const float decay = s.wd * p;
      g = g + decay;
    }
    if (st.momentum) {
      float b;
      if (s.t == 1) {
        b = g;
      } else {
        const float kept = s.mu * in.m1;
        const float added = s.cd * g;
        b = kept + added;
      }
      e.m1 = b;
      if (item.hyper.nesterov) {
        const float ahead = s.mu * b;
        g = g + ahead;
      } else {
        g = b;
      }
    }
    const float step = s.lr * g;
    e.x = in.d - step;
  } else {
    const float m_kept = s.b1 * in.m1;
    const float m_added = s.c1 * in.g;
    e.m1 = m_kept + m_added;
    const float v_kept = s.b2 * in.m2;
    const float cg = s.c2 * in.g;
    const float v_added = cg * in.g;
    e.v2 = v_kept + v_added;
    float den_src = e.v2;
    if (st.amsgrad) {
      e.vm = e.v2 > in.mm2 ? e.v2 : in.mm2;
      den_src = e.vm;
    }
    const float root = std::sqrt(den_src);
    const float corrected = root / s.sbc2;
    const float den = corrected + s.eps;
    const float dir = e.m1 / den;
    const float moved = s.alpha * dir;
    if (s.wd != 0.0f) {
      const float decay = s.lrwd * p;
      const float total = decay + moved;
      e.x = in.d - total;
    } else {
      e.x = in.d - moved;
    }
  }
  e.v = e.x;
  if (has_r) e.v = e.x + in.r;
  return e;
}

// Everything an item's elements read, loaded once (before anything is written).
struct ItemData {
  Matrix g;
  Matrix d;
  std::vector<float> r, m1, m2, mm2;
};

ItemData LoadItem(const StepItem& item, const std::vector<Matrix>& u, const StepScalars& s) {
  ItemData data;
  data.g = UpdateSum(u, s.k);
  data.d = DequantizeHost(LoadQuantized(AsConst(item.weight)));
  const int64_t rows = item.weight.rows, cols = item.weight.cols;
  const size_t n = static_cast<size_t>(rows * cols);
  data.r.assign(n, 0.0f);
  if (item.residual != nullptr) std::memcpy(data.r.data(), item.residual, n * sizeof(float));
  const OptimizerState& st = item.state;
  if (HasMoment1(st)) data.m1 = LoadMoment(st.moment1, st.dtype, rows, cols, false);
  if (IsAdamW(st)) data.m2 = LoadMoment(st.moment2, st.dtype, rows, cols, true);
  if (IsAdamW(st) && st.amsgrad) data.mm2 = LoadMoment(st.max_moment2, st.dtype, rows, cols, true);
  return data;
}

// Element i's inputs; an optimizer state the item does not keep reads as 0.
ElemIn InputAt(const ItemData& data, size_t i) {
  const auto at = [i](const std::vector<float>& v) { return v.empty() ? 0.0f : v[i]; };
  return ElemIn{data.g.values[i], data.d.values[i], data.r[i], at(data.m1), at(data.m2),
                at(data.mm2)};
}

std::vector<Matrix> LoadUpdates(const StepItem& item) {
  std::vector<Matrix> u;
  for (const ConstTensor& t : item.updates) u.push_back(LoadDense(t));
  return u;
}

// ---------------------------------------------------------------- the check of one item

void Fail(ReportPod* rep, int32_t outcome, int32_t quantity) {
  rep->outcome = outcome;
  rep->quantity = quantity;
}

void FailAt(ReportPod* rep, int32_t outcome, int32_t quantity, int64_t index, float value) {
  Fail(rep, outcome, quantity);
  rep->index = index;
  rep->value = value;
}

void FailBound(ReportPod* rep, int32_t quantity, double bound) {
  Fail(rep, step_ws::kOutOfRange, quantity);
  rep->bound = bound;
}

bool BelowLimit(double bound) { return bound < step_ws::kTwoPow127; }  // false for NaN

// 10.4 step 3 under current scaling: the whole computation, nothing written. Fills the plan's
// amaxes; returns false (report filled) on a non-finite result.
bool CheckCurrent(const StepItem& item, const StepScalars& s, const ItemData& data, ReportPod* rep,
                  Plan* plan) {
  const OptimizerState& st = item.state;
  const size_t n = data.g.values.size();
  int64_t first[3] = {-1, -1, -1};  // moment1, moment2, weight
  float value[3] = {0.0f, 0.0f, 0.0f};
  float vmax = 0.0f, m1max = 0.0f, s2max = 0.0f, svmmax = 0.0f;
  for (size_t i = 0; i < n; ++i) {
    const ElemOut e = StepElement(item, s, InputAt(data, i));
    const int64_t idx = static_cast<int64_t>(i);
    if (HasMoment1(st) && !Finite(e.m1) && first[0] < 0) {
      first[0] = idx;
      value[0] = e.m1;
    }
    if (IsAdamW(st) && first[1] < 0) {
      if (!Finite(e.v2)) {
        first[1] = idx;
        value[1] = e.v2;
      } else if (st.amsgrad && !Finite(e.vm)) {
        first[1] = idx;
        value[1] = e.vm;
      }
    }
    if (first[2] < 0) {
      if (!Finite(e.x)) {
        first[2] = idx;
        value[2] = e.x;
      } else if (!Finite(e.v)) {
        first[2] = idx;
        value[2] = e.v;
      }
    }
    vmax = std::fmax(vmax, std::fabs(e.v));
    m1max = std::fmax(m1max, std::fabs(e.m1));
    s2max = std::fmax(s2max, std::sqrt(e.v2));
    svmmax = std::fmax(svmmax, std::sqrt(e.vm));
  }
  const int32_t quantity[3] = {step_ws::kQMoment1, step_ws::kQMoment2, step_ws::kQWeight};
  for (int q = 0; q < 3; ++q) {
    if (first[q] >= 0) {
      FailAt(rep, step_ws::kNonFiniteResult, quantity[q], first[q], value[q]);
      return false;
    }
  }
  plan->amax = vmax;
  plan->m_amax[0] = m1max;
  plan->m_amax[1] = s2max;
  plan->m_amax[2] = svmmax;
  return true;
}

// 10.4 step 3 under delayed scaling: the bounds of 10.6 (double) and the moments' amaxes of
// 10.5 (f32). Returns false (report filled) when a bound reaches 2^127.
bool CheckDelayed(const StepItem& item, const StepScalars& s, ReportPod* rep, Plan* plan,
                  double* vb_out) {
  const OptimizerState& st = item.state;
  const float* stats = item.stats;
  const float a = stats[kStatNextAmax];
  if (!(a >= 0.0f && a <= kFltMax)) {
    FailBound(rep, step_ws::kQWeight, static_cast<double>(a));
    return false;
  }
  const bool has_r = item.residual != nullptr;
  const double g = plan->gmax;
  const double dold = 2688.0 * static_cast<double>(1.0f / plan->s_enc_old);
  const double r = has_r ? static_cast<double>(stats[kStatMaxResidual]) : 0.0;
  const double p = dold + r;
  const double s1 = stats[kStatMaxMoment1];
  const double s2 = stats[kStatMaxSqrtMoment2];
  if (!BelowLimit(g)) {
    FailBound(rep, step_ws::kQUpdateSum, g);
    return false;
  }
  double xb;
  if (item.kind == UpdateKind::kDelta) {
    xb = dold + g;
  } else if (!IsAdamW(st)) {
    const double gp = g + static_cast<double>(s.wd) * p;
    double gpp = gp;
    if (st.momentum) {
      const double mu = std::fabs(static_cast<double>(s.mu));
      double b = gp;
      if (s.t != 1) b = mu * s1 + std::fabs(static_cast<double>(s.cd)) * gp;
      if (!BelowLimit(b)) {
        FailBound(rep, step_ws::kQMoment1, b);
        return false;
      }
      gpp = item.hyper.nesterov ? gp + mu * b : b;
    }
    xb = dold + std::fabs(static_cast<double>(s.lr)) * gpp;
  } else {
    const double m = static_cast<double>(s.b1) * s1 + static_cast<double>(s.c1) * g;
    if (!BelowLimit(m)) {
      FailBound(rep, step_ws::kQMoment1, m);
      return false;
    }
    const double v = static_cast<double>(s.b2) * (s2 * s2) + static_cast<double>(s.c2) * (g * g);
    if (!BelowLimit(v)) {
      FailBound(rep, step_ws::kQMoment2, v);
      return false;
    }
    const double decay = static_cast<double>(s.lr) * static_cast<double>(s.wd) * p;
    xb = dold + decay + static_cast<double>(s.alpha) * m / static_cast<double>(s.eps);
  }
  if (!BelowLimit(xb)) {
    FailBound(rep, step_ws::kQWeight, xb);
    return false;
  }
  const double vb = xb + r;
  if (!BelowLimit(vb)) {
    FailBound(rep, step_ws::kQWeight, vb);
    return false;
  }
  *vb_out = vb;

  plan->amax = a;
  // 10.5: the NVFP4 moments' amaxes from the bounds, in f32.
  const float gm = plan->gmax;
  if (IsAdamW(st)) {
    const float m_kept = s.b1 * stats[kStatMaxMoment1];
    const float m_added = s.c1 * gm;
    plan->m_amax[0] = m_kept + m_added;
    const float sq = stats[kStatMaxSqrtMoment2] * stats[kStatMaxSqrtMoment2];
    const float v_kept = s.b2 * sq;
    const float cg = s.c2 * gm;
    const float v_added = cg * gm;
    const float v_sum = v_kept + v_added;
    plan->m_amax[1] = std::sqrt(v_sum);
    const float prev = stats[kStatMaxSqrtMaxMoment2];
    plan->m_amax[2] = prev > plan->m_amax[1] ? prev : plan->m_amax[1];
  } else if (st.momentum) {
    if (s.t == 1) {
      plan->m_amax[0] = gm;
    } else {
      const float kept = std::fabs(s.mu) * stats[kStatMaxMoment1];
      const float added = std::fabs(s.cd) * gm;
      plan->m_amax[0] = kept + added;
    }
  }
  return true;
}

void CheckItem(const StepItem& item, ReportPod* rep, uint64_t* fingerprints, Plan* plan) {
  *rep = ReportPod{step_ws::kOk, step_ws::kQNone, -1, 0, -1, 0.0f, 0.0f, 0.0};
  *plan = Plan{};
  const size_t k_count = item.updates.size();
  for (size_t k = 0; k < k_count; ++k) fingerprints[k] = UpdateFingerprint(item.updates[k]);
  if (item.check_only) {  // 10.4.5: only the fingerprints
    for (size_t k = 0; k < k_count; ++k) {
      if (fingerprints[k] != item.expect_fingerprints[k]) {
        Fail(rep, step_ws::kFingerprintMismatch, step_ws::kQNone);
        rep->rank = static_cast<int32_t>(k);
        return;
      }
    }
    return;
  }
  const StepScalars s = ComputeStepScalars(item.hyper, static_cast<int>(k_count));
  // 10.4.1: every update element finite (the first rank with a fault, its first index).
  const std::vector<Matrix> u = LoadUpdates(item);
  for (size_t k = 0; k < k_count; ++k) {
    for (size_t i = 0; i < u[k].values.size(); ++i) {
      if (!Finite(u[k].values[i])) {
        FailAt(rep, step_ws::kNonFiniteUpdate, step_ws::kQNone, static_cast<int64_t>(i),
               u[k].values[i]);
        rep->rank = static_cast<int32_t>(k);
        return;
      }
    }
  }
  // 10.4.2: the rank sum / mean finite; its max.
  const Matrix g = UpdateSum(u, s.k);
  float gmax = 0.0f;
  for (size_t i = 0; i < g.values.size(); ++i) {
    if (!Finite(g.values[i])) {
      FailAt(rep, step_ws::kNonFiniteResult, step_ws::kQUpdateSum, static_cast<int64_t>(i),
             g.values[i]);
      return;
    }
    gmax = std::fmax(gmax, std::fabs(g.values[i]));
  }
  plan->gmax = gmax;
  plan->s_enc_old = item.weight.global[1];
  const OptimizerState& st = item.state;
  const MomentTensor* moments[3] = {&st.moment1, &st.moment2, &st.max_moment2};
  for (int j = 0; j < 3; ++j) {
    plan->m_senc_old[j] = 1.0f;
    if (st.dtype == StateDType::kNvfp4 && moments[j]->present()) {
      plan->m_senc_old[j] = moments[j]->quantized.global[1];
    }
  }
  // 10.4.3.
  double vbound = 0.0;
  if (item.scaling == Scaling::kCurrent) {
    if (!CheckCurrent(item, s, LoadItem(item, u, s), rep, plan)) return;
    vbound = plan->amax;
  } else {
    if (!CheckDelayed(item, s, rep, plan, &vbound)) return;
  }
  for (int j = 0; j < 3; ++j) plan->m_senc_new[j] = GlobalEncodeScale(2688.0f, plan->m_amax[j]);
  // 10.4.4: the dequantized range of the new weight, and the residual's.
  const float a = plan->amax;
  plan->s_enc = GlobalEncodeScale(2688.0f, a);
  rep->amax = a;
  const double dmax = 2688.0 * static_cast<double>(GlobalDecodeScale(plan->s_enc));
  bool bf16_out = false;
  for (const MutTensor& o : item.dequantized_out) {
    bf16_out = bf16_out || (o.data != nullptr && o.dtype == DType::kBF16);
  }
  if (!BelowLimit(dmax)) {
    FailBound(rep, step_ws::kQWeight, dmax);
    return;
  }
  if (bf16_out && !(dmax < step_ws::kBf16Max)) {
    FailBound(rep, step_ws::kQDequantized, dmax);
    return;
  }
  if (item.residual != nullptr) {
    const double rb = 2.0 * (vbound > dmax ? vbound : dmax);
    if (!BelowLimit(rb)) {
      FailBound(rep, step_ws::kQResidual, rb);
      return;
    }
  }
}

// ---------------------------------------------------------------- the apply of one item

void ApplyItem(const StepItem& item, const Plan& plan) {
  const StepScalars s = ComputeStepScalars(item.hyper, static_cast<int>(item.updates.size()));
  const ItemData data = LoadItem(item, LoadUpdates(item), s);  // every read before any write
  const int64_t rows = item.weight.rows, cols = item.weight.cols;
  const size_t n = static_cast<size_t>(rows * cols);
  const OptimizerState& st = item.state;
  Matrix v(rows, cols);
  // The new optimizer state, of the moments the item keeps.
  std::vector<float> m1(HasMoment1(st) ? n : 0), v2(IsAdamW(st) ? n : 0);
  std::vector<float> vm(IsAdamW(st) && st.amsgrad ? n : 0);
  for (size_t i = 0; i < n; ++i) {
    const ElemOut e = StepElement(item, s, InputAt(data, i));
    v.values[i] = e.v;
    if (!m1.empty()) m1[i] = e.m1;
    if (!v2.empty()) v2[i] = e.v2;
    if (!vm.empty()) vm[i] = e.vm;
  }
  // Q: the new weight with the planned amax; R: the residual; O: the dequantized outputs.
  const ElementRounding rounding{item.rounding, item.seed, item.step};
  const HostQuantized q =
      QuantizeNvfp4(v, item.weight.block, plan.amax, ScaleSelection::kMapTo6, 256.0f, rounding);
  const Matrix dq = DequantizeHost(q);
  // In place, or a one-pass step's next state (StepNext).
  QuantizedTensor w_out = item.weight;
  float* r_out = item.residual;
  float* stats = item.stats;
  if (item.next.present()) {
    w_out.codes = item.next.codes;
    w_out.scales = item.next.scales;
    w_out.global = item.next.global;
    r_out = item.next.residual;
    stats = item.next.stats;
  }
  StoreQuantized(q, w_out);
  std::vector<float> r(n, 0.0f);
  if (r_out != nullptr) {
    for (size_t i = 0; i < n; ++i) r[i] = v.values[i] - dq.values[i];
    std::memcpy(r_out, r.data(), n * sizeof(float));
  }
  for (const MutTensor& o : item.dequantized_out) {
    if (o.data != nullptr) StoreDense(dq, o);
  }
  // The optimizer state (10.5).
  if (HasMoment1(st)) StoreMoment(st.moment1, st.dtype, rows, cols, m1, false, plan.m_amax[0]);
  if (IsAdamW(st)) StoreMoment(st.moment2, st.dtype, rows, cols, v2, true, plan.m_amax[1]);
  if (IsAdamW(st) && st.amsgrad) {
    StoreMoment(st.max_moment2, st.dtype, rows, cols, vm, true, plan.m_amax[2]);
  }
  // S: the statistics.
  if (stats != nullptr) {
    if (stats != item.stats) std::memcpy(stats, item.stats, kStepStatFloats * sizeof(float));
    stats[kStatNextAmax] = AbsMax(v.values.data(), n);
    stats[kStatMaxResidual] = AbsMax(r.data(), n);
    if (HasMoment1(st)) stats[kStatMaxMoment1] = AbsMax(m1.data(), n);
    const auto max_sqrt = [](const std::vector<float>& m) {
      float x = 0.0f;
      for (const float e : m) x = std::fmax(x, std::sqrt(e));
      return x;
    };
    if (IsAdamW(st)) stats[kStatMaxSqrtMoment2] = max_sqrt(v2);
    if (IsAdamW(st) && st.amsgrad) stats[kStatMaxSqrtMaxMoment2] = max_sqrt(vm);
  }
}

// The items' element counts: the check and the apply run items in parallel (parallel.h), each
// item's work as on one thread.
std::vector<int64_t> ItemSizes(const std::vector<StepItem>& items) {
  std::vector<int64_t> sizes;
  sizes.reserve(items.size());
  for (const StepItem& it : items) sizes.push_back(it.weight.rows * it.weight.cols);
  return sizes;
}

}  // namespace

uint64_t UpdateFingerprint(const ConstTensor& u) {
  // The tensor's bytes as little-endian 64-bit words (four bf16 or two f32 elements each; a
  // tensor has a multiple of 16 elements, so whole words).
  const uint64_t words = static_cast<uint64_t>(u.rows * u.cols) * DTypeSize(u.dtype) / 8;
  const auto* bytes = static_cast<const uint8_t*>(u.data);
  uint64_t sum = 0;
  for (uint64_t j = 0; j < words; ++j) {
    uint64_t w = 0;
    for (int b = 7; b >= 0; --b) w = (w << 8) | bytes[8 * j + static_cast<uint64_t>(b)];
    sum += Mix64(j * 0x9E3779B97F4A7C15ull + w);
  }
  const uint64_t c = u.dtype == DType::kF32 ? 1 : 2;
  const uint64_t shape =
      (c << 56) ^ (static_cast<uint64_t>(u.rows) << 28) ^ static_cast<uint64_t>(u.cols);
  return Mix64(sum ^ Mix64(shape));
}

void StepCheckHost(const std::vector<StepItem>& items, uint8_t* workspace,
                   const StepCancel& cancel) {
  const step_ws::Layout layout = StepLayoutOf(items);
  auto* reports = reinterpret_cast<ReportPod*>(workspace + layout.reports);
  auto* fingerprints = reinterpret_cast<uint64_t*>(workspace + layout.fingerprints);
  auto* plans = reinterpret_cast<Plan*>(workspace + layout.plans);
  std::vector<size_t> first_fp(items.size());
  size_t fp = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    first_fp[i] = fp;
    fp += items[i].updates.size();
  }
  ForEachPiece(ItemSizes(items), [&](size_t i) {
    CheckItem(items[i], &reports[i], fingerprints + first_fp[i], &plans[i]);
  });
  bool ok = true;
  for (size_t i = 0; i < items.size(); ++i) ok = ok && reports[i].outcome == step_ws::kOk;
  step_ws::Header header{};
  if (cancel.word != nullptr &&
      __atomic_load_n(cancel.word, __ATOMIC_ACQUIRE) == cancel.token) {
    header.cancelled = 1;
    ok = false;
  }
  header.ok = ok ? 1 : 0;
  header.checked = step_ws::kCheckedMagic;
  header.n_items = static_cast<int32_t>(items.size());
  header.n_updates = static_cast<int32_t>(fp);
  std::memcpy(workspace, &header, sizeof(header));
}

absl::Status StepApplyHost(const std::vector<StepItem>& items, uint8_t* workspace) {
  step_ws::Header header;
  std::memcpy(&header, workspace, sizeof(header));
  if (header.checked != step_ws::kCheckedMagic ||
      header.n_items != static_cast<int32_t>(items.size())) {
    return absl::FailedPreconditionError(
        absl::StrCat("workspace: no StepCheck of these ", items.size(), " items ran on it"));
  }
  if (header.ok != 1) return absl::OkStatus();  // the check refused the batch: nothing changes
  const step_ws::Layout layout = StepLayoutOf(items);
  const auto* plans = reinterpret_cast<const Plan*>(workspace + layout.plans);
  ForEachPiece(ItemSizes(items), [&](size_t i) {
    if (!items[i].check_only) ApplyItem(items[i], plans[i]);
  });
  return absl::OkStatus();
}

absl::Status StepOnePassHost(const std::vector<StepItem>& items, uint8_t* workspace,
                             const StepCancel& cancel) {
  // The same check and report as two passes; the CPU reads the updates twice, which changes no
  // result. Applied: the new state goes to each item's StepNext. Refused: the outputs get DQ(W)
  // of the unchanged weights, as after the CUDA backend's one pass; cancelled, nothing is
  // written (the CUDA backend's apply did not start, or its restore rewrites what it wrote).
  StepCheckHost(items, workspace, cancel);
  step_ws::Header header;
  std::memcpy(&header, workspace, sizeof(header));
  if (header.ok == 1) return StepApplyHost(items, workspace);
  if (header.cancelled == 1) return absl::OkStatus();
  for (const StepItem& item : items) {
    const Matrix dq = DequantizeHost(LoadQuantized(AsConst(item.weight)));
    for (const MutTensor& o : item.dequantized_out) {
      if (o.data != nullptr) StoreDense(dq, o);
    }
  }
  return absl::OkStatus();
}

}  // namespace fp4q::kernels::cpu
