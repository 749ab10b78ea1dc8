#!/usr/bin/env bash
# Runs ON the GPU machine, from the repository root, with a bundle made by
# scripts/device/service-bundle.sh. The service-level checks of issues 3, 6 and 8:
#   1. tests/server/ipc_gpu_test.cc: two processes, CUDA IPC in place vs inline, /metrics
#   2. one CUDA fp4qd (Unix socket + TCP loopback): `fp4q bench` small-RPC load (32 clients and
#      1 client) and bench/ipc_quantize_latency.py (8192x8192 bf16 Quantize by CUDA IPC)
#   3. tests/python/gpu_ipc_check.py: the Python client's IPC, caching and training checks
# Everything lands in $OUT/results.tgz (the device tool returns at most 8 files) plus
# $OUT/summary.txt.
#   bash service_h200.sh BUNDLE_DIR [LOAD_SECONDS (default 30)]
set -uo pipefail
b=$(cd "${1:?usage: service_h200.sh BUNDLE_DIR}" && pwd)
load_s=${2:-30}
out=${OUT:-$PWD/h200-out}
work=/tmp/fp4q-h200
rm -rf "$work" && mkdir -p "$work/py"
chmod +x "$b"/bin/* 2>/dev/null
export LD_LIBRARY_PATH="$b/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export FP4QD_BINARY="$b/bin/fp4qd" FP4Q_CUDA_MODULE="$b/bin/libfp4q_cuda.so"
export PYTHONUNBUFFERED=1
summary="$work/summary.txt"
note() { echo "$*" | tee -a "$summary"; }

note "commit: $(cat "$b/COMMIT" | tr '\n' ' ')"
note "gpu: $(nvidia-smi --query-gpu=name,driver_version,uuid --format=csv,noheader)"

# 1. Two-process IPC test.
"$b/bin/fp4q_ipc_gpu_test" > "$work/ipc_gpu_test.log" 2>&1
note "ipc_gpu_test: exit $? ($(grep -E '^\[  (PASSED|FAILED)' "$work/ipc_gpu_test.log" | tr '\n' ' '))"

# 2. Load and IPC latency against one CUDA fp4qd.
sock=$work/fp4qd.sock
"$b/bin/fp4qd" --backend cuda --allow_cuda_ipc --unix_socket "$sock" \
  --listen 127.0.0.1:50051 --metrics_listen 127.0.0.1:9450 --workers 16 \
  > "$work/fp4qd.out" 2> "$work/fp4qd.log" &
pid=$!
for _ in $(seq 100); do grep -q "listening on" "$work/fp4qd.out" 2>/dev/null && break; sleep 0.1; done
note "fp4qd: $(head -n1 "$work/fp4qd.out")"
"$b/bin/fp4q" --server 127.0.0.1:50051 bench --clients 32 --duration "$load_s" --warmup 5 \
  --mix quantize=4,qdq=2,dequantize=1,update=2,get=1,list=1,info=1,keepalive=1 \
  --shape 16x256 --server-pid "$pid" --json "$work/h200-load.json" > "$work/load-32.txt" 2>&1
note "bench 32 clients: exit $?"
"$b/bin/fp4q" --server 127.0.0.1:50051 bench --clients 1 --duration 10 \
  --mix list=1,info=1,keepalive=1 --server-pid "$pid" \
  --json "$work/h200-load-1client.json" > "$work/load-1.txt" 2>&1
note "bench 1 client: exit $?"
PYTHONPATH=client/python python3 bench/ipc_quantize_latency.py --server "unix://$sock" \
  --device cuda --shape 8192x8192 --dtype bf16 --iters 200 \
  --json "$work/h200-ipc-quantize.json" > "$work/ipc-latency.txt" 2>&1
note "ipc_quantize_latency: exit $? $(tail -n 3 "$work/ipc-latency.txt" | tr '\n' ' ')"
kill -TERM "$pid"; wait "$pid"
note "fp4qd SIGTERM exit: $?"

# 3. The Python client's GPU checks.
PYTHONPATH=client/python:tests/python python3 tests/python/gpu_ipc_check.py \
  --fp4qd "$b/bin/fp4qd" --out "$work/py" --steps 200 > "$work/py/py_run.txt" 2>&1
note "gpu_ipc_check: exit $? ($(tail -n 1 "$work/py/py_run.txt"))"

mkdir -p "$out"
tar czf "$out/results.tgz" -C /tmp fp4q-h200 --exclude='*.sock'
cp "$summary" "$out/summary.txt"
