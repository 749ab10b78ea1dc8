#!/usr/bin/env bash
# Dequantize with 32 elements a thread (Dequantize32Kernel: one 16-byte load of codes, no row
# division for row-major scales) against main's kernel (16 elements a thread, 8-byte loads, a
# 64-bit division each): the dequantize tests with the new module and test binary (two more
# shapes: NVFP4 rows of an odd number of blocks, which keep the old kernel), memcheck over them,
# then fp4q_bench's dequantize row and the GEMM at M = 512 and 8192 (whose B, or both operands,
# are dequantized before cuBLAS) with each module in turn: old new new old new old.
# Before the call, here: the module and fp4q_cuda_test built from the working tree into
# .bundle/alt9 (new.so.gz, fp4q_cuda_test, COMMIT), and the service binaries and libraries moved
# out of .bundle (bin/fp4qd, bin/fp4q, lib/libgrpc*, lib/libcrypto*, lib/libssl*,
# lib/libprotobuf*) to stay under the carry limit.
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
