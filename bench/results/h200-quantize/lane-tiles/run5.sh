#!/usr/bin/env bash
# Device call 5 (repository root, .bundle carried): where the two-output kernels' warps wait.
# Nsight Compute's stall reasons (per issued instruction) and L1/L2 request counts on the row +
# column rows (RTN and RHT + SR) for the lane tiles and the shared tiles (--rows-only), and on
# the row-wise RTN row (the one-block-a-lane kernel) for reference.
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
begin t5
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
m=smsp__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active
m=$m,gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum
m=$m,l1tex__t_requests_pipe_lsu_mem_global_op_st.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum
m=$m,l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum
m=$m,lts__t_sectors_op_write.sum,lts__t_sectors_op_read.sum
m=$m,l1tex__data_pipe_lsu_wavefronts.sum,l1tex__lsu_writeback_active.avg.pct_of_peak_sustained_active
for s in long_scoreboard lg_throttle mio_throttle short_scoreboard wait math_pipe_throttle \
    barrier membar drain not_selected dispatch_stall no_instruction branch_resolving \
    tex_throttle imc_miss selected; do
  m=$m,smsp__average_warps_issue_stalled_${s}_per_issue_active.ratio
done
run_ncu() {  # NAME KERNEL_REGEX ROW [FLAGS]
  room 60 "ncu $1" || return
  timeout 60 $ncu --clock-control none --kernel-name "$2" --launch-skip 3 --launch-count 1 \
    --metrics $m $b/bin/fp4q_bench --only "$3" --iters 10 ${4:-} --out $o/ncu-bench.json \
    > $o/ncu-$1.txt 2>&1
  echo "== $1 rc=$?"
  grep -E "inst_executed|issue_active|duration|dram__bytes|l1tex|lts__|stalled" $o/ncu-$1.txt \
    | awk '{printf "%s %s\n", $1, $NF}' | sed 's/smsp__average_warps_issue_stalled_//; s/_per_issue_active.ratio//'
}
run_ncu lanes-rtn regex:QuantizeLaneTiles "row+col RTN"
run_ncu shared-rtn regex:QuantizeTileKernel "row+col RTN" --rows-only
run_ncu lanes-sr regex:QuantizeLaneTiles "row+col RHT+SR"
run_ncu rowwise-rtn regex:QuantizeBlocksKernel "1x16 RTN, amax given"
