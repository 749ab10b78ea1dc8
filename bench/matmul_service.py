#!/usr/bin/env python3
"""The user's GEMM: C = A * B^T through fp4qd's Matmul, beside torch's bf16 matmul in the same run.

    # H200: fp4qd started by the benchmark (or --server/--fast-socket for a running one)
    python3 bench/matmul_service.py --fp4qd build/bin/fp4qd --json out.json
    # here: the CPU dry run (small shapes, inline tensors, a few calls), what ctest runs
    python3 bench/matmul_service.py --dry-run --fp4qd build-py/bin/fp4qd --json dry.json

For each M of --m (N = --n, K = --k; bf16 A [M, K] and B [N, K] of random values, never zeros),
over the fast socket (and gRPC with --grpc), each timed over --iters calls after --warmup, p50
and p90 of the wall time of one call (torch.cuda.synchronize() before it: the inputs are ready,
as the API requires; perf_counter around it) and the server's kernel time
(ReplyHeader.kernel_micros):
  matmul, both quantized   client.matmul(qa, qb, out=c): A and B quantized beforehand (NVFP4
                           1x16, RTN) into the client's CUDA tensors, sent by CUDA IPC; C
                           written by the server into the client's bf16 tensor.
  matmul, B stored         client.matmul(qa, name, out=c): B a weight fp4qd stores
                           (CreateWeight), A as above.
  matmul, A dense, B stored  client.matmul(fp4q.DenseOperand(a), name, out=c): A sent as bf16,
                           quantized by fp4qd in the same call (a layer's forward against a
                           stored weight).
  matmul, A and B dense    client.matmul(DenseOperand(a), DenseOperand(b), out=c): both
                           quantized in the call (fp4q.nn.Linear's forward GEMM).
  quantize, then matmul    client.quantize(a) then client.matmul(qa, name, out=c): the same
                           forward as two calls.
  torch bf16               torch.matmul(a, b.t(), out=c) in this process (cuBLAS), the same
                           wall-time convention, and its CUDA-event time.
Then a linear layer's training GEMMs at each M of --linear-m: forward and backward of
fp4q.nn.Linear(K, N) (three Matmul calls of dense operands: fprop, dgrad, wgrad) against
torch.nn.Linear in bf16 on the same data, wall time with the result synchronized.
Every fp4qd result is checked once, its output poisoned with NaN first, against the f32 product
of the operands' dequantized values (relative Frobenius error <= --tolerance). --json writes all
of it with the GPU, torch version, commit and commands; --profile adds a cProfile of each
row's calls at the first M (where the client's time goes).
"""

import argparse
import json
import math
import os
import platform
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "client", "python"))
sys.path.insert(0, HERE)

import torch  # noqa: E402

import fp4q  # noqa: E402
from fp4qd_process import Fp4qd, add_server_args, commit  # noqa: E402


def percentile(values, q):
    """Nearest-rank percentile (the value at rank ceil(q * n))."""
    s = sorted(values)
    return s[max(0, min(len(s) - 1, int(math.ceil(q * len(s))) - 1))]


def stats_us(values):
    return {"p50_us": percentile(values, 0.5), "p90_us": percentile(values, 0.9),
            "min_us": min(values), "samples": len(values)}


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_calls(fn, device, warmup, iters, header=None):
    """Wall microseconds of fn() per call (inputs synchronized before each), and the server's
    kernel microseconds per call when `header` gives the call's ReplyHeader (summed over the
    calls fn makes: header() returns the list)."""
    wall, kernel, server, queue = [], [], [], []
    for i in range(warmup + iters):
        sync(device)
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        if i >= warmup:
            wall.append((t1 - t0) * 1e6)
            if header is not None:
                hs = header()
                kernel.append(sum(h.kernel_micros for h in hs))
                server.append(sum(h.server_micros for h in hs))
                queue.append(sum(h.queue_micros for h in hs))
    out = {"wall": stats_us(wall)}
    if kernel:
        out["kernel"] = stats_us(kernel)
        out["server"] = stats_us(server)  # the request's arrival to its reply, in fp4qd
        out["queue"] = stats_us(queue)
        out["wall_minus_kernel_p50_us"] = out["wall"]["p50_us"] - out["kernel"]["p50_us"]
    return out


