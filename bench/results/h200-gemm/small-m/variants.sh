#!/usr/bin/env bash
# Builds CUDA modules that differ from build-device's only in matmul_small_m.cu's compile-time
# knobs (FP4Q_SMALL_M_STAGES: chunks of B loads a lane keeps in flight; FP4Q_SMALL_M_WAVES: the
# K split sized for that many waves of CTAs), for an A/B through FP4Q_CUDA_MODULE. The knobs
# existed from ce7e314 to f711e33 (call 2 ran this at c150fd7); they were dropped after the
# measurement kept the defaults, so this script needs a checkout of that range:
#   bash bench/results/h200-gemm/small-m/variants.sh OUTDIR S2W1 S3W1 ...
# Each NAME = S<stages>W<waves>; OUTDIR/NAME.so.gz. Run after build-device is built.
set -euo pipefail
out=$1; shift
mkdir -p "$out"; out=$(cd "$out" && pwd)
cd build-device
obj=kernels/src/cuda/CMakeFiles/fp4q_cuda.dir/matmul_small_m.cu.o
compile=$(ninja -t commands bin/libfp4q_cuda.so | grep -F -- "-o $obj")
link=$(ninja -t commands bin/libfp4q_cuda.so | grep -F -- "-o bin/libfp4q_cuda.so")
for name in "$@"; do
  st=${name#S}; st=${st%W*}; wv=${name#*W}
  vobj=/tmp/small_m_$name.o
  eval "${compile/-o $obj/-o $vobj} -DFP4Q_SMALL_M_STAGES=$st -DFP4Q_SMALL_M_WAVES=$wv -Xptxas=-v" \
    2>&1 | grep -A1 "SmallMKernel" | grep -oE "Used [0-9]+ registers|[0-9]+ bytes spill stores" | sort | uniq -c | tr "\n" " "; echo
  l=${link/$obj/$vobj}
  eval "${l/-o bin\/libfp4q_cuda.so/-o /tmp/mod_$name.so}"
  strip --strip-debug /tmp/mod_$name.so
  gzip -c /tmp/mod_$name.so > "$out/$name.so.gz"
  echo "$name: $(stat -c %s "$out/$name.so.gz") bytes"
done
