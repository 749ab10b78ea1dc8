#!/usr/bin/env bash
# Device call 1a of one-pass steps (then run1b.sh on the same warm machine) (StepRequest.one_pass): repository root, .bundle carried
# (scripts/device-bundle.sh at the commit under test). Correctness first, then speed, each
# two-pass row beside its one-pass row in the same run:
#   1. fp4q_cuda_test: the one-pass tests and the step tests, bit for bit against the CPU backend
#   2. the one-pass tests under compute-sanitizer memcheck
#   3. fp4q_bench --only step: per-kernel-set times of GPT-2's 50 weights and one 8192x8192
#      (apply only, check + apply, one pass), with the device copy in the same run; Nsight
#      Compute's time, instructions and DRAM bytes of each step kernel, two-pass and one-pass
#   4. fp4qd from C++ (bench-step, fast socket, step plans, delayed scaling): GPT-2, 8192x8192
#      twice each, and Llama-3-8B's 32 layers once: two passes, then one pass
#   5. Python: gpu_ipc_check (one-pass steps by IPC, the refusal's restored outputs) and
#      trainer_step.py for GPT-2 (its one-pass rows beside torch's optimizers)
set -uo pipefail
source bench/results/h200-step/overlap/env.sh
archive_on_exit r1a
nvidia-smi --query-gpu=name,driver_version,uuid --format=csv,noheader | tee $o/gpu.txt
echo "commit $FP4Q_COMMIT" | tee -a $o/gpu.txt
timeout 150 $b/bin/fp4q_cuda_test --gtest_filter='*OnePass*:*Step*:*LeanSgd*:*Batches*' \
  > $o/cuda-tests.txt 2>&1
echo "rc=$?" >> $o/cuda-tests.txt; grep -E "^\[ +(FAILED|PASSED|SKIPPED) |rc=" $o/cuda-tests.txt
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
room 120 memcheck && timeout 120 $cs --tool memcheck $b/bin/fp4q_cuda_test --gtest_filter='*OnePass*' \
  > $o/memcheck.txt 2>&1
echo "rc=$?" >> $o/memcheck.txt; grep -E "^\[ +(FAILED|PASSED) |ERROR SUMMARY|rc=" $o/memcheck.txt
room 150 "fp4q_bench step rows" && timeout 150 $b/bin/fp4q_bench --only step --out $o/bench-step.json > $o/bench-step.txt 2>&1
echo "fp4q_bench rc=$?"; grep -E "copy|SGD" $o/bench-step.txt | head -12
# Nsight Compute on one GPT-2 step of each kind: the kernels' time, instructions and DRAM bytes
# (the one-pass apply carries the check's work: its instructions an element against the lean
# apply's plus the check's).
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for row in "step check + apply, SGD + EF, delayed" "step one pass, SGD + EF, delayed"; do
  tag=$([[ $row == *"one pass"* ]] && echo one || echo two)
  room 120 "ncu $tag" || continue
  timeout 120 $ncu --clock-control none --kernel-name regex:Step --launch-skip 40 \
    --launch-count 8 --metrics gpu__time_duration.sum,smsp__inst_executed.sum,dram__bytes_read.sum,dram__bytes_write.sum,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active \
    $b/bin/fp4q_bench --only "$row" --iters 3 --out /tmp/ncu-$tag.json > $o/ncu-$tag.txt 2>&1
  echo "ncu $tag rc=$?"; grep -E "Step[A-Za-z]+Kernel|gpu__time|inst_executed|issue_active" $o/ncu-$tag.txt | head -24
done