def event_us(fn, device, warmup, iters):
    """CUDA-event microseconds of fn() (device time only), p50."""
    if device.type != "cuda":
        return None
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        fn()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) * 1e3)
    return stats_us(times)


def rel_frobenius(got, want):
    d = (got.double() - want.double()).norm()
    w = want.double().norm()
    return float(d / w) if w > 0 else float(d)


class Checked(Exception):
    pass


def check_output(name, c, reference, tolerance):
    """c (poisoned with NaN before the call) against the f32 reference."""
    if not torch.isfinite(c).all():
        raise Checked("%s: the output holds NaN/Inf after the call (not written?)" % name)
    err = rel_frobenius(c.float(), reference)
    if not err <= tolerance:
        raise Checked("%s: relative Frobenius error %.3g over the tolerance %.3g" %
                      (name, err, tolerance))
    return err


def m_section(client, m, n, k, b, weight, qb, ref_b, device, args):
    """The rows of one M (B, its stored weight and its quantized form are shared)."""
    gen = torch.Generator(device="cpu").manual_seed(1000 + m)
    a = torch.randn(m, k, generator=gen).to(torch.bfloat16).to(device)
    qa = client.quantize(a).rowwise
    ref = client.dequantize(qa, torch.float32, device=device) @ ref_b.t()
    c = torch.empty(m, n, dtype=torch.bfloat16, device=device)
    last = lambda: [client.last_header]  # noqa: E731
    section = {"m": m, "n": n, "k": k, "rows": {}}
    rows = section["rows"]

    def both():
        client.matmul(qa, qb, torch.bfloat16, out=c)

    def stored():
        client.matmul(qa, weight, torch.bfloat16, out=c)

    def dense_a():
        client.matmul(fp4q.DenseOperand(a), weight, torch.bfloat16, out=c)

    def dense_both():
        client.matmul(fp4q.DenseOperand(a), fp4q.DenseOperand(b), torch.bfloat16, out=c)

    headers = []

    def forward():
        q = client.quantize(a).rowwise
        headers[:] = [client.last_header]
        client.matmul(q, weight, torch.bfloat16, out=c)
        headers.append(client.last_header)

    for name, fn, header in (("matmul, both quantized", both, last),
                             ("matmul, B stored", stored, last),
                             ("matmul, A dense, B stored", dense_a, last),
                             ("matmul, A and B dense", dense_both, last),
                             ("quantize, then matmul (two calls), B stored", forward,
                              lambda: headers)):
        c.fill_(float("nan"))
        fn()
        sync(device)
        row = {"rel_frobenius_error": check_output(name, c, ref, args.tolerance)}
        before = dict(client.stats)
        row.update(timed_calls(fn, device, args.warmup, args.iters, header))
        row["client_stats_per_call"] = {
            k: (v - before.get(k, 0)) / (args.warmup + args.iters)
            for k, v in client.stats.items() if v != before.get(k, 0)}
        if args.profile and m == ms_profiled(args):
            profile_row(fn, name, m, device, args)
        rows[name] = row

    def torch_mm():
        torch.matmul(a, b.t(), out=c)

    def torch_mm_done():  # the same wall convention as a call to fp4qd: its result is ready
        torch_mm()
        sync(device)

    row = timed_calls(torch_mm_done, device, args.warmup, args.iters)
    row["event"] = event_us(torch_mm, device, args.warmup, args.iters)
    rows["torch bf16"] = row
    base = row["wall"]["p50_us"]
    for name, r in rows.items():
        if name != "torch bf16":
            r["torch_bf16_wall_over_this_wall"] = base / r["wall"]["p50_us"]
    return section


