// What the GPU benchmarks of the CLI (bench-ipc, bench-step) share: the CUDA runtime, loaded
// with dlopen through client::CudaRuntime (the CLI links no CUDA), and bf16 conversion.
#ifndef FP4Q_CLIENT_CLI_BENCH_CUDA_H_
#define FP4Q_CLIENT_CLI_BENCH_CUDA_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "fp4q/client/cuda_runtime.h"

namespace fp4q::client::cli {

// The runtime (`wanted`, else CudaRuntime's default libraries) with the calls the benchmarks
// make, device 0 current; FAILED_PRECONDITION saying why without a runtime or a device.
absl::StatusOr<std::unique_ptr<CudaRuntime>> LoadBenchCuda(const std::string& wanted);

// f32 -> bf16, round to nearest even (finite inputs).
uint16_t ToBf16(float f);

}  // namespace fp4q::client::cli

#endif  // FP4Q_CLIENT_CLI_BENCH_CUDA_H_
