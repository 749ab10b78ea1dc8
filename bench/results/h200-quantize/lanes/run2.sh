#!/usr/bin/env bash
# Device call (repository root, .bundle carried; .bundle/alt/libfp4q_cuda.so.gz is the module of
# 78c7b03, "old"): run1.sh's checks after the RHT's signs on packed bf16 pairs and MXFP4 on the
# one-block-a-lane kernel ("new").
#   1. the whole fp4q_cuda_test (new module)
#   2. compute-sanitizer memcheck over the lane kernels' large tests and MXFP4's
#   3. fp4q_bench --only quantize: new, old, new, old
#   4. Nsight Compute's instruction counts of the SR, RHT + SR and MXFP4 rows, new and old
# Each only if it fits (room, LIMIT). run3.sh and run4.sh run this with other settings: ARCHIVE
# (the archive's name, default q2), MEMCHECK_S (memcheck's limit, default 100), NCU_ROWS (the
# rows Nsight Compute counts, '|'-separated) and NCU_MODULES ("new old" or "new").
set -uo pipefail
source bench/results/h200-step/overlap/env.sh
archive_on_exit ${ARCHIVE:-q2}
nvidia-smi --query-gpu=name,driver_version,uuid --format=csv,noheader | tee $o/gpu.txt
echo "commit $FP4Q_COMMIT" | tee -a $o/gpu.txt
gunzip -f $b/alt/libfp4q_cuda.so.gz
new=$b/bin/libfp4q_cuda.so; old=$b/alt/libfp4q_cuda.so
room 180 tests && timeout 180 $b/bin/fp4q_cuda_test > $o/cuda-test.txt 2>&1
echo "tests rc=$?"; grep -E "^\[ +(FAILED|PASSED|SKIPPED) |tests ran" $o/cuda-test.txt | head -20
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
ms=${MEMCHECK_S:-100}
room $ms memcheck && timeout $ms $cs --tool memcheck $b/bin/fp4q_cuda_test \
  --gtest_filter='LargeQuantizeTest.*:CudaTest.Qdq*' > $o/memcheck.txt 2>&1
echo "memcheck rc=$?"; grep -E "^\[ +(FAILED|PASSED) |ERROR SUMMARY" $o/memcheck.txt
for r in 1 2; do
  for m in new old; do
    mod=$new; [[ $m == old ]] && mod=$old
    room 50 "bench $m $r" || continue
    FP4Q_CUDA_MODULE=$mod timeout 50 stdbuf -oL $b/bin/fp4q_bench --only quantize \
      --out $o/bench-$m-$r.json > $o/bench-$m-$r.txt 2>&1
    echo "bench $m $r rc=$?"; grep -E "^copy|^\| quantize (nv|mx)" $o/bench-$m-$r.txt | cut -d'|' -f2,4,6
  done
done
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
metrics=gpu__time_duration.sum,launch__registers_per_thread,sm__inst_issued.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,smsp__warps_eligible.avg.per_cycle_active,dram__throughput.avg.pct_of_peak_sustained_elapsed
IFS='|' read -ra rows <<< "${NCU_ROWS:-1x16 SR, amax given|1x16 RHT+SR, amax given|mxfp4 RTN}"
i=0
for row in "${rows[@]}"; do
  i=$((i + 1))
  for m in ${NCU_MODULES:-new old}; do
    mod=$new; [[ $m == old ]] && mod=$old
    room 30 "ncu $i $m" || continue
    FP4Q_CUDA_MODULE=$mod timeout 30 $ncu --clock-control none --kernel-name regex:"Quantize" \
      --launch-skip 3 --launch-count 1 --metrics $metrics $b/bin/fp4q_bench --only "$row" \
      --iters 5 --out $o/ncu-$i-$m.json > $o/ncu-$i-$m.txt 2>&1
    echo "ncu $i $m rc=$? $(grep -E "void|gpu__time_duration|smsp__inst_executed.sum " $o/ncu-$i-$m.txt | awk '{print $NF}' | tr '\n' ' ')"
  done
done
