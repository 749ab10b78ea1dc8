#!/usr/bin/env bash
# Device call 1 (repository root, .bundle carried): the code as it is after the review's
# refactors (quantize_lane_pairs.cu, AddResidualWords; checked then only by comparing SASS),
# and what the small-m and lanes READMEs listed as not measured through fp4qd.
#   1. the whole fp4q_cuda_test
#   2. compute-sanitizer memcheck over the quantize lanes' large tests, the error-feedback and
#      QDQ tests and the small-M GEMM tests
#   3. bench/matmul_service.py at M = 1 and 16 (the one-launch small-M kernel through fp4qd,
#      fast socket and gRPC, beside torch's bf16 matmul in the same process)
#   4. one 8192x8192 bf16 Quantize by CUDA IPC over the fast socket from Python, 1x16 and 16x16
#   5. fp4q_bench's quantize rows and the GEMM at M = 1 and 16 in process (the kernels' own time),
#      with the small calls' host costs broken down (launch_floor.cu)
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
begin e1
room 200 tests && timeout 200 $b/bin/fp4q_cuda_test > $o/cuda-test.txt 2>&1
echo "tests rc=$?"; grep -E "^\[ +(FAILED|PASSED|SKIPPED) |tests ran" $o/cuda-test.txt | head -12
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
room 110 memcheck && timeout 110 $cs --tool memcheck $b/bin/fp4q_cuda_test \
  --gtest_filter='LargeQuantizeTest.*:CudaTest.Qdq*:CudaTest.QuantizeWithErrorFeedback*:MatmulTest.SmallM*' \
  > $o/memcheck.txt 2>&1
echo "memcheck rc=$?"; grep -E "^\[ +(FAILED|PASSED) |ERROR SUMMARY" $o/memcheck.txt
if room 90 "matmul service"; then
  timeout 90 python3 bench/matmul_service.py --fp4qd $b/bin/fp4qd --m 1,16 --linear-m "" \
    --grpc --json $o/matmul_service.json > $o/matmul_service.txt 2>&1
  echo "matmul service rc=$?"; grep -E "^M=|B stored|torch bf16" $o/matmul_service.txt | head -20
fi
start_fp4qd 3000
for blk in 1x16 16x16; do
  room 40 "ipc quantize $blk" || continue
  timeout 40 python3 bench/ipc_quantize_latency.py --server unix://$d/g.sock --device cuda \
    --fast-socket $d/f.sock --shape 8192x8192 --dtype bf16 --iters 200 --option block=$blk \
    --json $o/ipc-quantize-$blk.json > $o/ipc-quantize-$blk.txt 2>&1
  echo "ipc quantize $blk rc=$?"
  python3 - $o/ipc-quantize-$blk.json <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print({k: round(r[k]["p50"], 1) for k in ("wall_us", "kernel_us", "server_us",
                                          "client_and_transport_us")}, r["rpc_transport"])
PY
done
kill $pid 2>/dev/null; wait $pid 2>/dev/null
room 60 "bench quantize" && timeout 60 stdbuf -oL $b/bin/fp4q_bench --only quantize \
  --out $o/bench-quantize.json > $o/bench-quantize.txt 2>&1
echo "bench quantize rc=$?"; grep -E "^copy|^\| quantize (nv|mx)" $o/bench-quantize.txt | cut -d'|' -f2,4,6
grep -E "host wall|wall," $o/bench-quantize.txt | head -20
room 30 "bench gemm" && timeout 30 $b/bin/fp4q_bench --only GEMM --gemm-m 1,16 \
  --out $o/bench-gemm.json > $o/bench-gemm.txt 2>&1
echo "bench gemm rc=$?"; grep -E "^GEMM" $o/bench-gemm.txt | cut -c1-70
