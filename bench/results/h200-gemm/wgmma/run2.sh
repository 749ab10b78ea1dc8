#!/usr/bin/env bash
# Device call 2: the A chunks by bulk copy on mbarriers (no proxy fence): the GEMM tests, the
# GEMM rows new / old / new, Nsight Compute on the wgmma kernel at M = 128 and 32.
set -u
source bench/results/h200-step/overlap/env.sh
new=$b/bin/libfp4q_cuda.so
old=$b/bin/libfp4q_cuda_old.so
nvidia-smi --query-gpu=name,uuid,driver_version --format=csv,noheader
timeout 120 $b/bin/fp4q_cuda_test --gtest_filter='*Matmul*:*Gemm*' > $o/test-matmul.txt 2>&1
echo "test rc=$?"; grep -E "^\[  (PASSED|FAILED) |tests ran" $o/test-matmul.txt | head
for v in new old new; do
  m=$new; [[ $v == old ]] && m=$old
  FP4Q_CUDA_MODULE=$m timeout 150 $b/bin/fp4q_bench --out /tmp/g.json --only GEMM \
    --gemm-m 16,32,64,128,256,512 > /tmp/g.txt 2>&1
  echo "== $v rc=$?"; grep -E "^GEMM|copy" /tmp/g.txt | tee -a $o/gemm-$v.txt
done
for mm in 128 32; do
  timeout 120 ncu --clock-control none -k regex:WgmmaKernel --launch-skip 3 --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
    --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section Occupancy \
    $b/bin/fp4q_bench --out /tmp/n.json --only GEMM --gemm-m $mm --iters 5 > $o/ncu-m$mm.txt 2>&1
  echo "ncu $mm rc=$?"
done
grep -E "Duration|Throughput|Stall|Issue Slots|Eligible|Tensor|Registers|Achieved Occ|Issued Warp" $o/ncu-m128.txt | head -40
