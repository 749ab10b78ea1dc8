// The decision of an optimizer step (NUMERICS 10.4, 10.6) and the apply's epilogue, as work of
// one CTA: per item the outcome (the first failing check in the order of 10.4, the value at the
// first index recomputed from the inputs), the bounds of 10.6 in double, the plan of the apply,
// the fingerprints and the batch flag (DecideBatch); then, for an accepted batch, the global
// records and statistics (FinishBatch). The decide and finish kernels (step_check.cu) are one
// call each; a one-pass step's apply runs both in the CTA that finishes its work last
// (step_apply.cuh), which saves their launches.
//
// The accumulators these read were written by other CTAs' atomics: the replica reductions read
// them through L2 (step_device.cuh's MinCopies, SumCopies, MaxCopies).
#ifndef FP4Q_KERNELS_SRC_CUDA_STEP_DECIDE_CUH_
#define FP4Q_KERNELS_SRC_CUDA_STEP_DECIDE_CUH_

#include <cuda_runtime.h>

#include <cfloat>

#include "step_device.cuh"
#include "step_launch.h"

namespace fp4q::kernels::cuda::step_dev {

using step_ws::Plan;
using step_ws::ReportPod;

FP4Q_D float UpdateAt(const step_ws::UpdateDesc& u, int64_t i) {
  if (u.dtype == kF32) return static_cast<const float*>(u.data)[i];
  return Bf16Lo(static_cast<const uint16_t*>(u.data)[i]);
}

// g at element i: the rank sum in order, divided by K when K > 1.
FP4Q_D float GAt(const StepDecideArgs& a, const ItemDesc& d, int64_t i) {
  float g = UpdateAt(a.updates[d.first_update], i);
  for (int k = 1; k < d.n_updates; ++k)
    g = __fadd_rn(g, UpdateAt(a.updates[d.first_update + k], i));
  if (d.n_updates > 1) g = __fdiv_rn(g, d.kf);
  return g;
}

// The whole recurrence at element i (for the value of a first non-finite index).
template <int kOpt, int kSt>
FP4Q_D Elem ElementAt(const StepDecideArgs& a, const ItemDesc& d, const Plan& plan, int64_t i) {
  const Scalars s = LoadScalars(d);
  const int64_t sc = d.cols >> 4;
  const int64_t row = i / d.cols;
  const int64_t cb = (i - row * d.cols) >> 4;
  const uint8_t byte = d.codes[i >> 1];
  const uint32_t code = (i & 1) ? (byte >> 4) : (byte & 0xFu);
  const float sfv = E4M3Value(d.scales[ScaleOffset(row, cb, sc, d.swizzled != 0)]);
  const float dq = __fmul_rn(__fmul_rn(E2M1Value(code), sfv), __frcp_rn(plan.s_enc_old));
  const float r = s.has_r ? d.residual[i] : 0.0f;
  float m1 = 0.0f, m2 = 0.0f, mm2 = 0.0f;
  if (HasM1<kOpt>() && !(kOpt == step_ws::kOptSgdMomentum && s.t1)) {
    m1 = MomentAt<kSt>(d, 0, __frcp_rn(plan.m_senc_old[0]), i, false);
  }
  if (IsAdamW<kOpt>()) m2 = MomentAt<kSt>(d, 1, __frcp_rn(plan.m_senc_old[1]), i, true);
  if (HasMm2<kOpt>()) mm2 = MomentAt<kSt>(d, 2, __frcp_rn(plan.m_senc_old[2]), i, true);
  return StepElement<kOpt>(s, GAt(a, d, i), dq, r, m1, m2, mm2);
}

template <int kOpt>
FP4Q_D Elem ElementAtOpt(const StepDecideArgs& a, const ItemDesc& d, const Plan& plan, int64_t i) {
  switch (d.state_dtype) {
    case step_ws::kStBF16:
      return ElementAt<kOpt, step_ws::kStBF16>(a, d, plan, i);
    case step_ws::kStNvfp4:
      return ElementAt<kOpt, step_ws::kStNvfp4>(a, d, plan, i);
    default:
      return ElementAt<kOpt, step_ws::kStF32>(a, d, plan, i);
  }
}

FP4Q_D Elem ElementAtAny(const StepDecideArgs& a, const ItemDesc& d, const Plan& plan, int64_t i) {
  switch (d.opt) {
    case step_ws::kOptSgdMomentum:
      return ElementAtOpt<step_ws::kOptSgdMomentum>(a, d, plan, i);
    case step_ws::kOptAdamW:
      return ElementAtOpt<step_ws::kOptAdamW>(a, d, plan, i);
    case step_ws::kOptAdamWAmsgrad:
      return ElementAtOpt<step_ws::kOptAdamWAmsgrad>(a, d, plan, i);
    default:
      return ElementAt<step_ws::kOptSgdPlain, step_ws::kStF32>(a, d, plan, i);
  }
}

FP4Q_D void FailAt(ReportPod* r, int32_t outcome, int32_t quantity, int64_t index, float value) {
  r->outcome = outcome;
  r->quantity = quantity;
  r->index = index;
  r->value = value;
}

FP4Q_D void FailBound(ReportPod* r, int32_t quantity, double bound) {
  r->outcome = step_ws::kOutOfRange;
  r->quantity = quantity;
  r->bound = bound;
}

FP4Q_D bool BelowLimit(double b) { return b < step_ws::kTwoPow127; }

// NUMERICS 10.6 and 10.5 under delayed scaling (the CPU reference's CheckDelayed, operation
// for operation, in double).
FP4Q_D bool DecideDelayed(const ItemDesc& d, ReportPod* rep, Plan* plan, double* vb_out) {
  const float* stats = d.stats;
  const float a = stats[0];
  if (!(a >= 0.0f && a <= FLT_MAX)) {
    FailBound(rep, step_ws::kQWeight, static_cast<double>(a));
    return false;
  }
  const bool has_r = d.residual != nullptr;
  const double g = plan->gmax;
  const double dold = __dmul_rn(2688.0, static_cast<double>(__frcp_rn(plan->s_enc_old)));
  const double r = has_r ? static_cast<double>(stats[1]) : 0.0;
  const double p = __dadd_rn(dold, r);
  const double s1 = stats[2];
  const double s2 = stats[3];
  if (!BelowLimit(g)) {
    FailBound(rep, step_ws::kQUpdateSum, g);
    return false;
  }
  const bool adamw = d.opt == step_ws::kOptAdamW || d.opt == step_ws::kOptAdamWAmsgrad;
  double xb;
  if (d.delta) {
    xb = __dadd_rn(dold, g);
  } else if (!adamw) {
    const double gp = __dadd_rn(g, __dmul_rn(static_cast<double>(d.wd), p));
    double gpp = gp;
    if (d.opt == step_ws::kOptSgdMomentum) {
      const double mu = fabs(static_cast<double>(d.mu));
      double b = gp;
      if (d.t != 1)
        b = __dadd_rn(__dmul_rn(mu, s1), __dmul_rn(fabs(static_cast<double>(d.cd)), gp));
      if (!BelowLimit(b)) {
        FailBound(rep, step_ws::kQMoment1, b);
        return false;
      }
      gpp = d.nesterov ? __dadd_rn(gp, __dmul_rn(mu, b)) : b;
    }
    xb = __dadd_rn(dold, __dmul_rn(fabs(static_cast<double>(d.lr)), gpp));
  } else {
    const double m = __dadd_rn(__dmul_rn(static_cast<double>(d.b1), s1),
                               __dmul_rn(static_cast<double>(d.c1), g));
    if (!BelowLimit(m)) {
      FailBound(rep, step_ws::kQMoment1, m);
      return false;
    }
    const double v = __dadd_rn(__dmul_rn(static_cast<double>(d.b2), __dmul_rn(s2, s2)),
                               __dmul_rn(static_cast<double>(d.c2), __dmul_rn(g, g)));
    if (!BelowLimit(v)) {
      FailBound(rep, step_ws::kQMoment2, v);
      return false;
    }
    const double decay =
        __dmul_rn(__dmul_rn(static_cast<double>(d.lr), static_cast<double>(d.wd)), p);
    xb = __dadd_rn(__dadd_rn(dold, decay), __ddiv_rn(__dmul_rn(static_cast<double>(d.alpha), m),
                                                     static_cast<double>(d.eps)));
  }
  if (!BelowLimit(xb)) {
    FailBound(rep, step_ws::kQWeight, xb);
    return false;
  }
  const double vb = __dadd_rn(xb, r);
  if (!BelowLimit(vb)) {
    FailBound(rep, step_ws::kQWeight, vb);
    return false;
  }
  *vb_out = vb;
  plan->amax = a;
  const float gm = plan->gmax;
  if (adamw) {
    plan->m_amax[0] = __fadd_rn(__fmul_rn(d.b1, stats[2]), __fmul_rn(d.c1, gm));
    const float sq = __fmul_rn(stats[3], stats[3]);
    const float v_sum = __fadd_rn(__fmul_rn(d.b2, sq), __fmul_rn(__fmul_rn(d.c2, gm), gm));
    plan->m_amax[1] = __fsqrt_rn(v_sum);
    const float prev = stats[4];
    plan->m_amax[2] = prev > plan->m_amax[1] ? prev : plan->m_amax[1];
  } else if (d.opt == step_ws::kOptSgdMomentum) {
    plan->m_amax[0] =
        d.t == 1 ? gm : __fadd_rn(__fmul_rn(fabsf(d.mu), stats[2]), __fmul_rn(fabsf(d.cd), gm));
  }
  return true;
}

FP4Q_D void DecideItem(const StepDecideArgs& a, int i, ReportPod* rep, Plan* plan) {
  const ItemDesc& d = a.descs[i];
  const int64_t u0 = d.first_update;
  const uint64_t code_shape = (static_cast<uint64_t>(d.rows) << 28) ^ static_cast<uint64_t>(d.cols);
  for (int k = 0; k < d.n_updates; ++k) {
    const uint64_t sum = SumCopies(a.fp_acc + (u0 + k) * step_ws::kAccCopies);
    const uint64_t c = a.updates[u0 + k].dtype == kF32 ? 1 : 2;
    a.fingerprints[u0 + k] = Mix64(sum ^ Mix64((c << 56) ^ code_shape));
  }
  if (d.check_only) {
    for (int k = 0; k < d.n_updates; ++k) {
      if (a.fingerprints[u0 + k] != a.updates[u0 + k].expect) {
        rep->outcome = step_ws::kFingerprintMismatch;
        rep->rank = k;
        return;
      }
    }
    return;
  }
  for (int k = 0; k < d.n_updates; ++k) {
    const uint64_t idx = MinCopies(a.upd_idx_acc + (u0 + k) * step_ws::kAccCopies);
    if (idx != kNone) {
      FailAt(rep, step_ws::kNonFiniteUpdate, step_ws::kQNone, static_cast<int64_t>(idx),
             UpdateAt(a.updates[u0 + k], static_cast<int64_t>(idx)));
      rep->rank = k;
      return;
    }
  }
  const uint64_t* idx_acc =
      a.idx_acc + static_cast<int64_t>(i) * step_ws::kIdxSlots * step_ws::kAccCopies;
  const uint32_t* max_acc =
      a.max_acc + static_cast<int64_t>(i) * step_ws::kMaxSlots * step_ws::kAccCopies;
  const uint64_t gbad = MinCopies(idx_acc + step_ws::kIdxG * step_ws::kAccCopies);
  if (gbad != kNone) {
    FailAt(rep, step_ws::kNonFiniteResult, step_ws::kQUpdateSum, static_cast<int64_t>(gbad),
           GAt(a, d, static_cast<int64_t>(gbad)));
    return;
  }
  plan->gmax = MaxCopies(max_acc + step_ws::kMaxG * step_ws::kAccCopies);
  plan->s_enc_old = d.global[1];
  for (int j = 0; j < 3; ++j) {
    plan->m_senc_old[j] =
        (d.state_dtype == step_ws::kStNvfp4 && d.m_global[j] != nullptr) ? d.m_global[j][1] : 1.0f;
  }
  double vbound = 0.0;
  if (!d.delayed) {
    const int slots[3] = {step_ws::kIdxM1, step_ws::kIdxM2, step_ws::kIdxW};
    const int32_t quantity[3] = {step_ws::kQMoment1, step_ws::kQMoment2, step_ws::kQWeight};
    for (int q = 0; q < 3; ++q) {
      const uint64_t bad = MinCopies(idx_acc + slots[q] * step_ws::kAccCopies);
      if (bad == kNone) continue;
      const Elem el = ElementAtAny(a, d, *plan, static_cast<int64_t>(bad));
      const float value = q == 0   ? el.m1
                          : q == 1 ? (!Finite(el.v2) ? el.v2 : el.vm)
                                   : (!Finite(el.x) ? el.x : el.v);
      FailAt(rep, step_ws::kNonFiniteResult, quantity[q], static_cast<int64_t>(bad), value);
      return;
    }
    plan->amax = MaxCopies(max_acc + step_ws::kMaxV * step_ws::kAccCopies);
    plan->m_amax[0] = MaxCopies(max_acc + step_ws::kMaxM1 * step_ws::kAccCopies);
    plan->m_amax[1] = MaxCopies(max_acc + step_ws::kMaxS2 * step_ws::kAccCopies);
    plan->m_amax[2] = MaxCopies(max_acc + step_ws::kMaxSvm * step_ws::kAccCopies);
    vbound = plan->amax;
  } else if (!DecideDelayed(d, rep, plan, &vbound)) {
    return;
  }
  for (int j = 0; j < 3; ++j) plan->m_senc_new[j] = SEncOf(plan->m_amax[j], 2688.0f);
  // 10.4.4.
  plan->s_enc = SEncOf(plan->amax, 2688.0f);
  rep->amax = plan->amax;
  const double dmax = __dmul_rn(2688.0, static_cast<double>(__frcp_rn(plan->s_enc)));
  if (!BelowLimit(dmax)) {
    FailBound(rep, step_ws::kQWeight, dmax);
    return;
  }
  if (d.bf16_out && !(dmax < step_ws::kBf16Max)) {
    FailBound(rep, step_ws::kQDequantized, dmax);
    return;
  }
  if (d.residual != nullptr) {
    const double rb = __dmul_rn(2.0, vbound > dmax ? vbound : dmax);
    if (!BelowLimit(rb)) FailBound(rep, step_ws::kQResidual, rb);
  }
}

// Every item's report, plan and fingerprints, and the header's batch flag. Called by every
// thread of one CTA of kThreads threads; returns the flag, the same in each.
FP4Q_D bool DecideBatch(const StepDecideArgs& a) {
  bool ok = true;
  for (int i = threadIdx.x; i < a.n_items; i += kThreads) {
    ReportPod rep{step_ws::kOk, step_ws::kQNone, -1, 0, -1, 0.0f, 0.0f, 0.0};
    Plan plan{};
    for (int j = 0; j < 3; ++j) plan.m_senc_old[j] = 1.0f;
    DecideItem(a, i, &rep, &plan);
    a.reports[i] = rep;
    a.plans[i] = plan;
    ok = ok && rep.outcome == step_ws::kOk;
  }
  // Read once the items are decided, as late as the CTA can: a cancellation written meanwhile
  // (the host timed out a ready signal the queued waits then saw) still refuses the batch.
  const bool cancelled =
      __syncthreads_or(a.cancel_word != nullptr &&
                       *static_cast<const volatile uint32_t*>(a.cancel_word) ==
                           a.cancel_token) != 0;
  ok = __syncthreads_and(ok && !cancelled) != 0;
  if (threadIdx.x == 0) {  // the fields it decides (QueueTable zeroed the header; a one-pass
                           // apply may have set one_pass_ran, which the restore reads)
    step_ws::Header* h = a.header;
    h->cancelled = cancelled ? 1 : 0;
    h->ok = ok ? 1 : 0;
    h->checked = step_ws::kCheckedMagic;
    h->n_items = a.n_items;
    h->n_updates = a.n_updates;
  }
  return ok;
}

// An accepted batch's global records of the weights and NVFP4 moments, and its statistics, from
// the plans DecideBatch wrote (the same thread wrote item i's) and the apply's maxima. Called by
// every thread of one CTA, after the batch was accepted.
FP4Q_D void FinishBatch(const StepFinishArgs& a) {
  for (int i = threadIdx.x; i < a.n_items; i += kThreads) {
    const ItemDesc& d = a.descs[i];
    if (d.check_only) continue;
    const Plan& plan = a.plans[i];
    d.global_next[0] = plan.amax;
    d.global_next[1] = plan.s_enc;
    if (d.state_dtype == step_ws::kStNvfp4) {
      for (int j = 0; j < 3; ++j) {
        if (d.m_global[j] == nullptr) continue;
        d.m_global[j][0] = plan.m_amax[j];
        d.m_global[j][1] = plan.m_senc_new[j];
      }
    }
    if (d.stats == nullptr) continue;
    const uint32_t* m =
        a.max_acc + static_cast<int64_t>(i) * step_ws::kMaxSlots * step_ws::kAccCopies;
    float* stats = d.stats_next;  // a one-pass step's: the others carried over first
    if (stats != d.stats) {
      for (int k = 0; k < step_ws::kStatFloats; ++k) stats[k] = d.stats[k];
    }
    stats[0] = MaxCopies(m + step_ws::kMaxApplyV * step_ws::kAccCopies);
    stats[1] =
        d.residual != nullptr ? MaxCopies(m + step_ws::kMaxApplyR * step_ws::kAccCopies) : 0.0f;
    if (d.opt != step_ws::kOptSgdPlain) {
      stats[2] = MaxCopies(m + step_ws::kMaxApplyM1 * step_ws::kAccCopies);
    }
    if (d.opt == step_ws::kOptAdamW || d.opt == step_ws::kOptAdamWAmsgrad) {
      stats[3] = MaxCopies(m + step_ws::kMaxApplyS2 * step_ws::kAccCopies);
    }
    if (d.opt == step_ws::kOptAdamWAmsgrad) {
      stats[4] = MaxCopies(m + step_ws::kMaxApplySvm * step_ws::kAccCopies);
    }
  }
}

}  // namespace fp4q::kernels::cuda::step_dev

#endif  // FP4Q_KERNELS_SRC_CUDA_STEP_DECIDE_CUH_
