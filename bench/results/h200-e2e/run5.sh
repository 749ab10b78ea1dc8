#!/usr/bin/env bash
# Device call 5 (repository root, .bundle carried; .bundle/alt/libfp4q_cuda.so.gz is the module
# of 75dcdb0): the code as it is (5a3e9a7: the item table in the init launch, the one-pass
# restore at two CTAs an SM).
#   1. the whole fp4q_cuda_test
#   2. memcheck over the step, one-pass and long-warp tests
#   3. fp4q_bench's SGD + EF delayed rows: new (5a3e9a7), old (75dcdb0: restore at six CTAs an
#      SM), new, old
#   4. bench/trainer_step.py over GPT-2: the model's step and one 8192x8192 weight from Python
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
begin e5 "alt $(cat $b/alt/COMMIT 2>/dev/null)"
room 200 tests && timeout 200 $b/bin/fp4q_cuda_test > $o/cuda-test.txt 2>&1
echo "tests rc=$?"; grep -E "^\[ +(FAILED|PASSED|SKIPPED) |tests ran" $o/cuda-test.txt | head -12
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
if room 120 memcheck; then
  timeout 120 $cs --tool memcheck $b/bin/fp4q_cuda_test \
    --gtest_filter='*OnePass*:*StepRefusals*:*StepMatchesCpuForEveryVariant*:*Batches*' \
    > $o/memcheck.txt 2>&1
  echo "memcheck rc=$?"; grep -E "^\[ +(FAILED|PASSED) |ERROR SUMMARY" $o/memcheck.txt
fi
for r in 1 2; do ab_bench $r 40 "SGD + EF, delayed"; done 2>&1 | grep -v "^step"
for f in $o/bench-*-?.txt; do echo "$(basename $f):"; grep -E "^step" $f | cut -c1-85; done
if room 170 "trainer step"; then
  timeout 170 python3 bench/trainer_step.py --fp4qd $b/bin/fp4qd --models gpt2-small \
    --behind-ms 0 --steps 100 --warmup 10 --json $o/trainer-step.json \
    > $o/trainer-step.txt 2>&1
  echo "trainer step rc=$?"; grep -E "^fp4q SGD|^torch foreach|^bytes floor, SGD|^one 8192" $o/trainer-step.txt
fi
