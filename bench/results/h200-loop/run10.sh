#!/usr/bin/env bash
# tests/python/test_torch_side.py on this torch (CPU with foreach=True, CUDA with foreach None);
# then why the overlapped step() builds its request afresh in the train suite's loop under MPS:
# plan_misses.py's counters on the step plan's checks, overlapped and synchronous.
# Repository root, .bundle carried.
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
export LIMIT=${LIMIT:-150}
begin loop14 "the torch side's tests; the overlapped step's plan misses"
(cd tests/python && PYTHONPATH=../../client/python:. timeout 60 python3 -m unittest -v \
  test_torch_side) > $o/test-torch-side.txt 2>&1
echo "test_torch_side rc=$?"; tail -3 $o/test-torch-side.txt
mps_start
for m in overlap sync; do
  flag=""; [[ $m == sync ]] && flag=--sync
  timeout 60 python3 bench/results/h200-loop/plan_misses.py --fp4qd $b/bin/fp4qd $flag \
    > $o/plan-misses-$m.txt 2>&1
  echo "== $m rc=$?"; tail -12 $o/plan-misses-$m.txt
done
mps_stop
echo "done ($SECONDS s)"
