#!/usr/bin/env bash
# Robustness of the training examples across seeds: starts fp4qd (CPU backend, free port),
# runs each example for every seed in a range, and prints per seed the ratios the CI test
# asserts (docs/TRAINING.md), plus SR+EF / SR.
#
#   scripts/examples-seeds.sh [--build-dir DIR] [--steps N] [--seeds "1 2 3 4 5"] [--out DIR]
#                             [--examples "linear mlp"]
#
# Defaults: build dir ./build (already built: fp4qd and the examples), 200 steps, seeds 1..5,
# examples linear and mlp (linear_qdq repeats linear bit for bit), results in DIR/seeds.
# Exit status 0 when every run worked (whatever the ratios), 1 otherwise, 2 bad usage.
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=build
steps=200
seeds="1 2 3 4 5"
examples="linear mlp"
out=""
while (($#)); do
  case "$1" in
    --build-dir) build_dir="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --seeds) seeds="$2"; shift 2 ;;
    --examples) examples="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "examples-seeds.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
out="${out:-$build_dir/seeds}"
bin="$build_dir/bin"
mkdir -p "$out"

"$bin/fp4qd" --listen 127.0.0.1:0 --metrics_listen= --backend cpu --log_format text \
  > "$out/fp4qd.stdout" 2> "$out/fp4qd.log" &
pid=$!
trap 'kill -TERM $pid 2> /dev/null || true; wait $pid 2> /dev/null || true' EXIT
addr=""
for _ in $(seq 1 300); do
  addr=$(sed -n 's/^fp4qd: listening on //p' "$out/fp4qd.stdout" | head -n 1)
  [[ -n "$addr" ]] && break
  kill -0 "$pid" 2> /dev/null || break
  sleep 0.1
done
[[ -n "$addr" ]] || { echo "examples-seeds.sh: fp4qd did not start (log: $out/fp4qd.log)" >&2; exit 1; }

files=()
for e in $examples; do
  for s in $seeds; do
    f="$out/$e-$steps-$s.json"
    "$bin/fp4q_example_$e" --server "$addr" --steps "$steps" --seed "$s" --json "$f" \
      > /dev/null 2> "$out/$e-$steps-$s.log" ||
      { echo "examples-seeds.sh: $e seed $s failed (log: $out/$e-$steps-$s.log)" >&2; exit 1; }
    files+=("$f")
  done
done

/usr/bin/python3 - "${files[@]}" << 'PY'
import json, sys
print("| example | steps | seed | RTN final/start | SR/RTN | RTN+EF/RTN | SR+EF/RTN | RTN+EF/SR | SR+EF/SR | fp32 lowest | asserted checks |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for path in sys.argv[1:]:
    d = json.load(open(path))
    f = {k: v["final_loss"] for k, v in d["variants"].items()}
    start = d["variants"]["rtn"]["start_loss"]
    ok = all(c["passed"] for c in d["checks"] if c["asserted"])
    lowest = f["fp32"] < min(f["rtn"], f["sr"], f["rtn_ef"], f["sr_ef"])
    print(f"| {d['example']} | {d['steps']} | {d['seed']} | {f['rtn'] / start:.3f} | "
          f"{f['sr'] / f['rtn']:.3f} | {f['rtn_ef'] / f['rtn']:.3f} | {f['sr_ef'] / f['rtn']:.3f} | "
          f"{f['rtn_ef'] / f['sr']:.3f} | {f['sr_ef'] / f['sr']:.3f} | {'yes' if lowest else 'NO'} | "
          f"{'all pass' if ok else 'FAIL'} |")
PY
