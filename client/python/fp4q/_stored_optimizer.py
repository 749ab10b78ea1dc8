"""fp4q.optim.StoredOptimizer, the machinery of fp4q.optim.SGD and AdamW (see fp4q.optim).

Construction (the session, the parameters sorted into stored weights and torch's, the weights
created or attached on the server), torch's optimizer for the parameters kept in torch, and
step(), whose helpers are fp4q._optim_step.StepMixin's; state_dict() / load_state_dict() are
fp4q._optim_state's.
"""

import dataclasses
import numbers

import grpc
import torch
from torch.optim import optimizer as _torch_optimizer

from fp4q import _optim_state
from fp4q import _overlap
from fp4q import functional
from fp4q import options as opts
from fp4q._optim_step import StepMixin
from fp4q.errors import Fp4qError
from fp4q.tensors import ClientArgumentError

_ROUNDINGS = ("nearest", "stochastic")
_BLOCKS = ("1x16", "16x16")
_SCALINGS = ("current", "delayed")
_STATE_DTYPES = ("f32", "bf16", "nvfp4")
_EXISTING = ("error", "attach", "replace")
_REQUIRED = _torch_optimizer.required


@dataclasses.dataclass
class _Stored:
    """A parameter the server stores: its weight name, param group and torch state index."""

    name: str
    param: torch.Tensor
    group: int
    index: int
    dtype: torch.dtype
    spec: opts.OptimizerSpec


_set_grad_enabled = torch._C._set_grad_enabled  # torch.set_grad_enabled without its object


def _choice(value, allowed, field):
    if value not in allowed:
        raise ClientArgumentError("%s: %r is not one of %s" % (field, value, list(allowed)))
    return value


