#!/usr/bin/env bash
# Device call (repository root, .bundle carried): where the small-M GEMM's time goes at
# N = K = 8192. fp4q_bench's GEMM rows at M = 1 and 16 twice (cuBLAS bf16 beside them), then
# Nsight Compute over one Matmul at each M: every kernel's duration, and the main kernel's
# speed of light, occupancy, scheduler and warp-state sections.
set -uo pipefail
source bench/results/h200-step/overlap/env.sh
archive_on_exit ${ARCHIVE:-g1}
nvidia-smi --query-gpu=name,driver_version,uuid --format=csv,noheader | tee $o/gpu.txt
echo "commit $FP4Q_COMMIT" | tee -a $o/gpu.txt
for r in 1 2; do
  room 40 "bench $r" || continue
  timeout 40 $b/bin/fp4q_bench --only GEMM --gemm-m 1,16 --out $o/bench-$r.json \
    > $o/bench-$r.txt 2>&1
  echo "bench $r rc=$?"; grep -E "^copy|^GEMM" $o/bench-$r.txt
done
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for m in 1 16; do
  room 40 "ncu times $m" || continue
  timeout 40 $ncu --clock-control none --launch-skip 40 --launch-count 6 \
    --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed \
    $b/bin/fp4q_bench --only GEMM --gemm-m $m --iters 5 --out $o/n.json > $o/ncu-times-$m.txt 2>&1
  echo "ncu times $m rc=$?"; grep -E "^  [A-Za-z_].*\(|duration|dram__" $o/ncu-times-$m.txt | head -24
  room 60 "ncu sections $m" || continue
  timeout 60 $ncu --clock-control none -k regex:SmallMKernel --launch-skip 3 --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section SchedulerStats \
    --section WarpStateStats --section MemoryWorkloadAnalysis \
    --metrics smsp__inst_executed.sum,lts__t_sectors_srcunit_tex_op_read.sum \
    $b/bin/fp4q_bench --only GEMM --gemm-m $m --iters 5 --out $o/n.json > $o/ncu-main-$m.txt 2>&1
  echo "ncu main $m rc=$?"
  grep -E "Duration|Throughput|Registers|Achieved Occupancy|Eligible|Issued Warp|Stall|Block Size|Grid Size|inst_executed" $o/ncu-main-$m.txt | head -30
done
