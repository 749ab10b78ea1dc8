"""One variant of one task: build the model and optimizer, train, evaluate, measure.

Timing per step (CUDA: synchronized at each boundary, so the parts add up to the step):
  worker_ms     forward, loss, backward and gradient clipping (the training worker's own work;
                for the NVFP4 GEMM variants it includes their GEMM calls to fp4qd)
  optimizer_ms  optimizer.step(): for the stored variants the fp4q.optim step (gradients to the
                server in one batched call, DQ(W) back into param.data) plus the torch update
                of the parameters that stay in torch; for the others torch's update
  server_ms     the stored variants' fp4q.optim step alone (its share of optimizer_ms)
"""

import math
import time

import torch
import torch.nn.functional as F

from fp4q_train import model as M


class Hyper:
    """Training hyperparameters (the same for every variant of a task). Fields are set from the
    preset and the command line; see run.py for the defaults."""

    def __init__(self, **kw):
        self.__dict__.update(kw)

    def lr_at(self, step, peak):
        """Linear warm-up over `warmup` steps, then cosine decay to min_lr_frac * peak."""
        if step <= self.warmup:
            return peak * step / max(1, self.warmup)
        frac = (step - self.warmup) / max(1, self.steps - self.warmup)
        return peak * (self.min_lr_frac + (1 - self.min_lr_frac) * 0.5 * (1 + math.cos(
            math.pi * min(1.0, frac))))

    def as_dict(self):
        return dict(self.__dict__)


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _decay(hp, opt):
    return hp.weight_decay_adamw if opt == "adamw" else hp.weight_decay_sgd


