#!/usr/bin/env bash
# Device call (repository root, .bundle carried; .bundle/var/NAME.so.gz from variants.sh): the
# small-M GEMM's K split and load depth. fp4q_bench's GEMM rows at M = 1 and 16 with each
# variant module (variants.sh), two rounds in alternating order; then Nsight Compute's durations of the
# prepare and main kernels of one Matmul at each M (the bundle's module).
set -uo pipefail
source bench/results/h200-step/overlap/env.sh
archive_on_exit ${ARCHIVE:-g2}
nvidia-smi --query-gpu=name,driver_version,uuid --format=csv,noheader | tee $o/gpu.txt
echo "commit $FP4Q_COMMIT" | tee -a $o/gpu.txt
# S2W1 (the defaults) is the bundle's own module.
vars=${VARIANTS:-S2W1 S3W1 S2W2 S3W2}
mkdir -p $b/var; ln -sf $b/bin/libfp4q_cuda.so $b/var/S2W1.so
for v in $vars; do [[ -f $b/var/$v.so.gz ]] && gunzip -f $b/var/$v.so.gz; done
for r in 1 2; do
  order=$vars; [[ $r == 2 ]] && order=$(echo $vars | tr ' ' '\n' | tac | tr '\n' ' ')
  for v in $order; do
    room 30 "bench $v $r" || continue
    FP4Q_CUDA_MODULE=$b/var/$v.so timeout 30 $b/bin/fp4q_bench --only GEMM --gemm-m 1,16 \
      --out $o/bench-$v-$r.json > $o/bench-$v-$r.txt 2>&1
    echo "$v $r rc=$? $(grep -E "^GEMM" $o/bench-$v-$r.txt | cut -c1-60 | tr '\n' ' ')"
  done
done
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for m in 1 16; do
  room 40 "ncu times $m" || continue
  timeout 40 $ncu --clock-control none -k regex:"PrepareAct|SmallM" --launch-skip 6 \
    --launch-count 6 --metrics gpu__time_duration.sum,sm__cycles_active.avg,gpc__cycles_elapsed.max \
    $b/bin/fp4q_bench --only GEMM --gemm-m $m --iters 5 --out $o/n.json > $o/ncu-times-$m.txt 2>&1
  echo "ncu times $m rc=$?"
  grep -E "^  [a-zA-Z].*\(|duration|cycles" $o/ncu-times-$m.txt | sed 's/(unnamed namespace)//' | cut -c1-90
done
