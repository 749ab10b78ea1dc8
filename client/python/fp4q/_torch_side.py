"""torch.optim.SGD's step for the parameters fp4q.optim.SGD keeps in torch, without its wrappers.

fp4q.optim.SGD steps the parameters it does not store (biases, norms, embeddings, ...) with a
torch.optim.SGD of the same hyperparameters. torch's step() costs the host far more than its
kernels: the profiler and hook wrappers, the gradient-mode and differentiable checks, the
per-parameter state gathering and grouping by device and dtype (on a GPU host, 0.4-0.7 ms a
step for a small transformer's 37 such parameters). In an overlapped training loop that host
time is the step's cost when the host, not the GPU, bounds the iteration.

sgd_step(inner) makes the same tensor calls as torch's multi-tensor SGD
(torch.optim.sgd._multi_tensor_sgd, the path torch takes for CUDA parameters by default) for the
configuration fp4q.optim.SGD creates (fused, maximize and differentiable left at their defaults)
once every momentum buffer exists, and nothing else:

    grads = _foreach_add(grads, params, alpha=weight_decay)        # when weight_decay != 0
    _foreach_mul_(bufs, momentum); _foreach_add_(bufs, grads, alpha=1 - dampening)
    _foreach_add_(params, bufs or grads, alpha=-lr)

so the parameters and buffers get bit for bit what torch's step would give them. torch takes
that path for plain CUDA tensors when the group's foreach is None (its default), and for any
tensors when it is True; elsewhere (CPU tensors with foreach None: torch's single-tensor loop,
whose bf16 results differ) and for anything else it declines (returns False, having changed
nothing): foreach=False, another optimizer class, Nesterov momentum (torch's multi-tensor path
then updates the gradients in place), a tensor learning rate, sparse gradients, a missing
momentum buffer (the first step, or a parameter whose gradient appears late), parameters of
several devices or dtypes in one group, and any step hook (torch's global ones or the inner
optimizer's), which torch's step() would run. The caller then calls inner.step().

Those checks read every parameter (its gradient, device, dtype, type and state entry), which
on a slow host costs about as much as the multi-tensor calls. Their outcome is kept per
optimizer and reused while the groups, their parameters and options, which parameters have
gradients, and the state dict are the ones it was made from: a step then reads each gradient
and checks only that it is a dense plain tensor of its group's dtype and device type.
"""

import operator
import weakref

import torch
from torch.optim import optimizer as _torch_optimizer

_DEFAULTS = (("fused", None), ("maximize", False), ("differentiable", False),
             ("nesterov", False))
_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _hooked(inner):
    for name in ("_global_optimizer_pre_hooks", "_global_optimizer_post_hooks"):
        if getattr(_torch_optimizer, name, None):
            return True
    return bool(getattr(inner, "_optimizer_step_pre_hooks", None) or
                getattr(inner, "_optimizer_step_post_hooks", None))


_NONE_KEPT = []


def _keeps_none_buffers():
    """Whether this torch's SGD records {"momentum_buffer": None} in a parameter's state when
    it steps without momentum (1.13 does, 2.x does not); asked of torch once, on a CPU tensor.
    Where it does, a step without momentum is taken only for parameters whose state has it,
    so that state_dict() stays what torch's steps would leave."""
    if not _NONE_KEPT:
        p = torch.nn.Parameter(torch.zeros(1))
        p.grad = torch.zeros(1)
        probe = torch.optim.SGD([p], lr=0.0)
        probe.step()
        _NONE_KEPT.append("momentum_buffer" in probe.state.get(p, ()))
    return _NONE_KEPT[0]


class _Kept:
    """A plan of _build's for one inner optimizer, with what it rests on: the state dict it
    read the momentum buffers from, and per group the group, its parameters, which of them had
    a gradient (`members`, in order; the others `absent`), their dtype and whether they were
    CUDA tensors, and the buffers."""

    __slots__ = ("state", "groups")

    def __init__(self, state):
        self.state, self.groups = state, []


# inner optimizer -> its _Kept. The buffers are the ones torch's step() left: sgd_step drops an
# optimizer's entry whenever it declines (torch's step() then runs and may make new ones), and
# load_state_dict() gives the optimizer a new state dict, which the entry no longer matches.
_kept = weakref.WeakKeyDictionary()


def _options(group):
    """The group's values that decide whether and how sgd_step steps it, but its lr."""
    return (tuple(group.get(key, default) for key, default in _DEFAULTS), group.get("foreach"),
            group["momentum"], group["dampening"], group["weight_decay"])


