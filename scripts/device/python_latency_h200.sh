#!/usr/bin/env bash
# Runs ON the GPU machine from the repository root, with the service bundle
# (scripts/device/service-bundle.sh): IPC Quantize latency of 8192x8192 bf16 from the Python
# client (bench/ipc_quantize_latency.py) and the C++ client (fp4q bench-ipc) over the fast
# socket, the clients busy-polling 0 or 100 us, against fp4qd plain and busy-polling
# (--worker_spin_us 200 --fast_socket_spin_us 200). Summary in $OUT/python-latency.txt, JSON
# beside it.
#   bash python_latency_h200.sh BUNDLE_DIR [ITERS (default 300)]
set -uo pipefail
b=$(cd "${1:?usage: python_latency_h200.sh BUNDLE_DIR [ITERS]}" && pwd)
iters=${2:-300}
out=${OUT:-$PWD/latency-out}
work=/tmp/fp4q-pylat
rm -rf "$work" && mkdir -p "$work" "$out"
export LD_LIBRARY_PATH="$b/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
report="$out/python-latency.txt"
echo "commit: $(tr '\n' ' ' < "$b/COMMIT"); gpu: $(nvidia-smi --query-gpu=name --format=csv,noheader)" > "$report"
for server in plain spin; do
  flags=()
  [[ $server == spin ]] && flags=(--worker_spin_us 200 --fast_socket_spin_us 200)
  "$b/bin/fp4qd" --backend cuda --allow_cuda_ipc --unix_socket "$work/s.sock" \
    --fast_socket "$work/f.sock" --listen 127.0.0.1:0 --metrics_listen "" "${flags[@]}" \
    > "$work/fp4qd.out" 2> "$work/fp4qd-$server.log" &
  pid=$!
  for _ in $(seq 100); do grep -q "listening on" "$work/fp4qd.out" 2>/dev/null && break; sleep 0.1; done
  for spin in 0 100; do
    name=$server-spin$spin
    PYTHONPATH=client/python timeout 120 python3 bench/ipc_quantize_latency.py \
      --server "unix://$work/s.sock" --fast-socket "$work/f.sock" --spin-us "$spin" \
      --device cuda --shape 8192x8192 --dtype bf16 --iters "$iters" \
      --json "$out/py-$name.json" > "$work/py-$name.txt" 2>&1
    echo "python $name: exit $? $(python3 -c "
import json; r=json.load(open('$out/py-$name.json'))
print(' '.join('%s p50 %.0f;' % (k, r[k]['p50']) for k in ('wall_us','kernel_us','overhead_us')), r['rpc_transport'])" 2>&1)" >> "$report"
    args=(--fast-socket "$work/f.sock")
    [[ $spin != 0 ]] && args+=(--spin-us "$spin")
    timeout 90 "$b/bin/fp4q" --server "unix://$work/s.sock" bench-ipc --shape 8192x8192 \
      --iters "$iters" --json "$out/cpp-$name.json" "${args[@]}" > /dev/null 2>&1
    echo "c++    $name: exit $? $(python3 -c "
import json; r=json.load(open('$out/cpp-$name.json'))
print(' '.join('%s p50 %.0f;' % (k, r[k]['p50']) for k in ('wall_us','kernel_us','overhead_us')))" 2>&1)" >> "$report"
  done
  kill -TERM "$pid"; wait "$pid"
done
