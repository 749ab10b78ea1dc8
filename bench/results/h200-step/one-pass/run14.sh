#!/usr/bin/env bash
# Device call 14 (repository root, .bundle carried): GPT-2's step from Python with its
# parameters and gradients as separate tensors, as an nn.Module's (one CUDA allocation per large
# tensor, each checked by the client every step), beside the flat buffers of the other calls, in
# the same run, twice each, alternating. Each only if it fits (room, LIMIT).
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
begin r14
for i in 1 2; do
  for layout in flat tensors; do
    room 100 "trainer_step $layout $i" || continue
    timeout 100 python3 bench/trainer_step.py --fp4qd $b/bin/fp4qd --models gpt2-small \
      --behind-ms 0 --steps 100 --warmup 10 --layout $layout \
      --json $o/trainer-step-$layout-$i.json > $o/trainer-step-$layout-$i.txt 2>&1
    echo "$layout $i rc=$? $(grep -E 'one pass, fast' $o/trainer-step-$layout-$i.txt)"
  done
done
