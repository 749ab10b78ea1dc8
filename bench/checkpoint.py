#!/usr/bin/env python3
"""What checkpointing fp4qd's training state costs a job, through the server.

    # GPU: fp4qd started by the benchmark, its --state_dir in a folder under --dir
    python3 bench/checkpoint.py --fp4qd build/bin/fp4qd --dir /tmp --json out.json
    # no GPU: the same model on fp4qd's CPU backend (tensors inline), or tiny shapes (CI)
    python3 bench/checkpoint.py --cpu --fp4qd build/bin/fp4qd
    python3 bench/checkpoint.py --dry-run --fp4qd build/bin/fp4qd

The model: GPT-2 small's 50 matrices (124.3M parameters; --dry-run: 10 small ones) stored by
fp4q.optim.SGD (momentum 0.9, round-to-nearest with error feedback: codes, scales, residual and
momentum on the server), stepped --warmup times so that the state is not the initial one. Then:
  - Checkpoint, the RPC: its wall time (the median of --repeats), the file's bytes and tensors,
    and its bandwidth;
  - the floor: as many bytes written by this process into the same folder and fsync'd (the
    file system's own speed, measured in the same run; the median of --repeats);
  - the alternative: torch.save of what torch's SGD keeps for the same model (fp32 master
    weights and momentum buffers), fsync'd, into the same folder (the median of --repeats);
  - a step during a checkpoint: fp4q.optim's step timed while a Checkpoint runs on another
    connection (a checkpoint copies each weight under that weight's lock, one at a time),
    against the step alone;
  - the restart: fp4qd stopped and started again on the folder, the time until it serves, and
    every weight read back (codes, scales, global scale, residual, momentum, last step) compared
    with what it held before the stop, byte for byte.
--json writes all of it with the device, torch version, commit and command.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "client", "python"))

import torch  # noqa: E402

import fp4q  # noqa: E402
from fp4qd_process import Fp4qd, add_server_args, commit  # noqa: E402
from trainer_step import Model, gpt2_shapes, sync  # noqa: E402

NAMESPACE = "bench-checkpoint"


def write_floor(folder, nbytes):
    """Seconds to write `nbytes` (random, 64 MiB at a time) into a new file of `folder` and
    fsync it: the file system's speed for a checkpoint's bytes."""
    chunk = os.urandom(min(nbytes, 64 << 20))
    path = os.path.join(folder, "floor.bin")
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        left = nbytes
        while left > 0:
            n = min(left, len(chunk))
            f.write(chunk[:n])
            left -= n
        f.flush()
        os.fsync(f.fileno())
    seconds = time.perf_counter() - t0
    os.unlink(path)
    return seconds


def torch_save(model, folder):
    """(seconds, bytes) of torch.save of torch's SGD state for the model (fp32 master weights
    and momentum buffers after one step), fsync'd."""
    masters = [torch.nn.Parameter(p.detach().float()) for _, p in model.params]
    for m, (_, p) in zip(masters, model.params):
        m.grad = p.grad.float()
    opt = torch.optim.SGD(masters, lr=1e-3, momentum=0.9)
    opt.step()
    sync(masters[0].device)
    path = os.path.join(folder, "torch-sgd.pt")
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        torch.save({"params": [m.detach() for m in masters], "optimizer": opt.state_dict()}, f)
        f.flush()
        os.fsync(f.fileno())
    seconds = time.perf_counter() - t0
    size = os.path.getsize(path)
    os.unlink(path)
    return seconds, size


def stored_state(client, names):
    """{name: (codes, scales, global record, residual, momentum, last step)} as fp4qd holds
    them, the tensors as bytes."""
    out = {}
    for n in names:
        w = client.get_weight(n, dequantized=False, quantized=True, residual=True,
                              optimizer_state=True)
        q = w.quantized
        momentum = w.optimizer_state.moments["momentum_buffer"]
        out[n] = (q.codes.cpu().numpy().tobytes(), q.scales.cpu().numpy().tobytes(),
                  (q.global_amax, q.s_enc), w.residual.float().cpu().numpy().tobytes(),
                  momentum.float().cpu().numpy().tobytes(), w.info.last_step)
    return out


