#!/usr/bin/env python3
"""The user's job: one optimizer step of a whole model whose weights fp4qd stores in NVFP4.

    # H200: fp4qd started by the benchmark (or --server/--fast-socket for a running one)
    python3 bench/trainer_step.py --fp4qd build/bin/fp4qd --json out.json
    # here: the CPU dry run (tiny shapes, inline tensors, a few steps), what ctest runs
    python3 bench/trainer_step.py --dry-run --fp4qd build-py/bin/fp4qd --json dry.json

Models (the parameters of their linear layers, as [rows, cols]; bf16 params and bf16 gradients
on the GPU, each model's tensors views of one flat params buffer and one flat grads buffer, so
CUDA IPC registers two allocations; --layout tensors: each a tensor of its own, as an
nn.Module's, so the large ones are allocations of their own):
  gpt2-small   12 x ([768, 2304], [768, 768], [768, 3072], [3072, 768]) + [50257, 768] +
               [1024, 768]: 50 matrices, 124,318,464 parameters
  llama3-8b    --llama-layers (default 32) x (q [4096, 4096], k [1024, 4096], v [1024, 4096],
               o [4096, 4096], gate [14336, 4096], up [14336, 4096], down [4096, 14336]):
               218,103,808 parameters a layer, 6.98e9 for 32
Rows, each timed over --steps steps after --warmup, median and p90 of the wall time of one
optimizer step (torch.cuda.synchronize() then perf_counter around it; random gradients, never
zeros), in the same run:
  fp4q SGD RTN+EF and fp4q AdamW (f32 moments, EF), each under current and delayed scaling,
  and SGD under delayed scaling with one_pass=True (each gradient read once; fp4qd keeps a
  second copy of each weight's state):
    fp4q.optim through
    fp4qd, gradients by CUDA IPC, DQ(W) written into the bf16 params by the server; over the
    fast socket and over gRPC. kernel_ms: the server's kernel time (ReplyHeader.kernel_micros);
    fp4qd_ms: the server's whole time for the call (ReplyHeader.server_micros): the rest of the
    wall is the client's and the transport's.
  bytes floor: bytes the update must move at the device copy bandwidth measured here with a
    large torch copy (read + write counted): SGD RTN+EF with bf16 grads and bf16 DQ out
    13.125 B/param (grad 2, DQ 2, f32 residual 4 + 4, codes 0.5 + 0.5, E4M3 scales 1/16 + 1/16);
    AdamW with f32 moments 29.125 (+ m and v, 4 + 4 each).
  torch foreach SGD / fused AdamW on fp32 master params: the step alone (fp32 grads), and the
    job as a user runs it (bf16 grads upcast into the masters' grads, the step, the masters
    copied back into the bf16 params).
  torch NVFP4 EF: this file's own in-process implementation of W <- Q(DQ(W) + r - lr g), r <-
    v - DQ(W) (1x16 blocks, E4M3 scales, the global scale from the amax of v, round to nearest,
    NUMERICS 1-5), under torch.compile where torch has it.
Also: one 8192x8192 SGD RTN+EF update through fp4qd, wall time vs its kernel time and fp4qd's
own time, under fp4q.optim's default current scaling and under delayed scaling in one pass; and (GPU,
--behind-ms) GPT-2's SGD step queued behind GPU work standing for the backward pass, with and
without ready signals, beside torch's step, as what each adds to the work's time.
Every row prints its ratio to the floor and to torch's optimizer; --json writes all of it with
the GPU name, torch version, commit and command. A row that does not fit in memory says so.
"""

import argparse
import contextlib
import json
import math
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "client", "python"))

import torch  # noqa: E402

import fp4q  # noqa: E402
from fp4qd_process import Fp4qd, add_server_args, commit  # noqa: E402

SGD_FLOOR_BYTES = 2 + 2 + 4 + 4 + 0.5 + 0.5 + 1 / 16 + 1 / 16   # 13.125
ADAMW_FLOOR_BYTES = SGD_FLOOR_BYTES + 16                          # 29.125


# ---------------------------------------------------------------------- models

def gpt2_shapes(dry):
    if dry:
        layer = [(64, 192), (64, 64), (64, 256), (256, 64)]
        return layer * 2 + [(500, 64), (128, 64)]
    layer = [(768, 2304), (768, 768), (768, 3072), (3072, 768)]
    return layer * 12 + [(50257, 768), (1024, 768)]


