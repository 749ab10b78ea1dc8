"""A training loop's iteration time with fp4q.optim, synchronous and overlap=True, beside torch.

The train suite's transformer (train/fp4q_train: 4 layers, d_model 384, 7.1M parameters in its
blocks, bf16 autocast; --layers, --d-model and --heads change it) on random byte windows (batch
64 x 128), in a loop as a user writes it: forward, backward, opt.step(),
opt.zero_grad(set_to_none=True), and no host synchronization except `loss.item()` every
--log-every iterations. Each variant runs --warmup iterations, then
--iters timed ones ending in a synchronize; the figure is wall time per iteration.

Variants (the same model, seed and data):
- torch: torch.optim.SGD (momentum 0.9) over every parameter, fp32 master weights: the loop a
  user would run without fp4q;
- fp4q: fp4q.optim.SGD (momentum 0.9, RTN + error feedback) storing the 16 block matrices in
  fp4qd (the rest in torch), step() waiting for the reply. Where fp4qd takes ready signals and
  the backward pass is still running when step() is called, step() sends at once with a ready
  word the stream writes behind it (fp4q.optim's ready_signal=True, the default);
- fp4q, host sync: the same with ready_signal=False: step() waits on the host for the backward
  pass before sending;
- fp4q overlap: the same with overlap=True (step() returns once the step is sent; the stream
  waits on the device for the new weights). Where fp4qd takes ready signals the host does not
  wait for the gradients either (the stream writes the ready word behind the backward pass);
- fp4q overlap, host sync: overlap=True with ready_signal=False, so step() waits on the host
  for the backward pass before sending (what overlap does with a server without ready
  signals).

"fp4q cost" is (variant - torch) / variant: the share of the iteration the stored-weight step
adds, of the medians over the rounds, of the best rounds (the VM's noise only slows a round
down) and round by round (each round against torch's round run just before it, the median of
those: drift between rounds cancels). "The step on the worker's stream" (CUDA) is the median GPU
time between an event recorded before opt.step() and one after it: torch's optimizer kernels,
or what the worker's stream waits for fp4qd's step (with overlap: ready signal seen, the step's
kernels, done signal); "the host in step()" the median wall time of the opt.step() call. Both
are also given per round. "Bound by" reads fp4qd's median wait for the ready signal: a step
sent 2 ms or more before its backward pass ends says the GPU bounds the loop (the host's
time in step() is hidden), one that arrives within 0.2 ms says the host does (that time is the
step's cost). Usage: python3 bench/train_loop.py --fp4qd build/bin/fp4qd
[--variant 'fp4q overlap' ...] [--out FILE.json] (--dry-run: a tiny model on the CPU backend, for
CI).
"""

import argparse
import cProfile
import io
import json
import os
import pstats
import re
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "train"))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "client", "python"))
sys.path.insert(0, HERE)

import fp4q  # noqa: E402
import fp4q.optim  # noqa: E402
from fp4q_train import model as M  # noqa: E402
from fp4qd_process import Fp4qd, add_server_args, commit  # noqa: E402


