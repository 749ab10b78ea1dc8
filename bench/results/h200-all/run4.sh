#!/usr/bin/env bash
# Not yet run. Why the overlapped step held the worker's stream 2.2 ms in call 2 (two GPU
# contexts, batch 256 x 128) where machines before measured about 0.5 ms: the same loop with
# fp4qd's step signals on the device (default) and polled by its host
# (--step_device_signals=false), and with fp4qd's automatic busy-polling off
# (--worker_spin_us=0 --fast_socket_spin_us=0), 5 rounds each (repository root, the whole
# .bundle carried, no alt modules).
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
begin loop4
tl() {  # tl TAG SECONDS [FP4QD FLAGS...]
  local tag=$1 secs=$2 a args=(); shift 2
  for a in "$@"; do args+=("--fp4qd-arg=$a"); done
  room $secs "train_loop $tag" || return 0
  timeout $secs python3 bench/train_loop.py --fp4qd "$b/bin/fp4qd" "${args[@]}" --rounds 5 \
    --batch 256 --out $o/train-loop-$tag.json > $o/train-loop-$tag.txt 2>&1
  echo "$tag rc=$?"; tail -16 $o/train-loop-$tag.txt
}
tl device 150
tl host 150 --step_device_signals=false
tl nospin 150 --worker_spin_us=0 --fast_socket_spin_us=0
echo "done ($SECONDS s)"
