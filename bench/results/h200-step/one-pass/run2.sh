#!/usr/bin/env bash
# Device call 2 of one-pass steps (repository root, .bundle carried), after call 1a found the
# decide kernel clearing the one-pass apply's mark in the header (the restore never ran) and
# two test comparisons of the next state that included the outputs: the step tests again, the
# one-pass tests under memcheck, then run1b.sh (through fp4qd) with the rest of the call's time.
set -uo pipefail
source bench/results/h200-step/overlap/env.sh
nvidia-smi --query-gpu=name,driver_version,uuid --format=csv,noheader | tee $o/gpu.txt
echo "commit $FP4Q_COMMIT" | tee -a $o/gpu.txt
timeout 150 $b/bin/fp4q_cuda_test --gtest_filter='*OnePass*:*Step*:*LeanSgd*:*Batches*' \
  > $o/cuda-tests.txt 2>&1
echo "rc=$?" >> $o/cuda-tests.txt; grep -E "^\[ +(FAILED|PASSED|SKIPPED) |rc=" $o/cuda-tests.txt
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
timeout 100 $cs --tool memcheck $b/bin/fp4q_cuda_test --gtest_filter='*OnePass*' \
  > $o/memcheck.txt 2>&1
echo "rc=$?" >> $o/memcheck.txt; grep -E "^\[ +(FAILED|PASSED) |ERROR SUMMARY|rc=" $o/memcheck.txt
cd $OUT && tar czf r2.tgz r && rm -rf r
