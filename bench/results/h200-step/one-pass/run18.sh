#!/usr/bin/env bash
# Device call 18 (repository root, .bundle carried): what the step kernels as programmatic
# dependent launches have not had on a GPU yet, and fp4qd's automatic spin on an H200. Each only
# if it fits (room, LIMIT):
#   1. the step and one-pass tests under compute-sanitizer memcheck and synccheck
#   2. tests/python/gpu_ipc_check.py (overlap=True and ready signals: the step's first kernel
#      queued behind a stream wait, the done signal behind its last)
#   3. bench/trainer_step.py's GPT-2 rows with fp4qd as it starts (automatic spin), twice
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
begin r18
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in memcheck synccheck; do
  room 120 $tool || continue
  timeout 120 $cs --tool $tool $b/bin/fp4q_cuda_test \
    --gtest_filter='*OnePass*:*Step*:*LeanSgd*:*Batches*' > $o/$tool.txt 2>&1
  echo "rc=$?" >> $o/$tool.txt; grep -E "^\[ +(FAILED|PASSED) |ERROR SUMMARY|rc=" $o/$tool.txt
done
room 100 gpu_ipc_check && timeout 100 python3 tests/python/gpu_ipc_check.py --fp4qd $b/bin/fp4qd \
  --out $o/ipc --steps 100 > $o/gpu_ipc_check.txt 2>&1
echo "gpu_ipc_check rc=$?"; tail -1 $o/gpu_ipc_check.txt
for i in 1 2; do trainer auto-$i; done
