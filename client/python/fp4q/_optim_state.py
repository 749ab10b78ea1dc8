"""fp4q.optim's state_dict and load_state_dict: the server-held state, saved and restored.

What state_dict() holds (plain Python, CPU tensors; torch.save / torch.load(weights_only=True)
round-trip it):
  "state", "param_groups": torch's format: param_groups with every hyperparameter and the
    parameters' indices (across groups, in order); "state" the torch-side parameters' states
    (torch's own optimizer's, e.g. "momentum_buffer", "exp_avg", "step").
  "fp4q": {
    "format": 1, "optimizer": "sgd" | "adamw", "step": the optimizer's count of steps (the next
    step() sends step + 1), "options": {rounding, error_feedback, block, scaling, state_dtype,
    seed}, "namespace", "server_epoch", "replica": (group, world_size, rank) or None,
    "weights": {parameter index: {
        "name", "shape", "dtype" ("float32" | "bfloat16"), "last_step", "optimizer_steps",
        "spec": {kind, momentum, amsgrad, state_dtype},
        "codes" (uint8 [rows, cols/2]), "scales" (uint8 E4M3 [rows, cols/16], plain layout),
        "global_amax", "s_enc" (the weight's f32 global record),
        "residual" (float32 [rows, cols], or None without error feedback),
        "moments": {torch state name: a float32 / bfloat16 tensor, or for NVFP4 storage
                    {"codes", "scales", "global_amax", "s_enc"}}}}}
  The weights part is exactly what the server stores (GetWeight(quantized, residual,
  optimizer_state)), bit for bit: no dequantized copy.

What load_state_dict(sd) does (the optimizer must have the same parameters, shapes, dtypes,
kind and fp4q options; a mismatch is refused naming it before anything changes):
  1. For each stored parameter, the server's weight is compared with the saved one (codes,
     scales, global record, residual, moments, last step; AdamW: also its step count). Equal:
     nothing is written (the same job's state, e.g. a worker that restarted while fp4qd kept
     its state).
  2. A weight that differs is re-created from the saved state, exactly, where fp4qd's API can
     write that state (current scaling): (a) error feedback on: CreateWeight, at the saved
     last step (which keys stochastic rounding), from an f32 x with RN(x - DQ(W)) equal to the
     saved residual (x = RN(DQ(W) + r), or the nearest f32 that gives r back where that sum
     rounded); (b) error feedback off, round-to-nearest: CreateWeight from DQ(W) with the
     elements that carry the global amax set back to it; (c) an SGD momentum buffer (f32 or
     bf16, round-to-nearest): the weight is created one step earlier and one Step with lr = 0
     and the buffer as gradient writes the buffer (torch's first momentum step copies the
     gradient) and the weight of the saved step. Before anything is written, every value to be
     created is quantized by a stateless Quantize and compared with the saved codes, scales and
     global record; after, every re-created weight is read back and compared bit for bit
     (INTERNAL naming the weight and the part if it differs). What fp4qd has no request to
     write is refused before anything changes (FAILED_PRECONDITION naming each weight and why):
     AdamW moments, NVFP4-stored moments, delayed scaling's carried amax, stochastic rounding
     without error feedback, or with a momentum buffer. Such a state loads only where the
     server still holds it (step 1).
     A re-created SGD weight's WeightInfo.optimizer_steps counts from the re-creation (0, or 1
     with a momentum buffer): SGD's arithmetic reads it only to tell the first momentum step.
     In a replica group only rank 0 writes; the other ranks wait (up to the group's deadline)
     until the server holds the saved state.
  3. Every stored parameter's data is set to the server's DQ(W); the hyperparameters,
     the torch-side state and the step count are taken from sd (torch's semantics).
"""

import time

import grpc
import torch

from fp4q import options as opts
from fp4q import results
from fp4q._messages import pb
from fp4q.errors import Fp4qError
from fp4q.results import StepItem
from fp4q.tensors import ClientArgumentError

FORMAT = 1
_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16"}


def _options(opt):
    return {"rounding": opt._rounding, "error_feedback": opt._error_feedback,
            "block": opt._block, "scaling": opt._scaling, "state_dtype": opt._state_dtype,
            "seed": opt._seed}


def _spec_dict(spec):
    return {"kind": spec.kind, "momentum": bool(spec.momentum), "amsgrad": bool(spec.amsgrad),
            "state_dtype": spec.state_dtype}


