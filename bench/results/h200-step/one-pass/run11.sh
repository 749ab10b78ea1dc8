#!/usr/bin/env bash
# Device call 11 (repository root, .bundle carried): the Python GPT-2 step with the client's
# default busy-polling of step replies, the same step from C++ in the same run, gpu_ipc_check
# (its optim check's odd steps find the stream idle), a short train/run.py for the server's
# share of a small transformer's step, then what fp4qd's own busy-polling changes. In this
# order, each only if it fits (room, LIMIT):
#   1. bench/trainer_step.py over GPT-2, fp4qd as it starts by default
#   2. fp4q bench-step over GPT-2 from C++ (two passes, then one; kept plans, delayed scaling),
#      with the client's automatic spin, then sleeping for each reply (--spin-us 0)
#   3. tests/python/gpu_ipc_check.py
#   4. train/run.py, both tasks, bf16-adamw beside four stored variants, 300 steps each
#   5. bench/trainer_step.py over GPT-2 with fp4qd's --worker_spin_us=3000
#      --fast_socket_spin_us=3000
#   6. python-client/trainloop.py's phases with the client's default
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
begin r11
spin="--worker_spin_us=3000 --fast_socket_spin_us=3000"
trainer default
bw=$(python3 -c "import json;print(json.load(open('$o/trainer-step-default.json'))[
  'copy_bandwidth_bytes_per_s'] / 1e9)" 2>/dev/null || echo 4200)
start_fp4qd $bw
step_pair gpt2 1 70 60 --model gpt2-small --iters 300
step_pair gpt2-sleep 1 70 60 --model gpt2-small --iters 300 --spin-us 0
kill $pid 2>/dev/null; wait $pid 2>/dev/null
room 130 gpu_ipc_check && timeout 130 python3 tests/python/gpu_ipc_check.py --fp4qd $b/bin/fp4qd \
  --out $o/ipc --steps 100 > $o/gpu_ipc_check.txt 2>&1
echo "gpu_ipc_check rc=$?"; tail -1 $o/gpu_ipc_check.txt
grep -o '"ready_steps_idle_and_signalled": [^}]*}' $o/gpu_ipc_check.txt
room 170 train && timeout 170 python3 train/run.py --preset gpu --fp4qd $b/bin/fp4qd \
  --tasks add,text --variants bf16-adamw,rtn-sgd,rtn-ef-sgd,sr-ef-adamw,rtn-ef-adamw \
  --steps 300 --eval-every 100 --out $o/train > $o/train.txt 2>&1
echo "train rc=$?"; tail -25 $o/train.txt
trainer fp4qd-spin $spin
phases default "" ""
