#!/usr/bin/python3
"""Plots and tables of a train/run.py output folder, and the results block of docs/TRAINING.md.

  /usr/bin/python3 train/plot.py OUT                       # OUT/TASK.png, OUT/results.md
  /usr/bin/python3 train/plot.py OUT --img-dir docs/img/train --doc docs/TRAINING.md

Reads OUT/summary.json and OUT/TASK/VARIANT.csv (train/run.py). Writes one PNG per task
(training loss, smoothed over 25 steps, and the task's validation metric, per variant) and
results.md: per task a table of the final numbers, the step-time split and memory, and the
verdicts below. With --doc it replaces the text between the markers
"<!-- train-results:begin -->" and "<!-- train-results:end -->" of that file with results.md
(images linked relative to the file), so the document's numbers always come from a summary.

Verdicts (computed here, from the summary):
  matches bf16    text: final validation bits per byte within 5% of the reference's; add: final held-out accuracy within 5 points of the
                  reference's; and, where a frozen run exists, at least 50% of the gain kept
                  (below): a variant whose block weights learned nothing does not match even
                  where the frozen run itself is within 5%.
                  The reference is bf16-adamw, and for SGD variants also bf16-sgd (same
                  optimizer in full precision). Variants that ran fewer steps (--recipe-steps)
                  are compared with the reference's evaluation at their last step.
  gain kept       (frozen - variant) / (frozen - reference) of the task's metric (accuracy:
                  the other way round), where frozen is the run of the same optimizer whose
                  block weights never change: 0 means the variant's block weights learned
                  nothing, 1 that they learned what the reference's did. Left out where the
                  reference and the frozen run differ by under 1% (text) or 2 points (add).
  stalls          a stored variant that keeps under 30% of that gain.
Needs matplotlib (Debian: python3-matplotlib). Exit status 0, 1 on unreadable input.
"""

import argparse
import csv
import json
import math
import os
import re
import sys

BEGIN, END = "<!-- train-results:begin -->", "<!-- train-results:end -->"
METRIC_LABEL = {"val_bpb": "validation bits/byte", "heldout_accuracy": "held-out exact match",
                "heldout_loss": "held-out answer loss"}
PRIMARY = {"text": "val_bpb", "add": "heldout_accuracy"}
STALL = 0.3
MATCH_GAIN = 0.5
TASK_TITLE = {"add": "3-digit addition", "text": "byte-level text"}


def read_csv(path):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    out = []
    for r in rows:
        out.append({k: (float(v) if v not in ("", None) else None) for k, v in r.items()})
    return out


def metric_at(rows, metric, step):
    """The metric's value at the last evaluation at or before `step`."""
    best = None
    for r in rows:
        if r.get(metric) is not None and r["step"] <= step:
            best = r[metric]
    return best


def smooth(xs, k=25):
    out, acc, q = [], 0.0, []
    for x in xs:
        q.append(x)
        acc += x
        if len(q) > k:
            acc -= q.pop(0)
        out.append(acc / len(q))
    return out


def style(name):
    if name.startswith("bf16"):
        return dict(color="black", ls="-" if name.endswith("adamw") else "--", lw=2)
    if name.startswith("frozen"):
        return dict(color="grey", ls="-" if name.endswith("adamw") else "--", lw=1.5)
    colours = {"rtn": "tab:red", "sr": "tab:blue", "rtn-ef": "tab:green", "sr-ef": "tab:purple"}
    base = name.split("+")[-1].rsplit("-", 1)[0]
    if name.startswith("nvfp4-"):
        return dict(color="tab:orange", ls="-" if name.endswith("adamw") else "--", lw=2)
    c = colours.get(base, "tab:brown")
    ls = "-" if name.endswith("adamw") else "--"
    if name.startswith("nvfp4+"):
        return dict(color=c, ls=":", lw=2.5)
    return dict(color=c, ls=ls, lw=1.3)


def plot_task(out_dir, task, variants, curves, path, summary):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker  # noqa: F401
    metric = PRIMARY[task]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(13, 5))
    for v in variants:
        rows = curves[v]
        st = [r["step"] for r in rows if r["step"] > 0 and r["loss"] is not None]
        ls = smooth([r["loss"] for r in rows if r["step"] > 0 and r["loss"] is not None])
        a1.plot(st, ls, label=v, **style(v))
        ev = [(r["step"], r[metric]) for r in rows if r.get(metric) is not None]
        a2.plot([e[0] for e in ev], [e[1] for e in ev], marker=".", label=v, **style(v))
    if task == "add":
        a1.set_yscale("log")
        a1.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        a1.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    else:
        late = [r["loss"] for v in variants for r in curves[v]
                if r["loss"] is not None and r["step"] >= 0.1 * summary["config"]["steps"]]
        if late:
            a1.set_ylim(min(late) * 0.97, max(late) * 1.03)
    a1.set_xlabel("step")
    a1.set_ylabel("training loss (nats, smoothed over 25 steps)")
    a2.set_xlabel("step")
    a2.set_ylabel(METRIC_LABEL[metric])
    if metric == "val_bpb":
        finals = [curves[v][-1].get(metric) for v in variants]
        finals = [f for f in finals if f is not None and math.isfinite(f)]
        if finals:
            a2.set_ylim(min(finals) * 0.95, min(max(finals) * 1.3, 8.5))
    for a in (a1, a2):
        a.grid(alpha=0.3)
    a2.legend(fontsize=8, ncol=2)
    env = summary["environment"]
    cfg = summary["config"]
    fig.suptitle("%s: %d layers, d_model %d, %s steps, %s (%s backend), commit %s" % (
        TASK_TITLE[task], cfg["layers"], cfg["d_model"], cfg["steps"], env["device"],
        env["server"].get("backend", "-"), env["commit"]))
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def fmt(x, spec="%.4g"):
    if x is None:
        return "-"
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return spec % x