def mismatch(info, s, opt):
    """Why the stored weight `info` (fp4q.v1.WeightInfo) cannot serve parameter `s`, or ""."""
    p = s.param
    o = info.options
    if list(info.shape) != list(p.shape):
        return "its shape is %s, the parameter's %s" % (list(info.shape), list(p.shape))
    want = {
        "block": opts.enum_value("block", opt._block),
        "rounding": opts.enum_value("rounding", opt._rounding),
        "error_feedback": opt._error_feedback,
        "dtype": pb.DType.DTYPE_BF16 if p.dtype == torch.bfloat16 else pb.DType.DTYPE_F32,
        "scaling": opts.enum_value("scaling", opt._scaling),
    }
    have = {
        "block": o.block or pb.BlockShape.BLOCK_SHAPE_1X16,
        "rounding": o.rounding or pb.Rounding.ROUNDING_NEAREST,
        "error_feedback": o.error_feedback,
        "dtype": o.dtype or pb.DType.DTYPE_F32,
        "scaling": o.scaling or pb.Scaling.SCALING_CURRENT,
    }
    for key in want:
        if want[key] != have[key]:
            return "its options.%s is %r, this optimizer's %r" % (key, have[key], want[key])
    if opt._rounding == "stochastic" and o.seed != (opt._seed + s.index) % 2**64:
        return "its options.seed is %d, this optimizer's %d" % (o.seed, opt._seed + s.index)
    spec = opts.OptimizerSpec.from_proto(o.optimizer)
    if spec != s.spec:
        return "it keeps %s state, this optimizer %s" % (_spec_dict(spec), _spec_dict(s.spec))
    return ""


# ---------------------------------------------------------------------- saving


def _read(opt, s):
    """The weight's state as the server stores it, in state_dict's "weights" form."""
    c = opt.client
    stateful = s.spec.kind == "adamw" or s.spec.momentum
    st = c.get_weight(s.name, dequantized=False, quantized=True,
                      residual=opt._error_feedback, optimizer_state=stateful)
    q = st.quantized
    moments = {}
    if st.optimizer_state is not None:
        for name, m in st.optimizer_state.moments.items():
            if isinstance(m, results.QuantizedTensor):
                moments[name] = {"codes": m.codes, "scales": m.scales,
                                 "global_amax": float(m.global_amax), "s_enc": float(m.s_enc)}
            else:
                moments[name] = m
    return {
        "name": s.name, "shape": tuple(int(d) for d in s.param.shape),
        "dtype": _DTYPES[s.dtype], "last_step": int(st.info.last_step),
        "optimizer_steps": int(st.info.optimizer_steps), "spec": _spec_dict(s.spec),
        "codes": q.codes, "scales": q.scales, "global_amax": float(q.global_amax),
        "s_enc": float(q.s_enc), "residual": st.residual, "moments": moments,
    }


def _torch_indices(opt):
    """The inner torch optimizer's parameter indices -> ours."""
    ours = {id(p): i for p, _, i, _ in opt._torch_side}
    out, k = {}, 0
    for g in opt._inner.param_groups:
        for p in g["params"]:
            out[k] = ours[id(p)]
            k += 1
    return out


def state_dict(opt):
    """The optimizer's state (see the module docstring)."""
    index = {}
    for s in opt._stored:
        index[id(s.param)] = s.index
    for p, _, i, _ in opt._torch_side:
        index[id(p)] = i
    groups = []
    for g in opt.param_groups:
        packed = {k: v for k, v in g.items() if k != "params"}
        packed["params"] = [index[id(p)] for p in g["params"]]
        groups.append(packed)
    state = {}
    if opt._inner is not None:
        inner = opt._inner.state_dict()["state"]
        mapping = _torch_indices(opt)
        state = {mapping[k]: v for k, v in inner.items()}
    opt._check_epoch()
    weights = {s.index: _read(opt, s) for s in opt._stored}
    opt._check_reply_epoch(opt.client.last_header, "GetWeight")
    replica = (opt._replica, opt._world_size, opt._rank) if opt._replica else None
    return {"state": state, "param_groups": groups, "fp4q": {
        "format": FORMAT, "optimizer": opt.KIND, "step": opt._fp4q_steps,
        "options": _options(opt), "namespace": opt.client.namespace,
        "server_epoch": opt._epoch, "replica": replica, "weights": weights}}


# ---------------------------------------------------------------------- comparing


def _bits(t):
    t = t.detach().contiguous().cpu()
    return t.view(torch.uint8) if t.dtype != torch.uint8 else t


