"""fp4q.optim: torch.optim.SGD and torch.optim.AdamW whose parameters fp4qd stores in 4 bits.

    opt = fp4q.optim.AdamW(model.named_parameters(), lr=1e-3, client=client)
    for x, y in data:
        loss_fn(model(x), y).backward()
        opt.step()        # one Step RPC: every stored weight updated by the server
        opt.zero_grad()

What runs where
- Construction: every parameter that can be stored (2-D, columns a multiple of 16, rows too for
  16x16 blocks, float32 or bfloat16, not in `exclude`) becomes a weight on the server
  (CreateWeight from the parameter's value, with the optimizer state the group's
  hyperparameters need: fp4q.v1.OptimizerSpec), and the parameter's data is replaced by DQ(W),
  the value the server stores. The others stay in torch and are updated by torch's own
  optimizer (torch.optim.SGD / AdamW) with the same param-group hyperparameters.
- step(): one Step request carrying every stored parameter's gradient (CUDA IPC regions when the
  tensors are CUDA and the server offers cuda_ipc, inline bytes otherwise) and, as each item's
  dequantized_out, the parameter's own data: DQ(W) after the update lands in param.data in
  place (by IPC, or copied from the reply). The hyperparameters are read from param_groups at
  every step (schedulers work); AdamW's bias corrections use each weight's own count of applied
  steps, as torch's per-parameter `step`. Parameters whose grad is None are skipped, as torch
  skips them. The step number sent is this optimizer's count of successful steps plus one: a
  step() that failed (an error, a lost connection) is sent again with the same number by the
  next step(), so a step the server did apply is answered "already applied" and never applied
  twice (a different gradient for it is refused, FAILED_PRECONDITION).
- The update itself is docs/NUMERICS.md section 10 (torch's SGD / AdamW arithmetic in f32 on
  DQ(W) + residual, then quantized with the weight's rounding), on the server's device.

Data-parallel replica groups (group=, world_size=, rank=): every rank builds the optimizer and
calls step() exactly as one process would; the server collects the K ranks' gradients of a step,
sums them in rank order and divides by K (the mean, as DDP's all-reduce gives), applies one
update to the one stored copy and writes DQ(W) into every rank's parameters. No
torch.distributed all-reduce is needed for stored parameters. Parameters kept in torch would
diverge between ranks, so with world_size > 1 they need an initialized torch.distributed
process group (their gradients are then averaged with all_reduce and their values broadcast
from rank 0 at construction); without one, construction refuses naming them. A rank that does
not send a step within `deadline_ms`, or whose session ends, fails that step for every rank
(nothing is applied).

Names and namespaces: weight names are name_prefix + the parameter's name (from
named_parameters(), or "param<i>" for the i-th parameter across groups when given plain
tensors), in the client's namespace (fp4q.Client(namespace=...)). A name that already exists is
an error unless existing="attach" (use the stored weight as it is: its DQ(W) is loaded into the
parameter and stepping continues after its last step) or "replace" (delete it and create it
from the parameter). In a replica group the first rank to create a weight creates it and the
others attach to it while it has not been stepped.

Restarts: the optimizer remembers the server_epoch it created its weights under. When the
server restarted (its state is then its last checkpoint's, or empty), step() raises
fp4q.ServerRestartedError naming both epochs before anything is sent; a step sent in the old
session is refused by the server, and is reported the same way. Nothing is re-created.

Overlap (overlap=True; needs fp4qd's CUDA backend with --allow_cuda_ipc, every stored
parameter on one CUDA device): step() sends the Step with a done signal (fp4q.v1.DoneSignal),
makes the current CUDA stream wait on the device for it (cuStreamWaitValue32) and returns. The
host goes on with the next forward pass while fp4qd applies the step; kernels queued on that
stream after step() run once DQ(W) is in param.data. The reply is taken by the next step(), or by
synchronize() (state_dict() and load_state_dict() call it). With ready signals (below) step()
does not wait on the host for the backward pass either. An error of the step in flight is
raised by the next step() or synchronize(), prefixed "step N (overlap=True: ...)", before
anything else is sent, and the next step() sends number N again, as after a failed step without
overlap. Work on other CUDA streams that reads the parameters must wait for the current stream
(torch.cuda.Stream.wait_stream). A step whose tensors cannot all travel in place by IPC
completes in step() as without overlap (fp4q._overlap).

Ready signals (ready_signal=True, the default; fp4qd's CUDA backend with --allow_cuda_ipc, which
lists "step_ready_signal", and every stored parameter on one CUDA device): step() does not wait
on the host for the backward pass queued before it. The current stream writes the step's value
into a ready word (fp4q.v1.ReadySignal) behind that work, the step is sent at once, and fp4qd
reads no gradient before the word holds the value: it validates the request and queues the
step's kernels behind a device-side wait while the backward pass still runs. With overlap=True
every step carries one. Without overlap a step carries one when the stream still has work
queued (when it is idle the step is sent at once without one), and step() still returns after the
reply, with DQ(W) in param.data; a backward pass queued further ahead than the server's
--step_ready_timeout_ms makes fp4qd refuse that step with nothing changed, and step() then
waits on the host and sends it again without the signal. Not used in replica groups without
overlap.

state_dict() / load_state_dict(): see fp4q._optim_state (what is saved, and what a load
restores exactly).

StoredOptimizer is defined in fp4q._stored_optimizer (construction, torch's side) with its step
helpers in fp4q._optim_step; both are imported here.
"""

