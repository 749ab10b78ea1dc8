#!/usr/bin/env bash
# Device call 14: the wgmma GEMM's A prepare kernel, a thread a word of A's codes (new =
# .bundle/alt6/: module and fp4q_cuda_test of the commit in its COMMIT) against a thread a
# 16-byte row (old = .bundle/alt5/, the module of the merged wgmma-all3 branch: main's kernel
# but for the prepare).
#   1. the GEMM tests with the new module and its test binary; memcheck over the wgmma tests
#   2. fp4q_bench --only GEMM at M = 17, 32, 64, 128, 256: old, new, new, old
#   3. every kernel of the M = 128 and 256 GEMM rows under Nsight Compute (durations), new
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
begin g14 "new $(cat $b/alt6/COMMIT), old $(cat $b/alt5/COMMIT)"
gunzip -f $b/alt5/new.so.gz $b/alt6/new.so.gz $b/alt6/fp4q_cuda_test.gz
chmod +x $b/alt6/fp4q_cuda_test
old=$b/alt5/new.so; new=$b/alt6/new.so; t=$b/alt6/fp4q_cuda_test
room 120 tests && FP4Q_CUDA_MODULE=$new timeout 120 $t --gtest_filter='MatmulTest.*' \
  > $o/test-matmul.txt 2>&1
echo "tests rc=$?"; grep -E "^\[ +(OK|PASSED|FAILED) " $o/test-matmul.txt
i=0
for v in old new new old; do
  i=$((i + 1)); m=$old; [[ $v == new ]] && m=$new
  room 30 "gemm $v $i" || continue
  FP4Q_CUDA_MODULE=$m timeout 30 $b/bin/fp4q_bench --out $o/gemm-$i-$v.json --only GEMM \
    --gemm-m 17,32,64,128,256 > $o/gemm-$i-$v.txt 2>&1
  echo "== $i $v rc=$?"; grep -E "^GEMM|^copy" $o/gemm-$i-$v.txt | cut -c1-80
done
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for M in 128 256; do
  room 60 "ncu $M" || continue
  FP4Q_CUDA_MODULE=$new timeout 60 $ncu --clock-control none --section SpeedOfLight \
    $b/bin/fp4q_bench --out /tmp/n.json --only GEMM --gemm-m $M --iters 3 > $o/ncu-all-m$M.txt 2>&1
  echo "ncu $M rc=$?"
  grep -E "^  [A-Za-z_].*\(|Duration" $o/ncu-all-m$M.txt | paste - - | grep -E "Prepare|Wgmma" \
    | awk '{print $1, $(NF)}' | sort | uniq -c
  gzip $o/ncu-all-m$M.txt
done
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
room 90 memcheck && FP4Q_CUDA_MODULE=$new timeout 90 $cs --tool memcheck $t \
  --gtest_filter='MatmulTest.Wgmma*:MatmulTest.WithinToleranceOfCpuReference' \
  > $o/memcheck.txt 2>&1
echo "memcheck rc=$?"; grep -E "ERROR SUMMARY|^\[ +(PASSED|FAILED) " $o/memcheck.txt