def _same_tensor(a, b):
    if a is None or b is None:
        return a is None and b is None
    return (tuple(a.shape) == tuple(b.shape) and a.dtype == b.dtype and
            torch.equal(_bits(a), _bits(b)))


def _f32_bits(x):
    return torch.tensor([x], dtype=torch.float32).view(torch.int32).item()


def difference(current, saved, kind):
    """The first part in which two "weights" entries differ, or "" when equal."""
    if current["last_step"] != saved["last_step"]:
        return "last step %d, saved %d" % (current["last_step"], saved["last_step"])
    if kind == "adamw" and current["optimizer_steps"] != saved["optimizer_steps"]:
        return "optimizer steps %d, saved %d" % (current["optimizer_steps"],
                                                 saved["optimizer_steps"])
    if (saved["spec"]["momentum"] and
            min(current["optimizer_steps"], 1) != min(saved["optimizer_steps"], 1)):
        return "momentum buffer written: %s, saved %s" % (current["optimizer_steps"] > 0,
                                                          saved["optimizer_steps"] > 0)
    for part in ("codes", "scales", "residual"):
        if not _same_tensor(current[part], saved[part]):
            return part
    for part in ("global_amax", "s_enc"):
        if _f32_bits(current[part]) != _f32_bits(saved[part]):
            return "%s (%r, saved %r)" % (part, current[part], saved[part])
    if set(current["moments"]) != set(saved["moments"]):
        return "moments %s, saved %s" % (sorted(current["moments"]), sorted(saved["moments"]))
    for name, m in saved["moments"].items():
        cur = current["moments"][name]
        if isinstance(m, dict):
            if not isinstance(cur, dict) or any(
                    not _same_tensor(cur[k], m[k]) for k in ("codes", "scales")) or any(
                    _f32_bits(cur[k]) != _f32_bits(m[k]) for k in ("global_amax", "s_enc")):
                return "moment %s" % name
        elif isinstance(cur, dict) or not _same_tensor(cur, m):
            return "moment %s" % name
    return ""


def _current(opt, s):
    try:
        return _read(opt, s)
    except Fp4qError as e:
        if e.code == grpc.StatusCode.NOT_FOUND and e.message.startswith("name: no weight"):
            return None
        raise


# ---------------------------------------------------------------------- loading


def _check(opt, sd):
    """Refuses a state_dict that does not fit this optimizer (nothing changed yet)."""
    if not isinstance(sd, dict) or not {"state", "param_groups", "fp4q"} <= set(sd):
        raise ClientArgumentError("state_dict: not an fp4q.optim state_dict (needs 'state', "
                                  "'param_groups' and 'fp4q')")
    f = sd["fp4q"]
    if f.get("format") != FORMAT:
        raise ClientArgumentError("state_dict['fp4q']['format']: %r, this client reads %d"
                                  % (f.get("format"), FORMAT))
    if f.get("optimizer") != opt.KIND:
        raise ClientArgumentError("state_dict['fp4q']['optimizer']: %r, this optimizer is %r"
                                  % (f.get("optimizer"), opt.KIND))
    mine = _options(opt)
    for k, v in mine.items():
        if f["options"].get(k) != v:
            raise ClientArgumentError("state_dict['fp4q']['options']['%s']: %r, this optimizer "
                                      "has %r" % (k, f["options"].get(k), v))
    groups = sd["param_groups"]
    if len(groups) != len(opt.param_groups):
        raise ClientArgumentError("state_dict['param_groups']: %d groups, this optimizer has %d"
                                  % (len(groups), len(opt.param_groups)))
    for gi, (g, ours) in enumerate(zip(groups, opt.param_groups)):
        if len(g["params"]) != len(ours["params"]):
            raise ClientArgumentError(
                "state_dict['param_groups'][%d]['params']: %d parameters, this optimizer's "
                "group has %d" % (gi, len(g["params"]), len(ours["params"])))
    weights = f["weights"]
    stored = {s.index for s in opt._stored}
    if set(weights) != stored:
        raise ClientArgumentError(
            "state_dict['fp4q']['weights']: parameters %s are stored, this optimizer stores %s"
            % (sorted(weights), sorted(stored)))
    for s in opt._stored:
        w = weights[s.index]
        field = "state_dict['fp4q']['weights'][%d]" % s.index
        if tuple(w["shape"]) != tuple(s.param.shape) or w["dtype"] != _DTYPES[s.dtype]:
            raise ClientArgumentError("%s: %s %s, parameter %d is %s %s" % (
                field, w["dtype"], list(w["shape"]), s.index, _DTYPES[s.dtype],
                list(s.param.shape)))
        if w["spec"] != _spec_dict(s.spec):
            raise ClientArgumentError("%s['spec']: %s, this optimizer's weight keeps %s" % (
                field, w["spec"], _spec_dict(s.spec)))


