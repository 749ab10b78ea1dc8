#!/usr/bin/python3
"""Plots the examples' loss curves (CSV from fp4q_example_* --csv) into one PNG.

    /usr/bin/python3 scripts/plot_curves.py --out docs/img/training_curves.png \
        build/demo/linear.csv build/demo/mlp.csv build/demo/linear_qdq.csv

One panel per CSV (header "step,fp32,rtn,sr,rtn_ef,sr_ef"), loss on a log scale. When a JSON
file with the same stem sits beside a CSV (--json of the same run), its description, steps, lr,
seed and backend title the panel and its RTN(W*) reference loss is drawn as a dotted line.
Needs Debian's python3-matplotlib (scripts/install-deps.sh): run it with /usr/bin/python3.
Exit status 0, or 1 with a message naming the file and what is wrong with it.
"""

import argparse
import csv
import json
import math
import os
import sys

VARIANTS = [  # column, label, colour, line style
    ("fp32", "fp32 (client, no quantization)", "black", "-"),
    ("rtn", "RTN", "tab:red", "-"),
    ("sr", "SR", "tab:blue", "-"),
    ("rtn_ef", "RTN + EF", "tab:green", "-"),
    ("sr_ef", "SR + EF", "tab:purple", "--"),
]


class InputError(Exception):
    pass


def read_curves(path):
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    if not rows:
        raise InputError(f"{path}: empty file")
    header = rows[0]
    expected = ["step"] + [v[0] for v in VARIANTS]
    if header != expected:
        raise InputError(f"{path}: header {','.join(header)!r}, expected {','.join(expected)!r}")
    steps, curves = [], {v[0]: [] for v in VARIANTS}
    for n, row in enumerate(rows[1:], start=2):
        if len(row) != len(header):
            raise InputError(f"{path}:{n}: {len(row)} fields, expected {len(header)}")
        try:
            step = int(row[0])
            values = [float(x) for x in row[1:]]
        except ValueError as e:
            raise InputError(f"{path}:{n}: {e}") from None
        if step != len(steps):
            raise InputError(f"{path}:{n}: step {step}, expected {len(steps)}")
        for (key, *_), value in zip(VARIANTS, values):
            if not math.isfinite(value) or value <= 0:
                raise InputError(f"{path}:{n}: {key} loss {value} is not a positive number")
            curves[key].append(value)
        steps.append(step)
    if len(steps) < 2:
        raise InputError(f"{path}: fewer than two steps")
    return steps, curves


def read_meta(csv_path):
    json_path = os.path.splitext(csv_path)[0] + ".json"
    if not os.path.exists(json_path):
        return None
    try:
        with open(json_path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise InputError(f"{json_path}: {e}") from None


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="PNG to write")
    parser.add_argument("--title", default="4-bit stored weights: RTN stalls, SR and EF learn",
                        help="figure title")
    parser.add_argument("csv", nargs="+", help="loss curves from fp4q_example_* --csv")
    args = parser.parse_args()

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    try:
        panels = [(path, *read_curves(path), read_meta(path)) for path in args.csv]
    except (OSError, InputError) as e:
        print(f"plot_curves.py: {e}", file=sys.stderr)
        return 1

    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.2), squeeze=False)
    for ax, (path, steps, curves, meta) in zip(axes[0], panels):
        for key, label, colour, style in VARIANTS:
            ax.plot(steps, curves[key], label=label, color=colour, linestyle=style, linewidth=1.4)
        if meta is not None:
            ax.axhline(meta["target_rtn_loss"], color="grey", linestyle=":", linewidth=1,
                       label="RTN(W*): teacher in 4 bits")
            how = "QDQ, client-held W" if meta.get("path") == "qdq" else "stored weight"
            ax.set_title(f"{meta['example']}: {how}\n{meta['backend']} backend, "
                         f"lr {meta['lr']:.3g}, seed {meta['seed']}", fontsize=10)
        else:
            ax.set_title(os.path.basename(path), fontsize=10)
        ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_ylabel("training loss")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=8, loc="lower left")
    fig.suptitle(args.title)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(f"plot_curves.py: wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
