"""What one read of a tensor attribute costs this host's Python (the reads fp4q.optim's step
plan key makes per parameter: grad, data_ptr(), dtype, shape, is_contiguous()), for CPU and
CUDA tensors, plain and nn.Parameter, and the whole key check (StepMixin._step_key) over 50
parameters, and over 16 whose gradients alternate between two sets of tensors. Run from the
repository root: python3 bench/results/h200-step/one-pass/attr_cost.py"""
import os
import sys
import timeit

import torch

sys.path.insert(0, os.path.join(os.getcwd(), "client", "python"))
from fp4q import _optim_step, _stored_optimizer  # noqa: E402
import fp4q  # noqa: E402

N = 20000
print("python %s, torch %s" % (sys.version.split()[0], torch.__version__))
for dev in ["cpu"] + (["cuda"] if torch.cuda.is_available() else []):
    p = torch.nn.Parameter(torch.randn(64, 16, device=dev, dtype=torch.bfloat16))
    p.grad = torch.randn(64, 16, device=dev, dtype=torch.bfloat16)
    g, shape = p.grad, p.shape
    for what, stmt in [("p.grad", "p.grad"), ("g.data_ptr()", "g.data_ptr()"),
                       ("p.data_ptr()", "p.data_ptr()"), ("g.dtype", "g.dtype"),
                       ("p.shape != shape", "p.shape != shape"),
                       ("g.is_contiguous()", "g.is_contiguous()"),
                       ("p.is_contiguous()", "p.is_contiguous()")]:
        t = min(timeit.repeat(stmt, globals=globals(), number=N, repeat=5)) / N
        print("%-5s %-20s %6.0f ns" % (dev, what, t * 1e9))
    stored = []
    for i in range(50):
        q = torch.nn.Parameter(torch.randn(64, 16, device=dev, dtype=torch.bfloat16))
        q.grad = torch.randn(64, 16, device=dev, dtype=torch.bfloat16)
        stored.append(_stored_optimizer._Stored(name="w%d" % i, param=q, group=0, index=i,
                                                dtype=q.dtype, spec=fp4q.OptimizerSpec()))
    opt = type("Opt", (_optim_step.StepMixin,), {})()
    opt._stored, opt._plan_token = stored, object()
    opt._step_key()
    t = min(timeit.repeat(opt._step_key, number=2000, repeat=5)) / 2000
    print("%-5s _step_key, 50 parameters: %.1f us" % (dev, t * 1e6))
    # The key over 16 parameters whose gradients alternate between two sets of tensors (torch's
    # allocator after zero_grad(set_to_none=True)), less the assignments alone.
    ps = [s.param for s in stored[:16]]
    opt._stored = stored[:16]
    sets = [[torch.randn(64, 16, device=dev, dtype=torch.bfloat16) for _ in ps] for _ in range(2)]
    turn = [0]

    def assign():
        grads = sets[turn[0]]
        turn[0] ^= 1
        for q, g in zip(ps, grads):
            q.grad = g

    def assign_and_key():
        assign()
        opt._step_key()

    t_assign = min(timeit.repeat(assign, number=2000, repeat=5)) / 2000
    t_key = min(timeit.repeat(assign_and_key, number=2000, repeat=5)) / 2000
    print("%-5s _step_key, 16 parameters, gradients alternating between 2 sets: %.1f us"
          % (dev, (t_key - t_assign) * 1e6))
