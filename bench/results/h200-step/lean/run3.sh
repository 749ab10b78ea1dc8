# One device call (repository root, .bundle carried, the module before the lean SGD run as
# .bundle/bin/libfp4q_cuda_old.so): the GPU tests at this commit, the lean tests under memcheck,
# the step through fp4qd from C++ (old and new module, alternated), then from Python
# (bench/trainer_step.py: fp4q.optim beside torch's optimizers) with the new module, then the
# old one if time is left.
set -x
source bench/results/h200-step/overlap/env.sh
nvidia-smi -L > $o/gpu.txt
OUT=$o/gpu-tests timeout 240 bash .bundle/run.sh gpu-tests > $o/gpu-tests.txt 2>&1
echo "rc=$?" >> $o/gpu-tests.txt; grep "gpu-tests\]" $o/gpu-tests.txt | tail -5
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
timeout 60 $cs --tool memcheck $b/bin/fp4q_cuda_test --gtest_filter='*LeanSgd*' \
  > $o/memcheck.txt 2>&1; echo "rc=$?" >> $o/memcheck.txt; tail -3 $o/memcheck.txt
bw=4200
d=/tmp/fq; mkdir -p $d
for m in old new; do
  mod=$b/bin/libfp4q_cuda.so; [[ $m == old ]] && mod=$b/bin/libfp4q_cuda_old.so
  rm -f $d/*.sock
  FP4Q_CUDA_MODULE=$mod $b/bin/fp4qd --listen 127.0.0.1:0 --metrics_listen "" \
    --unix_socket $d/g.sock --fast_socket $d/f.sock --allow_cuda_ipc --backend cuda \
    --log_format text --state_budget_bytes 130000000000 > $d/out 2> $o/fp4qd-$m.log &
  pid=$!; sleep 4
  S="$b/bin/fp4q --server unix://$d/g.sock bench-step --fast-socket $d/f.sock --copy-bandwidth $bw"
  for sc in delayed current; do
    timeout 40 $S --model gpt2-small --scaling $sc --iters 300 --warmup 20 --plan \
      --json $o/cpp-gpt2-$sc-$m.json > $o/cpp-gpt2-$sc-$m.log 2>&1
    timeout 40 $S --model square8192 --scaling $sc --iters 200 --warmup 20 --plan \
      --json $o/cpp-sq8192-$sc-$m.json > $o/cpp-sq8192-$sc-$m.log 2>&1
    timeout 60 $S --model llama3-8b --scaling $sc --iters 10 --warmup 2 \
      --json $o/cpp-llama-$sc-$m.json > $o/cpp-llama-$sc-$m.log 2>&1
  done
  timeout 40 $S --shapes 1152x384,384x384,1536x384,384x1536 --scaling delayed --iters 300 \
    --warmup 20 --plan --json $o/cpp-small-delayed-$m.json > $o/cpp-small-delayed-$m.log 2>&1
  kill $pid; wait $pid
  for f in $o/cpp-*-$m.json; do
    python3 -c "import json;d=json.load(open('$f'));print('$(basename $f)', d['wall_us']['p50'], d['kernel_us']['p50'], d['server_us']['p50'])"
  done
done
for m in new old; do
  mod=$b/bin/libfp4q_cuda.so; [[ $m == old ]] && mod=$b/bin/libfp4q_cuda_old.so
  FP4Q_CUDA_MODULE=$mod timeout 110 python3 bench/trainer_step.py --fp4qd $b/bin/fp4qd \
    --models gpt2-small --json $o/trainer_step-$m.json > $o/trainer-step-$m.log 2>&1
  echo "rc=$?" >> $o/trainer-step-$m.log; grep -E "fp4q SGD|torch foreach SGD|one 8192" $o/trainer-step-$m.log
done
cd $OUT && tar czf r.tgz r && rm -rf r
