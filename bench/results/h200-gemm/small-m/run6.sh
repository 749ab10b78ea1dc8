#!/usr/bin/env bash
# Device call (repository root, .bundle carried; .bundle/alt/libfp4q_cuda.so.gz is the module
# of c150fd7, "old": A prepared by its own kernel): the small-M GEMM in one launch with the
# backend's per-stream split tickets ("new").
#   1. the whole fp4q_cuda_test (new; with MatmulTest.SmallMSplitTicketsAcrossCallsAndStreams)
#   2. compute-sanitizer memcheck over the small-M GEMM tests
#   3. fp4q_bench's GEMM rows at M = 1 and 16: new, old, new, old
#   4. Nsight Compute: durations and per-SM activity of the new kernel at M = 1 and 16
set -uo pipefail
source bench/results/h200-step/overlap/env.sh
archive_on_exit ${ARCHIVE:-g7}
nvidia-smi --query-gpu=name,driver_version,uuid --format=csv,noheader | tee $o/gpu.txt
echo "commit $FP4Q_COMMIT" | tee -a $o/gpu.txt
gunzip -f $b/alt/libfp4q_cuda.so.gz
new=$b/bin/libfp4q_cuda.so; old=$b/alt/libfp4q_cuda.so
room 200 tests && timeout 200 $b/bin/fp4q_cuda_test > $o/cuda-test.txt 2>&1
echo "tests rc=$?"; grep -E "^\[ +(FAILED|PASSED|SKIPPED) |tests ran" $o/cuda-test.txt | head -12
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
room 100 memcheck && timeout 100 $cs --tool memcheck $b/bin/fp4q_cuda_test \
  --gtest_filter='MatmulTest.SmallM*:MatmulTest.WithinToleranceOfCpuReference' \
  > $o/memcheck.txt 2>&1
echo "memcheck rc=$?"; grep -E "^\[ +(FAILED|PASSED) |ERROR SUMMARY" $o/memcheck.txt
for r in 1 2; do
  for v in new old; do
    room 30 "bench $v $r" || continue
    mod=$new; [[ $v == old ]] && mod=$old
    FP4Q_CUDA_MODULE=$mod timeout 30 $b/bin/fp4q_bench --only GEMM --gemm-m 1,16 \
      --out $o/bench-$v-$r.json > $o/bench-$v-$r.txt 2>&1
    echo "$v $r rc=$? $(grep -E "^GEMM" $o/bench-$v-$r.txt | cut -c1-62 | tr '\n' ' ')"
  done
done
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for m in 1 16; do
  room 40 "ncu $m" || continue
  timeout 40 $ncu --clock-control none -k regex:"SmallM" --launch-skip 3 --launch-count 2 \
    --metrics gpu__time_duration.sum,gpc__cycles_elapsed.max,sm__cycles_active.min,sm__cycles_active.avg,sm__cycles_active.max,smsp__inst_executed.sum \
    $b/bin/fp4q_bench --only GEMM --gemm-m $m --iters 5 --out $o/n.json > $o/ncu-$m.txt 2>&1
  echo "ncu $m rc=$?"
  grep -E "^  [a-zA-Z].*\(|duration|cycles|inst_exec" $o/ncu-$m.txt | sed 's/(unnamed namespace)//' | cut -c1-90
done
