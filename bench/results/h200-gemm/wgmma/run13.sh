#!/usr/bin/env bash
# Device call 13: three K-loop / reduction changes of the wgmma kernel and their merge against
# main's, each built from its branch (none run on a GPU before this call):
#   dec  = .bundle/alt2/ (branch wgmma-decoupled: no CTA barrier a chunk; warps release stages
#          on mbarriers), desc = .bundle/alt3/ (branch wgmma-desc: the chunk's wgmma
#          descriptors as the stage's plus constants), pair = .bundle/alt4/ (branch wgmma-pair:
#          K split in two runs as 1 x 1 x 2 clusters, slice 1 hands its sums over DSMEM; its own
#          test binary with WgmmaKSplitInTwo), all3 = .bundle/alt5/ (branch wgmma-all3: the
#          three merged; pair's test binary); old = the bundle's module (main).
#   1. the wgmma kernel's tests with each new module; memcheck over the wgmma tests with each
#   2. fp4q_bench --only GEMM at M = 32, 64, 128, 256: old dec desc pair all3, then reversed
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
begin g13 "dec $(cat $b/alt2/COMMIT), desc $(cat $b/alt3/COMMIT), pair $(cat $b/alt4/COMMIT)\
, all3 $(cat $b/alt5/COMMIT)"
gunzip -f $b/alt2/new.so.gz $b/alt3/new.so.gz $b/alt4/new.so.gz $b/alt5/new.so.gz \
  $b/alt4/fp4q_cuda_test.gz
chmod +x $b/alt4/fp4q_cuda_test
declare -A mod=([old]=$b/bin/libfp4q_cuda.so [dec]=$b/alt2/new.so [desc]=$b/alt3/new.so
  [pair]=$b/alt4/new.so [all3]=$b/alt5/new.so)
declare -A test=([dec]=$b/bin/fp4q_cuda_test [desc]=$b/bin/fp4q_cuda_test
  [pair]=$b/alt4/fp4q_cuda_test [all3]=$b/alt4/fp4q_cuda_test)
f='MatmulTest.Wgmma*:MatmulTest.WithinTolerance*:MatmulTest.DecodeShapes*'
for v in dec desc pair all3; do
  room 60 "tests $v" && FP4Q_CUDA_MODULE=${mod[$v]} timeout 60 ${test[$v]} --gtest_filter=$f \
    > $o/test-matmul-$v.txt 2>&1
  echo "tests $v rc=$?"; grep -E "^\[ +(OK|PASSED|FAILED) " $o/test-matmul-$v.txt
done
i=0
for v in old dec desc pair all3 all3 pair desc dec old; do
  i=$((i + 1))
  room 30 "gemm $v $i" || continue
  FP4Q_CUDA_MODULE=${mod[$v]} timeout 30 $b/bin/fp4q_bench --out $o/gemm-$i-$v.json --only GEMM \
    --gemm-m 32,64,128,256 > $o/gemm-$i-$v.txt 2>&1
  echo "== $i $v rc=$?"; grep -E "^GEMM|^copy" $o/gemm-$i-$v.txt | cut -c1-80
done
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for v in all3 pair dec desc; do
  room 70 "memcheck $v" && FP4Q_CUDA_MODULE=${mod[$v]} timeout 70 $cs --tool memcheck \
    ${test[$v]} --gtest_filter='MatmulTest.Wgmma*:MatmulTest.WithinToleranceOfCpuReference' \
    > $o/memcheck-$v.txt 2>&1
  echo "memcheck $v rc=$?"; grep -E "ERROR SUMMARY|^\[ +(PASSED|FAILED) " $o/memcheck-$v.txt
done
