"""The client's call path: one request out, its reply back, by gRPC or by the fast socket.

Contract
- Owns the gRPC channel (no send/receive size limit; extra `channel_options` appended), one stub
  per method of fp4q.v1.Fp4q (built from the descriptor's METHODS, so a new RPC needs nothing
  here), the grpc.health.v1 stub, and the FastSocket when `fast_socket` is given.
- send(rpc, request, resend=False) -> reply; `request` is the method's message or a
  fp4q._messages.Serialized of one (sent as its bytes). Metadata: "fp4q-session" (the session's id, when
  open) and "authorization: Bearer <token>" (when a token is set); deadline: `timeout` seconds
  (None: none) for the whole call. Every reply passes through session.see_header (last_header,
  restart detection).
- Which transport: the fast socket when there is one, the framing serves the RPC (every method
  but OpenSession) and the call's frame and reply fit (FastSocket.frame); else gRPC
  ("fast_socket_fallbacks" counts the calls sent to gRPC for their size). A read-only call that
  fp4qd refuses on the fast socket for its reply's size (fp4q._fast_frames.is_reply_limit) is
  sent again by gRPC (counted as a fallback too). A fast call needs a session: one is opened for
  it when none is open, except for KeepAlive, CloseSession (they act on the session: without one
  gRPC answers, as it always did) and ServerInfo (it needs none). Every ServerInfo reply updates
  the fast socket's frame limits (FastSocket.set_limits).
- Namespaces: a session lives in one namespace (fp4q._session); when the session has one, every
  call but OpenSession, KeepAlive and CloseSession carries a session (one is opened first), since
  the server resolves every name in the caller's session's namespace.
- Resend rules (nothing else is ever sent twice):
  - fast socket, the hello refused NOT_FOUND (the server no longer knows the session): the
    session is forgotten, and a request with `resend` (one that names no region) is sent once
    more in a new session; otherwise NOT_FOUND is raised with the hello's message.
  - gRPC, a call refused NOT_FOUND because the server no longer knows the session it carried
    ("metadata fp4q-session: unknown or expired session"): the session is forgotten, and a
    request with `resend` is sent once more in a new session; otherwise the error is raised.
    Callers that must not continue in another session (fp4q.optim's steps) pass resend=False.
  - a send on a reused fast connection that finds the peer gone goes once more on a fresh
    connection (the frame never left; fp4q._fast_socket).
  - a request that names regions and is answered NOT_FOUND because its session vanished is
    rebuilt and sent once more by fp4q._requests (only it can rebuild a request).
- Errors: fp4q.Fp4qError with the gRPC code and the server's message, `rpc` set (a gRPC error
  through errors.from_rpc_error; the fast socket's own as documented there). A
  fast_socket_spin_us neither None nor in [0, 1000000] is a ClientArgumentError at construction.
- Thread safety: any number of threads; each call is independent (the fast socket gives each
  concurrent call its own connection).
"""

import os
import time

import grpc

from fp4q import _fast_frames
from fp4q import _fast_socket
from fp4q import tensors
from fp4q._messages import HEALTH_CHECK_PATH, METHODS, loaded
from fp4q.errors import Fp4qError, from_rpc_error

SESSION_METADATA_KEY = "fp4q-session"
AUTH_METADATA_KEY = "authorization"
# Calls that act on the session itself: never a reason to open one.
_SESSION_CALLS = frozenset({"OpenSession", "KeepAlive", "CloseSession"})
# Calls that need no session: the fast socket carries them only when one is open.
_SESSIONLESS = _SESSION_CALLS | {"ServerInfo"}
# The server's answer to a session id it does not know (engine.cc ResolveNamespace).
_UNKNOWN_SESSION = "metadata fp4q-session: unknown or expired session"


def _serialize(request):
    # A message, or fp4q._messages.Serialized (its bytes built already).
    return request.SerializeToString()


