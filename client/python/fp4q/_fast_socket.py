"""The client end of fp4qd's fast socket (`fp4qd --fast_socket PATH`).

Wire format (proto/fp4q/v1/fp4q.proto, "the fast socket"): a SOCK_SEQPACKET Unix socket where one
message is one frame, a FastRequest (here to the server) or FastReply (back), at most
`limits.max_frame` bytes each, in the format of a framing (fp4q._fast_frames.GENERIC: a method
name and its serialized request). The first frame of a connection is a hello binding it to a
session.

What goes there (`frame()`): a request of a method the framing serves whose frame fits, and whose
reply fits too: its bound (fp4q._fast_frames.reply_bound) plus the limits' reply margin within
the frame, the same check fp4qd makes before it runs a state-changing call. A read-only call
whose reply size the request does not tell (UNKNOWN) is sent too; fp4qd refuses its reply with
RESOURCE_EXHAUSTED when it does not fit, and fp4q._transport then sends it by gRPC. `limits`
starts at the proto's values (FastSocketLimit) and follows the server's ServerInfo.limits
(set_limits, called by the transport with every ServerInfo reply).

`FastSocket` is a small pool of connections, each bound (helloed) to one session id:
- A call takes an idle connection of the current session, or connects and says hello; it sends
  one frame and reads one reply (one outstanding call per connection, so concurrent threads use
  separate connections); the connection goes back to the pool afterwards (at most `max_idle`
  are kept).
- A connection that failed in any way (closed by the server, timed out, out of step) is closed,
  never reused; the next call connects again. An idle connection that became readable (the
  server closed it) is dropped before use, and a send refused on a reused connection (the frame
  never left) is tried once more on a fresh one.
- `reset()` (the session was dropped or re-opened) closes the idle connections and makes the busy
  ones close when they come back, so every later call says hello again.
- `heads_up()` tells fp4qd that a call follows soon on the connection the next call will take,
  when that connection has sat idle HEADS_UP_AFTER or longer and the server takes heads-ups
  (limits.heads_up_micros): fp4qd's thread for it then wakes while the caller still prepares the
  call, and busy-polls for it (FastRequest.heads_up_micros; no reply).
- Thread-safe; it knows nothing of sessions beyond the id each call names (fp4q._transport
  decides which calls come here and what a refused hello means for the session).

Failures raise fp4q.Fp4qError exactly as a gRPC call would: the server's code (google.rpc.Code
numbers are grpc.StatusCode values) and message; a failed connection is UNAVAILABLE; a missed
deadline is DEADLINE_EXCEEDED; a reply that breaks the protocol is INTERNAL. A refused hello
raises HelloRefused (the client turns it into an Fp4qError and handles the session).
"""

import errno
import itertools
import math
import select
import socket
import threading
import time

import grpc

from fp4q import _fast_frames
from fp4q._fast_frames import DEFAULT_LIMITS, GENERIC, MAX_TIMEOUT_MICROS, Limits
from fp4q._messages import Serialized, pb
from fp4q.errors import Fp4qError

_CODES = {c.value[0]: c for c in grpc.StatusCode}
# send() errors that mean the frame did not leave: the peer is gone.
_SEND_GONE = (errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN, errno.ECONNREFUSED)

# FastSocket(spin=None): the replies of these rpcs are busy-polled for, up to twice the last
# one's round trip when that took at most AUTO_SPIN_MAX seconds, unless the server runs on the
# CPU backend (its work needs this host's cores). A trainer's step repeats at the
# same size, and the thread sending it has nothing else to do until its reply: sleeping in recv
# costs the thread's wake-up and a core that idles down meanwhile (GPT-2's step from Python on
# the H200, bench/results/h200-step/one-pass call 11: 1.03-1.13 ms sleeping, 0.80-0.85 ms
# busy-polling, alternated in one run).
AUTO_SPIN = frozenset(("Step", "UpdateWeight"))
# A reply of those rpcs expected later than AUTO_SPIN_MAX but within AUTO_WAKE_MAX seconds (a
# synchronous step sent with a ready signal while the backward pass still runs, whose reply
# waits for it) is slept for until AUTO_SPIN_MAX before the last such round trip's time, then
# busy-polled for up to 2 * AUTO_SPIN_MAX: the thread's wake-up falls before the reply instead
# of after it, at the cost of that spin.
AUTO_WAKE_MAX = 50e-3
AUTO_SPIN_MAX = 2e-3


