#!/usr/bin/env bash
# run2.sh's loops under CUDA MPS (fp4qd and the worker share one GPU context: no time-slicing
# between the two processes), batch 256 x 128 then 64 x 128, on one machine.
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
begin loop3 "CUDA MPS"
mps_start
train_loop b256-mps 256 5 200
train_loop b64-mps 64 5 160
mps_stop
echo "done ($SECONDS s)"