def llama_shapes(dry, layers):
    if dry:
        d, kv, ff = 128, 32, 256
    else:
        d, kv, ff = 4096, 1024, 14336
    layer = [(d, d), (kv, d), (kv, d), (d, d), (ff, d), (ff, d), (d, ff)]
    return layer * layers


class Model:
    """The parameters and their gradients. layout "flat": views of two flat buffers (one
    allocation each); "tensors": each parameter and each gradient a tensor of its own, as an
    nn.Module's parameters and autograd's gradients are (torch's caching allocator then puts
    the large ones in allocations of their own)."""

    def __init__(self, shapes, device, dtype, seed, layout="flat"):
        self.shapes = shapes
        self.numel = sum(r * c for r, c in shapes)
        g = torch.Generator(device=device).manual_seed(seed)
        if layout == "flat":
            self.flat = torch.empty(self.numel, dtype=dtype, device=device)
            self.flat_grad = torch.empty(self.numel, dtype=dtype, device=device)
        self.params = []
        off = 0
        for i, (r, c) in enumerate(shapes):
            n = r * c
            if layout == "flat":
                view = self.flat[off:off + n].view(r, c)
                grad = self.flat_grad[off:off + n].view(r, c)
            else:
                view = torch.empty(r, c, dtype=dtype, device=device)
                grad = torch.empty(r, c, dtype=dtype, device=device)
            view.normal_(0.0, 0.02, generator=g)
            p = torch.nn.Parameter(view)
            p.grad = grad
            self.params.append(("l%d" % i, p))
            off += n
        self.randomize_grads(seed + 1)

    def randomize_grads(self, seed):
        g = torch.Generator(device=self.params[0][1].device).manual_seed(seed)
        for _, p in self.params:
            p.grad.normal_(0.0, 1e-2, generator=g)


# ---------------------------------------------------------------------- timing

def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device, warmup, steps):
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return times


def time_steps(opt, client, device, warmup, steps):
    """summary() of `steps` calls of opt.step() after `warmup`, with the medians of fp4qd's
    kernel time and of its own time for the call (its reply header): the rest of the wall is
    the client's and the transport's."""
    kernels, server = [], []

    def step():
        opt.step()
        kernels.append(client.last_header.kernel_micros / 1e3)
        server.append(client.last_header.server_micros / 1e3)
    out = summary(timed(step, device, warmup, steps))
    out["kernel_median_ms"] = statistics.median(kernels[warmup:])
    out["fp4qd_median_ms"] = statistics.median(server[warmup:])
    return out


def summary(times_s):
    ms = sorted(t * 1e3 for t in times_s)
    p90 = ms[min(len(ms) - 1, int(math.ceil(0.9 * len(ms))) - 1)]
    return {"median_ms": statistics.median(ms), "p90_ms": p90, "samples": len(ms)}


