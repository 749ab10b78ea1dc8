#!/usr/bin/env bash
# Fast socket heads-ups on a GPU: fp4q.optim's heads-up before a step whose connection sat idle
# (fp4qd's connection thread wakes while the client prepares the step), on and off
# (trainloop.py's HEADS_UP=0: fp4q.Client(fast_socket_heads_up=False)), alternating:
#   1. the Python client's phases of the train suite's synchronous step in its loop
#      (MODES=none: its forward and backward passes, about 7 ms, between steps), two rounds;
#   2. the same model's step with fixed gradients after 7 ms of an idle host (MODES=sleep),
#      two rounds;
#   3. bench/trainer_step.py's GPT-2 step (steps back to back: no heads-ups expected).
# fp4qd with its defaults (--idle_inline on). Repository root, the whole .bundle carried (a
# bundle of b0d593e or later).
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
begin loop6 "heads-ups"
for r in 1 2; do
  for h in 1 0; do
    client_phases loop-h$h-$r 40 MODES=none N=400 HEADS_UP=$h
  done
done
for r in 1 2; do
  for h in 1 0; do
    client_phases sleep-h$h-$r 30 MODES=sleep GAP_MS=7 N=300 HEADS_UP=$h
  done
done
trainer gpt2
grep -h "stats:" $o/phases-*.txt
echo "done ($SECONDS s)"
