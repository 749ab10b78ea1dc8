#!/usr/bin/env bash
# Device call 20 (repository root, .bundle carried; .bundle/alt/libfp4q_cuda.so.gz is the
# module of branch decide-reads, 862419d): run17's A/B round 2 (the step rows with programmatic
# launches and plain), the decide-reads module against main's on the same rows (ab_bench: "new"
# is main's module, "old" decide-reads'), then GPT-2 from Python with fp4qd's automatic spin
# (trainer). Each only if it fits (room, LIMIT).
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
begin r20 "alt: decide-reads 862419d"
pdl_bench 2 90 plain pdl
ab_bench dr 90 step
trainer auto-1
