#!/usr/bin/env bash
# Device call 3 (repository root, .bundle carried; .bundle/alt/libfp4q_cuda.so.gz is the module
# of ede26aa): a backend call's host work trimmed (Staging's buffer lists inline, cudaSetDevice
# only when the thread's device is another).
#   1. the whole fp4q_cuda_test; tests/python/gpu_ipc_check.py through fp4qd
#   2. fp4q_bench's small-call rows, new module against old, three rounds alternating
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
begin q3 "alt $(cat $b/alt/COMMIT 2>/dev/null)"
room 200 tests && timeout 200 $b/bin/fp4q_cuda_test > $o/cuda-test.txt 2>&1
echo "tests rc=$?"; grep -E "^\[ +(FAILED|PASSED|SKIPPED) |tests ran" $o/cuda-test.txt | head -12
room 130 gpu_ipc_check && timeout 130 python3 tests/python/gpu_ipc_check.py --fp4qd $b/bin/fp4qd \
  --out $o/ipc --steps 100 > $o/gpu_ipc_check.txt 2>&1
echo "gpu_ipc_check rc=$?"; tail -1 $o/gpu_ipc_check.txt
gunzip -f $b/alt/libfp4q_cuda.so.gz
for r in 1 2 3; do
  for m in new old; do
    mod=$b/bin/libfp4q_cuda.so; [[ $m == old ]] && mod=$b/alt/libfp4q_cuda.so
    room 30 "small $m $r" || continue
    FP4Q_CUDA_MODULE=$mod timeout 30 stdbuf -oL $b/bin/fp4q_bench --only "quantize small" \
      --out $o/small-$m-$r.json > $o/small-$m-$r.txt 2>&1
    echo "small $m $r rc=$? ($SECONDS s)"; grep -E "wall" $o/small-$m-$r.txt | grep -v "^|" |
      grep -E "^empty kernel|^quantize"
  done
done