def verdicts(task, res, curves):
    """name -> dict of comparisons (see the module doc)."""
    metric = PRIMARY[task]
    out = {}
    for name, r in res.items():
        d = {}
        step = r["steps"]
        value = r["final"].get(metric)
        frozen, own = "frozen-" + r["optimizer"], r["reference"]
        if name == frozen and own in res:
            d["gain_kept"] = 0.0  # by definition
        elif frozen in res and own in res and name not in (frozen, own) and value is not None:
            fv, rv = metric_at(curves[frozen], metric, step), metric_at(curves[own], metric, step)
            # Defined only where the block weights made a measurable difference to the reference.
            big = (0.01 * abs(rv)) if metric == "val_bpb" else 0.02
            if None not in (fv, rv) and abs(rv - fv) > big:
                d["gain_kept"] = (value - fv) / (rv - fv)
                if r["stored"]:
                    d["stalls"] = d["gain_kept"] < STALL
        for ref in ("bf16-adamw", own):
            if ref not in res or ref == name or ref in d:
                continue
            rv = metric_at(curves[ref], metric, step)
            if rv is None or value is None:
                continue
            if metric == "val_bpb":
                within = value <= 1.05 * rv
                text = "%+.1f%%" % (100 * (value / rv - 1))
            else:
                within = value >= rv - 0.05
                text = "%+.1f pts" % (100 * (value - rv))
            ok = within and d.get("gain_kept", 1.0) >= MATCH_GAIN
            d[ref] = {"ok": ok, "within": within, "text": text, "ref_value": rv}
        out[name] = d
    return out


def table(task, summary, curves, img_rel):
    res = summary["results"][task]
    metric = PRIMARY[task]
    ver = verdicts(task, res, curves)
    cfg = summary["config"]
    env = summary["environment"]
    lines = []
    lines.append("### %s" % TASK_TITLE[task])
    lines.append("")
    if img_rel:
        lines.append("![%s](%s)" % (task, img_rel))
        lines.append("")
    d = summary["data"][task]
    if task == "text":
        lines.append("Data: %d training files (%d bytes) and %d validation files (%d bytes) of "
                     "`%s`, SHA-1 %s; %d validation windows of %d bytes." % (
                         d["train_files"], d["train_bytes"], d["val_files"], d["val_bytes"],
                         d["root"], d["sha1"][:12], d["val_windows"], d["block_size"]))
    else:
        lines.append("Data: %d held-out operand pairs (%d excluded from training with their "
                     "swapped order), training drawn from the other %d." % (
                         d["heldout_pairs"], d["excluded_from_training"], d["train_pairs"]))
    lines.append("")
    mcols = [m for m in (["heldout_accuracy", "heldout_loss"] if task == "add" else ["val_bpb"])]
    head = (["variant", "steps", "train loss start", "train loss final"] +
            [METRIC_LABEL[m] for m in mcols] +
            ["vs bf16-adamw", "vs own-optimizer bf16", "gain kept", "codes moved",
             "worker ms", "optimizer ms", "server step ms", "server share", "tokens/s",
             "server bytes/param"])
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "---|" * len(head))
    for name, r in res.items():
        v = ver[name]

        def cmp(ref):
            c = v.get(ref)
            if c is None:
                return "-"
            return "%s %s" % ("**matches**" if c["ok"] else "no", c["text"])

        own = r["reference"] if r["reference"] != "bf16-adamw" else None
        cells = [name, str(r["steps"]), fmt(r["loss_start"]), fmt(r["loss_final"])]
        for m in mcols:
            x = r["final"].get(m)
            cells.append(fmt(100 * x, "%.1f%%") if m == "heldout_accuracy" and x is not None
                         else fmt(x))
        cells += [cmp("bf16-adamw"), cmp(own) if own else "-",
                  fmt(100 * v["gain_kept"], "%.0f%%") + (" (stalls)" if v.get("stalls") else "")
                  if "gain_kept" in v else "-",
                  fmt(100 * r["codes_moved"], "%.1f%%") if r.get("codes_moved") is not None
                  else "-",
                  fmt(r["worker_ms"], "%.2f"), fmt(r["optimizer_ms"], "%.2f"),
                  fmt(r["server_ms"], "%.2f"),
                  fmt(100 * r["server_share"], "%.1f%%") if r.get("server_share") is not None
                  else "-",
                  fmt(r["tokens_per_s"], "%.0f"),
                  fmt(r.get("server_bytes_per_stored_param"), "%.2f")]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    # Plain statements.
    match = [n for n in res if ver[n].get("bf16-adamw", {}).get("ok")]
    own_match = [n for n in res if res[n]["reference"] != "bf16-adamw" and
                 ver[n].get(res[n]["reference"], {}).get("ok")]
    no = [n for n in res if n != "bf16-adamw" and n not in match]
    stall = [n for n in res if ver[n].get("stalls")]
    lines.append("- Match bf16-adamw (%s, and keep at least %d%% of the gain over frozen block "
                 "weights): %s." % (
                     "within 5% in bits per byte" if task == "text" else
                     "within 5 points of accuracy", 100 * MATCH_GAIN,
                     ", ".join(match) if match else "none"))
    if own_match:
        lines.append("- Match their own optimizer's bf16 run (bf16-sgd): %s." % ", ".join(own_match))
    lines.append("- Do not match bf16-adamw: %s." % (", ".join(no) if no else "none"))
    lines.append("- Stall (keep under %d%% of the reference's gain over frozen block weights): "
                 "%s." % (100 * STALL, ", ".join(stall) if stall else "none"))
    stored = {n: r for n, r in res.items() if r["stored"]}
    if stored:
        key = (lambda n: stored[n]["final"][metric]) if metric == "heldout_accuracy" else (
            lambda n: -stored[n]["final"][metric])
        best = max(stored, key=key)
        lines.append("- Best stored-weight variant: %s (%s %s)." % (
            best, METRIC_LABEL[metric], fmt(100 * stored[best]["final"][metric], "%.1f%%")
            if metric == "heldout_accuracy" else fmt(stored[best]["final"][metric])))
        shares = [r["server_share"] for r in stored.values() if r.get("server_share") is not None]
        if shares:
            lines.append("- The server's step: %.1f%% to %.1f%% of the step time." % (
                100 * min(shares), 100 * max(shares)))
    lines.append("")
    return lines


