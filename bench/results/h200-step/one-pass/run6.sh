#!/usr/bin/env bash
# Device call 6 (repository root, .bundle carried): the step and one-pass GPU tests on the H200
# at this commit; what a tensor attribute read costs this host's Python (attr_cost.py: the
# reads of the Python client's step plan key); bench/train_loop.py's variants at batch 256,
# then 64 (the train suite's model, 3 rounds each). Each phase only if it fits (room, LIMIT).
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
begin r6
step_tests 120
timeout 60 python3 bench/results/h200-step/one-pass/attr_cost.py > $o/attr-cost.txt 2>&1
echo "attr_cost rc=$?"; cat $o/attr-cost.txt
tl() {  # tl TAG BATCH ROUNDS SECONDS
  room $4 "train_loop $1" || return 0
  timeout $4 python3 bench/train_loop.py --fp4qd "$b/bin/fp4qd" --rounds $3 --batch $2 \
    --out $o/train-loop-$1.json > $o/train-loop-$1.txt 2>&1; echo "$1 rc=$?"
  grep -E "ms/iteration|worker's stream" $o/train-loop-$1.txt | tail -10
}
tl b256 256 3 150
tl b64 64 3 110
