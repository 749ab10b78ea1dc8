#!/usr/bin/env bash
# Device call 1b of one-pass steps (after run1a.sh; repository root, .bundle carried): steps 4
# and 5 of run1a.sh's list, through fp4qd from C++ and Python. The copy bandwidth is measured
# again here (fp4q_bench's copy row). One round of each model first, then Python's checks, then
# the second rounds, each phase only if it fits in the call (room, overlap/env.sh).
set -uo pipefail
source bench/results/h200-step/overlap/env.sh
archive_on_exit r1b
nvidia-smi --query-gpu=name,driver_version,uuid --format=csv,noheader | tee $o/gpu.txt
echo "commit $FP4Q_COMMIT" | tee -a $o/gpu.txt
timeout 60 $b/bin/fp4q_bench --only copy --iters 20 --out $o/copy.json > $o/copy.txt 2>&1
echo "copy rc=$?"; grep -i copy $o/copy.txt | head -2
bw=$(python3 -c "import json;print(json.load(open('$o/copy.json'))['copy_gbps'])" || echo 4200)
d=/tmp/fq; mkdir -p $d; rm -f $d/*.sock
$b/bin/fp4qd --listen 127.0.0.1:0 --metrics_listen "" --unix_socket $d/g.sock \
  --fast_socket $d/f.sock --allow_cuda_ipc --backend cuda --log_format text \
  --state_budget_bytes 110000000000 > $d/out 2> $o/fp4qd.log &
pid=$!; for i in $(seq 400); do [[ -S $d/f.sock ]] && break; sleep 0.05; done
grep -o "step_signals[^ ]*" $o/fp4qd.log | head -1
S="$b/bin/fp4q --server unix://$d/g.sock bench-step --fast-socket $d/f.sock --plan \
  --scaling delayed --copy-bandwidth $bw"
step_pair() {  # step_pair MODEL ROUND ARGS...: two passes, then one
  local m=$1 r=$2; shift 2
  for p in two one; do
    flag=""; [[ $p == one ]] && flag="--one-pass"
    room 80 "$m $p round $r" || return 0
    timeout 120 $S "$@" $flag --json $o/cpp-$m-$p-$r.json > $o/cpp-$m-$p-$r.log 2>&1
    echo "$m $p $r rc=$? $(python3 -c "import json;d=json.load(open('$o/cpp-$m-$p-$r.json'));print('wall p50 %.1f us, kernel p50 %.1f us, %% of copy (wall, kernel) %s' % (d['wall_us']['p50'], d['kernel_us']['p50'], d.get('pct_of_copy_bandwidth')))" 2>&1)"
  done
}
step_pair gpt2 1 --model gpt2-small --iters 300
step_pair sq8192 1 --model square8192 --iters 300
step_pair llama 1 --model llama3-8b --iters 20 --warmup 3  # its setup (7e9 parameters) is long
kill $pid; wait $pid
room 150 gpu_ipc_check && timeout 150 python3 tests/python/gpu_ipc_check.py --fp4qd $b/bin/fp4qd --out $o/ipc --steps 100 \
  > $o/gpu_ipc_check.txt 2>&1
echo "gpu_ipc_check rc=$?"; tail -1 $o/gpu_ipc_check.txt
grep -A3 '"optim_one_pass' $o/ipc/gpu_ipc_check.json | head -4
room 150 trainer_step && timeout 150 python3 bench/trainer_step.py --fp4qd $b/bin/fp4qd --models gpt2-small \
  --behind-ms 0 --steps 100 --warmup 10 --json $o/trainer-step-gpt2.json \
  > $o/trainer-step-gpt2.txt 2>&1
echo "trainer_step rc=$?"; grep -E "delayed|foreach SGD|floor" $o/trainer-step-gpt2.txt | head -12
if room 100 "second rounds"; then
  rm -f $d/*.sock
  $b/bin/fp4qd --listen 127.0.0.1:0 --metrics_listen "" --unix_socket $d/g.sock \
    --fast_socket $d/f.sock --allow_cuda_ipc --backend cuda --log_format text \
    --state_budget_bytes 110000000000 > $d/out 2>> $o/fp4qd.log &
  pid=$!; for i in $(seq 400); do [[ -S $d/f.sock ]] && break; sleep 0.05; done
  step_pair gpt2 2 --model gpt2-small --iters 300
  step_pair sq8192 2 --model square8192 --iters 300
  kill $pid; wait $pid
fi