def render(out_dir, img_dir=None, doc=None):
    with open(os.path.join(out_dir, "summary.json")) as f:
        summary = json.load(f)
    img_dir = img_dir or out_dir
    os.makedirs(img_dir, exist_ok=True)
    env, cfg = summary["environment"], summary["config"]
    md = []
    recipe = any(v.startswith("nvfp4") for v in summary["variants"])
    md.append("Run: `%s`; %s, torch %s, fp4qd %s backend%s; commit %s; %d layers, d_model %d, "
              "%d heads; %d steps%s, seed %d, forward %s; %.0f s in all." % (
                  summary.get("command", "train/run.py --preset %s" % cfg["preset"]),
                  env["device"], env["torch"], env["server"].get("backend", "-"),
                  ", CUDA IPC + fast socket" if env["server"].get("fast_socket") else "",
                  env["commit"], cfg["layers"], cfg["d_model"], cfg["heads"], cfg["steps"],
                  " (NVFP4-GEMM variants %d)" % cfg["recipe_steps"] if recipe else "",
                  cfg["seed"], "bf16 autocast" if cfg["amp"] == "bf16" else "f32",
                  summary.get("wall_s", 0)))
    md.append("")
    for task in summary["tasks"]:
        if task not in summary["results"]:
            continue
        curves = {v: read_csv(os.path.join(out_dir, task, v + ".csv"))
                  for v in summary["results"][task]}
        png = os.path.join(img_dir, "%s.png" % task)
        plot_task(out_dir, task, list(summary["results"][task]), curves, png, summary)
        rel = os.path.relpath(png, os.path.dirname(os.path.abspath(doc)) if doc else out_dir)
        md += table(task, summary, curves, rel)
    text = "\n".join(md)
    with open(os.path.join(out_dir, "results.md"), "w") as f:
        f.write(text + "\n")
    if doc:
        with open(doc) as f:
            body = f.read()
        if BEGIN not in body or END not in body:
            raise SystemExit("%s: no %s ... %s block" % (doc, BEGIN, END))
        pre, rest = body.split(BEGIN, 1)
        _, post = rest.split(END, 1)
        with open(doc, "w") as f:
            f.write(pre + BEGIN + "\n" + text + "\n" + END + post)
    return text


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", help="a train/run.py --out folder")
    p.add_argument("--img-dir", help="where the PNGs go (default: the folder itself)")
    p.add_argument("--doc", help="a Markdown file with the results markers to fill")
    a = p.parse_args(argv)
    try:
        print(render(a.out, a.img_dir, a.doc))
    except (OSError, KeyError, ValueError) as e:
        print("plot.py: %s" % e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
