#!/usr/bin/env bash
# Device call 19 (repository root, .bundle carried): the checks of the step kernels as
# programmatic dependent launches (compute-sanitizer memcheck and synccheck over the step and
# one-pass tests, then gpu_ipc_check.py), then one round of run17's A/B: fp4q_bench's step
# rows (GPT-2, 8192 x 8192, the train suite) with programmatic launches (the default) and plain
# (FP4Q_STEP_PDL=0). Each only if it fits (room, LIMIT).
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
begin r19
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in memcheck synccheck; do
  room 110 $tool || continue
  timeout 110 $cs --tool $tool $b/bin/fp4q_cuda_test \
    --gtest_filter='*OnePass*:*Step*:*LeanSgd*:*Batches*' > $o/$tool.txt 2>&1
  echo "rc=$?" >> $o/$tool.txt; grep -E "^\[ +(FAILED|PASSED) |ERROR SUMMARY|rc=" $o/$tool.txt
done
room 90 gpu_ipc_check && timeout 90 python3 tests/python/gpu_ipc_check.py --fp4qd $b/bin/fp4qd \
  --out $o/ipc --steps 100 > $o/gpu_ipc_check.txt 2>&1
echo "gpu_ipc_check rc=$?"; tail -1 $o/gpu_ipc_check.txt
pdl_bench 1 90 pdl plain