def linear_section(client, m, n, k, device, args):
    """One training step's GEMMs of a linear layer (forward and backward, no bias): fp4q.nn.Linear
    (three Matmul calls of dense operands) against torch.nn.Linear in bf16, same data."""
    gen = torch.Generator(device="cpu").manual_seed(2000 + m)
    x = torch.randn(m, k, generator=gen).to(torch.bfloat16).to(device).requires_grad_()
    g = torch.randn(m, n, generator=gen).to(torch.bfloat16).to(device)
    torch.manual_seed(3)
    ref = torch.nn.Linear(k, n, bias=False, device=device, dtype=torch.bfloat16)
    fp4 = fp4q.nn.Linear.from_linear(ref, client=client, seed=5)
    rows = {}
    for name, layer in (("fp4q.nn.Linear (3 Matmul calls)", fp4), ("torch.nn.Linear bf16", ref)):
        def step(layer=layer):  # timed until its gradients are ready
            x.grad = None
            layer.weight.grad = None
            layer(x).backward(g)
            sync(device)
        rows[name] = timed_calls(step, device, args.warmup, args.iters)
    # The quantized layer's results are finite and near the bf16 ones (NVFP4's error).
    x.grad = fp4.weight.grad = None
    y = fp4(x)
    y.backward(g)
    want = ref(x.detach())
    err = rel_frobenius(y.detach().float(), want.float())
    if not (torch.isfinite(y).all() and torch.isfinite(x.grad).all() and
            torch.isfinite(fp4.weight.grad).all()) or not err < 0.25:
        raise Checked("fp4q.nn.Linear M=%d: output error %.3g against bf16 (or non-finite)"
                      % (m, err))
    rows["fp4q.nn.Linear (3 Matmul calls)"]["forward_rel_error_vs_bf16"] = err
    base = rows["torch.nn.Linear bf16"]["wall"]["p50_us"]
    rows["fp4q.nn.Linear (3 Matmul calls)"]["torch_bf16_wall_over_this_wall"] = (
        base / rows["fp4q.nn.Linear (3 Matmul calls)"]["wall"]["p50_us"])
    return {"m": m, "n": n, "k": k, "rows": rows}


def ms_profiled(args):
    return int(args.m.split(",")[0]) if not args.dry_run else 1


def profile_row(fn, name, m, device, args):
    """cProfile of --iters calls of one row (the first M), appended to --profile."""
    import cProfile
    import io
    import pstats
    prof = cProfile.Profile()
    sync(device)
    t0 = time.perf_counter()
    prof.enable()
    for _ in range(args.iters):
        sync(device)
        fn()
    prof.disable()
    per = (time.perf_counter() - t0) / args.iters * 1e6
    text = io.StringIO()
    st = pstats.Stats(prof, stream=text)
    st.sort_stats("tottime").print_stats(30)
    st.sort_stats("cumulative").print_stats(30)
    with open(args.profile, "a") as f:
        f.write("%s, M=%d, %d calls under cProfile: %.1f us a call (profiled)\n%s\n" %
                (name, m, args.iters, per, text.getvalue()))


