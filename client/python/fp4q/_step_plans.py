"""Step plans: the client's cache of the items of a trainer's repeated Step (fp4q._requests).

A trainer sends the same parameters' gradients and outputs at the same addresses step after
step. StepPlans keeps the items of the last few Steps whose every tensor went by IPC as a slice
of its own allocation, as their encoding (_StepPlan), keyed by _step_plan_key (or fp4q.optim's
own key); a layout's template (_SlicedItems) re-slices them when only the tensors' offsets
within the same allocations moved. fp4q._requests._step decides when a plan holds.
"""

import collections
import math
import threading

import torch

from fp4q import _fast_frames
from fp4q._messages import pb


class _StepPlan:
    """A Step's items as they were sent: the Transfer's plan (None: not every tensor went as a
    slice of its own allocation, so nothing is kept), the items' encoding, their reply bound
    and whether a brief reply may answer them (no item wants its DQ(W) inline)."""

    __slots__ = ("plan", "body", "reply_bound", "brief_ok", "server_ok", "server_id")

    def __init__(self, plan, body, reply_bound, brief_ok, server_ok=False):
        self.plan, self.body, self.reply_bound, self.brief_ok = plan, body, reply_bound, brief_ok
        # server_ok: the server may keep these items as a step plan (StepRequest.keep_plan);
        # server_id: the plan id it answered (0: none held).
        self.server_ok, self.server_id = server_ok, 0


def _server_may_keep(memo, body):
    """Whether the server can keep a step's items (`body`) as a plan: it offers step plans and
    every update and DQ(W) target is a region slice."""
    if memo.plan is None or not memo.brief_ok:
        return False
    info = memo.plan.info
    if info is None or "step_plans" not in info.supported_modes:
        return False
    return all(m.update.HasField("region") and
               (not m.HasField("dequantized_out") or m.dequantized_out.HasField("region"))
               for m in body.items)


def _field_key(message, field, wire_type):
    """The varint key of `message`'s field `field` with wire type `wire_type`."""
    return _fast_frames.varint(message.DESCRIPTOR.fields_by_name[field].number << 3 | wire_type)


_LEN, _VARINT = 2, 0
_ONE_BYTE = [bytes((n,)) for n in range(0x80)]


def _varint(n):
    """_fast_frames.varint, with one- and two-byte values taken without a loop."""
    if n < 0x80:
        return _ONE_BYTE[n]
    if n < 0x4000:
        return bytes((n & 0x7F | 0x80, n >> 7))
    return _fast_frames.varint(n)
def _region_id_field(region_id):
    """RegionSlice's region_id field, as the protobuf library writes it (nothing when empty)."""
    raw = region_id.encode()
    return _REGION_ID_KEY + _varint(len(raw)) + raw if raw else b""


def _slice_body(rid, offset):
    """A RegionSlice's bytes: its region_id field `rid` (_region_id_field), then the offset
    unless zero."""
    return rid + _OFFSET_KEY + _varint(offset) if offset else rid


_ITEMS_KEY = _field_key(pb.StepRequest, "items", _LEN)
_UPDATE_KEY = _field_key(pb.StepItem, "update", _LEN)
_OUT_KEY = _field_key(pb.StepItem, "dequantized_out", _LEN)
_TENSOR_REGION_KEY = _field_key(pb.Tensor, "region", _LEN)
_OUT_REGION_KEY = _field_key(pb.OutputTarget, "region", _LEN)
_REGION_ID_KEY = _field_key(pb.RegionSlice, "region_id", _LEN)
_OFFSET_KEY = _field_key(pb.RegionSlice, "offset", _VARINT)


class _SlicedItems:
    """The encoding of a Step's items (every update and DQ(W) target a region slice) with other
    slices: byte for byte what the protobuf library writes for the template with its slices
    replaced (fields in number order, a zero offset left out), spliced from each item's fixed
    parts without building a message. The fixed parts: the name, the update's dtype and shape,
    return_dequantized and group (fp4q.optim's re-sliced steps: the gradients of a new backward
    pass at other offsets of the same allocations)."""

    __slots__ = ("count", "_parts")

    def __init__(self, items):
        self._parts = []
        for m in items.items:
            tensor = pb.Tensor()
            tensor.CopyFrom(m.update)
            tensor.ClearField("region")
            self._parts.append((pb.StepItem(name=m.name).SerializeToString(),
                                tensor.SerializeToString(),
                                pb.StepItem(return_dequantized=m.return_dequantized,
                                            group=m.group).SerializeToString()))
        self.count = len(self._parts)

    def encode(self, slices):
        """The items' bytes with item k's update at slices[2k] and its DQ(W) target at
        slices[2k + 1], each (region_id, offset)."""
        varint = _varint
        ids = {}

        def region(key, slice_):
            region_id, offset = slice_
            rid = ids.get(region_id)
            if rid is None:
                rid = ids[region_id] = _region_id_field(region_id)
            body = _slice_body(rid, offset)
            return key + varint(len(body)) + body

        out = []
        for k, (name, tensor, tail) in enumerate(self._parts):
            update = tensor + region(_TENSOR_REGION_KEY, slices[2 * k])
            target = region(_OUT_REGION_KEY, slices[2 * k + 1])
            item = b"".join((name, _UPDATE_KEY, varint(len(update)), update, _OUT_KEY,
                             varint(len(target)), target, tail))
            out.append(_ITEMS_KEY + varint(len(item)) + item)
        return b"".join(out)


