#!/usr/bin/env bash
# Where the host's time in the overlapped step() goes, and fp4q.optim.SGD's step of the
# parameters it keeps in torch by torch's multi-tensor calls (fp4q._torch_side) against torch's
# step(). In the train suite's loop under CUDA MPS, the 4-layer, d_model 384 model:
# 1. tests/python/test_torch_side.py on this torch, CPU and CUDA tensors (bit for bit against
#    torch.optim.SGD);
# 2. bench/train_loop.py --step-phases (timers around synchronize(), the epoch check, the
#    hyperparameters, the step plan key, the send and the torch side's step): overlap=True and
#    the synchronous step beside torch's SGD;
# 3. the same, overlap=True, with the torch side stepped by torch's step();
# 4. overlap=True with Python's GIL switch interval at 0.5 ms instead of 5;
# 5. a cProfile of the overlapped step() over two rounds ($o/profile-fp4q-overlap.txt).
# Repository root, .bundle carried.
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
export LIMIT=${LIMIT:-300}
begin loop13 "opt.step()'s parts in the overlapped loop; the torch side's multi-tensor step"
(cd tests/python && PYTHONPATH=../../client/python:. timeout 60 python3 -m unittest -v \
  test_torch_side) > $o/test-torch-side.txt 2>&1
echo "test_torch_side rc=$?"; tail -3 $o/test-torch-side.txt
mps_start
loop_args=("--variant=fp4q overlap" "--variant=fp4q" --step-phases)
train_loop mps-phases 256 5 120
loop_args=("--variant=fp4q overlap" --step-phases --torch-side=torch-step)
train_loop mps-torch-step 256 4 80
loop_args=("--variant=fp4q overlap" --step-phases --switch-interval=0.0005)
train_loop mps-switch 256 4 80
loop_args=("--variant=fp4q overlap" "--profile-step=$o/profile")
train_loop mps-profile 256 2 60
mps_stop
echo "done ($SECONDS s)"
