#!/usr/bin/env bash
# Device call: bench/train_loop.py at batch 256 against fp4qd by default, busy-polling, and under CUDA MPS.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
nvidia-smi --query-gpu=name,driver_version,uuid --format=csv,noheader | tee $o/gpu.txt
echo "commit $FP4Q_COMMIT" | tee -a $o/gpu.txt
tl() {  # tl TAG [train_loop args]
  local tag=$1; shift
  timeout 170 python3 bench/train_loop.py --fp4qd "$b/bin/fp4qd" --rounds 7 --batch 256 \
    --out $o/train-loop-b256-$tag.json "$@" 2>&1 | tee $o/train-loop-b256-$tag.txt | tail -4
}
tl default
tl spin --fp4qd-arg=--worker_spin_us=20000 --fp4qd-arg=--fast_socket_spin_us=20000
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
MPS=$(command -v nvidia-cuda-mps-control || echo /usr/local/nvidia/bin/nvidia-cuda-mps-control)
$MPS -d && echo "MPS started" | tee -a $o/gpu.txt
tl mps
echo quit | $MPS
cd $OUT && tar czf r.tgz r && rm -rf r
