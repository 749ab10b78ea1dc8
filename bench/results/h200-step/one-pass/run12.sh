#!/usr/bin/env bash
# Device call 12 (repository root, .bundle carried): the Llama-3-8B-shaped step from Python
# (8 of the 32 layers: torch's optimizers need fp32 master weights beside fp4qd's state, and
# the whole model does not fit one GPU with them), beside the same 8 layers from C++ in the
# same run. Each only if it fits (room, LIMIT):
#   1. bench/trainer_step.py --models llama3-8b --llama-layers 8: fp4q.optim over the fast
#      socket and gRPC, torch's foreach SGD and fused AdamW, the bytes floor
#   2. fp4q bench-step --model llama3-8b --layers 8 from C++ (two passes, then one)
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
begin r12
room 300 "trainer_step llama" && timeout 300 python3 bench/trainer_step.py --fp4qd $b/bin/fp4qd \
  --models llama3-8b --llama-layers 8 --behind-ms 0 --steps 20 --warmup 3 \
  --json $o/trainer-step-llama8.json > $o/trainer-step-llama8.txt 2>&1
echo "trainer_step llama rc=$?"
grep -E "^copy|wait|delayed scaling|foreach|fused|floor" $o/trainer-step-llama8.txt | head -16
bw=$(python3 -c "import json;print(json.load(open('$o/trainer-step-llama8.json'))[
  'copy_bandwidth_bytes_per_s'] / 1e9)" 2>/dev/null || echo 4200)
start_fp4qd $bw
step_pair llama8 1 90 120 --model llama3-8b --layers 8 --iters 20 --warmup 3
kill $pid 2>/dev/null; wait $pid 2>/dev/null
