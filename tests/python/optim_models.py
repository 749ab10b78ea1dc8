"""The examples' two training problems in torch (examples/src/linear_problem.cc, mlp_problem.cc):
the same shapes, scales and teacher/student construction, drawn with torch's generator.

- linear regression: W [64, 256] from N(0, 1/16^2), target W* = W + N(0, (0.5/16)^2), 2048
  samples x ~ N(0, 1), loss 0.5 * mean_n |W x_n - W* x_n|^2 (starts near 8.0), computed as the
  example does from the sufficient statistics S = X^T X / N, C = Y^T X / N, q = mean |y|^2:
  0.5 <W, W S> - <W, C> + 0.5 q (the same function at out * in * in flops a step).
- MLP: y = W2 softsign(W1 x), 128 -> 64 -> 16, teacher = student + N(0, (0.5 * scale)^2),
  512 samples, loss 0.5 * mean_n |p_n - y_n|^2.
"""

import numpy as np
import torch

import fp4q_reference as R


class Linear(torch.nn.Module):
    def __init__(self, w):
        super().__init__()
        self.weight = torch.nn.Parameter(w.clone())

    def forward(self, x):
        return x @ self.weight.t()


class Stats:
    """The sufficient statistics of a linear-regression data set."""

    def __init__(self, x, y):
        n = x.shape[0]
        x64, y64 = x.double(), y.double()
        self.s = (x64.t() @ x64 / n).float()
        self.c = (y64.t() @ x64 / n).float()
        self.q = float((y64 * y64).sum(dim=1).mean())


class Mlp(torch.nn.Module):
    def __init__(self, w1, w2):
        super().__init__()
        self.w1 = torch.nn.Parameter(w1.clone())
        self.w2 = torch.nn.Parameter(w2.clone())

    def forward(self, x):
        z = x @ self.w1.t()
        return (z / (1 + z.abs())) @ self.w2.t()


def linear_problem(seed=1):
    g = torch.Generator().manual_seed(seed)
    w0 = torch.randn(64, 256, generator=g) / 16
    target = w0 + torch.randn(64, 256, generator=g) * (0.5 / 16)
    x = torch.randn(2048, 256, generator=g)
    return Linear(w0), Stats(x, x @ target.t()), target


def _mlp_tensors(seed):
    g = torch.Generator().manual_seed(seed)
    s1, s2 = 128 ** -0.5, 64 ** -0.5
    w1 = torch.randn(64, 128, generator=g) * s1
    w2 = torch.randn(16, 64, generator=g) * s2
    t1 = w1 + torch.randn(64, 128, generator=g) * (0.5 * s1)
    t2 = w2 + torch.randn(16, 64, generator=g) * (0.5 * s2)
    return w1, w2, t1, t2, torch.randn(512, 128, generator=g)


def mlp_problem(seed=2):
    w1, w2, t1, t2, x = _mlp_tensors(seed)
    with torch.no_grad():
        y = Mlp(t1, t2)(x)
    return Mlp(w1, w2), x, y


def _nvfp4(w):
    q = R.quantize_nvfp4(np.asarray(w.numpy(), np.float32))
    return torch.from_numpy(R.dequantize_nvfp4(q["packed"], q["scales"], q["s_enc"]))


def loss_floor(problem, seed=None):
    """The loss of the teacher's weights rounded to NVFP4 (1x16, RTN): what a student whose
    weights are stored in 4 bits can reach, give or take the rounding of its own path."""
    with torch.no_grad():
        if problem is linear_problem:
            _, stats, target = linear_problem(*(() if seed is None else (seed,)))
            return float(linear_loss(Linear(_nvfp4(target)), stats))
        _, _, t1, t2, x = _mlp_tensors(2 if seed is None else seed)
        return float(half_mse(Mlp(_nvfp4(t1), _nvfp4(t2))(x), Mlp(t1, t2)(x)))


def half_mse(pred, y):
    return 0.5 * ((pred - y) ** 2).sum(dim=1).mean()


def linear_loss(model, stats, _=None):
    w = model.weight
    ws = w.float() @ stats.s
    return 0.5 * (w.float() * ws).sum() - (w.float() * stats.c).sum() + 0.5 * stats.q


def mlp_loss(model, x, y):
    return half_mse(model(x), y)


def train(model, opt, loss_fn, x, y, steps):
    """Full-batch steps; returns the loss before each step and after the last."""
    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model, x, y)
        loss.backward()
        losses.append(float(loss))
        opt.step()
    with torch.no_grad():
        losses.append(float(loss_fn(model, x, y)))
    return losses
