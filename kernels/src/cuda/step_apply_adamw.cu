// The apply kernels of AdamW items (with and without amsgrad, moments in each state dtype), RTN
// and SR, 1x16 and 16x16 weights: instantiations of step_apply.cuh (kernel, budget and mapping
// there).
#include "step_apply.cuh"
#include "step_launch.h"

namespace fp4q::kernels::cuda {
namespace {

__global__ void ModuleAnchorKernel() {}  // names this file's CUDA module (StepApplyAdamWModule)

}  // namespace

cudaError_t LaunchStepApplyAdamW(const StepKernelArgs& a, int opt, int state_dtype, bool sr,
                                 bool tile16, cudaStream_t s) {
  using namespace step_dev;  // NOLINT
  if (opt == step_ws::kOptAdamW) {
    return LaunchApplyState<step_ws::kOptAdamW>(a, state_dtype, sr, tile16, s);
  }
  if (opt == step_ws::kOptAdamWAmsgrad) {
    return LaunchApplyState<step_ws::kOptAdamWAmsgrad>(a, state_dtype, sr, tile16, s);
  }
  return cudaErrorInvalidValue;
}

const void* StepApplyAdamWModule() { return reinterpret_cast<const void*>(&ModuleAnchorKernel); }

}  // namespace fp4q::kernels::cuda
