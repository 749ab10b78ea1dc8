#!/usr/bin/env bash
# The small-M GEMM with B's codes through a ring of cp.async stages in shared memory (K % 32 ==
# 0) against the bundle's kernel (two chunks of loads in flight in registers): the GEMM tests
# with the new module and test binary, memcheck over the small-M tests, then fp4q_bench's GEMM
# rows at M = 1 and 16 (cuBLAS bf16 beside them in each process) with each module in turn:
# old s6 s4 s6 old s4 s6 old. s6: 6 stages for M <= 8, 3 for M <= 16 (the code as committed);
# s4: 4 and 3. Before the call, here (bundle made first with scripts/device-bundle.sh --pack):
#   mkdir -p .bundle/ring
#   strip --strip-debug -o .bundle/ring/s6.so build-device/bin/libfp4q_cuda.so
#   strip --strip-debug -o .bundle/ring/fp4q_cuda_test build-device/bin/fp4q_cuda_test
#   (FP4Q_SMALL_M_ASYNC_STAGES1 set to 4 in matmul_small_m.cu, the module rebuilt:)
#   strip --strip-debug -o .bundle/ring/s4.so build-device/bin/libfp4q_cuda.so
#   gzip -f .bundle/ring/*.so .bundle/ring/fp4q_cuda_test
#   git log -1 --format=%h > .bundle/ring/COMMIT
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
begin ring1 "ring modules of $(cat $b/ring/COMMIT)"
gunzip -f $b/ring/*.gz; chmod +x $b/ring/fp4q_cuda_test
declare -A mod=([old]=$b/bin/libfp4q_cuda.so [s6]=$b/ring/s6.so [s4]=$b/ring/s4.so)
declare -A test=([s6]=$b/ring/fp4q_cuda_test [s4]=$b/ring/fp4q_cuda_test)
gemm_tests s6 'MatmulTest.*'
gemm_memcheck s6 'MatmulTest.SmallM*:MatmulTest.DecodeShapes*'
GEMM_M=1,16 gemm_rounds old s6 s4 s6 old s4 s6 old
gemm_tests s4 'MatmulTest.SmallM*:MatmulTest.DecodeShapes*'
echo "done ($SECONDS s)"
