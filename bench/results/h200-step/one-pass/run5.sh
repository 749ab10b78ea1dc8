#!/usr/bin/env bash
# Device call 5 of one-pass steps (repository root, .bundle carried with the module of 46cdb17
# gzipped in .bundle/alt/). Each phase only if it fits (room, LIMIT):
#   1. fp4q_bench's delayed SGD + EF step rows (apply alone, check + apply, one pass; GPT-2 and
#      8192 x 8192), the module under test, then the one of 46cdb17, each with its own copy row
#      (call 4 gave them 60 s each, too little: building GPT-2's weights on the host is slow)
#   2. through fp4qd from C++ (fp4q bench-step --plan, delayed): Llama-3-8B's 32 layers, then
#      GPT-2 and 8192 x 8192, two passes then one (run1b.sh's step_pair)
set -uo pipefail
source bench/results/h200-step/overlap/env.sh
archive_on_exit r5
[[ -f $b/alt/libfp4q_cuda.so.gz ]] && gunzip -f $b/alt/libfp4q_cuda.so.gz
nvidia-smi --query-gpu=name,driver_version,uuid --format=csv,noheader | tee $o/gpu.txt
echo "commit $FP4Q_COMMIT; alt module $(cat $b/alt/COMMIT 2>/dev/null)" | tee -a $o/gpu.txt
for m in new old; do
  mod=$b/bin/libfp4q_cuda.so; [[ $m == old ]] && mod=$b/alt/libfp4q_cuda.so
  room 130 "bench $m" || continue
  FP4Q_CUDA_MODULE=$mod timeout 130 stdbuf -oL $b/bin/fp4q_bench --only "SGD + EF, delayed" \
    --out $o/bench-$m-1.json > $o/bench-$m-1.txt 2>&1
  echo "bench $m rc=$? ($SECONDS s)"; grep -E "^copy|^step" $o/bench-$m-1.txt
done
bw=$(python3 -c "import json;print(json.load(open('$o/bench-new-1.json'))['copy_gbps'])" || echo 4200)
d=/tmp/fq; mkdir -p $d; rm -f $d/*.sock
$b/bin/fp4qd --listen 127.0.0.1:0 --metrics_listen "" --unix_socket $d/g.sock \
  --fast_socket $d/f.sock --allow_cuda_ipc --backend cuda --log_format text \
  --state_budget_bytes 110000000000 > $d/out 2> $o/fp4qd.log &
pid=$!; for i in $(seq 400); do [[ -S $d/f.sock ]] && break; sleep 0.05; done
S="$b/bin/fp4q --server unix://$d/g.sock bench-step --fast-socket $d/f.sock --plan \
  --scaling delayed --copy-bandwidth $bw"
step_pair() {  # step_pair MODEL ROUND ARGS...: two passes, then one
  local m=$1 r=$2; shift 2
  for p in two one; do
    flag=""; [[ $p == one ]] && flag="--one-pass"
    room 70 "$m $p round $r" || return 0
    timeout 100 $S "$@" $flag --json $o/cpp-$m-$p-$r.json > $o/cpp-$m-$p-$r.log 2>&1
    echo "$m $p $r rc=$? $(python3 -c "import json;d=json.load(open('$o/cpp-$m-$p-$r.json'));print('wall p50 %.1f us, kernel p50 %.1f us, %% of copy (wall, kernel) %s' % (d['wall_us']['p50'], d['kernel_us']['p50'], d.get('pct_of_copy_bandwidth')))" 2>&1 | tail -1)"
  done
}
step_pair llama 1 --model llama3-8b --iters 20 --warmup 3
step_pair gpt2 1 --model gpt2-small --iters 300
step_pair sq8192 1 --model square8192 --iters 300
kill $pid; wait $pid