def print_section(s):
    print("\nM=%d N=%d K=%d" % (s["m"], s["n"], s["k"]))
    print("| row | wall p50 us | in fp4qd | kernel | wall - kernel | torch bf16 wall / this |")
    print("|---|---|---|---|---|---|")
    for name, r in s["rows"].items():
        if "kernel" in r:
            print("| %s | %.1f | %.1f | %.1f | %.1f | %.2fx |" % (
                name, r["wall"]["p50_us"], r["server"]["p50_us"], r["kernel"]["p50_us"],
                r["wall_minus_kernel_p50_us"], r["torch_bf16_wall_over_this_wall"]),
                flush=True)
        else:
            ev = r.get("event")
            print("| %s | %.1f | - | %s | - | - |" % (
                name, r["wall"]["p50_us"], "event %.1f" % ev["p50_us"] if ev else "-"),
                flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dry-run", action="store_true",
                    help="CPU, N = K = 256, M 1,16,64, inline tensors, 1 warmup + 3 calls")
    add_server_args(ap, 16 << 30)
    ap.add_argument("--m", default="1,16,32,64,128,512,2048,8192",
                    help="comma-separated M values (A's rows)")
    ap.add_argument("--n", type=int, default=8192, help="B's rows (N)")
    ap.add_argument("--k", type=int, default=8192, help="the inner dimension (K)")
    ap.add_argument("--linear-m", default="2048,8192",
                    help="tokens of the linear-layer rows (fp4q.nn.Linear forward + backward "
                         "against torch.nn.Linear bf16, [N, K] weight); '' for none")
    ap.add_argument("--grpc", action="store_true", help="also every row over gRPC")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--tolerance", type=float, default=8e-3,
                    help="relative Frobenius error allowed for the bf16 output")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--profile", metavar="PATH",
                    help="also a cProfile of each row's calls at the first M, into PATH")
    args = ap.parse_args(argv)
    try:
        ms = [int(v) for v in args.m.split(",") if v.strip()]
    except ValueError:
        ap.error("--m: comma-separated integers, got %r" % args.m)
    if not ms or min(ms) < 1 or args.n < 16 or args.k < 16 or args.k % 16:
        ap.error("--m >= 1, --n >= 16, --k a multiple of 16 (>= 16)")
    if args.iters < 1 or args.warmup < 0:
        ap.error("--iters >= 1, --warmup >= 0")
    try:
        linear_ms = [int(v) for v in args.linear_m.split(",") if v.strip()]
    except ValueError:
        ap.error("--linear-m: comma-separated integers, got %r" % args.linear_m)
    if args.dry_run:
        device = torch.device("cpu")
        ms, args.n, args.k = [1, 16, 64], 256, 256
        linear_ms = [32] if linear_ms else []
        args.iters, args.warmup = min(args.iters, 3), min(args.warmup, 1)
        args.state_budget_bytes = min(args.state_budget_bytes, 1 << 30)
    else:
        if not torch.cuda.is_available():
            ap.error("no CUDA device: run with --dry-run here")
        device = torch.device("cuda", torch.cuda.current_device())
    if not args.fp4qd and not args.server:
        ap.error("give --fp4qd (started here) or --server (and --fast-socket)")
    torch.backends.cuda.matmul.allow_tf32 = False  # the f32 reference
    ipc = "require" if device.type == "cuda" else "auto"
    server = Fp4qd(args, cuda=device.type == "cuda")
    results = {"command": [sys.executable] + (sys.argv if argv is None else argv),
               "fp4qd_command": server.command, "commit": commit(), "torch": torch.__version__,
               "device": (torch.cuda.get_device_name(device) if device.type == "cuda"
                          else "cpu"),
               "host": platform.node(), "dry_run": args.dry_run, "iters": args.iters,
               "warmup": args.warmup, "transports": {}}
    failed = None
    try:
        for fast in [True, False] if args.grpc else [True]:
            transport = "fast socket" if fast else "gRPC"
            client = server.client(fast, "bench-matmul-%d" % os.getpid(), ipc)
            sections = []
            try:
                gen = torch.Generator(device="cpu").manual_seed(7)
                b = torch.randn(args.n, args.k, generator=gen).to(torch.bfloat16).to(device)
                weight = "matmul.b"
                client.create_weight(weight, b)
                qb = client.quantize(b).rowwise
                ref_b = client.dequantize(qb, torch.float32, device=device)
                stored = client.dequantize(weight, torch.float32, device=device)
                if not torch.equal(stored, ref_b):
                    raise Checked("the stored weight's DQ differs from Quantize's of the same B")
                print("%s: %s, N=%d K=%d" % (transport, results["device"], args.n, args.k),
                      flush=True)
                for m in ms:
                    s = m_section(client, m, args.n, args.k, b, weight, qb, ref_b, device, args)
                    print_section(s)
                    sections.append(s)
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
                linear = []
                for m in linear_ms:
                    s = linear_section(client, m, args.n, args.k, device, args)
                    f, t = s["rows"]["fp4q.nn.Linear (3 Matmul calls)"], s["rows"][
                        "torch.nn.Linear bf16"]
                    print("\nlinear layer forward + backward, M=%d N=%d K=%d: fp4q.nn.Linear "
                          "%.1f us, torch.nn.Linear bf16 %.1f us (torch / fp4q %.2fx)" % (
                              m, args.n, args.k, f["wall"]["p50_us"], t["wall"]["p50_us"],
                              f["torch_bf16_wall_over_this_wall"]), flush=True)
                    linear.append(s)
                stats = {k: v for k, v in client.stats.items()
                         if k.startswith(("fast", "ipc", "inline"))}
                results["transports"][transport] = {"sections": sections, "linear": linear,
                                                    "client_stats": stats}
            finally:
                try:
                    client.delete_namespace()
                except fp4q.Fp4qError:
                    pass
                client.close()
    except Checked as e:
        failed = str(e)
        results["error"] = failed
    finally:
        server.stop()
    text = json.dumps(results, indent=2, sort_keys=True)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    if failed:
        print("matmul_service: FAILED: %s" % failed, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
