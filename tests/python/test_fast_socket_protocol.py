"""The fast socket's protocol: hostile frames sent raw to a live CPU-backend `fp4qd --fast_socket`,
and the client's checks of the protocol against a scripted stand-in server (FakeFastServer)."""

import os
import shutil
import socket
import threading
import time
import unittest

import grpc

import fast_socket_testing
import fp4q
import fp4q_testing
from fast_socket_testing import Counting, RawConnection, randn
from fp4q._messages import pb

# SERVER, FAST_PATH, GRPC (gRPC only) and FAST (the fast socket), set by setUpModule.
setUpModule, tearDownModule = fast_socket_testing.module_fixture(globals())


def fast_call(call_id, method, request=None, **kwargs):
    """A FastRequest calling `method` with `request` (a message) serialized."""
    body = request.SerializeToString() if request is not None else b""
    return pb.FastRequest(call_id=call_id, method=method, request=body, **kwargs)


class RawProtocolTest(Counting):
    def test_hostile_frames_are_answered_and_the_connection_stays_usable(self):
        sid = GRPC.open_session() if GRPC.session_id is None else GRPC.session_id
        with RawConnection(FAST_PATH) as raw:
            raw.send_bytes(b"\xff" * 16)  # not a FastRequest
            r = raw.reply()
            self.assertEqual((r.call_id, r.code, r.HasField("hello"), r.reply), (0, 3, False, b""))
            self.assertEqual(r.message, "frame: 16 bytes are not a fp4q.v1.FastRequest")

            r = raw.call(fast_call(5, "KeepAlive"))
            self.assertEqual((r.call_id, r.code), (5, 9))  # FAILED_PRECONDITION before hello
            self.assertEqual(r.message, "FastRequest.method: the connection is not bound to a "
                             "session; its first frame must be a hello naming an open session")

            self.assertEqual(raw.send_bytes(b"\x08\x07" + b"\x00" * 69998), 70000)
            r = raw.reply()
            self.assertEqual((r.call_id, r.code), (0, 3))  # too long: not even read
            self.assertEqual(r.message, "frame: 70000 bytes exceed the fast socket's limit of "
                             "65536 bytes (send large inline tensors over gRPC)")

            r = raw.call(pb.FastRequest(call_id=6))
            self.assertEqual((r.call_id, r.code), (6, 3))  # no method, no hello
            self.assertRegex(r.message, r"^FastRequest\.method: empty \(name a method")
            r = raw.call(fast_call(7, "KeepAlive", timeout_micros=2**63))
            self.assertEqual((r.call_id, r.code), (7, 3))
            self.assertRegex(r.message, r"^FastRequest\.timeout_micros: ")

            r = raw.call(pb.FastRequest(call_id=8, hello=pb.FastHello(session_id="f" * 32)))
            self.assertEqual((r.call_id, r.code), (8, 5))  # NOT_FOUND: no such session
            self.assertRegex(r.message, r"^hello\.session_id: unknown or expired session \(open one with OpenSession")
            r = raw.call(pb.FastRequest(call_id=9, hello=pb.FastHello()))
            self.assertEqual((r.call_id, r.code), (9, 3))  # empty session id
            r = raw.call(pb.FastRequest(call_id=10, hello=pb.FastHello(session_id=sid),
                                        method="KeepAlive"))
            self.assertEqual((r.call_id, r.code), (10, 3))  # a hello carries no call
            self.assertRegex(r.message, r"^FastRequest\.method: set beside hello")
            r = raw.call(fast_call(11, "KeepAlive"))
            self.assertEqual((r.call_id, r.code), (11, 9))  # failed hellos bind nothing

            r = raw.call(pb.FastRequest(call_id=12, hello=pb.FastHello(session_id=sid)))
            self.assertEqual((r.call_id, r.code, r.HasField("hello")), (12, 0, True))
            self.assertEqual(r.hello.lease_seconds, 600)
            self.assertEqual(r.hello.header.backend, "cpu")
            r = raw.call(pb.FastRequest(call_id=13, hello=pb.FastHello(session_id=sid)))
            self.assertEqual((r.call_id, r.code), (13, 9))  # one hello per connection

            r = raw.call(fast_call(14, "Nope"))
            self.assertEqual((r.call_id, r.code, r.message),
                             (14, 12, "method: 'Nope' is not a method of fp4q.v1.Fp4q"))
            r = raw.call(fast_call(15, "OpenSession", pb.OpenSessionRequest()))
            self.assertEqual((r.call_id, r.code), (15, 3))
            self.assertRegex(r.message, r"^method: OpenSession is not served on the fast socket")
            r = raw.call(pb.FastRequest(call_id=16, method="Qdq", request=b"\xff" * 8))
            self.assertEqual((r.call_id, r.code), (16, 3))
            self.assertRegex(r.message, r"^request: 8 bytes are not a valid fp4q\.v1\.QdqRequest")

            # After all that, calls work and agree with gRPC.
            r = raw.call(fast_call(17, "KeepAlive"))
            self.assertEqual((r.call_id, r.code), (17, 0))
            self.assertEqual(pb.KeepAliveReply.FromString(r.reply).lease_seconds, 600)
            x = randn(4, 32, seed=17)
            req = pb.QdqRequest()
            req.input.dtype = pb.DType.DTYPE_F32
            req.input.shape.extend([4, 32])
            req.input.inline_data = x.numpy().tobytes()
            r = raw.call(fast_call(2**64 - 1, "Qdq", req))
            self.assertEqual((r.call_id, r.code), (2**64 - 1, 0))
            out = pb.QdqReply.FromString(r.reply)
            self.assertEqual(out.output.inline_data, GRPC.qdq(x).numpy().tobytes())
            self.assertEqual(list(out.output.shape), [4, 32])