def run_variant(variant, server, cfg, device, args, rounds):
    """Seconds per iteration of each round (a list), for `variant`."""
    torch.manual_seed(1)
    model = M.Transformer(cfg).to(device)
    c = None
    phases = {}  # --step-phases: label -> seconds of each call, of the timed iterations
    profiler = None  # --profile-step: a cProfile of opt.step() over the timed iterations
    if variant == "torch":
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    else:
        label = re.sub(r"[^A-Za-z0-9]+", "-", variant)  # a namespace's bytes
        c = server.client(True, "train-loop-%s-%d" % (label, os.getpid()),
                          "require" if device.type == "cuda" else "auto")
        store = set(M.block_linear_names(model))
        named = [(n, p) for n, p in model.named_parameters()]
        opt = fp4q.optim.SGD(named, lr=0.01, momentum=0.9, error_feedback=True, client=c,
                             exclude=[n for n, _ in named if n not in store],
                             existing="replace", overlap=variant.startswith("fp4q overlap"),
                             ready_signal=not variant.endswith("host sync"))
        check_epoch = opt._check_reply_epoch

        def record(header, rpc):  # every Step reply's header passes here
            if rpc == "Step" and header is not None:
                headers.append((header.kernel_micros, header.server_micros, header.queue_micros,
                                header.ready_wait_micros))
            return check_epoch(header, rpc)
        opt._check_reply_epoch = record
        if args.step_phases:
            _time_phases(opt, phases)
    headers = []
    g = torch.Generator(device=device).manual_seed(2)
    batches = [torch.randint(0, 256, (args.batch, cfg.block_size + 1), device=device,
                             generator=g) for _ in range(8)]
    use_autocast = device.type == "cuda"
    losses = []
    # The step on the GPU's timeline: an event before opt.step() (the backward pass queued
    # ahead of it) and one after it, on the worker's stream. Their distance is what the step
    # holds the stream: torch's optimizer kernels, or with overlap the wait for fp4qd's step
    # (ready signal seen, the step's kernels, done signal).
    marks = []
    host = []  # seconds the host spent in opt.step(), per iteration

    def step():
        if profiler is not None:
            profiler.runcall(opt.step)
        else:
            opt.step()

    def iteration(i):
        b = batches[i % len(batches)]
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_autocast):
            logits = model(b[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, 256),
                                                 b[:, 1:].reshape(-1))
        loss.backward()
        if device.type == "cuda":
            a, b = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            a.record()
            t = time.perf_counter()
            step()
            host.append(time.perf_counter() - t)
            b.record()
            marks.append((a, b))
        else:
            t = time.perf_counter()
            step()
            host.append(time.perf_counter() - t)
        opt.zero_grad(set_to_none=True)
        if args.log_every and i % args.log_every == 0:
            losses.append(loss.item())

    try:
        for i in range(args.warmup):
            iteration(i)
        if hasattr(opt, "synchronize"):
            opt.synchronize()
        del headers[:]
        del marks[:]
        del host[:]
        for spent in phases.values():
            del spent[:]
        if args.profile_step and variant != "torch":
            profiler = cProfile.Profile()  # step() reads it when called
        out = []
        for _ in range(rounds):
            if device.type == "cuda":
                torch.cuda.synchronize()
            started = time.time()
            t0 = time.perf_counter()
            for i in range(args.iters):
                iteration(i)
            if device.type == "cuda":
                torch.cuda.synchronize()
            if hasattr(opt, "synchronize"):
                opt.synchronize()
            out.append((time.perf_counter() - t0) / args.iters)
        if profiler is not None:
            text = io.StringIO()
            pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(45)
            path = "%s-%s.txt" % (args.profile_step, re.sub(r"[^A-Za-z0-9]+", "-", variant))
            with open(path, "a") as f:
                f.write("== %s, a round of %d iterations\n%s" % (variant, args.iters,
                                                               text.getvalue()))
        extra = {"round_started_unix_s": started,
                 "step_host_us": statistics.median(host) * 1e6}
        if phases:
            extra["step_phases_us"] = {k: statistics.median(v) * 1e6 for k, v in phases.items()
                                       if v}
        if marks:
            extra["step_on_stream_us"] = statistics.median(a.elapsed_time(b) * 1e3
                                                           for a, b in marks)
        if c is not None:
            o, r = opt._overlapped, opt._ready_steps
            extra.update({"overlapped_steps": o.sent if o else 0,
                          "completed_in_step": o.completed if o else 0,
                          "sent_with_ready_signal": o.ready_sent if o else r.sent if r else 0,
                          "steps_timed_by_fp4qd": len(headers)})
            if r is not None:  # synchronous steps: the stream was idle / the word timed out
                extra.update({"sent_stream_idle": r.idle, "ready_fallbacks": r.fallbacks})
            # How the client waited for the step replies, and its heads-ups (fp4q._fast_socket).
            extra["client_waits"] = {k: v for k, v in c.stats.items()
                                     if k.startswith("fast_socket_") and k != "fast_socket_calls"}
            if headers:
                # fp4qd's reply header, medians: the step's device work (check, apply, report;
                # launches included), the request's whole time in fp4qd (with a ready signal:
                # the wait for it too), its wait in the device's queue, and the wait for the
                # ready signal (the backward pass still running when the step arrived).
                for k, name in enumerate(("kernel_us", "server_us", "queue_us",
                                          "ready_wait_us")):
                    extra["fp4qd_" + name] = statistics.median(h[k] for h in headers)
        return out, losses, extra
    finally:
        if c is not None:
            del opt._check_reply_epoch  # the class's again: no cycle keeps the optimizer
            try:
                c.delete_namespace()
            except fp4q.Fp4qError:
                pass
            c.close()