def status_code(number):
    """The grpc.StatusCode of a google.rpc.Code number (UNKNOWN for numbers it does not know)."""
    return _CODES.get(number, grpc.StatusCode.UNKNOWN)


class FrameTooLarge(Exception):
    """The request or its reply does not fit in one frame (the caller uses gRPC instead)."""


class HelloRefused(Exception):
    """The server answered the hello with an error; code is a grpc.StatusCode."""

    def __init__(self, code, message):
        super().__init__("%s: %s" % (code.name, message))
        self.code = code
        self.message = message


class _SendGone(Exception):
    """A send on a reused connection found the peer gone: the frame was not delivered."""


# A connection idle this long (seconds) gets a heads-up before a step (FastSocket.heads_up):
# fp4qd's thread for it has stopped busy-polling by then (it polls for a caller back within
# twice its last gap, and at most 2 ms).
HEADS_UP_AFTER = 1e-3
# The heads-up's time: fp4qd busy-polls this long at most for the call that follows it.
HEADS_UP_MICROS = 2000


class _Conn:
    __slots__ = ("sock", "session_id", "generation", "timeout", "idle_since", "_poll")

    def __init__(self, sock, session_id, generation):
        self.sock = sock
        self.session_id = session_id
        self.generation = generation
        self.timeout = sock.gettimeout()
        self.idle_since = time.monotonic()  # its last exchange's end
        self._poll = None

    def readable(self):
        """True when the idle connection has something to read: EOF or a frame nobody awaits
        (one poll() of a poll object made once for the connection)."""
        p = self._poll
        if p is None:
            p = self._poll = select.poll()
            p.register(self.sock.fileno(), select.POLLIN | select.POLLHUP | select.POLLERR)
        return bool(p.poll(0))

    def settimeout(self, seconds):
        """sock.settimeout, skipped when unchanged (each one costs system calls)."""
        if seconds is None and self.timeout is None:
            return
        self.sock.settimeout(seconds)
        self.timeout = seconds

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


def _remaining(deadline, rpc):
    """Seconds left before `deadline` (None: no deadline); raises DEADLINE_EXCEEDED at 0."""
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise _deadline_error(rpc)
    return left


