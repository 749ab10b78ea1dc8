#!/usr/bin/env bash
# Device call 4 (repository root, .bundle carried; .bundle/alt/libfp4q_cuda.so.gz is the same
# commit with two mini tiles in flight for stochastic rounding too): fp4q_bench --only row+col,
# the bundle's module ("new": one in flight for SR, two for RTN) and the alt module ("old"),
# three rounds; the shared tiles (--rows-only) once; Nsight Compute on the RTN row.
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
begin t4 "alt $(cat $b/alt/COMMIT 2>/dev/null)"
for r in 1 2 3; do
  ab_bench $r 40 row+col
  for m in new old; do grep -E "^\| quantize" $o/bench-$m-$r.txt | cut -d'|' -f2,4,6; done
done
room 40 "shared" && timeout 40 stdbuf -oL $b/bin/fp4q_bench --only row+col --rows-only \
  --out $o/bench-shared.json > $o/bench-shared.txt 2>&1
echo "shared rc=$?"; grep -E "^copy|^\| quantize" $o/bench-shared.txt | cut -d'|' -f2,4,6
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
metrics=smsp__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active
metrics=$metrics,dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum
metrics=$metrics,launch__registers_per_thread
for row in "row+col RTN" "row+col RHT+SR"; do
  room 60 "ncu $row" || continue
  timeout 60 $ncu --clock-control none --kernel-name regex:QuantizeLaneTiles --launch-skip 3 \
    --launch-count 1 --metrics $metrics $b/bin/fp4q_bench --only "$row" --iters 10 \
    --out $o/ncu-bench.json > "$o/ncu-${row// /-}.txt" 2>&1
  echo "ncu $row rc=$?"
  grep -E "QuantizeLaneTiles|inst_executed|issue_active|dram__bytes|duration|registers" \
    "$o/ncu-${row// /-}.txt" | cut -c1-120
done
