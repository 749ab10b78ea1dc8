"""What encoding a Step's head costs: the message built and serialized at every step (the client
before 5a47a53) against fp4q._step_plans.StepHeads (kept per set of values), best of 5 rounds of
50,000 calls, one SGD group, a server plan id, one pass; both parse to the same message.
Run from the repository root with the descriptor fp4q uses (FP4Q_PROTO_DESCRIPTOR):
  PYTHONPATH=client/python python3 bench/results/cpu-step-host/step-heads/head_cost.py"""
import sys
import timeit

import fp4q
from fp4q._messages import pb
from fp4q._step_plans import StepHeads

groups = [fp4q.SgdHyperparameters(lr=1e-3, momentum=0.9)]


def built(step):
    req = pb.StepRequest(step=int(step), kind=0, brief_reply=True, keep_plan=False, plan_id=7,
                         one_pass=True)
    for h in groups:
        h.fill(req.groups.add())
    return req.SerializeToString()


heads = StepHeads()


def kept(step):
    return heads.encode(step, groups, 0, None, True, False, 7, True)


assert pb.StepRequest.FromString(built(12345)) == pb.StepRequest.FromString(kept(12345))
print("python %s" % sys.version.split()[0])
for name, f in (("built at every step", built), ("StepHeads.encode", kept)):
    t = min(timeit.repeat(lambda: f(12345), number=50000, repeat=5)) / 50000
    print("%-20s %.2f us" % (name, t * 1e6))
