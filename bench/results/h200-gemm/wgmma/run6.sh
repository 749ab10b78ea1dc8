#!/usr/bin/env bash
# Device call 6: where the wgmma kernel's chunk time goes at M = 128 (N = K = 8192): Nsight
# Compute's per-instruction samples (SourceCounters: executed instructions and warp stall
# samples by SASS line) and its warp-state and memory sections, then the SASS page as CSV.
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
begin g6
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
room 200 "ncu m128" && timeout 200 $ncu --clock-control none -k regex:WgmmaKernel \
  --launch-skip 3 --launch-count 1 --section SpeedOfLight --section WarpStateStats \
  --section SourceCounters --section MemoryWorkloadAnalysis --section Occupancy \
  --section LaunchStats -o $o/m128 $b/bin/fp4q_bench --out /tmp/n.json --only GEMM \
  --gemm-m 128 --iters 5 > $o/ncu-m128.txt 2>&1
echo "ncu rc=$?"; tail -3 $o/ncu-m128.txt
room 60 "ncu pages" || exit 0
$ncu -i $o/m128.ncu-rep --page details > $o/details-m128.txt 2>&1
grep -E "Duration|Throughput|Warp Cycles|Issued|Eligible|Active Warps|Registers|Stall" \
  $o/details-m128.txt | head -40
$ncu -i $o/m128.ncu-rep --page source --print-source sass --csv > $o/sass-m128.csv 2>&1
echo "sass rc=$? lines $(wc -l < $o/sass-m128.csv)"; head -2 $o/sass-m128.csv | cut -c1-600
gzip -f $o/sass-m128.csv
