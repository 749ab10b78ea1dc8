#!/usr/bin/env bash
# The overlapped step holding its gradients no longer once sent (with ready signals), so that
# zero_grad(set_to_none=True) frees them and the next backward pass reuses their memory (and the
# kept step plans match): under CUDA MPS, the train suite's 4-layer, d_model 384 model.
# 1. tests/python/test_torch_side.py on this torch (CPU with foreach=True, CUDA with foreach None);
# 2. plan_misses.py's counters on the step plan's checks, the overlapped loop, 60 iterations;
# 3. bench/train_loop.py --step-phases, overlap=True and the synchronous step beside torch's SGD.
# Repository root, .bundle carried.
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
export LIMIT=${LIMIT:-170}
begin loop14 "the overlapped step lets its gradients go once sent"
(cd tests/python && PYTHONPATH=../../client/python:. timeout 60 python3 -m unittest -v \
  test_torch_side) > $o/test-torch-side.txt 2>&1
echo "test_torch_side rc=$?"; tail -3 $o/test-torch-side.txt
mps_start
timeout 60 python3 bench/results/h200-loop/plan_misses.py --fp4qd $b/bin/fp4qd \
  > $o/plan-misses-overlap.txt 2>&1
echo "== plan misses rc=$?"; tail -12 $o/plan-misses-overlap.txt
loop_args=("--variant=fp4q overlap" "--variant=fp4q" --step-phases)
train_loop mps-phases 256 3 80
mps_stop
echo "done ($SECONDS s)"
