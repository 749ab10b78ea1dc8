#!/usr/bin/env bash
# The train model's step (16 small matrices) through fp4qd: bench-step timings, then the same
# under nsys (fp4qd launched by nsys) for the kernels' and the CUDA API's summaries.
B=$PWD/.bundle
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda/lib64 FP4Q_CUDA_MODULE=$B/bin/libfp4q_cuda.so
S=$(for i in 1 2 3 4; do printf '1152x384,384x384,1536x384,384x1536,'; done); S=${S%,}
NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
echo "nsys: ${NSYS:-none}"
run() {  # run TAG [prefix...]: fp4qd (under the prefix), bench-step twice, SIGTERM
  local tag=$1; shift
  rm -f /tmp/s.sock /tmp/s.fast
  "$@" $B/bin/fp4qd --backend cuda --allow_cuda_ipc --unix_socket /tmp/s.sock --fast_socket /tmp/s.fast \
    --listen 127.0.0.1:0 --metrics_listen= --log_format text > $OUT/fp4qd-$tag.out 2> $OUT/fp4qd-$tag.log &
  local pid=$!
  for _ in $(seq 300); do grep -q listening $OUT/fp4qd-$tag.out 2>/dev/null && break; sleep 0.1; done
  for opt in "--optimizer sgd --scaling current" "--optimizer adamw"; do
    timeout 60 $B/bin/fp4q --server unix:///tmp/s.sock bench-step --shapes "$S" $opt --iters 300 --warmup 30 \
      --fast-socket /tmp/s.fast 2>/dev/null | python3 -c "
import json,sys; d=json.load(sys.stdin); print('$tag', '$opt', d['parameters'], {k: d[k]['p50'] for k in ['wall_us','kernel_us','server_us','overhead_us','queue_us']})"
  done
  kill -TERM $pid; wait $pid 2>/dev/null
}
run plain
if [[ -n "$NSYS" ]]; then
  run nsys timeout 120 $NSYS profile -t cuda,osrt --sample=none --cpuctxsw=none -o $OUT/small -f true
  timeout 120 $NSYS stats -r cuda_gpu_kern_sum,cuda_api_sum,cuda_gpu_mem_time_sum -f csv -o $OUT/st $OUT/small.nsys-rep > /dev/null 2>&1
  ls $OUT; for f in $OUT/st*.csv; do echo "== $f"; head -25 $f | cut -c1-220; done
  rm -f $OUT/small.nsys-rep $OUT/small.sqlite
fi