class Transport:
    """`session` is the client's fp4q._session.Session; `count(key, n=1)` adds to its stats."""

    def __init__(self, target, *, session, timeout, token, channel_options, fast_socket,
                 fast_socket_spin_us, count, fast_socket_heads_up=True):
        if fast_socket_spin_us is not None and (
                isinstance(fast_socket_spin_us, bool) or
                not isinstance(fast_socket_spin_us, int) or
                not 0 <= fast_socket_spin_us <= 1000000):
            raise tensors.ClientArgumentError(
                "fast_socket_spin_us: %r is not None or an int in [0, 1000000]"
                % (fast_socket_spin_us,))
        self._session = session
        self._timeout = timeout
        self._token = token or None
        channel_opts = [("grpc.max_send_message_length", -1),
                        ("grpc.max_receive_message_length", -1)] + list(channel_options)
        self._channel = grpc.insecure_channel(target, options=channel_opts)
        self._stubs = {
            name: self._channel.unary_unary(path, request_serializer=_serialize,
                                            response_deserializer=rep.FromString)
            for name, (path, req, rep) in METHODS.items()}
        self._health = self._channel.unary_unary(
            HEALTH_CHECK_PATH, request_serializer=loaded().health_request.SerializeToString,
            response_deserializer=loaded().health_response.FromString)
        self.fast = (_fast_socket.FastSocket(os.fspath(fast_socket), count,
                                             spin=None if fast_socket_spin_us is None
                                             else fast_socket_spin_us * 1e-6)
                     if fast_socket else None)
        self._count = count
        self.heads_ups = bool(fast_socket_heads_up)

    def close(self):
        if self.fast is not None:
            self.fast.close()
        self._channel.close()

    def session_changed(self):
        """The session was forgotten: every fast connection says hello again, to the next."""
        if self.fast is not None:
            self.fast.reset()

    def _metadata(self):
        md = []
        sid = self._session.id
        if sid:
            md.append((SESSION_METADATA_KEY, sid))
        if self._token:
            md.append((AUTH_METADATA_KEY, "Bearer " + self._token))
        return tuple(md) or None

    def send(self, rpc, request, resend=False):
        """Sends one request (fast socket or gRPC); returns the reply or raises Fp4qError.
        `resend`: the request names no region, so it may be sent again under a new session."""
        if self._session.namespace and rpc not in _SESSION_CALLS:
            self._session.ensure()  # names resolve in the session's namespace
        reply = None
        if self.fast is not None and self.fast.serves(rpc):
            reply = self._send_fast(rpc, request, resend)
        if reply is None:
            reply = self._send_grpc(rpc, request, resend)
        self._session.see_header(reply)
        if self.fast is not None:
            if rpc == "ServerInfo":
                self.fast.set_limits(reply)
                self.fast.server_on_cpu = reply.backend == "cpu"
            elif rpc in _fast_socket.AUTO_SPIN:
                self.fast.server_on_cpu = reply.header.backend == "cpu"
        return reply

    def heads_up(self):
        """A fast socket heads-up for a call about to be sent in the current session
        (FastSocket.heads_up), unless the client was made with fast_socket_heads_up=False."""
        fast = self.fast
        if fast is not None and self.heads_ups:
            sid = self._session.id
            if sid is not None:
                fast.heads_up(sid)

    def begin(self, rpc, request):
        """Sends one request (fast socket or gRPC, sent once: no resend in a new session) and
        returns a Pending whose wait() (from any thread, once) returns the reply or raises
        Fp4qError, as send() would."""
        if self._session.namespace and rpc not in _SESSION_CALLS:
            self._session.ensure()
        if self.fast is not None and self.fast.serves(rpc):
            pending = self._begin_fast(rpc, request)
            if pending is not None:
                return pending
        sid = self._session.id
        try:
            future = self._stubs[rpc].future(request, metadata=self._metadata(),
                                             timeout=self._timeout)
        except grpc.RpcError as e:
            raise from_rpc_error(e, rpc) from None

        def wait():
            try:
                reply = future.result()
            except grpc.RpcError as e:
                error = from_rpc_error(e, rpc)
                if (sid is not None and error.code == grpc.StatusCode.NOT_FOUND and
                        error.message.startswith(_UNKNOWN_SESSION)):
                    self._session.forget_if(sid)
                raise error from None
            self._session.see_header(reply)
            return reply
        return Pending(wait)

    def _begin_fast(self, rpc, request):
        deadline = None if self._timeout is None else time.monotonic() + self._timeout
        try:
            frame = self.fast.frame(rpc, request)
        except _fast_socket.FrameTooLarge:
            self._count("fast_socket_fallbacks")
            return None
        sid = self._session.id
        if sid is None:
            sid = self._session.ensure()
        try:
            ticket = self.fast.start(rpc, frame, sid, self._token, deadline)
        except _fast_socket.FrameTooLarge:
            self._count("fast_socket_fallbacks")
            return None
        except _fast_socket.HelloRefused as e:
            if e.code == grpc.StatusCode.NOT_FOUND:
                self._session.forget_if(sid)
            raise Fp4qError(e.code, e.message, rpc) from None

        def wait():
            reply = self.fast.finish(ticket, rpc, deadline)
            self._session.see_header(reply)
            return reply
        return Pending(wait)

    def _send_grpc(self, rpc, request, resend):
        for attempt in (0, 1):
            sid = self._session.id
            try:
                return self._stubs[rpc](request, metadata=self._metadata(), timeout=self._timeout)
            except grpc.RpcError as e:
                error = from_rpc_error(e, rpc)
            if (sid is not None and error.code == grpc.StatusCode.NOT_FOUND and
                    error.message.startswith(_UNKNOWN_SESSION)):
                self._session.forget_if(sid)
                if resend and attempt == 0 and rpc not in _SESSION_CALLS:
                    self._session.ensure()
                    continue  # refused before it ran; a new session carries it
            raise error from None
        raise AssertionError("unreachable")

    def _send_fast(self, rpc, request, resend):
        """The reply over the fast socket, or None where the call belongs on gRPC."""
        deadline = None if self._timeout is None else time.monotonic() + self._timeout
        try:
            frame = self.fast.frame(rpc, request)
        except _fast_socket.FrameTooLarge:
            self._count("fast_socket_fallbacks")
            return None
        for attempt in (0, 1):
            sid = self._session.id
            if sid is None:
                if rpc in _SESSIONLESS:
                    return None  # gRPC answers as it always did, without opening a session
                sid = self._session.ensure()  # a connection is bound to a session
            try:
                return self.fast.call(rpc, frame, sid, self._token, deadline)
            except _fast_socket.FrameTooLarge:
                self._count("fast_socket_fallbacks")
                return None
            except Fp4qError as e:
                if rpc in _fast_frames.READ_ONLY and _fast_frames.is_reply_limit(e):
                    self._count("fast_socket_fallbacks")
                    return None  # read-only, refused for its reply's size: gRPC carries it
                raise
            except _fast_socket.HelloRefused as e:
                if e.code == grpc.StatusCode.NOT_FOUND:
                    # The server no longer knows the session (expired, or a restarted server).
                    self._session.forget_if(sid)
                    if resend and attempt == 0:
                        continue  # nothing was sent; a new session carries it
                raise Fp4qError(e.code, e.message, rpc) from None
        raise AssertionError("unreachable")

    def health(self, service):
        try:
            reply = self._health(loaded().health_request(service=service), timeout=self._timeout)
        except grpc.RpcError as e:
            raise from_rpc_error(e, "Health.Check") from None
        return loaded().health_status.Name(reply.status)


class Pending:
    """A request sent by Transport.begin: wait() returns its reply or raises its error."""

    __slots__ = ("_wait",)

    def __init__(self, wait):
        self._wait = wait

    def wait(self):
        return self._wait()
