#!/usr/bin/env bash
# Device call 7 (not yet run: no machine could be started): the CUDA backend's step kernels
# loaded at startup and its probe of whether a
# launch behind a device-side wait blocks
# (the device-wait test runs plainly, and skips under compute-sanitizer memcheck instead of
# hanging; fp4qd's startup line says step_signals=device), then GPT-2's step behind 5 ms of GPU
# work (bench/trainer_step.py --behind-ms 5), fp4qd's device-side signals on and off, without
# and with CUDA MPS: whether what a step adds
# after the work, beyond its kernels, is the GPU switching between the worker's and fp4qd's
# contexts; and a cProfile of the Python client's step() for GPT-2 (trainloop.py PROFILE=1).
set -uo pipefail
source bench/results/h200-step/overlap/env.sh
archive_on_exit r
nvidia-smi --query-gpu=name,driver_version,uuid --format=csv,noheader | tee $o/gpu.txt
echo "commit $FP4Q_COMMIT" | tee -a $o/gpu.txt
f='*DeviceWaits*:*StepRefusals*'
timeout 60 $b/bin/fp4q_cuda_test --gtest_filter="$f:*Batches*:*StepMatchesCpu*" > $o/device-waits.txt 2>&1
echo "rc=$?" >> $o/device-waits.txt; grep -E "^\[ +(OK|SKIPPED|FAILED|PASSED) |rc=" $o/device-waits.txt
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
room 90 memcheck && timeout 90 $cs --tool memcheck $b/bin/fp4q_cuda_test --gtest_filter="$f" > $o/memcheck.txt 2>&1
echo "rc=$?" >> $o/memcheck.txt; grep -E "^\[ +(OK|SKIPPED|FAILED|PASSED) |ERROR SUMMARY|rc=|skip" $o/memcheck.txt
d=/tmp/fq; mkdir -p $d; rm -f $d/*.sock
$b/bin/fp4qd --listen 127.0.0.1:0 --metrics_listen "" --unix_socket $d/g.sock --fast_socket $d/f.sock \
  --allow_cuda_ipc --backend cuda --log_format text > $d/out 2> $o/fp4qd-start.log &
pid=$!; t0=$(date +%s%N); for i in $(seq 400); do [[ -S $d/f.sock ]] && break; sleep 0.05; done
echo "fp4qd serving after $(( ($(date +%s%N) - t0) / 1000000 )) ms" | tee -a $o/fp4qd-start.log
grep -o "step_signals[^ ]*" $o/fp4qd-start.log | head -2; kill $pid; wait $pid
behind() {  # behind TAG [fp4qd flag]
  room 100 "behind $1" || return 0
  timeout 100 python3 bench/trainer_step.py --fp4qd $b/bin/fp4qd --models '' --behind-ms 5 \
    --steps 100 --warmup 10 ${2:+--fp4qd-arg=$2} --json $o/behind-$1.json > $o/behind-$1.txt 2>&1
  echo "behind $1 rc=$?"; grep -E "after the work|8192" $o/behind-$1.txt
}
behind device
behind host --step_device_signals=false
# Nsight Compute: each step kernel's GPU time and DRAM bytes (GPT-2's 50 matrices and one
# 8192x8192, delayed scaling, steps from C++). fp4qd itself is stopped (SIGTERM) so that ncu,
# its parent, writes the log.
if room 150 ncu; then
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
rm -f $d/*.sock
timeout 150 $ncu --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
  --print-units base --csv --log-file $o/ncu-step.csv $b/bin/fp4qd --listen 127.0.0.1:0 --metrics_listen "" \
  --unix_socket $d/g.sock --fast_socket $d/f.sock --allow_cuda_ipc --backend cuda \
  --log_format text > $d/out 2> $o/fp4qd-ncu.log &
npid=$!; for i in $(seq 600); do [[ -S $d/f.sock ]] && break; sleep 0.1; done
for m in "gpt2 --model gpt2-small" "8192 --shapes 8192x8192"; do
  set -- $m
  timeout 60 $b/bin/fp4q --server unix://$d/g.sock bench-step --fast-socket $d/f.sock "${@:2}" \
    --plan --scaling delayed --iters 4 --warmup 1 > $o/ncu-bench-$1.log 2>&1; echo "ncu $1 rc=$?"
done
pkill -TERM -f "^$b/bin/fp4qd" ; wait $npid; echo "ncu rc=$?"
python3 - "$o/ncu-step.csv" <<'PY'
import csv, collections, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
h = rows[0]
ki, mi, vi, ii = (h.index("Kernel Name"), h.index("Metric Name"), h.index("Metric Value"),
                  h.index("ID"))
k = collections.OrderedDict()
for r in rows[1:]:
    k.setdefault(r[ii], {"name": r[ki]})[r[mi]] = float(r[vi].replace(",", ""))
for v in list(k.values())[-60:]:
    t = v.get("gpu__time_duration.sum", 0)
    b = v.get("dram__bytes_read.sum", 0) + v.get("dram__bytes_write.sum", 0)
    print("%-56s %9.1f us %9.1f MB %7.1f GB/s" % (v["name"][:56], t / 1e3, b / 1e6,
                                                 b / t if t else 0))
PY
fi
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
MPS=$(command -v nvidia-cuda-mps-control || echo /usr/local/nvidia/bin/nvidia-cuda-mps-control)
$MPS -d && echo "MPS started" | tee -a $o/gpu.txt
behind mps-device
behind mps-host --step_device_signals=false
echo quit | $MPS
unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
room 100 trainloop && B=$b MODES=gpt2 SCALING=delayed N=200 PROFILE=1 timeout 100 \
  python3 bench/results/h200-step/python-client/trainloop.py > $o/trainloop-gpt2-profile.txt 2>&1
echo "trainloop rc=$?"; head -4 $o/trainloop-gpt2-profile.txt
