#!/usr/bin/env bash
# Device call 15: A's prepare kernel with a striding grid of at most 1 (v1) or 3 (v3) CTAs of
# 128 threads an SM (32 registers, two words a thread a round, loads first), so that the wgmma
# kernel launched after it (programmatic dependent launch) fits beside it and starts its weight
# loads while A is laid out; against the bundle's module (old: a thread a word, a full grid).
# v1 and v3 differ only in the launcher (.bundle/alt7/; COMMIT there names their source).
#   1. the wgmma tests with v1; fp4q_bench --only GEMM at M = 32..256: old v1 v3 v3 v1 old
#   2. the wgmma tests with v3; memcheck over the wgmma tests with v1
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
begin g15 "v1/v3 $(cat $b/alt7/COMMIT)"
gunzip -f $b/alt7/v1.so.gz $b/alt7/v3.so.gz
declare -A mod=([old]=$b/bin/libfp4q_cuda.so [v1]=$b/alt7/v1.so [v3]=$b/alt7/v3.so)
f='MatmulTest.Wgmma*:MatmulTest.WithinTolerance*:MatmulTest.MidM*'
tests() {
  room 60 "tests $1" && FP4Q_CUDA_MODULE=${mod[$1]} timeout 60 $b/bin/fp4q_cuda_test \
    --gtest_filter=$f > $o/test-matmul-$1.txt 2>&1
  echo "tests $1 rc=$?"; grep -E "^\[ +(OK|PASSED|FAILED) " $o/test-matmul-$1.txt
}
tests v1
i=0
for v in old v1 v3 v3 v1 old; do
  i=$((i + 1))
  room 25 "gemm $v $i" || continue
  FP4Q_CUDA_MODULE=${mod[$v]} timeout 25 $b/bin/fp4q_bench --out $o/gemm-$i-$v.json --only GEMM \
    --gemm-m 32,64,128,256 > $o/gemm-$i-$v.txt 2>&1
  echo "== $i $v rc=$?"; grep -E "^GEMM" $o/gemm-$i-$v.txt | cut -c1-62
done
tests v3
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
room 80 memcheck && FP4Q_CUDA_MODULE=${mod[v1]} timeout 80 $cs --tool memcheck \
  $b/bin/fp4q_cuda_test --gtest_filter='MatmulTest.Wgmma*:MatmulTest.WithinToleranceOfCpuReference' \
  > $o/memcheck.txt 2>&1
echo "memcheck rc=$?"; grep -E "ERROR SUMMARY|^\[ +(PASSED|FAILED) " $o/memcheck.txt
