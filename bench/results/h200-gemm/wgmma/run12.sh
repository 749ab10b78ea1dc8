#!/usr/bin/env bash
# Device call 12 (branch wgmma-pair): output tiles whose K is split in two run as 1 x 1 x 2
# clusters, slice 1 handing its sums to slice 0 through shared memory. new = .bundle/alt4/
# (new.so.gz, and fp4q_cuda_test.gz with the WgmmaKSplitInTwo test, both built from the commit in
# .bundle/alt4/COMMIT); old = the bundle's module (main).
#   1. the wgmma kernel's tests with the new module and test binary; memcheck over the wgmma
#      tests (WgmmaKSplitInTwo included)
#   2. fp4q_bench --only GEMM at M = 32, 64, 128, 256: old, new, new, old
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
begin g12 "new $(cat $b/alt4/COMMIT)"
gunzip -f $b/alt4/new.so.gz $b/alt4/fp4q_cuda_test.gz; chmod +x $b/alt4/fp4q_cuda_test
old=$b/bin/libfp4q_cuda.so; new=$b/alt4/new.so; t=$b/alt4/fp4q_cuda_test
room 90 tests && FP4Q_CUDA_MODULE=$new timeout 90 $t \
  --gtest_filter='MatmulTest.Wgmma*:MatmulTest.WithinTolerance*:MatmulTest.DecodeShapes*' \
  > $o/test-matmul.txt 2>&1
echo "tests rc=$?"; grep -E "^\[ +(OK|PASSED|FAILED) " $o/test-matmul.txt
i=0
for v in old new new old; do
  i=$((i + 1)); m=$old; [[ $v == new ]] && m=$new
  room 30 "gemm $v $i" || continue
  FP4Q_CUDA_MODULE=$m timeout 30 $b/bin/fp4q_bench --out $o/gemm-$i-$v.json --only GEMM \
    --gemm-m 32,64,128,256 > $o/gemm-$i-$v.txt 2>&1
  echo "== $i $v rc=$?"; grep -E "^GEMM|^copy" $o/gemm-$i-$v.txt | cut -c1-80
done
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
room 90 memcheck && FP4Q_CUDA_MODULE=$new timeout 90 $cs --tool memcheck $t \
  --gtest_filter='MatmulTest.Wgmma*:MatmulTest.WithinToleranceOfCpuReference' \
  > $o/memcheck.txt 2>&1
echo "memcheck rc=$?"; grep -E "ERROR SUMMARY|^\[ +(PASSED|FAILED) " $o/memcheck.txt
