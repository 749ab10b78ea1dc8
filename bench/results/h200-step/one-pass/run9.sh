#!/usr/bin/env bash
# Device call 9 (repository root, .bundle carried): the Python GPT-2 step with the client's
# default busy-polling of step replies (fast_socket_spin_us=None), with fp4qd sleeping and
# busy-polling; the Python step's phases; a GPT-2 checkpoint through fp4qd. Each phase only if it
# fits (room, LIMIT):
#   1. bench/trainer_step.py over GPT-2, fp4qd as it starts by default
#   2. the same with fp4qd's --worker_spin_us=3000 --fast_socket_spin_us=3000
#   3. python-client/trainloop.py's phases: the client sleeping for replies (SPIN_US=0), its
#      default, and its default with fp4qd busy-polling
#   4. tests/python/gpu_ipc_check.py (its optim check now also steps with the stream idle)
#   5. bench/checkpoint.py: GPT-2's stored state checkpointed through fp4qd, beside the disk's
#      floor and torch.save, and the restart read back
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
begin r9
spin="--worker_spin_us=3000 --fast_socket_spin_us=3000"
trainer default
trainer fp4qd-spin $spin
phases sleep 0 ""
phases default "" ""
phases default-fp4qd-spin "" "$spin"
room 130 gpu_ipc_check && timeout 130 python3 tests/python/gpu_ipc_check.py --fp4qd $b/bin/fp4qd \
  --out $o/ipc --steps 100 > $o/gpu_ipc_check.txt 2>&1
echo "gpu_ipc_check rc=$?"; tail -1 $o/gpu_ipc_check.txt
grep -o '"ready_steps_idle_and_signalled": [^}]*}' $o/gpu_ipc_check.txt
room 150 checkpoint && timeout 150 python3 bench/checkpoint.py --fp4qd $b/bin/fp4qd --dir /tmp \
  --json $o/checkpoint-gpt2.json > $o/checkpoint-gpt2.txt 2>&1
echo "checkpoint rc=$?"; tail -8 $o/checkpoint-gpt2.txt
