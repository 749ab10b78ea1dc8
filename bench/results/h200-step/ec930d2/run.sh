set -x
source bench/results/h200-step/overlap/env.sh
nvidia-smi -L > $o/gpu.txt
OUT=$o/gpu-tests timeout 260 bash .bundle/run.sh gpu-tests > $o/gpu-tests.txt 2>&1; echo "rc=$?" >> $o/gpu-tests.txt
tail -5 $o/gpu-tests.txt
timeout 120 $b/bin/fp4q_bench --only step --out $o/bench_step.json > $o/bench_step.log 2>&1
bw=$(python3 -c "import json;print(json.load(open('$o/bench_step.json'))['copy_gbps'])")
d=/tmp/fq; mkdir -p $d
$b/bin/fp4qd --listen 127.0.0.1:0 --metrics_listen "" --unix_socket $d/g.sock --fast_socket $d/f.sock --allow_cuda_ipc --backend cuda --log_format text --state_budget_bytes 130000000000 > $d/out 2> $o/fp4qd.log &
pid=$!; sleep 4
S="$b/bin/fp4q --server unix://$d/g.sock bench-step --fast-socket $d/f.sock --copy-bandwidth $bw"
for sc in delayed current; do
  timeout 60 $S --model gpt2-small --scaling $sc --iters 300 --warmup 20 --json $o/cpp-gpt2-$sc.json > $o/cpp-gpt2-$sc.log 2>&1
  timeout 60 $S --model square8192 --scaling $sc --iters 200 --warmup 20 --json $o/cpp-sq8192-$sc.json > $o/cpp-sq8192-$sc.log 2>&1
done
timeout 150 $S --model llama3-8b --scaling delayed --iters 10 --warmup 2 --json $o/cpp-llama-delayed.json > $o/cpp-llama-delayed.log 2>&1
kill $pid; wait $pid
timeout 200 python3 bench/trainer_step.py --fp4qd $b/bin/fp4qd --models gpt2-small --json $o/trainer_step.json > $o/trainer-step.log 2>&1; echo "rc=$?" >> $o/trainer-step.log
cd $OUT && tar czf r.tgz r && rm -rf r
