#!/usr/bin/env bash
# tests/python/gpu_ipc_check.py (its overlapped steps now named by their server plan's short
# path too); then on an H200 only: the overlapped loops (lib.sh's overlap_loops: under MPS beside torch's SGD, 9 rounds of the
# 4-layer model, 5 of the 6-layer one), then one 8192 x 8192 weight stepped alone from Python
# without phase timers, this client and alt-client/ (`git archive 9974074 client/python`,
# carried untracked: the client before fp4q._streams and Requests.step_named) in alternation,
# three rounds each. Repository root, .bundle and alt-client/ carried.
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
export LIMIT=${LIMIT:-400}
begin loop23 "alt-client: $(cat alt-client/COMMIT 2>/dev/null)"
ipc_check 90
grep -o '"step_plans_named": [0-9]*' $o/gpu_ipc_check.txt | sort | uniq -c
grep -q H200 $o/gpu.txt || { echo "not an H200: nothing more run"; exit 0; }
overlap_loops
for r in 1 2 3; do
  client_phases single-new-np-$r 30 MODES=single SCALING=delayed ONE_PASS=1 N=400 PHASES=0
  client_phases single-old-np-$r 30 MODES=single SCALING=delayed ONE_PASS=1 N=400 PHASES=0 \
    CLIENT=$PWD/alt-client
done
echo "done ($SECONDS s)"
