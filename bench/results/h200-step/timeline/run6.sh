#!/usr/bin/env bash
# Device call 6 (ran at b398625: README.md, call6/): the CUDA backend's probe of whether a
# launch behind a device-side wait blocks
# (the device-wait test runs plainly, and skips under compute-sanitizer memcheck instead of
# hanging; fp4qd's startup line says step_signals=device), then GPT-2's step behind 5 ms of GPU
# work (bench/trainer_step.py --behind-ms 5) without and with CUDA MPS: whether what a step adds
# after the work, beyond its kernels, is the GPU switching between the worker's and fp4qd's
# contexts; and a cProfile of the Python client's step() for GPT-2 (trainloop.py PROFILE=1).
set -uo pipefail
source bench/results/h200-step/overlap/env.sh
nvidia-smi --query-gpu=name,driver_version,uuid --format=csv,noheader | tee $o/gpu.txt
echo "commit $FP4Q_COMMIT" | tee -a $o/gpu.txt
f='*DeviceWaits*:*StepRefusals*'
timeout 60 $b/bin/fp4q_cuda_test --gtest_filter="$f" > $o/device-waits.txt 2>&1
echo "rc=$?" >> $o/device-waits.txt; grep -E "^\[ +(OK|SKIPPED|FAILED|PASSED) |rc=" $o/device-waits.txt
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
timeout 120 $cs --tool memcheck $b/bin/fp4q_cuda_test --gtest_filter="$f" > $o/memcheck.txt 2>&1
echo "rc=$?" >> $o/memcheck.txt; grep -E "^\[ +(OK|SKIPPED|FAILED|PASSED) |ERROR SUMMARY|rc=|skip" $o/memcheck.txt
d=/tmp/fq; mkdir -p $d; rm -f $d/*.sock
$b/bin/fp4qd --listen 127.0.0.1:0 --metrics_listen "" --unix_socket $d/g.sock --fast_socket $d/f.sock \
  --allow_cuda_ipc --backend cuda --log_format text > $d/out 2> $o/fp4qd-start.log &
pid=$!; for i in $(seq 40); do [[ -S $d/f.sock ]] && break; sleep 0.5; done
grep -o "step_signals[^ ]*" $o/fp4qd-start.log | head -2; kill $pid; wait $pid
behind() {  # behind TAG
  timeout 150 python3 bench/trainer_step.py --fp4qd $b/bin/fp4qd --models '' --behind-ms 5 \
    --json $o/behind-$1.json > $o/behind-$1.txt 2>&1; echo "behind $1 rc=$?"; tail -8 $o/behind-$1.txt
}
behind plain
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
MPS=$(command -v nvidia-cuda-mps-control || echo /usr/local/nvidia/bin/nvidia-cuda-mps-control)
$MPS -d && echo "MPS started" | tee -a $o/gpu.txt
behind mps
echo quit | $MPS
unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
B=$b MODES=gpt2 SCALING=delayed N=200 PROFILE=1 timeout 100 \
  python3 bench/results/h200-step/python-client/trainloop.py > $o/trainloop-gpt2-profile.txt 2>&1
echo "trainloop rc=$?"; head -4 $o/trainloop-gpt2-profile.txt
cd $OUT && tar czf r.tgz r && rm -rf r
