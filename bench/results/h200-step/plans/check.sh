# A second device call (from the repository root, .bundle of 35aed2c carried): the step tests
# under compute-sanitizer memcheck, and tests/python/gpu_ipc_check.py.
set -x
source bench/results/h200-step/overlap/env.sh
nvidia-smi -L > $o/gpu.txt
CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer)
timeout 260 $CS --tool memcheck $b/bin/fp4q_cuda_test \
  --gtest_filter='CudaTest.StepRefusalsMatchCpu:CudaTest.LongWarpRunsMatchCpu' \
  > $o/memcheck-step.txt 2>&1; echo "rc=$?" >> $o/memcheck-step.txt
timeout 150 python3 tests/python/gpu_ipc_check.py --fp4qd $b/bin/fp4qd --steps 100 \
  --out $o/gpu_ipc_check > $o/gpu_ipc_check.log 2>&1; echo "rc=$?" >> $o/gpu_ipc_check.log
cd $OUT && tar czf r.tgz r && rm -rf r
