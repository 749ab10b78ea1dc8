#!/usr/bin/env bash
# Device call (repository root, .bundle carried): the small-M GEMM as one cluster launch ("one":
# A decoded by each CTA, the K slices added in a thread-block cluster) against its two-launch
# path ("two": FP4Q_SMALL_M_TICKETS=1, A prepared by its own kernel, split tickets), same module.
#   1. the whole fp4q_cuda_test ("one" wherever the split fits a cluster)
#   2. MatmulTest.* under FP4Q_SMALL_M_TICKETS=1
#   3. compute-sanitizer memcheck over the small-M and tolerance GEMM tests ("one")
#   4. fp4q_bench's GEMM rows at M = 1 and 16: one, two, one, two
#   5. Nsight Compute: durations and SM activity of M = 1 and 16, "one"
set -uo pipefail
source bench/results/h200-step/overlap/env.sh
archive_on_exit ${ARCHIVE:-g4}
nvidia-smi --query-gpu=name,driver_version,uuid --format=csv,noheader | tee $o/gpu.txt
echo "commit $FP4Q_COMMIT" | tee -a $o/gpu.txt
room 200 tests && timeout 200 $b/bin/fp4q_cuda_test > $o/cuda-test.txt 2>&1
echo "tests rc=$?"; grep -E "^\[ +(FAILED|PASSED|SKIPPED) |tests ran" $o/cuda-test.txt | head -12
room 90 "tests two" && FP4Q_SMALL_M_TICKETS=1 timeout 90 $b/bin/fp4q_cuda_test \
  --gtest_filter='MatmulTest.*' > $o/cuda-test-matmul-two.txt 2>&1
echo "matmul two rc=$?"; grep -E "^\[ +(FAILED|PASSED) |tests ran" $o/cuda-test-matmul-two.txt
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
room 100 memcheck && timeout 100 $cs --tool memcheck $b/bin/fp4q_cuda_test \
  --gtest_filter='MatmulTest.SmallM*:MatmulTest.WithinToleranceOfCpuReference' \
  > $o/memcheck.txt 2>&1
echo "memcheck rc=$?"; grep -E "^\[ +(FAILED|PASSED) |ERROR SUMMARY" $o/memcheck.txt
for r in 1 2; do
  for v in one two; do
    room 30 "bench $v $r" || continue
    env=""; [[ $v == two ]] && env="FP4Q_SMALL_M_TICKETS=1"
    env $env timeout 30 $b/bin/fp4q_bench --only GEMM --gemm-m 1,16 --out $o/bench-$v-$r.json \
      > $o/bench-$v-$r.txt 2>&1
    echo "$v $r rc=$? $(grep -E "^GEMM" $o/bench-$v-$r.txt | cut -c1-62 | tr '\n' ' ')"
  done
done
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for m in 1 16; do
  room 40 "ncu $m" || continue
  timeout 40 $ncu --clock-control none -k regex:"SmallM" --launch-skip 3 --launch-count 3 \
    --metrics gpu__time_duration.sum,sm__cycles_active.avg,gpc__cycles_elapsed.max,smsp__inst_executed.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed \
    $b/bin/fp4q_bench --only GEMM --gemm-m $m --iters 5 --out $o/n.json > $o/ncu-$m.txt 2>&1
  echo "ncu $m rc=$?"
  grep -E "^  [a-zA-Z].*\(|duration|cycles|inst_exec|dram" $o/ncu-$m.txt | sed 's/(unnamed namespace)//' | cut -c1-90
done
