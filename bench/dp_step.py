#!/usr/bin/env python3
"""Data-parallel training through one fp4qd: K worker processes share one GPU and one stored copy.

    # H200 (fp4qd started here with CUDA IPC, the Unix socket and the fast socket):
    python3 bench/dp_step.py --fp4qd .bundle/bin/fp4qd --ranks 4 --json dp.json
    # here: the CPU version (inline tensors, a CPU fp4qd, a tiny model)
    python3 bench/dp_step.py --fp4qd build/bin/fp4qd --device cpu --ranks 2 --steps 20 --width 64

Each rank trains the same bias-free MLP (--layers x [--width, --width], every weight storable)
on its own shard of a synthetic regression task for --steps steps, in two ways, in the same run:
  fp4q   fp4q.optim.SGD(momentum) with group/world_size/rank: every rank sends its gradients to
         fp4qd (CUDA IPC), which sums the K contributions in rank order, divides by K, applies one
         update to the one stored 4-bit copy (RTN + error feedback) and writes DQ(W) back into
         every rank's parameters. No torch.distributed.
  torch  what a user picks instead: every rank holds its own fp32 master weights and momentum,
         all-reduces its gradients with torch.distributed (gloo: several ranks on one GPU is
         what NCCL refuses) and steps torch.optim.SGD(momentum).
Reported per way: the median and p90 of one training step's wall time on each rank, split into
forward + backward and the optimizer's part (fp4q: step(), the server's combine and update
included; torch: all_reduce + step), the final loss, whether every rank ends with the same
parameters, and the optimizer state's bytes per parameter: fp4q's from the server's ListTensors
(one copy, whatever K), torch's K x (fp32 master + momentum). --json writes it all with the GPU,
torch version, commit and command.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "client", "python"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402


def make_model(args, seed):
    torch.manual_seed(seed)
    layers = []
    for _ in range(args.layers):
        layers += [torch.nn.Linear(args.width, args.width, bias=False), torch.nn.GELU()]
    model = torch.nn.Sequential(*layers[:-1])
    for p in model.parameters():
        p.data.mul_(1.0 / max(1.0, (args.width ** 0.5) * 0.05))
    return model


def batches(args, rank, device):
    """This rank's shard: x ~ N(0, 1), y = teacher(x) for a fixed random teacher."""
    g = torch.Generator().manual_seed(1234)
    teacher = [torch.randn(args.width, args.width, generator=g) / args.width ** 0.5
               for _ in range(2)]
    g = torch.Generator().manual_seed(100 + rank)
    for _ in range(args.warmup + args.steps):
        x = torch.randn(args.batch, args.width, generator=g)
        y = torch.tanh(x @ teacher[0]) @ teacher[1]
        yield x.to(device), y.to(device)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def summarize(values):
    v = sorted(values)
    return {"median_ms": statistics.median(v) * 1e3,
            "p90_ms": v[min(len(v) - 1, int(0.9 * len(v)))] * 1e3}


def run_rank(rank, args, way, out_dir):
    device = torch.device(args.device)
    model = make_model(args, seed=7).to(device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = model.to(dtype)
    fwd, opt_t, losses = [], [], []
    if way == "fp4q":
        import fp4q
        client = fp4q.Client(args.server, fast_socket=args.fast_socket or None,
                             client_name="dp-rank%d" % rank, timeout=120)
        opt = fp4q.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, client=client,
                             error_feedback=True, name_prefix="dp/", group="dp",
                             world_size=args.ranks, rank=rank, deadline_ms=120000)
    else:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(args.port))
        dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
        masters = [p.detach().float().clone().requires_grad_(True) for p in model.parameters()]
        opt = torch.optim.SGD(masters, lr=args.lr, momentum=0.9)
    for i, (x, y) in enumerate(batches(args, rank, device)):
        sync(device)
        t0 = time.perf_counter()
        out = model(x.to(dtype)).float()
        loss = torch.nn.functional.mse_loss(out, y)
        model.zero_grad(set_to_none=True)
        loss.backward()
        sync(device)
        t1 = time.perf_counter()
        if way == "fp4q":
            opt.step()
        else:
            for m, p in zip(masters, model.parameters()):
                g = p.grad.float()
                dist.all_reduce(g)
                g.div_(args.ranks)
                m.grad = g
            opt.step()
            with torch.no_grad():
                for m, p in zip(masters, model.parameters()):
                    p.copy_(m)
        sync(device)
        t2 = time.perf_counter()
        if i >= args.warmup:
            fwd.append(t1 - t0)
            opt_t.append(t2 - t1)
            losses.append(loss.item())
    digest = torch.cat([p.detach().float().flatten() for p in model.parameters()])
    result = {"rank": rank, "forward_backward": summarize(fwd), "optimizer": summarize(opt_t),
              "step": summarize([a + b for a, b in zip(fwd, opt_t)]),
              "first_loss": losses[0], "final_loss": losses[-1],
              "param_checksum": float(digest.double().sum()),
              "param_bytes_head": digest[:64].tolist()}
    if way == "fp4q":
        listing = client.list_tensors()
        stored = sum(t.bytes for t in listing if t.name.startswith("dp/"))
        params = sum(p.numel() for p in model.parameters())
        result["server_state_bytes"] = stored
        result["server_bytes_per_param"] = stored / params
        client.close()
    else:
        dist.destroy_process_group()
        params = sum(p.numel() for p in model.parameters())
        result["rank_state_bytes"] = params * 8  # fp32 master + momentum on this rank
    with open(os.path.join(out_dir, "%s-%d.json" % (way, rank)), "w") as f:
        json.dump(result, f)


