# One device call (repository root, .bundle carried): the L2 prefetch distance with the lean
# SGD kernel. fp4q_bench's SGD rows at the default (2 slots) and at 0, 1 and 4, twice; then
# GPT-2 / Llama delayed from C++ through an fp4qd started with --cuda_step_prefetch 0 and 2,
# alternated.
set -x
source bench/results/h200-step/overlap/env.sh
nvidia-smi -L > $o/gpu.txt
for r in 1 2; do
  timeout 100 $b/bin/fp4q_bench --only "step check + apply, SGD + EF, delayed" \
    --step-prefetch-sweep 0,1,4 --iters 30 --out $o/bench-$r.json > $o/bench-$r.log 2>&1
  grep "SGD" $o/bench-$r.log | head -8
done
d=/tmp/fq; mkdir -p $d
for r in 1 2; do
  for pf in 0 2; do
    rm -f $d/*.sock
    $b/bin/fp4qd --listen 127.0.0.1:0 --metrics_listen "" --unix_socket $d/g.sock \
      --fast_socket $d/f.sock --allow_cuda_ipc --backend cuda --log_format text \
      --cuda_step_prefetch $pf --state_budget_bytes 130000000000 > $d/out 2> $o/fp4qd-$pf-$r.log &
    pid=$!; sleep 4
    S="$b/bin/fp4q --server unix://$d/g.sock bench-step --fast-socket $d/f.sock --copy-bandwidth 4200"
    timeout 40 $S --model gpt2-small --scaling delayed --iters 300 --warmup 20 --plan \
      --json $o/cpp-gpt2-delayed-pf$pf-$r.json > $o/cpp-gpt2-delayed-pf$pf-$r.log 2>&1
    timeout 60 $S --model llama3-8b --scaling delayed --iters 10 --warmup 2 \
      --json $o/cpp-llama-delayed-pf$pf-$r.json > $o/cpp-llama-delayed-pf$pf-$r.log 2>&1
    kill $pid; wait $pid
    for f in $o/cpp-*-pf$pf-$r.json; do
      python3 -c "import json;d=json.load(open('$f'));print('$(basename $f)', d['wall_us']['p50'], d['kernel_us']['p50'])"
    done
  done
done
cd $OUT && tar czf r.tgz r && rm -rf r
