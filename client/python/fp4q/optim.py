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

state_dict() / load_state_dict(): see fp4q._optim_state (what is saved, and what a load
restores exactly).
"""

import dataclasses
import math
import numbers

import grpc
import torch
from torch.optim import optimizer as _torch_optimizer

from fp4q import _optim_state
from fp4q import functional
from fp4q import options as opts
from fp4q.errors import Fp4qError, ServerRestartedError
from fp4q.results import StepItem
from fp4q.tensors import ClientArgumentError

__all__ = ["SGD", "AdamW", "StoredOptimizer"]

_ROUNDINGS = ("nearest", "stochastic")
_BLOCKS = ("1x16", "16x16")
_SCALINGS = ("current", "delayed")
_STATE_DTYPES = ("f32", "bf16", "nvfp4")
_EXISTING = ("error", "attach", "replace")
_SESSION_GONE = ("hello.session_id: unknown or expired session",
                 "metadata fp4q-session: unknown or expired session")


@dataclasses.dataclass
class _Stored:
    """A parameter the server stores: its weight name, param group and torch state index."""

    name: str
    param: torch.Tensor
    group: int
    index: int
    dtype: torch.dtype
    spec: opts.OptimizerSpec


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


def _choice(value, allowed, field):
    if value not in allowed:
        raise ClientArgumentError("%s: %r is not one of %s" % (field, value, list(allowed)))
    return value


class StoredOptimizer(torch.optim.Optimizer):
    """The machinery of fp4q.optim.SGD and AdamW (see the module docstring); not used directly.

    Subclasses set KIND ('sgd' | 'adamw'), TORCH (the torch.optim class for parameters kept in
    torch), check_group(group, field) (torch's validation of one param group) and
    hyperparameters(group) (its fp4q.SgdHyperparameters / AdamWHyperparameters) and
    spec_for(group) (the OptimizerSpec its weights are created with)."""

    KIND = None
    TORCH = None
    # The hyperparameters a weight's state is created for: changing them later is refused.
    FIXED = ()

    def __init__(self, params, defaults, *, client, name_prefix, group, world_size, rank,
                 deadline_ms, rounding, error_feedback, block, scaling, state_dtype, seed,
                 exclude, existing):
        self._ready = False
        self._rounding = _choice(rounding, _ROUNDINGS, "rounding")
        self._block = _choice(block, _BLOCKS, "block")
        self._error_feedback = bool(error_feedback)
        self._scaling = _choice(scaling, _SCALINGS, "scaling")
        self._state_dtype = _choice(state_dtype, _STATE_DTYPES, "state_dtype")
        self._existing = _choice(existing, _EXISTING, "existing")
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not (
                0 <= int(seed) < 2**63):
            raise ClientArgumentError("seed: %r is not an integer in [0, 2^63)" % (seed,))
        self._seed = int(seed)
        if not isinstance(name_prefix, str):
            raise ClientArgumentError("name_prefix: %r is not a string" % (name_prefix,))
        self._prefix = name_prefix
        self._replica = self._check_replica(group, world_size, rank, deadline_ms)
        self._world_size = int(world_size)
        self._rank = int(rank)
        self._deadline_ms = int(deadline_ms)
        self._names = {}  # id(param) -> the caller's name for it
        groups = self._normalize(params)
        self._exclude_ids, self._exclude_names = self._check_exclude(exclude)
        super().__init__(groups, defaults)  # add_param_group validates each group
        self.client = client if client is not None else functional.default_client()
        self._stored = []       # _Stored, in parameter order
        self._torch_side = []   # (param, group index, index, reason)
        self._inner = None      # torch's optimizer over the parameters kept in torch
        self._inner_group = {}  # our group index -> the inner optimizer's group index
        self._fp4q_steps = 0    # successful steps; the next Step sends this + 1
        self._count = 0         # parameters seen, across groups (torch's state indices)
        self._epoch = None
        info = self._connect()
        self._max_items = int(info.limits.max_step_items) or None
        for gi in range(len(self.param_groups)):
            self._register_group(gi)
        self._check_torch_side()
        self._ready = True

    # ------------------------------------------------------------------ construction

    @staticmethod
    def _check_replica(group, world_size, rank, deadline_ms):
        for field, v in (("world_size", world_size), ("rank", rank), ("deadline_ms", deadline_ms)):
            if isinstance(v, bool) or not isinstance(v, numbers.Integral):
                raise ClientArgumentError("%s: %r is not an integer" % (field, v))
        if world_size < 1:
            raise ClientArgumentError("world_size: %d must be >= 1" % world_size)
        if not 0 <= rank < world_size:
            raise ClientArgumentError("rank: %d is not in [0, %d)" % (rank, world_size))
        if deadline_ms < 0:
            raise ClientArgumentError("deadline_ms: %d must be >= 0" % deadline_ms)
        if group is None:
            if world_size != 1:
                raise ClientArgumentError(
                    "group: a replica group name is needed with world_size=%d" % world_size)
            return None
        if not isinstance(group, str) or not group:
            raise ClientArgumentError("group: %r is not a non-empty string" % (group,))
        return group

    def _normalize(self, params):
        """Param groups as torch takes them, with (name, tensor) pairs turned into tensors whose
        names are remembered."""
        if isinstance(params, torch.Tensor):
            raise TypeError("params argument given to the optimizer should be an iterable of "
                            "Tensors or dicts, but got " + torch.typename(params))
        groups = list(params)
        if not groups:
            raise ValueError("optimizer got an empty parameter list")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        out = []
        for g in groups:
            if not isinstance(g, dict):
                raise TypeError("param groups must all be dicts when the first one is")
            g = dict(g)
            g["params"] = self._named(g.get("params", []))
            out.append(g)
        return out

    def _named(self, params):
        if isinstance(params, torch.Tensor):
            return [params]
        tensors = []
        for p in params:
            if isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str):
                name, p = p
                self._names[id(p)] = name
            tensors.append(p)
        return tensors

    def _check_exclude(self, exclude):
        ids, names = set(), set()
        for e in exclude or ():
            if isinstance(e, str):
                names.add(e)
            elif isinstance(e, torch.Tensor):
                ids.add(id(e))
            else:
                raise ClientArgumentError("exclude: %r is neither a parameter nor a name" % (e,))
        return ids, names

    def _connect(self):
        """A session (the server answers every name of this optimizer in it), the server's
        limits and epoch, and the replica group joined."""
        c = self.client
        c._ensure_session()
        info = c.server_info()
        self._epoch = info.server_epoch
        if self._replica is not None:
            limit = int(info.limits.max_world_size)
            if limit and self._world_size > limit:
                raise ClientArgumentError("world_size: %d is over the server's limit of %d "
                                          "(fp4qd --max_world_size)" % (self._world_size, limit))
            c.join_group(self._replica, self._world_size, self._rank,
                         deadline_ms=self._deadline_ms)
        return info

    def add_param_group(self, param_group):
        """torch's add_param_group (defaults filled in, duplicates refused) plus fp4q's: each
        group is validated like torch's optimizer validates its arguments, and after
        construction the new group's storable parameters are created on the server."""
        if isinstance(param_group, dict) and hasattr(self, "_names"):
            param_group = dict(param_group)
            param_group["params"] = self._named(param_group.get("params", []))
            for key, value in self.defaults.items():
                if value is _REQUIRED and key not in param_group:
                    raise ClientArgumentError(
                        "%s: required (torch.optim.%s has no default; give %s= or each param "
                        "group's '%s')" % (key, type(self).__name__, key, key))
            # Checked before torch appends it, so a refused group leaves the optimizer as it was.
            self.check_group(dict(self.defaults, **param_group),
                             "param_groups[%d]" % len(self.param_groups))
        super().add_param_group(param_group)
        gi = len(self.param_groups) - 1
        if getattr(self, "_ready", False):
            self._register_group(gi)
            self._check_torch_side()

    def _name_of(self, p, index):
        return self._prefix + self._names.get(id(p), "param%d" % index)

    def _unstorable(self, p):
        """Why `p` stays in torch, or None when the server can store it."""
        if id(p) in self._exclude_ids or self._names.get(id(p)) in self._exclude_names:
            return "excluded by the caller"
        if p.dtype not in (torch.float32, torch.bfloat16):
            return "dtype %s (stored weights are float32 or bfloat16)" % p.dtype
        if p.dim() != 2:
            return "%d-D (stored weights are 2-D)" % p.dim()
        rows, cols = p.shape
        if cols % 16:
            return "%d columns, not a multiple of 16" % cols
        if self._block == "16x16" and rows % 16:
            return "%d rows, not a multiple of 16 (16x16 blocks)" % rows
        if p.is_sparse:
            return "sparse"
        return None

    def _register_group(self, gi):
        group = self.param_groups[gi]
        for p in group["params"]:
            index = self._count
            self._count += 1
            name = self._name_of(p, index)
            reason = self._unstorable(p)
            if reason is not None:
                self._torch_side.append((p, gi, index, reason))
                self._add_to_inner(p, gi)
                continue
            if self._max_items and len(self._stored) >= self._max_items:
                raise ClientArgumentError(
                    "params: more than %d storable parameters, the server's limit of items in "
                    "one step (fp4qd --max_step_items)" % self._max_items)
            spec = self.spec_for(group)
            s = _Stored(name=name, param=p, group=gi, index=index, dtype=p.dtype, spec=spec)
            self._create(s)
            self._stored.append(s)

    def _create(self, s):
        c = self.client
        p = s.param
        try:
            c.create_weight(s.name, p.detach(), block=self._block, rounding=self._rounding,
                            seed=(self._seed + s.index) % 2**64,
                            error_feedback=self._error_feedback, dtype=p.dtype,
                            scaling=self._scaling, optimizer=s.spec)
        except Fp4qError as e:
            if e.code != grpc.StatusCode.ALREADY_EXISTS:
                raise
            self._use_existing(s)
        self._check_reply_epoch(c.last_header, "CreateWeight")
        c.get_weight(s.name, out=p.data)  # the parameter holds what the server stores

    def _use_existing(self, s):
        c = self.client
        if self._existing == "replace":
            if self._replica is not None:
                raise ClientArgumentError(
                    "existing: 'replace' in a replica group (another rank may have created "
                    "weight '%s' a moment ago); delete stale state first "
                    "(Client.delete_namespace)" % s.name)
            c.delete_weight(s.name)
            c.create_weight(s.name, s.param.detach(), block=self._block,
                            rounding=self._rounding, seed=(self._seed + s.index) % 2**64,
                            error_feedback=self._error_feedback, dtype=s.param.dtype,
                            scaling=self._scaling, optimizer=s.spec)
            return
        info = c.get_weight(s.name, dequantized=False).info
        problem = _optim_state.mismatch(info, s, self)
        if problem:
            raise Fp4qError(grpc.StatusCode.ALREADY_EXISTS, (
                "weight '%s' exists in namespace '%s' and does not fit parameter %d: %s; delete "
                "it, or use another name_prefix or namespace") % (
                    s.name, c.namespace, s.index, problem))
        fresh = info.last_step == 0 and info.optimizer_steps == 0
        if self._existing == "attach" or (self._replica is not None and fresh):
            self._fp4q_steps = max(self._fp4q_steps, int(info.last_step))
            return
        raise Fp4qError(grpc.StatusCode.ALREADY_EXISTS, (
            "weight '%s' already exists in namespace '%s' (last step %d: an earlier run or "
            "another optimizer); pass existing='attach' to continue from it or "
            "existing='replace' to start over, or use another name_prefix or namespace "
            "(fp4q.Client(namespace=...)); Client.delete_namespace() deletes a job's state") % (
                s.name, c.namespace, info.last_step))

    # ------------------------------------------------------------------ torch's side

    def _torch_hyper(self, group):
        return {k: v for k, v in group.items() if k != "params"}

    def _add_to_inner(self, p, gi):
        hyper = self._torch_hyper(self.param_groups[gi])
        if self._inner is None:
            self._inner = self.TORCH([dict(hyper, params=[p])])
            self._inner_group[gi] = 0
        elif gi not in self._inner_group:
            self._inner.add_param_group(dict(hyper, params=[p]))
            self._inner_group[gi] = len(self._inner.param_groups) - 1
        else:
            self._inner.param_groups[self._inner_group[gi]]["params"].append(p)

    def _check_torch_side(self):
        if self._world_size == 1 or not self._torch_side:
            return
        names = ["%s (%s)" % (self._name_of(p, i), why) for p, _, i, why in self._torch_side]
        dist = torch.distributed
        if not (dist.is_available() and dist.is_initialized()):
            raise ClientArgumentError(
                "world_size=%d: parameters %s stay in torch, and their values would differ "
                "between ranks; initialize torch.distributed (their gradients are then "
                "averaged with all_reduce), or store them" % (self._world_size, names))
        for p, _, _, _ in self._torch_side:
            if not getattr(p, "_fp4q_broadcast", False):
                dist.broadcast(p.data, src=0)
                p._fp4q_broadcast = True

    @property
    def server_step(self):
        """The step number of the last step the server applied (the next step() sends this
        plus one; a failed step() is sent again with the same number)."""
        return self._fp4q_steps

    @property
    def stored_names(self):
        """{parameter index: the server's weight name} of the stored parameters."""
        return {s.index: s.name for s in self._stored}

    @property
    def torch_parameters(self):
        """{parameter index: why it stays in torch} of the parameters torch updates."""
        return {i: why for _, _, i, why in self._torch_side}

    # ------------------------------------------------------------------ the step

    def _check_epoch(self):
        now = self.client.server_epoch
        if now is not None and now != self._epoch:
            raise ServerRestartedError(self._epoch, now)

    def _check_reply_epoch(self, header, rpc):
        if header is not None and header.server_epoch != self._epoch:
            raise ServerRestartedError(self._epoch, header.server_epoch, rpc)

    def _hyper_for_step(self):
        """Every group's hyperparameters, validated (torch's rules and what the group's weights
        were created for), before anything is sent."""
        hypers = []
        for gi, group in enumerate(self.param_groups):
            field = "param_groups[%d]" % gi
            self.check_group(group, field)
            spec = self.spec_for(group)
            for s in self._stored:
                if s.group == gi and s.spec != spec:
                    raise ClientArgumentError(
                        "%s: %s, but its weights were created for %s (fixed at construction: %s)"
                        % (field, self._describe(spec), self._describe(s.spec),
                           ", ".join(self.FIXED)))
            hypers.append(self.hyperparameters(group))
        return hypers

    @staticmethod
    def _describe(spec):
        parts = [spec.kind]
        if spec.momentum:
            parts.append("a momentum buffer")
        if spec.amsgrad:
            parts.append("amsgrad")
        return " with ".join(parts)

    def _items(self):
        items, group_index = [], {}
        for s in self._stored:
            p = s.param
            g = p.grad
            if g is None:
                continue
            field = "parameter %d ('%s')" % (s.index, s.name)
            if g.is_sparse:
                raise ClientArgumentError("%s: sparse gradients are not supported" % field)
            if tuple(g.shape) != tuple(p.shape):
                raise ClientArgumentError("%s: gradient of shape %s for a parameter of shape %s"
                                          % (field, list(g.shape), list(p.shape)))
            if p.dtype != s.dtype:
                raise ClientArgumentError(
                    "%s: the parameter is %s now, but its weight was created %s (convert the "
                    "model before building the optimizer)" % (field, p.dtype, s.dtype))
            gi = group_index.setdefault(s.group, len(group_index))
            items.append(StepItem(name=s.name, update=g, dequantized_out=p.data, group=gi))
        return items, group_index

    @torch.no_grad()
    def step(self, closure=None):
        """One optimizer step (see the module docstring). Returns closure's loss, if given."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._check_epoch()
        hypers = self._hyper_for_step()
        items, group_index = self._items()
        if items:
            groups = [None] * len(group_index)
            for gi, k in group_index.items():
                groups[k] = hypers[gi]
            self._send(self._fp4q_steps + 1, items, groups)
            self._fp4q_steps += 1
        self._torch_step()
        return loss

    def _send(self, step, items, groups):
        c = self.client
        replica = (self._replica, self._rank) if self._replica is not None else None
        for attempt in (0, 1):
            try:
                result = c.step(step, items, groups, replica=replica, resend=False)
                break
            except Fp4qError as e:
                if e.code != grpc.StatusCode.NOT_FOUND or not e.message.startswith(_SESSION_GONE):
                    raise
                # The session this optimizer's calls ran in is gone: a restarted server, or a
                # lapsed lease. Nothing of this step ran.
                epoch = c.server_info().server_epoch
                if epoch != self._epoch:
                    raise ServerRestartedError(self._epoch, epoch, "Step") from None
                if self._replica is not None or attempt == 1:
                    raise Fp4qError(grpc.StatusCode.UNAVAILABLE, (
                        "step %d: this optimizer's session ended (its lease lapsed: the process "
                        "was stopped for longer than the lease, or the session was closed)%s; "
                        "nothing was applied") % (step, (
                            "; rank %d's place in replica group '%s' is free again: every rank "
                            "must build its optimizer again (existing='attach')"
                            % (self._rank, self._replica)) if self._replica else ""),
                        "Step") from None
                c._ensure_session()  # same server: its weights are intact
        self._check_reply_epoch(result.header, "Step")
        return result

    def _torch_step(self):
        if self._inner is None:
            return
        for gi, k in self._inner_group.items():
            self._inner.param_groups[k].update(self._torch_hyper(self.param_groups[gi]))
        if self._world_size > 1:
            dist = torch.distributed
            for p, _, _, _ in self._torch_side:
                if p.grad is not None:
                    dist.all_reduce(p.grad)
                    p.grad.div_(self._world_size)
        self._inner.step()

    # ------------------------------------------------------------------ state

    def state_dict(self):
        """See fp4q._optim_state.state_dict."""
        return _optim_state.state_dict(self)

    def load_state_dict(self, state_dict):
        """See fp4q._optim_state.load_state_dict."""
        _optim_state.load_state_dict(self, state_dict)

    def __repr__(self):
        return ("%s(%d stored, %d in torch, rounding=%r, error_feedback=%r, block=%r, "
                "scaling=%r)" % (type(self).__name__, len(self._stored), len(self._torch_side),
                                 self._rounding, self._error_feedback, self._block,
                                 self._scaling))


_REQUIRED = _torch_optimizer.required

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
"""


class SGD(StoredOptimizer):
    """torch.optim.SGD (momentum, dampening, Nesterov, weight decay) with 4-bit stored weights.

    Arguments as torch.optim.SGD: params (tensors, (name, tensor) pairs, or param group dicts),
    lr (required), momentum=0, dampening=0, weight_decay=0, nesterov=False. A group whose
    momentum is > 0 at construction gets a server-side momentum buffer; momentum can change
    later but not from 0 to > 0 (or back) for that group.
    """

    KIND = "sgd"
    TORCH = torch.optim.SGD
    FIXED = ("whether momentum is > 0",)

    def __init__(self, params, lr=_REQUIRED, momentum=0, dampening=0, weight_decay=0,
                 nesterov=False, *, rounding="nearest", error_feedback=True, block="1x16",
                 scaling="current", state_dtype="f32", seed=0, client=None, name_prefix="",
                 exclude=(), existing="error", group=None, world_size=1, rank=0,
                 deadline_ms=0):
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening,
                        weight_decay=weight_decay, nesterov=nesterov)
        if lr is not _REQUIRED:
            self.check_group(defaults, "")
        super().__init__(params, defaults, client=client, name_prefix=name_prefix,
                         group=group, world_size=world_size, rank=rank, deadline_ms=deadline_ms,
                         rounding=rounding, error_feedback=error_feedback, block=block,
                         scaling=scaling, state_dtype=state_dtype, seed=seed, exclude=exclude,
                         existing=existing)

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

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                 amsgrad=False, *, rounding="nearest", error_feedback=True, block="1x16",
                 scaling="current", state_dtype="f32", seed=0, client=None, name_prefix="",
                 exclude=(), existing="error", group=None, world_size=1, rank=0,
                 deadline_ms=0):
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                        amsgrad=amsgrad)
        self.check_group(defaults, "")
        super().__init__(params, defaults, client=client, name_prefix=name_prefix,
                         group=group, world_size=world_size, rank=rank, deadline_ms=deadline_ms,
                         rounding=rounding, error_feedback=error_feedback, block=block,
                         scaling=scaling, state_dtype=state_dtype, seed=seed, exclude=exclude,
                         existing=existing)

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
