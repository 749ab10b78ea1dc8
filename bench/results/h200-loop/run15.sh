#!/usr/bin/env bash
# tests/python/gpu_ipc_check.py with this commit's fp4qd; then fp4qd's host work a step, the
# build of 01185f9 (a step run on the fast socket connection's thread woke the device workers,
# and under the automatic spin its own thread through the eventfd) against this one (79aba49,
# 09b80b5: neither), alternating, three rounds each:
# `fp4q bench-step` from C++ over 8192 x 8192 and GPT-2 small (one pass, kept plans), with
# fp4qd's CPU time and context switches (every thread's, from /proc) over each run. Then on an
# H200 only: the overlapped loops (lib.sh's overlap_loops), one 8192 x 8192 weight stepped alone
# from Python (three runs, no phase timers), and trainer_step.py's GPT-2 step from Python.
# Repository root, .bundle carried, with the old fp4qd as .bundle/alt/fp4qd-01185f9.xz (the
# build/bin/fp4qd of 01185f9, stripped and xz-compressed: `strip -o F build/bin/fp4qd && xz F`).
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
export LIMIT=${LIMIT:-560}
begin loop24
ipc_check 90
old=$b/alt/fp4qd-01185f9
[[ -f $old.xz ]] && xz -dkf $old.xz && chmod +x $old
# fp4qd's CPU seconds and context switches so far, every thread's: "CPU SWITCHES"
use() {
  python3 - "$1" <<'PY'
import glob, os, sys
pid = sys.argv[1]
with open("/proc/%s/stat" % pid) as f:
    fields = f.read().rsplit(")", 1)[1].split()
cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
switches = 0
for status in glob.glob("/proc/%s/task/*/status" % pid):
    with open(status) as f:
        for line in f:
            if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                switches += int(line.split()[1])
print(cpu, switches)
PY
}
host_ab() {
  local r=$1 tag bin m iters a z
  for tag in old new; do
    bin=$old; [[ $tag == new ]] && bin=$b/bin/fp4qd
    [[ -x $bin ]] || { echo "no $tag fp4qd"; continue; }
    room 45 "host a/b $tag $r" || return 0
    FP4QD=$bin start_fp4qd 4200 > /dev/null
    for m in square8192 gpt2-small; do
      iters=2000; [[ $m == gpt2-small ]] && iters=1000
      a=$(use $pid)
      timeout 20 $S --model $m --one-pass --iters $iters --warmup 20 \
        --json $o/host-$tag-$m-$r.json > $o/host-$tag-$m-$r.log 2>&1
      z=$(use $pid)
      python3 - "$o/host-$tag-$m-$r.json" "$a" "$z" "$tag" "$m" "$r" "$iters" <<'PY'
import json, sys
path, a, z, tag, m, r, iters = sys.argv[1:]
d = json.load(open(path))
(c0, s0), (c1, s1) = (map(float, x.split()) for x in (a, z))
n = int(iters) + 20
print("host %s %s %s: wall p50 %.1f us, kernel p50 %.1f, server p50 %.1f; fp4qd CPU %.1f us "
      "and %.2f context switches a step" % (tag, m, r, d["wall_us"]["p50"], d["kernel_us"]["p50"],
                                            d["server_us"]["p50"], (c1 - c0) * 1e6 / n,
                                            (s1 - s0) / n))
PY
    done
    kill $pid; wait $pid 2>/dev/null
  done
}
for r in 1 2 3; do host_ab $r; done
grep -q H200 $o/gpu.txt || { echo "not an H200: nothing more run ($SECONDS s)"; exit 0; }
overlap_loops
for r in 1 2 3; do
  client_phases single-np-$r 30 MODES=single SCALING=delayed ONE_PASS=1 N=400 PHASES=0
done
trainer default
echo "done ($SECONDS s)"
