#!/usr/bin/env bash
# Device call 6 (repository root, .bundle carried): lane tiles whose stores fill sectors (call 5:
# 224 sector writes a 64 x 32 task where 75 MB of output needs about 73: L2 wrote 361 MB of
# sectors). A CTA task is 64 x 256; the row-wise output is staged in shared memory and written
# 128 bytes a row; a lane pair writes each column's 32 bytes as two whole-sector stores.
#   1. the quantize tests, the lane-tile test under memcheck and racecheck
#   2. fp4q_bench --only row+col: lane tiles and shared tiles (--rows-only), two rounds
#   3. Nsight Compute (stall reasons, sectors) on the lane tiles' RTN and RHT + SR rows
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
begin t6
room 150 tests && timeout 150 $b/bin/fp4q_cuda_test \
  --gtest_filter='AllModes/QuantizeTest.*:LargeQuantizeTest.*:CudaTest.CallsBackToBack*:*Golden*' \
  > $o/cuda-tests.txt 2>&1
echo "tests rc=$?"; grep -E "^\[ +(FAILED|PASSED|SKIPPED) |tests ran" $o/cuda-tests.txt | head -20
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in memcheck racecheck; do
  room 90 $tool && timeout 90 $cs --tool $tool $b/bin/fp4q_cuda_test \
    --gtest_filter='LargeQuantizeTest.LaneTiles*' > $o/$tool.txt 2>&1
  echo "$tool rc=$?"; grep -E "^\[ +(FAILED|PASSED) |ERROR SUMMARY|RACECHECK SUMMARY" $o/$tool.txt
done
for r in 1 2; do
  for m in lanes shared; do
    flag=""; [[ $m == shared ]] && flag="--rows-only"
    room 40 "bench $m $r" || continue
    timeout 40 stdbuf -oL $b/bin/fp4q_bench --only row+col $flag \
      --out $o/bench-$m-$r.json > $o/bench-$m-$r.txt 2>&1
    echo "bench $m $r rc=$? ($SECONDS s)"
    grep -E "^copy|^\| quantize" $o/bench-$m-$r.txt | cut -d'|' -f2,4,6
  done
done
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
m=smsp__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active
m=$m,gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum
m=$m,l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum,lts__t_sectors_op_write.sum
m=$m,lts__t_sectors_op_read.sum
for s in long_scoreboard short_scoreboard barrier wait math_pipe_throttle not_selected \
    mio_throttle dispatch_stall; do
  m=$m,smsp__average_warps_issue_stalled_${s}_per_issue_active.ratio
done
for row in "row+col RTN" "row+col RHT+SR"; do
  room 60 "ncu $row" || continue
  timeout 60 $ncu --clock-control none --kernel-name regex:QuantizeLaneTiles --launch-skip 3 \
    --launch-count 1 --metrics $m $b/bin/fp4q_bench --only "$row" --iters 10 \
    --out $o/ncu-bench.json > "$o/ncu-${row// /-}.txt" 2>&1
  echo "== ncu $row rc=$?"
  grep -E "inst_executed|issue_active|duration|dram__bytes|l1tex|lts__|stalled" \
    "$o/ncu-${row// /-}.txt" | awk '{printf "%s %s\n", $1, $NF}' \
    | sed 's/smsp__average_warps_issue_stalled_//; s/_per_issue_active.ratio//'
done
