"""Building requests from torch tensors and delivering the replies' tensors.

Contract
- call(rpc, build) runs one RPC whose request holds tensors: build(transfer) -> (request,
  planned) fills the request through a fresh fp4q._regions.Transfer (inputs inline or by IPC,
  outputs planned) and returns with it whatever the reply's decoding needs (`planned`); call
  sends it (the client's send: fp4q._transport), waits for the server's writes, and returns
  (reply, planned). Rebuild rule: a request that named regions and was answered NOT_FOUND while
  its session turned out lost (Session.lost) is built again, in a new session with new
  regions, and sent once more; every other error propagates. build may run twice: it must not
  change anything outside the request it returns.
- The building blocks a build uses: transfer.input(msg.field, tensor, "field") for an input,
  plan_output(...) for an output (the caller's `out=` written in place by IPC when possible, a
  tensor allocated here by IPC, or None: inline), fill_operand(...) for a QuantizedOperand (a
  QuantizedTensor or a weight name), and after the reply deliver(...) (the planned tensor, or
  the inline bytes as a tensor on the wanted device, copied into `out` when given) and
  quantized_from_reply(...) (a QuantizedTensor from a fp4q.v1.QuantizedTensor).
- Requests holds the RPCs with tensors (quantize, dequantize, qdq, matmul, create_weight,
  update_weight, step, get_weight); fp4q.Client's methods of those names delegate here.
- call(..., resend=False) sends the request once in the session it was built for: no resend
  in a new session and no rebuild (fp4q.optim's steps, which must notice a lost session).
- step() keeps the items of its last few requests whose every tensor went as a slice of its own
  allocation (fp4q._step_plans.StepPlans), as their encoding: the next step with the same
  tensors at the same addresses reuses it, after its head (the fields before the items, kept
  per set of hyperparameter values by fp4q._step_plans.StepHeads), with one driver call per
  allocation instead of a resolution per tensor (stat "step_plans_reused"); when only the
  tensors' offsets within the last plan's allocations moved (new gradient tensors each step)
  the kept items are re-sliced there ("step_plans_resliced"); it builds afresh when an
  allocation, the region cache, the session or the server changed. step_keyed() is
  fp4q.optim's: its own key, the items built only when no plan matches, and a brief reply (no
  per-item results) when every output went by IPC. step_named() (and step_begin() in the same
  case) is its short path once the server holds the key's plan: the head alone, its fields
  kept for the same hyperparameter objects, which fp4q.optim never changes in place.
- Outputs come back on the device of the request's main input (`device=` where there is none);
  before a request that uses regions is sent, the current CUDA stream of each device involved
  is synchronized; when a call returns, the server's writes are complete.
- Errors: refused arguments raise fp4q.ClientArgumentError before anything is sent; a reply
  that does not match what was asked is INTERNAL; the server's errors are fp4q.Fp4qError.
- Thread safety: any number of threads; last_qdq_amax is per thread.

A new RPC with tensors is one method here (or in the module that offers it, e.g. fp4q.optim):
a build(tr) with the blocks above, call(rpc, build), and the reply decoded with deliver; then a
public method that calls it. Its stub comes from the descriptor (fp4q._transport), sessions and
retries are the call path's; it goes over the fast socket when its request and reply fit there
(fp4q._fast_frames.REPLY_BOUNDS holds each method's reply bound; else it goes by gRPC).
"""

import operator
import threading

import grpc
import torch

from fp4q import _fast_frames
from fp4q import options as opts
from fp4q import results
from fp4q import tensors
from fp4q._messages import Serialized, pb
from fp4q._step_plans import (_DONE_KEY, _INT64, _READY_KEY, _STEP_KEY, StepHeads, StepPlans,
                              _server_may_keep, _signal_field, _step_plan_key, _StepPlan,
                              _varint)
from fp4q.errors import Fp4qError


