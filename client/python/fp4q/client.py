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
- Fast socket (`fast_socket=PATH`, fp4qd --fast_socket): every RPC but OpenSession goes as one
  SOCK_SEQPACKET frame each way instead of gRPC when the request fits in a frame (the proto's
  FAST_SOCKET_MAX_FRAME_BYTES, or the server's ServerInfo.limits) and so does the reply (its
  bound plus FAST_SOCKET_REPLY_MARGIN_BYTES); the others go by gRPC (stats
  "fast_socket_calls", "fast_socket_fallbacks"). Connections are bound to the session by a
  hello (a session is opened for it when none is) and replaced when the session changes.
  Replies, errors (codes, messages) and retries are those of gRPC; a refused or lost connection
  is UNAVAILABLE and the next call connects again.
- Namespaces (`namespace=`, open_session(namespace=)): every name the client sends (weights,
  residual keys, replica groups) lives in its session's namespace; a client with a namespace
  opens its session before its first call.
- Defaults from the environment (what deploy/ manifests set): target $FP4Q_SERVER, bearer_token
  $FP4Q_TOKEN, fast_socket $FP4Q_FAST_SOCKET; an explicit argument wins ("" turns a default
  off).
- Errors: every failure raises fp4q.Fp4qError with the gRPC code and the server's message;
  arguments refused before sending raise fp4q.ClientArgumentError (a Fp4qError and a
  ValueError, code INVALID_ARGUMENT).
- Thread safety: one Client may be shared by threads; each call is independent.

