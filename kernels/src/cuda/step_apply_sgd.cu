// The apply kernels of SGD items (plain, and with a momentum buffer in each state dtype), RTN and
// SR, 1x16 and 16x16 weights: instantiations of step_apply.cuh (kernel, budget and mapping
// there); the one-pass lean apply and its refusal's restore of the outputs.
#include "step_apply.cuh"
#include "step_launch.h"

namespace fp4q::kernels::cuda {
namespace {

__global__ void ModuleAnchorKernel() {}  // names this file's CUDA module (StepApplySgdModule)

// A refused one-pass step whose apply ran (a cancelled one may not have): every item's output
// gets DQ(W) of its unchanged weight (codes, scales and record in place), eight elements a lane
// in the lean run's slot mapping.
__global__ void __launch_bounds__(step_dev::kThreads) StepRestoreOutputsKernel(const StepKernelArgs a) {
  using namespace step_dev;  // NOLINT
  StepGridEnter();
  if (a.header->checked == step_ws::kCheckedMagic && a.header->ok == 1) return;
  if (a.header->one_pass_ran != 1) return;  // no apply wrote an output
  const int lane = threadIdx.x & 31;
  const WarpSlots run = WarpSlotsOf(a.total_units);
  int e = 0;
  for (int64_t s = run.begin; s < run.end;) {
    e = Advance(a.list, a.n_entries, e, s >> 1);
    const step_ws::ItemDesc& d = a.descs[a.list[e].item];
    const int64_t s0 = 2 * a.list[e].unit_begin;
    const int64_t item_end = 2 * a.list[e + 1].unit_begin;
    const int64_t run_end = item_end < run.end ? item_end : run.end;
    if (d.n_outs == 0) {
      s = run_end;
      continue;
    }
    const float s_dec = __frcp_rn(d.global[1]);
    for (int64_t t = s; t < run_end; ++t) {
      const int64_t at = (t - s0) * 256 + 8 * lane;
      if (at >= d.n) continue;
      float dq[8];
      DqWord8(*reinterpret_cast<const uint32_t*>(d.codes + (at >> 1)),
              E4M3Value(d.scales[at >> 4]), s_dec, dq);
      for (int k = 0; k < d.n_outs; ++k) {  // one output today (OnePassItem); every one
        const step_ws::OutDesc o = a.outs[d.first_out + k];
        if (o.dtype == kF32) {
          float* p = static_cast<float*>(o.data) + at;
          StoreV4(p, dq[0], dq[1], dq[2], dq[3]);
          StoreV4(p + 4, dq[4], dq[5], dq[6], dq[7]);
        } else {
          StoreV4(static_cast<uint16_t*>(o.data) + at, PackBf16x2(dq[0], dq[1]),
                  PackBf16x2(dq[2], dq[3]), PackBf16x2(dq[4], dq[5]), PackBf16x2(dq[6], dq[7]));
        }
      }
    }
    s = run_end;
  }
}

}  // namespace

cudaError_t LaunchStepApplySgd(const StepKernelArgs& a, int opt, int state_dtype, bool sr,
                               bool tile16, cudaStream_t s) {
  using namespace step_dev;  // NOLINT
  if (opt == step_ws::kOptSgdPlain) {
    return LaunchApplyRounding<step_ws::kOptSgdPlain, step_ws::kStF32>(a, sr, tile16, s);
  }
  if (opt == step_ws::kOptSgdMomentum) {
    return LaunchApplyState<step_ws::kOptSgdMomentum>(a, state_dtype, sr, tile16, s);
  }
  return cudaErrorInvalidValue;
}

cudaError_t LaunchStepApplySgdLean(const StepKernelArgs& a, bool sr, cudaStream_t s) {
  using namespace step_dev;  // NOLINT
  return sr ? LaunchApplyLean<true>(a, s) : LaunchApplyLean<false>(a, s);
}

cudaError_t LaunchStepApplySgdOnePass(const StepOnePassArgs& a, bool sr, cudaStream_t s) {
  using namespace step_dev;  // NOLINT
  return sr ? LaunchApplyOnePass<true>(a, s) : LaunchApplyOnePass<false>(a, s);
}

cudaError_t LaunchStepRestoreOutputs(const StepKernelArgs& a, cudaStream_t s) {
  using namespace step_dev;  // NOLINT
  static std::atomic<int> resident[kMaxStepDevices];
  return LaunchStepGrid(StepRestoreOutputsKernel, 0, resident, a, s);
}

const void* StepApplySgdModule() { return reinterpret_cast<const void*>(&ModuleAnchorKernel); }

}  // namespace fp4q::kernels::cuda