import inspect
import math
import numbers

import torch

from fp4q import options as opts
from fp4q._stored_optimizer import _REQUIRED, StoredOptimizer
from fp4q.tensors import ClientArgumentError

__all__ = ["SGD", "AdamW", "StoredOptimizer"]


def _finite_number(value, field):
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ClientArgumentError("%s: a tensor of %d elements is not a number"
                                      % (field, value.numel()))
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ClientArgumentError("%s: %r is not a number" % (field, value))
    value = float(value)
    if not math.isfinite(value):
        raise ClientArgumentError("%s: %r is not finite" % (field, value))
    return value


_FP4Q_DOC = """
    fp4q options (the same for every param group; fixed at construction):
      rounding: 'nearest' (default) | 'stochastic' (keyed by (seed + the parameter's index,
        step, element), docs/NUMERICS.md 4): how each update is rounded to 4 bits.
      error_feedback: True (default): the server keeps an f32 residual per weight and carries
        what rounding dropped into the next step; under round-to-nearest without it, updates
        smaller than half a grid step are lost and training stalls.
      block: '1x16' (default) | '16x16' NVFP4 blocks (16x16 needs rows a multiple of 16).
      scaling: 'current' (default) | 'delayed'. Where each update's global scale comes from:
        'current' takes the amax of the update's own new value, so nothing clips, results are
        those of the NUMERICS reference step by step, and state_dict restores exactly; the
        server then reads the weight twice per step. 'delayed' takes the previous step's amax:
        one pass over memory (faster on a GPU, where the step is memory bound), at the price of
        values beyond the previous amax clipping for one step (error feedback carries the
        excess into the next step) and of a state_dict that only the same server state can
        load. current is the default because it is exact and safe without error feedback too.
      state_dtype: 'f32' (default) | 'bf16' | 'nvfp4': storage of the momentum buffer / AdamW
        moments on the server (NVFP4 stores the second moment as its square root).
      seed: the base of the stochastic-rounding keys (default 0).
      client: the fp4q.Client (default fp4q.default_client(), from $FP4Q_SERVER etc.).
      name_prefix: prepended to every weight name (default "").
      exclude: parameters (tensors) or parameter names kept in torch.
      existing: 'error' (default) | 'attach' | 'replace': what a weight name that already
        exists on the server means (see the module docstring).
      group, world_size, rank, deadline_ms: a data-parallel replica group (module docstring);
        deadline_ms: how long a step waits for every rank (0: the server's 30 s).
      overlap: False (default) | True: step() sends the step and returns without waiting for
        the reply; the current CUDA stream waits on the device until fp4qd has written the new
        weights, so the next forward pass is queued at once (module docstring, "Overlap").
      ready_signal: True (default) | False: where fp4qd takes ready signals, step() does not
        wait on the host for the backward pass queued before it; the current CUDA stream
        writes a ready word behind it and fp4qd queues the step's kernels behind a device-side
        wait on that word (module docstring, "Ready signals"). False: the host waits.
      one_pass (SGD only): False (default) | True: ask fp4qd to apply each step in one pass
        (fp4q.v1.StepRequest.one_pass; needs scaling='delayed' and block='1x16'): each gradient
        is read once, the server keeping a second copy of every stored weight's state (codes,
        scales, residual: about 4.6 bytes a parameter with error feedback) in its budget. It
        takes steps of plain SGD (momentum 0, weight_decay 0, no replica group); others run in
        two passes, as does any step when the server has no room for the copy.
        one_pass_steps counts the steps fp4qd ran in one pass, and two_pass_reasons the others
        by fp4qd's reason ({"budget": 3}: StepResult.one_pass_outcome). A refused step (a NaN or Inf
        gradient) leaves DQ(W) of the unchanged weights in param.data, as it was.
"""


