# The GPT-2-shaped fp4q.optim.SGD step over the fast socket, N times, with the time of each client phase
# (timeline-*.txt). py-spy ran it without the phase timers (pyspy-*.txt). Environment: B (an
# unpacked .bundle: bin/fp4qd), LD_LIBRARY_PATH, FP4Q_CUDA_MODULE, FP4Q_PROTO_DESCRIPTOR; run
# from the repository root.
import os, statistics, subprocess, sys, time
sys.path.insert(0, os.path.join(os.getcwd(), "client", "python"))
import torch, fp4q
B = os.environ["B"]
sock, fast = "/tmp/py.sock", "/tmp/py.fast"
for p in (sock, fast):
    if os.path.exists(p): os.unlink(p)
srv = subprocess.Popen([B + "/bin/fp4qd", "--backend", "cuda", "--allow_cuda_ipc", "--unix_socket", sock,
                        "--fast_socket", fast, "--listen", "127.0.0.1:0", "--metrics_listen=", "--log_format", "text"],
                       stdout=subprocess.PIPE, stderr=open("/tmp/pyfp4qd.log", "w"), text=True)
for line in srv.stdout:
    if "listening" in line: break
shapes = []
for _ in range(12): shapes += [(768, 2304), (768, 768), (768, 3072), (3072, 768)]
shapes += [(50257, 768), (1024, 768)]
n = sum(r * c for r, c in shapes)
flat = (torch.randn(n, device="cuda") * 0.02).to(torch.bfloat16)
gflat = (torch.randn(n, device="cuda") * 0.01).to(torch.bfloat16)
params, off = [], 0
for r, c in shapes:
    p = torch.nn.Parameter(flat[off:off + r * c].view(r, c))
    p.grad = gflat[off:off + r * c].view(r, c)
    params.append(p); off += r * c
c = fp4q.Client("unix://" + sock, fast_socket=fast)
opt = fp4q.optim.SGD(params, lr=1e-4, client=c)
hdr = []
orig = opt._send
def send(*a, **k):
    r = orig(*a, **k); hdr.append(r.header); return r
opt._send = send
import collections
import fp4q._fast_socket as _fs, fp4q._requests as _rq, fp4q._regions as _rg, fp4q._optim_step as _os
spent = collections.defaultdict(float)
def timed(owner, name, label):
    f = getattr(owner, name)
    def w(*a, **k):
        t = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            spent[label] += time.perf_counter() - t
    setattr(owner, name, w)
timed(_os.StepMixin, "_items", "items")
timed(_os.StepMixin, "_hyper_for_step", "hyper")
timed(_rq, "_step_plan_key", "key")
timed(_rg.Transfer, "before_send", "before_send")
timed(_rg.Regions, "plan_valid", "plan_valid")
timed(_fs.FastSocket, "frame", "frame")
marks = []
_orig_ex = _fs.FastSocket._exchange
def _ex(self, *a, **k):
    t1 = time.perf_counter()
    try:
        return _orig_ex(self, *a, **k)
    finally:
        marks.append((t1, time.perf_counter()))
_fs.FastSocket._exchange = _ex
N = int(os.environ.get("N", "300"))
ws, pre, wire, post = [], [], [], []
for i in range(N + 20):
    torch.cuda.synchronize(); t0 = time.perf_counter(); opt.step(); t3 = time.perf_counter(); torch.cuda.synchronize()
    ws.append(t3 - t0)
    t1, t2 = marks[-1]
    pre.append(t1 - t0); wire.append(t2 - t1); post.append(t3 - t2)
ws = ws[20:]; h = hdr[20:]
med = lambda v: statistics.median(v[20:]) * 1e6
print("per step (mean): " + ", ".join("%s %.1f us" % (k, v / (N + 20) * 1e6) for k, v in spent.items()))
print("pre-send %.1f us, exchange (send..recv) %.1f us, after %.1f us" % (med(pre), med(wire), med(post)))
print("python step p50 %.1f us; server %.1f kernel %.1f" % (statistics.median(ws) * 1e6,
      statistics.median(x.server_micros for x in h), statistics.median(x.kernel_micros for x in h)))
srv.terminate(); srv.wait()
