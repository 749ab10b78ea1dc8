#!/usr/bin/env bash
# The current stream asked about by one driver call (fp4q._streams: cuStreamQuery,
# cuStreamSynchronize on torch's raw handle) instead of torch.cuda.current_stream()'s Stream,
# and the synchronous step of a server-held plan by Requests.step_named:
# 1. tests/python/gpu_ipc_check.py (its overlap check now also compares fp4q._streams' answers
#    with torch's on a busy and an idle stream, and counts any fallback to torch's Stream);
# 2. on an H200 only: run12.sh's loops (under CUDA MPS, the overlapped step beside torch's SGD,
#    9 rounds of the 4-layer model, 5 of the 6-layer one);
# 3. one 8192 x 8192 weight stepped alone from Python (trainloop.py MODES=single, delayed
#    scaling, one pass, phase timers on), this client against the one before fp4q._streams and
#    Requests.step_named (alt-client/: `git archive 9974074 client/python`, carried untracked),
#    alternating.
# Repository root, .bundle and alt-client/ carried.
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
export LIMIT=${LIMIT:-540}
begin loop19 "fp4q._streams; alt-client: $(cat alt-client/COMMIT 2>/dev/null)"
ipc_check 90
grep -o '"stream_[a-z_]*": [^,}]*\(\], \[[^]]*\]\]\)\?' $o/gpu_ipc_check.txt
if grep -q H200 $o/gpu.txt; then
  torch_side_tests
  overlap_loops
fi
for r in 1 2; do
  client_phases single-new-$r 40 MODES=single SCALING=delayed ONE_PASS=1 N=400
  client_phases single-old-$r 40 MODES=single SCALING=delayed ONE_PASS=1 N=400 \
    CLIENT=$PWD/alt-client
done
echo "done ($SECONDS s)"
