#!/usr/bin/env bash
# GPT-2's whole step from Python with one tensor a parameter (bench/trainer_step.py
# --layout tensors: an allocation per large tensor, which the client's plan check visits every
# step), beside torch's optimizers and the bytes floor in the same process: the client of
# ec5bb76 and later (the plan check by buffer id) against that of 03540f5 (three attributes),
# alternating new, old, new. Before the call, here (the old client and benches carried as an
# untracked folder; remove it after):
#   mkdir -p bench/results/h200-loop/old-tree
#   git archive 03540f5 client/python/fp4q $(git ls-tree --name-only 03540f5 bench/ | grep '\.py$') \
#     | tar -x -C bench/results/h200-loop/old-tree
# Repository root, .bundle carried.
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
export LIMIT=${LIMIT:-360}
begin gpt2t11 "GPT-2 step, one tensor a parameter: new client against old-tree's"
old=$PWD/bench/results/h200-loop/old-tree
for v in new-1 old-1 new-2; do
  room 110 "trainer $v" || continue
  script=bench/trainer_step.py; [[ $v == old-* ]] && script=$old/bench/trainer_step.py
  timeout 110 python3 $script --fp4qd $b/bin/fp4qd --models gpt2-small --layout tensors \
    --behind-ms 0 --steps 100 --warmup 10 --json $o/trainer-$v.json > $o/trainer-$v.txt 2>&1
  echo "trainer $v rc=$?"; grep -E "^copy|==|one pass|foreach|fused|floor" $o/trainer-$v.txt | head -14
done
echo "done ($SECONDS s)"
