#!/usr/bin/env bash
# The whole fp4q_cuda_test (the bundle's, d6f8e9c) with e522cda's CUDA module: the GPU code of
# main since e522cda (later commits leave kernels/ as it is), every GPU test bit for bit against
# the CPU backend or, for the GEMMs, within tolerance. On an H200, then, the overlapped training
# loop under MPS (bench/results/h200-loop/run1.sh's first loop, 7 rounds) if time is left.
# Repository root, the whole .bundle carried (alt10 as mxscale/run1.sh's header makes it).
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
begin mx2 "whole suite, module $(cat $b/alt10/COMMIT)"
alt_pair head alt10
module_tests head '*' 220 all
f=$o/test-all-head.txt
grep -E "tests from .* ran|^\[ +(PASSED|FAILED|SKIPPED) " $f | head -12
if grep -q H200 $o/gpu.txt; then
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
  mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
  MPS=$(command -v nvidia-cuda-mps-control || echo /usr/local/nvidia/bin/nvidia-cuda-mps-control)
  $MPS -d && loop_args=("--variant=fp4q overlap") && train_loop mps 256 7 90
  echo quit | $MPS
fi
echo "done ($SECONDS s)"
