#!/usr/bin/env bash
# Device call (repository root, .bundle carried): how the small-M main kernel's idle SM time is
# spread: Nsight Compute's per-SM active cycles (min / average / max) and CTAs per SM, at M = 1
# and 16, for three launches each.
set -uo pipefail
source bench/results/h200-step/overlap/env.sh
archive_on_exit ${ARCHIVE:-g5}
nvidia-smi --query-gpu=name,driver_version,uuid --format=csv,noheader | tee $o/gpu.txt
echo "commit $FP4Q_COMMIT" | tee -a $o/gpu.txt
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
m_list=${M_LIST:-1 16}
for m in $m_list; do
  room 40 "ncu $m" || continue
  timeout 40 $ncu --clock-control none -k regex:"SmallM" --launch-skip 3 --launch-count 3 \
    --metrics gpu__time_duration.sum,gpc__cycles_elapsed.max,sm__cycles_active.min,sm__cycles_active.avg,sm__cycles_active.max,sm__ctas_launched.min,sm__ctas_launched.max,sm__ctas_launched.sum,smsp__inst_executed.min,smsp__inst_executed.max \
    $b/bin/fp4q_bench --only GEMM --gemm-m $m --iters 5 --out $o/n.json > $o/ncu-$m.txt 2>&1
  echo "ncu $m rc=$?"
  grep -E "^  [a-zA-Z].*\(|duration|cycles|ctas|inst_exec" $o/ncu-$m.txt | sed 's/(unnamed namespace)//' | cut -c1-90
done
