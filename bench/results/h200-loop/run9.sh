#!/usr/bin/env bash
# Where the host's time in the overlapped step() goes: bench/train_loop.py --step-phases (timers
# around synchronize(), the epoch check, the hyperparameters, the step plan key, the send and
# torch's step of the unstored parameters) in the train suite's loop under CUDA MPS, the
# 4-layer, d_model 384 model, overlap=True and the synchronous step beside torch's SGD; then
# overlap=True again with Python's GIL switch interval at 0.5 ms instead of 5 (the reply
# watcher's wait for the GIL while the main thread runs the forward pass); then a cProfile of
# the overlapped step() over two rounds ($o/profile-fp4q-overlap.txt).
# Repository root, .bundle carried.
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
export LIMIT=${LIMIT:-200}
begin loop13 "opt.step()'s parts in the overlapped loop"
mps_start
loop_args=("--variant=fp4q overlap" "--variant=fp4q" --step-phases)
train_loop mps-phases 256 5 150
loop_args=("--variant=fp4q overlap" --step-phases --switch-interval=0.0005)
train_loop mps-switch 256 5 100
loop_args=("--variant=fp4q overlap" "--profile-step=$o/profile")
train_loop mps-profile 256 2 70
mps_stop
echo "done ($SECONDS s)"
