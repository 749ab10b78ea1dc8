# One device call (repository root, .bundle carried): Nsight Compute on the GPT-2-shaped
# delayed check + apply with the lean SGD kernel (time, DRAM, issue, occupancy, instructions),
# then tests/python/gpu_ipc_check.py (fp4q.optim by CUDA IPC against the inline path).
set -x
source bench/results/h200-step/overlap/env.sh
nvidia-smi -L > $o/gpu.txt
timeout 200 ncu --clock-control none --kernel-name regex:Step --launch-count 8 \
  --section SpeedOfLight --section LaunchStats --section Occupancy --section SchedulerStats \
  --metrics gpu__time_duration.sum,sm__inst_executed.sum,smsp__inst_executed.sum \
  $b/bin/fp4q_bench --only "step check + apply, SGD + EF, delayed" --iters 3 --out /tmp/x.json \
  > $o/ncu.txt 2>&1; echo "rc=$?" >> $o/ncu.txt
grep -E "Step[A-Za-z]*Kernel|Duration|DRAM Throughput|Executed Ipc A|Issue Slots Busy|inst_executed.sum|Registers Per|Achieved Occupancy|Block Limit Registers|Grid Size" $o/ncu.txt | head -80
timeout 150 python3 tests/python/gpu_ipc_check.py --fp4qd $b/bin/fp4qd --out $o/gpu_ipc_check --steps 100 \
  > $o/gpu_ipc_check.txt 2>&1
echo "rc=$?" >> $o/gpu_ipc_check.txt; tail -5 $o/gpu_ipc_check.txt
cd $OUT && tar czf r.tgz r && rm -rf r