class Requests:
    """`send(rpc, request, resend)` is the client's call path; `session_lost()` is
    Session.lost; `regions` the client's fp4q._regions.Regions."""

    def __init__(self, send, session_lost, regions, begin=None):
        self._send = send
        self._begin = begin  # Transport.begin: a request sent now, its reply waited for later
        self._session_lost = session_lost
        self._regions = regions
        self._tls = threading.local()
        self._step_plans = StepPlans()
        self._step_heads = StepHeads()
        self._named = None  # _named_head's: (plan id, one_pass, groups, their fields)

    def call(self, rpc, build, resend=True, order=None):
        """Builds (request, planned) with a Transfer, sends it, returns (reply, planned).
        `order`: as _begin_call's."""
        for attempt in (0, 1):
            transfer = self._regions.transfer()
            try:
                request, planned = build(transfer)
                if order is None:
                    transfer.before_send()
                else:
                    order(transfer)
                try:
                    reply = self._send(rpc, request, resend=resend and not transfer.uses_regions)
                except Fp4qError as e:
                    if (resend and attempt == 0 and transfer.uses_regions and
                            e.code == grpc.StatusCode.NOT_FOUND and self._session_lost()):
                        continue
                    raise
                transfer.after_reply()
                return reply, planned
            finally:
                transfer.release()
        raise AssertionError("unreachable")

    @property
    def last_qdq_amax(self):
        return getattr(self._tls, "qdq_amax", None)

    # ------------------------------------------------------------------ numerics

    def quantize(self, x, o):
        device = x.device if isinstance(x, torch.Tensor) else torch.device("cpu")

        def build(tr):
            req = pb.QuantizeRequest()
            tr.input(req.input, x, "input")
            o.fill(req.options)
            return req, plan_quantize_outputs(tr, req, x, o)

        reply, planned = self.call("Quantize", build)
        out = {}
        for which in ("rowwise", "columnwise"):
            out[which] = (quantized_from_reply(getattr(reply, which), planned, which, device)
                          if reply.HasField(which) else None)
        return results.QuantizeResult(**out)

    def dequantize(self, q, out_dtype, out, device):
        def build(tr):
            req = pb.DequantizeRequest(out_dtype=tensors.torch_dtype(out_dtype))
            shape, dev = fill_operand(req.input, q, tr, "input", device)
            if out is not None:
                shape, dev = tuple(out.shape), out.device
            planned = plan_output(tr, req.out, shape, out_dtype or torch.float32, dev, out)
            return req, (planned, dev)

        reply, (planned, dev) = self.call("Dequantize", build)
        return deliver(reply.output, planned, dev, out, "output")

    def qdq(self, x, o, out_dtype, out):
        def build(tr):
            req = pb.QdqRequest(out_dtype=tensors.torch_dtype(out_dtype))
            tr.input(req.input, x, "input")
            o.fill(req.options)
            dtype = out_dtype or x.dtype
            planned = plan_output(tr, req.out, tuple(x.shape), dtype, x.device, out)
            return req, planned

        reply, planned = self.call("Qdq", build)
        self._tls.qdq_amax = reply.global_amax
        return deliver(reply.output, planned, x.device, out, "output")

    def matmul(self, a, b, out_dtype, out, device):
        def build(tr):
            req = pb.MatmulRequest(out_dtype=tensors.torch_dtype(out_dtype))
            sa, da = fill_operand(req.a, a, tr, "a", device, dense=True)
            sb, _ = fill_operand(req.b, b, tr, "b", device, dense=True)
            shape = (sa[0], sb[0]) if sa and sb else None
            dev = da
            if out is not None:
                shape, dev = tuple(out.shape), out.device
            planned = plan_output(tr, req.out, shape, out_dtype or torch.float32, dev, out)
            return req, (planned, dev)

        reply, (planned, dev) = self.call("Matmul", build)
        return deliver(reply.output, planned, dev, out, "output")

    # ------------------------------------------------------------------ weights

    def create_weight(self, name, initial, block, rounding, seed, error_feedback, dtype, step,
                      device_uuid, scaling=None, optimizer=None):
        if optimizer is not None and not isinstance(optimizer, opts.OptimizerSpec):
            raise tensors.ClientArgumentError("optimizer: expected fp4q.OptimizerSpec or None, "
                                              "got %s" % type(optimizer).__name__)

        def build(tr):
            req = pb.CreateWeightRequest(name=name, step=int(step), device_uuid=device_uuid)
            tr.input(req.initial, initial, "initial")
            w = req.options
            w.block = opts.enum_value("block", block)
            w.rounding = opts.enum_value("rounding", rounding)
            opts._set_uint(w, "seed", seed)
            w.error_feedback = bool(error_feedback)
            w.dtype = tensors.torch_dtype(dtype, "dtype")
            w.scaling = opts.enum_value("scaling", scaling)
            if optimizer is not None:
                optimizer.fill(w.optimizer)
            return req, None

        return self.call("CreateWeight", build)[0].weight

    def step(self, step, items, groups, kind, replica, resend, brief_reply=False, one_pass=False):
        items = list(items)
        for i, it in enumerate(items):
            if not isinstance(it, results.StepItem):
                raise tensors.ClientArgumentError("items[%d]: expected fp4q.StepItem, got %s"
                                                  % (i, type(it).__name__))
        if not isinstance(brief_reply, bool):
            raise tensors.ClientArgumentError("brief_reply: %r is not a bool" % (brief_reply,))
        if not isinstance(one_pass, bool):
            raise tensors.ClientArgumentError("one_pass: %r is not a bool" % (one_pass,))
        return self._step(step, _step_plan_key(items), lambda: items, groups, kind, replica,
                          resend, brief_reply, one_pass=one_pass)

    def step_keyed(self, step, key, make_items, groups, replica, ready=None, one_pass=False,
                   order=None):
        """fp4q.optim's step, with its own key of its items in _step_plan_key's form (layout,
        pointers): the caller vouches that an equal layout means the same items apart from
        where their tensors are (names, groups, dtypes, shapes, contiguity), and `pointers`
        lists each item's update and dequantized_out addresses in item order, so that
        make_items() runs only when no plan holds. Sent once (resend=False); the reply is brief
        when no output travels inline. `ready`: as step_begin's; `one_pass`: as step()'s;
        `order`: without `ready`, what orders the step after the updates' streams in place of
        the host's wait for each (Transfer.before_send), as _begin_call's."""
        return self._step(step, key, make_items, groups, None, replica, False, True,
                          ready=ready, one_pass=one_pass, order=order)

    def step_named(self, step, key, groups, one_pass=False, order=None):
        """step_keyed()'s call (no replica, no ready signal) in the case a trainer's steps
        settle into, by a shorter path: the server holds the plan of `key` (StepRequest.plan_id)
        and the plan's allocations are the ones it was made of, so the request is its head
        alone and the reply brief. `groups`: fp4q.optim's hyperparameter objects, as
        step_keyed's; `order`: as step_keyed's. Returns the StepResult; None when that case does
        not hold, or when the server answers that it no longer holds the plan (the plan ids are
        then forgotten): nothing was applied, and step_keyed() is the call to make."""
        memo = self._server_plan(key)
        if memo is None:
            return None
        build = self._named_build(memo, self._named_head(step, groups, memo.server_id, one_pass))
        try:
            return self._step_decode(*self.call("Step", build, resend=False, order=order))
        except Fp4qError as e:
            if _plan_unknown(e) and self._forget_server_plans():
                return None
            raise

    def _step_named_begin(self, step, key, groups, signal, ready, one_pass):
        """step_begin()'s call (no replica) by step_named()'s path: its (pending, result), or
        None when the server holds no plan of `key` valid now (nothing sent). A server that no
        longer holds the plan refuses the step in the PendingStep's wait() (see
        PendingStep)."""
        memo = self._server_plan(key)
        if memo is None:
            return None
        body = self._named_head(step, groups, memo.server_id, one_pass)
        body += _signal_field(_DONE_KEY, signal[0], signal[1])
        if ready is not None:
            body += _signal_field(_READY_KEY, ready[0], ready[1])
        return self._begun_step(self._named_build(memo, body), ready)

    def _server_plan(self, key):
        """The kept plan of `key` when the server holds it (its server_id) and its allocations
        are the ones it was made of; else None."""
        memo = self._step_plans.get(key)
        if memo is None or not memo.server_id or not self._regions.plan_valid(memo.plan):
            return None
        return memo

    def _named_build(self, memo, body):
        """A build (see call()) of the Step `body` naming `memo`'s plan: its Transfer stands for
        the one the plan was made from (the step counted as one that named the server's
        plan), and the reply is brief."""
        def build(transfer):
            regions = self._regions
            transfer.adopt(memo.plan)
            regions.count("step_plans_reused")
            regions.count("step_plans_on_server")
            regions.count("step_plans_named")
            return Serialized(body, 0), (None, None, True, memo)
        return build

    def _begun_step(self, build, ready):
        """step_begin()'s (pending, result) for a Step built by `build`: begun, or completed
        now when an output is copied after the reply (see _begin_call)."""
        pending, done = self._begin_call("Step", build, lambda built: built[2],
                                         None if ready is None else ready[2])
        if pending is not None:
            return PendingStep(pending, self._step_decode, self._forget_server_plans), None
        return None, self._step_decode(*done)

    def _step_decode(self, reply, built):
        """A Step's StepResult from its reply and what its build returned (items, planned,
        brief, memo: the kept plan the server was asked to keep or named, else None)."""
        items, planned, brief, memo = built
        if memo is not None and reply.plan_id:
            memo.server_id = reply.plan_id  # kept (keep_plan), or named (plan_id) again
        return self._step_result(reply, items, planned, brief)

    def _named_head(self, step, groups, plan_id, one_pass):
        """step_named()'s request: StepHeads.encode's bytes for a brief step naming `plan_id`.
        The fields but the step number are kept for the last groups: step_named's callers make
        a new hyperparameter object whenever a value changes and never change one in place, so
        the same objects (identity) mean the same values."""
        kept = self._named
        if not (kept is not None and kept[0] == plan_id and kept[1] == one_pass and
                len(kept[2]) == len(groups) and all(map(operator.is_, kept[2], groups))):
            fields = self._step_heads.encode(0, groups, 0, None, True, False, plan_id, one_pass)
            kept = self._named = (plan_id, one_pass, tuple(groups), fields)
        if 0 < step < _INT64:
            return _STEP_KEY + _varint(step) + kept[3]
        # Step 0 (no field), or one outside int64 (refused): as encode writes or refuses it.
        return self._step_heads.encode(step, groups, 0, None, True, False, plan_id, one_pass)

    def step_begin(self, step, key, make_items, groups, replica, signal, ready=None,
                   one_pass=False):
        """step_keyed() with a done signal (`signal`: ((region_id, offset), value), see
        fp4q.v1.DoneSignal), sent without waiting for the reply when every tensor of the step
        goes in place by IPC. Returns (pending, result): a PendingStep to wait() for later and
        None, or None and the StepResult when the call had to complete now (an output that is
        copied after the reply, or no begin()). `ready`: None, or ((region_id, offset), value,
        order) for a step sent with a ready signal (fp4q.v1.ReadySignal): order(transfer) then
        stands for the host's wait for the updates' streams, and must see to it that the
        signal gets the value once they are complete. `groups`: as step_named's (objects never
        changed in place)."""
        if replica is None and key is not None:
            named = self._step_named_begin(step, key, groups, signal, ready, one_pass)
            if named is not None:
                return named
        return self._step(step, key, make_items, groups, None, replica, False, True,
                          signal=signal, ready=ready, one_pass=one_pass)

    def _step(self, step, key, make_items, groups, kind, replica, resend, brief_reply,
              signal=None, ready=None, one_pass=False, order=None):
        """The Step call of step(), step_keyed() and step_begin(). `key`: (layout, pointers) or
        None. A plan of the key is reused as it is; else, when the pointers all fall in the
        allocations of the layout's last plan (gradients made anew each step land at new
        offsets of the allocator's same blocks), the layout's items are re-sliced there; else
        make_items() builds them."""
        layout, pointers = key if key is not None else (None, None)
        groups = list(groups)
        for g, h in enumerate(groups):
            if not isinstance(h, (opts.SgdHyperparameters, opts.AdamWHyperparameters)):
                raise tensors.ClientArgumentError(
                    "groups[%d]: expected fp4q.SgdHyperparameters or fp4q.AdamWHyperparameters, "
                    "got %s" % (g, type(h).__name__))
        kind_value = opts.enum_value("kind", kind)

        def head(brief, keep=False, plan_id=0):
            # The fields before the items; a message's encodings concatenate (the items follow).
            return self._step_heads.encode(step, groups, kind_value, replica, brief, keep,
                                           plan_id, one_pass, signal, ready)

        def build(tr):
            plans = self._step_plans
            memo = plans.get(key) if key is not None else None
            valid = memo is not None and self._regions.plan_valid(memo.plan)
            if not valid and layout is not None:
                memo = plans.resliced(layout, pointers, key, self._regions.plan_valid)
                valid = memo is not None
                if valid:
                    self._regions.count("step_plans_resliced")
            if valid:
                tr.adopt(memo.plan)
                self._regions.count("step_plans_reused")
                brief = brief_reply and memo.brief_ok
                items = planned = None
                if not brief:
                    items = make_items()
                    planned = [it.dequantized_out for it in items]
                elif memo.server_id:
                    # The server holds these items: the step names them.
                    self._regions.count("step_plans_on_server")
                    return (Serialized(head(True, plan_id=memo.server_id), 0),
                            (items, planned, brief, memo))
                keep = brief and memo.server_ok
                return (Serialized(head(brief, keep) + memo.body,
                                   0 if brief else memo.reply_bound),
                        (items, planned, brief, memo if keep else None))
            items = make_items()
            body = pb.StepRequest()
            planned = []
            for i, it in enumerate(items):
                m = body.items.add(name=it.name, group=int(it.group),
                                   return_dequantized=bool(it.return_dequantized))
                tr.input(m.update, it.update, "items[%d].update" % i)
                out = it.dequantized_out
                plan = None
                if out is not None:
                    plan = plan_output(tr, m.dequantized_out, tuple(out.shape), out.dtype,
                                       out.device, out)
                    if plan is None:
                        m.return_dequantized = True  # inline, then copied into `out`
                planned.append(plan)
            memo = _StepPlan(tr.plan(), body.SerializeToString(),
                             _fast_frames.reply_bound("Step", body),
                             not any(m.return_dequantized for m in body.items))
            memo.server_ok = _server_may_keep(memo, body)
            if key is not None:
                plans.put(key, memo)
                if layout is not None:
                    plans.put_template(layout, memo, body)
            brief = brief_reply and memo.brief_ok
            keep = brief and memo.server_ok and key is not None
            return (Serialized(head(brief, keep) + memo.body, 0 if brief else memo.reply_bound),
                    (items, planned, brief, memo if keep else None))

        if signal is not None:
            return self._begun_step(build, ready)
        for attempt in (0, 1):
            try:
                return self._step_decode(*self.call("Step", build, resend=resend,
                                                    order=order if ready is None else ready[2]))
            except Fp4qError as e:
                # The server dropped the plan this step named (nothing changed): forget it and
                # send the items again, once.
                if attempt or not _plan_unknown(e) or not self._forget_server_plans():
                    raise
        raise AssertionError("unreachable")

    def _forget_server_plans(self):
        """Forgets every plan id the server was said to hold; True when there was one."""
        return self._step_plans.forget_server_ids() > 0

    def _begin_call(self, rpc, build, in_place, order=None):
        """call() for a request whose reply may be waited for later: (Pending, None) when it
        was sent by begin() and the server writes every output in place (in_place(planned),
        and nothing is copied after the reply), else (None, (reply, planned)) after a call()
        that completed now. Sent once, in the session it was built for. `order(transfer)`, when
        given, replaces the host's wait for the tensors' streams before the send (the request
        carries a ready signal)."""
        if self._begin is None:
            return None, self.call(rpc, build, resend=False, order=order)
        transfer = self._regions.transfer()
        try:
            request, planned = build(transfer)
            if not (in_place(planned) and transfer.writes_in_place()):
                transfer.release()
                return None, self.call(rpc, build, resend=False, order=order)
            if order is None:
                transfer.before_send()
            else:
                order(transfer)
            sent = self._begin(rpc, request)
        except BaseException:
            transfer.release()
            raise
        return _PendingCall(sent, transfer, planned), None

    def _step_result(self, reply, items, planned, brief):
        if brief:
            if reply.items:
                raise Fp4qError(grpc.StatusCode.INTERNAL, "reply items: %d results for a brief "
                                "reply" % len(reply.items), "Step")
            return results.StepResult(items=[], world_size=reply.world_size, header=reply.header,
                                      applied_items=reply.applied_items,
                                      one_pass=reply.one_pass,
                                      one_pass_outcome=reply.one_pass_outcome)
        if len(reply.items) != len(items):
            raise Fp4qError(grpc.StatusCode.INTERNAL, "reply items: %d results for %d items"
                            % (len(reply.items), len(items)), "Step")
        out = []
        append = out.append
        torch_dtype = tensors.torch_dtype
        result = results.StepItemResult
        for i, (it, r, plan) in enumerate(zip(items, reply.items, planned)):
            deq = None
            if r.HasField("dequantized"):
                d = r.dequantized
                inline = d.inline_data
                if inline or plan is not None:
                    target = it.dequantized_out
                    if target is not None and d.dtype != torch_dtype(target.dtype):
                        raise tensors.ClientArgumentError(
                            "items[%d].dequantized_out: a %s tensor, but weight '%s' is %s (the "
                            "target must have the weight's dtype)"
                            % (i, target.dtype, it.name, pb.DType.Name(d.dtype)))
                    if not inline and plan is target:
                        deq = target  # the server wrote it in place
                    else:
                        dev = target.device if target is not None else it.update.device
                        deq = deliver(d, plan, dev, target, "items[%d].dequantized" % i)
            append(result(r.name, r.applied, r.last_step, r.global_amax, deq))
        return results.StepResult(items=out, world_size=reply.world_size, header=reply.header,
                                  applied_items=reply.applied_items, one_pass=reply.one_pass,
                                  one_pass_outcome=reply.one_pass_outcome)

    def update_weight(self, name, step, update, lr, kind, return_dequantized, dequantized_out):
        def build(tr):
            req = pb.UpdateWeightRequest(name=name, step=int(step), lr=float(lr),
                                         kind=opts.enum_value("kind", kind),
                                         return_dequantized=bool(return_dequantized))
            tr.input(req.update, update, "update")
            planned = None
            if dequantized_out is not None:
                planned = plan_output(tr, req.dequantized_out, tuple(dequantized_out.shape),
                                      dequantized_out.dtype, dequantized_out.device,
                                      dequantized_out)
            return req, planned

        reply, planned = self.call("UpdateWeight", build)
        deq = None
        if reply.HasField("dequantized") and (reply.dequantized.inline_data or planned is not None):
            dev = dequantized_out.device if dequantized_out is not None else update.device
            deq = deliver(reply.dequantized, planned, dev, dequantized_out, "dequantized")
        return results.UpdateResult(applied=reply.applied, last_step=reply.last_step,
                                    dequantized=deq, global_amax=reply.global_amax)

    def get_weight(self, name, dequantized, out_dtype, quantized, residual, device,
                   optimizer_state=False, out=None):
        if out is not None:
            dequantized = True
            device = out.device
            if out_dtype is None:
                out_dtype = out.dtype

        def build(tr):
            req = pb.GetWeightRequest(name=name, dequantized=bool(dequantized),
                                      out_dtype=tensors.torch_dtype(out_dtype),
                                      quantized=bool(quantized), residual=bool(residual),
                                      optimizer_state=bool(optimizer_state))
            planned = None
            if out is not None:
                planned = plan_output(tr, req.out, tuple(out.shape), out.dtype, out.device, out)
            return req, planned

        reply, planned = self.call("GetWeight", build)
        deq = res = qt = state = None
        if dequantized and reply.HasField("dequantized"):
            deq = deliver(reply.dequantized, planned, device, out, "dequantized")
        if residual and reply.HasField("residual"):
            res = deliver(reply.residual, None, device, None, "residual")
        if quantized and reply.HasField("quantized"):
            qt = quantized_from_reply(reply.quantized, {}, "quantized", torch.device(device))
        if optimizer_state and reply.HasField("optimizer_state"):
            st = reply.optimizer_state
            moments = {}
            for m in st.moments:
                if m.dtype == pb.StateDType.STATE_DTYPE_NVFP4:
                    moments[m.name] = quantized_from_reply(m.quantized, {}, "moments." + m.name,
                                                           torch.device(device))
                else:
                    moments[m.name] = deliver(m.dense, None, device, None, "moments." + m.name)
            state = results.OptimizerState(spec=opts.OptimizerSpec.from_proto(st.spec),
                                           steps=int(st.steps), moments=moments)
        return results.WeightState(info=reply.weight, dequantized=deq, quantized=qt, residual=res,
                                   optimizer_state=state)

    def reset_optimizer(self, name, optimizer):
        if not isinstance(optimizer, opts.OptimizerSpec):
            raise tensors.ClientArgumentError("optimizer: expected fp4q.OptimizerSpec, got %s"
                                              % type(optimizer).__name__)
        req = pb.ResetOptimizerRequest(name=name)
        optimizer.fill(req.optimizer)
        return self._send("ResetOptimizer", req).weight