def _groups(params_named, hp, opt):
    """Two param groups: matrices with weight decay, vectors (LayerNorm, biases) without."""
    wd = _decay(hp, opt)
    decay = [p for n, p in params_named if p.dim() >= 2]
    rest = [p for n, p in params_named if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": wd}]
    if rest:
        groups.append({"params": rest, "weight_decay": 0.0})
    return [g for g in groups if g["params"]]


def _torch_optimizer(opt, groups, hp):
    if opt == "adamw":
        return torch.optim.AdamW(groups, lr=hp.lr_adamw, betas=tuple(hp.betas), eps=hp.eps)
    return torch.optim.SGD(groups, lr=hp.lr_sgd, momentum=hp.momentum)


class Optimizers:
    """The stored variants' pair: fp4q.optim over the block linear weights, torch's optimizer
    of the same kind over everything else. fp4q.optim makes the same split itself when given
    every parameter with exclude=[...]; it is written out here so that step() can time the
    server's part alone."""

    def __init__(self, stored, plain):
        self.stored, self.plain = stored, plain
        self.param_groups = stored.param_groups + (plain.param_groups if plain else [])
        self.server_ms = 0.0

    def step(self, device):
        t0 = time.perf_counter()
        self.stored.step()
        _sync(device)
        self.server_ms = (time.perf_counter() - t0) * 1e3
        if self.plain:
            self.plain.step()

    def zero_grad(self, set_to_none=True):
        self.stored.zero_grad(set_to_none=True)
        if self.plain:
            self.plain.zero_grad(set_to_none=True)


def build(variant, task, cfg, hp, client, device, prefix):
    """The model (same initial weights for every variant) and its optimizer."""
    torch.manual_seed(hp.seed)
    model = M.Transformer(cfg)
    if variant.nvfp4_gemm:
        import fp4q.nn
        counter = iter(range(1, 1 << 20))
        M.swap_linears(model, lambda lin: fp4q.nn.Linear.from_linear(
            lin, client=client, seed=hp.seed * 7919 + next(counter)))
    model.to(device)
    if variant.frozen:
        for n, p in model.named_parameters():
            if n in set(M.block_linear_names(model)):
                p.requires_grad_(False)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not variant.stored:
        return model, _torch_optimizer(variant.optimizer, _groups(named, hp, variant.optimizer),
                                       hp), []
    import fp4q.optim
    store = set(M.block_linear_names(model))
    stored_named = [(n, p) for n, p in named if n in store]
    other_named = [(n, p) for n, p in named if n not in store]
    common = dict(rounding=variant.rounding, error_feedback=variant.error_feedback,
                  block=variant.block, seed=hp.seed, client=client, name_prefix=prefix)
    # Named parameters: the server's weights are called prefix + the parameter's name.
    groups = [{"params": stored_named, "weight_decay": _decay(hp, variant.optimizer)}]
    if variant.optimizer == "adamw":
        stored = fp4q.optim.AdamW(groups, lr=hp.lr_adamw, betas=tuple(hp.betas), eps=hp.eps,
                                  **common)
    else:
        stored = fp4q.optim.SGD(groups, lr=hp.lr_sgd, momentum=hp.momentum, **common)
    plain = None
    if other_named:
        plain = _torch_optimizer(variant.optimizer, _groups(other_named, hp, variant.optimizer),
                                 hp)
    return model, Optimizers(stored, plain), [n for n, _ in stored_named]


def _server_listing(client, prefix):
    return [t for t in client.list_tensors() if t.name.startswith(prefix)]


def _codes(client, names):
    return {n: client.get_weight(n, dequantized=False, quantized=True).quantized.codes.cpu()
            for n in names}


def _nibbles(codes):
    # -0 (0x8) and +0 (0x0) are one value.
    lo, hi = codes & 0xF, codes >> 4
    both = torch.stack([lo, hi])
    return torch.where(both == 8, torch.zeros_like(both), both)


def _moved(first, last):
    changed = total = 0
    for n, c in first.items():
        a, b = _nibbles(c), _nibbles(last[n])
        changed += int((a != b).sum())
        total += a.numel()
    return changed / max(1, total)


def train(variant, task, cfg, hp, client, device, prefix, log=print, on_row=None,
          max_steps=None):
    """Trains one variant for max_steps (default hp.steps, the schedule's length) steps;
    returns its summary (a dict) and its per-step rows."""
    last = min(hp.steps, max_steps or hp.steps)
    device = torch.device(device)
    task.reset_order()
    model, opt, stored_names = build(variant, task, cfg, hp, client, device, prefix)
    n_params = sum(p.numel() for p in model.parameters())
    n_stored = sum(p.numel() for n, p in model.named_parameters() if n in set(stored_names))
    peak = hp.lr_adamw if variant.optimizer == "adamw" else hp.lr_sgd
    amp = hp.amp == "bf16"
    params = [p for p in model.parameters() if p.requires_grad]
    server_names = []
    first_codes, codes_from = None, None

    def evaluate():
        model.eval()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            m = task.evaluate(model, device)
        model.train()
        return m

    def snapshot_codes(step):
        nonlocal server_names, first_codes, codes_from
        listing = [t for t in _server_listing(client, prefix) if t.kind == 1]  # weights
        server_names = sorted(t.name for t in listing)
        if server_names:
            first_codes, codes_from = _codes(client, server_names), step

    if variant.stored:
        snapshot_codes(0)
    rows, t_start = [], time.perf_counter()
    row0 = {"step": 0, "lr": 0.0, "loss": "", **evaluate()}
    rows.append(row0)
    if on_row:
        on_row(row0)
    tokens = task.tokens_per_batch(hp.batch)
    for step in range(1, last + 1):
        x, y = task.batch(hp.batch)
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        lr = hp.lr_at(step, peak)
        for g in opt.param_groups:
            g["lr"] = lr
        _sync(device)
        t0 = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            logits = model(x)
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1),
                               ignore_index=-100)
        loss.backward()
        if hp.clip > 0:
            torch.nn.utils.clip_grad_norm_(params, hp.clip)
        loss_value = float(loss)  # synchronizes
        _sync(device)
        t1 = time.perf_counter()
        if isinstance(opt, Optimizers):
            opt.step(device)
        else:
            opt.step()
        _sync(device)
        t2 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        if not math.isfinite(loss_value):
            log("%s: loss %r at step %d: stopping this variant" % (variant.name, loss_value, step))
        if variant.stored and first_codes is None:
            snapshot_codes(step)
        row = {"step": step, "lr": lr, "loss": loss_value,
               "worker_ms": (t1 - t0) * 1e3, "optimizer_ms": (t2 - t1) * 1e3,
               "server_ms": opt.server_ms if isinstance(opt, Optimizers) else 0.0,
               "tokens_per_s": tokens / max(1e-9, t2 - t0)}
        if step % hp.eval_every == 0 or step == last or not math.isfinite(loss_value):
            row.update(evaluate())
        rows.append(row)
        if on_row:
            on_row(row)
        if step % hp.log_every == 0 or step == last:
            log("%-20s step %5d  loss %.4f  %s  %.1f+%.1f ms" % (
                variant.name, step, loss_value, _fmt_metrics(task, row), row["worker_ms"],
                row["optimizer_ms"]))
        if not math.isfinite(loss_value):
            break
    wall = time.perf_counter() - t_start
    summary = _summarize(variant, task, hp, rows, wall, n_params, n_stored)
    if variant.stored:
        listing = _server_listing(client, prefix)
        held = sum(t.bytes for t in listing)
        summary["server_bytes"] = held
        summary["server_bytes_per_stored_param"] = held / max(1, n_stored)
        summary["server_tensors"] = len(listing)
        if first_codes is not None:
            summary["codes_moved"] = _moved(first_codes, _codes(client, server_names))
            summary["codes_moved_since_step"] = codes_from
        for t in listing:
            if t.kind == 1:
                client.delete_weight(t.name)
    return summary, rows


