# The train suite's model (4 layers, d_model 384) in a real loop: forward, backward, then the
# stored weights' fp4q.optim.SGD step (momentum 0.9, RTN + EF) timed alone, with the client's
# phases and stats; MODES: none / zero (zero_grad(set_to_none=True/False)), fixed (fixed
# gradients, no backward: steps back to back), sleep (fixed gradients, the host idle GAP_MS
# before each step), busy (fixed gradients, the GPU kept busy GAP_MS by this process before each
# step, then synchronized), gpt2 (the GPT-2-shaped matrices, fixed gradients), single (one
# 8192x8192 matrix, fixed gradients).
# FP4QD_ARGS: more fp4qd flags (space-separated). SPIN_US: the client's fast_socket_spin_us (unset: its default).
# HEADS_UP=0: fp4q.Client(fast_socket_heads_up=False).
# Env: B (bundle dir), LD_LIBRARY_PATH, FP4Q_CUDA_MODULE, FP4Q_PROTO_DESCRIPTOR. Run from repo root.
# SCALING: fp4q.optim's scaling (default: its own); ONE_PASS=1: one_pass=True (SCALING=delayed). PROFILE=1: also a cProfile of opt.step() over steps 20.. (PHASES=0: without the phase timers).
import collections, os, statistics, subprocess, sys, time
sys.path.insert(0, os.environ.get("CLIENT") or os.path.join(os.getcwd(), "client", "python"))
sys.path.insert(0, os.path.join(os.getcwd(), "train"))
import torch, fp4q, fp4q.optim
from fp4q_train import model as M
import fp4q._fast_socket as _fs, fp4q._requests as _rq, fp4q._regions as _rg, fp4q._optim_step as _os
import fp4q._transport as _tp, fp4q._step_plans as _sp

B = os.environ["B"]
sock, fast = "/tmp/tl.sock", "/tmp/tl.fast"
for p in (sock, fast):
    if os.path.exists(p): os.unlink(p)
srv = subprocess.Popen([B + "/bin/fp4qd", "--backend", "cuda", "--allow_cuda_ipc", "--unix_socket", sock,
                        "--fast_socket", fast, "--listen", "127.0.0.1:0", "--metrics_listen=", "--log_format", "text"] + os.environ.get("FP4QD_ARGS", "").split(),
                       stdout=subprocess.PIPE, stderr=open("/tmp/tlfp4qd.log", "w"), text=True)
for line in srv.stdout:
    if "listening" in line: break

spent = collections.defaultdict(float)
calls = collections.Counter()
def timed(owner, name, label):
    f = getattr(owner, name, None)
    if f is None:
        return
    def w(*a, **k):
        t = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            spent[label] += time.perf_counter() - t
            calls[label] += 1
    setattr(owner, name, w)
marks = []
_orig_ex = _fs.FastSocket._exchange
def _ex(self, *a, **k):
    t1 = time.perf_counter()
    try:
        return _orig_ex(self, *a, **k)
    finally:
        marks.append((t1, time.perf_counter()))
_fs.FastSocket._exchange = _ex
if os.environ.get("PHASES", "1") == "1":
    timed(_os.StepMixin, "_items", "items")
    timed(_os.StepMixin, "_step_key", "step_key")
    timed(_os.StepMixin, "_hyper_for_step", "hyper")
    timed(_rq, "_step_plan_key", "key")
    timed(_rg.Transfer, "before_send", "before_send")
    timed(_rg.Regions, "plan_valid", "plan_valid")
    timed(_rq.StepPlans, "resliced", "resliced")
    timed(_rg.Transfer, "input", "input")
    timed(_fs.FastSocket, "frame", "frame")
    timed(_tp.Transport, "heads_up", "heads_up")
    timed(_fs.FastSocket, "_take_idle", "take_idle")
    timed(_sp.StepHeads, "encode", "head")
entered = []
_orig_check_epoch = _os.StepMixin._check_epoch
def _check_epoch(self):
    entered.append(time.perf_counter())  # _step's first call after the heads-up
    return _orig_check_epoch(self)
_os.StepMixin._check_epoch = _check_epoch

kw = {} if os.environ.get("HEADS_UP", "1") == "1" else {"fast_socket_heads_up": False}
c = fp4q.Client("unix://" + sock, fast_socket=fast,
                fast_socket_spin_us=int(os.environ["SPIN_US"]) if os.environ.get("SPIN_US") else None, **kw)
cfg = M.Config(vocab_size=256, block_size=128, layers=4, d_model=384, heads=6)
N = int(os.environ.get("N", "200"))
GAP = float(os.environ.get("GAP_MS", "7")) / 1e3

def gap(mode, mats):
    """The time a worker's forward and backward take: the host idle, or the GPU busy."""
    if mode == "sleep":
        time.sleep(GAP)
    elif mode == "busy":
        t = time.perf_counter()
        while time.perf_counter() - t < GAP:
            for _ in range(8):
                torch.mm(mats[0], mats[1], out=mats[2])
            torch.cuda.synchronize()

