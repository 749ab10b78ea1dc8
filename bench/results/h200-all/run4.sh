#!/usr/bin/env bash
# Not yet run. Why the overlapped step held the worker's stream 2.2 ms in call 2 (two GPU
# contexts, batch 256 x 128) where machines before measured about 0.5 ms: the same loop with
# fp4qd's step signals on the device (default) and polled by its host
# (--step_device_signals=false), and with fp4qd's automatic busy-polling off
# (--worker_spin_us=0 --fast_socket_spin_us=0), 5 rounds each (repository root, the whole
# .bundle carried, no alt modules).
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
begin loop4
train_loop device 256 5 150
train_loop host 256 5 150 --step_device_signals=false
train_loop nospin 256 5 150 --worker_spin_us=0 --fast_socket_spin_us=0
echo "done ($SECONDS s)"
