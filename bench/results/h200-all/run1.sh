#!/usr/bin/env bash
# Every headline figure in one device call (repository root, the whole .bundle carried, no alt
# modules): meant for an H200, whose figures the issues' targets are; on another GPU it records
# what it got (gpu.txt).
#   1. fp4q_bench, every row (kernels beside the copy ceiling and cuBLAS bf16, same process)
#   2. through fp4qd (CUDA backend, fast socket, kept plans, delayed scaling) from C++:
#      fp4q bench-step over GPT-2 small, 8192 x 8192 and Llama-3-8B-shaped layers, two passes
#      and one
#   3. from Python: bench/trainer_step.py over GPT-2 small (fp4q.optim beside torch's SGD and
#      AdamW and the in-process torch NVFP4 update, same process)
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
begin all1
headline_steps
kill $pid; wait $pid 2>/dev/null
trainer default
echo "done ($SECONDS s)"
