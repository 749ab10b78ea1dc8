#!/usr/bin/env bash
# Device call: the gpu-tests suite, gpu_ipc_check.py and the train loop at batch 256 (repository root, .bundle carried).
set -uo pipefail
bash .bundle/run.sh gpu-tests > $OUT/gpu-tests-console.txt 2>&1; echo "gpu-tests rc=$?"
tail -5 $OUT/summary.txt
source bench/results/h200-step/overlap/env.sh
nvidia-smi --query-gpu=name,driver_version,uuid --format=csv,noheader | tee $o/gpu.txt
echo "commit $FP4Q_COMMIT" | tee -a $o/gpu.txt
timeout 200 python3 tests/python/gpu_ipc_check.py --fp4qd "$b/bin/fp4qd" --out $o/gpu_ipc_check --steps 200 > $o/gpu_ipc_check.log 2>&1
echo "gpu_ipc_check rc=$?"; grep -E "FAIL|passed" $o/gpu_ipc_check.log | cut -c1-300; grep optim_overlap $o/gpu_ipc_check.log | cut -c1-200
timeout 200 python3 bench/train_loop.py --fp4qd "$b/bin/fp4qd" --rounds 7 --batch 256 \
  --out $o/train-loop-b256.json 2>&1 | tee $o/train-loop-b256.txt | tail -8
cd $OUT && tar czf r.tgz r && rm -rf r
