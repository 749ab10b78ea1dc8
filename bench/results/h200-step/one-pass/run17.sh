#!/usr/bin/env bash
# Device call 17 (repository root, .bundle carried): run15's A/B again with its output line-
# buffered (call 15's runs timed out with nothing written while fp4q_bench built its inputs on
# one thread; it uses every core now): fp4q_bench's step rows over GPT-2, 8192 x 8192 and the
# train suite's 16 matrices, the step kernels as programmatic dependent launches (the default)
# and plain (FP4Q_STEP_PDL=0), alternating; then the train
# suite's matrices through fp4qd from C++ as the suite steps them (momentum 0.9 + EF, current
# scaling). Each only if it fits (room, LIMIT).
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
begin r17
for r in 1 2; do pdl_bench $r 100 pdl plain; done
copy=$(grep -oP "^copy: .*: \K[0-9]+" $o/bench-pdl-1.txt)
[[ -z "$copy" || "$copy" == 0 ]] && copy=3000
start_fp4qd $copy
shapes=$(python3 -c "print(','.join(['1152x384','384x384','1536x384','384x1536']*4))")
room 40 "cpp train" && timeout 40 $b/bin/fp4q --server unix://$d/g.sock bench-step \
  --fast-socket $d/f.sock --plan --copy-bandwidth $copy --shapes $shapes --iters 300 \
  --warmup 20 --momentum 0.9 --scaling current --json $o/cpp-train.json > $o/cpp-train.log 2>&1
echo "cpp train rc=$? $(python3 -c "import json;d=json.load(open('$o/cpp-train.json'));print('wall p50 %.1f us, kernel p50 %.1f us, server %.1f' % (d['wall_us']['p50'], d['kernel_us']['p50'], d['server_us']['p50']))" 2>&1 | tail -1)"
kill $pid 2>/dev/null; wait $pid 2>/dev/null
