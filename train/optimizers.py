#!/usr/bin/env python3
"""The examples' two problems trained with fp4qd's own optimizers, beside torch's fp32 ones.

    python3 train/optimizers.py --out OUT [--steps 300] [--seed 1] [--plot PNG]
                                [--server ADDR | --fp4qd PATH]

The problems are those of examples/ (docs/TRAINING.md "The problem"): a teacher/student linear
regression (64x256 weight, 2048 samples) and a two-layer softsign MLP (128 -> 64 -> 16, 512
samples), the teacher one fine-tuning step away from the student's start (W* = W0 + 0.5 E). Here
they are written in torch (torch's RNG, not the examples' SplitMix64), and each is trained from
the same start by:

  torch-adamw       torch.optim.AdamW on fp32 weights (the reference)
  fp4q-adamw-*      fp4q.optim.AdamW: weights stored in NVFP4 (1x16) on fp4qd, f32 moments,
                    rtn | sr | rtn-ef | sr-ef; rtn-ef-bf16 / rtn-ef-nvfp4: bf16 or NVFP4 moments;
                    rtn-ef-delayed: delayed scaling (the previous step's amax, one pass)
  torch-sgdm        torch.optim.SGD, momentum 0.9, on fp32 weights
  fp4q-sgdm-*       fp4q.optim.SGD, momentum 0.9, the momentum buffer on fp4qd: rtn | rtn-ef

Every per-element AdamW step (about lr = 1e-3) is far below half an NVFP4 grid step of these
weights (about 0.01), so round-to-nearest alone cannot move a weight and stalls, while error
feedback carries the dropped part into the next step and follows fp32. The checks printed at the
end are asserted: the exit status is 1 when one fails, naming it. OUT/optimizers.json holds every
loss curve; --plot draws them (matplotlib).

Without --server an fp4qd is started on the CPU backend (--fp4qd PATH, else $FP4Q_FP4QD, else
build/bin/fp4qd) and stopped at the end.
"""

import argparse
import json
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "client", "python"))

import fp4q  # noqa: E402
from fp4q_train import server as S  # noqa: E402

LR_ADAMW = 1e-3
LR_SGD = {"linear": 0.02, "mlp": 0.1}  # the examples' learning rates
MOMENTUM = 0.9
ROUNDING = {"rtn": "nearest", "sr": "stochastic"}


def softsign(z):
    return z / (1 + z.abs())


class Problem:
    """A teacher/student regression; loss() is the mean squared error over the samples."""

    def __init__(self, kind, seed):
        g = torch.Generator().manual_seed(seed)
        self.kind = kind
        if kind == "linear":
            shapes, n = [(64, 256)], 2048
        else:
            shapes, n = [(64, 128), (16, 64)], 512
        self.w0 = [torch.randn(s, generator=g) / s[1] ** 0.5 for s in shapes]
        self.teacher = [w + 0.5 * torch.randn(w.shape, generator=g) / w.shape[1] ** 0.5
                        for w in self.w0]
        self.x = torch.randn(n, shapes[0][1], generator=g)
        with torch.no_grad():
            self.y = self.forward(self.teacher, self.x)
            # The linear loss from its sufficient statistics, as the C++ example computes it:
            # the same function, 64x256x256 work a step instead of 2048x64x256.
            self.xx = self.x.t() @ self.x / n
            self.yx = self.y.t() @ self.x / n
            self.yy = (self.y ** 2).sum() / n

    def forward(self, ws, x):
        if self.kind == "linear":
            return x @ ws[0].t()
        return softsign(x @ ws[0].t()) @ ws[1].t()

    def model(self):
        return torch.nn.ParameterList([torch.nn.Parameter(w.clone()) for w in self.w0])

    def loss(self, m):
        ws = list(m)
        if self.kind == "linear":
            w = ws[0]
            return (((w @ self.xx) * w).sum() - 2 * (self.yx * w).sum() + self.yy) / w.shape[0]
        return torch.mean((self.forward(ws, self.x) - self.y) ** 2)