def timed_steps(opt, device, n):
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        opt.step()
        sync(device)
        times.append(time.perf_counter() - t0)
    return times


def steps_during_checkpoint(server, opt, device, args):
    """Step times while Checkpoints run back to back on another connection (at least
    --repeats of them and --steps steps), and the number of checkpoints taken."""
    other = server.client(True, NAMESPACE, ipc_mode(device))
    done = threading.Event()
    taken, failed = [], []

    def checkpoints():
        try:
            while not done.is_set() or len(taken) < args.repeats:
                other.checkpoint()
                taken.append(1)
        except Exception as e:  # noqa: BLE001 (raised again on the main thread)
            failed.append(e)
        finally:
            other.close()
    t = threading.Thread(target=checkpoints, name="checkpoints")
    t.start()
    times = []
    try:
        while len(times) < args.steps or len(taken) < args.repeats:
            times += timed_steps(opt, device, 1)
            if not t.is_alive():
                break
    finally:
        done.set()
        t.join()
    if failed:
        raise failed[0]
    return times, len(taken)


def ipc_mode(device):
    return "require" if device.type == "cuda" else "never"


def ms(seconds):
    return seconds * 1e3


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dry-run", action="store_true",
                    help="CPU, tiny shapes, inline tensors, few repeats")
    ap.add_argument("--cpu", action="store_true",
                    help="GPT-2's shapes on fp4qd's CPU backend, tensors inline")
    add_server_args(ap, 32 << 30)
    ap.add_argument("--dir", default=tempfile.gettempdir(),
                    help="where fp4qd's state folder is made (the file system measured)")
    ap.add_argument("--warmup", type=int, default=3, help="steps before the first checkpoint")
    ap.add_argument("--repeats", type=int, default=3, help="checkpoints timed (median)")
    ap.add_argument("--steps", type=int, default=20, help="steps timed alone and during")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    if not args.fp4qd:
        ap.error("give --fp4qd: the benchmark restarts the fp4qd it starts")
    for name in ("warmup", "repeats", "steps"):
        if getattr(args, name) < 1:
            ap.error("--%s: at least 1" % name)
    if args.dry_run:
        device = torch.device("cpu")
        args.repeats, args.steps = min(args.repeats, 2), min(args.steps, 4)
        args.state_budget_bytes = min(args.state_budget_bytes, 1 << 30)
    elif args.cpu:
        device = torch.device("cpu")
    else:
        if not torch.cuda.is_available():
            ap.error("no CUDA device: run with --dry-run here")
        device = torch.device("cuda", torch.cuda.current_device())
    folder = tempfile.mkdtemp(prefix="fp4q-checkpoint-", dir=args.dir)
    args.fp4qd_arg = args.fp4qd_arg + ["--state_dir", folder]
    model = Model(gpt2_shapes(args.dry_run), device, torch.bfloat16, seed=7)
    result = {
        "command": [sys.executable] + sys.argv if argv is None else ["checkpoint.py"] + argv,
        "commit": commit(), "torch": torch.__version__, "dry_run": args.dry_run,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "parameters": model.numel, "matrices": len(model.shapes), "state_dir": folder}
    server = Fp4qd(args, cuda=device.type == "cuda")
    result["fp4qd_command"] = server.command
    try:
        client = server.client(True, NAMESPACE, ipc_mode(device))
        opt = fp4q.optim.SGD(model.params, lr=1e-3, momentum=0.9, client=client)
        names = list(opt.stored_names.values())
        for _ in range(args.warmup):
            opt.step()
        sync(device)
        walls, reply = [], None
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            reply = client.checkpoint()
            walls.append(time.perf_counter() - t0)
        size = reply.bytes
        floor_s = statistics.median(write_floor(folder, size) for _ in range(args.repeats))
        saves = [torch_save(model, folder) for _ in range(args.repeats)]
        torch_s, torch_bytes = statistics.median(t for t, _ in saves), saves[0][1]
        alone = timed_steps(opt, device, args.steps)
        during, taken = steps_during_checkpoint(server, opt, device, args)
        before = stored_state(client, names)
        client.checkpoint()  # the state just read is the one the restart must bring back
        client.close()
        result.update({
            "checkpoint": {"median_ms": ms(statistics.median(walls)),
                           "all_ms": [ms(w) for w in walls], "bytes": size,
                           "tensors": reply.tensors, "file": reply.path,
                           "gb_per_s": size / statistics.median(walls) / 1e9,
                           "bytes_per_parameter": size / model.numel},
            "floor": {"ms": ms(floor_s), "gb_per_s": size / floor_s / 1e9},
            "torch_save": {"ms": ms(torch_s), "bytes": torch_bytes,
                           "gb_per_s": torch_bytes / torch_s / 1e9},
            "step_alone": {"median_ms": ms(statistics.median(alone)),
                           "max_ms": ms(max(alone))},
            "step_during_checkpoint": {"median_ms": ms(statistics.median(during)),
                                       "max_ms": ms(max(during)), "steps": len(during),
                                       "checkpoints": taken}})
        server.stop()  # fp4qd writes its state once more as it stops: the same
        t0 = time.perf_counter()
        server = Fp4qd(args, cuda=device.type == "cuda")
        restart_s = time.perf_counter() - t0
        fresh = server.client(True, NAMESPACE, ipc_mode(device))
        after = stored_state(fresh, names)
        fresh.close()
        differ = sorted(n for n in names if after[n] != before[n])
        result["restart"] = {"serving_after_ms": ms(restart_s), "weights": len(names),
                             "bit_identical": not differ, "differing": differ}
    finally:
        server.stop()
        for f in os.listdir(folder) if os.path.isdir(folder) else []:
            os.unlink(os.path.join(folder, f))
        if os.path.isdir(folder):
            os.rmdir(folder)
    report(result)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
        print("wrote %s" % args.json)
    return 0 if result["restart"]["bit_identical"] else 1