def _plan(inner):
    """Per group with gradients: (params, grads, bufs or None, lr, momentum, dampening,
    weight_decay), or None where the step is not this module's. The last plan's checks are
    kept: while the groups, their parameters and options, which parameters have gradients and
    the state dict are those it was made from, a step reads each gradient and checks it (a
    dense plain tensor of the group's dtype, on CUDA or not as the group was) and reuses the
    rest."""
    if type(inner) is not torch.optim.SGD or _hooked(inner):
        return None
    kept = _kept.get(inner)
    if kept is not None:
        work = _reuse(inner, kept)
        if work is not None:
            return work
    work, kept = _build(inner)
    if kept is None:
        _kept.pop(inner, None)
    else:
        _kept[inner] = kept
    return work


def _reuse(inner, kept):
    """_plan's work from `kept`, or None where anything it rests on changed."""
    groups = inner.param_groups
    if kept.state is not inner.state or len(groups) != len(kept.groups):
        return None
    work = []
    for group, (was, params, options, members, absent, dtype, on_cuda, bufs) in zip(
            groups, kept.groups):
        lr = group["lr"]
        current = group["params"]
        if (group is not was or _options(group) != options or type(lr) is not float and
                isinstance(lr, torch.Tensor) or len(current) != len(params) or
                not all(map(operator.is_, current, params))):
            return None
        grads = [p.grad for p in members]
        for g in grads:
            if (g is None or type(g) not in _PLAIN or g.is_sparse or g.dtype is not dtype or
                    g.is_cuda is not on_cuda):
                return None
        for p in absent:
            if p.grad is not None:
                return None
        if members:
            _, _, momentum, dampening, wd = options
            work.append((members, grads, bufs, lr, momentum, dampening, wd))
    return work


def _build(inner):
    """(work, _Kept) by checking every parameter; (None, None) where the step is not this
    module's."""
    state = inner.state
    none_kept = _keeps_none_buffers()
    work = []
    kept = _Kept(state)
    for group in inner.param_groups:
        for key, default in _DEFAULTS:
            if group.get(key, default) != default:
                return None, None
        foreach = group.get("foreach")
        if foreach is False:
            return None, None
        lr = group["lr"]
        if isinstance(lr, torch.Tensor):
            return None, None
        momentum, dampening, wd = group["momentum"], group["dampening"], group["weight_decay"]
        params, grads, bufs, absent = [], [], [], []
        kind = None
        for p in group["params"]:
            g = p.grad
            if g is None:
                absent.append(p)
                continue
            if g.is_sparse:
                return None, None
            # foreach=None: torch takes the multi-tensor path for plain CUDA tensors only.
            if foreach is None and (p.device.type != "cuda" or type(p) not in _PLAIN or
                                    type(g) not in _PLAIN):
                return None, None
            here = (p.device, p.dtype)
            if kind is None:
                kind = here
            elif here != kind:
                return None, None
            params.append(p)
            grads.append(g)
            if momentum != 0:
                buf = state[p].get("momentum_buffer") if p in state else None
                if buf is None:
                    return None, None
                bufs.append(buf)
            elif none_kept and "momentum_buffer" not in state.get(p, ()):
                return None, None  # torch's step records the parameter's None buffer first
        bufs = bufs if momentum != 0 else None
        if params:
            work.append((params, grads, bufs, lr, momentum, dampening, wd))
        # A gradient of another dtype or device type than the group's, or of another class than
        # a plain tensor, makes the kept plan's check fail: it is built again.
        dtype, on_cuda = (kind[1], kind[0].type == "cuda") if kind is not None else (None, None)
        kept.groups.append((group, tuple(group["params"]), _options(group), params, absent,
                            dtype, on_cuda, bufs))
    return work, kept


def sgd_step(inner):
    """inner's step (a torch.optim.SGD) by torch's multi-tensor calls; True when taken, False
    (nothing changed) when inner.step() must run instead. Call under torch.no_grad()."""
    work = _plan(inner)
    if work is None:
        _kept.pop(inner, None)  # torch's step() runs, and may make new buffers
        return False
    for params, grads, bufs, lr, momentum, dampening, wd in work:
        if wd != 0:
            grads = torch._foreach_add(grads, params, alpha=wd)
        if bufs is not None:
            torch._foreach_mul_(bufs, momentum)
            torch._foreach_add_(bufs, grads, alpha=1 - dampening)
            grads = bufs
        torch._foreach_add_(params, grads, alpha=-lr)
    return True
