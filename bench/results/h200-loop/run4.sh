#!/usr/bin/env bash
# The synchronous step in the training loop with the Python client's sleep-then-poll wait for a
# step reply expected late (fp4q._fast_socket.AUTO_WAKE_MAX: the step is sent with a ready
# signal while the backward pass runs, and its reply comes once that and the step are done),
# against the same client with the rule off (no_wake.py: slept for throughout), alternating, two
# rounds each: bench/train_loop.py, torch's SGD and `fp4q.optim.SGD` without overlap, the
# 6-layer d_model 512 model, batch 256 x 128, 5 rounds a run, under CUDA MPS as in run1.sh.
# Repository root, the whole .bundle carried (fp4qd of b0d593e or later; the client is the
# working tree's).
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
begin loop8 "sync loop: sleep-then-poll on and off"
mps_start
args=(--fp4qd "$b/bin/fp4qd" --variant=fp4q --layers=6 --d-model=512 --heads=8 --rounds 5
      --batch 256)
for r in 1 2; do
  for m in wake sleep; do
    room 70 "$m-$r" || continue
    script=bench/train_loop.py
    [[ $m == sleep ]] && script=bench/results/h200-loop/no_wake.py
    timeout 70 python3 $script "${args[@]}" --out $o/sync-$m-$r.json > $o/sync-$m-$r.txt 2>&1
    echo "$m-$r rc=$? ($SECONDS s)"
    grep -E "^fp4q |worker's stream|waits" $o/sync-$m-$r.txt
  done
done
mps_stop
echo "done ($SECONDS s)"
