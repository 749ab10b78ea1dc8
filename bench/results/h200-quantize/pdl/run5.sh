#!/usr/bin/env bash
# Device call 5 (repository root, .bundle carried; .bundle/alt/libfp4q_cuda.so.gz is the module
# of ede26aa): on an H200 first the Python GPT-2 step and the C++ 8192 x 8192 steps; then
# the small-call rows, new module against old in the order
# old new new old old new new old (drift cancels), to settle call 4's noisy rounds.
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
begin q5 "alt $(cat $b/alt/COMMIT 2>/dev/null)"
if grep -q H200 $o/gpu.txt; then  # first what has waited for an H200 (run2.sh's part)
  trainer default
  bw=$(python3 -c "import json;print(json.load(open('$o/trainer-step-default.json'))[
    'copy_bandwidth_bytes_per_s'] / 1e9)" 2>/dev/null || echo 4200)
  start_fp4qd $bw
  step_pair 8192 1 70 60 --model square8192 --iters 300
  kill $pid 2>/dev/null; wait $pid 2>/dev/null
fi
gunzip -f $b/alt/libfp4q_cuda.so.gz
i=0
for m in old new new old old new new old; do
  i=$((i + 1))
  mod=$b/bin/libfp4q_cuda.so; [[ $m == old ]] && mod=$b/alt/libfp4q_cuda.so
  room 30 "small $m $i" || continue
  FP4Q_CUDA_MODULE=$mod timeout 30 stdbuf -oL $b/bin/fp4q_bench --only "quantize small" \
    --out $o/small-$i-$m.json > $o/small-$i-$m.txt 2>&1
  echo "small $i $m rc=$? ($SECONDS s)"; grep -E "wall" $o/small-$i-$m.txt | grep -v "^|" |
    grep -E "^empty kernel|^quantize"
done
