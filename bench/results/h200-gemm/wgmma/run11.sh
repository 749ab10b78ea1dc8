#!/usr/bin/env bash
# Device call 11: two K-loop changes of the wgmma kernel against main's, each from its branch:
#   dec  = .bundle/alt2/new.so.gz (branch wgmma-decoupled: no CTA barrier a chunk; warps release
#          stages on mbarriers), desc = .bundle/alt3/new.so.gz (branch wgmma-desc: the chunk's
#          wgmma descriptors as the stage's plus constants); old = the bundle's (main).
#   1. the wgmma kernel's tests with dec and with desc; memcheck over the wgmma tests with each
#   2. fp4q_bench --only GEMM at M = 32, 64, 128, 256: old, dec, desc, desc, dec, old
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
begin g11 "dec $(cat $b/alt2/COMMIT), desc $(cat $b/alt3/COMMIT)"
gunzip -f $b/alt2/new.so.gz $b/alt3/new.so.gz
declare -A mod=([old]=$b/bin/libfp4q_cuda.so [dec]=$b/alt2/new.so [desc]=$b/alt3/new.so)
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for v in dec desc; do
  room 60 "tests $v" && FP4Q_CUDA_MODULE=${mod[$v]} timeout 60 $b/bin/fp4q_cuda_test \
    --gtest_filter='MatmulTest.Wgmma*:MatmulTest.WithinTolerance*:MatmulTest.DecodeShapes*' \
    > $o/test-matmul-$v.txt 2>&1
  echo "tests $v rc=$?"; grep -E "^\[ +(PASSED|FAILED) " $o/test-matmul-$v.txt
done
i=0
for v in old dec desc desc dec old; do
  i=$((i + 1))
  room 30 "gemm $v $i" || continue
  FP4Q_CUDA_MODULE=${mod[$v]} timeout 30 $b/bin/fp4q_bench --out $o/gemm-$i-$v.json --only GEMM \
    --gemm-m 32,64,128,256 > $o/gemm-$i-$v.txt 2>&1
  echo "== $i $v rc=$?"; grep -E "^GEMM|^copy" $o/gemm-$i-$v.txt | cut -c1-80
done
for v in dec desc; do
  room 60 "memcheck $v" && FP4Q_CUDA_MODULE=${mod[$v]} timeout 60 $cs --tool memcheck \
    $b/bin/fp4q_cuda_test \
    --gtest_filter='MatmulTest.Wgmma*:MatmulTest.WithinToleranceOfCpuReference' \
    > $o/memcheck-$v.txt 2>&1
  echo "memcheck $v rc=$?"; grep -E "ERROR SUMMARY|^\[ +(PASSED|FAILED) " $o/memcheck-$v.txt
done
