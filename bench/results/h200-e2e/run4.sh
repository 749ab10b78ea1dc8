#!/usr/bin/env bash
# Device call 4 (repository root, .bundle carried; .bundle/alt/libfp4q_cuda.so.gz is the module
# of branch onepass-3ctas: the one-pass RTN apply at three CTAs an SM): the step's item table
# carried in the init kernel's launch ("inline", 75dcdb0) against the host-to-device copy it
# replaced ("copy": the same module with FP4Q_STEP_INLINE_TABLE=0), and the alt module.
#   1. fp4q_cuda_test's step tests (inline tables for the small batches; the 224-item sweep
#      batch and the long-warp batches' tables go by the copy path)
#   2. memcheck over the one-pass, refusal and lean tests (the inline path)
#   3. fp4q_bench's SGD + EF delayed rows (apply, check + apply, one pass) for GPT-2, 8192x8192
#      and the train suite's 16 matrices: inline, copy, alt, twice
#   4. through fp4qd (C++ bench-step, fast socket, kept plans, delayed scaling): GPT-2 and one
#      8192x8192 weight in one pass, fp4qd started inline then copy, twice
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
begin e4 "alt $(cat $b/alt/COMMIT 2>/dev/null)"
gunzip -f $b/alt/libfp4q_cuda.so.gz
step_tests 120
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
if room 100 memcheck; then
  timeout 100 $cs --tool memcheck $b/bin/fp4q_cuda_test \
    --gtest_filter='*OnePass*:*StepRefusals*:*LeanSgd*:*StepMatchesCpuForEveryVariant*' \
    > $o/memcheck.txt 2>&1
  echo "memcheck rc=$?"; grep -E "^\[ +(FAILED|PASSED) |ERROR SUMMARY" $o/memcheck.txt
fi
for r in 1 2; do
  for v in inline copy alt; do
    room 40 "bench $v $r" || continue
    env=""; mod=$b/bin/libfp4q_cuda.so
    [[ $v == copy ]] && env="FP4Q_STEP_INLINE_TABLE=0"
    [[ $v == alt ]] && mod=$b/alt/libfp4q_cuda.so
    env $env FP4Q_CUDA_MODULE=$mod timeout 40 stdbuf -oL $b/bin/fp4q_bench \
      --only "SGD + EF, delayed" --step-models gpt2,8192,train --iters 40 \
      --out $o/bench-$v-$r.json > $o/bench-$v-$r.txt 2>&1
    echo "bench $v $r rc=$?"; grep -E "^step" $o/bench-$v-$r.txt | cut -c1-85
  done
done
for r in 1 2; do
  for v in inline copy; do
    room 70 "fp4qd $v $r" || continue
    if [[ $v == copy ]]; then export FP4Q_STEP_INLINE_TABLE=0; else unset FP4Q_STEP_INLINE_TABLE; fi
    start_fp4qd 3027
    for m in gpt2-small square8192; do
      timeout 30 $S --model $m --iters 300 --one-pass --json $o/cpp-$m-$v-$r.json \
        > $o/cpp-$m-$v-$r.log 2>&1
      echo "$v $r $m rc=$? $(python3 -c "import json;d=json.load(open('$o/cpp-$m-$v-$r.json'));print('wall p50 %.1f us, kernel p50 %.1f us' % (d['wall_us']['p50'], d['kernel_us']['p50']))" 2>&1 | tail -1)"
    done
    kill $pid 2>/dev/null; wait $pid 2>/dev/null
  done
done
unset FP4Q_STEP_INLINE_TABLE
