#!/usr/bin/env bash
# fp4q.optim's kept step plan keys (the last 4, 318a10a) against the last key alone, in the
# train suite's loop with zero_grad(set_to_none=True) (trainloop.py MODES=none: the phases of
# the synchronous step, step_key among them), the two clients alternating, two rounds each.
# Before the call, here (the client before the change, carried as an untracked folder):
#   mkdir -p bench/results/h200-loop/keys-old-client
#   git archive 8064c96 client/python/fp4q | tar -x --strip-components=2 \
#     -C bench/results/h200-loop/keys-old-client
# and remove the folder after the call. Repository root, .bundle carried.
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
export LIMIT=${LIMIT:-170}
begin keys8 "step plan keys: the working tree's client (4 kept keys) against keys-old-client (1)"
old=$PWD/bench/results/h200-loop/keys-old-client
for r in 1 2; do
  client_phases new-$r 38 MODES=none N=400
  client_phases old-$r 38 CLIENT=$old MODES=none N=400
done
echo "done ($SECONDS s)"
