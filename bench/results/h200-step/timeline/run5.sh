#!/usr/bin/env bash
# Device call 5 (ran at d3a9f25 after run4.sh: README.md, call5/): bench/train_loop.py's five
# variants at batch 64 (bound by the host) and at batch 256 under CUDA MPS (one GPU context
# for fp4qd and the worker: no time-slicing between the two processes), then batch 256 again
# without MPS in the same call.
set -uo pipefail
source bench/results/h200-step/overlap/env.sh
nvidia-smi --query-gpu=name,driver_version,uuid --format=csv,noheader | tee $o/gpu.txt
echo "commit $FP4Q_COMMIT" | tee -a $o/gpu.txt
tl() {  # tl TAG BATCH ROUNDS SECONDS
  timeout $4 python3 bench/train_loop.py --fp4qd "$b/bin/fp4qd" --rounds $3 --batch $2 \
    --out $o/train-loop-$1.json > $o/train-loop-$1.txt 2>&1; echo "$1 rc=$?"
  tail -16 $o/train-loop-$1.txt
}
tl b64 64 5 150
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
MPS=$(command -v nvidia-cuda-mps-control || echo /usr/local/nvidia/bin/nvidia-cuda-mps-control)
$MPS -d && echo "MPS started" | tee -a $o/gpu.txt
tl b256-mps 256 3 130
echo quit | $MPS
unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
tl b256 256 3 130
cd $OUT && tar czf r.tgz r && rm -rf r
