"""What an optimizer's step() wrapper costs, without a server: an Optimizer subclass whose step
torch wraps (its profiler range and hooks) against one that takes fp4q.optim's wrapper (23f74c1),
both around a step that does nothing. Best of 5 rounds of 20,000 calls each.

    PYTHONPATH=client/python FP4Q_PROTO_DESCRIPTOR=<build>/tests/python/fp4q_v1.binpb \\
        python3 bench/results/cpu-step-host/step-wrapper/step_wrapper.py
"""
import platform
import time

import torch

from fp4q._stored_optimizer import StoredOptimizer


class TorchWrapped(torch.optim.Optimizer):
    def __init__(self, params):
        super().__init__(params, {})

    @torch.no_grad()
    def step(self, closure=None):  # as fp4q.optim's was before 23f74c1
        return None


class Fp4qWrapped(torch.optim.Optimizer):
    step = StoredOptimizer.step
    _step_hooks = StoredOptimizer._step_hooks
    _step_without_grad = StoredOptimizer._step_without_grad

    def __init__(self, params):
        super().__init__(params, {})

    def _step(self, closure):
        return None


def best_us(opt, calls=20000, rounds=5):
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(calls):
            opt.step()
        best = min(best, (time.perf_counter() - t) / calls * 1e6)
    return best


params = [torch.nn.Parameter(torch.zeros(4))]
print("python %s, torch %s, %s" % (platform.python_version(), torch.__version__,
                                   platform.processor() or platform.machine()))
for cls in (TorchWrapped, Fp4qWrapped):
    print("%-13s step() %.2f us" % (cls.__name__, best_us(cls(params))))
