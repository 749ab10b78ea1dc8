#!/usr/bin/env bash
# Device call 4 of one-pass steps (repository root, .bundle carried with the module of 46cdb17
# gzipped in .bundle/alt/): what call 3's run3.sh meant to time and did not (its --only matched
# no row), and where the Python step's time goes. Each phase only if it fits (room, LIMIT):
#   1. fp4q_bench's delayed SGD + EF step rows (apply alone, check + apply, one pass; GPT-2 and
#      8192 x 8192) with the module under test and the one of 46cdb17, alternated, each run
#      with its own copy row (ab_table.py tabulates them)
#   2. the GPT-2-shaped fp4q.optim.SGD step from Python (delayed scaling, fixed gradients), one
#      pass and two, split into the client's phases (python-client/trainloop.py), then a
#      cProfile of the one-pass step
#   3. Nsight Compute over the one-pass row's step kernels: each launch's time, instructions
#      and DRAM bytes
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
begin r4 "alt module $(cat $b/alt/COMMIT 2>/dev/null)"
for round in 1 2; do ab_bench $round 60 "SGD + EF, delayed"; done
export B=$b
for p in 1 0; do
  room 60 "phases one_pass=$p" || continue
  SCALING=delayed ONE_PASS=$p MODES=gpt2 N=600 timeout 60 \
    python3 bench/results/h200-step/python-client/trainloop.py > $o/phases-$p.txt 2>&1
  echo "rc=$?" >> $o/phases-$p.txt; echo "one_pass=$p"; grep -E "mode=|pre-send|per step" $o/phases-$p.txt
done
room 60 "profile" && SCALING=delayed ONE_PASS=1 PHASES=0 PROFILE=1 MODES=gpt2 N=600 timeout 60 \
  python3 bench/results/h200-step/python-client/trainloop.py > $o/profile-1.txt 2>&1
echo "profile rc=$?"; head -30 $o/profile-1.txt | grep -E "mode=|tottime" -A 14 | head -18
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
room 120 ncu && timeout 120 $ncu --clock-control none --kernel-name regex:Step --launch-count 48 \
  --metrics gpu__time_duration.sum,smsp__inst_executed.sum,dram__bytes_read.sum,dram__bytes_write.sum,smsp__issue_active.avg.pct_of_peak_sustained_active \
  $b/bin/fp4q_bench --only "step one pass, SGD + EF, delayed" --iters 3 --out /tmp/ncu.json \
  > $o/ncu-one.txt 2>&1
echo "ncu rc=$?"; grep -cE "Step[A-Za-z]+Kernel" $o/ncu-one.txt
