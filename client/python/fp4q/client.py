"""fp4q.Client: every fp4q.v1.Fp4q RPC with torch tensors in and out.

Contract
- Tensors: CPU tensors always travel inline. A CUDA tensor travels by CUDA IPC (a registered
  region of its allocation plus its byte offset) when `ipc` allows it and the server serves that
  GPU with "cuda_ipc" enabled; otherwise it is copied and sent inline (see fp4q.ipc for the exact
  conditions; `ipc_reasons` records why a device fell back). Outputs come back on the device of
  the request's main input (`device=` where there is none): by IPC straight into a tensor
  allocated here, or inline and then copied to that device.
- Ordering: before a request that uses regions is sent, the current CUDA stream of each device
  involved is synchronized; when a method returns, the server's writes are complete.
- Sessions: opened on first need (or by open_session), sent as gRPC metadata "fp4q-session",
  renewed by a background thread while open, closed by close(). A server restart (a new
  server_epoch) or an expired session drops the cached regions; a request whose regions vanished
  with an expired session is rebuilt and sent once more.
- Fast socket (`fast_socket=PATH`, fp4qd --fast_socket): Quantize, Dequantize, Qdq, Matmul,
  UpdateWeight and KeepAlive go as one SOCK_SEQPACKET frame each way instead of gRPC when the
  request fits in a frame (65536 bytes) and so does the reply's inline output; the others go by
  gRPC (stats "fast_socket_calls", "fast_socket_fallbacks"). Connections are bound to the session
  by a hello (a session is opened for it when none is) and replaced when the session changes.
  Replies, errors (codes, messages) and retries are those of gRPC; a refused or lost connection
  is UNAVAILABLE and the next call connects again.
- Errors: every failure raises fp4q.Fp4qError with the gRPC code and the server's message;
  arguments refused before sending raise fp4q.ClientArgumentError (a Fp4qError and a
  ValueError, code INVALID_ARGUMENT).
- Thread safety: one Client may be shared by threads; each call is independent.
"""

import collections
import os
import threading
import time

import grpc
import torch

from fp4q import _fast_socket
from fp4q import _transport
from fp4q import ipc as ipc_mod
from fp4q import options as opts
from fp4q import results
from fp4q import tensors
from fp4q._messages import HEALTH_CHECK_PATH, METHODS, loaded, pb
from fp4q.errors import Fp4qError, from_rpc_error

DEFAULT_TARGET = "127.0.0.1:50051"
SESSION_METADATA_KEY = "fp4q-session"
AUTH_METADATA_KEY = "authorization"
_IPC_MODES = ("auto", "never", "require")


