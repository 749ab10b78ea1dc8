#!/usr/bin/env python3
"""Nsight Compute's per-kernel CSV (--csv --metrics gpu__time_duration.sum,dram__bytes_read.sum,
dram__bytes_write.sum,...) of fp4q_bench's step rows, as steps: a step begins at each
StepInitKernel; steps of the same kernel sequence and init grid (1 CTA: one 8192x8192 weight,
6: the train suite's 16 matrices) are grouped, with each kernel's median time and DRAM bytes.

    python3 ncu_steps.py call15-h100/ncu-times.csv.gz
"""

import collections
import csv
import gzip
import statistics
import sys

NAMES = [("StepInitKernel", "init"), ("StepCheckLeanKernel", "check (updates)"),
         ("StepDecideKernel", "decide"), ("StepApplyLeanKernel", "apply (lean)"),
         ("StepFinishKernel", "finish"), ("StepApplyOnePassKernel", "one-pass apply"),
         ("StepRestoreOutputsKernel", "restore"), ("StepCheckKernel<1, 0, 1>", "check (SGD, current)"),
         ("StepCheckKernel<1, 1, 1>", "check (momentum, current)"),
         ("StepApplyKernel<1, 1, 0, 0>", "apply (momentum)"),
         ("StepApplyKernel<2, 2, 0, 0>", "apply (AdamW bf16)"),
         ("StepApplyKernel<2, 3, 0, 0>", "apply (AdamW nvfp4)")]


def short(name):
    for key, label in NAMES:
        if key in name:
            return label
    return name[:40]


def main(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        rows = list(csv.reader(f))
    hdr, kernels = None, collections.OrderedDict()
    for r in rows:
        if r and r[0] == "ID":
            hdr = r
            continue
        if hdr is None or len(r) != len(hdr):
            continue
        d = dict(zip(hdr, r))
        k = kernels.setdefault(int(d["ID"]), {"name": d["Kernel Name"], "grid": d["Grid Size"]})
        k[d["Metric Name"]] = float(d["Metric Value"].replace(",", ""))
    steps, cur = [], None
    for k in kernels.values():
        name = short(k["name"])
        if name == "init" or cur is None:
            cur = {"grid": k["grid"], "k": []}
            steps.append(cur)
        cur["k"].append((name, k["gpu__time_duration.sum"] / 1e3, k["dram__bytes_read.sum"] / 1e6,
                         k["dram__bytes_write.sum"] / 1e6))
    groups = collections.OrderedDict()
    for s in steps:
        groups.setdefault((s["grid"], tuple(x[0] for x in s["k"])), []).append(s)
    for (grid, names), ss in groups.items():
        if len(ss) < 3:
            continue  # the rows' first (untimed) steps
        print("init grid %s: %d steps" % (grid, len(ss)))
        total = 0.0
        for i, name in enumerate(names):
            med = statistics.median(s["k"][i][1] for s in ss)
            total += med
            print("  %-26s %8.2f us  read %8.2f MB  written %8.2f MB" % (
                name, med, statistics.median(s["k"][i][2] for s in ss),
                statistics.median(s["k"][i][3] for s in ss)))
        print("  %-26s %8.2f us" % ("sum of kernels", total))


if __name__ == "__main__":
    main(sys.argv[1])
