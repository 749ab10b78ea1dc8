#!/usr/bin/env bash
# Runs ON the GPU machine, from the repository root, with a bundle made by
# scripts/device/service-bundle.sh. The service-level checks of issues 3, 6 and 8, in one device
# call of about 6 minutes (LOAD_SECONDS 20):
#   1. the server GPU tests under compute-sanitizer memcheck: tests/server/ipc_gpu_test.cc (two
#      processes, CUDA IPC in place vs inline, /metrics) and the client's LiveCudaIpc test
#      (tests/client/client_cuda_live_test.cc), child processes (fp4qd) included
#   2. one CUDA fp4qd (Unix socket + TCP loopback, --streams_per_gpu 4): `fp4q bench` mixed load
#      (32 clients) and small RPCs (1 client); `fp4q bench-ipc` (C++) and
#      bench/ipc_quantize_latency.py (Python), both 8192x8192 bf16 Quantize by CUDA IPC; a
#      scrape of /metrics (queue wait, kernel and request histograms)
#   3. the same 32-client load for LOAD_SECONDS/2 against --streams_per_gpu 1 (the old single
#      stream per GPU) and 8, for comparison
#   4. tests/python/gpu_ipc_check.py: the Python client's IPC, caching and training checks
#   5. the fast socket (fp4qd --fast_socket, no gRPC): small RPCs (KeepAlive) and 16x256
#      Quantize with 1 client, the 32-client mix, `fp4q bench-ipc --fast-socket` and the Python
#      latency script with --fast-socket; then the same against a server with
#      --worker_spin_us/--fast_socket_spin_us (busy-polling instead of thread wake-ups)
# Everything lands in $OUT/results.tgz (the device tool returns at most 8 files) plus
# $OUT/summary.txt. Every step has a timeout; a missing GPU makes the steps fail, not pass.
#   bash service_h200.sh BUNDLE_DIR [LOAD_SECONDS (default 20)]
# FP4Q_SERVICE_ONLY=fast runs step 5 alone (a short follow-up run).
set -uo pipefail
b=$(cd "${1:?usage: service_h200.sh BUNDLE_DIR}" && pwd)
load_s=${2:-20}
out=${OUT:-$PWD/h200-out}
work=/tmp/fp4q-h200
rm -rf "$work" && mkdir -p "$work/py"
chmod +x "$b"/bin/* 2>/dev/null
export LD_LIBRARY_PATH="$b/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export FP4QD_BINARY="$b/bin/fp4qd" FP4Q_CUDA_MODULE="$b/bin/libfp4q_cuda.so"
export FP4Q_FP4QD="$b/bin/fp4qd" FP4Q_CLI="$b/bin/fp4q"
export PYTHONUNBUFFERED=1
summary="$work/summary.txt"
sanitizer=/usr/local/cuda/bin/compute-sanitizer
note() { echo "$*" | tee -a "$summary"; }
gtest_result() { grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$1" | tr '\n' ' '; }
started=$(date +%s)
elapsed() { echo "$(($(date +%s) - started)) s"; }

note "commit: $(tr '\n' ' ' < "$b/COMMIT")"
note "gpu: $(nvidia-smi --query-gpu=name,driver_version,uuid --format=csv,noheader)"
note "cpus: $(nproc)"

only=${FP4Q_SERVICE_ONLY:-all}
# 1. GPU tests under memcheck (fp4qd children too; IPC mappings are not leak-checked).
if [[ $only != fast ]]; then
memcheck() {  # memcheck NAME TIMEOUT_S CMD...
  local name=$1 limit=$2
  shift 2
  timeout -k 10 "$limit" "$sanitizer" --tool memcheck --target-processes all --leak-check no \
    --error-exitcode 86 "$@" > "$work/$name.log" 2>&1
  local rc=$?
  note "$name under memcheck: exit $rc ($(gtest_result "$work/$name.log")" \
    "$(grep -E 'ERROR SUMMARY' "$work/$name.log" | sort | uniq -c | tr -s ' ' | tr '\n' ';'))" \
    "[$(elapsed)]"
  [[ $rc == 124 ]] && note "$name: TIMED OUT after $limit s"
}
if [[ -x "$sanitizer" ]]; then
  memcheck ipc_gpu_test_memcheck 150 "$b/bin/fp4q_ipc_gpu_test"
  memcheck client_cuda_live_memcheck 120 "$b/bin/fp4q_client_live_test" \
    --gtest_filter='LiveCudaIpc.*'
else
  note "memcheck: $sanitizer not found; running the GPU tests plainly"
  timeout 120 "$b/bin/fp4q_ipc_gpu_test" > "$work/ipc_gpu_test.log" 2>&1
  note "ipc_gpu_test: exit $? ($(gtest_result "$work/ipc_gpu_test.log"))"
fi

fi  # only != fast

# 2. Load and IPC latency against one CUDA fp4qd.
start_server() {  # start_server NAME STREAMS PORT METRICS_PORT [FLAGS...]
  local name=$1 streams=$2 port=$3 mport=$4
  shift 4
  "$b/bin/fp4qd" --backend cuda --allow_cuda_ipc --unix_socket "$work/$name.sock" \
    --fast_socket "$work/$name.fast" \
    --listen "127.0.0.1:$port" --metrics_listen "127.0.0.1:$mport" --streams_per_gpu "$streams" \
    "$@" > "$work/$name.out" 2> "$work/$name.log" &
  pid=$!
  for _ in $(seq 100); do grep -q "listening on" "$work/$name.out" 2>/dev/null && break; sleep 0.1; done
  note "fp4qd $name (--streams_per_gpu $streams $*): $(head -n1 "$work/$name.out")"
}
stop_server() {
  kill -TERM "$pid"
  timeout 60 tail --pid="$pid" -f /dev/null
  wait "$pid"
  note "fp4qd SIGTERM exit: $? [$(elapsed)]"
}
scrape() {  # scrape PORT FILE
  python3 -c "import urllib.request,sys; sys.stdout.write(urllib.request.urlopen('http://127.0.0.1:$1/metrics', timeout=10).read().decode())" > "$2" 2>&1
}
mix=quantize=4,qdq=2,dequantize=1,update=2,get=1,list=1,info=1,keepalive=1
if [[ $only != fast ]]; then

start_server fp4qd 4 50051 9450
sock=$work/fp4qd.sock
timeout $((load_s + 60)) "$b/bin/fp4q" --server 127.0.0.1:50051 bench --clients 32 \
  --duration "$load_s" --warmup 5 --mix "$mix" --shape 16x256 --server-pid "$pid" --quiet \
  --json "$work/h200-load.json" > "$work/load-32.txt" 2>&1
note "bench 32 clients: exit $? $(grep '^total' "$work/load-32.txt") [$(elapsed)]"
timeout 60 "$b/bin/fp4q" --server 127.0.0.1:50051 bench --clients 1 --duration 10 --quiet \
  --mix list=1,info=1,keepalive=1 --server-pid "$pid" \
  --json "$work/h200-load-1client.json" > "$work/load-1.txt" 2>&1
note "bench 1 client: exit $? $(grep '^total' "$work/load-1.txt") [$(elapsed)]"
note "$(grep -E '^(info|keepalive|list) ' "$work/load-1.txt" | awk '{printf "%s p50 %s us; ", $1, $4}')"
# The floor of one RPC on this VM (the standard health check, no fp4q handler work), over TCP
# loopback and over the Unix socket, one client.
for ep in "tcp 127.0.0.1:50051" "unix unix://$sock"; do
  set -- $ep
  timeout 60 "$b/bin/fp4q" --server "$2" bench --clients 1 --duration 8 --quiet \
    --mix health=1,list=1,info=1,keepalive=1 --json "$work/h200-load-1client-$1.json" \
    > "$work/load-1-$1.txt" 2>&1
  note "bench 1 client over $1: exit $? $(grep -E '^(health|info|keepalive|list) ' \
    "$work/load-1-$1.txt" | awk '{printf "%s p50 %s us; ", $1, $4}')"
done
timeout 90 "$b/bin/fp4q" --server "unix://$sock" bench-ipc --shape 8192x8192 --dtype bf16 \
  --iters 200 --warmup 10 --json "$work/h200-ipc-quantize-cpp.json" \
  > "$work/ipc-latency-cpp.txt" 2>&1
rc=$?
[[ -s "$work/h200-ipc-quantize-cpp.json" ]] || cp "$work/ipc-latency-cpp.txt" "$work/h200-ipc-quantize-cpp.err"
note "bench-ipc (C++): exit $rc $(tail -n 2 "$work/h200-ipc-quantize-cpp.err" 2>/dev/null)$(python3 -c "
import json,sys
r=json.load(open('$work/h200-ipc-quantize-cpp.json'))
print(' '.join('%s p50 %.0f p99 %.0f;' % (k, r[k]['p50'], r[k]['p99']) for k in
      ('wall_us','kernel_us','queue_us','server_us','overhead_us','client_and_transport_us')),
      'goal met:', r['goal_p50_wall_le_kernel_plus_100us'])" 2>/dev/null) [$(elapsed)]"
PYTHONPATH=client/python timeout 120 python3 bench/ipc_quantize_latency.py \
  --server "unix://$sock" --device cuda --shape 8192x8192 --dtype bf16 --iters 200 \
  --json "$work/h200-ipc-quantize.json" > "$work/ipc-latency.txt" 2>&1
rc=$?
[[ -s "$work/h200-ipc-quantize.json" ]] || cp "$work/ipc-latency.txt" "$work/h200-ipc-quantize.err"
note "ipc_quantize_latency.py: exit $rc $(tail -n 1 "$work/h200-ipc-quantize.err" 2>/dev/null)$(python3 -c "
import json
r=json.load(open('$work/h200-ipc-quantize.json'))
print(' '.join('%s p50 %.0f p99 %.0f;' % (k, r[k]['p50'], r[k]['p99']) for k in
      ('wall_us','kernel_us','overhead_us')), 'goal met:', r['goal_p50_wall_le_kernel_plus_100us'])
" 2>/dev/null) [$(elapsed)]"
scrape 9450 "$work/metrics.txt"
note "metrics: $(grep -c '^fp4q_' "$work/metrics.txt") fp4q_ samples; queue wait count/sum:" \
  "$(grep -E '^fp4q_queue_wait_seconds_(count|sum)' "$work/metrics.txt" | awk '{print $2}' | tr '\n' ' ')"
stop_server

# 3. The same mixed load with one stream per GPU (the old executor) and with 8, for comparison.
port=50052
for streams in 1 8; do
  start_server "fp4qd$streams" "$streams" "$port" $((port + 9400 - 50000))
  timeout $((load_s / 2 + 60)) "$b/bin/fp4q" --server "127.0.0.1:$port" bench --clients 32 \
    --duration $((load_s / 2)) --warmup 3 --mix "$mix" --shape 16x256 --quiet \
    --json "$work/h200-load-${streams}stream.json" > "$work/load-32-${streams}stream.txt" 2>&1
  note "bench 32 clients, $streams stream(s): exit $? $(grep '^total' "$work/load-32-${streams}stream.txt") [$(elapsed)]"
  scrape $((port + 9400 - 50000)) "$work/metrics-${streams}stream.txt"
  stop_server
  port=$((port + 1))
done

# 4. The Python client's GPU checks.
PYTHONPATH=client/python:tests/python timeout 100 python3 tests/python/gpu_ipc_check.py \
  --fp4qd "$b/bin/fp4qd" --out "$work/py" --steps 200 > "$work/py/py_run.txt" 2>&1
note "gpu_ipc_check: exit $? ($(tail -n 1 "$work/py/py_run.txt")) [$(elapsed)]"

fi  # only != fast

# 5. The fast socket. ipc_cpp NAME ARGS...: bench-ipc over it, summarised.
ipc_cpp() {
  local name=$1
  shift
  timeout 90 "$b/bin/fp4q" --server "unix://$work/$srv.sock" bench-ipc --shape 8192x8192 \
    --dtype bf16 --iters 300 --warmup 20 --json "$work/$name.json" "$@" > "$work/$name.txt" 2>&1
  local rc=$?
  note "bench-ipc $*: exit $rc $(tail -n 2 "$work/$name.txt" | grep -v '^}' | head -c 300)$(python3 -c "
import json
r=json.load(open('$work/$name.json'))
print(' '.join('%s p50 %.0f p99 %.0f;' % (k, r[k]['p50'], r[k]['p99']) for k in
      ('wall_us','kernel_us','queue_us','server_us','overhead_us','client_and_transport_us',
       'fast_keepalive_us') if k in r), 'goal met:', r['goal_p50_wall_le_kernel_plus_100us'])" 2>/dev/null) [$(elapsed)]"
}
fast_small() {  # fast_small NAME ARGS...: 1 client, KeepAlive + 16x256 Quantize over it
  local name=$1
  shift
  timeout 60 "$b/bin/fp4q" --server "unix://$work/$srv.sock" bench --clients 1 --duration 8 \
    --quiet --mix keepalive=1,quantize=1,health=1 --json "$work/$name.json" "$@" \
    > "$work/$name.txt" 2>&1
  note "bench 1 client $*: exit $? $(grep -E '^(health|keepalive|quantize) ' "$work/$name.txt" \
    | awk '{printf "%s p50 %s us (kernel %s); ", $1, $4, $7}')"
}
port=50060
for variant in plain spin; do
  srv=fast-$variant
  if [[ $variant == spin ]]; then
    start_server "$srv" 4 "$port" $((port + 9400 - 50000)) --worker_spin_us 200 \
      --fast_socket_spin_us 200
  else
    start_server "$srv" 4 "$port" $((port + 9400 - 50000))
  fi
  fsock=$work/$srv.fast
  fast_small "$variant-grpc-1"
  fast_small "$variant-fast-1" --fast-socket "$fsock"
  fast_small "$variant-fast-1-spin" --fast-socket "$fsock" --spin-us 100
  ipc_cpp "h200-ipc-$variant-grpc"
  ipc_cpp "h200-ipc-$variant-fast" --fast-socket "$fsock"
  ipc_cpp "h200-ipc-$variant-fast-spin" --fast-socket "$fsock" --spin-us 100
  if [[ $variant == plain ]]; then
    # Twice on the same server: the second run shows whether memory stays flat after warm-up.
    for round in 1 2; do
      timeout $((load_s + 60)) "$b/bin/fp4q" --server "unix://$work/$srv.sock" bench \
        --clients 32 --duration "$load_s" --warmup 5 --mix "$mix" --shape 16x256 \
        --server-pid "$pid" --quiet --fast-socket "$fsock" \
        --json "$work/h200-load-fast-$round.json" > "$work/load-32-fast-$round.txt" 2>&1
      note "bench 32 clients over the fast socket, round $round: exit $? $(grep '^total' \
        "$work/load-32-fast-$round.txt"); $(grep 'RSS' "$work/load-32-fast-$round.txt") [$(elapsed)]"
    done
  fi
  for t in grpc fast; do
    extra=()
    [[ $t == fast ]] && extra=(--fast-socket "$fsock")
    PYTHONPATH=client/python timeout 120 python3 bench/ipc_quantize_latency.py \
      --server "unix://$work/$srv.sock" --device cuda --shape 8192x8192 --dtype bf16 \
      --iters 300 "${extra[@]}" --json "$work/h200-py-$variant-$t.json" \
      > "$work/py-$variant-$t.txt" 2>&1
    note "ipc_quantize_latency.py $variant $t: exit $? $(tail -n 1 "$work/py-$variant-$t.txt" | head -c 200)$(python3 -c "
import json
r=json.load(open('$work/h200-py-$variant-$t.json'))
print(' '.join('%s p50 %.0f p99 %.0f;' % (k, r[k]['p50'], r[k]['p99']) for k in
      ('wall_us','kernel_us','overhead_us')), 'goal met:', r['goal_p50_wall_le_kernel_plus_100us'])
" 2>/dev/null) [$(elapsed)]"
  done
  scrape $((port + 9400 - 50000)) "$work/metrics-$srv.txt"
  stop_server
  port=$((port + 1))
done

mkdir -p "$out"
tar czf "$out/results.tgz" -C /tmp --exclude='*.sock' fp4q-h200
cp "$summary" "$out/summary.txt"
