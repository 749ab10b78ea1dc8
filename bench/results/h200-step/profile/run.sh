# Where the GPT-2-shaped step's time goes (run from the repository root with .bundle carried).
set -x
source bench/results/h200-step/overlap/env.sh
tar xJf "${PERF_PACK:?set PERF_PACK to a tar.xz holding perfpack/perf and perfpack/lib (perf is not installed there)}" -C /tmp
P="env LD_LIBRARY_PATH=/tmp/perfpack/lib:$LD_LIBRARY_PATH /tmp/perfpack/perf"
nvidia-smi -L > $o/gpu.txt
G="timeout 60 python3 bench/results/h200-step/profile/gstep.py --fp4qd $b/bin/fp4qd"
SP="--fp4qd-arg=--fast_socket_spin_us=300 --fp4qd-arg=--worker_spin_us=300"
for r in 1 2; do
  $G --label plain >> $o/gstep.jsonl 2>>$o/gstep.err
  $G --label srvspin $SP >> $o/gstep.jsonl 2>>$o/gstep.err
  $G --label allspin $SP --spin-us 2000 >> $o/gstep.jsonl 2>>$o/gstep.err
done
$G --label prof --profile $o/cprofile.txt >> $o/gstep.jsonl 2>>$o/gstep.err
# fp4qd under perf while C++ bench-step GPT-2 delayed with plans runs
d=/tmp/fq; mkdir -p $d
$b/bin/fp4qd --listen 127.0.0.1:0 --metrics_listen "" --unix_socket $d/g.sock --fast_socket $d/f.sock --allow_cuda_ipc --backend cuda --log_format text --state_budget_bytes 60000000000 > $d/out 2> $o/fp4qd.log &
pid=$!; sleep 4
$b/bin/fp4q --server unix://$d/g.sock bench-step --model gpt2-small --scaling delayed --fast-socket $d/f.sock --iters 4000 --warmup 20 --plan --copy-bandwidth 4200 --json $o/cpp-plan.json > $o/cpp-plan.log 2>&1 &
bp=$!; sleep 1.5
$P record -F 8000 -g -p $pid -o /tmp/flat.data -- sleep 1.5 2> /dev/null
wait $bp
kill $pid; wait $pid
$P report -i /tmp/flat.data --no-children --sort sym 2>/dev/null | grep -E "^ +[0-9]" | head -120 > $o/perf-flat.txt
$P report -i /tmp/flat.data --children --sort sym 2>/dev/null | grep -E "^ +[0-9]" | head -150 > $o/perf-children.txt
$P report -i /tmp/flat.data --no-children --sort tid 2>/dev/null | grep -E "^ +[0-9]" | head -30 > $o/perf-tid.txt
# kernels of the GPT-2 delayed check + apply
timeout 150 ncu --clock-control none --kernel-name regex:Step --launch-count 8 --section SpeedOfLight --section LaunchStats --section Occupancy --section SchedulerStats --metrics gpu__time_duration.sum,sm__inst_executed.sum,smsp__inst_executed.sum $b/bin/fp4q_bench --only "step check + apply, SGD + EF, delayed" --iters 3 --out /tmp/x.json > $o/ncu.txt 2>&1
# a second call: the driver and torch calls the client makes, and the apply kernel's SASS counts
timeout 60 python3 bench/results/h200-step/profile/micro.py > $o/micro.txt 2>&1
timeout 150 ncu --clock-control none --kernel-name regex:StepApplyKernel --launch-skip 1 --launch-count 1 \
  --section SourceCounters --section InstructionStats --section WarpStateStats -o /tmp/rep \
  $b/bin/fp4q_bench --only "step check + apply, SGD + EF, delayed" --iters 2 --out /tmp/x.json > $o/ncu-run.txt 2>&1
ncu -i /tmp/rep.ncu-rep --page source --csv --print-source sass > $o/source.csv
cd $OUT && tar czf r.tgz r && rm -rf r