def _torch_default(cls, name):
    """The installed torch.optim class's default for argument `name` (_REQUIRED where it has
    none: older torch, Debian's 1.13 among them, requires SGD's lr; newer torch defaults it)."""
    d = inspect.signature(cls.__init__).parameters[name].default
    return _REQUIRED if d is inspect.Parameter.empty or d is _REQUIRED else d


class SGD(StoredOptimizer):
    """torch.optim.SGD (momentum, dampening, Nesterov, weight decay) with 4-bit stored weights.

    Arguments as torch.optim.SGD: params (tensors, (name, tensor) pairs, or param group dicts),
    lr (the installed torch's default: required in older torch, 1e-3 in newer), momentum=0,
    dampening=0, weight_decay=0, nesterov=False. A group whose momentum is > 0 at construction
    gets a server-side momentum buffer; momentum can change later but not from 0 to > 0 (or
    back) for that group.
    """

    KIND = "sgd"
    TORCH = torch.optim.SGD
    FIXED = ("whether momentum is > 0",)
    HYPER_KEYS = ("lr", "momentum", "dampening", "weight_decay", "nesterov")

    def __init__(self, params, lr=_torch_default(torch.optim.SGD, "lr"), momentum=0,
                 dampening=0, weight_decay=0, nesterov=False, *, rounding="nearest",
                 error_feedback=True, block="1x16", scaling="current", state_dtype="f32",
                 seed=0, client=None, name_prefix="", exclude=(), existing="error", group=None,
                 world_size=1, rank=0, deadline_ms=0, overlap=False,
                 ready_signal=True, one_pass=False):
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening,
                        weight_decay=weight_decay, nesterov=nesterov)
        if lr is not _REQUIRED:
            self.check_group(defaults, "")
        super().__init__(params, defaults, client=client, name_prefix=name_prefix,
                         group=group, world_size=world_size, rank=rank, deadline_ms=deadline_ms,
                         rounding=rounding, error_feedback=error_feedback, block=block,
                         scaling=scaling, state_dtype=state_dtype, seed=seed, exclude=exclude,
                         existing=existing, overlap=overlap,
                         ready_signal=ready_signal, one_pass=one_pass)

    @staticmethod
    def check_group(group, field):
        """torch.optim.SGD's checks, with the field and value named."""
        f = (field + "['%s']") if field else "%s"
        if group.get("lr") is _REQUIRED:
            raise ClientArgumentError(
                "%s: required (torch.optim.SGD has no default learning rate)" % (f % "lr"))
        lr = _finite_number(group["lr"], f % "lr")
        if lr < 0:
            raise ClientArgumentError("%s: %r must be >= 0 (Invalid learning rate)"
                                      % (f % "lr", lr))
        momentum = _finite_number(group["momentum"], f % "momentum")
        if momentum < 0:
            raise ClientArgumentError("%s: %r must be >= 0 (Invalid momentum value)"
                                      % (f % "momentum", momentum))
        dampening = _finite_number(group["dampening"], f % "dampening")
        wd = _finite_number(group["weight_decay"], f % "weight_decay")
        if wd < 0:
            raise ClientArgumentError("%s: %r must be >= 0 (Invalid weight_decay value)"
                                      % (f % "weight_decay", wd))
        if group["nesterov"] and (momentum <= 0 or dampening != 0):
            raise ClientArgumentError(
                "%s: Nesterov momentum requires a momentum and zero dampening (momentum %r, "
                "dampening %r)" % (f % "nesterov", momentum, dampening))

    def spec_for(self, group):
        return opts.OptimizerSpec(kind="sgd", momentum=float(group["momentum"]) > 0,
                                  state_dtype=self._state_dtype)

    def hyperparameters(self, group):
        return opts.SgdHyperparameters(
            lr=float(group["lr"]), momentum=float(group["momentum"]),
            dampening=float(group["dampening"]), weight_decay=float(group["weight_decay"]),
            nesterov=bool(group["nesterov"]))


