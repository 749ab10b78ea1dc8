#!/usr/bin/env bash
# Device call 1 of one-pass steps (StepRequest.one_pass): repository root, .bundle carried
# (scripts/device-bundle.sh at the commit under test). Correctness first, then speed, each
# two-pass row beside its one-pass row in the same run:
#   1. fp4q_cuda_test: the one-pass tests and the step tests, bit for bit against the CPU backend
#   2. the one-pass tests under compute-sanitizer memcheck
#   3. fp4q_bench --only step: per-kernel-set times of GPT-2's 50 weights and one 8192x8192
#      (apply only, check + apply, one pass), with the device copy in the same run; Nsight
#      Compute's time, instructions and DRAM bytes of each step kernel, two-pass and one-pass
#   4. fp4qd from C++ (bench-step, fast socket, step plans, delayed scaling): GPT-2, 8192x8192
#      twice each, and Llama-3-8B's 32 layers once: two passes, then one pass
#   5. Python: gpu_ipc_check (one-pass steps by IPC, the refusal's restored outputs) and
#      trainer_step.py for GPT-2 (its one-pass rows beside torch's optimizers)
set -uo pipefail
source bench/results/h200-step/overlap/env.sh
nvidia-smi --query-gpu=name,driver_version,uuid --format=csv,noheader | tee $o/gpu.txt
echo "commit $FP4Q_COMMIT" | tee -a $o/gpu.txt
timeout 150 $b/bin/fp4q_cuda_test --gtest_filter='*OnePass*:*Step*:*LeanSgd*:*Batches*' \
  > $o/cuda-tests.txt 2>&1
echo "rc=$?" >> $o/cuda-tests.txt; grep -E "^\[ +(FAILED|PASSED|SKIPPED) |rc=" $o/cuda-tests.txt
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
timeout 120 $cs --tool memcheck $b/bin/fp4q_cuda_test --gtest_filter='*OnePass*' \
  > $o/memcheck.txt 2>&1
echo "rc=$?" >> $o/memcheck.txt; grep -E "^\[ +(FAILED|PASSED) |ERROR SUMMARY|rc=" $o/memcheck.txt
timeout 150 $b/bin/fp4q_bench --only step --out $o/bench-step.json > $o/bench-step.txt 2>&1
echo "fp4q_bench rc=$?"; grep -E "copy|SGD" $o/bench-step.txt | head -12
# Nsight Compute on one GPT-2 step of each kind: the kernels' time, instructions and DRAM bytes
# (the one-pass apply carries the check's work: its instructions an element against the lean
# apply's plus the check's).
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for row in "step check + apply, SGD + EF, delayed" "step one pass, SGD + EF, delayed"; do
  tag=$([[ $row == *"one pass"* ]] && echo one || echo two)
  timeout 120 $ncu --clock-control none --kernel-name regex:Step --launch-skip 40 \
    --launch-count 8 --metrics gpu__time_duration.sum,smsp__inst_executed.sum,dram__bytes_read.sum,dram__bytes_write.sum,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active \
    $b/bin/fp4q_bench --only "$row" --iters 3 --out /tmp/ncu-$tag.json > $o/ncu-$tag.txt 2>&1
  echo "ncu $tag rc=$?"; grep -E "Step[A-Za-z]+Kernel|gpu__time|inst_executed|issue_active" $o/ncu-$tag.txt | head -24
done
bw=$(python3 -c "import json;print(json.load(open('$o/bench-step.json'))['copy_gbps'])" || echo 4200)
d=/tmp/fq; mkdir -p $d; rm -f $d/*.sock
$b/bin/fp4qd --listen 127.0.0.1:0 --metrics_listen "" --unix_socket $d/g.sock \
  --fast_socket $d/f.sock --allow_cuda_ipc --backend cuda --log_format text \
  --state_budget_bytes 110000000000 > $d/out 2> $o/fp4qd.log &
pid=$!; for i in $(seq 400); do [[ -S $d/f.sock ]] && break; sleep 0.05; done
grep -o "step_signals[^ ]*" $o/fp4qd.log | head -1
S="$b/bin/fp4q --server unix://$d/g.sock bench-step --fast-socket $d/f.sock --plan \
  --scaling delayed --copy-bandwidth $bw"
for m in "gpt2 --model gpt2-small --iters 300" "sq8192 --model square8192 --iters 300" \
         "llama --model llama3-8b --iters 20 --warmup 3"; do
  set -- $m
  rounds="1 2"; [[ $1 == llama ]] && rounds=1  # its setup (7e9 parameters) takes longest
  for r in $rounds; do
    for p in two one; do
      flag=""; [[ $p == one ]] && flag="--one-pass"
      timeout 150 $S "${@:2}" $flag --json $o/cpp-$1-$p-$r.json > $o/cpp-$1-$p-$r.log 2>&1
      echo "$1 $p $r rc=$? $(python3 -c "import json;d=json.load(open('$o/cpp-$1-$p-$r.json'));print('wall p50 %.1f us, kernel p50 %.1f us, %% of copy (wall, kernel) %s' % (d['wall_us']['p50'], d['kernel_us']['p50'], d.get('pct_of_copy_bandwidth')))" 2>&1)"
    done
  done
done
kill $pid; wait $pid
timeout 200 python3 tests/python/gpu_ipc_check.py --fp4qd $b/bin/fp4qd --out $o/ipc --steps 100 \
  > $o/gpu_ipc_check.txt 2>&1
echo "gpu_ipc_check rc=$?"; tail -1 $o/gpu_ipc_check.txt
grep -A3 '"optim_one_pass' $o/ipc/gpu_ipc_check.json | head -4
timeout 200 python3 bench/trainer_step.py --fp4qd $b/bin/fp4qd --models gpt2-small \
  --behind-ms 0 --steps 100 --warmup 10 --json $o/trainer-step-gpt2.json \
  > $o/trainer-step-gpt2.txt 2>&1
echo "trainer_step rc=$?"; grep -E "delayed|foreach SGD|floor" $o/trainer-step-gpt2.txt | head -12
cd $OUT && tar czf r.tgz r && rm -rf r
