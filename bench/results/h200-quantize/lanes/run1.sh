#!/usr/bin/env bash
# Device call (repository root, .bundle carried; .bundle/alt/libfp4q_cuda.so.gz is the CUDA
# module of the commit before, "old"): the one-block-a-lane quantize kernels after their rewrite
# ("new": packed bf16 block amax, the scale multiplier from a per-CTA table, the loop over two
# register sets, the amax-only pass its own kernel).
#   1. fp4q_cuda_test's quantize tests (bit for bit against the CPU backend), new module
#   2. the same subset as h200-quantize/memcheck.txt under compute-sanitizer memcheck
#   3. fp4q_bench --only quantize: new, old, new, old (each file has its own copy row)
#   4. Nsight Compute's instruction counts of rows 1-3 and the amax pass, new and old
#   5. fp4q_bench --only quantize --bf16-block-ctas 4, new and old
# Each only if it fits (room, LIMIT).
set -uo pipefail
source bench/results/h200-step/overlap/env.sh
archive_on_exit q1
nvidia-smi --query-gpu=name,driver_version,uuid --format=csv,noheader | tee $o/gpu.txt
echo "commit $FP4Q_COMMIT" | tee -a $o/gpu.txt
gunzip -f $b/alt/libfp4q_cuda.so.gz
new=$b/bin/libfp4q_cuda.so; old=$b/alt/libfp4q_cuda.so
room 60 tests && timeout 60 $b/bin/fp4q_cuda_test --gtest_filter='*Quantize*:*Amax*:*Guard*' \
  > $o/cuda-test-quantize.txt 2>&1
echo "tests rc=$?"; grep -E "^\[ +(FAILED|PASSED|SKIPPED) " $o/cuda-test-quantize.txt | head -20
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
room 90 memcheck && timeout 90 $cs --tool memcheck $b/bin/fp4q_cuda_test \
  --gtest_filter='LargeQuantizeTest.*:AllModes/QuantizeTest.MatchesCpuBitForBit/1*' \
  > $o/memcheck.txt 2>&1
echo "memcheck rc=$?"; grep -E "^\[ +(FAILED|PASSED) |ERROR SUMMARY" $o/memcheck.txt
for r in 1 2; do
  for m in new old; do
    mod=$new; [[ $m == old ]] && mod=$old
    room 60 "bench $m $r" || continue
    FP4Q_CUDA_MODULE=$mod timeout 60 stdbuf -oL $b/bin/fp4q_bench --only quantize \
      --out $o/bench-$m-$r.json > $o/bench-$m-$r.txt 2>&1
    echo "bench $m $r rc=$?"; grep -E "^copy|^quantize|^amax|^RHT|^dequantize" $o/bench-$m-$r.txt
  done
done
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
metrics=dram__throughput.avg.pct_of_peak_sustained_elapsed,gpu__time_duration.sum,launch__registers_per_thread,sm__inst_issued.avg.pct_of_peak_sustained_active,sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_fmaheavy_cycles_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,smsp__inst_executed_pipe_alu.sum,smsp__inst_executed_pipe_fma.sum,smsp__inst_executed_pipe_fmaheavy.sum,smsp__inst_executed_pipe_lsu.sum,smsp__inst_executed_pipe_uniform.sum,smsp__warps_eligible.avg.per_cycle_active,sm__warps_active.avg.pct_of_peak_sustained_active
i=0
for row in "1x16 RTN, amax given" "1x16 SR, amax given" "1x16 RHT+SR, amax given" \
           "1x16 RTN, amax computed"; do
  i=$((i + 1))
  for m in new old; do
    mod=$new; [[ $m == old ]] && mod=$old
    room 40 "ncu $i $m" || continue
    FP4Q_CUDA_MODULE=$mod timeout 40 $ncu --clock-control none --kernel-name regex:"Blocks" \
      --launch-skip 3 --launch-count 1 --metrics $metrics $b/bin/fp4q_bench --only "$row" \
      --iters 5 --out $o/ncu-$i-$m.json > $o/ncu-$i-$m.txt 2>&1
    echo "ncu $i $m rc=$? $(grep -E "gpu__time_duration|smsp__inst_executed.sum " $o/ncu-$i-$m.txt | awk '{print $NF}' | tr '\n' ' ')"
  done
done
for m in new old; do
  mod=$new; [[ $m == old ]] && mod=$old
  room 60 "bench c4 $m" || continue
  FP4Q_CUDA_MODULE=$mod timeout 60 stdbuf -oL $b/bin/fp4q_bench --only "1x16" --bf16-block-ctas 4 \
    --out $o/c4-$m.json > $o/c4-$m.txt 2>&1
  echo "c4 $m rc=$?"; grep -E "^copy|^quantize" $o/c4-$m.txt
done
