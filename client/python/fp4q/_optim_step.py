"""The helpers of StoredOptimizer.step (fp4q.optim): checks, the Step request and torch's side.

StepMixin holds the StoredOptimizer methods that step() calls: the server-epoch checks, every
group's hyperparameters validated, the Step items built from the gradients, the Step RPC (a
lost session handled), and torch's optimizer stepped for the parameters kept in torch.
"""

import grpc
import torch

from fp4q import _torch_side
from fp4q._step_plans import _exact
from fp4q.errors import Fp4qError, ServerRestartedError
from fp4q.results import StepItem
from fp4q.tensors import ClientArgumentError

_SESSION_GONE = ("hello.session_id: unknown or expired session",
                 "metadata fp4q-session: unknown or expired session")


class _PlanKey:
    """A step-plan key, (layout, pointers) as fp4q._requests.step_keyed takes it, whose hash is
    computed once: a step that reuses the last step's key finds its plan without hashing and
    comparing every parameter's entry again."""

    __slots__ = ("layout", "pointers", "_hash")

    def __init__(self, layout, pointers):
        self.layout, self.pointers = layout, pointers
        self._hash = hash((layout, pointers))

    def __hash__(self):
        return self._hash

    def __eq__(self, other):
        return self is other or (type(other) is _PlanKey and self._hash == other._hash and
                                 self.layout == other.layout and self.pointers == other.pointers)

    def __iter__(self):
        return iter((self.layout, self.pointers))

    def __getitem__(self, i):
        return (self.layout, self.pointers)[i]


def _plain_values(group, keys):
    """The group's values of `keys` as a tuple when every one is a plain float, int or bool (or
    a tuple of them), else None (a tensor or other object is validated at every step). Two
    tuples are equal only when the values encode the same (fp4q._step_plans._exact: a zero's
    sign counts)."""
    values = tuple(map(_exact, map(group.get, keys)))
    return None if None in values else values


