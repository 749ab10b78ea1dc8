#!/usr/bin/env bash
# Device call 4 (a later session; not yet run): the synchronous step() with ready signals
# (fp4q.optim ready_signal=True, the default) against the host's wait, in
# tests/python/gpu_ipc_check.py (bit-identical steps, the ready-word fallback), GPT-2's step
# queued behind 5 ms of GPU work (bench/trainer_step.py --behind-ms) and bench/train_loop.py
# (five variants) at batch 256; the device-wait test (its host side on a second thread) and
# the step refusals under memcheck. run5.sh: the loop at batch 64 and under CUDA MPS.
set -uo pipefail
source bench/results/h200-step/overlap/env.sh
nvidia-smi --query-gpu=name,driver_version,uuid --format=csv,noheader | tee $o/gpu.txt
echo "commit $FP4Q_COMMIT" | tee -a $o/gpu.txt
timeout 60 $b/bin/fp4q_cuda_test --gtest_filter='*DeviceWaits*:*Step*:*LeanSgd*' \
  > $o/cuda-step-tests.txt 2>&1; echo "rc=$?" >> $o/cuda-step-tests.txt
grep -E "^\[  (PASSED|FAILED|SKIPPED) |rc=" $o/cuda-step-tests.txt
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
timeout 90 $cs --tool memcheck $b/bin/fp4q_cuda_test --gtest_filter='*DeviceWaits*:*StepRefusals*' \
  > $o/memcheck.txt 2>&1; echo "rc=$?" >> $o/memcheck.txt
grep -E "PASSED|FAILED|ERROR SUMMARY|rc=" $o/memcheck.txt
timeout 120 python3 tests/python/gpu_ipc_check.py --fp4qd $b/bin/fp4qd --out $o/gpu_ipc_check \
  --steps 100 > $o/gpu_ipc_check.txt 2>&1; echo "rc=$?" >> $o/gpu_ipc_check.txt
tail -4 $o/gpu_ipc_check.txt
tl() {  # tl TAG BATCH ROUNDS SECONDS
  timeout $4 python3 bench/train_loop.py --fp4qd "$b/bin/fp4qd" --rounds $3 --batch $2 \
    --out $o/train-loop-$1.json > $o/train-loop-$1.txt 2>&1; echo "$1 rc=$?"
  tail -16 $o/train-loop-$1.txt
}
timeout 120 python3 bench/trainer_step.py --fp4qd $b/bin/fp4qd --models '' --behind-ms 5 \
  --json $o/behind.json > $o/behind.txt 2>&1; echo "behind rc=$?"; tail -8 $o/behind.txt
tl b256 256 3 130
cd $OUT && tar czf r.tgz r && rm -rf r
