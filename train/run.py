#!/usr/bin/env python3
"""Trains a small decoder-only transformer on 3-digit addition and on byte-level text, in every
variant of fp4q's 4-bit training (train/fp4q_train/variants.py), and writes per-step CSVs and a
summary JSON.

  python3 train/run.py --preset gpu --out OUT          # the full run (one H200: see docs)
  python3 train/run.py --preset cpu-ci --out OUT       # the CI version (CPU fp4qd, ~75 s)
  python3 train/run.py --tasks add --variants bf16,rtn-ef-adamw --steps 300 --out OUT

The variants that use fp4qd need a server: by default one is started (--fp4qd PATH, else
$FP4Q_FP4QD, else build/bin/fp4qd) with the CUDA backend, --allow_cuda_ipc, a Unix socket and
the fast socket when --device cuda (CUDA tensors then travel by IPC), else the CPU backend.
--server ADDR [--fast-socket PATH] uses a running one instead. The Python client comes from
client/python (this script adds it to sys.path when fp4q is not importable).

Outputs under --out: TASK/VARIANT.csv (one row per step: step, lr, loss, the task's metrics on
evaluation steps, worker_ms, optimizer_ms, server_ms, tokens_per_s) and summary.json (the
configuration, the environment, and per task and variant the final numbers, the step-time
split, tokens/s and the server's bytes per stored parameter). Exit status: 0 done (whatever the
results), 1 error, 2 bad usage.
"""

import argparse
import csv
import json
import os
import platform
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import torch  # noqa: E402

from fp4q_train import data as D  # noqa: E402
from fp4q_train import loop  # noqa: E402
from fp4q_train import model as M  # noqa: E402
from fp4q_train import server as S  # noqa: E402
from fp4q_train import variants as V  # noqa: E402

