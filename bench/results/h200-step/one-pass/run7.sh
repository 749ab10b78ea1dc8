#!/usr/bin/env bash
# Device call 7 (repository root, .bundle carried): what the code after efc0571 changed, on a
# GPU. Each phase only if it fits (room, LIMIT):
#   1. fp4q_cuda_test's step and one-pass tests
#   2. tests/python/gpu_ipc_check.py (the synchronous step with an idle stream now skips the
#      host's synchronize of it: ea784ab; its overlap and ready-signal checks compare every
#      step bit for bit with host-waited steps)
#   3. bench/trainer_step.py over GPT-2 (fp4qd's own time per row now printed beside the
#      kernels'), then the Python step's phases, one pass (python-client/trainloop.py)
#   4. bench/checkpoint.py: GPT-2's stored state checkpointed through fp4qd (device-to-host
#      snapshots), beside the disk's floor and torch.save, and the restart read back
#   5. bench/trainer_step.py over 8 of Llama-3-8B's 32 layers (torch's optimizers need fp32
#      master weights beside fp4qd's state: the whole model does not fit one GPU with them)
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
begin r7
step_tests 120
room 150 gpu_ipc_check && timeout 150 python3 tests/python/gpu_ipc_check.py --fp4qd $b/bin/fp4qd \
  --out $o/ipc --steps 100 > $o/gpu_ipc_check.txt 2>&1
echo "gpu_ipc_check rc=$?"; tail -1 $o/gpu_ipc_check.txt
room 150 trainer_step && timeout 150 python3 bench/trainer_step.py --fp4qd $b/bin/fp4qd \
  --models gpt2-small --behind-ms 0 --steps 100 --warmup 10 --json $o/trainer-step-gpt2.json \
  > $o/trainer-step-gpt2.txt 2>&1
echo "trainer_step rc=$?"; grep -E "row|delayed|foreach|floor|8192" $o/trainer-step-gpt2.txt | head -14
export B=$b
room 60 phases && SCALING=delayed ONE_PASS=1 MODES=gpt2 N=600 timeout 60 \
  python3 bench/results/h200-step/python-client/trainloop.py > $o/phases-1.txt 2>&1
echo "phases rc=$?"; grep -E "mode=|pre-send|per step" $o/phases-1.txt
room 150 checkpoint && timeout 150 python3 bench/checkpoint.py --fp4qd $b/bin/fp4qd --dir /tmp \
  --json $o/checkpoint-gpt2.json > $o/checkpoint-gpt2.txt 2>&1
echo "checkpoint rc=$?"; tail -6 $o/checkpoint-gpt2.txt
room 200 "trainer_step llama" && timeout 200 python3 bench/trainer_step.py --fp4qd $b/bin/fp4qd \
  --models llama3-8b --llama-layers 8 --behind-ms 0 --steps 20 --warmup 3 \
  --json $o/trainer-step-llama8.json > $o/trainer-step-llama8.txt 2>&1
echo "trainer_step llama rc=$?"; grep -E "row|delayed|foreach|floor" $o/trainer-step-llama8.txt | head -14
