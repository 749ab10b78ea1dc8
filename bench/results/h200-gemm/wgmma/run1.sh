#!/usr/bin/env bash
# Device call 1 of the wgmma kernel: the GEMM tests, memcheck over the wgmma shapes, and the
# GEMM rows with the new module and the module before it (.bundle/bin/libfp4q_cuda_old.so)
# alternated. Run from the repository root with .bundle carried.
set -u
source bench/results/h200-step/overlap/env.sh
new=$b/bin/libfp4q_cuda.so
old=$b/bin/libfp4q_cuda_old.so
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.max.sm --format=csv > $o/gpu.txt
timeout 120 $b/bin/fp4q_cuda_test --gtest_filter='*Matmul*:*Gemm*' > $o/test-matmul.txt 2>&1
echo "test rc=$?"; tail -4 $o/test-matmul.txt; grep -E "FAILED|rel" $o/test-matmul.txt | head -20
for round in 1 2; do
  for v in new old; do
    m=$new; [[ $v == old ]] && m=$old
    FP4Q_CUDA_MODULE=$m timeout 150 $b/bin/fp4q_bench --out $o/gemm-$v-$round.json --only GEMM \
      --gemm-m 16,32,64,128,256,512 > $o/gemm-$v-$round.txt 2>&1
    echo "== $v $round rc=$?"; grep -E "^GEMM|copy" $o/gemm-$v-$round.txt
  done
done
timeout 200 compute-sanitizer --tool memcheck $b/bin/fp4q_cuda_test \
  --gtest_filter='MatmulTest.Wgmma*:MatmulTest.WithinToleranceOfCpuReference' > $o/memcheck.txt 2>&1
echo "memcheck rc=$?"; grep -E "ERROR SUMMARY|PASSED|FAILED" $o/memcheck.txt | head
