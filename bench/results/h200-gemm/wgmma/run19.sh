#!/usr/bin/env bash
# Device call 19 (ran: README.md, not kept): the wgmma kernel with one group of wgmmas left queued
# on the tensor cores while the lanes decode the next chunk (call19/wait1.diff: each step waits for
# chunk c - 1's group only, wgmma.wait_group 1, then releases and refills that chunk's stage),
# against main's. Call 13b's profile of main's kernel at M = 128 found a quarter of the stall
# samples in fixed-latency waits, and on the H200 the kernel does 17.2 GFLOP in 41.8 us (call 18):
# 411 TFLOP/s, 42% of the dense bf16 peak NVIDIA states for it (989 TFLOP/s; not measured here).
# Main drains the wgmma pipe every chunk (wgmma.wait_group 0), and thread 0 waits for every warp to
# release a stage before the next chunk's wgmmas are issued.
# Before the call, here (the module compiles for sm_90a with no spills and no ptxas wgmma
# serialization warning: 188-228 registers):
#   git apply bench/results/h200-gemm/wgmma/call19/wait1.diff
#   ninja -C build-device libfp4q_cuda.so && mkdir -p .bundle/alt8
#   strip --strip-debug -o .bundle/alt8/new.so build-device/bin/libfp4q_cuda.so
#   gzip -f .bundle/alt8/new.so && echo "main+run19-wait1.diff" > .bundle/alt8/COMMIT
#   git checkout kernels/src/cuda/matmul_wgmma.cu && ninja -C build-device libfp4q_cuda.so
# with the bundle made by `scripts/device-bundle.sh --pack` first (or the service binaries and
# libraries moved out of .bundle, run18.sh's note) to stay under the carry limit.
#   1. the wgmma and mid-M tests with it; memcheck over the wgmma tests
#   2. fp4q_bench --only GEMM at M = 32, 64, 128, 256: old wait1 wait1 old wait1 old
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
begin g19 "wait1 $(cat $b/alt8/COMMIT)"
gunzip -f $b/alt8/new.so.gz
declare -A mod=([old]=$b/bin/libfp4q_cuda.so [wait1]=$b/alt8/new.so)
declare -A test=()
gemm_tests wait1 'MatmulTest.Wgmma*:MatmulTest.WithinTolerance*:MatmulTest.MidM*'
gemm_rounds old wait1 wait1 old wait1 old
gemm_memcheck wait1 'MatmulTest.Wgmma*:MatmulTest.WithinToleranceOfCpuReference'
