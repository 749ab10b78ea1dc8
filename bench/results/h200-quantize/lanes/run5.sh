#!/usr/bin/env bash
# Device call 7 (repository root, .bundle carried; .bundle/alt/libfp4q_cuda.so.gz is the module of
# main at ba3f5c8, "old"): run2.sh's checks for branch tiles16-lanes' tile pairs (c08185f, the
# branch rebased on ba3f5c8, "new"); Nsight Compute on the 16x16 row, both modules. LIMIT=400
# leaves the rest of the call to bench/results/h200-gemm/small-m/run1.sh.
ARCHIVE=q7 MEMCHECK_S=90 NCU_ROWS="16x16 RTN" LIMIT=${LIMIT:-400} \
  exec bash bench/results/h200-quantize/lanes/run2.sh
