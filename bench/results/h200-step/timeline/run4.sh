#!/usr/bin/env bash
# Device call 4 (a later session; not yet run): the synchronous step() with ready signals
# (fp4q.optim ready_signal=True, the default) against the host's wait, in
# tests/python/gpu_ipc_check.py (bit-identical steps, the ready-word fallback) and in
# bench/train_loop.py (five variants) at batch 256 and 64 and under CUDA MPS; the device-wait
# test (its host side on a second thread) and the step refusals under memcheck.
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
tl b256 256 5 150
tl b64 64 5 110
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
MPS=$(command -v nvidia-cuda-mps-control || echo /usr/local/nvidia/bin/nvidia-cuda-mps-control)
$MPS -d && echo "MPS started" | tee -a $o/gpu.txt
tl b256-mps 256 3 100
echo quit | $MPS
cd $OUT && tar czf r.tgz r && rm -rf r