# Presets: model size, steps, batch and evaluation cadence. Command-line flags override them.
PRESETS = {
    # One H200, all variants of both tasks: see docs/TRAINING.md for the measured time.
    "gpu": dict(tasks="add,text", variants="all", layers=4, d_model=384, heads=6, steps=1000,
                recipe_steps=200, batch_add=512, batch_text=64, block_size=128, eval_every=100,
                warmup=100, lr_adamw=1e-3, lr_sgd=0.3, amp="bf16", device="cuda", heldout=2000),
    # CI on two CPU cores: a tiny model on the text task, AdamW at 1e-3 (as the GPU run):
    # bf16, frozen block weights, RTN and RTN+EF stored weights (see docs/TRAINING.md).
    "cpu-ci": dict(tasks="text", variants="ci", layers=2, d_model=64, heads=2, steps=400,
                   recipe_steps=None, batch_add=64, batch_text=16, block_size=64, eval_every=100,
                   warmup=30, lr_adamw=1e-3, lr_sgd=0.3, amp="bf16", device="cpu", heldout=500),
}


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=sorted(PRESETS), default="gpu",
                   help="gpu (default): 4 layers, d_model 384, both tasks, every variant, 1000 "
                   "steps (NVFP4-GEMM variants 200), --device cuda; cpu-ci: 2 layers, d_model "
                   "64, text, bf16/frozen/RTN/RTN+EF AdamW, 400 steps, --device cpu. The flags "
                   "below override a preset's values")
    p.add_argument("--tasks", help="comma-separated: add, text")
    p.add_argument("--variants", help="comma-separated names or groups (all, stored, ci); "
                   "see train/fp4q_train/variants.py")
    p.add_argument("--steps", type=int, help="training steps per variant")
    p.add_argument("--recipe-steps", type=int,
                   help="stop the NVFP4 GEMM variants (nvfp4-*, nvfp4+*) after this many steps "
                   "(their learning-rate schedule is still that of --steps); default --steps")
    p.add_argument("--batch-add", type=int, help="addition problems per batch (12 tokens each)")
    p.add_argument("--batch-text", type=int, help="text windows per batch")
    p.add_argument("--block-size", type=int, help="text window length in bytes")
    p.add_argument("--heldout", type=int, help="held-out addition pairs (the probe)")
    p.add_argument("--layers", type=int)
    p.add_argument("--d-model", type=int)
    p.add_argument("--heads", type=int)
    p.add_argument("--lr-adamw", type=float, help="AdamW peak learning rate")
    p.add_argument("--lr-sgd", type=float, help="SGD peak learning rate (momentum 0.9)")
    p.add_argument("--warmup", type=int, help="linear warm-up steps (then cosine to 10%%)")
    p.add_argument("--eval-every", type=int)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--device", choices=["cuda", "cpu"])
    p.add_argument("--amp", choices=["bf16", "off"],
                   help="bf16: forward under torch.autocast(bfloat16); off: f32")
    p.add_argument("--text-dir", help="folder whose *.py files are the text corpus "
                   "(default: this interpreter's standard library)")
    p.add_argument("--server", help="a running fp4qd's gRPC address (host:port or unix:PATH)")
    p.add_argument("--fast-socket", help="with --server: its --fast_socket path")
    p.add_argument("--fp4qd", help="the fp4qd binary to start (default $FP4Q_FP4QD, "
                   "build/bin/fp4qd)")
    p.add_argument("--backend", choices=["cpu", "cuda"],
                   help="the started fp4qd's backend (default: cuda with --device cuda)")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--quiet", action="store_true")
    a = p.parse_args(argv)
    for k, v in PRESETS[a.preset].items():
        if getattr(a, k, None) is None:
            setattr(a, k, v)
    if a.recipe_steps is None:
        a.recipe_steps = a.steps
    try:
        a.variant_list = V.expand(a.variants)
        a.task_list = [t.strip() for t in a.tasks.split(",") if t.strip()]
        bad = [t for t in a.task_list if t not in ("add", "text")]
        if bad or not a.task_list:
            raise ValueError("--tasks: %r (add, text)" % a.tasks)
        if a.steps < 1 or a.recipe_steps < 1:
            raise ValueError("--steps and --recipe-steps must be >= 1")
    except ValueError as e:
        p.error(str(e))
    if a.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: torch sees no CUDA device (--device cpu?)")
    return a


def _import_fp4q():
    try:
        import fp4q  # noqa: F401
    except ImportError:
        sys.path.insert(0, os.path.join(REPO, "client", "python"))
        import fp4q  # noqa: F401
    return sys.modules["fp4q"]


