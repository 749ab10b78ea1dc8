#!/usr/bin/env bash
# fp4qd --idle_inline on a GPU, on and off (call 3 of README.md): a fast socket request whose
# device is idle runs on its connection's thread, with a CUDA stream of its own, instead of
# waking a device worker. In order of importance, each part only if it fits the LIMIT:
#   1. tests/python/gpu_ipc_check.py with the checks' calls over the fast socket and
#      --idle_inline=true (every check: IPC bit-identical to inline, one-pass steps, fp4q.optim,
#      overlap and ready signals);
#   2. the Python client's phases of the train suite's synchronous step in its loop (MODES=none:
#      its forward and backward passes, about 7 ms, between steps, in which fp4qd's worker
#      sleeps), the flag on and off alternating, two rounds (on the H100s without the flag the
#      device queue took 45-52 us there);
#   3. the same for one 8192 x 8192 step back to back (delayed scaling, one pass).
# Repository root, the whole .bundle carried (a bundle of 7de3544 or later).
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
begin loop3 "idle_inline"
if room 150 "gpu_ipc_check"; then
  timeout 150 python3 tests/python/gpu_ipc_check.py --fp4qd $b/bin/fp4qd --out $o/ipc \
    --steps 100 --fast-socket /tmp/fp4q-idle-inline.sock --fp4qd-arg=--idle_inline=true \
    > $o/gpu_ipc_check.txt 2>&1
  echo "gpu_ipc_check rc=$?"; tail -3 $o/gpu_ipc_check.txt
fi
for r in 1 2; do
  for m in on off; do
    a=""; [[ $m == on ]] && a="--idle_inline=true"
    client_phases loop-$m-$r 40 MODES=none N=400 FP4QD_ARGS="$a"
  done
done
for m in on off; do
  a=""; [[ $m == on ]] && a="--idle_inline=true"
  client_phases single-$m 40 MODES=single SCALING=delayed ONE_PASS=1 N=600 FP4QD_ARGS="$a"
done
echo "done ($SECONDS s)"