class StoredOptimizer(StepMixin, torch.optim.Optimizer):
    """The machinery of fp4q.optim.SGD and AdamW (see fp4q.optim's docstring); not used directly.

    Subclasses set KIND ('sgd' | 'adamw'), TORCH (the torch.optim class for parameters kept in
    torch), check_group(group, field) (torch's validation of one param group) and
    hyperparameters(group) (its fp4q.SgdHyperparameters / AdamWHyperparameters) and
    spec_for(group) (the OptimizerSpec its weights are created with)."""

    KIND = None
    TORCH = None
    # The hyperparameters a weight's state is created for: changing them later is refused.
    FIXED = ()
    # The param-group keys hyperparameters(group) and spec_for(group) read.
    HYPER_KEYS = ()

    def __init__(self, params, defaults, *, client, name_prefix, group, world_size, rank,
                 deadline_ms, rounding, error_feedback, block, scaling, state_dtype, seed,
                 exclude, existing, overlap=False, ready_signal=True, one_pass=False):
        self._ready = False
        for field, v in (("overlap", overlap), ("ready_signal", ready_signal),
                         ("one_pass", one_pass)):
            if not isinstance(v, bool):
                raise ClientArgumentError("%s: %r is not a bool" % (field, v))
        if one_pass and (scaling != "delayed" or block != "1x16"):
            raise ClientArgumentError(
                "one_pass: True needs scaling='delayed' and block='1x16' (got scaling=%r, "
                "block=%r): a one-pass step takes the previous step's amax" % (scaling, block))
        self._one_pass = one_pass
        self.one_pass_steps = 0  # steps fp4qd ran in one pass (StepResult.one_pass)
        self.two_pass_reasons = {}  # and why the others ran in two (StepResult.one_pass_outcome)
        self._overlapped = None  # fp4q._overlap.OverlappedSteps with overlap=True
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
        self._specs_checked = {}  # group index -> the spec its stored weights were found to match
        self._hyper_last = {}  # group index -> (its plain values, its hyperparameters), last step
        self._plan_token = object()  # this optimizer's items (names, groups) in step-plan keys
        self._torch_side = []   # (param, group index, index, reason)
        self._inner = None      # torch's optimizer over the parameters kept in torch
        self._inner_group = {}  # our group index -> the inner optimizer's group index
        self._fp4q_steps = 0    # successful steps; the next Step sends this + 1
        self._count = 0         # parameters seen, across groups (torch's state indices)
        self._epoch = None
        info = self._connect()
        self._max_items = int(info.limits.max_step_items) or None
        device = self._overlap_device(info) if overlap else None
        for gi in range(len(self.param_groups)):
            self._register_group(gi)
        self._check_torch_side()
        ready = ready_signal and "step_ready_signal" in info.supported_modes
        if device is not None:
            self._overlapped = _overlap.OverlappedSteps(self.client, device, ready)
        elif ready and self._replica is None:
            device = self._stored_device()
            if device is not None and device.type == "cuda":
                self._ready_steps = _overlap.ReadySteps(self.client, device)
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

    def _overlap_device(self, info):
        """The device of overlap=True's steps (None: nothing is stored), checked before any
        weight is created: the server must write done signals and every stored parameter be on
        one CUDA device."""
        modes = set(info.supported_modes)
        missing = [m for m in ("cuda_ipc", "step_done_signal") if m not in modes]
        if missing:
            raise ClientArgumentError(
                "overlap: True needs a server that offers %s to this client (fp4qd "
                "--allow_cuda_ipc on the CUDA backend, reached over its Unix socket); it lists "
                "%s" % (" and ".join(missing), sorted(modes)))
        devices = sorted({str(p.device) for g in self.param_groups for p in g["params"]
                          if self._unstorable(p) is None})
        if not devices:
            return None  # nothing stored: every step is torch's
        if len(devices) > 1 or not devices[0].startswith("cuda"):
            raise ClientArgumentError(
                "overlap: True needs every stored parameter on one CUDA device; they are on %s"
                % devices)
        return torch.device(devices[0])

    def _stored_device(self):
        """The one device of the stored parameters (after construction), or None."""
        devices = {s.param.device for s in self._stored}
        return devices.pop() if len(devices) == 1 else None

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
        plus one; a failed step() is sent again with the same number). With overlap=True a step
        in flight counts once its outcome is taken (synchronize())."""
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

    def step(self, *args, **kwargs):
        """One optimizer step, step(closure=None) (see fp4q.optim's docstring). Returns
        closure's loss, if given.

        torch.optim.Optimizer wraps a subclass's step() for its profiler and hooks; that wrapper
        enters a profiler range on every call (torch 2.11 on the development VM: 8.8 us a call
        against this one's 1.6, bench/results/cpu-step-host/step-wrapper), so this one is
        marked as already wrapped and does the
        same: the step's pre hooks (torch's global ones, then this optimizer's; either may
        replace the arguments), the step, then its post hooks, inside torch's
        "Optimizer.step#<class>.step" range only while torch's profiler records. The step runs
        without autograd (torch's optimizers run under no_grad), its closure with it."""
        for hook in self._step_hooks("pre"):
            result = hook(self, args, kwargs)
            if result is not None:
                if not (isinstance(result, tuple) and len(result) == 2):
                    raise RuntimeError("%r must return None or a tuple of (new_args, new_kwargs), "
                                       "but got %r" % (hook, result))
                args, kwargs = result
        if torch.autograd._profiler_enabled():
            with torch.autograd.profiler.record_function(
                    "Optimizer.step#%s.step" % type(self).__name__):
                loss = self._step_without_grad(*args, **kwargs)
        else:
            loss = self._step_without_grad(*args, **kwargs)
        self._optimizer_step_code()
        for hook in self._step_hooks("post"):
            hook(self, args, kwargs)
        return loss

    step.hooked = True  # torch.optim.Optimizer leaves it unwrapped

    def _step_hooks(self, when):
        """torch's step hooks to run `when` ("pre": the global ones, then this optimizer's;
        "post": the other way round), as torch >= 2.0 keeps them (none before)."""
        mine = getattr(self, "_optimizer_step_%s_hooks" % when, None)
        glob = getattr(_torch_optimizer, "_global_optimizer_%s_hooks" % when, None)
        if not mine and not glob:
            return ()
        order = (glob, mine) if when == "pre" else (mine, glob)
        return [hook for hooks in order if hooks for hook in hooks.values()]

    def _step_without_grad(self, closure=None):
        enabled = torch.is_grad_enabled()
        _set_grad_enabled(False)
        try:
            return self._step(closure)
        finally:
            _set_grad_enabled(enabled)

    def _step(self, closure):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.synchronize()
        if self._overlapped is None:
            # fp4qd's thread for the step wakes while the checks below run (after an idle gap).
            # An overlapped step is sent while the backward pass runs, which it waits for.
            self.client._transport.heads_up()
        self._check_epoch()
        hypers = self._hyper_for_step()
        key, group_index = self._step_key()
        if group_index:  # some stored parameter has a gradient
            groups = [None] * len(group_index)
            for gi, k in group_index.items():
                groups[k] = hypers[gi]
            if self._overlapped is not None:
                self._send_overlapped(self._fp4q_steps + 1, key, groups)
            else:
                self._send(self._fp4q_steps + 1, key, groups)
                self._fp4q_steps += 1
        self._torch_step()
        return loss

    def synchronize(self):
        """With overlap=True: waits for the step in flight and takes its outcome (the step
        count advances, or its error is raised here; the next step() then sends that step number
        again). Without overlap, or with no step in flight, it returns at once."""
        o = self._overlapped
        if o is None or o.in_flight is None:
            return
        step = o.in_flight
        try:
            _, result = o.finish()
        except Fp4qError as e:
            raise self._overlapped_error(step, e) from None
        self._check_reply_epoch(result.header, "Step")
        self._count_passes(result)
        self._fp4q_steps = step

    # ------------------------------------------------------------------ state

    def state_dict(self):
        """See fp4q._optim_state.state_dict (after synchronize())."""
        self.synchronize()
        return _optim_state.state_dict(self)

    def load_state_dict(self, state_dict):
        """See fp4q._optim_state.load_state_dict (after synchronize())."""
        self.synchronize()
        _optim_state.load_state_dict(self, state_dict)

    def __repr__(self):
        return ("%s(%d stored, %d in torch, rounding=%r, error_feedback=%r, block=%r, "
                "scaling=%r)" % (type(self).__name__, len(self._stored), len(self._torch_side),
                                 self._rounding, self._error_feedback, self._block,
                                 self._scaling))