def copy_bandwidth(device, dry):
    """Device copy bandwidth (bytes read + written per second) of a large torch copy."""
    n = (64 << 20) if dry else (2 << 30)  # bytes per buffer
    a = torch.empty(n // 4, dtype=torch.float32, device=device).normal_()
    b = torch.empty_like(a)
    times = timed(lambda: b.copy_(a), device, 3, 5 if dry else 20)
    return 2 * n / statistics.median(times)


@contextlib.contextmanager
def out_of_memory_as_row(row):
    """A row that runs out of device memory, or that fp4qd refuses (its state budget, IPC),
    says so in its "error" and the run goes on; any other failure stops the run."""
    try:
        yield
    except fp4q.Fp4qError as e:
        row["error"] = "fp4qd: %s" % str(e)[:300]
    except RuntimeError as e:  # torch.cuda.OutOfMemoryError is a RuntimeError
        if "out of memory" not in str(e).lower():
            raise
        row["error"] = "out of memory: %s" % str(e).splitlines()[0][:200]
    finally:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


# ---------------------------------------------------------------------- torch's optimizers

def torch_rows(model, kind, device, warmup, steps):
    """torch's optimizer on fp32 masters: the step alone, and with the bf16 grads upcast and
    the masters copied back into the bf16 params."""
    rows = []
    params = [p for _, p in model.params]
    step_only = {"name": "torch %s, fp32 master (step only)" % kind}
    job = {"name": "torch %s, fp32 master (bf16 grads in, bf16 params out)" % kind}
    with out_of_memory_as_row(step_only):
        masters = [p.detach().float() for p in params]
        for m, p in zip(masters, params):
            m.grad = p.grad.float()
        if kind == "foreach SGD":
            opt = torch.optim.SGD(masters, lr=1e-2, foreach=True)
        else:
            fused = device.type == "cuda"
            opt = (torch.optim.AdamW(masters, lr=1e-4, fused=True) if fused else
                   torch.optim.AdamW(masters, lr=1e-4, foreach=True))
            if not fused:  # fused AdamW is CUDA only
                for row in (step_only, job):
                    row["name"] = row["name"].replace("fused AdamW", "foreach AdamW")
        step_only.update(summary(timed(opt.step, device, warmup, steps)))
        grads = [p.grad for p in params]
        mgrads = [m.grad for m in masters]

        def full():
            torch._foreach_copy_(mgrads, grads) if hasattr(torch, "_foreach_copy_") else [
                a.copy_(b) for a, b in zip(mgrads, grads)]
            opt.step()
            with torch.no_grad():
                for p, m in zip(params, masters):
                    p.copy_(m)
        job.update(summary(timed(full, device, warmup, steps)))
    rows.extend([step_only, job])
    return rows


# ---------------------------------------------------------------------- torch NVFP4 EF

_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_FLT_MAX = torch.finfo(torch.float32).max


def _e4m3(u):
    """Round non-negative f32 values to E4M3 (nearest-even, saturating at 448), as f32."""
    u = torch.clamp(u, max=448.0)
    if hasattr(torch, "float8_e4m3fn"):
        return u.to(torch.float8_e4m3fn).float()
    mant, exp = torch.frexp(u)  # u = mant * 2^exp, mant in [0.5, 1)
    quantum = torch.ldexp(torch.ones_like(u), torch.clamp(exp - 4, min=-9))
    return torch.round(u / quantum) * quantum


def nvfp4_ef_update(codes, scales, s_dec, r, g, lr, out):
    """In-process W <- Q(DQ(W) + r - lr g) with error feedback; writes DQ(W') into `out`.
    codes: uint8 [rows, cols/2]; scales: f32 [rows, cols/16] (E4M3 values); s_dec: f32 [1]."""
    rows, half = codes.shape
    cols = half * 2
    lut = torch.tensor(_E2M1 + tuple(-v for v in _E2M1), device=codes.device)
    idx = torch.stack((codes & 15, codes >> 4), dim=-1).reshape(rows, cols).long()
    d = (lut[idx].view(rows, cols // 16, 16) * scales.unsqueeze(-1)).view(rows, cols) * s_dec
    v = (d - lr * g.float()) + r  # NUMERICS 5.1's order: x = RN(d - RN(lr g)), v = RN(x + r)
    amax = v.abs().amax()
    s_enc = torch.clamp(2688.0 / amax, max=_FLT_MAX)  # G2: 1 for amax 0 or Inf
    s_enc = torch.where((amax > 0) & torch.isfinite(amax) & (s_enc > 0), s_enc,
                        torch.ones_like(s_enc))
    new_dec = 1.0 / s_enc
    vb = v.view(rows, cols // 16, 16)
    sf = _e4m3(vb.abs().amax(-1) * (s_enc * (1.0 / 6.0)))
    inv = torch.clamp(1.0 / (sf * new_dec), max=_FLT_MAX)
    y = vb * inv.unsqueeze(-1)
    a = y.abs()
    mag = ((a > 0.25).int() + (a >= 0.75).int() + (a > 1.25).int() + (a >= 1.75).int() +
           (a > 2.5).int() + (a >= 3.5).int() + (a > 5.0).int())
    code = mag + 8 * torch.signbit(y).int()
    dq = (lut[code.long()] * sf.unsqueeze(-1)).view(rows, cols) * new_dec
    code = code.view(rows, cols)
    codes.copy_((code[:, 0::2] | (code[:, 1::2] << 4)).to(torch.uint8))
    scales.copy_(sf)
    s_dec.copy_(new_dec.reshape(1))
    r.copy_(v - dq)
    out.copy_(dq)


def torch_nvfp4_row(model, device, warmup, steps):
    row = {"name": "torch NVFP4 EF update, in-process"}
    with out_of_memory_as_row(row):
        fn = nvfp4_ef_update
        compiled = hasattr(torch, "compile") and device.type == "cuda"
        if compiled:
            fn = torch.compile(nvfp4_ef_update, dynamic=False)
        row["name"] += " (torch.compile)" if compiled else " (eager)"
        state = []
        for _, p in model.params:
            rows_, cols = p.shape
            state.append((torch.zeros(rows_, cols // 2, dtype=torch.uint8, device=device),
                          torch.ones(rows_, cols // 16, device=device),
                          torch.ones(1, device=device),
                          torch.zeros(rows_, cols, device=device), p))

        def step():
            with torch.no_grad():
                for codes, scales, s_dec, r, p in state:
                    fn(codes, scales, s_dec, r, p.grad, 1e-2, p.data)
        row.update(summary(timed(step, device, warmup, steps)))
    return row


# ---------------------------------------------------------------------- fp4q

DRY = False


def ipc_mode():
    return "require" if torch.cuda.is_available() and not DRY else "auto"


CONFIGS = [
    ("fp4q SGD RTN+EF, current scaling", "sgd", dict(scaling="current")),
    ("fp4q SGD RTN+EF, delayed scaling", "sgd", dict(scaling="delayed")),
    ("fp4q SGD RTN+EF, delayed scaling, one pass", "sgd", dict(scaling="delayed", one_pass=True)),
    ("fp4q AdamW f32 moments, EF", "adamw", dict(state_dtype="f32")),
    ("fp4q AdamW f32 moments, EF, delayed scaling", "adamw",
     dict(state_dtype="f32", scaling="delayed")),
]


@contextlib.contextmanager
def bench_client(server, fast, namespace):
    """A client of `server` in its own `namespace` (over the fast socket when `fast`), whose
    namespace is deleted and connection closed afterwards."""
    c = server.client(fast, namespace, ipc_mode())
    try:
        yield c
    finally:
        try:
            c.delete_namespace()
        except fp4q.Fp4qError:
            pass
        c.close()


def fp4q_row(server, model, label, kind, kw, fast, device, warmup, steps, tag):
    row = {"name": "%s, %s" % (label, "fast socket" if fast else "gRPC"),
           "floor_bytes_per_param": SGD_FLOOR_BYTES if kind == "sgd" else ADAMW_FLOOR_BYTES}
    ns = "bench-%s-%d" % (tag, os.getpid())
    with bench_client(server, fast, ns) as c:
        with out_of_memory_as_row(row):
            if kind == "sgd":
                opt = fp4q.optim.SGD(model.params, lr=1e-2, client=c, existing="replace", **kw)
            else:
                opt = fp4q.optim.AdamW(model.params, lr=1e-4, client=c, existing="replace", **kw)
            row.update(time_steps(opt, c, device, warmup, steps))
            if kw.get("one_pass"):
                # Steps fp4qd could not take in one pass (no room for the copy) ran in two.
                row["one_pass_steps"] = "%d of %d" % (opt.one_pass_steps, warmup + steps)
                if opt.one_pass_steps != warmup + steps:
                    row["two_pass_reasons"] = dict(opt.two_pass_reasons)
                    row["name"] += " [ran in two passes: %s]" % ", ".join(
                        "%s %d" % kv for kv in sorted(opt.two_pass_reasons.items()))
            row["stats"] = {k: v for k, v in c.stats.items() if k.startswith(("fast", "ipc",
                                                                              "inline"))}
            if row["stats"].get("ipc_fallbacks"):
                row["ipc_fallback_reasons"] = dict(c.ipc_reasons)
    return row


def model_section(name, shapes, server, args, device, bandwidth):
    dtype = torch.bfloat16
    model = Model(shapes, device, dtype, seed=1, layout=args.layout)
    n = model.numel
    print("\n== %s: %d matrices, %d parameters (%s layout)" % (name, len(shapes), n, args.layout),
          flush=True)
    rows = []
    for kind in ("foreach SGD", "fused AdamW"):
        rows.extend(torch_rows(model, kind, device, args.warmup, args.steps))
    rows.append(torch_nvfp4_row(model, device, args.warmup, args.steps))
    for label, kind, kw in CONFIGS:
        for fast in (True, False):
            rows.append(fp4q_row(server, model, label, kind, kw, fast, device, args.warmup,
                                 args.steps, name))
    floors = {"bytes floor, SGD RTN+EF (13.125 B/param)": SGD_FLOOR_BYTES,
              "bytes floor, AdamW f32 moments EF (29.125 B/param)": ADAMW_FLOOR_BYTES}
    for label, b in floors.items():
        rows.append({"name": label, "median_ms": n * b / bandwidth * 1e3, "p90_ms": None,
                     "bytes_per_param": b})
    ref = {"sgd": _find(rows, "torch foreach SGD, fp32 master (bf16"),
           "adamw": _find(rows, "torch fused AdamW, fp32 master (bf16") or
           _find(rows, "torch foreach AdamW, fp32 master (bf16")}
    for row in rows:
        if "median_ms" not in row:
            continue
        adam = "AdamW" in row["name"]
        floor_ms = n * (ADAMW_FLOOR_BYTES if adam else SGD_FLOOR_BYTES) / bandwidth * 1e3
        row["vs_floor"] = row["median_ms"] / floor_ms
        t = ref["adamw" if adam else "sgd"]
        row["vs_torch"] = row["median_ms"] / t["median_ms"] if t and "median_ms" in t else None
    del model
    return {"parameters": n, "matrices": len(shapes), "rows": rows}


def _find(rows, prefix):
    for row in rows:
        if row["name"].startswith(prefix) and "median_ms" in row:
            return row
    return None


# The single-weight rows: fp4q.optim.SGD's defaults (current scaling, two passes), and delayed
# scaling in one pass (the fastest a step of SGD + EF runs).
UPDATE_8192_MODES = (("current scaling", {}),
                     ("delayed scaling, one pass", {"scaling": "delayed", "one_pass": True}))


def update_8192(server, args, device, bandwidth):
    """One 8192x8192 SGD RTN+EF weight stepped alone, in each of UPDATE_8192_MODES: wall time
    against the server's kernel time and its own time (ReplyHeader)."""
    size = 256 if args.dry_run else 8192
    rows = []
    for mode, kw in UPDATE_8192_MODES:
        model = Model([(size, size)], device, torch.bfloat16, seed=3)
        out = {"shape": [size, size], "mode": mode}
        with bench_client(server, True, "bench-8192-%d" % os.getpid()) as c:
            with out_of_memory_as_row(out):
                opt = fp4q.optim.SGD(model.params, lr=1e-2, client=c, existing="replace", **kw)
                out.update(time_steps(opt, c, device, args.warmup, args.steps))
                out["wall_minus_kernel_ms"] = out["median_ms"] - out["kernel_median_ms"]
                out["floor_ms"] = size * size * SGD_FLOOR_BYTES / bandwidth * 1e3
                out["kernel_vs_floor"] = out["kernel_median_ms"] / out["floor_ms"]
                if kw.get("one_pass"):
                    out["one_pass_steps"] = opt.one_pass_steps
        del model
        rows.append(out)
    return rows


def print_table(name, section):
    print("\n%s (%d parameters)" % (name, section["parameters"]))
    print("%-68s %10s %10s %10s %10s %9s %9s" % ("row", "median ms", "p90 ms", "fp4qd ms",
                                                 "kernel ms", "x floor", "x torch"))
    for row in section["rows"]:
        if "error" in row:
            print("%-68s %s" % (row["name"], row["error"]))
            continue
        fmt = lambda v, f="%10.3f": (f % v) if v is not None else "%10s" % "-"  # noqa: E731
        print("%-68s %s %s %s %s %s %s" % (
            row["name"], fmt(row["median_ms"]), fmt(row.get("p90_ms")),
            fmt(row.get("fp4qd_median_ms")), fmt(row.get("kernel_median_ms")),
            fmt(row.get("vs_floor"), "%9.2f"),
            fmt(row.get("vs_torch"), "%9.2f")))


def gpu_busy(device, ms):
    """A function that queues about `ms` of GPU work (torch.cuda._sleep, calibrated here) on
    the current stream, standing for the backward pass a real loop queues before step()."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    cycles = 1 << 20
    torch.cuda._sleep(cycles)  # warm
    sync(device)
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    sync(device)
    per_ms = cycles / start.elapsed_time(end)
    n = int(per_ms * ms)
    return lambda: torch.cuda._sleep(n)


def behind_backward(server, args, device):
    """The step as a synchronous loop sees it: about --behind-ms of GPU work queued on the
    stream (the backward pass), then step(), then the GPU synchronized. "after the work" is the
    median wall time minus that of the GPU work alone, measured in the same run: what the step
    adds to an iteration. fp4q.optim.SGD (RTN + EF, current scaling, fast socket) with
    ready_signal=True (the step is sent while the work runs and its kernels queued behind a
    device-side wait) and False (step() waits for the work on the host first), and with
    overlap=True (step() returns once the step is sent; the stream waits on the device for the
    new weights, so "after the work" is what the step holds the stream), beside torch's
    foreach SGD on fp32 masters (the step alone)."""
    model = Model(gpt2_shapes(False), device, torch.bfloat16, seed=7)
    busy = gpu_busy(device, args.behind_ms)
    rows = []
    alone = summary(timed(busy, device, args.warmup, args.steps))
    rows.append(dict(name="GPU work alone (%.1f ms asked)" % args.behind_ms, **alone))
    params = [p for _, p in model.params]
    masters = [p.detach().float() for p in params]
    for m, p in zip(masters, params):
        m.grad = p.grad.float()
    topt = torch.optim.SGD(masters, lr=1e-2, foreach=True)
    rows.append(dict(name="torch foreach SGD, fp32 master (step only)",
                     **summary(timed(lambda: (busy(), topt.step()), device, args.warmup,
                                     args.steps))))
    masters = topt = None  # their memory back before fp4qd's weights are made
    for ready, overlap in ((True, False), (False, False), (True, True)):
        name = "fp4q SGD RTN+EF, fast socket, %s" % (
            "overlap=True" if overlap else "ready_signal=%s" % ready)
        with bench_client(server, True, "bench-behind-%d-%d-%d" % (ready, overlap,
                                                                   os.getpid())) as c:
            fopt = fp4q.optim.SGD(model.params, lr=1e-2, client=c, existing="replace",
                                  ready_signal=ready, overlap=overlap)
            row = dict(name=name, **summary(timed(lambda: (busy(), fopt.step()), device,
                                                  args.warmup, args.steps)))
            fopt.synchronize()
            r = fopt._ready_steps
            row["sent_with_ready_signal"] = r.sent if r is not None else 0
            row["sent_stream_idle"] = r.idle if r is not None else 0
            rows.append(row)
    for row in rows[1:]:
        row["after_work_ms"] = row["median_ms"] - alone["median_ms"]
    return {"behind_ms": args.behind_ms, "model": "gpt2-small", "rows": rows}


def profile_steps(server, args, device, path):
    """cProfile of the Python side of fp4q.optim.SGD.step on the GPT-2 shapes (fast socket):
    the functions by own time, then by cumulative time, into `path`."""
    import cProfile
    import io
    import pstats
    model = Model(gpt2_shapes(args.dry_run), device, torch.bfloat16, seed=5)
    with bench_client(server, True, "bench-profile-%d" % os.getpid()) as c:
        opt = fp4q.optim.SGD(model.params, lr=1e-2, client=c, existing="replace")
        for _ in range(args.warmup):
            opt.step()
        prof = cProfile.Profile()
        sync(device)
        t0 = time.perf_counter()
        prof.enable()
        for _ in range(args.steps):
            opt.step()
        prof.disable()
        sync(device)
        wall = (time.perf_counter() - t0) / args.steps * 1e3
        buf = io.StringIO()
        buf.write("fp4q.optim.SGD.step, GPT-2 shapes, fast socket, %d steps under cProfile: "
                  "%.3f ms a step (profiled)\n" % (args.steps, wall))
        st = pstats.Stats(prof, stream=buf)
        st.sort_stats("tottime").print_stats(40)
        st.sort_stats("cumulative").print_stats(40)
        with open(path, "w") as f:
            f.write(buf.getvalue())
        print("wrote %s (%.3f ms a profiled step)" % (path, wall))


def main(argv=None):
    global DRY
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dry-run", action="store_true",
                    help="CPU, tiny shapes, inline tensors, 1 warmup + 3 steps")
    add_server_args(ap, 130 << 30)
    ap.add_argument("--models", default="gpt2-small,llama3-8b")
    ap.add_argument("--llama-layers", type=int, default=32)
    ap.add_argument("--layout", choices=("flat", "tensors"), default="flat",
                    help="flat (default): every parameter and gradient a view of two flat "
                         "buffers; tensors: each its own tensor, as an nn.Module's (one CUDA "
                         "allocation per large tensor, which the client's per-step checks visit)")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--behind-ms", type=float, default=5.0,
                    help="GPU: also time GPT-2's step queued behind this much GPU work (the "
                         "backward pass), with and without ready signals (0: skip)")
    ap.add_argument("--profile", metavar="PATH",
                    help="also profile the Python side of GPT-2-shaped fp4q.optim.SGD steps "
                         "(cProfile) into PATH")
    args = ap.parse_args(argv)
    DRY = args.dry_run
    if args.dry_run:
        device = torch.device("cpu")
        args.steps, args.warmup = min(args.steps, 3), min(args.warmup, 1)
        args.state_budget_bytes = min(args.state_budget_bytes, 1 << 30)
        args.llama_layers = min(args.llama_layers, 2)
    else:
        if not torch.cuda.is_available():
            ap.error("no CUDA device: run with --dry-run here")
        device = torch.device("cuda", torch.cuda.current_device())
    if not args.fp4qd and not args.server:
        ap.error("give --fp4qd (started here) or --server (and --fast-socket)")
    torch.manual_seed(0)
    server = Fp4qd(args, cuda=device.type == "cuda")
    try:
        bandwidth = copy_bandwidth(device, args.dry_run)
        print("copy bandwidth (read + write): %.1f GB/s" % (bandwidth / 1e9), flush=True)
        print("fast socket client: %s" % (
            "busy-polls each reply %d us" % args.spin_us if args.spin_us else
            "sleeps for every reply" if args.spin_us == 0 else
            "its default (busy-polls step replies expected within 2 ms)"), flush=True)
        results = {
            "command": [sys.executable] + sys.argv if argv is None else ["trainer_step.py"] + argv,
            "fp4qd_command": server.command, "commit": commit(), "torch": torch.__version__,
            "device": (torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"),
            "dry_run": args.dry_run, "steps": args.steps, "warmup": args.warmup,
            "client_spin_us": args.spin_us,
            "copy_bandwidth_bytes_per_s": bandwidth, "layout": args.layout, "models": {}}
        wanted = [m.strip() for m in args.models.split(",") if m.strip()]
        for name in wanted:
            if name == "gpt2-small":
                shapes = gpt2_shapes(args.dry_run)
            elif name == "llama3-8b":
                shapes = llama_shapes(args.dry_run, args.llama_layers)
            else:
                ap.error("--models: %r is not gpt2-small or llama3-8b" % name)
            results["models"][name] = model_section(name, shapes, server, args, device,
                                                    bandwidth)
            print_table(name, results["models"][name])
        if args.behind_ms > 0 and device.type == "cuda":
            b = results["behind_backward"] = behind_backward(server, args, device)
            print("\nGPT-2's step behind %.1f ms of GPU work (median ms; after the work: what "
                  "the step adds)" % b["behind_ms"])
            for row in b["rows"]:
                print("%-68s %10.3f %s" % (row["name"], row["median_ms"], "" if
                                           "after_work_ms" not in row else
                                           "after the work %.3f" % row["after_work_ms"]))
        if args.profile:
            profile_steps(server, args, device, args.profile)
        results["update_8192"] = update_8192(server, args, device, bandwidth)
        for u in results["update_8192"]:
            what = "one %dx%d SGD RTN+EF update, %s" % (u["shape"][0], u["shape"][1], u["mode"])
            if "error" in u:
                print("\n%s: %s" % (what, u["error"]))
                continue
            print("\n%s, over the fast socket: wall %.3f ms (p90 %.3f), kernel %.3f ms, fp4qd "
                  "%.3f ms, wall - kernel %.3f ms, kernel / floor %.2f" % (
                      what, u["median_ms"], u["p90_ms"], u["kernel_median_ms"],
                      u["fp4qd_median_ms"], u["wall_minus_kernel_ms"], u["kernel_vs_floor"]))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)
            print("wrote %s" % args.json)
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