# fp4qd's median wait for a step's ready signal above which the host is taken to run ahead of the
# GPU (the GPU bounds the loop), and below which the host is taken to keep the GPU waiting.
GPU_BOUND_WAIT_US, HOST_BOUND_WAIT_US = 2000.0, 200.0


def _bound_by(ready_wait_us):
    """What bounds the loop, from fp4qd's wait for the ready signal: a step sent long before its
    backward pass ends means the host runs ahead of the GPU (whose time then sets the iteration,
    and hides the host's time in step()); one that arrives as the backward pass ends means the
    host keeps up only just, and its time in step() is the step's cost. None in between, and
    for steps sent without a ready signal (a wait of 0)."""
    if ready_wait_us >= GPU_BOUND_WAIT_US:
        return ("the GPU: the host sent each step %.1f ms before the backward pass ended"
                % (ready_wait_us / 1e3))
    if 0 < ready_wait_us <= HOST_BOUND_WAIT_US:
        return ("the host: each step arrived %.0f us before the backward pass ended"
                % ready_wait_us)
    return None


def _time_phases(opt, phases):
    """--step-phases: wraps the parts of opt.step() (an fp4q.optim optimizer) with timers that
    append each call's seconds to phases[label]. A label's part runs inside those above it that
    it is indented under (in the report's order)."""
    def wrap(owner, name, label):
        f = getattr(owner, name, None)
        if f is None:
            return
        spent = phases.setdefault(label, [])

        def timed(*a, **k):
            t = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                spent.append(time.perf_counter() - t)
        setattr(owner, name, timed)

    for name, label in PHASES:
        if not name.startswith(("requests.", "overlapped.")):
            wrap(opt, name, label)
    wrap(opt.client._requests, "step_begin", "  requests.step_begin")
    wrap(opt.client._requests, "step_keyed", "  requests.step_keyed")
    o = opt._overlapped
    if o is not None:
        wrap(o, "_watcher", "  overlapped: the watcher's queue")
        order = o._order

        def timed_order(value):
            inner = order(value)
            spent = phases.setdefault("    the ready word (host waits on other devices, its write)",
                                      [])

            def timed(transfer):
                t = time.perf_counter()
                try:
                    return inner(transfer)
                finally:
                    spent.append(time.perf_counter() - t)
            return timed
        o._order = timed_order


# opt.step()'s parts that --step-phases times (attribute of the optimizer, label).
PHASES = (("synchronize", "synchronize (the step in flight's outcome)"),
          ("_check_epoch", "epoch check"), ("_hyper_for_step", "hyperparameters"),
          ("_step_key", "step plan key"), ("_send", "send (request, exchange or hand-off)"),
          ("_torch_step", "torch's step of the unstored parameters"))


