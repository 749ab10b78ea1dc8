// The apply kernels of SGD items (plain, and with a momentum buffer in each state dtype), RTN and
// SR, 1x16 and 16x16 weights: instantiations of step_apply.cuh (kernel, budget and mapping
// there).
#include "step_apply.cuh"
#include "step_launch.h"

namespace fp4q::kernels::cuda {
namespace {

__global__ void ModuleAnchorKernel() {}  // names this file's CUDA module (StepApplySgdModule)

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

const void* StepApplySgdModule() { return reinterpret_cast<const void*>(&ModuleAnchorKernel); }

}  // namespace fp4q::kernels::cuda
