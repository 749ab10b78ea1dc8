#!/usr/bin/env bash
# Device call 1 (repository root, .bundle carried): the lane quantizers, the amax reduction and
# dequantize as programmatic dependent launches (pdl.cuh).
#   1. the whole fp4q_cuda_test (with CudaTest.CallsBackToBackWithoutHostSyncMatchCpu)
#   2. compute-sanitizer memcheck and synccheck over the chained-calls test, memcheck over the
#      lane kernels' large tests, amax and dequantize
#   3. fp4q_bench --only quantize, programmatic ("pdl") and plain (FP4Q_QUANTIZE_PDL=0),
#      alternating, two rounds: every quantize row and the small calls
#   4. an 8192x8192 bf16 Quantize by IPC over the fast socket from Python: RTN, SR, RHT + SR
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
begin q1
room 220 tests && timeout 220 $b/bin/fp4q_cuda_test > $o/cuda-test.txt 2>&1
echo "tests rc=$?"; grep -E "^\[ +(FAILED|PASSED|SKIPPED) |tests ran" $o/cuda-test.txt | head -12
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
room 120 memcheck && timeout 120 $cs --tool memcheck $b/bin/fp4q_cuda_test \
  --gtest_filter='CudaTest.CallsBackToBack*:LargeQuantizeTest.*:CudaTest.AmaxMatchesCpu:CudaTest.Dequantize*' \
  > $o/memcheck.txt 2>&1
echo "memcheck rc=$?"; grep -E "^\[ +(FAILED|PASSED) |ERROR SUMMARY" $o/memcheck.txt
room 60 synccheck && timeout 60 $cs --tool synccheck $b/bin/fp4q_cuda_test \
  --gtest_filter='CudaTest.CallsBackToBack*' > $o/synccheck.txt 2>&1
echo "synccheck rc=$?"; grep -E "^\[ +(FAILED|PASSED) |ERROR SUMMARY" $o/synccheck.txt
for r in 1 2; do
  for v in pdl plain; do
    room 45 "bench $v $r" || continue
    env=""; [[ $v == plain ]] && env="FP4Q_QUANTIZE_PDL=0"
    env $env timeout 45 stdbuf -oL $b/bin/fp4q_bench --only quantize \
      --out $o/bench-$v-$r.json > $o/bench-$v-$r.txt 2>&1
    echo "bench $v $r rc=$? ($SECONDS s)"
    grep -E "^copy|^\| quantize (nv|mx)|^\| dequantize" $o/bench-$v-$r.txt | cut -d'|' -f2,4,6
    grep -E "wall" $o/bench-$v-$r.txt | grep -v "^|" | head -20
  done
done
start_fp4qd 3000
for spec in "rtn|" "sr|--option rounding=sr" "rht-sr|--option rounding=sr --option rht=default"; do
  name=${spec%%|*}; opt=${spec#*|}
  room 40 "ipc quantize $name" || continue
  timeout 40 python3 bench/ipc_quantize_latency.py --server unix://$d/g.sock --device cuda \
    --fast-socket $d/f.sock --shape 8192x8192 --dtype bf16 --iters 200 $opt \
    --json $o/ipc-quantize-$name.json > $o/ipc-quantize-$name.txt 2>&1
  echo "ipc quantize $name rc=$?"
  python3 - $o/ipc-quantize-$name.json <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print({k: round(r[k]["p50"], 1) for k in ("wall_us", "kernel_us", "server_us",
                                          "client_and_transport_us")}, r["rpc_transport"],
      r.get("options"))
PY
done
kill $pid 2>/dev/null; wait $pid 2>/dev/null
echo "done ($SECONDS s)"