def _fmt_metrics(task, row):
    keys = [k for k in task.metric_names if k in row]
    return "  ".join("%s %.4f" % (k, row[k]) for k in keys) if keys else ""


def _median(xs):
    xs = sorted(xs)
    if not xs:
        return None
    m = len(xs) // 2
    return xs[m] if len(xs) % 2 else 0.5 * (xs[m - 1] + xs[m])


def _summarize(variant, task, hp, rows, wall, n_params, n_stored):
    steps = [r for r in rows if r["step"] > 0]
    timed = steps[min(10, len(steps) // 10):]  # the first steps include warm-up
    losses = [r["loss"] for r in steps]
    k = max(1, len(losses) // 20)
    evals = [r for r in rows if task.metric_names[0] in r]
    worker = _median([r["worker_ms"] for r in timed])
    optim = _median([r["optimizer_ms"] for r in timed])
    server = _median([r["server_ms"] for r in timed])
    step_ms = _median([r["worker_ms"] + r["optimizer_ms"] for r in timed])
    out = {
        "variant": variant.name, "task": task.name, "optimizer": variant.optimizer,
        "nvfp4_gemm": variant.nvfp4_gemm, "stored": variant.stored, "frozen": variant.frozen,
        "rounding": variant.rounding or None, "error_feedback": variant.error_feedback,
        "block": variant.block if variant.stored else None, "reference": variant.reference,
        "steps": len(steps), "params": n_params, "stored_params": n_stored,
        "loss_start": sum(losses[:min(k, 5)]) / min(k, 5),
        "loss_final": sum(losses[-k:]) / k,
        "loss_window": k, "finite": all(math.isfinite(x) for x in losses),
        "final": {m: evals[-1][m] for m in task.metric_names} if evals else {},
        "start": {m: evals[0][m] for m in task.metric_names} if evals else {},
        "worker_ms": worker, "optimizer_ms": optim,
        "server_ms": server if variant.stored else None,
        "step_ms": step_ms,
        "server_share": (server / step_ms) if variant.stored and step_ms else None,
        "tokens_per_step": task.tokens_per_batch(hp.batch),
        "tokens_per_s": task.tokens_per_batch(hp.batch) / (step_ms / 1e3) if step_ms else None,
        "wall_s": wall,
    }
    best = task.metric_best
    if evals:
        out["best"] = {m: (max if best[m] == "max" else min)(r[m] for r in evals)
                       for m in task.metric_names}
    return out
