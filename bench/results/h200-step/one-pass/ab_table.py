#!/usr/bin/env python3
"""The step rows of fp4q_bench runs of two CUDA modules, alternated (run3.sh's
bench-{new,old}-{1,2}.json): a markdown table of each row's time per run, the floor at that run's
copy bandwidth, and each run's time over its floor.

usage: ab_table.py DIR  (the folder holding the bench-*.json files)
"""
import glob
import json
import os
import sys


def main():
    if len(sys.argv) != 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if len(sys.argv) == 2 else 2
    runs = []
    for path in sorted(glob.glob(os.path.join(sys.argv[1], "bench-*-*.json"))):
        tag = os.path.basename(path)[len("bench-"):-len(".json")]
        with open(path) as f:
            runs.append((tag, json.load(f)))
    if not runs:
        print("no bench-*-*.json in %s" % sys.argv[1], file=sys.stderr)
        return 1
    print("| row | shape | " + " | ".join("%s (copy %.0f GB/s)" % (t, d["copy_gbps"])
                                          for t, d in runs) + " |")
    print("|---|---|" + "---|" * len(runs))
    keys = [(r["name"], r["shape"]) for r in runs[0][1]["rows"]]
    for name, shape in keys:
        cells = []
        for _, d in runs:
            row = next((r for r in d["rows"] if (r["name"], r["shape"]) == (name, shape)), None)
            if row is None:
                cells.append("-")
                continue
            floor_us = row["bytes"] / (d["copy_gbps"] * 1e3)
            cells.append("%.1f us, %.2fx floor" % (row["us"], row["us"] / floor_us))
        print("| %s | %s | %s |" % (name, shape.split(",")[0], " | ".join(cells)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
