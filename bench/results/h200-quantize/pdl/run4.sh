#!/usr/bin/env bash
# Device call 4 (repository root, .bundle carried; .bundle/alt/libfp4q_cuda.so.gz is the module
# of ede26aa): small tensors (<= 65536 elements) whose quantize computes its own global amax
# reduce it in every CTA (an ordinary launch) instead of a cooperative launch with grid
# barriers; plus the host trims of 06a77ec.
#   1. fp4q_cuda_test's quantize tests (every mode and shape against the CPU backend, amax
#      computed and given), the chained-calls test, the kernel-choice host tests' GPU peers;
#      memcheck and racecheck over the chained-calls test
#   2. fp4q_bench --only quantize: new, old, new, old (the large rows and the small calls)
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
begin q4 "alt $(cat $b/alt/COMMIT 2>/dev/null)"
room 120 tests && timeout 120 $b/bin/fp4q_cuda_test \
  --gtest_filter='AllModes/QuantizeTest.*:LargeQuantizeTest.*:CudaTest.CallsBackToBack*:CudaTest.Qdq*:CudaTest.QuantizeWithErrorFeedback*:*Golden*:CudaTest.Amax*' \
  > $o/cuda-tests.txt 2>&1
echo "tests rc=$?"; grep -E "^\[ +(FAILED|PASSED|SKIPPED) |tests ran" $o/cuda-tests.txt | head
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in memcheck racecheck; do
  room 60 $tool && timeout 60 $cs --tool $tool $b/bin/fp4q_cuda_test \
    --gtest_filter='CudaTest.CallsBackToBack*' > $o/$tool.txt 2>&1
  echo "$tool rc=$?"; grep -E "^\[ +(FAILED|PASSED) |ERROR SUMMARY|RACECHECK SUMMARY" $o/$tool.txt
done
gunzip -f $b/alt/libfp4q_cuda.so.gz
for r in 1 2; do
  for m in new old; do
    mod=$b/bin/libfp4q_cuda.so; [[ $m == old ]] && mod=$b/alt/libfp4q_cuda.so
    room 45 "bench $m $r" || continue
    FP4Q_CUDA_MODULE=$mod timeout 45 stdbuf -oL $b/bin/fp4q_bench --only quantize \
      --out $o/bench-$m-$r.json > $o/bench-$m-$r.txt 2>&1
    echo "bench $m $r rc=$? ($SECONDS s)"
    grep -E "^copy|^\| quantize (nv|mx)|^\| dequantize" $o/bench-$m-$r.txt | cut -d'|' -f2,4,6
    grep -E "wall" $o/bench-$m-$r.txt | grep -v "^|" | grep -E "^empty kernel|^quantize"
  done
done
