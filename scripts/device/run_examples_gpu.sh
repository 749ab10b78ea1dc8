#!/usr/bin/env bash
# Runs ON the GPU machine, from the folder made by scripts/device/examples-bundle.sh (this
# script is copied into it): starts fp4qd --backend cuda --allow_cuda_ipc, shows it (fp4q
# health, fp4q info), runs the three training examples with --transport cuda_ipc (and example
# 1 once more inline, to compare the transports), writes the tables, CSV curves and JSON
# results, compares them with the CPU backend's results in the bundle (same seeds: the losses
# must be the same bits), and stops the server with SIGTERM.
#
#   run_examples_gpu.sh [--out DIR] [--steps "200 500"] [--seed N]
#
# Defaults: --out $OUT (the device tool's folder) or ./gpu-out, steps 200 and 500, seed 1.
# Writes DIR/gpu-STEPS/{linear,mlp,linear_qdq}.{txt,csv,json}, DIR/gpu-STEPS/linear_inline.*,
# DIR/compare.txt, DIR/fp4qd.log, DIR/info.txt. Exit status 0 when every run worked and every
# comparison that had a CPU result matched bit for bit; 1 otherwise; 2 bad usage.
set -uo pipefail
bundle=$(cd "$(dirname "$0")" && pwd)
out="${OUT:-$PWD/gpu-out}"
steps_list="200 500"
seed=1
while (($#)); do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --steps) steps_list="$2"; shift 2 ;;
    --seed) seed="$2"; shift 2 ;;
    -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run_examples_gpu.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"
cuda_lib=/usr/local/cuda/lib64
export LD_LIBRARY_PATH="$bundle/lib:$cuda_lib:${LD_LIBRARY_PATH:-}"
# cuBLASLt of the CUDA 13 toolkit; where the toolkit lacks it, the one PyTorch's wheels carry.
if [[ ! -e "$cuda_lib/libcublasLt.so.13" ]]; then
  extra=$(python3 -c 'import nvidia.cublas, os; print(os.path.join(list(nvidia.cublas.__path__)[0], "lib"))' 2> /dev/null || true)
  if [[ -n "$extra" ]]; then export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$extra"; fi
fi
bin="$bundle/bin"
failed=0
fail() { echo "run_examples_gpu.sh: FAILED: $*" >&2; failed=1; }

{
  echo "commit: $(tr '\n' ' ' < "$bundle/COMMIT" 2> /dev/null)"
  nvidia-smi --query-gpu=name,uuid,driver_version,memory.total --format=csv 2>&1
} | tee "$out/info.txt"

"$bin/fp4qd" --listen 127.0.0.1:0 --metrics_listen 127.0.0.1:0 --backend cuda --allow_cuda_ipc \
  --cuda_ipc_over_tcp \
  --cuda_module "$bin/libfp4q_cuda.so" --log_format text \
  > "$out/fp4qd.stdout" 2> "$out/fp4qd.log" &
pid=$!
addr=""
for _ in $(seq 1 600); do
  addr=$(sed -n 's/^fp4qd: listening on //p' "$out/fp4qd.stdout" | head -n 1)
  [[ -n "$addr" ]] && break
  kill -0 "$pid" 2> /dev/null || break
  sleep 0.1
done
if [[ -z "$addr" ]]; then
  tail -n 30 "$out/fp4qd.log" >&2
  echo "run_examples_gpu.sh: fp4qd did not start (log above)" >&2
  kill -TERM "$pid" 2> /dev/null
  exit 1
fi
"$bin/fp4q" --server "$addr" health 2>&1 | tee -a "$out/info.txt" || fail "fp4q health"
"$bin/fp4q" --server "$addr" info 2>&1 | tee -a "$out/info.txt" || fail "fp4q info"

run_example() {  # name transport dir steps suffix
  local name=$1 transport=$2 dir=$3 steps=$4 stem=$5
  "$bin/fp4q_example_$name" --server "$addr" --steps "$steps" --seed "$seed" \
    --transport "$transport" --csv "$dir/$stem.csv" --json "$dir/$stem.json" \
    > "$dir/$stem.txt" 2> "$dir/$stem.log"
  local rc=$?
  cat "$dir/$stem.txt"
  ((rc == 0)) || { tail -n 5 "$dir/$stem.log" >&2; fail "example $name ($transport, $steps steps): exit status $rc"; }
}

for steps in $steps_list; do
  dir="$out/gpu-$steps"
  mkdir -p "$dir"
  for name in linear mlp linear_qdq; do run_example "$name" cuda_ipc "$dir" "$steps" "$name"; done
  run_example linear inline "$dir" "$steps" linear_inline
done

kill -TERM "$pid"
wait "$pid"
rc=$?
((rc == 0)) || fail "fp4qd exited with status $rc on SIGTERM"

# Same seed, same bits: every loss of every step against the CPU backend's CSV, and the
# transports against each other. The CSVs carry 9 significant digits; the JSONs 17 (exact).
python3 - "$out" "$bundle/cpu" $steps_list << 'PY' | tee "$out/compare.txt"
import json, os, sys
out, cpu, steps = sys.argv[1], sys.argv[2], sys.argv[3:]
bad = 0
def losses(path):
    d = json.load(open(path))
    return {k: (v["start_loss"], v["final_loss"]) for k, v in d["variants"].items()}, d
for s in steps:
    gpu_dir = os.path.join(out, f"gpu-{s}")
    pairs = [(f"gpu-{s}/{n}.json (cuda, cuda_ipc)", os.path.join(gpu_dir, f"{n}.json"),
              f"cpu-{s}/{n}.json (cpu, inline)", os.path.join(cpu, f"cpu-{s}", f"{n}.json"))
             for n in ("linear", "mlp", "linear_qdq")]
    pairs.append((f"gpu-{s}/linear.json (cuda_ipc)", os.path.join(gpu_dir, "linear.json"),
                  f"gpu-{s}/linear_inline.json (inline)", os.path.join(gpu_dir, "linear_inline.json")))
    for la, a, lb, b in pairs:
        if not os.path.exists(a):
            print(f"MISSING {la}"); bad += 1; continue
        if not os.path.exists(b):
            print(f"no reference for {la}: {lb} absent"); continue
        (va, da), (vb, db) = losses(a), losses(b)
        same = va == vb and open(a[:-5] + ".csv").read() == open(b[:-5] + ".csv").read()
        print(f"{'IDENTICAL' if same else 'DIFFERENT'}  {la}  vs  {lb}  [{da['backend']}/{da['transport']} vs {db['backend']}/{db['transport']}]")
        if not same:
            bad += 1
            for k in va:
                if va[k] != vb.get(k):
                    print(f"    {k}: start/final {va[k]} vs {vb.get(k)}")
sys.exit(1 if bad else 0)
PY
((PIPESTATUS[0] == 0)) || fail "comparison (see $out/compare.txt)"
echo "run_examples_gpu.sh: results in $out (exit status $failed)"
exit "$failed"
