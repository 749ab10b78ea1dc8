#!/usr/bin/env bash
# Device call 16 (repository root, .bundle carried): fp4qd's automatic spin (--worker_spin_us
# and --fast_socket_spin_us now default to -1, automatic: spin_policy.h) against both off (0,
# what fp4qd did by default before), alternating, on the Python GPT-2 step's phases
# (trainloop.py, one pass, 1500 steps); then bench/trainer_step.py's GPT-2 rows with fp4qd as
# it starts by default, the parameters in flat buffers and as one tensor each. Each only if it
# fits (room, LIMIT).
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
begin r16
off="--worker_spin_us=0 --fast_socket_spin_us=0"
for i in 1 2; do
  phases auto-$i "" ""
  phases off-$i "" "$off"
done
for layout in flat tensors; do
  room 100 "trainer_step $layout" || continue
  timeout 100 python3 bench/trainer_step.py --fp4qd $b/bin/fp4qd --models gpt2-small \
    --behind-ms 0 --steps 100 --warmup 10 --layout $layout \
    --json $o/trainer-step-$layout.json > $o/trainer-step-$layout.txt 2>&1
  echo "$layout rc=$? $(grep -E 'one pass, fast' $o/trainer-step-$layout.txt)"
done
