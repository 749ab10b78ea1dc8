#!/usr/bin/env bash
# The overlapped training loop round by round (bench/train_loop.py, the train suite's model at
# batch 256 x 128, torch's SGD and fp4q.optim.SGD overlap=True in turn): under CUDA MPS (7
# rounds), then a 6-layer, d_model 512 model (also the step waiting for its reply); the Python
# client's phases of one 8192 x 8192 step (delayed scaling, one pass) and of the train suite's
# step in its loop; bench/trainer_step.py's GPT-2 step; the loop in two GPU contexts (5 rounds)
# with fp4qd's defaults, with host-polled step signals and with its busy-polling off. The GPU's
# clocks, power and temperature sampled every 100 ms beside the loops (smi.csv). Then a cProfile
# of each Python step, and each kernel of fp4q_bench's one-pass 8192 x 8192 step alone under
# Nsight Compute (GPU time, caches and clocks left as they are). In that order of importance: a
# part that no longer fits the LIMIT is skipped. Repository root, the whole .bundle carried.
# Ran as call 1 on an H100 (README.md).
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
begin loop1
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu \
  --format=csv -lms 100 > $o/smi.csv 2>&1 &
smi=$!
loop_args=("--variant=fp4q overlap")  # torch and the overlapped step only
loop() { train_loop $1 256 "${@:2}"; }  # TAG ROUNDS SECONDS [FP4QD FLAGS...], batch 256
mps_start
loop mps 7 90
# The same under MPS with the largest model the issue names (6 layers, d_model 512: 18.9M
# parameters in the blocks), the step waiting for its reply and overlapped.
loop_args=("--variant=fp4q" "--variant=fp4q overlap" --layers=6 --d-model=512 --heads=8)
loop mps-6x512 5 110
loop_args=("--variant=fp4q overlap")
mps_stop
client_phases single 40 MODES=single SCALING=delayed ONE_PASS=1 N=600
client_phases loop 40 MODES=none N=400
trainer gpt2  # GPT-2's step from Python with this client (p50, p90), torch's in the same run
loop two 5 70
loop two-host 5 70 --step_device_signals=false
loop two-nospin 5 70 --worker_spin_us=0 --fast_socket_spin_us=0
kill $smi
client_phases single-profile 40 MODES=single SCALING=delayed ONE_PASS=1 N=300 PROFILE=1 PHASES=0
client_phases loop-profile 40 MODES=none N=300 PROFILE=1 PHASES=0
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [[ -n "$NCU" ]] && room 60 "ncu one pass"; then
  timeout 60 $NCU --cache-control none --clock-control none --metrics gpu__time_duration.sum \
    --launch-skip 40 --launch-count 30 $b/bin/fp4q_bench --only "step one pass" \
    --step-models 8192 --iters 20 --out /tmp/ncu-bench.json > $o/ncu-one-pass.txt 2>&1
  echo "ncu rc=$?"; grep -E "^  [A-Za-z].*\(|gpu__time_duration" $o/ncu-one-pass.txt | head -24
fi
echo "done ($SECONDS s)"
