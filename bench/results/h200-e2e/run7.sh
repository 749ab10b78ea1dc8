#!/usr/bin/env bash
# Device call 7 (repository root, .bundle carried; .bundle/alt/libfp4q_cuda.so.gz is the module
# of 75dcdb0, whose quantize kernels are main's): the lane quantizers' SR with the first two
# Philox rounds folded (branch philox-head, "new") against main ("old").
#   1. fp4q_cuda_test's quantize tests (every mode against the CPU backend bit for bit, the large
#      lane-kernel tests, SR at its thresholds)
#   2. fp4q_bench --only quantize: new, old
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
begin e7 "alt $(cat $b/alt/COMMIT 2>/dev/null)"
room 100 tests && timeout 100 $b/bin/fp4q_cuda_test \
  --gtest_filter='AllModes/QuantizeTest.*:LargeQuantizeTest.*:CudaTest.Qdq*:CudaTest.QuantizeWithErrorFeedback*:*Golden*' \
  > $o/cuda-tests.txt 2>&1
echo "tests rc=$?"; grep -E "^\[ +(FAILED|PASSED|SKIPPED) |tests ran" $o/cuda-tests.txt | head
gunzip -f $b/alt/libfp4q_cuda.so.gz
for m in new old; do
  mod=$b/bin/libfp4q_cuda.so; [[ $m == old ]] && mod=$b/alt/libfp4q_cuda.so
  room 60 "bench $m" || continue
  FP4Q_CUDA_MODULE=$mod timeout 60 stdbuf -oL $b/bin/fp4q_bench --only quantize \
    --out $o/bench-$m.json > $o/bench-$m.txt 2>&1
  echo "bench $m rc=$?"; grep -E "^copy|^\| quantize (nv|mx)" $o/bench-$m.txt | cut -d'|' -f2,4,6
done
