# GPT-2-shaped fp4q.optim.SGD delayed step through fp4qd: configs alternated (spin), cProfile.
import argparse, os, sys, time, statistics, json
sys.path.insert(0, os.path.join(os.getcwd(), "bench"))
import torch, fp4q, fp4q.optim
from trainer_step import Model, gpt2_shapes, timed, summary
from fp4qd_process import Fp4qd
ap = argparse.ArgumentParser()
ap.add_argument("--fp4qd"); ap.add_argument("--steps", type=int, default=300)
ap.add_argument("--profile"); ap.add_argument("--label", default="")
ap.add_argument("--scaling", default="delayed")
ap.add_argument("--fp4qd-arg", action="append", default=[])
ap.add_argument("--spin-us", type=int, default=0)
a = ap.parse_args()
a.server = a.fast_socket = None; a.state_budget_bytes = 60 << 30
dev = torch.device("cuda")
srv = Fp4qd(a, cuda=True)
model = Model(gpt2_shapes(False), dev, torch.bfloat16, seed=1)
c = srv.client(True, "g-%d" % os.getpid(), "require")
opt = fp4q.optim.SGD(model.params, lr=1e-2, client=c, scaling=a.scaling)
k, s = [], []
def step():
    opt.step(); k.append(c.last_header.kernel_micros); s.append(c.last_header.server_micros)
t = timed(step, dev, 20, a.steps)
r = summary(t); r["kernel_us"] = statistics.median(k[20:]); r["server_us"] = statistics.median(s[20:])
r["label"] = a.label; r["stats"] = dict(c.stats)
print(json.dumps(r), flush=True)
if a.profile:
    import cProfile, pstats, io
    pr = cProfile.Profile(); pr.enable()
    for _ in range(300): opt.step()
    pr.disable(); buf = io.StringIO()
    st = pstats.Stats(pr, stream=buf); st.sort_stats("tottime").print_stats(45)
    st.sort_stats("cumulative").print_stats(45)
    open(a.profile, "w").write(buf.getvalue())
c.close(); srv.stop()