class FakeFastServer:
    """A scripted stand-in for fp4qd's fast socket: it answers every hello and CloseSession
    (a closing client's) with OK and every other frame with behave(connection number,
    FastRequest) -> bytes to send (None: close the connection; "close-after:" + bytes: send
    them, then close; "silent": no answer). `requests` records all but CloseSession."""

    def __init__(self, path, behave):
        self.path = path
        self.behave = behave
        self.requests = []  # (connection number, FastRequest)
        self.connections = 0
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.listener.bind(path)
        self.listener.listen(16)
        self._open = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            n = self.connections
            self.connections += 1
            self._open.append(conn)
            threading.Thread(target=self._serve, args=(conn, n), daemon=True).start()

    def _serve(self, conn, n):
        with conn:
            while True:
                try:
                    data = conn.recv(70000)
                except OSError:
                    return
                if not data:
                    return
                req = pb.FastRequest.FromString(data)
                if req.method == "CloseSession":
                    conn.send(pb.FastReply(call_id=req.call_id).SerializeToString())
                    continue
                self.requests.append((n, req))
                if req.HasField("hello"):
                    reply = pb.FastReply(call_id=req.call_id)
                    reply.hello.lease_seconds = 600
                    conn.send(reply.SerializeToString())
                    continue
                action = self.behave(n, req)
                if action is None:
                    return
                if action == "silent":
                    continue
                if isinstance(action, tuple):  # ("close-after", bytes)
                    conn.send(action[1])
                    return
                conn.send(action)

    def close(self):
        self.listener.close()
        for conn in self._open:
            try:
                conn.close()
            except OSError:
                pass


