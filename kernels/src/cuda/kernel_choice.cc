// See kernel_choice.h.
#include "cuda/kernel_choice.h"

namespace fp4q::kernels::cuda {
namespace {

bool LanesCover(const RowPass& p) {
  if (p.fmt == kFmtMx) {
    if (p.residual || p.amax_only) return false;  // one block a lane pair: Quantize and QDQ
  } else if (p.fmt == kFmtNv16x16) {
    // Tile pairs (a tile's rows are the 16 lanes of one parity): Quantize and QDQ, map-to-6.
    if (p.residual || p.amax_only || p.scale_sel != kSelMapTo6 || p.rows % 16 != 0) return false;
  } else if (p.fmt != kFmtNv1x16 || p.scale_sel != kSelMapTo6) {
    return false;
  }
  if (p.residual && p.rht) return false;
  if (p.rows <= 0 || p.cols <= 0 || p.cols % 64 != 0) return false;
  // Block indices stay below 2^31 (32-bit block arithmetic, the swizzled layout's row division).
  return static_cast<uint64_t>(p.rows) * static_cast<uint64_t>(p.cols) / 16 < (uint64_t{1} << 31);
}

}  // namespace

RowKernel ChooseRowKernel(const RowPass& p, const KernelTuning& t) {
  if (t.rows_only || !LanesCover(p)) return RowKernel::kRows;
  if (p.residual && p.amax_only && p.guarded) return RowKernel::kLanesGuardedAmax;
  if (p.residual) return RowKernel::kLanesResidual;
  if (p.x_dtype == kBF16 && t.bf16_block_ctas == 4) return RowKernel::kLanesBlocksFourCtas;
  return RowKernel::kLanesBlocks;
}

bool FusedAmaxFits(const RowPass& p, const KernelTuning& t) {
  const RowKernel k = ChooseRowKernel(p, t);
  if (k != RowKernel::kLanesBlocks && k != RowKernel::kLanesBlocksFourCtas) return false;
  return !p.amax_only && p.fmt != kFmtMx &&  // MXFP4 has no global scale
         static_cast<uint64_t>(p.rows) * static_cast<uint64_t>(p.cols) <= kFusedAmaxMaxElems;
}

bool LaneTilesCover(const RowPass& p, const KernelTuning& t) {
  if (t.rows_only || p.residual || p.fmt != kFmtNv1x16 || p.scale_sel != kSelMapTo6 ||
      p.x_dtype != kBF16) {
    return false;
  }
  if (p.rows <= 0 || p.cols <= 0 || p.rows % 64 != 0 || p.cols % 256 != 0) return false;
  return static_cast<uint64_t>(p.rows) * static_cast<uint64_t>(p.cols) / 16 < (uint64_t{1} << 31);
}

bool CtaAmaxFits(const RowPass& p) {
  return p.x_dtype == kBF16 &&
         static_cast<uint64_t>(p.rows) * static_cast<uint64_t>(p.cols) <= kCtaAmaxMaxElems;
}

const char* RowKernelName(RowKernel k) {
  switch (k) {
    case RowKernel::kRows: return "rows";
    case RowKernel::kLanesGuardedAmax: return "lanes, guarded amax";
    case RowKernel::kLanesResidual: return "lanes, residual";
    case RowKernel::kLanesBlocks: return "lanes, one block a lane";
    case RowKernel::kLanesBlocksFourCtas: return "lanes, one block a lane, 4 CTAs";
  }
  return "?";
}

}  // namespace fp4q::kernels::cuda
