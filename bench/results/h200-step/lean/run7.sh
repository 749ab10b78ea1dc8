# One device call (repository root, .bundle carried with the module before this change as
# .bundle/bin/libfp4q_cuda_cur.so): the lean run's L2 prefetch issued once a 128-byte line
# instead of by every lane. The lean tests with the new module, then fp4q_bench's GPT-2 /
# 8192 x 8192 check + apply rows, current and new module alternated three times.
set -x
source bench/results/h200-step/overlap/env.sh
nvidia-smi -L > $o/gpu.txt
timeout 60 $b/bin/fp4q_cuda_test --gtest_filter='*LeanSgd*' > $o/lean-test.txt 2>&1
echo "rc=$?" >> $o/lean-test.txt; tail -2 $o/lean-test.txt
for r in 1 2 3; do
  for m in cur new; do
    mod=$b/bin/libfp4q_cuda.so; [[ $m == cur ]] && mod=$b/bin/libfp4q_cuda_cur.so
    FP4Q_CUDA_MODULE=$mod timeout 60 $b/bin/fp4q_bench --only "step check + apply, SGD + EF, delayed" \
      --iters 60 --out $o/bench-$m-$r.json > $o/bench-$m-$r.log 2>&1
    grep "SGD" $o/bench-$m-$r.log | head -2 | sed "s/^/$m $r: /"
  done
done
cd $OUT && tar czf r.tgz r && rm -rf r
