// Programmatic dependent launch (compute capability 9.0+), shared by the kernels that take it
// (the optimizer step's, the lane quantizers', the amax reduction and dequantize).
//
// A kernel launched with the attribute may start while the stream's previous kernel finishes:
// its CTAs are scheduled once every CTA of that kernel has called launch_dependents (or exited).
// Such a kernel calls PdlGridEnter() before it reads or writes any global memory: it waits for
// the previous kernel's completion and memory (griddepcontrol.wait), then lets the stream's next
// kernel launch early in turn. What overlaps is a launch and its CTAs' start with the previous
// kernel's last CTAs, which for a small tensor is most of a call. Both instructions are no-ops
// in a kernel launched without the attribute, and a kernel behind a non-kernel operation (a
// copy, a memset, a stream wait) waits for it as ever.
#ifndef FP4Q_KERNELS_SRC_CUDA_PDL_CUH_
#define FP4Q_KERNELS_SRC_CUDA_PDL_CUH_

#include <cuda_runtime.h>

#include <atomic>

#include "device_numerics.cuh"

namespace fp4q::kernels::cuda {

FP4Q_D void PdlGridEnter() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Whether a cooperative launch may also be programmatic in this process: cleared the first time
// the runtime refuses the pair and takes the same launch without the programmatic attribute.
inline std::atomic<bool>& CooperativePdlAllowed() {
  static std::atomic<bool> allowed{true};
  return allowed;
}

// Launches `kernel` (which calls PdlGridEnter first when `pdl` can be set) on `grid` x `block`
// with `smem` bytes of dynamic shared memory on `s`: programmatic when `pdl`, cooperative when
// `cooperative`. A failed launch's error is returned and cleared (launch errors are not sticky).
template <typename... Params, typename... Args>
cudaError_t LaunchWithAttrs(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                            cudaStream_t s, bool pdl, bool cooperative, const Args&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr[2];
  unsigned n = 0;
  if (cooperative) {
    attr[n].id = cudaLaunchAttributeCooperative;
    attr[n].val.cooperative = 1;
    ++n;
    pdl = pdl && CooperativePdlAllowed().load(std::memory_order_relaxed);
  }
  const unsigned without_pdl = n;
  if (pdl) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  cfg.attrs = n > 0 ? attr : nullptr;
  cfg.numAttrs = n;
  cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, args...);
  if (e != cudaSuccess && cooperative && pdl) {
    // Refused: again without the attribute. When that launch is taken, the pair was what the
    // runtime refused, and later cooperative launches go without it.
    cudaGetLastError();
    cfg.numAttrs = without_pdl;
    e = cudaLaunchKernelEx(&cfg, kernel, args...);
    if (e == cudaSuccess) CooperativePdlAllowed().store(false, std::memory_order_relaxed);
  }
  if (e != cudaSuccess) cudaGetLastError();
  return e;
}

}  // namespace fp4q::kernels::cuda

#endif  // FP4Q_KERNELS_SRC_CUDA_PDL_CUH_