def _deadline_error(rpc):
    return Fp4qError(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded", rpc)


def _readable_within(sock, seconds):
    """True when `sock` has something to read within `seconds` (slept for in poll())."""
    p = select.poll()
    p.register(sock.fileno(), select.POLLIN | select.POLLHUP | select.POLLERR)
    return bool(p.poll(max(0, math.ceil(seconds * 1e3))))


class FastSocket:
    """A pool of fast-socket connections to one fp4qd. Thread-safe."""

    def __init__(self, path, count=None, max_idle=8, spin=0.0, framing=GENERIC,
                 limits=DEFAULT_LIMITS):
        self.path = path
        self.framing = framing
        self.limits = limits  # replaced whole (a tuple), never mutated: read without the lock
        # Seconds of busy-polling for each reply before blocking, or None: AUTO_SPIN's policy.
        self._spin = spin
        self._last_round_trip = {}  # rpc -> seconds of its last call() (AUTO_SPIN's rpcs)
        # The server's backend is the CPU one (set by fp4q._transport from its replies): its
        # steps run on this host's cores, which a busy-polling client would take from it.
        self.server_on_cpu = False
        self._count = count or (lambda key, n=1: None)
        self._max_idle = max_idle
        self._lock = threading.Lock()
        self._idle = []
        self._generation = 0
        self._closed = False
        self._ids = itertools.count(1)

    # ------------------------------------------------------------------ pool

    def reset(self):
        """Forgets every connection: idle ones are closed, busy ones close when released."""
        with self._lock:
            self._generation += 1
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def close(self):
        with self._lock:
            self._closed = True
        self.reset()

    def _next_id(self):
        with self._lock:
            return next(self._ids)

    def _take_idle(self, session_id):
        stale = []
        found = None
        with self._lock:
            while self._idle:
                conn = self._idle.pop()
                if (conn.session_id == session_id and conn.generation == self._generation and
                        not conn.readable()):
                    found = conn
                    break
                stale.append(conn)
        for conn in stale:
            conn.close()
        return found

    def _release(self, conn):
        conn.idle_since = time.monotonic()
        with self._lock:
            keep = (not self._closed and conn.generation == self._generation and
                    len(self._idle) < self._max_idle)
            if keep:
                self._idle.append(conn)
        if not keep:
            conn.close()

    def heads_up(self, session_id):
        """Sends a heads-up (see the module docstring) on the idle connection of `session_id`
        that the next call takes, when it has been idle HEADS_UP_AFTER or longer and the server
        takes heads-ups; True when one was sent. Never raises: a connection whose send fails is
        closed (the next call connects again)."""
        micros = self.limits.heads_up_micros
        if not micros:
            return False
        with self._lock:
            if not self._idle:
                return False
            conn = self._idle[-1]  # what _take_idle pops first
            if (conn.session_id != session_id or conn.generation != self._generation or
                    time.monotonic() - conn.idle_since < HEADS_UP_AFTER):
                return False
            self._idle.pop()
        try:
            sent = conn.sock.send(self.framing.heads_up(min(micros, HEADS_UP_MICROS)),
                                  socket.MSG_DONTWAIT)
        except OSError:
            sent = 0
        if not sent:
            conn.close()
            return False
        self._count("fast_socket_heads_ups")
        self._release(conn)
        return True

    # ------------------------------------------------------------------ calls

    def set_limits(self, info):
        """Takes the frame limits a ServerInfoReply reports (kept where it reports none)."""
        self.limits = Limits.from_server_info(info, self.limits)

    def serves(self, rpc):
        """True when `rpc` may travel here (frame() may still refuse one call for its size)."""
        return self.framing.serves(rpc)

    def frame(self, rpc, request):
        """A Frame carrying `request` (call_id and timeout are filled in when it is sent).
        Raises FrameTooLarge when it cannot fit in a frame (checked exactly when sent), or when
        its reply might not (fp4qd would refuse a state-changing call for it, or do a stateless
        call's work and then answer RESOURCE_EXHAUSTED); a read-only call of UNKNOWN reply size
        is framed (see the module docstring)."""
        limits = self.limits
        if request.ByteSize() > limits.max_frame:
            raise FrameTooLarge()  # without copying a large request into the frame
        try:
            bound = (request.reply_bound if type(request) is Serialized else
                     _fast_frames.reply_bound(rpc, request))
        except Exception:  # noqa: BLE001 - a malformed request: gRPC names the problem
            raise FrameTooLarge() from None
        if bound is _fast_frames.UNKNOWN:
            if rpc not in _fast_frames.READ_ONLY:
                raise FrameTooLarge()
        elif not limits.reply_fits(bound):
            raise FrameTooLarge()
        msg = self.framing.request(rpc, request.SerializeToString())
        if len(msg) > limits.max_frame:
            raise FrameTooLarge()
        return msg

    def call(self, rpc, msg, session_id, token, deadline):
        """Sends `msg` (from frame()) as `rpc` on a connection bound to `session_id`; returns the
        reply message of the RPC. Raises FrameTooLarge (nothing sent), HelloRefused, Fp4qError."""
        op = self.framing.carried(rpc)
        for attempt in (0, 1):
            conn = self._take_idle(session_id)
            reused = conn is not None
            if conn is None:
                conn = self._connect(session_id, token, deadline, rpc)
            done = False
            try:
                try:
                    reply = self._exchange(conn, rpc, msg, deadline, reused)
                except _SendGone:
                    if attempt == 0:
                        continue  # the frame never left; a fresh connection sends it
                    raise self._unavailable(rpc, "the server closed the connection") from None
                except FrameTooLarge:
                    done = True  # refused before sending: the connection is still in step
                    raise
                payload = self._payload(reply, op, rpc) if reply.code == 0 else None
                done = True  # a whole, well-formed exchange: error or not, the connection is fine
            finally:
                self._settle(conn, done)
            return self._outcome(reply, payload, rpc)
        raise AssertionError("unreachable")

    def _settle(self, conn, whole):
        """Back to the pool after a `whole` exchange, else closed (out of step)."""
        if whole:
            self._release(conn)
        else:
            conn.close()

    def _outcome(self, reply, payload, rpc):
        """The call's payload, or its error raised."""
        self._count("fast_socket_calls")
        if reply.code != 0:
            raise Fp4qError(status_code(reply.code), reply.message, rpc)
        return payload

    def _payload(self, reply, op, rpc):
        if reply.carried != op:
            raise Fp4qError(grpc.StatusCode.INTERNAL, "fast socket %s: reply carries %s, not %s"
                            % (self.path, reply.carried, op), rpc)
        return reply.payload

    def _unavailable(self, rpc, what):
        return Fp4qError(grpc.StatusCode.UNAVAILABLE, "fast socket %s: %s" % (self.path, what), rpc)

    def _connect(self, session_id, token, deadline, rpc):
        with self._lock:
            generation = self._generation
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        conn = _Conn(sock, session_id, generation)
        ok = False
        try:
            conn.settimeout(_remaining(deadline, rpc))
            try:
                sock.connect(self.path)
            except socket.timeout:
                raise _deadline_error(rpc) from None
            except OSError as e:
                raise self._unavailable(rpc, "connect: %s" % (e.strerror or e)) from None
            hello = pb.FastHello(session_id=session_id, auth_token=token or "")
            call_id = self._send_frame(conn, rpc, self.framing.hello(hello.SerializeToString()),
                                       deadline, False)
            reply = self._recv_reply(conn, rpc, call_id, deadline, 0.0)
            if reply.code != 0:
                raise HelloRefused(status_code(reply.code), reply.message)
            self._payload(reply, "hello", rpc)
            self._count("fast_socket_connects")
            ok = True
            return conn
        finally:
            if not ok:
                conn.close()

    def _spin_for(self, rpc):
        """Seconds to busy-poll for the reply of a call() of `rpc`: the fixed spin, or with
        spin=None AUTO_SPIN's: up to twice the last round trip of the same rpc (AUTO_SPIN_MAX
        before the first), nothing once that round trip took longer than AUTO_SPIN_MAX or for
        other rpcs, and none for a server on the CPU backend."""
        if self._spin is not None:
            return self._spin
        if rpc not in AUTO_SPIN or self.server_on_cpu:
            return 0.0
        last = self._last_round_trip.get(rpc)
        if last is None:
            return AUTO_SPIN_MAX
        return 0.0 if last > AUTO_SPIN_MAX else min(2 * last, AUTO_SPIN_MAX)

    def _wake_after(self, rpc):
        """With spin=None, seconds after the send of a call() of `rpc` at which its thread wakes
        to busy-poll for the reply (AUTO_WAKE_MAX's rule), or None (it never sleeps first)."""
        if self._spin is not None or rpc not in AUTO_SPIN or self.server_on_cpu:
            return None
        last = self._last_round_trip.get(rpc)
        if last is None or not AUTO_SPIN_MAX < last <= AUTO_WAKE_MAX:
            return None
        return last - AUTO_SPIN_MAX

    def _spin_recv(self, conn, spin):
        """The reply frame when it arrives within `spin` seconds (busy-polling a non-blocking
        socket: the thread is not put to sleep and woken; the GIL is released only for each
        recv), else None."""
        conn.settimeout(0.0)
        until = time.monotonic() + spin
        while True:
            try:
                return conn.sock.recv(self.limits.max_frame + 1)
            except (BlockingIOError, InterruptedError):
                if time.monotonic() >= until:
                    return None

    def start(self, rpc, msg, session_id, token, deadline):
        """The first half of call(): sends `msg` on a connection of its own and returns a
        ticket for finish(), which waits for the reply (from any thread). Raises as call()
        does; nothing was sent when it raises."""
        for attempt in (0, 1):
            conn = self._take_idle(session_id)
            reused = conn is not None
            if conn is None:
                conn = self._connect(session_id, token, deadline, rpc)
            try:
                call_id = self._send_frame(conn, rpc, msg, deadline, reused)
            except _SendGone:
                conn.close()
                if attempt == 0:
                    continue
                raise self._unavailable(rpc, "the server closed the connection") from None
            except FrameTooLarge:
                self._release(conn)
                raise
            except BaseException:
                conn.close()
                raise
            return (conn, call_id)
        raise AssertionError("unreachable")

    def finish(self, ticket, rpc, deadline):
        """The reply message of a call start() sent; raises Fp4qError as call() does."""
        conn, call_id = ticket
        done = False
        try:
            reply = self._recv_reply(conn, rpc, call_id, deadline)
            payload = None
            if reply.code == 0:
                payload = self._payload(reply, self.framing.carried(rpc), rpc)
            done = True
        finally:
            self._settle(conn, done)
        return self._outcome(reply, payload, rpc)

    def _exchange(self, conn, rpc, msg, deadline, reused):
        """One frame (`msg`, a Frame) out, one frame in: the decoded reply (a _fast_frames.Reply)
        with our call_id (its code unchecked). Raising leaves `conn` out of step (the caller
        closes it)."""
        spin = self._spin_for(rpc)
        wake = self._wake_after(rpc) if not spin else None
        sent = time.monotonic()
        call_id = self._send_frame(conn, rpc, msg, deadline, reused)
        if wake is None:
            reply = self._recv_reply(conn, rpc, call_id, deadline, spin)
        else:
            until = sent + wake if deadline is None else min(sent + wake, deadline)
            reply = self._recv_reply(conn, rpc, call_id, deadline, 2 * AUTO_SPIN_MAX,
                                     sleep_until=until)
        if self._spin is None and rpc in AUTO_SPIN:
            self._last_round_trip[rpc] = time.monotonic() - sent
        return reply

    def _send_frame(self, conn, rpc, msg, deadline, reused):
        """Sends `msg` on `conn` under a new call_id (returned)."""
        sock = conn.sock
        call_id = self._next_id()
        left = _remaining(deadline, rpc)
        timeout_micros = 0 if left is None else min(max(1, int(left * 1e6)), MAX_TIMEOUT_MICROS)
        data = msg.data(call_id, timeout_micros)
        max_frame = self.limits.max_frame
        if len(data) > max_frame:
            raise FrameTooLarge()
        try:
            sent = None
            if conn.timeout == 0.0:
                # Left non-blocking by the last reply's busy-poll: a frame the socket takes at
                # once goes without switching the socket to blocking and back (a system call
                # each, every call).
                try:
                    sent = sock.send(data)
                except BlockingIOError:
                    pass  # the socket's buffer is full: sent below, waiting as the call may
            if sent is None:
                conn.settimeout(left)
                sent = sock.send(data)
        except socket.timeout:
            raise _deadline_error(rpc) from None
        except OSError as e:
            if reused and e.errno in _SEND_GONE:
                raise _SendGone() from None
            raise self._unavailable(rpc, "send: %s" % (e.strerror or e)) from None
        if sent != len(data):
            raise self._unavailable(rpc, "send: %d of %d bytes sent" % (sent, len(data)))
        return call_id

    def _recv_reply(self, conn, rpc, call_id, deadline, spin=None, sleep_until=None):
        """The reply frame to `call_id` on `conn`, decoded (its code unchecked); busy-polled for
        `spin` seconds first (None: the fixed spin, none with spin=None), and before that slept
        for until monotonic time `sleep_until` when given (the reply, if it comes by then, is
        read at once)."""
        sock = conn.sock
        max_frame = self.limits.max_frame
        if spin is None:
            spin = self._spin or 0.0
        try:
            data = None
            if sleep_until is not None and _readable_within(sock, sleep_until - time.monotonic()):
                self._count("fast_socket_replied_before_spin")
                spin = 0.0
            if spin > 0:
                data = self._spin_recv(conn, spin)
                self._count("fast_socket_polled" if data is not None else
                            "fast_socket_polled_then_slept")
            if data is None:
                conn.settimeout(_remaining(deadline, rpc))
                data = sock.recv(max_frame + 1)
        except socket.timeout:
            raise _deadline_error(rpc) from None
        except OSError as e:
            raise self._unavailable(rpc, "recv: %s" % (e.strerror or e)) from None
        if not data:
            raise self._unavailable(rpc, "the server closed the connection")
        if len(data) > max_frame:
            raise Fp4qError(grpc.StatusCode.INTERNAL, "fast socket %s: a reply frame over %d "
                            "bytes" % (self.path, max_frame), rpc)
        try:
            reply = self.framing.parse(data, rpc)
        except Exception as e:  # noqa: BLE001 - protobuf's DecodeError differs across versions
            raise Fp4qError(grpc.StatusCode.INTERNAL, "fast socket %s: undecodable reply frame "
                            "(%d bytes): %s" % (self.path, len(data), e), rpc) from None
        if reply.call_id != call_id:
            raise Fp4qError(grpc.StatusCode.INTERNAL, "fast socket %s: reply call_id %d to "
                            "call %d (code %d: %s)" % (self.path, reply.call_id, call_id,
                                                       reply.code, reply.message), rpc)
        return reply
