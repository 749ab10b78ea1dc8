#!/usr/bin/env bash
# The MXFP4 scale byte without branches (MxScaleByte in kernels/src/cuda/device_numerics.cuh:
# integer work on the f32 bits; the host reference's byte for every non-negative input, NaN and
# infinity, tests/kernels/mx_scale_bits_test.cc) against the module before it: the quantize GPU
# tests that cover MXFP4 (bit for bit against the CPU backend) with the new module, fp4q_bench's
# MXFP4 row with each module in turn (old new new old new old), then memcheck over the MXFP4
# tests.
# In the SASS (scripts/sass_hot_path.py) the lane kernel's MXFP4 bf16 RTN hot loop goes from
# 17.20 to 15.14 instructions an element (SR 23.31 -> 21.19, RHT + SR 30.28 -> 28.28).
# Ran as call 1 (README.md). Before the call, here, with the .bundle of d6f8e9c (its module is
# "old"):
#   ninja -C build-device libfp4q_cuda.so && mkdir -p .bundle/alt10
#   strip --strip-debug -o .bundle/alt10/new.so build-device/bin/libfp4q_cuda.so
#   gzip -f .bundle/alt10/new.so && git log -1 --format=%h > .bundle/alt10/COMMIT
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
begin mx1 "mxscale $(cat $b/alt10/COMMIT)"
alt_pair new alt10
F='*QuantizeTest.*:CudaTest.QuantizeWithErrorFeedback*:CudaTest.Qdq*:CudaTest.FiniteGuard*'
F+=':CudaTest.ReproducesTheGoldenVectors:CudaTest.CallsBackToBack*'
module_tests new "$F" 90 quantize
only_rounds mxfp4 old new new old new old
gemm_memcheck new '*mxfp4*:*Mxfp*'
echo "done ($SECONDS s)"
