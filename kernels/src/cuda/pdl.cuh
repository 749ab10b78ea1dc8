// Programmatic dependent launch (compute capability 9.0+), shared by the kernels launched that
// way: the optimizer step's (step_device.cuh) and the direct GEMMs' main kernels behind their
// prepare kernels (matmul_direct.cuh).
//
// A kernel launched with the attribute may start while the stream's previous kernel finishes:
// its CTAs are scheduled once every CTA of that kernel has called launch_dependents (or exited).
// Such a kernel calls PdlGridEnter() before it reads or writes any global memory: it waits for
// the previous kernel's completion and memory (griddepcontrol.wait), then lets the stream's next
// kernel launch early in turn. Both instructions are no-ops in a kernel launched without the
// attribute, and a kernel behind a non-kernel operation (a copy, a memset, a stream wait) waits
// for it as ever.
//
// The quantize, amax and dequantize kernels are launched plainly: as programmatic launches they
// showed no gain on an H100 (small calls are bound by the host; the large rows did not move;
// bench/results/h200-quantize/pdl/).
#ifndef FP4Q_KERNELS_SRC_CUDA_PDL_CUH_
#define FP4Q_KERNELS_SRC_CUDA_PDL_CUH_

#include <cuda_runtime.h>

#include "device_numerics.cuh"

namespace fp4q::kernels::cuda {

FP4Q_D void PdlGridEnter() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Launches `kernel` on `grid` x `block` with `smem` bytes of dynamic shared memory on `s`, as a
// programmatic dependent launch when `pdl`. A failed launch's error is returned and cleared
// (launch errors are not sticky).
// With a `cluster` other than 1 x 1 x 1 the grid runs as clusters of that shape (each grid
// dimension a multiple of the cluster's; compute capability 9.0+).
template <typename... Params, typename... Args>
cudaError_t LaunchClusterMaybePdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                                  cudaStream_t s, bool pdl, dim3 cluster, const Args&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr[2];
  unsigned n = 0;
  if (pdl) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  if (cluster.x * cluster.y * cluster.z > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = cluster.x;
    attr[n].val.clusterDim.y = cluster.y;
    attr[n].val.clusterDim.z = cluster.z;
    ++n;
  }
  cfg.attrs = n > 0 ? attr : nullptr;
  cfg.numAttrs = n;
  const cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, args...);
  if (e != cudaSuccess) cudaGetLastError();
  return e;
}

template <typename... Params, typename... Args>
cudaError_t LaunchMaybePdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                           cudaStream_t s, bool pdl, const Args&... args) {
  return LaunchClusterMaybePdl(kernel, grid, block, smem, s, pdl, dim3(1, 1, 1), args...);
}

}  // namespace fp4q::kernels::cuda

#endif  // FP4Q_KERNELS_SRC_CUDA_PDL_CUH_
