#!/usr/bin/env bash
# Device call: bench/train_loop.py at batch 256 against fp4qd by default, busy-polling, and under CUDA MPS.
set -uo pipefail
b=$PWD/.bundle
cuda_lib=/usr/local/cuda/lib64
export LD_LIBRARY_PATH="$b/lib:$cuda_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if [[ ! -e "$cuda_lib/libcublasLt.so.13" ]]; then
  extra=$(python3 -c 'import nvidia.cublas, os; print(os.path.join(list(nvidia.cublas.__path__)[0], "lib"))' 2>/dev/null || true)
  [[ -n "$extra" ]] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$extra"
fi
chmod +x "$b"/bin/*
export FP4Q_CUDA_MODULE="$b/bin/libfp4q_cuda.so" FP4Q_FP4QD="$b/bin/fp4qd"
export PYTHONPATH="$PWD/client/python:$PWD/tests/python"
export FP4Q_PROTO_DESCRIPTOR="$b/python/fp4q_v1.binpb" PYTHONUNBUFFERED=1
export FP4Q_COMMIT=$(cat "$b/COMMIT")
o=$OUT/r; mkdir -p $o
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
