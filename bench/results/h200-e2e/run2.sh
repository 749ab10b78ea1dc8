#!/usr/bin/env bash
# Device call 2 (repository root, .bundle carried): the trainer's step from Python on the code
# as it is, and the checks the README listed as not run since the step kernels became
# programmatic dependent launches (4a7ee26) and the device-wait test was fixed to write its
# ready word from a second thread.
#   1. bench/trainer_step.py over GPT-2 (no Llama) with fp4qd as it starts: the model's step
#      rows, and one 8192x8192 update under current scaling and under delayed scaling in one
#      pass (wall, fp4qd's time, kernels)
#   2. tests/python/gpu_ipc_check.py --steps 100 (fp4q.optim by CUDA IPC against the inline path)
#   3. compute-sanitizer memcheck over the step, one-pass and device-wait tests
#   4. synccheck over the one-pass tests
#   5. fp4q_bench's step rows for GPT-2 and 8192x8192 (the kernels on the GPU, same machine)
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
begin e2
if room 170 "trainer step"; then
  timeout 170 python3 bench/trainer_step.py --fp4qd $b/bin/fp4qd --models gpt2-small \
    --behind-ms 0 --steps 100 --warmup 10 --json $o/trainer-step.json \
    > $o/trainer-step.txt 2>&1
  echo "trainer step rc=$?"; grep -E "^fp4q SGD|^torch|^bytes floor|^one 8192" $o/trainer-step.txt
fi
if room 130 "gpu_ipc_check"; then
  timeout 130 python3 tests/python/gpu_ipc_check.py --fp4qd $b/bin/fp4qd --out $o/gpu_ipc_check \
    --steps 100 > $o/gpu_ipc_check.txt 2>&1
  echo "gpu_ipc_check rc=$?"; tail -4 $o/gpu_ipc_check.txt
fi
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
if room 150 memcheck; then
  timeout 150 $cs --tool memcheck $b/bin/fp4q_cuda_test \
    --gtest_filter='*OnePass*:*Step*:*LeanSgd*:*DeviceWaits*' > $o/memcheck.txt 2>&1
  echo "memcheck rc=$?"; grep -E "^\[ +(FAILED|PASSED|SKIPPED) |ERROR SUMMARY|tests ran" $o/memcheck.txt
fi
if room 80 synccheck; then
  timeout 80 $cs --tool synccheck $b/bin/fp4q_cuda_test --gtest_filter='*OnePass*' \
    > $o/synccheck.txt 2>&1
  echo "synccheck rc=$?"; grep -E "^\[ +(FAILED|PASSED) |ERROR SUMMARY" $o/synccheck.txt
fi
if room 60 "bench step"; then
  timeout 60 stdbuf -oL $b/bin/fp4q_bench --only step --step-models gpt2,8192 --iters 60 \
    --out $o/bench-step.json > $o/bench-step.txt 2>&1
  echo "bench step rc=$?"; grep -E "^copy|^step" $o/bench-step.txt
fi
