#!/usr/bin/env bash
# Device call 8 (repository root, .bundle carried): the code after efc0571 on a GPU, and where
# the host's time goes in a GPT-2 step. Each phase only if it fits (room, LIMIT):
#   1. which profilers the machine has (perf, gdb, nsys)
#   2. fp4q_cuda_test's step and one-pass tests; tests/python/gpu_ipc_check.py (the synchronous
#      step with an idle stream skips the host's synchronize of it: ea784ab)
#   3. perf's sampled call graphs: fp4qd while `fp4q bench-step` runs GPT-2 in one pass from
#      C++, then the Python client and fp4qd while python-client/trainloop.py steps GPT-2
#      (python3 -X perf: the Python functions named in the samples)
#   4. the Python step's phases, the client sleeping for the reply or busy-polling for it
#   5. bench/trainer_step.py over GPT-2 (fp4qd's own time per row beside the kernels'), then
#      with the client busy-polling for replies (--spin-us 3000)
set -uo pipefail
source bench/results/h200-step/one-pass/lib.sh
begin r8
for t in perf gdb nsys; do echo "$t: $(command -v $t || echo none)"; done | tee $o/tools.txt
cat /proc/sys/kernel/perf_event_paranoid 2>/dev/null | sed 's/^/perf_event_paranoid /' | tee -a $o/tools.txt
step_tests 120
room 150 gpu_ipc_check && timeout 150 python3 tests/python/gpu_ipc_check.py --fp4qd $b/bin/fp4qd \
  --out $o/ipc --steps 100 > $o/gpu_ipc_check.txt 2>&1
echo "gpu_ipc_check rc=$?"; tail -1 $o/gpu_ipc_check.txt
report() {  # report NAME: perf's flat profile and its call graph of $o/NAME.perf
  perf report -i $o/$1.perf --stdio --no-children --percent-limit 0.4 --sort comm,dso,sym \
    -g none > $o/$1-flat.txt 2>&1
  perf report -i $o/$1.perf --stdio --no-children --percent-limit 2 --sort comm,sym \
    -g caller,0.5,callee --max-stack 24 > $o/$1-graph.txt 2>&1
  rm -f $o/$1.perf; head -45 $o/$1-flat.txt | grep -v "^#" | grep -v "^$" | head -30
}
if command -v perf > /dev/null && room 60 "perf fp4qd"; then
  start_fp4qd 4200
  timeout 40 $S --model gpt2-small --iters 12000 --one-pass --json $o/cpp-gpt2-prof.json \
    > $o/cpp-gpt2-prof.log 2>&1 &
  bp=$!; sleep 5
  timeout 20 perf record -F 4999 -g -p $pid -o $o/fp4qd.perf -- sleep 4 > $o/perf-fp4qd.log 2>&1
  echo "perf fp4qd rc=$?"; wait $bp; echo "bench-step rc=$?"; tail -1 $o/cpp-gpt2-prof.log
  kill $pid; wait $pid
  report fp4qd
fi
export B=$b
if command -v perf > /dev/null && room 90 "perf python"; then
  SCALING=delayed ONE_PASS=1 MODES=gpt2 N=4000 PHASES=0 timeout 90 perf record -F 2999 -g \
    -o $o/py.perf -- python3 -X perf bench/results/h200-step/python-client/trainloop.py \
    > $o/phases-perf.txt 2>&1
  echo "perf python rc=$?"; grep -E "mode=|pre-send" $o/phases-perf.txt
  report py
fi
# The Python step's phases with the client sleeping in recv (SPIN_US=0) or busy-polling for the
# reply (SPIN_US), and with fp4qd's threads busy-polling too
phases sleep 0 ""
phases spin 3000 ""
phases spin-both 3000 "--fast_socket_spin_us=3000 --worker_spin_us=3000"
phases sleep-2 0 ""
room 150 trainer_step && timeout 150 python3 bench/trainer_step.py --fp4qd $b/bin/fp4qd \
  --models gpt2-small --behind-ms 0 --steps 100 --warmup 10 --json $o/trainer-step-gpt2.json \
  > $o/trainer-step-gpt2.txt 2>&1
echo "trainer_step rc=$?"; grep -E "row|delayed|foreach|floor|8192" $o/trainer-step-gpt2.txt | head -14
room 150 "trainer_step spin" && timeout 150 python3 bench/trainer_step.py --fp4qd $b/bin/fp4qd \
  --models gpt2-small --behind-ms 0 --steps 100 --warmup 10 --spin-us 3000 \
  --json $o/trainer-step-gpt2-spin.json > $o/trainer-step-gpt2-spin.txt 2>&1
echo "trainer_step spin rc=$?"; grep -E "delayed|foreach|8192" $o/trainer-step-gpt2-spin.txt | head -8
