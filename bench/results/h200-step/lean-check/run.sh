set -x
source bench/results/h200-step/overlap/env.sh
tar xJf .prof/perf.tar.xz -C /tmp
xz -dc .prof/old_cuda.so.xz > /tmp/old_cuda.so
P="env LD_LIBRARY_PATH=/tmp/perfpack/lib:$LD_LIBRARY_PATH /tmp/perfpack/perf"
nvidia-smi -L > $o/gpu.txt; nvidia-smi --query-gpu=driver_version --format=csv >> $o/gpu.txt
# correctness of the step kernels against the CPU backend
timeout 240 $b/bin/fp4q_cuda_test --gtest_filter='CudaTest.Step*:CudaTest.Batches*:CudaTest.LongWarp*:CudaTest.FiniteGuard*:CudaTest.AmaxFirst*' > $o/cuda-step-tests.txt 2>&1; echo "rc=$?" >> $o/cuda-step-tests.txt
tail -3 $o/cuda-step-tests.txt
CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer)
timeout 200 $CS --tool memcheck $b/bin/fp4q_cuda_test --gtest_filter='CudaTest.StepRefusalsMatchCpu:CudaTest.LongWarpRunsMatchCpu' > $o/memcheck-step.txt 2>&1; echo "rc=$?" >> $o/memcheck-step.txt
tail -3 $o/memcheck-step.txt
# kernels: new module, then the module of 73d6986, in one run
timeout 150 $b/bin/fp4q_bench --only step --out $o/bench_step_new.json > $o/bench_step_new.log 2>&1
FP4Q_CUDA_MODULE=/tmp/old_cuda.so timeout 150 $b/bin/fp4q_bench --only step --out $o/bench_step_old.json > $o/bench_step_old.log 2>&1
d=/tmp/fq; mkdir -p $d
$b/bin/fp4qd --listen 127.0.0.1:0 --metrics_listen "" --unix_socket $d/g.sock --fast_socket $d/f.sock --allow_cuda_ipc --backend cuda --log_format text --state_budget_bytes 100000000000 > $d/out 2> $o/fp4qd.log &
pid=$!; sleep 4
for sc in delayed current; do
$b/bin/fp4q --server unix://$d/g.sock bench-step --model gpt2-small --scaling $sc --fast-socket $d/f.sock --iters 3000 --warmup 20 --json $o/cpp-gpt2-$sc.json > $o/cpp-gpt2-$sc.log 2>&1 &
bp=$!; sleep 1.5
if [ $sc = delayed ]; then
$P record -F 8000 -p $pid -o /tmp/flat.data -- sleep 1.5 2> /dev/null
$P record -F 1500 --call-graph dwarf,16384 -p $pid -o /tmp/dwarf.data -- sleep 0.8 2> /dev/null
fi
wait $bp
done
$P report -i /tmp/flat.data --no-children --sort sym 2>/dev/null | head -150 > $o/perf-cpp-flat.txt
$P report -i /tmp/flat.data --no-children --sort tid 2>/dev/null | head -40 > $o/perf-cpp-tid.txt
timeout 100 $P report -i /tmp/dwarf.data --children --sort sym 2>/dev/null | grep -E "^ +[0-9]" | head -250 > $o/perf-cpp-children.txt
timeout 120 python3 bench/results/h200-step/lean-check/py_steps.py --server unix://$d/g.sock --fast $d/f.sock --seconds 5 --scaling delayed --out $o/py-delayed.json > $o/py-delayed.log 2>&1 &
pp=$!; for i in $(seq 300); do [ -e /tmp/pysteps.go ] && break; sleep 0.2; done; sleep 0.5
$P record -F 8000 -a -o /tmp/pyflat.data -- sleep 1.5 2>/dev/null
wait $pp
$P report -i /tmp/pyflat.data --no-children --sort comm,dso,sym 2>/dev/null | head -200 > $o/perf-py-flat.txt
timeout 60 python3 bench/results/h200-step/lean-check/py_steps.py --server unix://$d/g.sock --fast $d/f.sock --seconds 3 --scaling current --out $o/py-current.json > $o/py-current.log 2>&1
kill $pid; wait
cd $OUT && tar czf r.tgz r && rm -rf r
