#!/usr/bin/env bash
# Device call 3 (repository root, .bundle carried; .bundle/alt/libfp4q_cuda.so.gz is the same
# commit with the lane-tile kernel at 4 CTAs an SM, 64 registers, against 3 and 80 in the
# bundle's module):
#   1. fp4q_bench --only row+col (RHT + SR and RTN), bundle's module ("new", 3 CTAs) and the
#      alt module ("old", 4 CTAs), twice each; then --rows-only (the shared tiles) once
#   2. Nsight Compute on the RTN row + column row, lane tiles and shared tiles
#   3. the whole fp4q_cuda_test
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
begin t3 "alt $(cat $b/alt/COMMIT 2>/dev/null)"
for r in 1 2; do
  ab_bench $r 40 row+col
  for m in new old; do grep -E "^\| quantize" $o/bench-$m-$r.txt | cut -d'|' -f2,4,6; done
done
room 40 "shared" && timeout 40 stdbuf -oL $b/bin/fp4q_bench --only row+col --rows-only \
  --out $o/bench-shared.json > $o/bench-shared.txt 2>&1
echo "shared rc=$?"; grep -E "^copy|^\| quantize" $o/bench-shared.txt | cut -d'|' -f2,4,6
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
metrics=smsp__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active
metrics=$metrics,dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum
metrics=$metrics,launch__registers_per_thread
for m in lanes shared; do
  flag=""; k=regex:QuantizeLaneTiles
  [[ $m == shared ]] && flag="--rows-only" && k=regex:QuantizeTileKernel
  room 60 "ncu $m" || continue
  timeout 60 $ncu --clock-control none --kernel-name $k --launch-skip 3 --launch-count 1 \
    --metrics $metrics $b/bin/fp4q_bench --only "row+col RTN" --iters 10 $flag \
    --out $o/ncu-bench-$m.json > $o/ncu-rtn-$m.txt 2>&1
  echo "ncu $m rc=$?"
  grep -E "QuantizeLaneTiles|QuantizeTileKernel|inst_executed|issue_active|dram__bytes|duration|registers" \
    $o/ncu-rtn-$m.txt | cut -c1-120
done
room 300 "whole suite" && timeout 300 $b/bin/fp4q_cuda_test > $o/cuda-tests-all.txt 2>&1
echo "whole suite rc=$?"; grep -E "^\[ +(FAILED|PASSED|SKIPPED) |tests ran" $o/cuda-tests-all.txt | head
