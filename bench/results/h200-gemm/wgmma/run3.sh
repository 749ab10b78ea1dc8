#!/usr/bin/env bash
# Device call 3: B's load buffers reloaded right after their decode (no register copies, 2-4
# chunks of loads in flight): the GEMM tests, the GEMM rows new / old / new, memcheck over the
# wgmma shapes.
set -u
source bench/results/h200-step/overlap/env.sh
new=$b/bin/libfp4q_cuda.so
old=$b/bin/libfp4q_cuda_old.so
nvidia-smi --query-gpu=name,uuid,driver_version --format=csv,noheader
timeout 120 $b/bin/fp4q_cuda_test --gtest_filter='*Matmul*:*Gemm*' > $o/test-matmul.txt 2>&1
echo "test rc=$?"; grep -E "^\[  (PASSED|FAILED) |tests ran" $o/test-matmul.txt | head
for v in new old new; do
  m=$new; [[ $v == old ]] && m=$old
  FP4Q_CUDA_MODULE=$m timeout 150 $b/bin/fp4q_bench --out /tmp/g.json --only GEMM \
    --gemm-m 16,32,64,128,256,512 > /tmp/g.txt 2>&1
  echo "== $v rc=$?"; grep -E "^GEMM|copy" /tmp/g.txt | tee -a $o/gemm-$v.txt
done
timeout 200 compute-sanitizer --tool memcheck $b/bin/fp4q_cuda_test \
  --gtest_filter='MatmulTest.Wgmma*:MatmulTest.WithinToleranceOfCpuReference' > /tmp/mc.txt 2>&1
echo "memcheck rc=$?"; grep -E "ERROR SUMMARY|PASSED|FAILED" /tmp/mc.txt | tee $o/memcheck.txt
