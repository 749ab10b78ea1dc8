#!/usr/bin/env bash
# Runs ON the GPU machine from the repository root, with the service bundle
# (scripts/device/service-bundle.sh): where the Python client spends an IPC Quantize call.
# Starts a CUDA fp4qd with --fast_socket, then runs bench/ipc_quantize_latency.py (8192x8192
# bf16) under cProfile over the fast socket and over gRPC, and writes the top functions by own
# time and by cumulative time to $OUT/python-ipc-profile.txt.
#   bash python_ipc_profile.sh BUNDLE_DIR [ITERS (default 1000)]
set -uo pipefail
b=$(cd "${1:?usage: python_ipc_profile.sh BUNDLE_DIR [ITERS]}" && pwd)
iters=${2:-1000}
out=${OUT:-$PWD/profile-out}
work=/tmp/fp4q-pyprof
rm -rf "$work" && mkdir -p "$work" "$out"
export LD_LIBRARY_PATH="$b/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
"$b/bin/fp4qd" --backend cuda --allow_cuda_ipc --unix_socket "$work/s.sock" \
  --fast_socket "$work/f.sock" --listen 127.0.0.1:0 --metrics_listen "" \
  > "$work/fp4qd.out" 2> "$work/fp4qd.log" &
pid=$!
for _ in $(seq 100); do grep -q "listening on" "$work/fp4qd.out" 2>/dev/null && break; sleep 0.1; done
report="$out/python-ipc-profile.txt"
echo "commit: $(tr '\n' ' ' < "$b/COMMIT")" > "$report"
for t in ${PROFILE_TRANSPORTS:-fast grpc}; do
  extra=()
  [[ $t == fast ]] && extra=(--fast-socket "$work/f.sock")
  PYTHONPATH=client/python timeout 200 python3 -m cProfile -o "$work/$t.prof" \
    bench/ipc_quantize_latency.py --server "unix://$work/s.sock" --device cuda \
    --shape 8192x8192 --dtype bf16 --iters "$iters" "${extra[@]}" --json "$work/$t.json" \
    > "$work/$t.txt" 2>&1
  echo "== $t: exit $? $(tail -n 1 "$work/$t.txt" | head -c 300)" >> "$report"
  python3 - "$work/$t.prof" "$work/$t.json" >> "$report" 2>&1 <<'PY'
import json, pstats, sys
r = json.load(open(sys.argv[2]))
print({k: round(r[k]['p50'], 1) for k in ('wall_us', 'kernel_us', 'overhead_us')})
s = pstats.Stats(sys.argv[1])
s.sort_stats('tottime').print_stats(35)
s.sort_stats('cumulative').print_stats(45)
# Where the client's own per-call time goes: the callees of its per-call functions.
s.sort_stats('cumulative').print_callees(
    r'client\.py:\d+\((quantize|build|_call|_raw_fast|_plan_quantize_outputs|_quantized_from_reply)\)|'
    r'_transport\.py:\d+\((input|input_region|output|_region_for|before_send|after_reply)\)')
PY
done
kill -TERM "$pid"; wait "$pid"
cp "$work"/*.json "$out/" 2>/dev/null
