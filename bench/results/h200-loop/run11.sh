#!/usr/bin/env bash
# The ready word written by the driver (cuStreamWriteValue32) instead of a one-element fill_,
# and the overlapped step letting its gradients go once sent: under CUDA MPS, the train suite's
# 4-layer, d_model 384 model.
# 1. tests/python/gpu_ipc_check.py (its overlap check counts the driver's ready-word writes and
#    compares every step bit for bit with the host-waited step);
# 2. tests/python/test_torch_side.py on this torch (CPU with foreach=True, CUDA with foreach None);
# 3. plan_misses.py's counters on the step plan's checks, the overlapped loop, 60 iterations;
# 4. bench/train_loop.py --step-phases, overlap=True and the synchronous step beside torch's SGD;
#    then one round of overlap=True with opt.step() under cProfile (--profile-step).
# Repository root, .bundle carried.
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
export LIMIT=${LIMIT:-270}
begin loop15 "the ready word by cuStreamWriteValue32; the sent step's gradients let go"
ipc_check 90
torch_side_tests
mps_start
timeout 60 python3 bench/results/h200-loop/plan_misses.py --fp4qd $b/bin/fp4qd \
  > $o/plan-misses-overlap.txt 2>&1
echo "== plan misses rc=$?"; tail -12 $o/plan-misses-overlap.txt
loop_args=("--variant=fp4q overlap" "--variant=fp4q" --step-phases)
train_loop mps-phases 256 3 80
loop_args=("--variant=fp4q overlap" --profile-step $o/profile-overlap)
train_loop mps-profile 256 1 40
mps_stop
echo "done ($SECONDS s)"
