# One device call (from the repository root, .bundle carried): the step tests on the GPU, then
# the trainer's step with and without server-side step plans, from C++ and from Python.
set -x
source bench/results/h200-step/overlap/env.sh
export B=$b
nvidia-smi -L > $o/gpu.txt
# The step kernels and the IPC paths on the GPU, the client's plan path included.
timeout 150 $b/bin/fp4q_cuda_test --gtest_filter='*Step*' > $o/cuda-step-tests.txt 2>&1
echo "rc=$?" >> $o/cuda-step-tests.txt
timeout 60 $b/bin/fp4q_ipc_gpu_test > $o/ipc-gpu-test.txt 2>&1; echo "rc=$?" >> $o/ipc-gpu-test.txt
timeout 100 python3 tests/python/gpu_ipc_check.py --fp4qd $b/bin/fp4qd --steps 100 \
  --out $o/gpu_ipc_check > $o/gpu_ipc_check.log 2>&1; echo "rc=$?" >> $o/gpu_ipc_check.log
timeout 60 $b/bin/fp4q_bench --only step --out $o/bench_step.json > $o/bench_step.log 2>&1
bw=$(python3 -c "import json;print(json.load(open('$o/bench_step.json'))['copy_gbps'])")
d=/tmp/fq; mkdir -p $d
$b/bin/fp4qd --listen 127.0.0.1:0 --metrics_listen "" --unix_socket $d/g.sock \
  --fast_socket $d/f.sock --allow_cuda_ipc --backend cuda --log_format text \
  --state_budget_bytes 130000000000 > $d/out 2> $o/fp4qd.log &
pid=$!; sleep 4
S="$b/bin/fp4q --server unix://$d/g.sock bench-step --fast-socket $d/f.sock --copy-bandwidth $bw"
# Items every step, then the plan, alternating twice (same process, same weights' shapes).
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
# Python: the GPT-2 step's phases, and the train suite's model in its loop (fp4q.optim uses the
# server's plans where fp4qd offers them).
# Python with the plans and without (fp4qd --max_step_plans=0), alternating.
for round in 1 2; do
  MODES=gpt2,none N=400 timeout 80 python3 bench/results/h200-step/python-client/trainloop.py \
    > $o/phases-plan-$round.txt 2>&1; echo "rc=$?" >> $o/phases-plan-$round.txt
  FP4QD_ARGS=--max_step_plans=0 MODES=gpt2,none N=400 timeout 80 \
    python3 bench/results/h200-step/python-client/trainloop.py \
    > $o/phases-items-$round.txt 2>&1; echo "rc=$?" >> $o/phases-items-$round.txt
done
timeout 200 python3 bench/trainer_step.py --fp4qd $b/bin/fp4qd --models gpt2-small \
  --json $o/trainer_step.json > $o/trainer-step.log 2>&1; echo "rc=$?" >> $o/trainer-step.log
cd $OUT && tar czf r.tgz r && rm -rf r
