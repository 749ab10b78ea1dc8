// The host side of kernel_codes.h: the public enums (types.h) -> the kernels' int codes, and the
// compile-time checks that tie each code to its enum. Every .cc file that fills a launcher's
// parameters (launch.h, step_launch.h) converts through these, so a new enum value that the
// codes do not cover breaks the build here rather than a kernel at run time. Host only: nvcc
// never sees it (types.h includes Abseil).
#ifndef FP4Q_KERNELS_SRC_CUDA_KERNEL_CODES_HOST_H_
#define FP4Q_KERNELS_SRC_CUDA_KERNEL_CODES_HOST_H_

#include "cuda/kernel_codes.h"
#include "fp4q/kernels/types.h"

namespace fp4q::kernels::cuda {

// Codes that are the enums' own values.
static_assert(kF32 == static_cast<int>(DType::kF32) && kBF16 == static_cast<int>(DType::kBF16),
              "kernel_codes.h: DType codes");
static_assert(kSelMapTo6 == static_cast<int>(ScaleSelection::kMapTo6) &&
                  kSelMae == static_cast<int>(ScaleSelection::kFourOverSixMae) &&
                  kSelMse == static_cast<int>(ScaleSelection::kFourOverSixMse),
              "kernel_codes.h: ScaleSelection codes");
static_assert(kMxRceil == static_cast<int>(MxScaleRule::kRceil) &&
                  kMxFloor == static_cast<int>(MxScaleRule::kFloor),
              "kernel_codes.h: MxScaleRule codes");
static_assert(kRhtDefaultSigns == static_cast<int>(RhtMode::kDefaultSigns) &&
                  kRhtSeeded == static_cast<int>(RhtMode::kSeeded),
              "kernel_codes.h: RhtMode codes");

constexpr int DtypeCode(DType d) { return static_cast<int>(d); }
constexpr int SelCode(ScaleSelection s) { return static_cast<int>(s); }
constexpr int MxRuleCode(MxScaleRule r) { return static_cast<int>(r); }
constexpr int RhtCode(RhtMode m) { return static_cast<int>(m); }

// The format code is Format x BlockShape, numbered from 0 (types.h numbers Format and
// BlockShape from 1): NVFP4 1x16, NVFP4 16x16, MXFP4 (1x32, its only block).
constexpr int FmtCode(Format f, BlockShape b) {
  if (f == Format::kMxfp4) return kFmtMx;
  return b == BlockShape::k16x16 ? kFmtNv16x16 : kFmtNv1x16;
}
static_assert(FmtCode(Format::kNvfp4, BlockShape::k1x16) == kFmtNv1x16 &&
                  FmtCode(Format::kNvfp4, BlockShape::k16x16) == kFmtNv16x16 &&
                  FmtCode(Format::kMxfp4, BlockShape::k1x32) == kFmtMx &&
                  kFmtNv1x16 != kFmtNv16x16 && kFmtNv16x16 != kFmtMx && kFmtNv1x16 != kFmtMx,
              "kernel_codes.h: format codes");

}  // namespace fp4q::kernels::cuda

#endif  // FP4Q_KERNELS_SRC_CUDA_KERNEL_CODES_HOST_H_
