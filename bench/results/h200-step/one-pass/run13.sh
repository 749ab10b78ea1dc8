#!/usr/bin/env bash
# Device call 13 (repository root, .bundle carried): where the train suite's synchronous stored
# step (16 matrices, 7.1M parameters) spends 1.2-1.5 ms when the same matrices take 0.2 ms from
# C++ stepped back to back. Each only if it fits (room, LIMIT):
#   1. python-client/trainloop.py's phases of that model's step, MODES fixed (steps back to
#      back), sleep (the host idle 10 ms before each), busy (the GPU busy 10 ms, then
#      synchronized), none (a real forward and backward, zero_grad(set_to_none=True)), 300
#      steps each, fp4qd as it starts by default
#   2. the same with fp4qd's threads busy-polling through the 10 ms (--worker_spin_us=20000
#      --fast_socket_spin_us=20000)
#   3. train/run.py's text task, two stored variants, against an fp4qd started that way
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
begin r13
spin="--worker_spin_us=20000 --fast_socket_spin_us=20000"
for n in default spin; do
  a=""; [[ $n == spin ]] && a=$spin
  room 90 "trainloop $n" || continue
  B=$b FP4QD_ARGS="$a" MODES=fixed,sleep,busy,none GAP_MS=10 N=300 timeout 90 \
    python3 bench/results/h200-step/python-client/trainloop.py > $o/trainloop-$n.txt 2>&1
  echo "trainloop $n rc=$?"; grep -E "mode=|pre-send" $o/trainloop-$n.txt
done
d=/tmp/fq13; mkdir -p $d; rm -f $d/*.sock
$b/bin/fp4qd --listen 127.0.0.1:0 --metrics_listen "" --unix_socket $d/g.sock \
  --fast_socket $d/f.sock --allow_cuda_ipc --backend cuda --log_format text $spin \
  > $d/out 2>> $o/fp4qd.log &
pid=$!; for i in $(seq 400); do [[ -S $d/f.sock ]] && break; sleep 0.05; done
room 90 "train spin" && timeout 90 python3 train/run.py --preset gpu --server unix://$d/g.sock \
  --fast-socket $d/f.sock --tasks text --variants rtn-ef-sgd,rtn-ef-adamw --steps 300 \
  --eval-every 150 --out $o/train-spin > $o/train-spin.txt 2>&1
echo "train spin rc=$?"
python3 -c "
import json; d = json.load(open('$o/train-spin/summary.json'))
for t, vs in d['results'].items():
    for v, r in vs.items():
        print(t, v, 'server_ms %.3f share %.3f worker_ms %.2f' % (r['server_ms'], r['server_share'], r['worker_ms']))"
kill $pid 2>/dev/null; wait $pid 2>/dev/null
