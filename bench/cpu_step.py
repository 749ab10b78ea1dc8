#!/usr/bin/env python3
"""The trainer's step where no GPU is present: fp4qd's CPU backend against torch on the same CPU.

    python3 bench/cpu_step.py --fp4qd build/bin/fp4qd --json out.json            # GPT-2 small
    python3 bench/cpu_step.py --fp4qd build/bin/fp4qd --scale 16 --steps 5      # rows / 16

What runs: fp4qd started here with --backend cpu and a fast socket; `fp4q.optim.SGD` (round to
nearest with error feedback, plain SGD) over GPT-2-small's 50 matrices (12 x ([768, 2304],
[768, 768], [768, 3072], [3072, 768]) + [50257, 768] + [1024, 768]; --scale S divides every
row count by S), bf16 parameters and gradients in host memory, sent inline (the fast socket
where the frame fits, gRPC otherwise: GPT-2 at full size),
DQ(W) copied back into the parameters. Gradients random, never zero; the parameters are
poisoned before the timed steps and checked after.

Rows, each the median wall time of one optimizer step over --steps steps after --warmup, in the
same run:
  - fp4q SGD, delayed and current scaling: step() wall, and fp4qd's kernel time (the CPU
    backend's, ReplyHeader.kernel_micros) per parameter;
  - torch foreach SGD with fp32 master weights, bf16 in and out (the gradients upcast into the
    masters' gradients, the step, the masters copied back into the bf16 parameters): what a
    user would run instead on this CPU, with torch's own threads (--threads);
  - the bytes floor: 13.125 bytes a parameter (NUMERICS: SGD with error feedback, bf16 in and
    out) at this CPU's copy bandwidth, measured here with a large torch copy.
The CPU backend is the exact reference of docs/NUMERICS.md; this measures what it costs.
"""

import argparse
import json
import os
import platform
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "client", "python"))
sys.path.insert(0, HERE)

import torch  # noqa: E402

import fp4q  # noqa: E402
import fp4q.optim  # noqa: E402
from fp4qd_process import Fp4qd, commit  # noqa: E402

BYTES_PER_PARAM = 13.125