def report(r):
    c, fl, ts = r["checkpoint"], r["floor"], r["torch_save"]
    print("%s, %d matrices, %d parameters (%s)" % (
        "GPT-2 small" if not r["dry_run"] else "tiny GPT-2 shapes", r["matrices"],
        r["parameters"], r["device"]))
    print("Checkpoint: %.1f ms for %d bytes (%.2f bytes a parameter, %d tensors): %.2f GB/s" % (
        c["median_ms"], c["bytes"], c["bytes_per_parameter"], c["tensors"], c["gb_per_s"]))
    print("  the floor, the same bytes written and fsync'd here: %.1f ms (%.2f GB/s); "
          "Checkpoint takes %.2fx" % (fl["ms"], fl["gb_per_s"], c["median_ms"] / fl["ms"]))
    print("  torch.save of torch SGD's fp32 weights and momentum: %.1f ms for %d bytes "
          "(%.2f GB/s)" % (ts["ms"], ts["bytes"], ts["gb_per_s"]))
    a, d = r["step_alone"], r["step_during_checkpoint"]
    print("a step: %.2f ms alone (max %.2f); %.2f ms during checkpoints (max %.2f; %d steps, "
          "%d checkpoints)" % (a["median_ms"], a["max_ms"], d["median_ms"], d["max_ms"],
                               d["steps"], d["checkpoints"]))
    rs = r["restart"]
    print("restart: serving after %.1f ms; %d weights read back %s" % (
        rs["serving_after_ms"], rs["weights"],
        "bit-identical" if rs["bit_identical"] else "DIFFERING: %s" % rs["differing"]))


if __name__ == "__main__":
    sys.exit(main())
