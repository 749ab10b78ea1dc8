#!/usr/bin/env bash
# Device call 1: (1) the wgmma GEMM through fp4qd (bench/matmul_service.py, fast socket and
# gRPC); (2) bench/train_loop.py at batch 64 and 256 with the step's time on the worker's
# stream, fp4qd by default and busy-polling; (3) the Python client's phases of a GPT-2 step
# under delayed scaling (trainloop.py, mode gpt2).
set -uo pipefail
source bench/results/h200-step/overlap/env.sh
nvidia-smi --query-gpu=name,driver_version,uuid --format=csv,noheader | tee $o/gpu.txt
echo "commit $FP4Q_COMMIT" | tee -a $o/gpu.txt
timeout 150 python3 bench/matmul_service.py --fp4qd "$b/bin/fp4qd" --m 1,16,32,64,128,256,512 \
  --linear-m 2048 --grpc --json $o/matmul_service.json > $o/matmul_service.txt 2>&1
echo "matmul_service rc=$?"; grep -A12 "^M=128" $o/matmul_service.txt | head -14
for batch in 64 256; do
  timeout 120 python3 bench/train_loop.py --fp4qd "$b/bin/fp4qd" --rounds 3 --batch $batch \
    --out $o/train-loop-b$batch.json > $o/train-loop-b$batch.txt 2>&1; echo "b$batch rc=$?"
  tail -12 $o/train-loop-b$batch.txt
done
timeout 100 python3 bench/train_loop.py --fp4qd "$b/bin/fp4qd" --rounds 3 --batch 256 \
  --fp4qd-arg=--worker_spin_us=20000 --fp4qd-arg=--fast_socket_spin_us=20000 \
  --out $o/train-loop-b256-spin.json > $o/train-loop-b256-spin.txt 2>&1; echo "spin rc=$?"
tail -12 $o/train-loop-b256-spin.txt
B=$b MODES=gpt2 SCALING=delayed N=200 timeout 100 python3 bench/results/h200-step/python-client/trainloop.py \
  > $o/trainloop-gpt2-delayed.txt 2>&1; echo "trainloop rc=$?"; cat $o/trainloop-gpt2-delayed.txt
# (4) each kernel's device time in a step of the train suite's 16 block matrices (fp4qd under
# Nsight Compute, gpu__time_duration only), current and delayed scaling, beside the host-timed
# kernel_us of the same steps without the profiler.
small=$(for l in 1 2 3 4; do printf "1152x384,384x384,1536x384,384x1536,"; done); small=${small%,}
d=/tmp/fq; mkdir -p $d
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for prof in 0 1; do
  rm -f $d/*.sock
  pre=""; [[ $prof == 1 ]] && pre="$ncu --target-processes all --metrics gpu__time_duration.sum --csv --log-file $o/ncu-small.csv"
  $pre $b/bin/fp4qd --listen 127.0.0.1:0 --metrics_listen "" --unix_socket $d/g.sock \
    --fast_socket $d/f.sock --allow_cuda_ipc --backend cuda --log_format text > $d/out 2> $o/fp4qd-$prof.log &
  pid=$!; for i in $(seq 40); do [[ -S $d/f.sock ]] && break; sleep 0.5; done
  S="$b/bin/fp4q --server unix://$d/g.sock bench-step --fast-socket $d/f.sock --shapes $small --plan"
  for sc in current delayed; do
    if [[ $prof == 1 ]]; then it="--iters 3 --warmup 1"; else it="--iters 300 --warmup 20"; fi
    timeout 60 $S --scaling $sc $it --json $o/small-$sc-$prof.json > $o/small-$sc-$prof.log 2>&1
    python3 -c "import json;d=json.load(open('$o/small-$sc-$prof.json'));print('small $sc prof=$prof wall', d['wall_us']['p50'], 'kernel', d['kernel_us']['p50'], 'server', d['server_us']['p50'])"
  done
  kill $pid; wait $pid
done
python3 - "$o/ncu-small.csv" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
h = rows[0]; rows = rows[1:]
ki, vi = h.index("Kernel Name"), h.index("Metric Value")
for r in rows:
    print("%-60s %s" % (r[ki][:60], r[vi]))
PY
cd $OUT && tar czf r.tgz r && rm -rf r