def gpt2_shapes(scale):
    layer = [(768, 2304), (768, 768), (768, 3072), (3072, 768)]
    return [(max(1, r // scale), c) for r, c in layer * 12 + [(50257, 768), (1024, 768)]]


def median_ms(f, steps, warmup):
    times = []
    for i in range(warmup + steps):
        t = time.perf_counter()
        f()
        if i >= warmup:
            times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def copy_bandwidth():
    """Bytes read + written per second of a 256 MiB torch copy on this CPU."""
    a = torch.empty(64 << 20, dtype=torch.float32).normal_()
    b = torch.empty_like(a)
    ms = median_ms(lambda: b.copy_(a), 7, 2)
    return 2 * a.numel() * 4 / (ms / 1e3)


def model(shapes, seed):
    g = torch.Generator().manual_seed(seed)
    params = [torch.nn.Parameter((torch.randn(*s, generator=g) * 0.02).to(torch.bfloat16))
              for s in shapes]
    for p in params:
        p.grad = (torch.randn(p.shape, generator=g) * 0.01 + 1e-4).to(torch.bfloat16)
    return params


def fp4q_row(server, shapes, scaling, args):
    params = model(shapes, 5)
    client = server.client(True, "cpu-step-%s" % scaling, "never")
    try:
        opt = fp4q.optim.SGD(params, lr=1e-3, client=client, scaling=scaling)
        with torch.no_grad():
            for p in params:
                p.fill_(float("nan"))  # poison: every DQ(W) value must be written
        kernel_us = []

        def step():
            opt.step()
            kernel_us.append(client.last_header.kernel_micros)
        wall = median_ms(step, args.steps, args.warmup)
        unwritten = sum(int(torch.isnan(p.float()).sum()) for p in params)
        if unwritten:
            raise RuntimeError("%d DQ(W) values were not written" % unwritten)
        return wall, statistics.median(kernel_us[args.warmup:]) / 1e3
    finally:
        client.close()


def torch_row(shapes, args):
    params = model(shapes, 5)
    master = [p.detach().float().requires_grad_() for p in params]
    for m in master:
        m.grad = torch.zeros_like(m)
    opt = torch.optim.SGD(master, lr=1e-3, foreach=True)

    def step():
        with torch.no_grad():
            for m, p in zip(master, params):
                m.grad.copy_(p.grad)
            opt.step()
            for m, p in zip(master, params):
                p.copy_(m)
    return median_ms(step, max(args.steps, 5), 2)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n", 2)[2])
    ap.add_argument("--fp4qd", default="build/bin/fp4qd", help="fp4qd (default build/bin/fp4qd)")
    ap.add_argument("--scale", type=int, default=1,
                    help="divide GPT-2's row counts by this (default 1: 124.3M parameters)")
    ap.add_argument("--steps", type=int, default=3, help="timed steps (default 3)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps first (default 1)")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch's threads for its rows (default: torch's own choice)")
    ap.add_argument("--json", help="also write the report there")
    args = ap.parse_args()
    for name, v, least in (("--scale", args.scale, 1), ("--steps", args.steps, 1),
                           ("--warmup", args.warmup, 0), ("--threads", args.threads, 0)):
        if v < least:
            ap.error("%s: %d is not >= %d" % (name, v, least))
    if not os.path.exists(args.fp4qd):
        ap.error("--fp4qd: %s not found (cmake --build build)" % args.fp4qd)
    if args.threads:
        torch.set_num_threads(args.threads)
    shapes = gpt2_shapes(args.scale)
    n = sum(r * c for r, c in shapes)
    bandwidth = copy_bandwidth()
    floor_ms = n * BYTES_PER_PARAM / bandwidth * 1e3
    ns = argparse.Namespace(fp4qd=args.fp4qd, fp4qd_arg=[], server=None,
                            fast_socket=None, state_budget_bytes=64 << 30, spin_us=0)
    server = Fp4qd(ns, cuda=False)
    rows = []
    try:
        for scaling in ("delayed", "current"):
            wall, kernel = fp4q_row(server, shapes, scaling, args)
            rows.append({"row": "fp4q SGD RTN + EF, %s scaling (CPU backend)" % scaling,
                         "ms": wall, "kernel_ms": kernel,
                         "kernel_ns_per_param": kernel * 1e6 / n})
            print("%s: %.1f ms a step (kernels %.1f ms, %.1f ns a parameter)"
                  % (rows[-1]["row"], wall, kernel, rows[-1]["kernel_ns_per_param"]), flush=True)
    finally:
        server.stop()
    torch_ms = torch_row(shapes, args)
    rows.append({"row": "torch foreach SGD, fp32 master, bf16 in and out", "ms": torch_ms})
    rows.append({"row": "bytes floor (13.125 B/param at the copy bandwidth)", "ms": floor_ms})
    print("%s: %.2f ms" % (rows[-2]["row"], torch_ms))
    print("%s: %.2f ms (copy %.1f GB/s)" % (rows[-1]["row"], floor_ms, bandwidth / 1e9))
    for r in rows[:2]:
        print("  %s: %.0fx torch, %.0fx the floor" % (r["row"], r["ms"] / torch_ms,
                                                      r["ms"] / floor_ms))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"tool": "bench/cpu_step.py", "commit": commit(),
                       "command": " ".join(sys.argv), "fp4qd_command": server.command,
                       "cpu": platform.processor() or platform.machine(),
                       "cores": os.cpu_count(), "torch": torch.__version__,
                       "torch_threads": torch.get_num_threads(), "params": n,
                       "shapes": shapes, "copy_gbps": bandwidth / 1e9, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
