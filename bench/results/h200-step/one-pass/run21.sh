#!/usr/bin/env bash
# Device call 21 (repository root, .bundle carried): what the lanes README listed as not
# measured. Through fp4qd on the CUDA backend:
#   1. the trainer's step with stochastic rounding beside round-to-nearest (fp4q bench-step,
#      GPT-2-small, delayed scaling, two passes and one), since c96afac's SR noise change;
#   2. one 8192x8192 bf16 Quantize by CUDA IPC over the fast socket from Python
#      (bench/ipc_quantize_latency.py) with the second-pass quantize kernels.
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
begin r21
copy=${COPY_GBPS:-3028}
start_fp4qd $copy
step_pair gpt2-rtn 1 60 60 --model gpt2-small --iters 300
step_pair gpt2-sr 1 60 60 --model gpt2-small --iters 300 --rounding sr
if room 60 "ipc quantize"; then
  timeout 60 python3 bench/ipc_quantize_latency.py --server unix://$d/g.sock --device cuda \
    --fast-socket $d/f.sock --shape 8192x8192 --dtype bf16 --iters 200 \
    --json $o/ipc-quantize-fast.json > $o/ipc-quantize-fast.txt 2>&1
  echo "ipc quantize rc=$?"; tail -12 $o/ipc-quantize-fast.txt
fi
kill $pid 2>/dev/null; wait $pid 2>/dev/null
