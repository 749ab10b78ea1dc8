# One device call (from the repository root, .bundle carried, with the module of the commit
# before the lean SGD run as .bundle/bin/libfp4q_cuda_old.so): the step tests with the new
# module, then the step kernels and the step through fp4qd with the old and the new module,
# alternated in the same run.
set -x
source bench/results/h200-step/overlap/env.sh
nvidia-smi -L > $o/gpu.txt
timeout 200 $b/bin/fp4q_cuda_test --gtest_filter='*Step*:*LongWarp*:*LeanSgd*:*Batches*:*UpdateWeight*' \
  > $o/step-tests.txt 2>&1; echo "rc=$?" >> $o/step-tests.txt
tail -5 $o/step-tests.txt
for round in 1 2; do
  for m in old new; do
    mod=$b/bin/libfp4q_cuda.so; [[ $m == old ]] && mod=$b/bin/libfp4q_cuda_old.so
    FP4Q_CUDA_MODULE=$mod timeout 100 $b/bin/fp4q_bench --only "step " --out $o/bench-$m-$round.json \
      > $o/bench-$m-$round.log 2>&1
    grep "SGD" $o/bench-$m-$round.log | head -6
  done
done
bw=$(python3 -c "import json;print(json.load(open('$o/bench-new-1.json'))['copy_gbps'])" || echo 4200)
d=/tmp/fq; mkdir -p $d
for m in old new; do
  mod=$b/bin/libfp4q_cuda.so; [[ $m == old ]] && mod=$b/bin/libfp4q_cuda_old.so
  rm -f $d/*.sock
  FP4Q_CUDA_MODULE=$mod $b/bin/fp4qd --listen 127.0.0.1:0 --metrics_listen "" --unix_socket $d/g.sock \
    --fast_socket $d/f.sock --allow_cuda_ipc --backend cuda --log_format text \
    --state_budget_bytes 130000000000 > $d/out 2> $o/fp4qd-$m.log &
  pid=$!; sleep 4
  S="$b/bin/fp4q --server unix://$d/g.sock bench-step --fast-socket $d/f.sock --copy-bandwidth $bw"
  for sc in delayed current; do
    timeout 40 $S --model gpt2-small --scaling $sc --iters 300 --warmup 20 --plan \
      --json $o/cpp-gpt2-$sc-$m.json > $o/cpp-gpt2-$sc-$m.log 2>&1
    tail -3 $o/cpp-gpt2-$sc-$m.log
  done
  timeout 40 $S --model square8192 --scaling delayed --iters 200 --warmup 20 --plan \
    --json $o/cpp-sq8192-delayed-$m.json > $o/cpp-sq8192-delayed-$m.log 2>&1
  tail -3 $o/cpp-sq8192-delayed-$m.log
  kill $pid; wait $pid
done
cd $OUT && tar czf r.tgz r && rm -rf r