def _git_commit():
    if os.environ.get("FP4Q_COMMIT"):  # set by scripts/device/run.sh: the bundle's commit
        return os.environ["FP4Q_COMMIT"]
    try:
        # "-dirty": tracked files differ from the commit (fp4qd may be built from them).
        return subprocess.run(["git", "-C", REPO, "describe", "--always", "--dirty"],
                              capture_output=True, text=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


class CsvLog:
    def __init__(self, path, metric_names):
        self.f = open(path, "w", newline="")
        self.cols = (["step", "lr", "loss"] + list(metric_names) +
                     ["worker_ms", "optimizer_ms", "server_ms", "tokens_per_s"])
        self.w = csv.DictWriter(self.f, self.cols, extrasaction="ignore")
        self.w.writeheader()

    def __call__(self, row):
        self.w.writerow({k: ("%.6g" % v if isinstance(v, float) else v) for k, v in row.items()})

    def close(self):
        self.f.close()


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    log = (lambda *x: None) if a.quiet else (lambda s: print(s, flush=True))
    os.makedirs(a.out, exist_ok=True)
    device = torch.device(a.device)
    need_server = any(v.uses_server for v in a.variant_list)
    fp4q = _import_fp4q() if need_server else None
    srv = client = None
    info = {}
    try:
        if need_server:
            if a.server:
                client = fp4q.Client(a.server, fast_socket=a.fast_socket, timeout=600)
            else:
                backend = a.backend or ("cuda" if a.device == "cuda" else "cpu")
                srv = S.Fp4qd(S.find_fp4qd(a.fp4qd), backend=backend)
                log("fp4qd: %s (%s backend)" % (srv.target, backend))
                client = fp4q.Client(srv.target, fast_socket=srv.fast, timeout=600)
            si = client.server_info()
            info = {"backend": si.backend, "version": si.version,
                    "gpus": [g.name for g in si.gpus], "started_here": srv is not None,
                    "fast_socket": bool(srv.fast if srv else a.fast_socket)}
        summary = {"command": " ".join(["train/run.py"] + (sys.argv[1:] if argv is None
                                                            else list(argv))),
                   "config": {k: v for k, v in vars(a).items()
                              if k not in ("variant_list", "task_list")},
                   "variants": [v.name for v in a.variant_list], "tasks": a.task_list,
                   "environment": {"torch": torch.__version__, "python": platform.python_version(),
                                   "device": (torch.cuda.get_device_name(device)
                                              if device.type == "cuda" else "CPU " + (platform.processor()
                                                                           or platform.machine())),
                                   "cpu_threads": torch.get_num_threads(),
                                   "commit": _git_commit(), "server": info},
                   "data": {}, "results": {}}
        t_all = time.perf_counter()
        for task_name in a.task_list:
            task = D.make_task(task_name, a.seed, a.text_dir, a.block_size, a.heldout)
            summary["data"][task_name] = task.describe()
            cfg = M.Config(vocab_size=task.vocab_size, block_size=task.block_size,
                           layers=a.layers, d_model=a.d_model, heads=a.heads)
            batch = a.batch_add if task_name == "add" else a.batch_text
            os.makedirs(os.path.join(a.out, task_name), exist_ok=True)
            results = summary["results"][task_name] = {}
            for v in a.variant_list:
                steps = a.recipe_steps if v.nvfp4_gemm else a.steps
                # steps: the schedule's length, the same for every variant
                hp = loop.Hyper(seed=a.seed, steps=a.steps, batch=batch, warmup=a.warmup,
                                min_lr_frac=0.1, lr_adamw=a.lr_adamw, lr_sgd=a.lr_sgd,
                                betas=(0.9, 0.95), eps=1e-8, weight_decay_adamw=0.1,
                                weight_decay_sgd=0.0, momentum=0.9, clip=1.0,
                                eval_every=a.eval_every, log_every=max(1, a.eval_every),
                                amp=a.amp)
                csv_log = CsvLog(os.path.join(a.out, task_name, v.name + ".csv"),
                                 task.metric_names)
                prefix = "train/%d/%s/%s/" % (os.getpid(), task_name, v.name.replace("+", "_"))
                log("== %s / %s (%d steps)" % (task_name, v.name, steps))
                try:
                    res, _ = loop.train(v, task, cfg, hp, client, device, prefix, log=log,
                                        on_row=csv_log, max_steps=steps)
                finally:
                    csv_log.close()
                res["model"] = {"layers": cfg.layers, "d_model": cfg.d_model,
                                "heads": cfg.heads, "vocab": cfg.vocab_size,
                                "block_size": cfg.block_size}
                results[v.name] = res
                log("== %s / %s: %.1f s" % (task_name, v.name, res["wall_s"]))
                with open(os.path.join(a.out, "summary.json"), "w") as f:
                    json.dump(summary, f, indent=1)
        summary["wall_s"] = time.perf_counter() - t_all
        with open(os.path.join(a.out, "summary.json"), "w") as f:
            json.dump(summary, f, indent=1)
        log("wrote %s (%.0f s)" % (os.path.join(a.out, "summary.json"), summary["wall_s"]))
    finally:
        if client is not None:
            client.close()
        if srv is not None:
            srv.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
