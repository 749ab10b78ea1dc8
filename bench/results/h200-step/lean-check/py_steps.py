"""GPT-2-shaped fp4q.optim.SGD steps against a running fp4qd for --seconds: wall per step, the
reply headers, and the client's phases (time.perf_counter around step())."""
import argparse, json, os, statistics, sys, time
sys.path.insert(0, os.path.join(os.getcwd(), "bench"))
import torch
import fp4q, fp4q.optim
from trainer_step import Model, gpt2_shapes
ap = argparse.ArgumentParser()
ap.add_argument("--server"); ap.add_argument("--fast"); ap.add_argument("--seconds", type=float, default=4)
ap.add_argument("--scaling", default="delayed"); ap.add_argument("--out")
a = ap.parse_args()
dev = torch.device("cuda", 0)
model = Model(gpt2_shapes(False), dev, torch.bfloat16, seed=5)
c = fp4q.Client(a.server, fast_socket=a.fast, namespace="pysteps-%d" % os.getpid(), max_regions=1024,
                timeout=600, ipc="require")
opt = fp4q.optim.SGD(model.params, lr=1e-2, client=c, existing="replace", scaling=a.scaling)
hdr = []
chk = opt._check_reply_epoch
def rec(h, rpc):
    if rpc == "Step" and h is not None: hdr.append((h.kernel_micros, h.server_micros, h.queue_micros))
    return chk(h, rpc)
opt._check_reply_epoch = rec
for _ in range(20): opt.step()
torch.cuda.synchronize()
walls = []; hdr.clear(); open('/tmp/pysteps.go', 'w').close()
end = time.perf_counter() + a.seconds
while time.perf_counter() < end:
    t = time.perf_counter(); opt.step(); walls.append((time.perf_counter() - t) * 1e6)
del opt._check_reply_epoch
r = {"steps": len(walls), "wall_p50_us": statistics.median(walls),
     "kernel_p50_us": statistics.median(x[0] for x in hdr), "server_p50_us": statistics.median(x[1] for x in hdr),
     "queue_p50_us": statistics.median(x[2] for x in hdr), "scaling": a.scaling}
print(json.dumps(r))
if a.out: json.dump(r, open(a.out, "w"))
c.delete_namespace(); c.close()
