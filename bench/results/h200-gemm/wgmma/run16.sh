#!/usr/bin/env bash
# Device call 16 (the whole .bundle carried, its module the one call 15 kept; repository root):
# every GEMM row of fp4q_bench (M = 1 .. 8192, N = K = 8192, cuBLAS bf16 in the process), then
# the user's GEMM through fp4qd at M = 32, 64, 128, 256 (bench/matmul_service.py: Matmul by CUDA
# IPC over the fast socket from Python, beside torch's bf16 matmul in the same process).
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
begin g16
room 110 "every GEMM row" && timeout 110 stdbuf -oL $b/bin/fp4q_bench --out $o/bench-gemm.json \
  --only GEMM > $o/bench-gemm.txt 2>&1
echo "rc=$?"; grep -E "^copy|^GEMM" $o/bench-gemm.txt | cut -c1-150
room 100 "matmul service" && timeout 100 python3 bench/matmul_service.py --fp4qd $b/bin/fp4qd \
  --m 32,64,128,256 --linear-m "" --iters 50 --json $o/matmul-service.json \
  > $o/matmul-service.txt 2>&1
echo "rc=$?"; tail -30 $o/matmul-service.txt | cut -c1-160
