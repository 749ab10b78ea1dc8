#!/usr/bin/env bash
# Device call 18: two changes of the wgmma kernel against main's, each built from its branch
# (neither run on a GPU before this call), aimed at call 13b's profile of main's kernel:
#   bufs3   = .bundle/alt8/ (branch wgmma-bufs3): three chunks of B loads in flight at 128
#             tokens (two on main), the K loop unrolled over six chunks. At M = 128, 22% of the
#             stall samples were long-scoreboard waits, most at the first use of a chunk's B loads.
#   stages6 = .bundle/alt9/ (branch wgmma-stages6): 6 A stages at 128 tokens, 8 below (4 on
#             main). At M = 256, 9% of the samples waited for A's chunk to land.
#   old     = the bundle's module (main).
#   1. the wgmma and mid-M tests with each; memcheck over the wgmma tests with each
#   2. fp4q_bench --only GEMM at M = 32, 64, 128, 256: old bufs3 stages6 stages6 bufs3 old
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
begin g18 "bufs3 $(cat $b/alt8/COMMIT), stages6 $(cat $b/alt9/COMMIT)"
gunzip -f $b/alt8/new.so.gz $b/alt9/new.so.gz
declare -A mod=([old]=$b/bin/libfp4q_cuda.so [bufs3]=$b/alt8/new.so [stages6]=$b/alt9/new.so)
declare -A test=()
for v in bufs3 stages6; do
  gemm_tests $v 'MatmulTest.Wgmma*:MatmulTest.WithinTolerance*:MatmulTest.MidM*'
done
gemm_rounds old bufs3 stages6 stages6 bufs3 old
for v in bufs3 stages6; do
  gemm_memcheck $v 'MatmulTest.Wgmma*:MatmulTest.WithinToleranceOfCpuReference'
done
