#!/usr/bin/env bash
# Device call 7 (repository root, .bundle carried): every fp4q_bench row in one run at the lane
# tiles' commit (the copy ceiling and cuBLAS bf16 in the same process).
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
begin t7
room 300 "whole bench" && timeout 300 stdbuf -oL $b/bin/fp4q_bench --out $o/bench-all.json \
  > $o/bench-all.txt 2>&1
echo "whole bench rc=$? ($SECONDS s)"; grep -E "^copy|^\|" $o/bench-all.txt | cut -d'|' -f2-7 | head -60
