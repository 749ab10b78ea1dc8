# One device call (repository root, .bundle carried with the module before the lean SGD run as
# .bundle/bin/libfp4q_cuda_old.so): the step tests with the new module (and two under memcheck),
# then the step through fp4qd from C++ with the old and the new module, alternated twice.
set -x
source bench/results/h200-step/overlap/env.sh
nvidia-smi -L > $o/gpu.txt
timeout 200 $b/bin/fp4q_cuda_test \
  --gtest_filter='*Step*:*LongWarp*:*LeanSgd*:*Batches*:*UpdateWeight*' > $o/step-tests.txt 2>&1
echo "rc=$?" >> $o/step-tests.txt; tail -3 $o/step-tests.txt
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
timeout 150 $cs --tool memcheck $b/bin/fp4q_cuda_test --gtest_filter='*LeanSgd*:*StepRefusals*' \
  > $o/memcheck.txt 2>&1; echo "rc=$?" >> $o/memcheck.txt; tail -4 $o/memcheck.txt
bw=4200
d=/tmp/fq; mkdir -p $d
for round in 1 2; do
  for m in old new; do
    mod=$b/bin/libfp4q_cuda.so; [[ $m == old ]] && mod=$b/bin/libfp4q_cuda_old.so
    rm -f $d/*.sock
    FP4Q_CUDA_MODULE=$mod $b/bin/fp4qd --listen 127.0.0.1:0 --metrics_listen "" \
      --unix_socket $d/g.sock --fast_socket $d/f.sock --allow_cuda_ipc --backend cuda \
      --log_format text --state_budget_bytes 130000000000 > $d/out 2> $o/fp4qd-$m-$round.log &
    pid=$!; sleep 4
    S="$b/bin/fp4q --server unix://$d/g.sock bench-step --fast-socket $d/f.sock --copy-bandwidth $bw"
    for sc in delayed current; do
      timeout 40 $S --model gpt2-small --scaling $sc --iters 300 --warmup 20 --plan \
        --json $o/cpp-gpt2-$sc-$m-$round.json > $o/cpp-gpt2-$sc-$m-$round.log 2>&1
    done
    timeout 40 $S --model square8192 --scaling delayed --iters 200 --warmup 20 --plan \
      --json $o/cpp-sq8192-delayed-$m-$round.json > $o/cpp-sq8192-delayed-$m-$round.log 2>&1
    timeout 60 $S --model llama3-8b --scaling delayed --iters 10 --warmup 2 \
      --json $o/cpp-llama-delayed-$m-$round.json > $o/cpp-llama-delayed-$m-$round.log 2>&1
    kill $pid; wait $pid
    for f in $o/cpp-*-$m-$round.json; do
      python3 -c "import json,sys;d=json.load(open('$f'));print('$(basename $f)', d['wall_us']['p50'], d['kernel_us']['p50'], d['server_us']['p50'])"
    done
  done
done
cd $OUT && tar czf r.tgz r && rm -rf r
