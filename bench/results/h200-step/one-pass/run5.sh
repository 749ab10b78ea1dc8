#!/usr/bin/env bash
# Device call 5 of one-pass steps (repository root, .bundle carried with the module of 46cdb17
# gzipped in .bundle/alt/). Each phase only if it fits (room, LIMIT):
#   1. fp4q_bench's delayed SGD + EF step rows (apply alone, check + apply, one pass; GPT-2 and
#      8192 x 8192), the module under test, then the one of 46cdb17, each with its own copy row
#      (call 4 gave them 60 s each, too little: building GPT-2's weights on the host is slow)
#   2. through fp4qd from C++ (fp4q bench-step --plan, delayed): Llama-3-8B's 32 layers, then
#      GPT-2 and 8192 x 8192, two passes then one (run1b.sh's step_pair)
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
begin r5 "alt module $(cat $b/alt/COMMIT 2>/dev/null)"
ab_bench 1 130 "SGD + EF, delayed"
bw=$(python3 -c "import json;print(json.load(open('$o/bench-new-1.json'))['copy_gbps'])" || echo 4200)
start_fp4qd $bw
step_pair llama 1 70 100 --model llama3-8b --iters 20 --warmup 3
step_pair gpt2 1 70 100 --model gpt2-small --iters 300
step_pair sq8192 1 70 100 --model square8192 --iters 300
kill $pid; wait $pid
