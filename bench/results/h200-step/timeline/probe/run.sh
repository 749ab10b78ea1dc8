#!/usr/bin/env bash
# Device call: what blocks a host thread queued behind a device-side wait (probe_blocking_check.cu,
# one process per case), then the CUDA backend's own start-up probe: the device-wait test alone
# in a fresh process (nothing loaded before it) and fp4qd's start-up line with its reason when
# the signals stay off. Repository root, .bundle carried.
set -uo pipefail
source bench/results/h200-step/overlap/env.sh
nvidia-smi --query-gpu=name,driver_version,uuid --format=csv,noheader | tee $o/gpu.txt
echo "commit $FP4Q_COMMIT" | tee -a $o/gpu.txt
p=bench/results/h200-step/timeline/probe
nvcc -O2 -arch=sm_90 -o /tmp/probe_blocking_check $p/probe_blocking_check.cu -lcuda \
  > $o/probe-build.txt 2>&1 || { echo "probe build failed"; cat $o/probe-build.txt; }
for t in lazy lazy2 loaded gfunc fattr attr halloc malloc free fhost memset cpypin cpypage \
         event write olazy oload; do
  timeout 20 /tmp/probe_blocking_check $t 2>&1 | grep -v "^loaded [0-9]" | tee -a $o/probe.txt
done
CUDA_MODULE_LOADING=EAGER timeout 20 /tmp/probe_blocking_check lazy 2>&1 | sed 's/^/EAGER /' \
  | tee -a $o/probe.txt
timeout 60 $b/bin/fp4q_cuda_test --gtest_filter='*DeviceWaits*' > $o/device-waits-alone.txt 2>&1
echo "rc=$?" >> $o/device-waits-alone.txt
grep -E "^\[ +(OK|SKIPPED|FAILED|PASSED) |rc=|skip" $o/device-waits-alone.txt
d=/tmp/fq; mkdir -p $d; rm -f $d/*.sock
$b/bin/fp4qd --listen 127.0.0.1:0 --metrics_listen "" --unix_socket $d/g.sock --fast_socket $d/f.sock \
  --allow_cuda_ipc --backend cuda --log_format text > $d/out 2> $o/fp4qd-start.log &
pid=$!; t0=$(date +%s%N); for i in $(seq 400); do [[ -S $d/f.sock ]] && break; sleep 0.05; done
echo "fp4qd serving after $(( ($(date +%s%N) - t0) / 1000000 )) ms" | tee -a $o/fp4qd-start.log
grep -E -o "step_signals[^ ]*|device-side step signals off.*" $o/fp4qd-start.log | head -3
kill $pid; wait $pid
cd $OUT && tar czf probe.tgz r && rm -rf r
