#!/usr/bin/env bash
# Device call 10 (branch wgmma-decoupled): the warpgroups released from the per-chunk CTA barrier
# (per-stage mbarriers), against the bundle's module (main: the bundle built from main).
# "new" = .bundle/alt2/new.so.gz (built from the commit in .bundle/alt2/COMMIT).
#   1. the wgmma kernel's GEMM tests with the new module; memcheck over the wgmma tests
#   2. fp4q_bench --only GEMM at M = 32, 64, 128, 256 (the wgmma kernel's): old, new, new, old
#   3. Nsight Compute's per-instruction samples of the new kernel at M = 128 (as call 6)
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
begin g10 "new $(cat $b/alt2/COMMIT)"
gunzip -f $b/alt2/new.so.gz
old=$b/bin/libfp4q_cuda.so; new=$b/alt2/new.so
room 90 tests && FP4Q_CUDA_MODULE=$new timeout 90 $b/bin/fp4q_cuda_test \
  --gtest_filter='MatmulTest.Wgmma*:MatmulTest.WithinTolerance*:MatmulTest.DecodeShapes*' \
  > $o/test-matmul.txt 2>&1
echo "tests rc=$?"; grep -E "^\[ +(PASSED|FAILED) |tests ran" $o/test-matmul.txt | head
i=0
for v in old new new old; do
  i=$((i + 1)); m=$old; [[ $v == new ]] && m=$new
  room 45 "gemm $v $i" || continue
  FP4Q_CUDA_MODULE=$m timeout 45 $b/bin/fp4q_bench --out $o/gemm-$i-$v.json --only GEMM \
    --gemm-m 32,64,128,256 > $o/gemm-$i-$v.txt 2>&1
  echo "== $i $v rc=$?"; grep -E "^GEMM|^copy" $o/gemm-$i-$v.txt | cut -c1-110
done
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
room 90 memcheck && FP4Q_CUDA_MODULE=$new timeout 90 $cs --tool memcheck $b/bin/fp4q_cuda_test \
  --gtest_filter='MatmulTest.Wgmma*:MatmulTest.WithinToleranceOfCpuReference' \
  > $o/memcheck.txt 2>&1
echo "memcheck rc=$?"; grep -E "ERROR SUMMARY|^\[ +(PASSED|FAILED) " $o/memcheck.txt
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
room 60 ncu && FP4Q_CUDA_MODULE=$new timeout 60 $ncu --clock-control none \
  -k regex:WgmmaKernel --launch-skip 3 --launch-count 1 --section SpeedOfLight \
  --section WarpStateStats --section SourceCounters -o $o/m128 $b/bin/fp4q_bench \
  --out /tmp/n.json --only GEMM --gemm-m 128 --iters 5 > $o/ncu-m128.txt 2>&1
echo "ncu rc=$?"
if [[ -f $o/m128.ncu-rep ]]; then
  $ncu -i $o/m128.ncu-rep --page details | grep -E "Duration|Warp Cycles Per Issued|SM Active" \
    | tee $o/details-m128.txt
  $ncu -i $o/m128.ncu-rep --page source --print-source sass --csv | gzip > $o/sass-m128.csv.gz
  rm -f $o/m128.ncu-rep
fi
