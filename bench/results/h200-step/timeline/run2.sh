#!/usr/bin/env bash
# Device call 2 (commit 9f0c73f: step signals on the device): the step tests and the new
# device-wait test, that test under memcheck, tests/python/gpu_ipc_check.py (fp4q.optim overlap
# with ready signals, the ready timeout's cancellation), then bench/train_loop.py at batch 64
# and 256.
set -uo pipefail
source bench/results/h200-step/overlap/env.sh
nvidia-smi --query-gpu=name,driver_version,uuid --format=csv,noheader | tee $o/gpu.txt
echo "commit $FP4Q_COMMIT" | tee -a $o/gpu.txt
timeout 200 $b/bin/fp4q_cuda_test --gtest_filter='*DeviceWaits*:*Step*:*LeanSgd*:*Batches*:*LongWarp*' \
  > $o/cuda-step-tests.txt 2>&1; echo "rc=$?" >> $o/cuda-step-tests.txt
grep -E "^\[  (PASSED|FAILED|SKIPPED) |tests ran|rc=" $o/cuda-step-tests.txt
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
timeout 90 $cs --tool memcheck $b/bin/fp4q_cuda_test --gtest_filter='*DeviceWaits*' \
  > $o/memcheck.txt 2>&1; echo "rc=$?" >> $o/memcheck.txt; tail -3 $o/memcheck.txt
timeout 150 python3 tests/python/gpu_ipc_check.py --fp4qd $b/bin/fp4qd --out $o/gpu_ipc_check \
  --steps 100 > $o/gpu_ipc_check.txt 2>&1; echo "rc=$?" >> $o/gpu_ipc_check.txt
tail -4 $o/gpu_ipc_check.txt
for batch in 64 256; do
  timeout 100 python3 bench/train_loop.py --fp4qd "$b/bin/fp4qd" --rounds 3 --batch $batch \
    --out $o/train-loop-b$batch.json > $o/train-loop-b$batch.txt 2>&1; echo "b$batch rc=$?"
  tail -12 $o/train-loop-b$batch.txt
done
cd $OUT && tar czf r.tgz r && rm -rf r