class StepPlans:
    """The items of the last few Step requests whose every tensor went by IPC as a slice of its
    own allocation, keyed by their key (_step_plan_key, or fp4q.optim's own): a trainer sends
    the same parameters' gradients and outputs at the same addresses step after step, so a step
    encodes only its head (step, kind, groups, replica) before the items' kept bytes, and
    checks one driver call per allocation (Regions.plan_valid) instead of resolving every
    tensor again. Holds no tensor. Thread-safe."""

    SIZE = 4

    def __init__(self):
        self._lock = threading.Lock()
        self._plans = collections.OrderedDict()  # key -> _StepPlan
        self._templates = collections.OrderedDict()  # layout -> (_StepPlan, _SlicedItems)

    def put_template(self, layout, memo, items):
        """Keeps a keyed step's items (a StepRequest holding only them) as its layout's
        template, when every item's update and DQ(W) target are region slices of the plan."""
        if memo.plan is None or not all(
                m.update.HasField("region") and m.dequantized_out.HasField("region")
                for m in items.items):
            with self._lock:
                self._templates.pop(layout, None)
            return
        encoder = _SlicedItems(items)
        with self._lock:
            self._templates[layout] = (memo, encoder)
            self._templates.move_to_end(layout)
            while len(self._templates) > self.SIZE:
                self._templates.popitem(last=False)

    def resliced(self, layout, pointers, key, plan_valid):
        """The layout's template with each item's two slices at `pointers` (update, DQ(W)
        target, in item order), kept under `key`; None when there is no template, its plan no
        longer holds, or a pointer is outside its allocations."""
        with self._lock:
            found = self._templates.get(layout)
        if found is None:
            return None
        memo, encoder = found
        if len(pointers) != 2 * encoder.count or not plan_valid(memo.plan):
            return None
        slices = list(map(memo.plan.locate, pointers))
        if None in slices:
            return None
        moved = _StepPlan(memo.plan, encoder.encode(slices), memo.reply_bound,
                          memo.brief_ok, memo.server_ok)
        self.put(key, moved)
        return moved

    def get(self, key):
        with self._lock:
            memo = self._plans.get(key)
            if memo is not None:
                self._plans.move_to_end(key)
            return memo

    def forget_server_ids(self):
        """Forgets the server-side plan id of every kept step; returns how many it held."""
        with self._lock:
            held = [m for m in self._plans.values() if m.server_id]
            for m in held:
                m.server_id = 0
            return len(held)

    def put(self, key, memo):
        with self._lock:
            if memo.plan is None:
                self._plans.pop(key, None)
                return
            self._plans[key] = memo
            self._plans.move_to_end(key)
            while len(self._plans) > self.SIZE:
                self._plans.popitem(last=False)


_STEP_KEY = _field_key(pb.StepRequest, "step", _VARINT)
_INT64 = 1 << 63


def _exact(v):
    """A hyperparameter value as a key that equals another only when both encode the same: a
    float, int or bool (a zero float with its sign: 0.0 == -0.0, but not as encoded), or a
    tuple of them; None for anything else (a tensor, whose value may change in place)."""
    t = type(v)
    if t is float:
        return (0.0, math.copysign(1.0, v)) if v == 0.0 else v
    if t is int or t is bool:
        return (t, v)  # 1 == 1.0 == True, but their fields' types differ
    if t is tuple:
        values = tuple(map(_exact, v))
        return None if None in values else values
    return None


def _head_key(groups, rest):
    """StepHeads' key of a head: the groups' classes and field values (_exact) with `rest`;
    None when a value has no exact key."""
    key = [rest]
    for h in groups:
        values = tuple(map(_exact, h.__dict__.values()))
        if None in values:
            return None
        key.append((type(h), values))
    return tuple(key)


