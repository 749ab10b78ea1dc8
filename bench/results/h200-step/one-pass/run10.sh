#!/usr/bin/env bash
# Device call 10 (repository root, .bundle carried), a short one: the Python GPT-2 step through
# fp4qd with the client's default busy-polling of step replies (fast_socket_spin_us=None), then
# gpu_ipc_check (its optim check's odd steps find the stream idle). Each only if it fits.
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
begin r10
room 100 trainer_step && timeout 100 python3 bench/trainer_step.py --fp4qd $b/bin/fp4qd \
  --models gpt2-small --behind-ms 0 --steps 100 --warmup 10 --json $o/trainer-step-default.json \
  > $o/trainer-step-default.txt 2>&1
echo "trainer_step rc=$?"; grep -E "^copy|delayed scaling|foreach|8192" $o/trainer-step-default.txt
room 100 gpu_ipc_check && timeout 100 python3 tests/python/gpu_ipc_check.py --fp4qd $b/bin/fp4qd \
  --out $o/ipc --steps 100 > $o/gpu_ipc_check.txt 2>&1
echo "gpu_ipc_check rc=$?"; tail -1 $o/gpu_ipc_check.txt
grep -o '"ready_steps_idle_and_signalled": [^}]*}' $o/gpu_ipc_check.txt
