#!/usr/bin/env bash
# Device call 1b of one-pass steps (after run1a.sh; repository root, .bundle carried): steps 4
# and 5 of run1a.sh's list, through fp4qd from C++ and Python. The copy bandwidth is measured
# again here (fp4q_bench's copy row). One round of each model first, then Python's checks, then
# the second rounds, each phase only if it fits in the call (room, overlap/env.sh).
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
begin r1b
timeout 60 $b/bin/fp4q_bench --only copy --iters 20 --out $o/copy.json > $o/copy.txt 2>&1
echo "copy rc=$?"; grep -i copy $o/copy.txt | head -2
bw=$(python3 -c "import json;print(json.load(open('$o/copy.json'))['copy_gbps'])" || echo 4200)
start_fp4qd $bw
step_pair gpt2 1 80 120 --model gpt2-small --iters 300
step_pair sq8192 1 80 120 --model square8192 --iters 300
step_pair llama 1 80 120 --model llama3-8b --iters 20 --warmup 3  # its setup (7e9 parameters) is long
kill $pid; wait $pid
room 150 gpu_ipc_check && timeout 150 python3 tests/python/gpu_ipc_check.py --fp4qd $b/bin/fp4qd --out $o/ipc --steps 100 \
  > $o/gpu_ipc_check.txt 2>&1
echo "gpu_ipc_check rc=$?"; tail -1 $o/gpu_ipc_check.txt
grep -A3 '"optim_one_pass' $o/ipc/gpu_ipc_check.json | head -4
room 150 trainer_step && timeout 150 python3 bench/trainer_step.py --fp4qd $b/bin/fp4qd --models gpt2-small \
  --behind-ms 0 --steps 100 --warmup 10 --json $o/trainer-step-gpt2.json \
  > $o/trainer-step-gpt2.txt 2>&1
echo "trainer_step rc=$?"; grep -E "delayed|foreach SGD|floor" $o/trainer-step-gpt2.txt | head -12
if room 100 "second rounds"; then
  start_fp4qd $bw
  step_pair gpt2 2 80 120 --model gpt2-small --iters 300
  step_pair sq8192 2 80 120 --model square8192 --iters 300
  kill $pid; wait $pid
fi