def _why_not_restorable(opt, w):
    """Why no sequence of fp4qd requests writes the saved state `w` exactly, or ""."""
    spec = w["spec"]
    momentum = spec["momentum"] and w["optimizer_steps"] > 0
    if spec["kind"] == "adamw":
        return "fp4qd has no request that writes AdamW moments"
    if momentum and spec["state_dtype"] == "nvfp4":
        return "fp4qd has no request that writes an NVFP4 momentum buffer exactly"
    if opt._scaling == "delayed":
        return ("under delayed scaling the weight was quantized with the previous step's amax, "
                "which no request can set")
    if not opt._error_feedback and opt._rounding == "stochastic":
        return ("stochastic rounding without error feedback: the value the codes were rounded "
                "from is not kept")
    if momentum and opt._rounding == "stochastic":
        return ("stochastic rounding with a momentum buffer: writing the buffer takes one more "
                "step, which rounds the weight again under another key")
    if momentum and w["last_step"] < 1:
        return "a momentum buffer at step 0"
    return ""


def _plan(opt, s, w):
    """(x, why): the f32 value CreateWeight must quantize to give back the saved weight, checked
    with a stateless Quantize of it (and, with error feedback, that RN(x - DQ(W)) is the saved
    residual) before anything is written; `why` says what would not come back ("" = all)."""
    why = _why_not_restorable(opt, w)
    if why:
        return None, why
    x, dq = _initial(opt, w)
    momentum = w["spec"]["momentum"] and w["optimizer_steps"] > 0
    if opt._error_feedback:
        if not torch.equal(_bits(x - dq), _bits(w["residual"])):
            return None, "no f32 value gives back its residual"
        if momentum and not torch.equal(_bits(dq + w["residual"]), _bits(x)):
            return None, ("its residual is not exactly the difference of two f32 values the "
                          "extra step can reproduce")
    q = opt.client.quantize(x, block=opt._block, rounding=opt._rounding,
                            seed=(opt._seed + s.index) % 2**64, step=int(w["last_step"])).rowwise
    if not (_same_tensor(q.codes, w["codes"]) and _same_tensor(q.scales, w["scales"]) and
            _f32_bits(q.global_amax) == _f32_bits(w["global_amax"]) and
            _f32_bits(q.s_enc) == _f32_bits(w["s_enc"])):
        return None, "no value quantizes back to its codes and scales"
    return x, ""


def _initial(opt, w):
    """(x, DQ(W)): the f32 value CreateWeight must quantize to give back the saved weight."""
    rows, cols = w["shape"]
    q = results.QuantizedTensor(codes=w["codes"], scales=w["scales"], rows=rows, cols=cols,
                                global_amax=w["global_amax"], s_enc=w["s_enc"],
                                block=opt._block)
    dq = opt.client.dequantize(q, torch.float32)
    if opt._error_feedback:
        return _with_residual(dq, w["residual"]), dq
    # Round-to-nearest without a residual: every element whose code is +-6 in a block whose
    # scale is 448 (E4M3's largest, the scale of the block holding the global amax) is set to
    # +-amax, so that the amax CreateWeight computes is the saved one.
    codes = w["codes"].to(torch.int16)
    nibbles = torch.stack((codes & 0xF, codes >> 4), dim=-1).reshape(rows, cols)
    scale = w["scales"].repeat_interleave(16, dim=1)
    top = ((nibbles & 7) == 7) & (scale == 0x7E)
    sign = torch.where((nibbles & 8) != 0, -1.0, 1.0)
    amax = torch.tensor(w["global_amax"], dtype=torch.float32)
    return torch.where(top, sign * amax, dq), dq


