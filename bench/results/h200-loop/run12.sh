#!/usr/bin/env bash
# The overlapped loop over more rounds (call 14's three rounds of the 4-layer model varied from
# -2.4% to 9.2% round by round): under CUDA MPS, torch's SGD and fp4q.optim.SGD(overlap=True)
# interleaved, 9 rounds of the train suite's 4-layer, d_model 384 model, then 5 of the 6-layer,
# d_model 512 one; no phase timers. First tests/python/gpu_ipc_check.py (the driver calls on
# torch's raw current stream handle) and tests/python/test_torch_side.py on this torch (its
# load_state_dict test fixed to give each optimizer its own copy of the state).
# Repository root, .bundle carried.
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
export LIMIT=${LIMIT:-250}
begin loop16 "the overlapped loop, 9 + 5 rounds"
ipc_check 90
torch_side_tests
overlap_loops
echo "done ($SECONDS s)"