VARIANTS = ("torch", "fp4q", "fp4q, host sync", "fp4q overlap", "fp4q overlap, host sync")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_server_args(ap, 8 << 30)
    ap.add_argument("--iters", type=int, default=200, help="timed iterations per round")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3,
                    help="rounds per variant, the variants interleaved (median reported)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--layers", type=int, default=4, help="transformer blocks (default 4)")
    ap.add_argument("--d-model", type=int, default=384, help="model width (default 384)")
    ap.add_argument("--heads", type=int, default=6, help="attention heads (default 6)")
    ap.add_argument("--log-every", type=int, default=10,
                    help="loss.item() every N iterations (0: never; default 10)")
    ap.add_argument("--variant", action="append", metavar="NAME",
                    help="run this variant (repeatable; default: all; torch always runs): " +
                    ", ".join("'%s'" % v for v in VARIANTS))
    ap.add_argument("--out", help="write the report (JSON) here")
    ap.add_argument("--step-phases", action="store_true",
                    help="also time opt.step()'s parts (fp4q variants; the timers add a few us)")
    ap.add_argument("--profile-step", metavar="PREFIX",
                    help="also cProfile opt.step() in each fp4q variant's rounds (slower: "
                    "profiled rounds' times are not the unprofiled ones), appended to "
                    "PREFIX-<variant>.txt")
    ap.add_argument("--torch-side", choices=("foreach", "torch-step"), default="foreach",
                    help="how fp4q.optim.SGD steps the parameters it keeps in torch: torch's "
                    "multi-tensor calls (its default, fp4q._torch_side) or torch's step() (for "
                    "comparison)")
    ap.add_argument("--switch-interval", type=float, metavar="SECONDS",
                    help="sys.setswitchinterval (Python's default 0.005): how long a thread "
                    "waiting for the GIL (the overlapped step's reply watcher) waits before "
                    "the running one must yield it")
    ap.add_argument("--dry-run", action="store_true",
                    help="a tiny model on the CPU backend (CI): checks the script, no numbers")
    args = ap.parse_args(argv)
    if args.torch_side == "torch-step":
        from fp4q import _torch_side
        _torch_side.sgd_step = lambda inner: False
    if args.switch_interval is not None:
        if not args.switch_interval > 0:
            ap.error("--switch-interval: a positive number of seconds (got %r)"
                     % args.switch_interval)
        sys.setswitchinterval(args.switch_interval)
    device = torch.device("cuda" if torch.cuda.is_available() and not args.dry_run else "cpu")
    if args.dry_run:
        cfg = M.Config(vocab_size=256, block_size=16, layers=1, d_model=32, heads=2)
        args.iters, args.warmup, args.rounds, args.batch = 3, 1, 1, 4
    else:
        if (min(args.layers, args.d_model, args.heads) < 1 or args.d_model % 16 or
                args.d_model % args.heads):
            ap.error("--layers, --d-model, --heads: positive, d_model a multiple of 16 (the "
                     "stored blocks) and of heads (got %d, %d, %d)" % (
                         args.layers, args.d_model, args.heads))
        cfg = M.Config(vocab_size=256, block_size=128, layers=args.layers, d_model=args.d_model,
                       heads=args.heads)
    if not args.fp4qd and not args.server:
        ap.error("give --fp4qd (start one) or --server")
    variants = list(VARIANTS) if device.type == "cuda" else ["torch", "fp4q"]
    if args.variant:
        chosen = args.variant
        unknown = [v for v in chosen if v not in VARIANTS]
        if unknown:
            ap.error("--variant: unknown %s (known: %s)" % (
                ", ".join(repr(v) for v in unknown), ", ".join(repr(v) for v in VARIANTS)))
        variants = ["torch"] + [v for v in variants if v in chosen and v != "torch"]
    server = Fp4qd(args, cuda=device.type == "cuda")
    times = {v: [] for v in variants}
    losses, extras = {}, {}
    per_round = {v: [] for v in variants}
    try:
        for _ in range(args.rounds):  # interleaved, so that drift hits every variant alike
            for v in variants:
                t, lo, extra = run_variant(v, server, cfg, device, args, 1)
                times[v].extend(t)
                losses[v], extras[v] = lo, extra
                per_round[v].append(extra)
    finally:
        server.stop()
    ref = statistics.median(times["torch"]) * 1e3
    ref_best = min(times["torch"]) * 1e3
    rows = []
    for v in variants:
        ms = statistics.median(times[v]) * 1e3
        best = min(times[v]) * 1e3
        row = {"variant": v, "ms_per_iteration": ms, "best_round_ms": best,
               "rounds_ms": [t * 1e3 for t in times[v]],
               "fp4q_cost": None if v == "torch" else (ms - ref) / ms,
               "fp4q_cost_best_rounds": None if v == "torch" else (best - ref_best) / best,
               # Each round against torch's round just before it (the variants run in turn).
               "fp4q_cost_paired": None if v == "torch" else statistics.median(
                   (t - r) / t for t, r in zip(times[v], times["torch"])),
               "first_losses": losses[v][:3], "per_round": per_round[v]}
        row.update(extras[v])
        # The medians over the rounds, where each round has the figure.
        for k in ("step_host_us", "step_on_stream_us", "fp4qd_kernel_us", "fp4qd_server_us",
                  "fp4qd_queue_us", "fp4qd_ready_wait_us"):
            xs = [e[k] for e in per_round[v] if k in e]
            if xs:
                row[k] = statistics.median(xs)
        rows.append(row)
        cost = "" if v == "torch" else (
            ", fp4q cost %.1f%% (best rounds: %.1f%%; round by round against torch's: %.1f%%)"
            % (100 * row["fp4q_cost"], 100 * row["fp4q_cost_best_rounds"],
               100 * row["fp4q_cost_paired"]))
        print("%-24s %.3f ms/iteration, best round %.3f (rounds %s)%s" % (
            v, ms, best, " ".join("%.3f" % x for x in row["rounds_ms"]), cost), flush=True)
        print("%-24s the host in step() (median): %.1f us; by round: %s" % (
            "", row["step_host_us"], " ".join("%.0f" % e["step_host_us"] for e in per_round[v])),
              flush=True)
        if "step_on_stream_us" in row:
            print("%-24s the step on the worker's stream (median): %.1f us; by round: %s"
                  % ("", row["step_on_stream_us"],
                     " ".join("%.0f" % e["step_on_stream_us"] for e in per_round[v])), flush=True)
        if "fp4qd_kernel_us" in row:
            print("%-24s fp4qd a step (medians): kernels %.1f us, in fp4qd %.1f us, queued %.1f us,"
                  " waiting for the ready signal %.1f us"
                  % ("", row["fp4qd_kernel_us"], row["fp4qd_server_us"], row["fp4qd_queue_us"],
                     row["fp4qd_ready_wait_us"]),
                  flush=True)
            row["bound_by"] = _bound_by(row["fp4qd_ready_wait_us"])
            if row["bound_by"]:
                print("%-24s the loop is bound by %s" % ("", row["bound_by"]), flush=True)
        if row.get("step_phases_us"):
            ph = row["step_phases_us"]
            order = [lb for _, lb in PHASES] + sorted(k for k in ph if k.startswith(" "))
            print("%-24s step() parts, medians of the last round (us): %s" % ("", "; ".join(
                "%s %.1f" % (lb.strip(), ph[lb]) for lb in order if lb in ph)), flush=True)
        if row.get("client_waits"):
            print("%-24s the client's waits for replies (last round): %s"
                  % ("", " ".join("%s %d" % (k[len("fast_socket_"):], n)
                                  for k, n in sorted(row["client_waits"].items()))), flush=True)
    report = {"command": " ".join([os.path.basename(sys.executable)] + sys.argv),
              "fp4qd_command": server.command, "commit": commit(), "torch": torch.__version__,
              "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
              "model": vars(cfg) if hasattr(cfg, "__dict__") else str(cfg),
              "batch": args.batch, "iters": args.iters, "warmup": args.warmup,
              "log_every": args.log_every, "switch_interval_s": sys.getswitchinterval(),
              "torch_side": args.torch_side,
              "rows": rows}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
