// The plain-int codes the CUDA launchers and kernels use for the public enums (types.h), in a
// header with no CUDA or Abseil includes (launch.h and kernel_choice.h include it; nvcc never
// compiles Abseil). kernel_codes_host.h converts the enums to these and checks them against
// types.h at compile time.
#ifndef FP4Q_KERNELS_SRC_CUDA_KERNEL_CODES_H_
#define FP4Q_KERNELS_SRC_CUDA_KERNEL_CODES_H_

namespace fp4q::kernels::cuda {

enum : int { kF32 = 1, kBF16 = 2 };                          // DType (same values)
enum : int { kFmtNv1x16 = 0, kFmtNv16x16 = 1, kFmtMx = 2 };  // Format x BlockShape (FmtCode)
enum : int { kSelMapTo6 = 0, kSelMae = 1, kSelMse = 2 };     // ScaleSelection (same values)
enum : int { kMxRceil = 0, kMxFloor = 1 };                   // MxScaleRule (same values)
enum : int { kRhtDefaultSigns = 1, kRhtSeeded = 2 };         // RhtMode (same values; 0 is off)

}  // namespace fp4q::kernels::cuda

#endif  // FP4Q_KERNELS_SRC_CUDA_KERNEL_CODES_H_
