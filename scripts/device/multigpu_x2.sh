#!/usr/bin/env bash
# Runs ON a machine with 2+ GPUs (nvidia-h200-x2), from the repository root, with a bundle made
# by scripts/device/multigpu-bundle.sh:
#   1. fp4q_multigpu_test on every GPU (tests/server/multigpu_test.cc): ServerInfo, Quantize /
#      QDQ / Matmul by CUDA IPC on each GPU vs the CPU backend, a weight placed on GPU 1,
#      cross-GPU requests refused naming the fields, both GPUs under load at once (/metrics).
#      Must pass with no test skipped.
#   2. the same binary with CUDA_VISIBLE_DEVICES=0: every test must SKIP, saying why.
#   3. fp4q_ipc_gpu_test (the single-GPU IPC test) with both GPUs visible.
#   4. tests/python/multigpu_check.py: the Python client with tensors on cuda:0 and cuda:1
#      (needs the generated client/python/fp4q/_proto carried along).
# $OUT gets summary.txt and results.tgz (logs, gtest XML). Exit 0 only when all four hold.
#   bash multigpu_x2.sh BUNDLE_DIR
set -uo pipefail
b=$(cd "${1:?usage: multigpu_x2.sh BUNDLE_DIR}" && pwd)
out=${OUT:-$PWD/multigpu-out}
work=/tmp/fp4q-multigpu
rm -rf "$work" && mkdir -p "$work" "$out"
chmod +x "$b"/bin/* 2>/dev/null
export LD_LIBRARY_PATH="$b/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export FP4QD_BINARY="$b/bin/fp4qd" FP4Q_CUDA_MODULE="$b/bin/libfp4q_cuda.so"
summary="$work/summary.txt"
note() { echo "$*" | tee -a "$summary"; }
verdict=0
gtest_line() { grep -E '^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ test' "$1" | tr '\n' ' '; }

note "commit: $(tr '\n' ' ' < "$b/COMMIT")"
nvidia-smi -L 2>&1 | tee -a "$summary"
nvidia-smi topo -m > "$work/topo.txt" 2>&1

# 1. Both GPUs.
timeout 240 "$b/bin/fp4q_multigpu_test" --gtest_output="xml:$work/multigpu_test.xml" \
  > "$work/multigpu_test.log" 2>&1
rc=$?
skipped=$(grep -c '^\[  SKIPPED \]' "$work/multigpu_test.log")
note "multigpu_test (all GPUs): exit $rc, skipped lines $skipped:" \
  "$(gtest_line "$work/multigpu_test.log")"
grep '^\[ multigpu \]' "$work/multigpu_test.log" | tee -a "$summary"
if ((rc != 0 || skipped != 0)); then verdict=1; fi

# 2. One GPU visible: a skip with the reason, never a pass.
CUDA_VISIBLE_DEVICES=0 timeout 60 "$b/bin/fp4q_multigpu_test" > "$work/multigpu_test_1gpu.log" 2>&1
rc=$?
reason=$(grep -m1 'needs at least 2' "$work/multigpu_test_1gpu.log")
note "multigpu_test (CUDA_VISIBLE_DEVICES=0): exit $rc, reason: ${reason:-NONE}"
one=$work/multigpu_test_1gpu.log
if ((rc != 0)) || [[ -z "$reason" ]] || ! grep -q '^\[  SKIPPED \]' "$one" ||
   grep -q '^\[       OK \]' "$one"; then
  verdict=1
fi

# 3. The single-GPU IPC test with two GPUs visible.
timeout 120 "$b/bin/fp4q_ipc_gpu_test" > "$work/ipc_gpu_test.log" 2>&1
rc=$?
note "ipc_gpu_test (all GPUs): exit $rc: $(gtest_line "$work/ipc_gpu_test.log")"
if ((rc != 0)); then verdict=1; fi

# 4. The Python client, a tensor on each GPU.
PYTHONPATH=client/python:tests/python timeout 120 python3 tests/python/multigpu_check.py \
  --fp4qd "$b/bin/fp4qd" > "$work/multigpu_check_py.log" 2>&1
rc=$?
note "multigpu_check.py: exit $rc: $(tail -n 1 "$work/multigpu_check_py.log")"
if ((rc != 0)); then verdict=1; fi

note "VERDICT: $([[ $verdict == 0 ]] && echo PASS || echo FAIL)"
tar czf "$out/results.tgz" -C /tmp fp4q-multigpu
cp "$summary" "$out/summary.txt"
exit "$verdict"
