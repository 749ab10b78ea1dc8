#!/usr/bin/env bash
# Device call 2 (repository root, .bundle carried), the quantize kernels launched plainly again
# (call 1 measured them as programmatic launches: slower for small calls). On an H200 first what
# has waited for one: bench/trainer_step.py over GPT-2 (with the single 8192 x 8192 update,
# torch's optimizers in the same run) and the C++ one-pass steps of GPT-2 and 8192 x 8192
# through fp4qd. Then on any GPU:
#   1. fp4q_cuda_test: the chained-calls test, the step, one-pass and GEMM tests (the launch
#      helper they share moved to pdl.cuh)
#   2. fp4q_bench's small-call rows with the host's enqueue time per call, two rounds
#   3. the whole fp4q_bench (every row, its baselines in the same run)
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
begin q2
if grep -q H200 $o/gpu.txt; then
  trainer default
  bw=$(python3 -c "import json;print(json.load(open('$o/trainer-step-default.json'))[
    'copy_bandwidth_bytes_per_s'] / 1e9)" 2>/dev/null || echo 4200)
  start_fp4qd $bw
  step_pair gpt2 1 70 60 --model gpt2-small --iters 300
  step_pair 8192 1 70 60 --model square8192 --iters 300
  kill $pid 2>/dev/null; wait $pid 2>/dev/null
fi
room 90 tests && timeout 90 $b/bin/fp4q_cuda_test \
  --gtest_filter='CudaTest.CallsBackToBack*:*OnePass*:*Step*:*LeanSgd*:MatmulTest.*' \
  > $o/cuda-tests.txt 2>&1
echo "tests rc=$?"; grep -E "^\[ +(FAILED|PASSED|SKIPPED) |tests ran" $o/cuda-tests.txt | head
for r in 1 2; do
  room 30 "small $r" || continue
  timeout 30 stdbuf -oL $b/bin/fp4q_bench --only "quantize small" \
    --out $o/small-$r.json > $o/small-$r.txt 2>&1
  echo "small $r rc=$? ($SECONDS s)"; grep -E "wall" $o/small-$r.txt | grep -v "^|"
done
room 240 "whole bench" && timeout 240 stdbuf -oL $b/bin/fp4q_bench --out $o/bench-all.json \
  > $o/bench-all.txt 2>&1
echo "whole bench rc=$? ($SECONDS s)"; grep -E "^\|" $o/bench-all.txt | cut -d'|' -f2-10 | head -80
