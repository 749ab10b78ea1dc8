#!/usr/bin/env bash
# Where the Python client's time before the send goes on a GPU host: trainloop.py's phase timers
# (now also the heads-up, taking an idle connection, the head's encoding, and the time from
# step() to its epoch check) in the train suite's loop (MODES=none, 16 matrices) and for one
# 8192 x 8192 weight (MODES=single, delayed scaling, one pass), two rounds each.
# Repository root, .bundle carried.
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
export LIMIT=${LIMIT:-200}
begin pre10 "the client's pre-send phases"
for r in 1 2; do
  client_phases loop-$r 38 MODES=none N=400
  client_phases single-$r 38 MODES=single SCALING=delayed ONE_PASS=1 N=400
done
for f in $o/phases-*.txt; do echo "== $(basename $f)"; cat $f; done
echo "done ($SECONDS s)"