def variants(client, seed):
    """name -> a function of (named parameters, problem kind) making the optimizer."""
    def stored(cls, prefix, **kw):
        def make(params, kind):
            return cls(params, client=client, name_prefix="%s/%s/" % (prefix, kind),
                       existing="replace", seed=seed, **kw)
        return make

    adam = dict(lr=LR_ADAMW, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    v = {"torch-adamw": lambda p, k: torch.optim.AdamW([t for _, t in p], **adam)}
    for r, ef in (("rtn", False), ("sr", False), ("rtn-ef", True), ("sr-ef", True)):
        v["fp4q-adamw-" + r] = stored(fp4q.optim.AdamW, "opt-adamw-" + r, rounding=ROUNDING[r.split("-")[0]],
                                      error_feedback=ef, **adam)
    for dt in ("bf16", "nvfp4"):
        v["fp4q-adamw-rtn-ef-" + dt] = stored(fp4q.optim.AdamW, "opt-adamw-ef-" + dt,
                                              rounding="nearest", error_feedback=True,
                                              state_dtype=dt, **adam)
    v["fp4q-adamw-rtn-ef-delayed"] = stored(fp4q.optim.AdamW, "opt-adamw-ef-delayed",
                                            rounding="nearest", error_feedback=True,
                                            scaling="delayed", **adam)
    v["torch-sgdm"] = lambda p, k: torch.optim.SGD([t for _, t in p], lr=LR_SGD[k],
                                                   momentum=MOMENTUM)
    for r, ef in (("rtn", False), ("rtn-ef", True)):
        v["fp4q-sgdm-" + r] = (lambda ef_, r_: lambda p, k: fp4q.optim.SGD(
            p, lr=LR_SGD[k], momentum=MOMENTUM, client=client,
            name_prefix="opt-sgdm-%s/%s/" % (r_, k), existing="replace", seed=seed,
            rounding="nearest", error_feedback=ef_))(ef, r)
    return v


# Bytes a stored parameter holds on the server for each optimizer state (measured by ListTensors
# on a 1024 x 1024 weight), and what the layout says it must: codes 0.5 + E4M3 scales 1/16, the
# f32 residual 4 with error feedback, each moment 4 (f32), 2 (bf16) or 0.5625 (NVFP4), a few
# fixed bytes (global records, statistics) spread over 2^20 elements. torch's AdamW on an fp32
# master weight keeps 12 (the weight 4, exp_avg 4, exp_avg_sq 4) beside the model's own copy.
STATE_OPTIONS = [  # label, OptimizerSpec fields, error feedback, moments, bytes per moment
    ("plain SGD", dict(kind="sgd"), False, 0, 0),
    ("plain SGD + EF", dict(kind="sgd"), True, 0, 0),
    ("SGD momentum, f32", dict(kind="sgd", momentum=True), True, 1, 4),
    ("SGD momentum, bf16", dict(kind="sgd", momentum=True, state_dtype="bf16"), True, 1, 2),
    ("SGD momentum, NVFP4", dict(kind="sgd", momentum=True, state_dtype="nvfp4"), True, 1,
     0.5625),
    ("AdamW, f32 moments", dict(kind="adamw"), False, 2, 4),
    ("AdamW, f32 moments + EF", dict(kind="adamw"), True, 2, 4),
    ("AdamW, bf16 moments + EF", dict(kind="adamw", state_dtype="bf16"), True, 2, 2),
    ("AdamW, NVFP4 moments + EF", dict(kind="adamw", state_dtype="nvfp4"), True, 2, 0.5625),
    ("AdamW amsgrad, f32 + EF", dict(kind="adamw", amsgrad=True), True, 3, 4),
]
TORCH_ADAMW_BYTES = 12.0


def state_bytes(client):
    """(label -> measured bytes per parameter, the checks against the layout: within 0.001)."""
    n = 1024 * 1024
    w0 = torch.randn(1024, 1024) * 0.02
    out, rows = {}, []
    for label, spec, ef, moments, per in STATE_OPTIONS:
        name = "state-bytes/" + "".join(ch if ch.isalnum() else "-" for ch in label)
        client.create_weight(name, w0, error_feedback=ef, optimizer=fp4q.OptimizerSpec(**spec))
        got = [t.bytes for t in client.list_tensors() if t.name == name][0] / n
        client.delete_weight(name)
        want = 0.5625 + (4 if ef else 0) + moments * per
        out[label] = got
        print("  %-28s %7.4f B/param  (layout %.4f; torch AdamW fp32 master %.0f)" % (
            label, got, want, TORCH_ADAMW_BYTES))
        rows.append(("state bytes: %s holds its layout's bytes" % label,
                     abs(got - want) < 1e-3, "%.5f vs %.5f" % (got, want)))
    return out, rows


def floor_loss(problem, client):
    """The loss at the teacher's weights stored in NVFP4 (round-to-nearest): how close any
    4-bit stored weight can get, where fp32 reaches 0."""
    with torch.no_grad():
        q = [fp4q.functional.qdq(w, client=client) for w in problem.teacher]
        return problem.loss(torch.nn.ParameterList([torch.nn.Parameter(t) for t in q])).item()


def train(problem, make, steps):
    m = problem.model()
    opt = make(list(m.named_parameters()), problem.kind)
    losses = []
    t0 = time.perf_counter()
    for _ in range(steps):
        opt.zero_grad()
        loss = problem.loss(m)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    with torch.no_grad():
        losses.append(problem.loss(m).item())  # after the last step
    return losses, time.perf_counter() - t0


class Checks:
    def __init__(self):
        self.failed = []

    def check(self, text, passed, detail):
        print("  %-70s %s  (%s)" % (text, "yes" if passed else "FAILED", detail))
        if not passed:
            self.failed.append(text)


def check(results, floors):
    c = Checks()
    for kind, r in results.items():
        start = r["torch-adamw"][0]
        floor = floors[kind]
        for name in ("fp4q-adamw-rtn-ef", "fp4q-adamw-sr-ef", "fp4q-adamw-rtn-ef-bf16",
                     "fp4q-adamw-rtn-ef-nvfp4", "fp4q-adamw-rtn-ef-delayed", "fp4q-sgdm-rtn-ef"):
            got = r[name][-1]
            c.check("%s: %s ends within 2.5x of the 4-bit floor" % (kind, name),
                    got <= 2.5 * floor, "%.5f vs floor %.5f" % (got, floor))
        for name in ("fp4q-adamw-rtn", "fp4q-sgdm-rtn"):
            got = r[name][-1]
            c.check("%s: %s (RTN alone) stalls: final >= 0.8 x start" % (kind, name),
                    got >= 0.8 * start, "%.5f vs %.5f" % (got, 0.8 * start))
        sr = r["fp4q-adamw-sr"][-1]
        c.check("%s: fp4q-adamw-sr learns without EF: final <= 0.5 x start" % kind,
                sr <= 0.5 * start, "%.5f vs %.5f" % (sr, 0.5 * start))
        for name in ("torch-adamw", "torch-sgdm"):
            got = r[name][-1]
            c.check("%s: %s (fp32) goes below the 4-bit floor" % (kind, name), got < floor,
                    "%.5f vs floor %.5f" % (got, floor))
    return c


def plot(results, floors, path, steps):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(2, 2, figsize=(12, 8), sharex=True)
    for row, kind in enumerate(("linear", "mlp")):
        r = results[kind]
        for col, family in enumerate(("adamw", "sgdm")):
            ax = axes[row][col]
            for name in sorted(r):
                if family not in name:
                    continue
                style = "-" if name.startswith("torch") else "--"
                # The linear loss from sufficient statistics can round below 0 near the optimum.
                ax.plot([max(v, 1e-7) for v in r[name]], style, label=name, linewidth=2 if "torch" in name else 1.2)
            ax.axhline(floors[kind], color="grey", linestyle=":",
                       label="4-bit floor (teacher in NVFP4)")
            ax.set_yscale("log")
            ax.set_title("%s, %s" % (kind, "AdamW lr %g" % LR_ADAMW if family == "adamw"
                                     else "SGD momentum %g, lr %g" % (MOMENTUM, LR_SGD[kind])))
            ax.set_xlabel("step")
            ax.set_ylabel("training loss (MSE)")
            ax.legend(fontsize=8)
    fig.suptitle("The examples' problems, %d steps: fp4qd's optimizers on 4-bit stored weights "
                 "vs torch's on fp32" % steps)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="directory for optimizers.json")
    p.add_argument("--steps", type=int, default=300, help="steps per run (default 300)")
    p.add_argument("--seed", type=int, default=1, help="data, start and SR seed (default 1)")
    p.add_argument("--plot", help="also draw the curves into this PNG")
    p.add_argument("--server", help="a running fp4qd's address (else one is started)")
    p.add_argument("--fp4qd", help="the fp4qd to start (default $FP4Q_FP4QD, build/bin/fp4qd)")
    a = p.parse_args(argv)
    if a.steps < 1:
        p.error("--steps: must be at least 1")
    torch.manual_seed(a.seed)
    torch.set_num_threads(1)  # small problems: threads only contend with fp4qd
    srv = None
    if a.server is None:
        srv = S.Fp4qd(S.find_fp4qd(a.fp4qd), backend="cpu")
    target = a.server or srv.target
    try:
        client = fp4q.Client(target)
        results, seconds, floors = {}, {}, {}
        for kind in ("linear", "mlp"):
            problem = Problem(kind, a.seed)
            floors[kind] = floor_loss(problem, client)
            print("%-6s %-24s loss %.5f (the teacher's weights in NVFP4)" % (
                kind, "4-bit floor", floors[kind]), flush=True)
            results[kind], seconds[kind] = {}, {}
            for name, make in variants(client, a.seed).items():
                losses, secs = train(problem, make, a.steps)
                results[kind][name] = losses
                seconds[kind][name] = secs
                print("%-6s %-24s start %.5f  final %.5f  (%.1f s)" % (
                    kind, name, losses[0], losses[-1], secs), flush=True)
        print("\nserver bytes per parameter:")
        per_param, byte_rows = state_bytes(client)
        client.close()
    finally:
        if srv is not None:
            srv.stop()
    print("\nchecks:")
    c = check(results, floors)
    for text, passed, detail in byte_rows:
        c.check(text, passed, detail)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "optimizers.json"), "w") as f:
        json.dump({"steps": a.steps, "seed": a.seed, "lr_adamw": LR_ADAMW, "lr_sgd": LR_SGD,
                   "momentum": MOMENTUM, "floor": floors, "losses": results, "seconds": seconds,
                   "bytes_per_param": per_param, "torch_adamw_bytes_per_param": TORCH_ADAMW_BYTES,
                   "failed": c.failed}, f)
    if a.plot:
        plot(results, floors, a.plot, a.steps)
        print("wrote %s" % a.plot)
    if c.failed:
        print("FAILED: %s" % "; ".join(c.failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
