#!/usr/bin/env bash
# Device call 3 of one-pass steps (repository root, .bundle carried, with the CUDA module of the
# commit before the change under test gzipped in .bundle/alt/, for the carry limit): the one-pass apply's last CTA deciding
# and finishing, and one init kernel for a step's header and accumulators.
#   1. fp4q_cuda_test: the one-pass tests and the step tests (the module under test)
#   2. the one-pass tests under compute-sanitizer memcheck, then synccheck (the barriers around
#      the last CTA's decision)
#   3. fp4q_bench's delayed SGD + EF step rows (apply, check + apply, one pass; GPT-2 and
#      8192 x 8192) with the module under test and the one before, alternated twice, each run
#      with its own copy row
# then run1b.sh (through fp4qd) with the rest of the call.
set -uo pipefail
source bench/results/h200-step/overlap/env.sh
[[ -f $b/alt/libfp4q_cuda.so.gz ]] && gunzip -f $b/alt/libfp4q_cuda.so.gz
nvidia-smi --query-gpu=name,driver_version,uuid --format=csv,noheader | tee $o/gpu.txt
echo "commit $FP4Q_COMMIT; alt module $(cat $b/alt/COMMIT 2>/dev/null)" | tee -a $o/gpu.txt
timeout 150 $b/bin/fp4q_cuda_test --gtest_filter='*OnePass*:*Step*:*LeanSgd*:*Batches*' \
  > $o/cuda-tests.txt 2>&1
echo "rc=$?" >> $o/cuda-tests.txt; grep -E "^\[ +(FAILED|PASSED|SKIPPED) |rc=" $o/cuda-tests.txt
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
room 120 memcheck && timeout 120 $cs --tool memcheck $b/bin/fp4q_cuda_test \
  --gtest_filter='*OnePass*' > $o/memcheck.txt 2>&1
echo "rc=$?" >> $o/memcheck.txt; grep -E "^\[ +(FAILED|PASSED) |ERROR SUMMARY|rc=" $o/memcheck.txt
room 120 synccheck && timeout 100 $cs --tool synccheck $b/bin/fp4q_cuda_test \
  --gtest_filter='*OnePass*' > $o/synccheck.txt 2>&1
echo "rc=$?" >> $o/synccheck.txt; grep -E "^\[ +(FAILED|PASSED) |ERROR SUMMARY|rc=" $o/synccheck.txt
for round in 1 2; do
  for m in new old; do
    mod=$b/bin/libfp4q_cuda.so; [[ $m == old ]] && mod=$b/alt/libfp4q_cuda.so
    room 60 "bench $m $round" || continue
    FP4Q_CUDA_MODULE=$mod timeout 60 $b/bin/fp4q_bench --only "SGD + EF, delayed" \
      --out $o/bench-$m-$round.json > $o/bench-$m-$round.txt 2>&1
    echo "bench $m $round rc=$?"; grep -E "^copy|^step" $o/bench-$m-$round.txt
  done
done
cd $OUT && tar czf r3.tgz r && rm -rf r