class StepMixin:
    """StoredOptimizer's step machinery (see fp4q.optim); it uses the optimizer's fields."""

    # _step_key's last keys, most recent first: (what _key_holds checks, key, group index).
    # Several: with zero_grad(set_to_none=True) torch's allocator hands the next
    # backward pass's gradients blocks that alternate between a few sets of addresses.
    _recent_keys = ()
    RECENT_KEYS = 4
    _ready_steps = None  # fp4q._overlap.ReadySteps: overlap=False's steps with ready signals
    _one_pass = False  # ask for one-pass steps (StepRequest.one_pass)
    one_pass_steps = 0  # steps fp4qd ran in one pass
    two_pass_reasons = None  # {StepResult.one_pass_outcome: steps} of the others (one_pass=True)

    def _check_epoch(self):
        now = self.client.server_epoch
        if now is not None and now != self._epoch:
            raise ServerRestartedError(self._epoch, now)

    def _check_reply_epoch(self, header, rpc):
        if header is not None and header.server_epoch != self._epoch:
            raise ServerRestartedError(self._epoch, header.server_epoch, rpc)

    def _hyper_for_step(self):
        """Every group's hyperparameters, validated (torch's rules and what the group's weights
        were created for), before anything is sent. A group whose values (HYPER_KEYS) are plain
        numbers equal to those of its last step reuses that step's, checked then."""
        hypers = []
        checked = self._specs_checked
        last = self._hyper_last
        for gi, group in enumerate(self.param_groups):
            sig = _plain_values(group, self.HYPER_KEYS)
            kept = last.get(gi)
            if sig is not None and kept is not None and kept[0] == sig:
                hypers.append(kept[1])
                continue
            field = "param_groups[%d]" % gi
            self.check_group(group, field)
            spec = self.spec_for(group)
            if checked.get(gi) != spec:
                for s in self._stored:
                    if s.group == gi and s.spec != spec:
                        raise ClientArgumentError(
                            "%s: %s, but its weights were created for %s (fixed at "
                            "construction: %s)" % (field, self._describe(spec),
                                                   self._describe(s.spec), ", ".join(self.FIXED)))
                checked[gi] = spec
            h = self.hyperparameters(group)
            hypers.append(h)
            if sig is not None:
                last[gi] = (sig, h)
            else:
                last.pop(gi, None)
        return hypers

    @staticmethod
    def _describe(spec):
        parts = [spec.kind]
        if spec.momentum:
            parts.append("a momentum buffer")
        if spec.amsgrad:
            parts.append("amsgrad")
        return " with ".join(parts)

    def _step_key(self):
        """This step's items as a key of the client's step plans (fp4q._requests.step_keyed:
        (layout, pointers), a _PlanKey), with {param group: its index in the Step's groups} of
        the groups with gradients; the gradients checked as _items checks them. The layout, per
        stored parameter: None without a gradient, else the gradient's dtype and contiguity and
        the parameter's shape and contiguity (names and groups are the optimizer's own:
        `_plan_token` stands for them); the pointers: the gradient's and the parameter's
        addresses of each parameter with a gradient.

        When every parameter has a gradient where it had one of the last RECENT_KEYS keys, and
        every gradient and parameter has the address, dtype, shape and contiguity it had there,
        that key is the answer (the layout holds nothing else); else it is computed afresh. The
        kept keys hold no tensor: a gradient freed by zero_grad(set_to_none=True) goes back to
        torch's allocator, and the next backward pass reuses its memory."""
        recent = self._recent_keys
        for j, last in enumerate(recent):
            if self._key_holds(last[0]):
                if j:
                    recent.insert(0, recent.pop(j))
                return last[1], last[2]
        layout = [self._plan_token]
        pointers = []
        append, point = layout.append, pointers.append
        group_index = {}
        checks = []
        for s in self._stored:
            p = s.param
            g = p.grad
            if g is None:
                append(None)
                checks.append((s, None))
                continue
            if g.is_sparse or g.shape != p.shape or p.dtype != s.dtype:
                self._refuse_gradient(s, g)
            if s.group not in group_index:
                group_index[s.group] = len(group_index)
            g_contiguous, p_contiguous = g.is_contiguous(), p.is_contiguous()
            append((g.dtype, g_contiguous, p.shape, p_contiguous))
            g_ptr, p_ptr = g.data_ptr(), p.data_ptr()
            point(g_ptr)
            point(p_ptr)
            checks.append((s, (g_ptr, p_ptr, g.dtype, p.dtype, g.shape, g_contiguous,
                               p_contiguous)))
        key = _PlanKey(tuple(layout), tuple(pointers))
        if not isinstance(recent, list):
            recent = self._recent_keys = []
        recent.insert(0, (tuple(checks), key, group_index))
        del recent[self.RECENT_KEYS:]
        return key, group_index

    def _key_holds(self, checks):
        """Whether the parameters and their gradients are as `checks` (of an entry of
        _recent_keys: per stored parameter, its _Stored and None where it had no gradient, else
        its gradient's and its own address, dtype, shape and contiguity) saw them: _step_key's
        check, False at the first difference."""
        if len(checks) != len(self._stored):
            return False
        try:
            for s, want in checks:
                p = s.param
                g = p.grad
                if want is None:
                    if g is not None:
                        return False
                    continue
                if g is None:
                    return False
                g_ptr, p_ptr, g_dtype, p_dtype, shape, g_contiguous, p_contiguous = want
                if (g.data_ptr() != g_ptr or p.data_ptr() != p_ptr or g.dtype is not g_dtype or
                        p.dtype is not p_dtype or g.shape != shape or p.shape != shape or
                        g.is_contiguous() is not g_contiguous or
                        p.is_contiguous() is not p_contiguous):
                    return False
        except RuntimeError:
            return False  # a tensor without storage (a sparse gradient): refused afresh
        return True

    def _items(self):
        items, group_index = [], {}
        for s in self._stored:
            p = s.param
            g = p.grad
            if g is None:
                continue
            if g.is_sparse or g.shape != p.shape or p.dtype != s.dtype:
                self._refuse_gradient(s, g)
            gi = group_index.get(s.group)
            if gi is None:
                gi = group_index[s.group] = len(group_index)
            items.append(StepItem(s.name, g, p.data, False, gi))
        return items, group_index

    @staticmethod
    def _refuse_gradient(s, g):
        p = s.param
        field = "parameter %d ('%s')" % (s.index, s.name)
        if g.is_sparse:
            raise ClientArgumentError("%s: sparse gradients are not supported" % field)
        if g.shape != p.shape:
            raise ClientArgumentError("%s: gradient of shape %s for a parameter of shape %s"
                                      % (field, list(g.shape), list(p.shape)))
        raise ClientArgumentError(
            "%s: the parameter is %s now, but its weight was created %s (convert the "
            "model before building the optimizer)" % (field, p.dtype, s.dtype))

    def _send(self, step, key, groups, overlapped=False):
        """Sends step `step` and returns its StepResult; with `overlapped`, by
        self._overlapped.send (None: the step is in flight, synchronize() takes its outcome).
        A lost session is opened again and the step sent once more (single workers)."""
        c = self.client
        replica = (self._replica, self._rank) if self._replica is not None else None
        ready_steps = None if overlapped else self._ready_steps
        for attempt in (0, 1):
            try:
                if overlapped:
                    result = self._overlapped.send(step, key, lambda: self._items()[0], groups,
                                                   replica, one_pass=self._one_pass)
                else:
                    ready, idle = ((None, None) if ready_steps is None
                                   else ready_steps.ready_and_order())
                    result = None
                    if ready is None and replica is None:  # the server's plan, if it holds one
                        result = c._requests.step_named(step, key, groups, self._one_pass, idle)
                    try:
                        if result is None:
                            result = c._requests.step_keyed(
                                step, key, lambda: self._items()[0], groups, replica, ready,
                                one_pass=self._one_pass, order=idle)
                    except Fp4qError as e:
                        if ready is None or not ready_steps.retry_without(e):
                            raise
                        # Nothing of the step ran: sent again, the host having waited.
                        result = c._requests.step_keyed(step, key, lambda: self._items()[0],
                                                        groups, replica, one_pass=self._one_pass)
                break
            except Fp4qError as e:
                gone = self._session_gone(step, e, retry=attempt == 0)
                if gone is not None:
                    raise gone from None
                c._ensure_session()  # same server: its weights are intact
        if result is not None:
            self._check_reply_epoch(result.header, "Step")
            self._count_passes(result)
        return result

    def _count_passes(self, result):
        """one_pass_steps, or two_pass_reasons when one pass was asked and fp4qd ran two."""
        if result.one_pass:
            self.one_pass_steps += 1
        elif self._one_pass:
            why = result.one_pass_outcome or "unknown"  # a server older than the field
            self.two_pass_reasons[why] = self.two_pass_reasons.get(why, 0) + 1

    def _session_gone(self, step, e, retry):
        """None when `e` says this optimizer's session is gone and the step may be sent again
        in a new one (`retry`, single workers); else the error to raise for step `step`."""
        if e.code != grpc.StatusCode.NOT_FOUND or not e.message.startswith(_SESSION_GONE):
            return e
        # The session this optimizer's calls ran in is gone: a restarted server, or a lapsed
        # lease. Nothing of this step ran.
        c = self.client
        epoch = c.server_info().server_epoch
        if epoch != self._epoch:
            return ServerRestartedError(self._epoch, epoch, "Step")
        if self._replica is None and retry:
            return None
        return Fp4qError(grpc.StatusCode.UNAVAILABLE, (
            "step %d: this optimizer's session ended (its lease lapsed: the process was stopped "
            "for longer than the lease, or the session was closed)%s; nothing was applied") % (
                step, (
                    "; rank %d's place in replica group '%s' is free again: every rank must "
                    "build its optimizer again (existing='attach')"
                    % (self._rank, self._replica)) if self._replica else ""), "Step")

    def _send_overlapped(self, step, key, groups):
        if self._send(step, key, groups, overlapped=True) is not None:
            self._fp4q_steps = step  # it had to complete in step()

    def _overlapped_error(self, step, e):
        """The error to raise for step `step`, sent with overlap=True, that failed with `e`."""
        gone = self._session_gone(step, e, retry=False)
        if gone is not e:
            if self._replica is None and not isinstance(gone, ServerRestartedError):
                self.client._ensure_session()  # the next step() is sent in a new session
            return gone
        return Fp4qError(e.code, "step %d (overlap=True: sent by the step() before this call): "
                         "%s" % (step, e.message), e.rpc)

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
        if not _torch_side.sgd_step(self._inner):  # the same tensor calls, fewer host us
            self._inner.step()
