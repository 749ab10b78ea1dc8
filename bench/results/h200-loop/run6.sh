#!/usr/bin/env bash
# The step plan check by buffer id alone (ec5bb76) against the three-attribute check (03540f5):
# tests/python/gpu_ipc_check.py with the new client (its buffer id check compares both driver
# calls, also from a thread without a context), then the train suite's loop with
# zero_grad(set_to_none=True) (trainloop.py MODES=none), the two clients alternating.
# Before the call, here (the client before the change, carried as an untracked folder):
#   mkdir -p bench/results/h200-loop/plan-old-client
#   git archive 03540f5 client/python/fp4q | tar -x --strip-components=2 \
#     -C bench/results/h200-loop/plan-old-client
# and remove the folder after the call. Repository root, .bundle carried.
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
export LIMIT=${LIMIT:-280}
begin plan9 "plan check: the working tree's client (buffer id alone) against plan-old-client"
old=$PWD/bench/results/h200-loop/plan-old-client
if room 120 "gpu_ipc_check"; then
  timeout 120 python3 tests/python/gpu_ipc_check.py --fp4qd $b/bin/fp4qd --out $o/ipc \
    --steps 100 --fast-socket /tmp/fp4q-check.sock > $o/gpu_ipc_check.txt 2>&1
  echo "gpu_ipc_check rc=$?"; tail -3 $o/gpu_ipc_check.txt
  grep -E "buffer_id" $o/gpu_ipc_check.txt
fi
for r in 1 2; do
  client_phases new-$r 38 MODES=none N=400
  client_phases old-$r 38 CLIENT=$old MODES=none N=400
done
echo "done ($SECONDS s)"
