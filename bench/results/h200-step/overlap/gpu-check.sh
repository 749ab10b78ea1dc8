#!/usr/bin/env bash
# Device call: tests/python/gpu_ipc_check.py against the bundle's fp4qd (run from the repository root, .bundle carried).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
nvidia-smi --query-gpu=name,driver_version,uuid --format=csv,noheader | tee $o/gpu.txt
echo "commit $FP4Q_COMMIT" | tee -a $o/gpu.txt
timeout 200 python3 tests/python/gpu_ipc_check.py --fp4qd "$b/bin/fp4qd" --out $o/gpu_ipc_check --steps 200 > $o/gpu_ipc_check.log 2>&1
echo "gpu_ipc_check rc=$?"; grep -E "PASS|FAIL|passed" $o/gpu_ipc_check.log | cut -c1-300
cd $OUT && tar czf r.tgz r && rm -rf r
