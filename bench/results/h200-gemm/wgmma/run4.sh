#!/usr/bin/env bash
# Device call 4 (the module of call 3): the whole fp4q_cuda_test, then Nsight Compute's stall
# reasons for the wgmma kernel at M = 128.
set -u
source bench/results/h200-step/overlap/env.sh
nvidia-smi --query-gpu=name,uuid,driver_version --format=csv,noheader
timeout 170 $b/bin/fp4q_cuda_test > /tmp/t.txt 2>&1
echo "cuda_test rc=$?"; grep -E "^\[  (PASSED|FAILED|SKIPPED) |tests ran|FAILED  \]" /tmp/t.txt | tee $o/cuda-test.txt | head
timeout 90 ncu --clock-control none -k regex:WgmmaKernel --launch-skip 3 --launch-count 1 \
  --section SpeedOfLight \
  --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\\.ratio \
  $b/bin/fp4q_bench --out /tmp/n.json --only GEMM --gemm-m 128 --iters 5 > $o/ncu-stalls-m128.txt 2>&1
echo "ncu rc=$?"; grep -E "stalled|Duration" $o/ncu-stalls-m128.txt | sort -k3 -n -r | head -14