def start_fp4qd(args, tmp):
    sock = os.path.join(tmp, "grpc.sock")
    fast = os.path.join(tmp, "fast.sock")
    flags = [args.fp4qd, "--listen", "127.0.0.1:0", "--metrics_listen=", "--unix_socket", sock,
             "--fast_socket", fast, "--backend", "cuda" if args.device.startswith("cuda") else "cpu"]
    if args.device.startswith("cuda"):
        flags.append("--allow_cuda_ipc")
    log = open(os.path.join(tmp, "fp4qd.log"), "w")
    proc = subprocess.Popen(flags, stdout=subprocess.PIPE, stderr=log, text=True)
    line = proc.stdout.readline()
    if "listening" not in line:
        raise SystemExit("fp4qd did not start: %s (log %s)" % (line, log.name))
    return proc, "unix:" + sock, fast


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fp4qd", help="start this fp4qd (else --server)")
    ap.add_argument("--server", help="a running fp4qd's gRPC address (unix:/path on a GPU)")
    ap.add_argument("--fast-socket", default="", help="its --fast_socket path")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--port", type=int, default=29517)
    ap.add_argument("--ways", default="fp4q,torch")
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.width % 16 != 0:
        raise SystemExit("--width: %d is not a multiple of 16 (stored weights)" % args.width)
    tmp = tempfile.mkdtemp(prefix="fp4q-dp-")
    proc = None
    if args.fp4qd:
        proc, args.server, args.fast_socket = start_fp4qd(args, tmp)
    if not args.server:
        raise SystemExit("give --fp4qd or --server")
    report = {"ranks": args.ranks, "layers": args.layers, "width": args.width,
              "batch": args.batch, "steps": args.steps, "command": " ".join(sys.argv),
              "torch": torch.__version__, "ways": {}}
    if args.device.startswith("cuda"):
        report["gpu"] = torch.cuda.get_device_name(0)
    report["commit"] = os.environ.get("FP4Q_COMMIT")
    if not report["commit"]:
        try:
            report["commit"] = subprocess.run(
                ["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True,
                text=True).stdout.strip()
        except OSError:
            report["commit"] = "unknown"
    try:
        for way in args.ways.split(","):
            mp.spawn(run_rank, args=(args, way, tmp), nprocs=args.ranks, join=True)
            ranks = [json.load(open(os.path.join(tmp, "%s-%d.json" % (way, r))))
                     for r in range(args.ranks)]
            same = all(r["param_bytes_head"] == ranks[0]["param_bytes_head"] and
                       r["param_checksum"] == ranks[0]["param_checksum"] for r in ranks)
            w = {"per_rank": ranks, "ranks_agree": same,
                 "step_median_ms": statistics.median(r["step"]["median_ms"] for r in ranks),
                 "optimizer_median_ms": statistics.median(
                     r["optimizer"]["median_ms"] for r in ranks),
                 "forward_backward_median_ms": statistics.median(
                     r["forward_backward"]["median_ms"] for r in ranks),
                 "final_loss": statistics.mean(r["final_loss"] for r in ranks)}
            if way == "fp4q":
                w["state_bytes_per_param"] = ranks[0]["server_bytes_per_param"]
            else:
                w["state_bytes_per_param"] = 8.0 * args.ranks
            report["ways"][way] = w
            print("%-6s step %7.2f ms (fwd+bwd %6.2f, optimizer %6.2f) final loss %.5f ranks "
                  "agree %s state %.2f B/param" %
                  (way, w["step_median_ms"], w["forward_backward_median_ms"],
                   w["optimizer_median_ms"], w["final_loss"], same, w["state_bytes_per_param"]))
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
