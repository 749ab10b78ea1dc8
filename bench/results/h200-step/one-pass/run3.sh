#!/usr/bin/env bash
# Device call 3 of one-pass steps (repository root, .bundle carried, with the CUDA module of the
# commit before the change under test gzipped in .bundle/alt/, for the carry limit): the
# one-pass apply's last CTA deciding and finishing, and one init kernel for a step's header and
# accumulators. Each phase only if it fits (room, overlap/env.sh; LIMIT: this script's share):
#   1. fp4q_cuda_test: the one-pass tests and the step tests (the module under test)
#   2. fp4q_bench's delayed SGD + EF step rows (apply, check + apply, one pass; GPT-2 and
#      8192 x 8192) with the module under test and the one before, alternated, each run with
#      its own copy row (ab_table.py tabulates them)
#   3. the one-pass tests under compute-sanitizer memcheck, then synccheck (the barriers around
#      the last CTA's decision)
# then run1b.sh (through fp4qd) with the rest of the call.
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
gpu_header "alt module $(cat $b/alt/COMMIT 2>/dev/null)"
step_tests 150
for round in 1 2; do ab_bench $round 45 "SGD + EF, delayed"; done
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in memcheck synccheck; do
  room 90 $tool || continue
  timeout 90 $cs --tool $tool $b/bin/fp4q_cuda_test --gtest_filter='*OnePass*' > $o/$tool.txt 2>&1
  echo "rc=$?" >> $o/$tool.txt; grep -E "^\[ +(FAILED|PASSED) |ERROR SUMMARY|rc=" $o/$tool.txt
done
cd $OUT && tar czf r3.tgz r && rm -rf r
