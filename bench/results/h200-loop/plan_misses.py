"""Why the overlapped step() builds its request afresh: bench/train_loop.py's overlapped
variant (the 4-layer model, MPS as the caller set it up) for 60 iterations, with counters on
the step plan's checks: the kept key, the allocation check (which part fails: the server info,
the region cache's generation, a buffer id), the re-slice (no template, check failed, a pointer
outside the template's allocations), and the client's step_plans stats. Usage (repository
root, fp4qd's bundle env): python3 bench/results/h200-loop/plan_misses.py --fp4qd PATH [--sync]
"""
import collections
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))

import train_loop  # noqa: E402
from fp4q import _regions, _step_plans  # noqa: E402

counts = collections.Counter()
_valid = _regions.Regions.plan_valid


def plan_valid(self, plan):
    info = self.info
    if info is None or info is not plan.info:
        counts["plan_valid: server info replaced"] += 1
    elif plan.generation != self.cache.generation:
        counts["plan_valid: region cache generation moved (%d -> %d)" % (
            plan.generation, self.cache.generation)] += 1
    ok = _valid(self, plan)
    counts["plan_valid: %s" % ok] += 1
    return ok


_resliced = _step_plans.StepPlans.resliced


def resliced(self, layout, pointers, key, valid):
    found = self._templates.get(layout)
    if found is None:
        counts["resliced: no template"] += 1
    else:
        memo = found[0]
        outside = sum(memo.plan.locate(p) is None for p in pointers)
        counts["resliced: pointers outside the template's allocations: %d of %d" % (
            outside, len(pointers))] += 1
    out = _resliced(self, layout, pointers, key, valid)
    counts["resliced: %s" % (out is not None)] += 1
    return out


_regions.Regions.plan_valid = plan_valid
_step_plans.StepPlans.resliced = resliced
sync = "--sync" in sys.argv
argv = [a for a in sys.argv[1:] if a != "--sync"]
train_loop.main(argv + ["--variant=fp4q" if sync else "--variant=fp4q overlap", "--rounds=1",
                        "--iters=60", "--warmup=5", "--batch=256"])
for k, n in sorted(counts.items()):
    print("%6d  %s" % (n, k))
