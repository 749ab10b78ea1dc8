#!/usr/bin/env bash
# Device call 3: the device-wait test (its host side on a second thread) and the step refusals
# under memcheck; bench/train_loop.py at batch 256 (7 rounds), the same under CUDA MPS (one
# GPU context for fp4qd and the worker: no time-slicing between them), and at batch 64.
set -uo pipefail
source bench/results/h200-step/overlap/env.sh
nvidia-smi --query-gpu=name,driver_version,uuid --format=csv,noheader | tee $o/gpu.txt
echo "commit $FP4Q_COMMIT" | tee -a $o/gpu.txt
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
timeout 100 $cs --tool memcheck $b/bin/fp4q_cuda_test --gtest_filter='*DeviceWaits*:*StepRefusals*' \
  > $o/memcheck.txt 2>&1; echo "rc=$?" >> $o/memcheck.txt; grep -E "PASSED|FAILED|ERROR SUMMARY|rc=" $o/memcheck.txt
tl() {  # tl TAG BATCH ROUNDS
  timeout 150 python3 bench/train_loop.py --fp4qd "$b/bin/fp4qd" --rounds $3 --batch $2 \
    --out $o/train-loop-$1.json > $o/train-loop-$1.txt 2>&1; echo "$1 rc=$?"
  tail -12 $o/train-loop-$1.txt
}
tl b256 256 7
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
MPS=$(command -v nvidia-cuda-mps-control || echo /usr/local/nvidia/bin/nvidia-cuda-mps-control)
$MPS -d && echo "MPS started" | tee -a $o/gpu.txt
tl b256-mps 256 5
echo quit | $MPS
unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
tl b64 64 5
cd $OUT && tar czf r.tgz r && rm -rf r
