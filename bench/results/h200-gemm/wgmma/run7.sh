#!/usr/bin/env bash
# Device call 7: A's chunks multicast to a cluster of CTAs (each CTA's thread 0 copies 1 / kCs
# of a chunk into every CTA of its cluster; a stage is refilled once every warp of the cluster
# has released it, per-stage mbarriers instead of the CTA barrier). Modules: "old" = the
# bundle's (no cluster), c2 / c4 = clusters of 2 / 4 (.bundle/alt2/, built from this commit with
# FP4Q_WGMMA_CLUSTER 2 / 4).
#   1. the GEMM tests with c2 and c4; memcheck over the wgmma tests with c4
#   2. fp4q_bench --only GEMM at M = 32, 64, 128, 256: old, c2, c4, c4, c2, old
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
begin g7
for c in c2 c4; do gunzip -f $b/alt2/$c.so.gz; done
old=$b/bin/libfp4q_cuda.so
for c in c2 c4; do
  room 60 "tests $c" || continue
  FP4Q_CUDA_MODULE=$b/alt2/$c.so timeout 60 $b/bin/fp4q_cuda_test \
    --gtest_filter='*Matmul*:*Gemm*' > $o/test-matmul-$c.txt 2>&1
  echo "tests $c rc=$?"; grep -E "^\[ +(PASSED|FAILED) |tests ran" $o/test-matmul-$c.txt | head
done
i=0
for v in old c2 c4 c4 c2 old; do
  i=$((i + 1)); m=$old; [[ $v != old ]] && m=$b/alt2/$v.so
  room 45 "gemm $v $i" || continue
  FP4Q_CUDA_MODULE=$m timeout 45 $b/bin/fp4q_bench --out $o/gemm-$i-$v.json --only GEMM \
    --gemm-m 32,64,128,256 > $o/gemm-$i-$v.txt 2>&1
  echo "== $i $v rc=$?"; grep -E "^GEMM|^copy" $o/gemm-$i-$v.txt | cut -c1-110
done
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
room 90 memcheck && FP4Q_CUDA_MODULE=$b/alt2/c4.so timeout 90 $cs --tool memcheck \
  $b/bin/fp4q_cuda_test --gtest_filter='MatmulTest.Wgmma*:MatmulTest.WithinToleranceOfCpuReference' \
  > $o/memcheck-c4.txt 2>&1
echo "memcheck rc=$?"; grep -E "ERROR SUMMARY|^\[ +(PASSED|FAILED) " $o/memcheck-c4.txt
