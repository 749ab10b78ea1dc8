#!/usr/bin/env bash
# The train suite's model in a real training loop (bench/train_loop.py: torch's SGD beside
# fp4q.optim.SGD synchronous and overlap=True, each with and without the host's wait for the
# backward pass), at batch 64 x 128 (bound by the host) and 256 x 128 (bound by the GPU), on
# one machine, no MPS (repository root, the whole .bundle carried, no alt modules).
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
begin loop2
train_loop b256 256 5 200
train_loop b64 64 5 160
echo "done ($SECONDS s)"