SGD.__doc__ += _FP4Q_DOC


class AdamW(StoredOptimizer):
    """torch.optim.AdamW (decoupled weight decay, bias correction, amsgrad) with 4-bit stored
    weights.

    Arguments as torch.optim.AdamW: params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
    weight_decay=1e-2, amsgrad=False. eps must be > 0 (torch allows 0; the server refuses it:
    a zero gradient would divide 0 by 0). amsgrad is fixed per group at construction.
    """

    KIND = "adamw"
    TORCH = torch.optim.AdamW
    FIXED = ("amsgrad",)
    HYPER_KEYS = ("lr", "betas", "eps", "weight_decay", "amsgrad")

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                 amsgrad=False, *, rounding="nearest", error_feedback=True, block="1x16",
                 scaling="current", state_dtype="f32", seed=0, client=None, name_prefix="",
                 exclude=(), existing="error", group=None, world_size=1, rank=0,
                 deadline_ms=0, overlap=False,
                 ready_signal=True):
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                        amsgrad=amsgrad)
        self.check_group(defaults, "")
        super().__init__(params, defaults, client=client, name_prefix=name_prefix,
                         group=group, world_size=world_size, rank=rank, deadline_ms=deadline_ms,
                         rounding=rounding, error_feedback=error_feedback, block=block,
                         scaling=scaling, state_dtype=state_dtype, seed=seed, exclude=exclude,
                         existing=existing, overlap=overlap,
                         ready_signal=ready_signal)

    @staticmethod
    def check_group(group, field):
        """torch.optim.AdamW's checks (and eps > 0), with the field and value named."""
        f = (field + "['%s']") if field else "%s"
        lr = _finite_number(group["lr"], f % "lr")
        if lr < 0:
            raise ClientArgumentError("%s: %r must be >= 0 (Invalid learning rate)"
                                      % (f % "lr", lr))
        eps = _finite_number(group["eps"], f % "eps")
        if eps <= 0:
            raise ClientArgumentError(
                "%s: %r must be > 0 (Invalid epsilon value; fp4qd refuses 0: a zero gradient "
                "would divide 0 by 0)" % (f % "eps", eps))
        betas = group["betas"]
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise ClientArgumentError("%s: %r is not a pair (beta1, beta2)" % (f % "betas", betas))
        for i, b in enumerate(betas):
            b = _finite_number(b, "%s[%d]" % (f % "betas", i))
            if not 0 <= b < 1:
                raise ClientArgumentError("%s[%d]: %r is not in [0, 1) (Invalid beta parameter "
                                          "at index %d)" % (f % "betas", i, b, i))
        wd = _finite_number(group["weight_decay"], f % "weight_decay")
        if wd < 0:
            raise ClientArgumentError("%s: %r must be >= 0 (Invalid weight_decay value)"
                                      % (f % "weight_decay", wd))
        if not isinstance(group["amsgrad"], bool):
            raise ClientArgumentError("%s: %r is not a bool" % (f % "amsgrad", group["amsgrad"]))

    def spec_for(self, group):
        return opts.OptimizerSpec(kind="adamw", amsgrad=bool(group["amsgrad"]),
                                  state_dtype=self._state_dtype)

    def hyperparameters(self, group):
        b1, b2 = group["betas"]
        return opts.AdamWHyperparameters(lr=float(group["lr"]), betas=(float(b1), float(b2)),
                                         eps=float(group["eps"]),
                                         weight_decay=float(group["weight_decay"]))


AdamW.__doc__ += _FP4Q_DOC
