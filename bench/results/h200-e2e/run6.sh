#!/usr/bin/env bash
# Device call 6 (repository root, .bundle carried): the code as it is (the inline item table,
# the restore as before) with the new test of every table size.
#   1. fp4q_cuda_test's step, one-pass and batch tests, ItemTablesOfEverySizeMatchCpu among them
#   2. memcheck over ItemTablesOfEverySizeMatchCpu
#   3. tests/python/gpu_ipc_check.py --steps 100 (fp4q.optim through fp4qd by CUDA IPC)
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
begin e6
room 150 tests && timeout 150 $b/bin/fp4q_cuda_test \
  --gtest_filter='*OnePass*:*Step*:*LeanSgd*:*Batches*:*LongWarp*:*ItemTables*' \
  > $o/cuda-tests.txt 2>&1
echo "tests rc=$?"; grep -E "^\[ +(FAILED|PASSED|SKIPPED) |ItemTables" $o/cuda-tests.txt
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
if room 120 memcheck; then
  timeout 120 $cs --tool memcheck $b/bin/fp4q_cuda_test --gtest_filter='*ItemTables*' \
    > $o/memcheck.txt 2>&1
  echo "memcheck rc=$?"; grep -E "^\[ +(FAILED|PASSED) |ERROR SUMMARY" $o/memcheck.txt
fi
if room 130 "gpu_ipc_check"; then
  timeout 130 python3 tests/python/gpu_ipc_check.py --fp4qd $b/bin/fp4qd --out $o/gpu_ipc_check \
    --steps 100 > $o/gpu_ipc_check.txt 2>&1
  echo "gpu_ipc_check rc=$?"; tail -2 $o/gpu_ipc_check.txt
fi
