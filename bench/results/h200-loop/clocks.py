"""The GPU's SM clock, power and temperature during each round of run1.sh's loops.

Usage: python3 clocks.py DIR (a call's raw folder: smi.csv or smi.csv.gz, and train-loop-*.json).
Each round of each variant starts at its per_round round_started_unix_s and ends at the next
round's start (the last at the file's end); the nvidia-smi samples in between give its median SM
clock (MHz), power (W) and temperature (C), printed beside the round's ms per iteration and host
time in step().
"""

import csv
import datetime
import glob
import gzip
import json
import os
import statistics
import sys


def samples(path):
    out = []
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        for row in csv.reader(f):
            if not row or not row[0][:1].isdigit():
                continue
            t = datetime.datetime.strptime(row[0].strip(), "%Y/%m/%d %H:%M:%S.%f")
            vals = [float(x.strip().split()[0]) for x in row[1:5]]
            out.append((t.timestamp(), vals))
    return out


def main(folder):
    smi_path = os.path.join(folder, "smi.csv")
    smi = samples(smi_path if os.path.exists(smi_path) else smi_path + ".gz")
    for path in sorted(glob.glob(os.path.join(folder, "train-loop-*.json"))):
        rep = json.load(open(path))
        starts = sorted((r["started"], row["variant"], i, r, row["rounds_ms"][i])
                        for row in rep["rows"]
                        for i, r in enumerate(
                            [dict(e, started=e["round_started_unix_s"]) for e in row["per_round"]]))
        print(os.path.basename(path))
        for k, (t0, variant, i, extra, ms) in enumerate(starts):
            t1 = starts[k + 1][0] if k + 1 < len(starts) else t0 + 5.0
            got = [v for t, v in smi if t0 <= t < t1]
            if not got:
                continue
            med = [statistics.median(v[j] for v in got) for j in range(4)]
            print("  %-14s round %d  %7.3f ms/it  step() host %6.0f us  SM %4.0f MHz  mem %4.0f"
                  "  %3.0f W  %2.0f C" % (variant, i, ms, extra.get("step_host_us", 0), *med))


if __name__ == "__main__":
    main(sys.argv[1])
