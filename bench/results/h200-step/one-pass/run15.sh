#!/usr/bin/env bash
# Device call 15 (repository root, .bundle carried): where the one-pass 8192 x 8192 step's 24 us
# over its apply go, and why the train suite's 16 small matrices take 4-7x their bytes floor.
# Each only if it fits (room, LIMIT):
#   0. fp4q_cuda_test's step tests (the step kernels now programmatic dependent launches)
#   1. fp4q_bench's step rows over GPT-2, 8192 x 8192 and the train suite's matrices (the new
#      row: SGD momentum 0.9 + EF, current scaling, two passes, as the suite steps them), the
#      step kernels as programmatic dependent launches and plain (FP4Q_STEP_PDL=0), twice
#   2. Nsight Compute: each step kernel's time and DRAM bytes (every step row, 8192^2 and the
#      train suite), so that an event-timed step less its kernels is the launches' gaps and the
#      table's copy
#   3. Nsight Compute's full set on the 8192^2 lean apply and the 8192^2 one-pass apply
#   4. the train suite's matrices through fp4qd from C++ (momentum + current, two passes)
#   5. pointer_attrs.py (the Python client's per-allocation plan check)
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
begin r15
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
step_tests 150
# The step kernels as programmatic dependent launches (the default) against plain launches
# (FP4Q_STEP_PDL=0), alternating.
for r in 1 2; do
  for v in pdl plain; do
    room 75 "bench $v $r" || continue
    env=""; [[ $v == plain ]] && env="FP4Q_STEP_PDL=0"
    env $env timeout 75 $b/bin/fp4q_bench --only step --iters 60 --out $o/bench-$v-$r.json \
      > $o/bench-$v-$r.txt 2>&1
    echo "bench $v $r rc=$?"; grep -E "^copy|^step" $o/bench-$v-$r.txt
  done
done
m="gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,launch__grid_size"
m="$m,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active"
room 100 "ncu times" && timeout 100 $ncu --clock-control none --kernel-name regex:Step \
  --metrics $m --csv $b/bin/fp4q_bench --only step --step-models 8192,train --iters 6 \
  --out /tmp/ncu.json > $o/ncu-times.csv 2> $o/ncu-times.err
echo "ncu times rc=$? $(grep -c Step $o/ncu-times.csv) rows"
for row in "step apply, SGD:StepApplyLean" "one pass:StepApplyOnePass"; do
  IFS=: read -r only k <<< "$row"
  room 80 "ncu full $k" || continue
  timeout 80 $ncu --clock-control none --set full --kernel-name regex:"$k" --launch-skip 2 \
    --launch-count 1 $b/bin/fp4q_bench --only "$only" --step-models 8192 --iters 6 \
    --out /tmp/ncu.json > $o/ncu-full-$k.txt 2>&1
  echo "ncu full $k rc=$?"; grep -E "Duration|DRAM Throughput|Memory Throughput|Registers|Achieved Occupancy" \
    $o/ncu-full-$k.txt | head -8
done
copy=$(grep -oP "^copy: .*: \K[0-9]+" $o/bench-pdl-1.txt)
[[ -z "$copy" || "$copy" == 0 ]] && copy=4200
start_fp4qd $copy
shapes=$(python3 -c "print(','.join(['1152x384','384x384','1536x384','384x1536']*4))")
for v in "momentum-current:--momentum 0.9 --scaling current"; do
  tag=${v%%:*}; args=${v#*:}
  room 40 "cpp train $tag" || continue
  timeout 40 $S --shapes $shapes --iters 300 --warmup 20 $args --json $o/cpp-train-$tag.json \
    > $o/cpp-train-$tag.log 2>&1
  echo "cpp train $tag rc=$? $(python3 -c "import json;d=json.load(open('$o/cpp-train-$tag.json'));print('wall p50 %.1f us, kernel p50 %.1f us, server %.1f' % (d['wall_us']['p50'], d['kernel_us']['p50'], d['server_us']['p50']))" 2>&1 | tail -1)"
done
kill $pid 2>/dev/null; wait $pid 2>/dev/null
room 40 pointer_attrs && timeout 40 python3 bench/results/h200-step/one-pass/pointer_attrs.py \
  > $o/pointer-attrs.txt 2>&1
echo "pointer_attrs rc=$?"; cat $o/pointer-attrs.txt | tail -8