class StepHeads:
    """The fields of a StepRequest before its items (fp4q._requests._step's head), encoded: a
    trainer's steps differ in `step` alone (and in their signals' values) until a
    hyperparameter changes, so the rest is encoded once per set of values and kept, keyed by
    those values (not by the hyperparameter objects, which the caller may change in place).
    Protobuf parses fields in any order, so the step number goes before the kept bytes and the
    signals after them. Thread-safe."""

    SIZE = 16

    def __init__(self):
        self._lock = threading.Lock()
        self._kept = {}

    def encode(self, step, groups, kind=0, replica=None, brief=False, keep=False, plan_id=0,
               one_pass=False, signal=None, ready=None):
        """The head's bytes: StepRequest(step, groups, kind, replica, brief_reply, keep_plan,
        plan_id, one_pass, done_signal, ready_signal), as SerializeToString() gives a message
        that parses to the same fields. `groups`: hyperparameter objects (fill(msg));
        `replica`: None or (group, rank); `signal`: None or ((region_id, offset), value);
        `ready`: None or ((region_id, offset), value, ...)."""
        step = int(step)
        if not -_INT64 <= step < _INT64:
            return pb.StepRequest(step=step).SerializeToString()  # raises as it always did
        if replica is not None:
            replica = (replica[0], int(replica[1]))
        key = _head_key(groups, (kind, replica, brief, keep, plan_id, one_pass))
        try:
            fields = None if key is None else self._kept.get(key)
        except TypeError:  # unhashable, e.g. a replica group that is no string: the message
            key = fields = None  # names it
        if fields is None:
            req = pb.StepRequest(kind=kind, brief_reply=brief, keep_plan=keep, plan_id=plan_id,
                                 one_pass=one_pass)
            for h in groups:
                h.fill(req.groups.add())
            if replica is not None:
                req.replica.group, req.replica.rank = replica
            fields = req.SerializeToString()
            if key is not None:
                with self._lock:
                    if len(self._kept) >= self.SIZE:
                        self._kept.clear()
                    self._kept[key] = fields
        if step:
            fields = _STEP_KEY + _varint(step % (1 << 64)) + fields
        if signal is not None:
            fields += _signal_field(_DONE_KEY, signal[0], signal[1])
        if ready is not None:
            fields += _signal_field(_READY_KEY, ready[0], ready[1])
        return fields


_DONE_KEY = _field_key(pb.StepRequest, "done_signal", _LEN)
_READY_KEY = _field_key(pb.StepRequest, "ready_signal", _LEN)
# DoneSignal and ReadySignal share their first two fields (region, value).
_SIGNAL_REGION_KEY = _field_key(pb.DoneSignal, "region", _LEN)
_SIGNAL_VALUE_KEY = _field_key(pb.DoneSignal, "value", _VARINT)
assert (_SIGNAL_REGION_KEY, _SIGNAL_VALUE_KEY) == (
    _field_key(pb.ReadySignal, "region", _LEN), _field_key(pb.ReadySignal, "value", _VARINT))


def _signal_field(key, slice_, value):
    """A StepRequest's done_signal or ready_signal field (`key`) with region `slice_`
    ((region_id, offset)) and `value`, byte for byte what the protobuf library writes (a zero
    offset or value and an empty region id left out); through the library for values outside
    their fields' ranges, which it refuses."""
    region_id, offset = slice_
    offset, value = int(offset), int(value)
    if not (0 <= offset < 1 << 64 and 0 <= value < 1 << 32 and type(region_id) is str):
        req = pb.DoneSignal(value=value)
        req.region.region_id, req.region.offset = region_id, offset  # raises as it always did
        body = req.SerializeToString()
        return key + _varint(len(body)) + body
    region = _slice_body(_region_id_field(region_id), offset)
    body = _SIGNAL_REGION_KEY + _varint(len(region)) + region
    if value:
        body += _SIGNAL_VALUE_KEY + _varint(value)
    return key + _varint(len(body)) + body


def _step_plan_key(items):
    """A Step's items as a step-plan key, (layout, pointers) as fp4q.optim's: the layout holds
    each item's name, group, return_dequantized, and its tensors' dtypes, shapes and contiguity;
    the pointers each item's update and dequantized_out addresses (None without a target).
    Addresses are unique over the process's GPUs (unified addressing), so they name the device
    too. None when a tensor is not a CUDA one (those travel inline: nothing to reuse)."""
    layout, pointers = [], []
    append, point = layout.append, pointers.append
    tensor = torch.Tensor
    for it in items:
        u, out = it.update, it.dequantized_out
        if type(u) is not tensor and not isinstance(u, tensor):
            return None
        if not u.is_cuda or u.requires_grad:
            return None
        point(u.data_ptr())
        if out is None:
            append((it.name, it.group, it.return_dequantized, u.dtype, u.shape,
                    u.is_contiguous(), None))
            point(None)
            continue
        if type(out) is not tensor and not isinstance(out, tensor):
            return None
        if not out.is_cuda:
            return None
        append((it.name, it.group, it.return_dequantized, u.dtype, u.shape, u.is_contiguous(),
                (out.dtype, out.shape, out.is_contiguous())))
        point(out.data_ptr())
    return tuple(layout), tuple(pointers)
