#!/usr/bin/env bash
# Device call 3 (repository root, .bundle carried): where a single 8192x8192 one-pass step's time
# goes beyond its kernels.
#   1. the Python client's phases of that step (python-client/trainloop.py, mode single: one
#      matrix, fixed gradients, delayed scaling, one pass, 1500 steps), then a cProfile of it
#   2. Nsight Compute's durations of the step kernels of fp4q_bench's one-pass and apply-alone
#      rows at 8192x8192 (which kernels a one-pass step runs beside its apply, and for how long)
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
begin e3
if room 60 "phases single"; then
  B=$b SCALING=delayed ONE_PASS=1 MODES=single N=1500 timeout 60 \
    python3 bench/results/h200-step/python-client/trainloop.py > $o/phases-single.txt 2>&1
  echo "phases single rc=$?"; grep -E "mode=|pre-send|per step" $o/phases-single.txt
fi
if room 60 "profile single"; then
  B=$b SCALING=delayed ONE_PASS=1 MODES=single N=600 PROFILE=1 PHASES=0 timeout 60 \
    python3 bench/results/h200-step/python-client/trainloop.py > $o/profile-single.txt 2>&1
  echo "profile single rc=$?"; grep -E "mode=|pre-send" $o/profile-single.txt
  grep -A22 "Ordered by: internal time" $o/profile-single.txt | head -24
fi
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for row in "step one pass" "step apply, SGD + EF"; do
  room 60 "ncu $row" || continue
  f=$o/ncu-$(echo $row | tr ' ,+' '___').txt
  timeout 60 $ncu --clock-control none -k regex:"Step" --launch-skip 12 --launch-count 8 \
    --metrics gpu__time_duration.sum,launch__grid_size,launch__registers_per_thread,sm__cycles_active.avg,gpc__cycles_elapsed.max,smsp__inst_executed.sum,dram__bytes.sum \
    $b/bin/fp4q_bench --only "$row" --step-models 8192 --iters 5 --out $o/n.json > $f 2>&1
  echo "ncu $row rc=$?"
  grep -E "^  [A-Za-z].*\(|duration|grid_size|registers|cycles|inst_exec|dram__bytes" $f | \
    sed 's/(unnamed namespace)//' | cut -c1-100 | head -60
done