The parts, each owning one concern (their docstrings are the detailed contracts): _session
(session, keep-alive, server epoch), _transport (gRPC or fast socket, resend rules; the wire in
_fast_socket and _fast_frames), _regions (CUDA IPC decisions, region cache, arenas, each
request's Transfer), _requests (requests built from torch tensors, replies delivered). The
Client wires them and keeps the public API; it holds no state of its own but `stats`.
"""

import collections
import os
import threading

import torch

from fp4q import _regions
from fp4q import _requests
from fp4q import _session
from fp4q import _transport
from fp4q import options as opts
from fp4q import tensors
from fp4q._messages import pb
from fp4q.errors import Fp4qError

DEFAULT_TARGET = "127.0.0.1:50051"
SESSION_METADATA_KEY = _transport.SESSION_METADATA_KEY
AUTH_METADATA_KEY = _transport.AUTH_METADATA_KEY
_IPC_MODES = _regions.IPC_MODES


class Client:
    """A connection to one fp4qd.

    Args:
      target: "host:port" or "unix:/path"; default $FP4Q_SERVER or 127.0.0.1:50051.
      namespace: the job namespace of every session this client opens (fp4qd scopes every name
        by it; None or "": the default namespace).
      ipc: "auto" (IPC where possible, inline otherwise), "never", or "require" (a CUDA tensor
        that cannot travel by IPC raises FAILED_PRECONDITION with the reason).
      client_name: sent with OpenSession (server logs).
      timeout: per-call deadline in seconds (None: no deadline).
      max_regions: registered allocations kept before the least recently used is unregistered.
      channel_options: extra grpc channel options.
      bearer_token: fp4qd --auth_token_file's token: every gRPC call carries metadata
        "authorization: Bearer <token>", and the fast socket's hello carries the token.
        Default $FP4Q_TOKEN.
      fast_socket: the path of fp4qd's --fast_socket (same host): the calls whose request and
        reply fit in one frame travel there instead of gRPC (see the module docstring).
        Default $FP4Q_FAST_SOCKET.
      fast_socket_spin_us: busy-poll each fast-socket reply this long (0-1000000 microseconds)
        before sleeping: saves the thread's wake-up for a CPU core kept busy while waiting.
        None (the default): only the replies of Step and UpdateWeight, up to twice the last
        such call's round trip when it took at most 2 ms (a trainer's repeated step; see
        fp4q._fast_socket.AUTO_SPIN), from 2 ms before the last round trip's time when that
        took 2-50 ms (slept for until then), and never from a server on the CPU backend; 0:
        never.
      fast_socket_heads_up: before a step (fp4q.optim) whose fast socket connection sat idle
        1 ms or more, send fp4qd a heads-up (a frame with no reply) so that its thread wakes
        while this process prepares the step, where fp4qd takes heads-ups (its
        limits.fast_socket_max_heads_up_micros). Default True.
    """

    def __init__(self, target=None, *, ipc="auto", client_name="fp4q-python", timeout=None,
                 max_regions=256, channel_options=(), bearer_token=None, fast_socket=None,
                 fast_socket_spin_us=None, namespace=None, fast_socket_heads_up=True):
        self.target = target or os.environ.get("FP4Q_SERVER") or DEFAULT_TARGET
        if bearer_token is None:
            bearer_token = os.environ.get("FP4Q_TOKEN") or None
        if fast_socket is None:
            fast_socket = os.environ.get("FP4Q_FAST_SOCKET") or None
        if namespace is not None and not isinstance(namespace, str):
            raise tensors.ClientArgumentError("namespace: %r is not a string" % (namespace,))
        self.stats = collections.Counter()
        self.ipc_reasons = {}
        self._stats_lock = threading.Lock()
        # The parts reach one another through methods of the client, looked up when called.
        self._ipc = _regions.Regions(ipc, max_regions, send=self._raw,
                                     ensure_session=lambda: self._ensure_session(),
                                     count=self._count, reasons=self.ipc_reasons)
        self._session = _session.Session(self._raw, client_name, self._on_session_forgotten,
                                         self._on_server_restart, namespace=namespace or "")
        self._transport = _transport.Transport(
            self.target, session=self._session, timeout=timeout, token=bearer_token,
            channel_options=channel_options, fast_socket=fast_socket,
            fast_socket_spin_us=fast_socket_spin_us, count=self._count,
            fast_socket_heads_up=fast_socket_heads_up)
        self._requests = _requests.Requests(self._raw, self._session.lost, self._ipc,
                                            lambda rpc, req: self._transport.begin(rpc, req))

    # ------------------------------------------------------------------ lifecycle

    def close(self):
        """Closes the session (releasing its regions on the server) and the channel."""
        try:
            if self._session.id is not None:
                self.close_session()
        except Fp4qError:
            pass
        finally:
            self._transport.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def last_header(self):
        """The ReplyHeader of this thread's last successful call (None before any)."""
        return self._session.last_header

    @property
    def session_id(self):
        return self._session.id

    @property
    def namespace(self):
        """The namespace this client's sessions are opened in ("" is the default namespace)."""
        return self._session.namespace

    @property
    def server_epoch(self):
        """The server_epoch of the last reply this client saw (None before any): it changes
        when the server restarted."""
        return self._session.epoch

    # ------------------------------------------------------------------ wiring

    def _count(self, key, n=1):
        with self._stats_lock:
            self.stats[key] += n

    def _raw(self, rpc, request, resend=False):
        """Sends one request (fast socket or gRPC); returns the reply or raises Fp4qError.
        `resend`: the request names no region, so it may be sent again under a new session."""
        return self._transport.send(rpc, request, resend)

    def _call(self, rpc, build):
        """Builds (request, planned) with a Transfer, sends it, returns (reply, planned)."""
        return self._requests.call(rpc, build)

    def _ensure_session(self):
        return self._session.ensure()

    def _on_session_forgotten(self):  # the session's lock is held
        self._transport.session_changed()
        self._ipc.clear()

    def _on_server_restart(self):
        self._ipc.forget_server_info()

    # The parts' state under the names tests and tools use (test_offline, gpu_ipc_check).
    _info = property(lambda self: self._ipc.info,
                     lambda self, info: setattr(self._ipc, "info", info))
    _ipc_mode = property(lambda self: self._ipc.mode,
                         lambda self, mode: setattr(self._ipc, "mode", mode))
    _regions = property(lambda self: self._ipc.cache)
    _fast = property(lambda self: self._transport.fast)

    def _ipc_uuid(self, device):
        """The server's spelling of `device`'s UUID when IPC may carry it; raises ipc.NoIpc."""
        return self._ipc.uuid_for(device)

    def _ipc_refused(self, device, reason):
        self._ipc.refused(device, reason)

    @staticmethod
    def _quantized_from_reply(q, planned, which, device):
        return _requests.quantized_from_reply(q, planned, which, device)

    # ------------------------------------------------------------------ sessions and regions

    def open_session(self, client_name=None, namespace=None):
        """OpenSession; the id is then sent with every call. Returns the session id.
        `namespace` (None: the client's) becomes the namespace of this and later sessions."""
        if namespace is not None and not isinstance(namespace, str):
            raise tensors.ClientArgumentError("namespace: %r is not a string" % (namespace,))
        return self._session.open(client_name, namespace)

    def keep_alive(self):
        """KeepAlive for the current session; returns the lease in seconds."""
        return self._session.keep_alive()

    def close_session(self):
        """CloseSession; returns how many regions the server released."""
        return self._session.close()

    def register_cuda_region(self, ipc_handle, size, device_uuid=""):
        """RegisterCudaRegion (64-byte cudaIpcMemHandle of an allocation's base, usable bytes,
        GPU UUID); returns the region id. Opens a session when none is open."""
        return self._ipc.register(ipc_handle, size, device_uuid)

    def register_tensor(self, tensor):
        """Registers (once per allocation) the allocation holding a CUDA tensor; returns
        (region_id, byte offset of the tensor). FAILED_PRECONDITION when IPC cannot carry it."""
        return self._ipc.register_tensor(tensor)

    def unregister_cuda_region(self, region_id):
        self._ipc.unregister(region_id)

    def enable_arena(self, device, nbytes=64 << 20, max_tensor_bytes=1 << 20):
        """Pools CUDA tensors of at most `max_tensor_bytes` on `device` into one registered
        buffer of `nbytes` (one registration for many small tensors). Returns the arena."""
        return self._ipc.enable_arena(device, nbytes, max_tensor_bytes)

    # ------------------------------------------------------------------ info and health

    def server_info(self):
        """ServerInfo; returns the fp4q.v1.ServerInfoReply message."""
        return self._raw("ServerInfo", pb.ServerInfoRequest())

    def health(self, service=""):
        """grpc.health.v1 Check: 'SERVING', 'NOT_SERVING', ... for "", "liveness", "readiness"."""
        return self._transport.health(service)

    # ------------------------------------------------------------------ numerics

    def quantize(self, x, options=None, **kwargs):
        """Quantize x [rows, cols] (float32 / bfloat16); keyword options as fp4q.QuantOptions.
        Returns QuantizeResult(rowwise, columnwise) of QuantizedTensor on x's device."""
        return self._requests.quantize(x, opts.quant_options(options, **kwargs))

    def dequantize(self, q, out_dtype=torch.float32, *, out=None, device=None):
        """Dequantize a QuantizedTensor, or a server-held weight by name. The result is on the
        device of q's codes (for a weight name: `device`, default CPU), or written into `out`."""
        return self._requests.dequantize(q, out_dtype, out, device)

    def qdq(self, x, options=None, out_dtype=None, *, out=None, **kwargs):
        """Quantize-dequantize (row-wise). Returns x's shape in out_dtype (default x's dtype)
        on x's device; the reply's global amax is in last_qdq_amax."""
        return self._requests.qdq(x, opts.quant_options(options, **kwargs), out_dtype, out)

    @property
    def last_qdq_amax(self):
        """The global amax of this thread's last qdq reply."""
        return self._requests.last_qdq_amax

    def matmul(self, a, b, out_dtype=torch.float32, *, out=None, device=None):
        """C = A * B^T: [a.rows, b.rows]. Each operand is an fp4q.QuantizedTensor, a stored
        weight's name, or an fp4q.DenseOperand (a tensor fp4qd quantizes in this call)."""
        return self._requests.matmul(a, b, out_dtype, out, device)

    # ------------------------------------------------------------------ weights and state

    def create_weight(self, name, initial, *, block=None, rounding=None, seed=0,
                      error_feedback=False, dtype=None, step=0, device_uuid="", scaling=None,
                      optimizer=None):
        """CreateWeight: a server-held NVFP4 weight from `initial` [rows, cols].
        scaling: 'current' (the server's default) | 'delayed'; optimizer: the fp4q.OptimizerSpec
        of the state it keeps (None: plain SGD). Returns the fp4q.v1.WeightInfo message."""
        return self._requests.create_weight(name, initial, block, rounding, seed,
                                            error_feedback, dtype, step, device_uuid, scaling,
                                            optimizer)

    def update_weight(self, name, step, update, *, lr=0.0, kind=None, return_dequantized=False,
                      dequantized_out=None):
        """UpdateWeight with a gradient (W <- Q(DQ(W) + r - lr*g)) or delta (kind='delta').
        Returns UpdateResult(applied, last_step, dequantized, global_amax)."""
        return self._requests.update_weight(name, step, update, lr, kind, return_dequantized,
                                            dequantized_out)

    def get_weight(self, name, *, dequantized=True, out_dtype=None, quantized=False,
                   residual=False, device="cpu", optimizer_state=False, out=None):
        """GetWeight: the weight's info and, as asked, DQ(W), its codes/scales, its residual,
        its optimizer state (fp4q.OptimizerState), as tensors on `device`; DQ(W) written into
        `out` (by IPC in place where it can) when given. Returns WeightState."""
        return self._requests.get_weight(name, dequantized, out_dtype, quantized, residual,
                                         device, optimizer_state, out)

    def step(self, step, items, groups, *, kind=None, replica=None, resend=True,
             brief_reply=False, one_pass=False):
        """Step: one optimizer step of many stored weights, applied as a unit (every item or
        none). items: fp4q.StepItem (name, update, dequantized_out / return_dequantized,
        group); groups: one fp4q.SgdHyperparameters or fp4q.AdamWHyperparameters per parameter
        group (each item's `group` indexes them); kind: 'gradient' (default) | 'delta';
        replica: (group name, rank) of a replica group this session joined (join_group).
        resend=False: never sent again in another session (see fp4q._transport).
        brief_reply=True: the reply lists no item, only how many applied (StepResult.items is
        empty, applied_items counts them), when every item's DQ(W) goes to its
        dequantized_out by IPC (else the items come back as usual).
        one_pass=True: apply in one pass where the server can (fp4q.v1.StepRequest.one_pass:
        plain SGD items under delayed scaling, read once; a refused step then leaves DQ(W) of
        the unchanged weights in the dequantized_out targets); StepResult.one_pass says whether
        it did. Returns fp4q.StepResult."""
        return self._requests.step(step, items, groups, kind, replica, resend, brief_reply,
                                   one_pass)

    def reset_optimizer(self, name, optimizer):
        """ResetOptimizer: the weight's optimizer state replaced by zeroed state of `optimizer`
        (fp4q.OptimizerSpec), its step count by 0. Returns the fp4q.v1.WeightInfo message."""
        return self._requests.reset_optimizer(name, optimizer)

    def join_group(self, group, world_size, rank, *, deadline_ms=0):
        """JoinGroup: this session becomes `rank` of the replica group (created by the first
        join; later joins must agree on world_size). deadline_ms: how long a step waits for
        the other ranks (0: the server's 30000). Returns the number of ranks joined so far."""
        self._session.ensure()  # a rank is a session
        req = pb.JoinGroupRequest(group=group, world_size=int(world_size), rank=int(rank),
                                  deadline_ms=int(deadline_ms))
        return self._raw("JoinGroup", req).members

    def leave_group(self, group):
        """LeaveGroup: frees this session's rank (a step being collected fails for all ranks)."""
        self._raw("LeaveGroup", pb.LeaveGroupRequest(group=group))

    def delete_namespace(self):
        """DeleteNamespace: deletes every weight, residual and group of this client's namespace
        (refused for the default namespace). Returns how many were deleted."""
        return self._raw("DeleteNamespace", pb.DeleteNamespaceRequest()).deleted

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
