#!/usr/bin/env bash
# Device call: the train suite model's forward + backward alone, then bench/train_loop.py at batch 64 and 256.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
nvidia-smi --query-gpu=name,driver_version,uuid --format=csv,noheader | tee $o/gpu.txt
# GPU time of one iteration's forward+backward alone at each batch (is the loop GPU- or CPU-bound?)
python3 - <<'PY' 2>&1 | tee $o/fwd-bwd.txt
import sys, time, torch
sys.path.insert(0, "train")
from fp4q_train import model as M
cfg = M.Config(vocab_size=256, block_size=128, layers=4, d_model=384, heads=6)
m = M.Transformer(cfg).cuda()
for batch in (64, 256):
    x = torch.randint(0, 256, (batch, 129), device="cuda")
    def it():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            lg = m(x[:, :-1])
        torch.nn.functional.cross_entropy(lg.float().reshape(-1, 256), x[:, 1:].reshape(-1)).backward()
    for _ in range(10): it()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter(); s.record()
    for _ in range(50): it()
    e.record(); torch.cuda.synchronize(); wall = (time.perf_counter() - t0) / 50
    # GPU busy time: the same work queued behind a sleep, so the host is far ahead
    torch.cuda._sleep(200_000_000); s.record()
    for _ in range(50): it()
    e.record(); torch.cuda.synchronize()
    print("batch %d: forward+backward %.3f ms/iteration in a loop; GPU time %.3f ms (work queued ahead)" % (batch, wall * 1e3, s.elapsed_time(e) / 50))
PY
for batch in 64 256; do
  timeout 200 python3 bench/train_loop.py --fp4qd "$b/bin/fp4qd" --rounds 7 --batch $batch \
    --out $o/train-loop-b$batch.json 2>&1 | tee $o/train-loop-b$batch.txt | tail -4
done
cd $OUT && tar czf r.tgz r && rm -rf r
