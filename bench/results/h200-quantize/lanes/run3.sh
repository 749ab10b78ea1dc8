#!/usr/bin/env bash
# Device call (repository root, .bundle carried; .bundle/alt/libfp4q_cuda.so.gz is the module of
# 78c7b03, "old"): run2.sh's checks at c96afac ("new": stochastic rounding's noise from Philox's
# words without inverting them, in every kernel that rounds stochastically, the step's included),
# Nsight Compute on four rows of the new module only.
ARCHIVE=q3 NCU_MODULES=new \
  NCU_ROWS="1x16 RTN, amax given|1x16 SR, amax given|1x16 RHT+SR, amax given|mxfp4 RTN" \
  exec bash bench/results/h200-quantize/lanes/run2.sh
