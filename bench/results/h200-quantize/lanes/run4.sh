#!/usr/bin/env bash
# Device call (repository root, .bundle carried; .bundle/alt/libfp4q_cuda.so.gz is the module of
# 78c7b03, "old"): run2.sh's checks after NVFP4 16x16 moved onto the one-block-a-lane kernel
# (branch tiles16-lanes: a tile's 16 rows in a half-warp) and the sm_80 fallback of the packed
# block amax; Nsight Compute on the 16x16 row, both modules.
ARCHIVE=q4 MEMCHECK_S=150 NCU_ROWS="16x16 RTN" exec bash bench/results/h200-quantize/lanes/run2.sh
