#!/usr/bin/env bash
# Every headline figure at this commit in one device call, as run1.sh (fp4q_bench's every row
# beside the copy ceiling and cuBLAS bf16; fp4q bench-step over GPT-2 small, 8192 x 8192 and
# Llama-3-8B-shaped layers in two passes and one; trainer_step.py's GPT-2 step from Python),
# then the client's live GPU tests (LiveCudaIpc.*: bench-step's heads-up cases among them) and
# bench-step over GPT-2 and 8192 x 8192 with a 5 ms gap before each step, heads-ups on and off
# alternating. Repository root, the whole .bundle carried. Meant for an H200; elsewhere it
# records what it got (gpu.txt).
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
begin all4
headline_steps
# With a 5 ms gap before each step (a training loop's forward and backward), heads-ups off and
# on in turn.
for r in 1 2; do
  for h in off on; do
    flag=""; [[ $h == off ]] && flag="--no-heads-up"
    for m in gpt2-small square8192; do
      room 30 "gap $m $h $r" || continue
      timeout 30 $S --model $m --one-pass --iters 200 --warmup 10 --gap-us 5000 $flag \
        --json $o/gap-$m-$h-$r.json > $o/gap-$m-$h-$r.log 2>&1
      echo "gap $m $h $r rc=$? $(python3 -c "import json;d=json.load(open('$o/gap-$m-$h-$r.json'))
print('wall p50 %.1f p90 %.1f us, kernel p50 %.1f, server p50 %.1f, heads-ups %d' % (
  d['wall_us']['p50'], d['wall_us']['p90'], d['kernel_us']['p50'], d['server_us']['p50'],
  d['heads_ups']))" 2>&1 | tail -1)"
    done
  done
done
kill $pid; wait $pid 2>/dev/null
trainer default
if room 60 "live tests"; then
  FP4Q_CLI=$b/bin/fp4q timeout 60 $b/bin/fp4q_client_live_test --gtest_filter='LiveCudaIpc.*' \
    > $o/client-live-test.txt 2>&1
  echo "live tests rc=$?"; grep -E "^\[ +(FAILED|PASSED|SKIPPED|  OK) " $o/client-live-test.txt
fi
echo "done ($SECONDS s)"
