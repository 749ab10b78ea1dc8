// The CUDA backend's choice of row-wise quantize kernel (kernels/src/cuda/kernel_choice.h):
// plain C++, so it runs where there is no GPU. Every case is a pass cuda_ops.cc launches.
#include "cuda/kernel_choice.h"

#include "gtest/gtest.h"

namespace fp4q::kernels::cuda {
namespace {

RowPass Nv(int64_t rows, int64_t cols, int dtype = kBF16) {
  RowPass p;
  p.rows = rows;
  p.cols = cols;
  p.x_dtype = dtype;
  return p;
}

TEST(KernelChoiceTest, LaneKernelsTakeNvfp4OneBySixteenMapToSixOnRowsOfSixtyFour) {
  const KernelTuning t;
  EXPECT_EQ(ChooseRowKernel(Nv(8192, 8192), t), RowKernel::kLanesBlocks);
  EXPECT_EQ(ChooseRowKernel(Nv(1, 64, kF32), t), RowKernel::kLanesBlocks);
  RowPass sr = Nv(128, 4096);
  sr.rht = true;  // RHT without a residual stays on the lanes
  EXPECT_EQ(ChooseRowKernel(sr, t), RowKernel::kLanesBlocks);
  // Everything else: the general row kernel.
  EXPECT_EQ(ChooseRowKernel(Nv(16, 48), t), RowKernel::kRows);   // cols % 64 != 0
  EXPECT_EQ(ChooseRowKernel(Nv(0, 64), t), RowKernel::kRows);
  RowPass four = Nv(64, 64);
  four.scale_sel = kSelMse;
  EXPECT_EQ(ChooseRowKernel(four, t), RowKernel::kRows);
  // 2^31 blocks or more: the lanes' 32-bit block arithmetic would wrap.
  EXPECT_EQ(ChooseRowKernel(Nv(int64_t{1} << 20, int64_t{1} << 15), t), RowKernel::kRows);
  EXPECT_EQ(ChooseRowKernel(Nv((int64_t{1} << 20) - 1, int64_t{1} << 15), t),
            RowKernel::kLanesBlocks);
}

TEST(KernelChoiceTest, MxfpFourTakesTheBlockLanesWithoutErrorFeedback) {
  const KernelTuning t;
  RowPass mx = Nv(64, 64);
  mx.fmt = kFmtMx;
  EXPECT_EQ(ChooseRowKernel(mx, t), RowKernel::kLanesBlocks);
  mx.rht = true;
  EXPECT_EQ(ChooseRowKernel(mx, t), RowKernel::kLanesBlocks);
  mx.rht = false;
  mx.scale_sel = kSelMse;  // four-over-six is NVFP4's: the MXFP4 choice ignores it
  EXPECT_EQ(ChooseRowKernel(mx, t), RowKernel::kLanesBlocks);
  KernelTuning four;
  four.bf16_block_ctas = 4;
  EXPECT_EQ(ChooseRowKernel(mx, four), RowKernel::kLanesBlocksFourCtas);
  EXPECT_FALSE(FusedAmaxFits(mx, t));  // no global scale to compute
  RowPass ef = mx;
  ef.residual = true;  // error feedback: the row kernel
  EXPECT_EQ(ChooseRowKernel(ef, t), RowKernel::kRows);
  RowPass odd = Nv(16, 96);
  odd.fmt = kFmtMx;  // rows of 32 * 3: not a whole number of four-lane groups
  EXPECT_EQ(ChooseRowKernel(odd, t), RowKernel::kRows);
}

TEST(KernelChoiceTest, SixteenBySixteenTilesTakeTheBlockLanesWithMapToSix) {
  const KernelTuning t;
  RowPass tile = Nv(64, 64);
  tile.fmt = kFmtNv16x16;
  EXPECT_EQ(ChooseRowKernel(tile, t), RowKernel::kLanesBlocks);
  tile.rht = true;
  EXPECT_EQ(ChooseRowKernel(tile, t), RowKernel::kLanesBlocks);
  EXPECT_TRUE(FusedAmaxFits(tile, t));
  RowPass odd_rows = Nv(40, 64);  // not whole tiles (never asked of the kernels; still refused)
  odd_rows.fmt = kFmtNv16x16;
  EXPECT_EQ(ChooseRowKernel(odd_rows, t), RowKernel::kRows);
  RowPass narrow = Nv(48, 96);  // rows of 96: not a whole number of 64-column steps
  narrow.fmt = kFmtNv16x16;
  EXPECT_EQ(ChooseRowKernel(narrow, t), RowKernel::kRows);
  RowPass four = Nv(64, 64);
  four.fmt = kFmtNv16x16;
  four.scale_sel = kSelMae;  // four-over-six sums errors over the tile: the row kernel
  EXPECT_EQ(ChooseRowKernel(four, t), RowKernel::kRows);
  RowPass ef = Nv(64, 64);
  ef.fmt = kFmtNv16x16;
  ef.residual = true;
  EXPECT_EQ(ChooseRowKernel(ef, t), RowKernel::kRows);
}

TEST(KernelChoiceTest, ErrorFeedbackPassesTakeTheResidualLanesAndTheGuardItsOwn) {
  const KernelTuning t;
  RowPass ef = Nv(768, 3072);
  ef.residual = true;
  EXPECT_EQ(ChooseRowKernel(ef, t), RowKernel::kLanesResidual);
  ef.amax_only = true;  // the unguarded amax pass of x + r
  EXPECT_EQ(ChooseRowKernel(ef, t), RowKernel::kLanesResidual);
  ef.guarded = true;
  EXPECT_EQ(ChooseRowKernel(ef, t), RowKernel::kLanesGuardedAmax);
  ef.rht = true;  // RHT with a residual: the row kernel
  EXPECT_EQ(ChooseRowKernel(ef, t), RowKernel::kRows);
}

TEST(KernelChoiceTest, TuningSendsPassesToTheRowKernelOrFourCtas) {
  KernelTuning rows;
  rows.rows_only = true;
  RowPass ef = Nv(64, 64);
  ef.residual = true;
  EXPECT_EQ(ChooseRowKernel(Nv(64, 64), rows), RowKernel::kRows);
  EXPECT_EQ(ChooseRowKernel(ef, rows), RowKernel::kRows);
  KernelTuning four;
  four.bf16_block_ctas = 4;
  EXPECT_EQ(ChooseRowKernel(Nv(64, 64), four), RowKernel::kLanesBlocksFourCtas);
  EXPECT_EQ(ChooseRowKernel(Nv(64, 64, kF32), four), RowKernel::kLanesBlocks);  // bf16 only
  EXPECT_EQ(ChooseRowKernel(ef, four), RowKernel::kLanesResidual);
}

TEST(KernelChoiceTest, FusedAmaxTakesSmallOneBlockALanePassesOnly) {
  const KernelTuning t;
  EXPECT_TRUE(FusedAmaxFits(Nv(1024, 1024), t));  // 2^20 elements: the limit
  EXPECT_FALSE(FusedAmaxFits(Nv(1025, 1024), t));
  RowPass ef = Nv(64, 64);
  ef.residual = true;
  EXPECT_FALSE(FusedAmaxFits(ef, t));
  RowPass amax = Nv(64, 64);
  amax.amax_only = true;
  EXPECT_FALSE(FusedAmaxFits(amax, t));
  EXPECT_FALSE(FusedAmaxFits(Nv(16, 48), t));  // the row kernel
  KernelTuning rows;
  rows.rows_only = true;
  EXPECT_FALSE(FusedAmaxFits(Nv(64, 64), rows));
  KernelTuning four;
  four.bf16_block_ctas = 4;
  EXPECT_TRUE(FusedAmaxFits(Nv(64, 64), four));
  EXPECT_STREQ(RowKernelName(ChooseRowKernel(Nv(64, 64), four)),
               "lanes, one block a lane, 4 CTAs");
}

TEST(KernelChoiceTest, EveryCtaReducesTheAmaxOfTensorsUpTo65536Elements) {
  EXPECT_TRUE(CtaAmaxFits(Nv(1, 4096)));
  EXPECT_TRUE(CtaAmaxFits(Nv(16, 4096)));  // 2^16 elements: the limit
  EXPECT_FALSE(CtaAmaxFits(Nv(17, 4096)));
  EXPECT_FALSE(CtaAmaxFits(Nv(16, 4096, kF32)));  // bf16 x only
  EXPECT_FALSE(CtaAmaxFits(Nv(128, 4096)));  // the cooperative launch
  EXPECT_TRUE(FusedAmaxFits(Nv(128, 4096), KernelTuning{}));
}

TEST(KernelChoiceTest, TwoOutputPassesTakeTheLaneTilesOnBf16NvfpFourOneBySixteen) {
  const KernelTuning t;
  EXPECT_TRUE(LaneTilesCover(Nv(8192, 8192), t));
  EXPECT_TRUE(LaneTilesCover(Nv(64, 256), t));
  RowPass rht = Nv(192, 768);
  rht.rht = true;
  EXPECT_TRUE(LaneTilesCover(rht, t));
  rht.amax_only = true;  // the RHT's amax pass too
  EXPECT_TRUE(LaneTilesCover(rht, t));
  // The shared tiles: f32 x, rows not a multiple of 64, columns not of 256, other formats and
  // scale rules, 2^31 blocks or more, and the A/B knob.
  EXPECT_FALSE(LaneTilesCover(Nv(64, 64, kF32), t));
  EXPECT_FALSE(LaneTilesCover(Nv(64, 208), t));
  EXPECT_FALSE(LaneTilesCover(Nv(64, 96), t));
  EXPECT_FALSE(LaneTilesCover(Nv(64, 1088), t));
  EXPECT_FALSE(LaneTilesCover(Nv(48, 256), t));
  EXPECT_FALSE(LaneTilesCover(Nv(272, 512), t));
  EXPECT_FALSE(LaneTilesCover(Nv(0, 64), t));
  RowPass mx = Nv(64, 64);
  mx.fmt = kFmtMx;
  EXPECT_FALSE(LaneTilesCover(mx, t));
  RowPass tiles = Nv(64, 64);
  tiles.fmt = kFmtNv16x16;
  EXPECT_FALSE(LaneTilesCover(tiles, t));
  RowPass four = Nv(64, 64);
  four.scale_sel = kSelMae;
  EXPECT_FALSE(LaneTilesCover(four, t));
  EXPECT_FALSE(LaneTilesCover(Nv(int64_t{1} << 20, int64_t{1} << 15), t));
  EXPECT_TRUE(LaneTilesCover(Nv((int64_t{1} << 20) - 64, int64_t{1} << 15), t));
  KernelTuning rows_only;
  rows_only.rows_only = true;
  EXPECT_FALSE(LaneTilesCover(Nv(8192, 8192), rows_only));
}

}  // namespace
}  // namespace fp4q::kernels::cuda
