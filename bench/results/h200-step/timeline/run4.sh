#!/usr/bin/env bash
# Device call 4 (ran at d3a9f25: README.md, call4/): the synchronous step() with ready signals
# (fp4q.optim ready_signal=True, the default) against the host's wait, in
# tests/python/gpu_ipc_check.py (bit-identical steps, the ready-word fallback), GPT-2's step
# queued behind 5 ms of GPU work (bench/trainer_step.py --behind-ms); the device-wait test (its
# host side on a second thread) and
# the step refusals under memcheck; fp4qd's host time around the kernels after the step's items
# are validated once and the CUDA backend builds its item table once (GPT-2's and the train
# suite's matrices from C++, with fp4qd's device worker sleeping and busy-polling between
# steps: the cost of its wake-up; GPT-2 from Python with the client's phase timers). About
# 5 minutes expected; each part writes into $OUT/r as it ends, so a call cut at its limit keeps
# what ran. run5.sh: bench/train_loop.py's five variants at batch 64, and
# at batch 256 with and without CUDA MPS.
set -uo pipefail
source bench/results/h200-step/overlap/env.sh
nvidia-smi --query-gpu=name,driver_version,uuid --format=csv,noheader | tee $o/gpu.txt
echo "commit $FP4Q_COMMIT" | tee -a $o/gpu.txt
timeout 90 $b/bin/fp4q_cuda_test --gtest_filter='*DeviceWaits*:*Step*:*LeanSgd*:*Batches*:*LongWarp*' \
  > $o/cuda-step-tests.txt 2>&1; echo "rc=$?" >> $o/cuda-step-tests.txt
grep -E "^\[  (PASSED|FAILED|SKIPPED) |rc=" $o/cuda-step-tests.txt
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
timeout 90 $cs --tool memcheck $b/bin/fp4q_cuda_test --gtest_filter='*DeviceWaits*:*StepRefusals*' \
  > $o/memcheck.txt 2>&1; echo "rc=$?" >> $o/memcheck.txt
grep -E "PASSED|FAILED|ERROR SUMMARY|rc=" $o/memcheck.txt
timeout 120 python3 tests/python/gpu_ipc_check.py --fp4qd $b/bin/fp4qd --out $o/gpu_ipc_check \
  --steps 100 > $o/gpu_ipc_check.txt 2>&1; echo "rc=$?" >> $o/gpu_ipc_check.txt
tail -4 $o/gpu_ipc_check.txt
# fp4qd as it runs by default, then with its device worker busy-polling for work (the steps
# come back to back, so the spin saves the worker's wake-up: its cost on this host).
d=/tmp/fq; mkdir -p $d
small=$(for l in 1 2 3 4; do printf "1152x384,384x384,1536x384,384x1536,"; done); small=${small%,}
for spin in 0 2000; do
  rm -f $d/*.sock
  $b/bin/fp4qd --listen 127.0.0.1:0 --metrics_listen "" --unix_socket $d/g.sock --worker_spin_us $spin \
    --fast_socket $d/f.sock --allow_cuda_ipc --backend cuda --log_format text > $d/out 2> $o/fp4qd-host-$spin.log &
  pid=$!; for i in $(seq 40); do [[ -S $d/f.sock ]] && break; sleep 0.5; done
  for m in "small --shapes $small" "gpt2 --model gpt2-small"; do
    for sc in current delayed; do
      set -- $m
      t=host-$1-$sc-spin$spin
      timeout 30 $b/bin/fp4q --server unix://$d/g.sock bench-step --fast-socket $d/f.sock "${@:2}" \
        --plan --scaling $sc --iters 300 --warmup 20 --json $o/$t.json > $o/$t.log 2>&1
      python3 -c "import json;d=json.load(open('$o/$t.json'));print('$t wall', d['wall_us']['p50'], 'kernel', d['kernel_us']['p50'], 'server', d['server_us']['p50'])"
    done
  done
  kill $pid; wait $pid
done
B=$b MODES=gpt2 SCALING=delayed N=200 timeout 100 python3 bench/results/h200-step/python-client/trainloop.py \
  > $o/trainloop-gpt2-delayed.txt 2>&1; echo "trainloop rc=$?"; cat $o/trainloop-gpt2-delayed.txt
timeout 120 python3 bench/trainer_step.py --fp4qd $b/bin/fp4qd --models '' --behind-ms 5 \
  --json $o/behind.json > $o/behind.txt 2>&1; echo "behind rc=$?"; tail -8 $o/behind.txt
cd $OUT && tar czf r.tgz r && rm -rf r