class Client:
    """A connection to one fp4qd.

    Args:
      target: "host:port" or "unix:/path"; default $FP4Q_SERVER or 127.0.0.1:50051.
      ipc: "auto" (IPC where possible, inline otherwise), "never", or "require" (a CUDA tensor
        that cannot travel by IPC raises FAILED_PRECONDITION with the reason).
      client_name: sent with OpenSession (server logs).
      timeout: per-call deadline in seconds (None: no deadline).
      max_regions: registered allocations kept before the least recently used is unregistered.
      channel_options: extra grpc channel options.
      bearer_token: fp4qd --auth_token_file's token: every gRPC call carries metadata
        "authorization: Bearer <token>", and the fast socket's hello carries the token.
      fast_socket: the path of fp4qd's --fast_socket (same host): the tensor calls whose request
        and reply fit in one frame travel there instead of gRPC (see the module docstring).
      fast_socket_spin_us: busy-poll each fast-socket reply this long (0-1000000 microseconds)
        before sleeping: saves the thread's wake-up for a CPU core kept busy while waiting.
    """

    def __init__(self, target=None, *, ipc="auto", client_name="fp4q-python", timeout=None,
                 max_regions=256, channel_options=(), bearer_token=None, fast_socket=None,
                 fast_socket_spin_us=0):
        if ipc not in _IPC_MODES:
            raise tensors.ClientArgumentError("ipc: %r is not one of %s" % (ipc, _IPC_MODES))
        self.target = target or os.environ.get("FP4Q_SERVER") or DEFAULT_TARGET
        self._ipc_mode = ipc
        self._client_name = client_name
        self._timeout = timeout
        self._token = bearer_token or None
        channel_opts = [("grpc.max_send_message_length", -1),
                        ("grpc.max_receive_message_length", -1)] + list(channel_options)
        self._channel = grpc.insecure_channel(self.target, options=channel_opts)
        self._stubs = {
            name: self._channel.unary_unary(path, request_serializer=req.SerializeToString,
                                            response_deserializer=rep.FromString)
            for name, (path, req, rep) in METHODS.items()}
        self._health = self._channel.unary_unary(
            HEALTH_CHECK_PATH, request_serializer=loaded().health_request.SerializeToString,
            response_deserializer=loaded().health_response.FromString)
        self._lock = threading.RLock()
        self._session_id = None
        self._lease_s = 0
        self._keepalive_stop = None
        self._epoch = None
        self._info = None
        self._uuids = {}
        self._served = None  # (ServerInfoReply, {normalized GPU UUID: the server's spelling})
        self._arenas = {}
        self._ipc_disabled = None  # server's refusal message, once seen
        self._regions = ipc_mod.RegionCache(self._register_for_cache, self._unregister_quietly,
                                            max_regions)
        self._tls = threading.local()
        self.stats = collections.Counter()
        self.ipc_reasons = {}
        if (isinstance(fast_socket_spin_us, bool) or not isinstance(fast_socket_spin_us, int) or
                not 0 <= fast_socket_spin_us <= 1000000):
            raise tensors.ClientArgumentError(
                "fast_socket_spin_us: %r is not an int in [0, 1000000]" % (fast_socket_spin_us,))
        self._fast = (_fast_socket.FastSocket(os.fspath(fast_socket), self._count,
                                              spin=fast_socket_spin_us * 1e-6)
                      if fast_socket else None)

    # ------------------------------------------------------------------ lifecycle

    def close(self):
        """Closes the session (releasing its regions on the server) and the channel."""
        try:
            if self._session_id is not None:
                self.close_session()
        except Fp4qError:
            pass
        finally:
            if self._fast is not None:
                self._fast.close()
            self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def last_header(self):
        """The ReplyHeader of this thread's last successful call (None before any)."""
        return getattr(self._tls, "header", None)

    @property
    def session_id(self):
        return self._session_id

    # ------------------------------------------------------------------ plumbing

    def _count(self, key, n=1):
        with self._lock:
            self.stats[key] += n

    def _metadata(self):
        md = []
        sid = self._session_id
        if sid:
            md.append((SESSION_METADATA_KEY, sid))
        if self._token:
            md.append((AUTH_METADATA_KEY, "Bearer " + self._token))
        return tuple(md) or None

    def _raw(self, rpc, request, resend=False):
        """Sends one request (fast socket or gRPC); returns the reply or raises Fp4qError.
        `resend`: the request names no region, so it may be sent again under a new session."""
        if self._fast is not None and rpc in _fast_socket.OPS:
            reply = self._raw_fast(rpc, request, resend)
            if reply is not None:
                self._see_header(reply)
                return reply
        try:
            reply = self._stubs[rpc](request, metadata=self._metadata(), timeout=self._timeout)
        except grpc.RpcError as e:
            raise from_rpc_error(e, rpc) from None
        self._see_header(reply)
        return reply

    def _raw_fast(self, rpc, request, resend):
        """The reply over the fast socket, or None where the call belongs on gRPC."""
        deadline = None if self._timeout is None else time.monotonic() + self._timeout
        try:
            frame = self._fast.frame(rpc, request)
        except _fast_socket.FrameTooLarge:
            self._count("fast_socket_fallbacks")
            return None
        for attempt in (0, 1):
            with self._lock:
                sid = self._session_id
            if sid is None:
                if rpc == "KeepAlive":
                    return None  # no session to keep: gRPC answers as it always did
                sid = self._ensure_session()  # a connection is bound to a session
            try:
                return self._fast.call(rpc, frame, sid, self._token, deadline)
            except _fast_socket.FrameTooLarge:
                self._count("fast_socket_fallbacks")
                return None
            except _fast_socket.HelloRefused as e:
                if e.code == grpc.StatusCode.NOT_FOUND:
                    # The server no longer knows the session (expired, or a restarted server).
                    with self._lock:
                        if self._session_id == sid:
                            self._forget_session_locked()
                    if resend and attempt == 0:
                        continue  # nothing was sent; a new session carries it
                raise Fp4qError(e.code, e.message, rpc) from None
        raise AssertionError("unreachable")

    def _see_header(self, reply):
        header = getattr(reply, "header", None)
        if header is None:
            return
        self._tls.header = header
        with self._lock:
            if self._epoch is not None and header.server_epoch != self._epoch:
                # The server restarted: sessions and regions did not survive it.
                self._forget_session_locked()
                self._info = None
            self._epoch = header.server_epoch

    def _call(self, rpc, build):
        """Builds (request, planned) with a Transfer, sends it, returns (reply, planned)."""
        for attempt in (0, 1):
            transfer = _transport.Transfer(self)
            try:
                request, planned = build(transfer)
                transfer.before_send()
                try:
                    reply = self._raw(rpc, request, resend=not transfer.uses_regions)
                except Fp4qError as e:
                    if (attempt == 0 and transfer.uses_regions and
                            e.code == grpc.StatusCode.NOT_FOUND and self._session_lost()):
                        continue
                    raise
                transfer.after_reply()
                return reply, planned
            finally:
                transfer.release()
        raise AssertionError("unreachable")

    def _session_lost(self):
        """True (and the session forgotten) when the server no longer knows our session."""
        with self._lock:
            if self._session_id is None:
                return True
        try:
            self.keep_alive()
            return False
        except Fp4qError as e:
            if e.code != grpc.StatusCode.NOT_FOUND:
                raise
        with self._lock:
            self._forget_session_locked()
        return True

    def _forget_session_locked(self):
        self._session_id = None
        if self._fast is not None:
            self._fast.reset()  # every fast connection says hello again, to the next session
        if self._keepalive_stop is not None:
            self._keepalive_stop.set()
            self._keepalive_stop = None
        self._regions.clear()

    # ------------------------------------------------------------------ IPC decisions

    def _server_info_cached(self):
        with self._lock:
            info = self._info
        if info is None:
            info = self.server_info()
            with self._lock:
                self._info = info
        return info

    def _ipc_uuid(self, device):
        """The server's spelling of `device`'s UUID when IPC may carry it; raises ipc.NoIpc."""
        if self._ipc_mode == "never":
            raise ipc_mod.NoIpc("ipc='never'")
        if self._ipc_disabled:
            raise ipc_mod.NoIpc(self._ipc_disabled)
        info = self._server_info_cached()
        served = self._served
        if served is None or served[0] is not info:
            if "cuda_ipc" not in info.supported_modes:
                raise ipc_mod.NoIpc("the server (backend %s) does not offer cuda_ipc" %
                                    info.backend)
            by_uuid = {}
            for gpu in info.gpus:
                by_uuid.setdefault(ipc_mod.normalize_uuid(gpu.uuid), gpu.uuid)
            served = self._served = (info, by_uuid)  # per ServerInfo reply, not per tensor
        index = device.index if device.index is not None else torch.cuda.current_device()
        uuid = self._uuids.get(index)
        if uuid is None:
            try:
                uuid = ipc_mod.device_uuid(index)
            except Exception as e:  # noqa: BLE001 - any driver failure means "no IPC"
                raise ipc_mod.NoIpc("cannot read the UUID of cuda:%d: %s" % (index, e)) from e
            self._uuids[index] = uuid
        spelling = served[1].get(ipc_mod.normalize_uuid(uuid))
        if spelling is not None:
            self._ensure_session()
            return spelling
        raise ipc_mod.NoIpc("cuda:%d (%s) is not a GPU this server serves (%s): another node "
                            "or another GPU" % (index, uuid, [g.uuid for g in info.gpus]))

    def _ipc_refused(self, device, reason):
        if self._ipc_mode == "require":
            raise Fp4qError(grpc.StatusCode.FAILED_PRECONDITION,
                            "ipc='require' but %s cannot travel by CUDA IPC: %s" % (device, reason))
        with self._lock:
            self.ipc_reasons[str(device)] = reason
            self.stats["ipc_fallbacks"] += 1

    def _register_for_cache(self, handle, size, uuid):
        try:
            return self.register_cuda_region(handle, size, uuid)
        except Fp4qError as e:
            if e.code == grpc.StatusCode.FAILED_PRECONDITION:
                self._ipc_disabled = "the server refused RegisterCudaRegion: " + e.message
                raise ipc_mod.NoIpc(self._ipc_disabled) from e
            raise

    def _unregister_quietly(self, region_id):
        try:
            self.unregister_cuda_region(region_id)
        except Fp4qError:
            pass

    def _arena_for(self, device):
        if not self._arenas:
            return None
        return self._arenas.get(str(torch.device(device)))

    def enable_arena(self, device, nbytes=64 << 20, max_tensor_bytes=1 << 20):
        """Pools CUDA tensors of at most `max_tensor_bytes` on `device` into one registered
        buffer of `nbytes` (one registration for many small tensors). Returns the arena."""
        arena = ipc_mod.Arena(device, nbytes, max_tensor_bytes)
        self._arenas[str(arena.device)] = arena
        return arena

    # ------------------------------------------------------------------ sessions and regions

    def _ensure_session(self):
        with self._lock:
            if self._session_id is not None:
                return self._session_id
        self.open_session(self._client_name)
        return self._session_id

    def open_session(self, client_name=None):
        """OpenSession; the id is then sent with every call. Returns the session id."""
        reply = self._raw("OpenSession",
                          pb.OpenSessionRequest(client_name=client_name or self._client_name))
        with self._lock:
            if self._session_id is not None:
                self._forget_session_locked()
            self._session_id = reply.session_id
            self._lease_s = reply.lease_seconds
            self._start_keepalive_locked(reply.lease_seconds)
        return reply.session_id

    def _start_keepalive_locked(self, lease_s):
        if lease_s <= 0:
            return
        stop = threading.Event()
        self._keepalive_stop = stop
        interval = max(0.5, lease_s / 3.0)

        def loop():
            while not stop.wait(interval):
                try:
                    self.keep_alive()
                except Fp4qError:
                    pass  # a lost session is noticed by the next request
        threading.Thread(target=loop, name="fp4q-keepalive", daemon=True).start()

    def keep_alive(self):
        """KeepAlive for the current session; returns the lease in seconds."""
        return self._raw("KeepAlive", pb.KeepAliveRequest()).lease_seconds

    def close_session(self):
        """CloseSession; returns how many regions the server released."""
        try:
            reply = self._raw("CloseSession", pb.CloseSessionRequest())
        finally:
            with self._lock:
                self._forget_session_locked()
        return reply.regions_released

    def register_cuda_region(self, ipc_handle, size, device_uuid=""):
        """RegisterCudaRegion (64-byte cudaIpcMemHandle of an allocation's base, usable bytes,
        GPU UUID); returns the region id. Opens a session when none is open."""
        self._ensure_session()
        reply = self._raw("RegisterCudaRegion", pb.RegisterCudaRegionRequest(
            ipc_handle=bytes(ipc_handle), size=int(size), device_uuid=device_uuid))
        self._count("registrations")
        return reply.region_id

    def register_tensor(self, tensor):
        """Registers (once per allocation) the allocation holding a CUDA tensor; returns
        (region_id, byte offset of the tensor). FAILED_PRECONDITION when IPC cannot carry it."""
        if not isinstance(tensor, torch.Tensor) or tensor.device.type != "cuda":
            raise tensors.ClientArgumentError("tensor: expected a CUDA torch.Tensor")
        try:
            return self._regions.slice_for(tensor, self._ipc_uuid(tensor.device))
        except ipc_mod.NoIpc as e:
            raise Fp4qError(grpc.StatusCode.FAILED_PRECONDITION, str(e)) from None

    def unregister_cuda_region(self, region_id):
        self._raw("UnregisterCudaRegion", pb.UnregisterCudaRegionRequest(region_id=region_id))

    # ------------------------------------------------------------------ info and health

    def server_info(self):
        """ServerInfo; returns the fp4q.v1.ServerInfoReply message."""
        return self._raw("ServerInfo", pb.ServerInfoRequest())

    def health(self, service=""):
        """grpc.health.v1 Check: 'SERVING', 'NOT_SERVING', ... for "", "liveness", "readiness"."""
        try:
            reply = self._health(loaded().health_request(service=service), timeout=self._timeout)
        except grpc.RpcError as e:
            raise from_rpc_error(e, "Health.Check") from None
        return loaded().health_status.Name(reply.status)

    # ------------------------------------------------------------------ numerics

    def quantize(self, x, options=None, **kwargs):
        """Quantize x [rows, cols] (float32 / bfloat16); keyword options as fp4q.QuantOptions.
        Returns QuantizeResult(rowwise, columnwise) of QuantizedTensor on x's device."""
        o = opts.quant_options(options, **kwargs)
        device = x.device if isinstance(x, torch.Tensor) else torch.device("cpu")

        def build(tr):
            req = pb.QuantizeRequest()
            tr.input(req.input, x, "input")
            o.fill(req.options)
            return req, self._plan_quantize_outputs(tr, req, x, o)

        reply, planned = self._call("Quantize", build)
        out = {}
        for which in ("rowwise", "columnwise"):
            out[which] = (self._quantized_from_reply(getattr(reply, which), planned, which, device)
                          if reply.HasField(which) else None)
        return results.QuantizeResult(**out)

    def _plan_quantize_outputs(self, tr, req, x, o):
        planned = {}
        if x.device.type != "cuda" or x.dim() != 2:
            return planned
        which_out = req.options.outputs
        sides = []
        if which_out in (0, pb.Outputs.OUTPUTS_ROWWISE, pb.Outputs.OUTPUTS_BOTH):
            sides.append(("rowwise", x.shape[0], x.shape[1]))
        if which_out in (pb.Outputs.OUTPUTS_COLUMNWISE, pb.Outputs.OUTPUTS_BOTH):
            sides.append(("columnwise", x.shape[1], x.shape[0]))
        for which, rows, cols in sides:
            sb = results.scale_bytes(o.format, o.block, o.scale_layout, rows, cols)
            if sb is None:
                continue  # the server will name the bad shape
            plain = req.options.scale_layout != pb.ScaleLayout.SCALE_LAYOUT_SWIZZLED
            scale_shape = (rows, sb // rows) if plain else (sb,)
            planned[which + "_codes"] = tr.output(getattr(req, which + "_codes"),
                                                  (rows, cols // 2), torch.uint8, x.device)
            planned[which + "_scales"] = tr.output(getattr(req, which + "_scales"),
                                                   scale_shape, torch.uint8, x.device)
        return planned

    def _quantized_from_reply(self, q, planned, which, device):
        q_shape = q.shape
        if len(q_shape) != 2:
            raise Fp4qError(grpc.StatusCode.INTERNAL,
                            "reply %s.shape: %s is not [rows, cols]" % (which, list(q_shape)))
        rows, cols = int(q_shape[0]), int(q_shape[1])
        q_format, q_layout = q.format, q.scale_layout
        fmt = opts.enum_name("format", q_format)
        layout = opts.enum_name("scale_layout", q_layout)
        sb = results.scale_bytes(q_format, 0, q_layout, rows, cols)
        if sb is None:
            raise Fp4qError(grpc.StatusCode.INTERNAL, "reply %s: shape %s cannot be quantized"
                            % (which, [rows, cols]))
        scale_shape = (sb,) if layout == "swizzled" else (rows, sb // rows)
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
                parts[name] = _transport.result_tensor(
                    None, getattr(q, name), pb.DType.DTYPE_U8, shape, device,
                    which + "." + name)
        return results.QuantizedTensor(
            codes=parts["codes"], scales=parts["scales"], rows=rows, cols=cols,
            global_amax=q.global_amax, s_enc=q.s_enc, format=fmt,
            block=opts.enum_name("block", q.block), scale_layout=layout)

    def dequantize(self, q, out_dtype=torch.float32, *, out=None, device=None):
        """Dequantize a QuantizedTensor, or a server-held weight by name. The result is on the
        device of q's codes (for a weight name: `device`, default CPU), or written into `out`."""
        def build(tr):
            req = pb.DequantizeRequest(out_dtype=tensors.torch_dtype(out_dtype))
            shape, dev = self._fill_operand(req.input, q, tr, "input", device)
            if out is not None:
                shape, dev = tuple(out.shape), out.device
            planned = self._plan_output(tr, req.out, shape, out_dtype or torch.float32, dev, out)
            return req, (planned, dev)

        reply, (planned, dev) = self._call("Dequantize", build)
        return self._deliver(reply.output, planned, dev, out, "output")

    def qdq(self, x, options=None, out_dtype=None, *, out=None, **kwargs):
        """Quantize-dequantize (row-wise). Returns x's shape in out_dtype (default x's dtype)
        on x's device; the reply's global amax is in last_qdq_amax."""
        o = opts.quant_options(options, **kwargs)

        def build(tr):
            req = pb.QdqRequest(out_dtype=tensors.torch_dtype(out_dtype))
            tr.input(req.input, x, "input")
            o.fill(req.options)
            dtype = out_dtype or x.dtype
            planned = self._plan_output(tr, req.out, tuple(x.shape), dtype, x.device, out)
            return req, planned

        reply, planned = self._call("Qdq", build)
        self._tls.qdq_amax = reply.global_amax
        return self._deliver(reply.output, planned, x.device, out, "output")

    @property
    def last_qdq_amax(self):
        """The global amax of this thread's last qdq reply."""
        return getattr(self._tls, "qdq_amax", None)

    def matmul(self, a, b, out_dtype=torch.float32, *, out=None, device=None):
        """C = A * B^T from two QuantizedTensors (or weight names): [a.rows, b.rows]."""
        def build(tr):
            req = pb.MatmulRequest(out_dtype=tensors.torch_dtype(out_dtype))
            sa, da = self._fill_operand(req.a, a, tr, "a", device)
            sb, _ = self._fill_operand(req.b, b, tr, "b", device)
            shape = (sa[0], sb[0]) if sa and sb else None
            dev = da
            if out is not None:
                shape, dev = tuple(out.shape), out.device
            planned = self._plan_output(tr, req.out, shape, out_dtype or torch.float32, dev, out)
            return req, (planned, dev)

        reply, (planned, dev) = self._call("Matmul", build)
        return self._deliver(reply.output, planned, dev, out, "output")

    def _fill_operand(self, msg, q, tr, field, device):
        """Fills a QuantizedOperand; returns (shape or None, result device)."""
        if isinstance(q, str):
            msg.weight_name = q
            return None, torch.device(device or "cpu")
        if not isinstance(q, results.QuantizedTensor):
            raise tensors.ClientArgumentError(
                "%s: expected fp4q.QuantizedTensor or a weight name, got %s" %
                (field, type(q).__name__))
        q.fill(msg.tensor, tr, field)
        return (q.rows, q.cols), (torch.device(device) if device else q.codes.device)

    def _plan_output(self, tr, target, shape, dtype, device, out):
        if shape is None:
            return None
        if (out is not None and out.device.type == "cuda" and out.is_contiguous() and
                out.dtype == dtype):
            slot = tr.input_region(out)  # registers out's allocation; the server writes it
            if slot is not None:
                target.region.region_id, target.region.offset = slot
                return out
        return tr.output(target, shape, dtype, device)

    def _deliver(self, result, planned, device, out, field):
        t = _transport.result_tensor(planned if not result.inline_data else None,
                                     result.inline_data, result.dtype, result.shape, device,
                                     field)
        if out is not None and t is not out:
            out.copy_(t)
            return out
        return t

    # ------------------------------------------------------------------ weights and state

    def create_weight(self, name, initial, *, block=None, rounding=None, seed=0,
                      error_feedback=False, dtype=None, step=0, device_uuid=""):
        """CreateWeight: a server-held NVFP4 weight from `initial` [rows, cols].
        Returns the fp4q.v1.WeightInfo message."""
        def build(tr):
            req = pb.CreateWeightRequest(name=name, step=int(step), device_uuid=device_uuid)
            tr.input(req.initial, initial, "initial")
            w = req.options
            w.block = opts.enum_value("block", block)
            w.rounding = opts.enum_value("rounding", rounding)
            opts._set_uint(w, "seed", seed)
            w.error_feedback = bool(error_feedback)
            w.dtype = tensors.torch_dtype(dtype, "dtype")
            return req, None

        return self._call("CreateWeight", build)[0].weight

    def update_weight(self, name, step, update, *, lr=0.0, kind=None, return_dequantized=False,
                      dequantized_out=None):
        """UpdateWeight with a gradient (W <- Q(DQ(W) + r - lr*g)) or delta (kind='delta').
        Returns UpdateResult(applied, last_step, dequantized, global_amax)."""
        def build(tr):
            req = pb.UpdateWeightRequest(name=name, step=int(step), lr=float(lr),
                                         kind=opts.enum_value("kind", kind),
                                         return_dequantized=bool(return_dequantized))
            tr.input(req.update, update, "update")
            planned = None
            if dequantized_out is not None:
                planned = self._plan_output(tr, req.dequantized_out, tuple(dequantized_out.shape),
                                            dequantized_out.dtype, dequantized_out.device,
                                            dequantized_out)
            return req, planned

        reply, planned = self._call("UpdateWeight", build)
        deq = None
        if reply.HasField("dequantized") and (reply.dequantized.inline_data or planned is not None):
            dev = dequantized_out.device if dequantized_out is not None else update.device
            deq = self._deliver(reply.dequantized, planned, dev, dequantized_out, "dequantized")
        return results.UpdateResult(applied=reply.applied, last_step=reply.last_step,
                                    dequantized=deq, global_amax=reply.global_amax)

    def get_weight(self, name, *, dequantized=True, out_dtype=None, quantized=False,
                   residual=False, device="cpu"):
        """GetWeight: the weight's info and, as asked, DQ(W), its codes/scales, its residual,
        as tensors on `device`. Returns WeightState."""
        req = pb.GetWeightRequest(name=name, dequantized=bool(dequantized),
                                  out_dtype=tensors.torch_dtype(out_dtype),
                                  quantized=bool(quantized), residual=bool(residual))
        reply = self._raw("GetWeight", req)
        deq = res = qt = None
        if dequantized and reply.HasField("dequantized"):
            deq = self._deliver(reply.dequantized, None, device, None, "dequantized")
        if residual and reply.HasField("residual"):
            res = self._deliver(reply.residual, None, device, None, "residual")
        if quantized and reply.HasField("quantized"):
            qt = self._quantized_from_reply(reply.quantized, {}, "quantized", torch.device(device))
        return results.WeightState(info=reply.weight, dequantized=deq, quantized=qt, residual=res)

    def delete_weight(self, name):
        self._raw("DeleteWeight", pb.DeleteWeightRequest(name=name))

    def reset_residual(self, name):
        """Zeroes a residual: a weight's (by weight name) or a qdq/quantize residual_key's."""
        self._raw("ResetResidual", pb.ResetResidualRequest(name=name))

    def list_tensors(self):
        """ListTensors: a list of fp4q.v1.TensorListing messages."""
        return list(self._raw("ListTensors", pb.ListTensorsRequest()).tensors)

    def checkpoint(self):
        """Checkpoint; returns the fp4q.v1.CheckpointReply (path, bytes, tensors)."""
        return self._raw("Checkpoint", pb.CheckpointRequest())
