# One device call (from the repository root, .bundle carried): the GPU tests, then the trainer's
# step with and without server-side step plans, from C++ and from Python, alternated in one run.
set -x
source bench/results/h200-step/overlap/env.sh
export B=$b
nvidia-smi -L > $o/gpu.txt
OUT=$o/gpu-tests timeout 240 bash .bundle/run.sh gpu-tests > $o/gpu-tests.txt 2>&1
echo "rc=$?" >> $o/gpu-tests.txt
timeout 120 $b/bin/fp4q_bench --only step --out $o/bench_step.json > $o/bench_step.log 2>&1
bw=$(python3 -c "import json;print(json.load(open('$o/bench_step.json'))['copy_gbps'])" || echo 4200)
d=/tmp/fq; mkdir -p $d
$b/bin/fp4qd --listen 127.0.0.1:0 --metrics_listen "" --unix_socket $d/g.sock \
  --fast_socket $d/f.sock --allow_cuda_ipc --backend cuda --log_format text \
  --state_budget_bytes 130000000000 > $d/out 2> $o/fp4qd.log &
pid=$!; sleep 4
S="$b/bin/fp4q --server unix://$d/g.sock bench-step --fast-socket $d/f.sock --copy-bandwidth $bw"
# Items every step, then the plan, alternating twice (the same fp4qd).
for round in 1 2; do
  for p in items plan; do
    flag=""; [[ $p == plan ]] && flag="--plan"
    for sc in delayed current; do
      timeout 40 $S --model gpt2-small --scaling $sc --iters 300 --warmup 20 $flag \
        --json $o/cpp-gpt2-$sc-$p-$round.json > $o/cpp-gpt2-$sc-$p-$round.log 2>&1
    done
    timeout 40 $S --model square8192 --scaling delayed --iters 200 --warmup 20 $flag \
      --json $o/cpp-sq8192-delayed-$p-$round.json > $o/cpp-sq8192-delayed-$p-$round.log 2>&1
    timeout 40 $S --shapes 1152x384,384x384,1536x384,384x1536 --scaling delayed --iters 300 \
      --warmup 20 $flag --json $o/cpp-small-$p-$round.json > $o/cpp-small-$p-$round.log 2>&1
  done
done
kill $pid; wait $pid
# Python: the GPT-2 step's phases and the train suite's model in its loop, with the server's
# plans and without (fp4qd --max_step_plans=0), alternating.
for round in 1 2; do
  MODES=gpt2,none N=400 timeout 70 python3 bench/results/h200-step/python-client/trainloop.py \
    > $o/phases-plan-$round.txt 2>&1; echo "rc=$?" >> $o/phases-plan-$round.txt
  FP4QD_ARGS=--max_step_plans=0 MODES=gpt2,none N=400 timeout 70 \
    python3 bench/results/h200-step/python-client/trainloop.py \
    > $o/phases-items-$round.txt 2>&1; echo "rc=$?" >> $o/phases-items-$round.txt
done
timeout 160 python3 bench/trainer_step.py --fp4qd $b/bin/fp4qd --models gpt2-small \
  --json $o/trainer_step.json > $o/trainer-step.log 2>&1; echo "rc=$?" >> $o/trainer-step.log
cd $OUT && tar czf r.tgz r && rm -rf r