def _with_residual(dq, r):
    """An f32 x with RN(x - DQ(W)) == r for every element: x = RN(DQ(W) + r), or where that
    subtraction would not give r back (the saved step's v - DQ(W) was rounded), the nearest
    f32 on either side that does. CreateWeight then keeps exactly r as the residual."""
    x = dq + r
    bad = (x - dq) != r
    for k in range(1, 9):
        if not bool(bad.any()):
            break
        for direction in (float("inf"), float("-inf")):
            cand = x
            for _ in range(k):
                cand = torch.nextafter(cand, torch.full_like(cand, direction))
            fix = bad & ((cand - dq) == r)
            x = torch.where(fix, cand, x)
            bad = bad & ~fix
    return x


def _restore(opt, s, w, x):
    c = opt.client
    try:
        c.delete_weight(s.name)
    except Fp4qError as e:
        if e.code != grpc.StatusCode.NOT_FOUND:
            raise
    momentum = w["spec"]["momentum"] and w["optimizer_steps"] > 0
    last = int(w["last_step"])
    c.create_weight(s.name, x, block=opt._block, rounding=opt._rounding,
                    seed=(opt._seed + s.index) % 2**64, error_feedback=opt._error_feedback,
                    dtype=s.dtype, step=last - 1 if momentum else last, scaling=opt._scaling,
                    optimizer=s.spec)
    if momentum:
        # torch's (and fp4qd's) first momentum step copies the gradient into the buffer; with
        # lr 0 the weight's value stays that of the saved step and is quantized with its key.
        buf = w["moments"]["momentum_buffer"]
        c.step(last, [StepItem(name=s.name, update=buf)],
               [opts.SgdHyperparameters(lr=0.0, momentum=1.0)], resend=False)
    got = _read(opt, s)
    diff = difference(got, w, opt.KIND)
    if diff:
        raise Fp4qError(grpc.StatusCode.INTERNAL, (
            "load_state_dict: weight '%s' re-created from the state_dict differs from it in %s "
            "(the server now holds the re-created weight)") % (s.name, diff))


def _wait_for(opt, pending, weights):
    """Replica ranks but 0: until the server holds the saved state of every weight."""
    deadline = time.monotonic() + (opt._deadline_ms or 30000) / 1000.0
    while pending:
        pending = [s for s in pending if difference(_current(opt, s) or _MISSING,
                                                    weights[s.index], opt.KIND)]
        if not pending:
            return
        if time.monotonic() > deadline:
            raise Fp4qError(grpc.StatusCode.DEADLINE_EXCEEDED, (
                "load_state_dict: rank %d of replica group '%s' waited %d ms for rank 0 to "
                "restore weights %s" % (opt._rank, opt._replica, opt._deadline_ms or 30000,
                                        [s.name for s in pending[:5]])))
        time.sleep(0.05)


_MISSING = {"last_step": -1, "optimizer_steps": -1, "spec": {"momentum": False}}


def load_state_dict(opt, sd):
    """Loads a state_dict (see the module docstring)."""
    _check(opt, sd)
    opt._check_epoch()
    f = sd["fp4q"]
    weights = f["weights"]
    pending = []
    for s in opt._stored:
        cur = _current(opt, s)
        if cur is None or difference(cur, weights[s.index], opt.KIND):
            pending.append(s)
    writer = opt._replica is None or opt._rank == 0
    plans = {s.index: _plan(opt, s, weights[s.index]) if writer else
             (None, _why_not_restorable(opt, weights[s.index])) for s in pending}
    refused = [(s, plans[s.index][1]) for s in pending if plans[s.index][1]]
    if refused:
        raise Fp4qError(grpc.StatusCode.FAILED_PRECONDITION, (
            "load_state_dict: %d weights differ from the server's and cannot be re-created "
            "exactly: %s; nothing was changed (such a state loads only where the server still "
            "holds it)") % (len(refused), "; ".join(
                "'%s': %s" % (s.name, why) for s, why in refused[:5])))
    if not writer:
        _wait_for(opt, pending, weights)
    else:
        for s in pending:
            _restore(opt, s, weights[s.index], plans[s.index][0])
    for s in opt._stored:
        opt.client.get_weight(s.name, out=s.param.data)
    opt._check_reply_epoch(opt.client.last_header, "GetWeight")
    for g, saved in zip(opt.param_groups, sd["param_groups"]):
        for k, v in saved.items():
            if k != "params":
                g[k] = v
    if opt._inner is not None:
        mapping = {ours: k for k, ours in _torch_indices(opt).items()}
        inner = opt._inner.state_dict()
        inner["state"] = {mapping[i]: v for i, v in sd["state"].items() if i in mapping}
        opt._inner.load_state_dict(inner)
    opt._fp4q_steps = int(f["step"])