# ---------------------------------------------------------------------- building blocks

def plan_quantize_outputs(tr, req, x, o):
    """Quantize's outputs by IPC for a 2-D CUDA x: {"rowwise_codes": tensor, ...}, each also
    pointed at by the request's OutputTarget of that name; {} for inline outputs."""
    planned = {}
    if x.device.type != "cuda" or x.dim() != 2:
        return planned
    for which, rows, cols in results.quantize_sides(req.options.outputs, x.shape[0], x.shape[1]):
        scale_shape = results.scale_shape(o.format, o.block, o.scale_layout, rows, cols)
        if scale_shape is None:
            continue  # the server will name the bad shape
        planned[which + "_codes"] = tr.output(getattr(req, which + "_codes"),
                                              (rows, cols // 2), torch.uint8, x.device)
        planned[which + "_scales"] = tr.output(getattr(req, which + "_scales"),
                                               scale_shape, torch.uint8, x.device)
    return planned


def quantized_from_reply(q, planned, which, device):
    """A QuantizedTensor from a reply's fp4q.v1.QuantizedTensor: the planned tensors where the
    server wrote them by IPC, else its inline bytes as tensors on `device`."""
    q_shape = q.shape
    if len(q_shape) != 2:
        raise Fp4qError(grpc.StatusCode.INTERNAL,
                        "reply %s.shape: %s is not [rows, cols]" % (which, list(q_shape)))
    rows, cols = int(q_shape[0]), int(q_shape[1])
    scale_shape = results.scale_shape(q.format, 0, q.scale_layout, rows, cols)
    if scale_shape is None:
        raise Fp4qError(grpc.StatusCode.INTERNAL, "reply %s: shape %s cannot be quantized"
                        % (which, [rows, cols]))
    parts = {}
    for name, data_oneof, region, shape in (
            ("codes", "codes_data", "codes_region", (rows, cols // 2)),
            ("scales", "scales_data", "scales_region", scale_shape)):
        kind = q.WhichOneof(data_oneof)
        planned_t = planned.get(which + "_" + name) if planned else None
        if kind == region and planned_t is None:
            raise Fp4qError(grpc.StatusCode.INTERNAL, "reply %s.%s: written to a region "
                            "this client did not ask for" % (which, name))
        if kind != name and planned_t is not None:
            parts[name] = planned_t  # the server wrote it by IPC
        else:
            parts[name] = result_tensor(None, getattr(q, name), pb.DType.DTYPE_U8, shape,
                                        device, which + "." + name)
    return results.QuantizedTensor(
        codes=parts["codes"], scales=parts["scales"], rows=rows, cols=cols,
        global_amax=q.global_amax, s_enc=q.s_enc, format=opts.enum_name("format", q.format),
        block=opts.enum_name("block", q.block),
        scale_layout=opts.enum_name("scale_layout", q.scale_layout))


def _plan_unknown(e):
    """Whether `e` is the server's answer to a plan_id it does not hold."""
    return e.code == grpc.StatusCode.NOT_FOUND and e.message.startswith("plan_id:")


class _PendingCall:
    """A request Requests._begin_call sent: wait() (once, from any thread) returns
    (reply, planned) or raises; the Transfer's tensors are held until then."""

    def __init__(self, sent, transfer, planned):
        self._sent = sent
        self._transfer = transfer
        self._planned = planned

    def wait(self):
        try:
            reply = self._sent.wait()
            self._transfer.after_reply()
            planned, self._planned = self._planned, None  # held by the caller alone now
            return reply, planned
        finally:
            self._transfer.release()

    def let_go(self, planned):
        """Transfer.let_go, and `planned` replaced by planned(planned)."""
        self._transfer.let_go()
        self._planned = planned(self._planned)


class PendingStep:
    """A Step that Requests.step_begin sent: wait() returns its StepResult or raises its
    error (once, from any thread). A refusal of a plan the server no longer holds (NOT_FOUND,
    nothing applied) also calls forget(), so that the step, sent again, carries its items."""

    def __init__(self, call, decode, forget=None):
        self._call = call
        self._decode = decode
        self._forget = forget

    def wait(self):
        try:
            reply, built = self._call.wait()
        except Fp4qError as e:
            if self._forget is not None and _plan_unknown(e):
                self._forget()
            raise
        return self._decode(reply, built)

    def let_go(self):
        """Holds the step's tensors no longer (see Transfer.let_go): the request is sent and
        its reply is brief (begun steps' are), which needs no item."""
        self._call.let_go(lambda built: (None,) + tuple(built[1:]))


def fill_operand(msg, q, tr, field, device, dense=False):
    """Fills a QuantizedOperand; returns (shape or None, result device). dense: an
    fp4q.DenseOperand is accepted (Matmul's operands)."""
    if isinstance(q, str):
        msg.weight_name = q
        return None, torch.device(device or "cpu")
    if dense and isinstance(q, results.DenseOperand):
        q.fill(msg.dense, tr, field + ".dense")
        return q.shape, (torch.device(device) if device else q.device)
    if not isinstance(q, results.QuantizedTensor):
        raise tensors.ClientArgumentError(
            "%s: expected fp4q.QuantizedTensor%s or a weight name, got %s" %
            (field, ", fp4q.DenseOperand" if dense else "", type(q).__name__))
    q.fill(msg.tensor, tr, field)
    return (q.rows, q.cols), (torch.device(device) if device else q.codes.device)


def plan_output(tr, target, shape, dtype, device, out):
    """Where an output of `shape` (None: unknown here) goes: `out` itself when the server can
    write it by IPC, a tensor allocated here by IPC, or None (inline)."""
    if shape is None:
        return None
    if (out is not None and out.device.type == "cuda" and out.is_contiguous() and
            out.dtype == dtype):
        slot = tr.input_region(out)  # registers out's allocation; the server writes it
        if slot is not None:
            target.region.region_id, target.region.offset = slot
            return out
    return tr.output(target, shape, dtype, device)


def deliver(result, planned, device, out, field):
    """A reply's TensorResult as a tensor on `device` (the planned one unless the server sent
    bytes inline), copied into `out` when given and not already it."""
    t = result_tensor(planned if not result.inline_data else None, result.inline_data,
                      result.dtype, result.shape, device, field)
    if out is not None and t is not out:
        out.copy_(t)
        return out
    return t


def result_tensor(planned, data, dtype, shape, device, field):
    """An output as a torch tensor on `device`: `planned` when the server wrote it by IPC,
    else the inline bytes (checked against dtype and shape) copied to `device`."""
    if planned is not None:
        return planned
    t = tensors.from_bytes(data, dtype, shape, field)
    device = torch.device(device)
    return t if device.type == "cpu" else t.to(device)
