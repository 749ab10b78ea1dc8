#!/usr/bin/env bash
# Device call 2 (repository root, .bundle carried): the two-output quantizer on lane tiles of
# 64 x 32 (quantize_tile.cu, LaneTilesCover; call 1 ran 16 x 32 tasks) against the shared-tile
# kernel it replaces for bf16 NVFP4 1x16, which the same module still runs under --rows-only.
#   1. fp4q_cuda_test's quantize tests (every mode and shape against the CPU backend; the new
#      LargeQuantizeTest.LaneTilesMatchCpuBitForBitInBothOutputs), the chained-calls test
#   2. compute-sanitizer memcheck and racecheck over the lane-tile test
#   3. fp4q_bench --only RHT+SR: default (lane tiles), --rows-only (shared tiles), twice each
#   4. Nsight Compute on the row + column row, both kernels: executed instructions, issue
#      activity, DRAM bytes
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
begin t2
room 150 tests && timeout 150 $b/bin/fp4q_cuda_test \
  --gtest_filter='AllModes/QuantizeTest.*:LargeQuantizeTest.*:CudaTest.CallsBackToBack*:*Golden*' \
  > $o/cuda-tests.txt 2>&1
echo "tests rc=$?"; grep -E "^\[ +(FAILED|PASSED|SKIPPED) |tests ran" $o/cuda-tests.txt | head -20
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in memcheck racecheck; do
  room 90 $tool && timeout 90 $cs --tool $tool $b/bin/fp4q_cuda_test \
    --gtest_filter='LargeQuantizeTest.LaneTiles*:AllModes/QuantizeTest.*16x16*32x64*' \
    > $o/$tool.txt 2>&1
  echo "$tool rc=$?"; grep -E "^\[ +(FAILED|PASSED) |ERROR SUMMARY|RACECHECK SUMMARY" $o/$tool.txt
done
for r in 1 2; do
  for m in lanes shared; do
    flag=""; [[ $m == shared ]] && flag="--rows-only"
    room 40 "bench $m $r" || continue
    timeout 40 stdbuf -oL $b/bin/fp4q_bench --only RHT+SR $flag \
      --out $o/bench-$m-$r.json > $o/bench-$m-$r.txt 2>&1
    echo "bench $m $r rc=$? ($SECONDS s)"
    grep -E "^copy|^\| quantize" $o/bench-$m-$r.txt | cut -d'|' -f2,4,6,7
  done
done
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
metrics=smsp__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active
metrics=$metrics,dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum
metrics=$metrics,sm__warps_active.avg.pct_of_peak_sustained_active
metrics=$metrics,launch__registers_per_thread,launch__occupancy_limit_registers
for m in lanes shared; do
  flag=""; k=regex:QuantizeLaneTiles
  [[ $m == shared ]] && flag="--rows-only" && k=regex:QuantizeTileKernel
  room 60 "ncu $m" || continue
  timeout 60 $ncu --clock-control none --kernel-name $k --launch-skip 3 --launch-count 1 \
    --metrics $metrics --section WarpStateStats $b/bin/fp4q_bench --only "row+col" --iters 10 \
    $flag \
    --out $o/ncu-bench-$m.json > $o/ncu-$m.txt 2>&1
  echo "ncu $m rc=$?"; grep -E "QuantizeLaneTiles|QuantizeTileKernel|inst_executed|issue_active|dram__bytes|duration|warps_active|registers|Stall|stall|Cycles" $o/ncu-$m.txt | cut -c1-150
done
