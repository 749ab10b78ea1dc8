#!/usr/bin/env bash
# Every fp4q_bench row in one run (the copy ceiling and cuBLAS bf16 in the same process), at the
# bundle's commit, on whichever GPU the call gets (gpu.txt names it).
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
begin k1
room 190 "whole bench" && timeout 190 stdbuf -oL $b/bin/fp4q_bench --out $o/bench-all.json \
  > $o/bench-all.txt 2>&1
echo "whole bench rc=$? ($SECONDS s)"; grep -E "^copy|^\|" $o/bench-all.txt | cut -d'|' -f2-7 | head -70
