#!/usr/bin/env bash
# fp4qd's CPU time and context switches over a bench/step_host.py run, two fp4qd builds in turn
# (BASE and NEW: build folders with bin/fp4qd and the tests' fake CUDA module), the same client.
# perf stat follows fp4qd from its start to its exit (warm-up, the timed steps and the empty
# round trips between them). Writes <tag>-p<params>-<i>.{json,perf} here.
#   PYTHON=/usr/bin/python3 BASE=/tmp/base-build NEW=build \
#     bash bench/results/cpu-step-host/worker-wakeups/run.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../../../.."
steps=${STEPS:-20000}
python=${PYTHON:-python3}  # with torch (Debian's /usr/bin/python3 here)
for params in 1 50; do
  for i in 1 2 3; do
    for tag in base new; do
      b=$BASE; [[ $tag == new ]] && b=$NEW
      "$python" bench/step_host.py --build "$b" --params $params --steps $steps \
        --json "$here/$tag-p$params-$i.json" > "$here/$tag-p$params-$i.log" 2>&1 &
      py=$!
      pid=""
      for _ in $(seq 100); do
        pid=$(pgrep -P $py -f "^$b/bin/fp4qd" || true)  # step_host's own child
        [[ -n $pid ]] && break
        sleep 0.05
      done
      [[ -n $pid ]] || { echo "no fp4qd started (see $here/$tag-p$params-$i.log)" >&2; exit 1; }
      perf stat -e task-clock,context-switches -p "$pid" -o "$here/$tag-p$params-$i.perf" &
      wait $py
      wait
      "$python" - "$here/$tag-p$params-$i" <<'PY'
import json, re, sys
base = sys.argv[1]
r = json.load(open(base + ".json"))
text = open(base + ".perf").read()
ms = float(re.search(r"([\d.,]+) msec task-clock", text).group(1).replace(",", ""))
cs = int(re.search(r"([\d,]+)\s+context-switches", text).group(1).replace(",", ""))
steps = r["steps"] + 50
print("%s: step() p50 %.1f us, fp4qd %.0f us; fp4qd CPU %.1f us and %.2f context switches a step"
      % (base.rsplit("/", 1)[1], r["step_us"]["p50"], r["server_us"], ms * 1e3 / steps,
         cs / steps))
PY
    done
  done
done
