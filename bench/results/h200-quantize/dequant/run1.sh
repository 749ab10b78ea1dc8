#!/usr/bin/env bash
# Dequantize with 32 elements a thread (Dequantize32Kernel: one 16-byte load of codes, no row
# division for row-major scales) against main's kernel (16 elements a thread, 8-byte loads, a
# 64-bit division each): the dequantize tests with the new module and test binary (two more
# shapes: NVFP4 rows of an odd number of blocks, which keep the old kernel), memcheck over them,
# then fp4q_bench's dequantize row and the GEMM at M = 512 and 8192 (whose B, or both operands,
# are dequantized before cuBLAS) with each module in turn: old new new old new old.
# Ran as call 1 (README.md: slower, not kept). The change is dequant32.diff (this folder), kept
# off main. Before the call, here:
#   git apply bench/results/h200-quantize/dequant/dequant32.diff
#   ninja -C build-device libfp4q_cuda.so fp4q_cuda_test && mkdir -p .bundle/alt9
#   strip --strip-debug -o .bundle/alt9/new.so build-device/bin/libfp4q_cuda.so
#   strip --strip-debug -o .bundle/alt9/fp4q_cuda_test build-device/bin/fp4q_cuda_test
#   gzip -f .bundle/alt9/new.so && echo "main+dequant32.diff" > .bundle/alt9/COMMIT
#   git checkout kernels/src/cuda/elementwise.cu tests/kernels/cuda/cuda_ops_test.cc
# with the bundle made by `scripts/device-bundle.sh --pack` first (so that it, alt9 and other
# alt folders fit one call's carry).
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
begin dq1 "dequant32 $(cat $b/alt9/COMMIT)"
gunzip -f $b/alt9/new.so.gz
chmod +x $b/alt9/fp4q_cuda_test
declare -A mod=([old]=$b/bin/libfp4q_cuda.so [new]=$b/alt9/new.so)
declare -A test=([new]=$b/alt9/fp4q_cuda_test)
F='CudaTest.Dequantize*:MatmulTest.WithinTolerance*:MatmulTest.DecodeShapes*'
gemm_tests new "$F"
gemm_memcheck new 'CudaTest.Dequantize*'
i=0
for v in old new new old new old; do
  i=$((i + 1))
  room 30 "bench $v $i" || continue
  FP4Q_CUDA_MODULE=${mod[$v]} timeout 30 $b/bin/fp4q_bench --only dequantize \
    --out $o/dq-$i-$v.json > $o/dq-$i-$v.txt 2>&1
  FP4Q_CUDA_MODULE=${mod[$v]} timeout 30 $b/bin/fp4q_bench --only GEMM --gemm-m 512,8192 \
    --out $o/gemm-$i-$v.json > $o/gemm-$i-$v.txt 2>&1
  echo "== $i $v rc=$?"; grep -hE "^copy|^\| dequantize|^GEMM M=(512|8192)" \
    $o/dq-$i-$v.txt $o/gemm-$i-$v.txt | cut -c1-100
done
echo "done ($SECONDS s)"
