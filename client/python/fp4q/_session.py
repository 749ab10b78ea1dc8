"""The client's session with one fp4qd, and what it knows of that server's lifetime.

Contract
- Owns the session id (sent with every call by fp4q._transport: gRPC metadata "fp4q-session",
  the fast socket's hello), its lease, the keep-alive thread, and the server epoch.
- open() sends OpenSession (a session already open is forgotten first) and starts a daemon
  thread that sends KeepAlive every lease / 3 seconds (at least 0.5 s) until the session is
  forgotten; its failures are ignored (a lost session is noticed by the next request).
  ensure() opens one with the client's name when none is open. close() sends CloseSession and
  forgets the session whatever the answer.
- Namespace: every session is opened in `namespace` (OpenSessionRequest.namespace; "" is the
  server's default namespace). open(namespace=N) makes N the namespace of that session and of
  every later one. `namespace` is what was asked; `server_namespace` what the last OpenSession
  answered.
- Forgetting (close, a re-open, a server restart, a session the server no longer knows) calls
  `on_forget()` with the session's lock held: the parts bound to the session (fast-socket
  connections, registered regions) drop it there; on_forget must not call back into the
  session. A restart (a reply whose header carries another server_epoch than the last one)
  forgets the session and calls `on_restart()` (what was learnt of the server is stale).
- see_header(reply) is called with every reply: it records this thread's last ReplyHeader
  (last_header) and detects restarts.
- lost(): whether the server still knows our session, asked with a KeepAlive (the session is
  forgotten when it does not); errors other than NOT_FOUND propagate.
- Errors: the RPCs raise fp4q.Fp4qError as `send` does. Thread-safe: one lock guards the id,
  lease, epoch and keep-alive; RPCs are sent with it released.
"""

import threading

import grpc

from fp4q._messages import pb
from fp4q.errors import Fp4qError


class Session:
    """`send(rpc, request) -> reply` is the client's call path (fp4q._transport.Transport.send)."""

    def __init__(self, send, client_name, on_forget, on_restart, namespace=""):
        self._send = send
        self._client_name = client_name
        self.namespace = namespace or ""
        self.server_namespace = None
        self._on_forget = on_forget
        self._on_restart = on_restart
        self._lock = threading.RLock()
        self._id = None
        self._lease_s = 0
        self._keepalive_stop = None
        self._epoch = None
        self._tls = threading.local()

    @property
    def id(self):
        """The open session's id, or None."""
        return self._id

    @property
    def epoch(self):
        """The server_epoch of the last reply seen (None before any)."""
        return self._epoch

    @property
    def last_header(self):
        """The ReplyHeader of this thread's last reply that had one (None before any)."""
        return getattr(self._tls, "header", None)

    # ------------------------------------------------------------------ the RPCs

    def ensure(self):
        """The open session's id, opening one (with the client's name) when none is."""
        with self._lock:
            if self._id is not None:
                return self._id
        self.open(self._client_name)
        return self._id

    def open(self, client_name=None, namespace=None):
        ns = self.namespace if namespace is None else namespace
        reply = self._send("OpenSession", pb.OpenSessionRequest(
            client_name=client_name or self._client_name, namespace=ns))
        with self._lock:
            if self._id is not None:
                self._forget_locked()
            self.namespace = ns
            self.server_namespace = reply.namespace
            self._id = reply.session_id
            self._lease_s = reply.lease_seconds
            self._start_keepalive_locked(reply.lease_seconds)
        return reply.session_id

    def keep_alive(self):
        return self._send("KeepAlive", pb.KeepAliveRequest()).lease_seconds

    def close(self):
        try:
            reply = self._send("CloseSession", pb.CloseSessionRequest())
        finally:
            self.forget()
        return reply.regions_released

    def lost(self):
        """True (and the session forgotten) when the server no longer knows our session."""
        with self._lock:
            if self._id is None:
                return True
        try:
            self.keep_alive()
            return False
        except Fp4qError as e:
            if e.code != grpc.StatusCode.NOT_FOUND:
                raise
        self.forget()
        return True

    # ------------------------------------------------------------------ state

    def forget(self):
        with self._lock:
            self._forget_locked()

    def forget_if(self, session_id):
        """Forgets the session if it still is `session_id` (not one opened meanwhile)."""
        with self._lock:
            if self._id == session_id:
                self._forget_locked()

    def see_header(self, reply):
        header = getattr(reply, "header", None)
        if header is None:
            return
        self._tls.header = header
        with self._lock:
            if self._epoch is not None and header.server_epoch != self._epoch:
                # The server restarted: sessions and regions did not survive it.
                self._forget_locked()
                self._on_restart()
            self._epoch = header.server_epoch

    def _forget_locked(self):
        self._id = None
        self._on_forget()
        if self._keepalive_stop is not None:
            self._keepalive_stop.set()
            self._keepalive_stop = None

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
