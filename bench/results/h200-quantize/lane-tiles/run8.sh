#!/usr/bin/env bash
# Device call 8 (repository root, .bundle carried; .bundle/alt/libfp4q_cuda.so.gz is the module
# of 42b5da5): small quantize calls computing their own global amax with every CTA reducing the
# whole tensor (kCtaAmax, up to 65536 bf16 elements) against the cooperative launch, and the
# two-output quantizer through fp4qd.
#   1. the quantize tests with LargeQuantizeTest.AmaxComputedInTheLaunchMatchesCpuInBothForms;
#      memcheck and racecheck over that test
#   2. fp4q_bench --only "quantize small": new, old, old, new
#   3. fp4q_bench --only "row+col" (the kernels in process), then one 8192 x 8192 bf16 Quantize
#      by CUDA IPC over the fast socket from Python (bench/ipc_quantize_latency.py), amax
#      computed by the server: row + column RHT + SR, row + column RTN, row-wise RHT + SR
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
begin t8 "alt $(cat $b/alt/COMMIT 2>/dev/null)"
room 100 tests && timeout 100 $b/bin/fp4q_cuda_test \
  --gtest_filter='AllModes/QuantizeTest.*:LargeQuantizeTest.*:CudaTest.CallsBackToBack*:*Golden*' \
  > $o/cuda-tests.txt 2>&1
echo "tests rc=$?"; grep -E "^\[ +(FAILED|PASSED|SKIPPED) |tests ran" $o/cuda-tests.txt | head -20
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in memcheck racecheck; do
  room 60 $tool && timeout 60 $cs --tool $tool $b/bin/fp4q_cuda_test \
    --gtest_filter='LargeQuantizeTest.AmaxComputed*' > $o/$tool.txt 2>&1
  echo "$tool rc=$?"; grep -E "^\[ +(FAILED|PASSED) |ERROR SUMMARY|RACECHECK SUMMARY" $o/$tool.txt
done
gunzip -f $b/alt/libfp4q_cuda.so.gz
i=0
for m in new old old new; do
  i=$((i + 1))
  mod=$b/bin/libfp4q_cuda.so; [[ $m == old ]] && mod=$b/alt/libfp4q_cuda.so
  room 20 "small $m $i" || continue
  FP4Q_CUDA_MODULE=$mod timeout 20 stdbuf -oL $b/bin/fp4q_bench --only "quantize small" \
    --out $o/small-$i-$m.json > $o/small-$i-$m.txt 2>&1
  echo "small $i $m rc=$?"
  grep -E "^empty kernel launch|^quantize small" $o/small-$i-$m.txt | cut -c1-100
done
room 40 "row+col in process" && timeout 40 stdbuf -oL $b/bin/fp4q_bench --only "row+col" \
  --out $o/rowcol.json > $o/rowcol.txt 2>&1
echo "row+col rc=$?"; grep -E "^copy|row\+col" $o/rowcol.txt | cut -c1-120
start_fp4qd 3000
for v in "both-rht-sr:outputs=both rounding=sr rht=default" "both-rtn:outputs=both" \
         "row-rht-sr:rounding=sr rht=default"; do
  name=${v%%:*}; opts=(); for kv in ${v#*:}; do opts+=(--option "$kv"); done
  room 40 "ipc $name" || continue
  timeout 40 python3 bench/ipc_quantize_latency.py --server unix://$d/g.sock --device cuda \
    --fast-socket $d/f.sock --shape 8192x8192 --dtype bf16 --iters 200 "${opts[@]}" \
    --json $o/ipc-$name.json > $o/ipc-$name.txt 2>&1
  echo "ipc $name rc=$? $(python3 -c "import json; d = json.load(open('$o/ipc-$name.json'))
print('wall p50 %.1f p99 %.1f, kernel p50 %.1f, server p50 %.1f, %s' % (d['wall_us']['p50'],
      d['wall_us']['p99'], d['kernel_us']['p50'], d['server_us']['p50'], d['rpc_transport']))" 2>&1 | tail -1)"
done
kill $pid 2>/dev/null; wait $pid 2>/dev/null