class ClientProtocolTest(Counting):
    """The client's side of the protocol, against FakeFastServer (KeepAlive calls: the real
    server opens the session over gRPC, the stand-in answers the fast socket)."""

    timeout = 30

    def setUp(self):
        self.path = fp4q_testing.socket_path("fake.sock")
        self.script = []  # behave(n, req) callables, one per call, in order
        self.fake = FakeFastServer(self.path, lambda n, req: self.script.pop(0)(n, req))
        self.client = fp4q.Client(SERVER.target, timeout=self.timeout, fast_socket=self.path)
        self.client.open_session()
        # Replies carry the real server's epoch: another epoch reads as a restarted server.
        self.epoch = self.client.last_header.server_epoch

    def keep_alive_reply(self, req, lease=7, call_id=None):
        body = pb.KeepAliveReply(lease_seconds=lease)
        body.header.server_epoch = self.epoch
        reply = pb.FastReply(call_id=req.call_id if call_id is None else call_id,
                             reply=body.SerializeToString())
        return reply.SerializeToString()

    def tearDown(self):
        self.client.close()
        self.fake.close()
        shutil.rmtree(os.path.dirname(self.path), ignore_errors=True)

    def assertKeepAliveFails(self, code, pattern):
        with self.assertRaises(fp4q.Fp4qError) as cm:
            self.client.keep_alive()
        self.assertEqual((cm.exception.code, cm.exception.rpc), (code, "KeepAlive"))
        self.assertRegex(cm.exception.message, pattern)

    def test_requests_carry_the_session_and_the_deadline(self):
        self.script = [lambda n, req: self.keep_alive_reply(req)] * 2
        self.assertEqual(self.client.keep_alive(), 7)
        self.assertEqual(self.client.keep_alive(), 7)
        (n0, hello), (n1, first), (n2, second) = self.fake.requests
        self.assertEqual((n0, n1, n2), (0, 0, 0))  # one connection, reused
        self.assertEqual(hello.hello.session_id, self.client.session_id)
        self.assertEqual(hello.hello.auth_token, "")
        self.assertEqual((first.method, first.request), ("KeepAlive", b""))
        self.assertNotEqual(first.call_id, second.call_id)
        self.assertGreater(first.timeout_micros, 25 * 10**6)
        self.assertLessEqual(first.timeout_micros, 30 * 10**6)

    def test_a_step_reply_expected_late_is_slept_for_then_polled(self):
        """A Step whose reply came after AUTO_SPIN_MAX (a synchronous step sent while the
        backward pass runs): the next one sleeps until shortly before the last round trip's
        time, then busy-polls (AUTO_WAKE_MAX's rule)."""
        from fp4q import _fast_socket as fs

        def late_step(n, req):
            time.sleep(0.02)
            body = pb.StepReply()
            body.header.server_epoch = self.epoch
            return pb.FastReply(call_id=req.call_id,
                                reply=body.SerializeToString()).SerializeToString()
        self.script = [late_step] * 3
        f = self.client._fast
        f.server_on_cpu = False  # the stand-in stands for a GPU server
        self.assertIsNone(f._wake_after("Step"))  # no round trip yet: the plain spin
        msg = f.frame("Step", pb.StepRequest())
        waits = ("fast_socket_replied_before_spin", "fast_socket_polled",
                 "fast_socket_polled_then_slept")
        for i in range(3):
            before = [self.client.stats[k] for k in waits]
            reply = f.call("Step", msg, self.client.session_id, None, None)
            self.assertEqual(reply.header.server_epoch, self.epoch)
            counted = [self.client.stats[k] - b for k, b in zip(waits, before)]
            # Every reply counted once: the first after the plain spin ran out, the later ones
            # by the sleep-then-poll path (which of its three outcomes depends on the timing).
            self.assertEqual(sum(counted), 1)
            if i == 0:
                self.assertEqual(counted, [0, 0, 1])
            last = f._last_round_trip["Step"]
            self.assertGreaterEqual(last, 0.02)
            self.assertEqual(f._wake_after("Step"),
                             last - fs.AUTO_SPIN_MAX if last <= fs.AUTO_WAKE_MAX else None)
        f._last_round_trip["Step"] = 0.06  # slower than AUTO_WAKE_MAX: slept for throughout
        self.assertIsNone(f._wake_after("Step"))
        self.assertEqual(f._spin_for("Step"), 0.0)

    def test_server_errors_keep_the_connection(self):
        def error(code):
            return lambda n, req: pb.FastReply(call_id=req.call_id, code=code,
                                               message="no room").SerializeToString()
        self.script = [error(8), error(99), lambda n, req: self.keep_alive_reply(req)]
        before = self.snapshot(self.client)
        self.assertKeepAliveFails(grpc.StatusCode.RESOURCE_EXHAUSTED, r"^no room$")
        self.assertKeepAliveFails(grpc.StatusCode.UNKNOWN, r"^no room$")
        self.assertEqual(self.client.keep_alive(), 7)
        self.assertCounts(self.client, before, calls=3, connects=1)

    def test_a_connection_closed_mid_call_is_unavailable_and_the_next_call_reconnects(self):
        self.script = [lambda n, req: None, lambda n, req: self.keep_alive_reply(req)]
        self.assertKeepAliveFails(grpc.StatusCode.UNAVAILABLE,
                                  r"^fast socket .*: the server closed the connection$")
        self.assertEqual(self.client.keep_alive(), 7)
        self.assertEqual(self.fake.connections, 2)

    def test_an_idle_connection_the_server_closed_is_replaced_silently(self):
        self.script = [lambda n, req: self.keep_alive_reply(req, lease=6),
                       lambda n, req: ("close-after", self.keep_alive_reply(req)),
                       lambda n, req: self.keep_alive_reply(req, lease=8)]
        self.assertEqual(self.client.keep_alive(), 6)
        self.assertEqual(self.client.keep_alive(), 7)  # the connection checked idle once before
        time.sleep(0.2)  # the close reaches the client's idle connection
        self.assertEqual(self.client.keep_alive(), 8)
        self.assertEqual(self.fake.connections, 2)

    def test_protocol_violations_are_internal_and_drop_the_connection(self):
        def oversize(n, req):
            body = pb.KeepAliveReply()
            body.header.backend = "x" * 66000
            reply = pb.FastReply(call_id=req.call_id, reply=body.SerializeToString())
            return reply.SerializeToString()

        def wrong_op(n, req):  # a hello's reply to a call
            return pb.FastReply(call_id=req.call_id,
                                hello=pb.FastHelloReply(lease_seconds=5)).SerializeToString()

        def not_the_reply(n, req):  # `reply` bytes that are not a KeepAliveReply
            return pb.FastReply(call_id=req.call_id, reply=b"\xff" * 4).SerializeToString()

        cases = [(lambda n, req: self.keep_alive_reply(req, call_id=req.call_id + 1000),
                  r"reply call_id \d+ to call \d+"),
                 (oversize, r"a reply frame over 65536 bytes"),
                 (lambda n, req: b"\xff" * 8, r"undecodable reply frame \(8 bytes\)"),
                 (not_the_reply, r"undecodable reply frame \(\d+ bytes\)"),
                 (wrong_op, r"reply carries hello, not reply")]
        self.script = [behave for behave, _ in cases]
        for i, (_, pattern) in enumerate(cases):
            with self.subTest(pattern):
                self.assertKeepAliveFails(grpc.StatusCode.INTERNAL, pattern)
                self.assertEqual(self.fake.connections, i + 1)
        self.script = [lambda n, req: self.keep_alive_reply(req)]
        self.assertEqual(self.client.keep_alive(), 7)
        self.assertEqual(self.fake.connections, len(cases) + 1)

    def replace_client(self, **kwargs):
        """A client of another configuration; the first one closes after the test."""
        self.addCleanup(self.client.close)
        self.client = fp4q.Client(SERVER.target, fast_socket=self.path, **kwargs)

    def test_a_missed_deadline_is_deadline_exceeded(self):
        self.replace_client(timeout=0.5)
        self.client.open_session()
        self.script = [lambda n, req: "silent", lambda n, req: self.keep_alive_reply(req)]
        start = time.monotonic()
        self.assertKeepAliveFails(grpc.StatusCode.DEADLINE_EXCEEDED, r"^Deadline Exceeded$")
        self.assertLess(time.monotonic() - start, 5)
        self.assertLessEqual(self.fake.requests[-1][1].timeout_micros, 500000)
        self.assertEqual(self.client.keep_alive(), 7)  # on a new connection
        self.assertEqual(self.fake.connections, 2)

    def test_without_a_timeout_calls_wait_and_carry_no_deadline(self):
        self.replace_client()
        self.client.open_session()

        def slow(n, req):
            time.sleep(0.3)
            return self.keep_alive_reply(req)

        self.script = [slow, lambda n, req: self.keep_alive_reply(req, lease=8)]
        self.assertEqual(self.client.keep_alive(), 7)
        self.assertEqual(self.client.keep_alive(), 8)
        (_, hello), (_, first), (_, second) = self.fake.requests
        self.assertEqual((hello.timeout_micros, first.timeout_micros, second.timeout_micros),
                         (0, 0, 0))
        self.assertEqual(self.fake.connections, 1)


if __name__ == "__main__":
    unittest.main()