def gpt2_params(single=False):
    shapes = []
    for _ in range(12): shapes += [(768, 2304), (768, 768), (768, 3072), (3072, 768)]
    shapes += [(50257, 768), (1024, 768)]
    if single:
        shapes = [(8192, 8192)]
    n = sum(r * c for r, c in shapes)
    flat = (torch.randn(n, device="cuda") * 0.02).to(torch.bfloat16)
    gflat = (torch.randn(n, device="cuda") * 0.01).to(torch.bfloat16)
    params, off = [], 0
    for i, (r, c) in enumerate(shapes):
        p = torch.nn.Parameter(flat[off:off + r * c].view(r, c))
        p.grad = gflat[off:off + r * c].view(r, c)
        params.append(("w%d" % i, p)); off += r * c
    return params

def run(mode, prefix):
    torch.manual_seed(1)
    if mode in ("gpt2", "single"):
        stored = gpt2_params(single=mode == "single")
        model = None
    else:
        model = M.Transformer(cfg).cuda()
        store = set(M.block_linear_names(model))
        stored = [(n, p) for n, p in model.named_parameters() if n in store]
    kw = dict(lr=1e-4) if mode in ("gpt2", "single") else dict(lr=0.01, momentum=0.9)
    if os.environ.get("SCALING"):
        kw["scaling"] = os.environ["SCALING"]
    if os.environ.get("ONE_PASS") == "1":
        kw["one_pass"] = True
    opt = fp4q.optim.SGD([{"params": stored, "weight_decay": 0.0}], error_feedback=True,
                         client=c, name_prefix=prefix, **kw)
    hdr = []
    orig = opt._send
    def send(*a, **k):
        r = orig(*a, **k); hdr.append(r.header); return r
    opt._send = send
    x = torch.randint(0, 256, (64, 128), device="cuda")
    y = torch.randint(0, 256, (64, 128), device="cuda")
    spent.clear(); calls.clear()
    stats0 = dict(c.stats)
    ws, fb, pre, post, xch, enter = [], [], [], [], [], []
    mats = [torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    for i in range(N):
        gap(mode, mats)
        torch.cuda.synchronize(); t0 = time.perf_counter()
        if mode in ("none", "zero") or i == 0 and model is not None:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = model(x)
            loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, 256), y.reshape(-1))
            loss.backward()
        if mode == "reslice":
            if i == 0:
                grads = [p.grad for _, p in stored]
                total = sum(g.numel() for g in grads)
                halves = torch.empty(7 * total, dtype=grads[0].dtype, device="cuda")
                views, off = [[] for _ in range(7)], 0
                for g in grads:
                    for h in range(7):
                        v = halves[h * total + off:h * total + off + g.numel()].view(g.shape)
                        v.copy_(g)
                        views[h].append(v)
                    off += g.numel()
            for (_, p), v in zip(stored, views[i % 7]):
                p.grad = v
        torch.cuda.synchronize(); t1 = time.perf_counter()
        if globals().get("PROF") is not None and i >= 20:
            PROF.enable()
        opt.step()
        if globals().get("PROF") is not None and i >= 20:
            PROF.disable()
        t15 = time.perf_counter()
        torch.cuda.synchronize(); t2 = time.perf_counter()
        a, b = marks[-1]
        pre.append(a - t1); post.append(t15 - b); xch.append(b - a)
        enter.append(entered[-1] - t1 if entered else 0.0)
        if mode == "none":
            opt.zero_grad(set_to_none=True)
        elif mode == "zero":
            opt.zero_grad(set_to_none=False)
        ws.append(t2 - t1); fb.append(t1 - t0)
    skip = 20
    stats = {k: v - stats0.get(k, 0) for k, v in c.stats.items() if v - stats0.get(k, 0)}
    print("mode=%s: step p50 %.1f us (p90 %.1f), fwd+bwd p50 %.1f us; server p50 %.1f kernel %.1f queue %.1f; items %d" % (
        mode, statistics.median(ws[skip:]) * 1e6, sorted(ws[skip:])[int(0.9 * (N - skip))] * 1e6,
        statistics.median(fb[skip:]) * 1e6,
        statistics.median(h.server_micros for h in hdr[skip:]), statistics.median(h.kernel_micros for h in hdr[skip:]),
        statistics.median(h.queue_micros for h in hdr[skip:]), len(stored)))
    print("   pre-send p50 %.1f us, exchange p50 %.1f us, after-reply p50 %.1f us" % (statistics.median(pre[skip:]) * 1e6, statistics.median(xch[skip:]) * 1e6, statistics.median(post[skip:]) * 1e6))
    print("   pre-send: step() to the epoch check (after the heads-up) p50 %.1f us"
          % (statistics.median(enter[skip:]) * 1e6))
    print("   per step (mean): " + ", ".join("%s %.1f us (%d calls)" % (k, v / N * 1e6, calls[k]) for k, v in spent.items()))
    print("   stats: %s" % stats)
    sys.stdout.flush()

import cProfile, pstats, io
for mode in os.environ.get("MODES", "fixed,zero,none").split(","):
    PROF = cProfile.Profile() if os.environ.get("PROFILE") == "1" else None
    run(mode, "tl_%s_" % mode)
    if globals().get("PROF") is not None:
        out = io.StringIO()
        st = pstats.Stats(PROF, stream=out)
        st.sort_stats("tottime").print_stats(35)
        st.sort_stats("cumulative").print_stats(45)
        print(out.getvalue())
srv.terminate(); srv.wait()
