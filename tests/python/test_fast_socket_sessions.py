"""fp4q.Client(fast_socket=...)'s sessions against a live CPU-backend `fp4qd --fast_socket`: hellos,
new and vanished sessions, a missing socket, bearer tokens in metadata and hello, and a restarted
server reached again."""

import os
import shutil
import unittest

import grpc
import torch

import fast_socket_testing
import fp4q
import fp4q_testing
from fast_socket_testing import Counting, RawConnection, randn
from fp4q._messages import METHODS, pb

# SERVER, FAST_PATH, GRPC (gRPC only) and FAST (the fast socket), set by setUpModule.
setUpModule, tearDownModule = fast_socket_testing.module_fixture(globals())


def close_session_over_grpc(target, session_id):
    """CloseSession for `session_id`, sent outside any fp4q.Client (the session vanishes under
    the client that opened it, as when its lease runs out)."""
    path, req, rep = METHODS["CloseSession"]
    with grpc.insecure_channel(target) as channel:
        call = channel.unary_unary(path, request_serializer=req.SerializeToString,
                                   response_deserializer=rep.FromString)
        call(req(), metadata=(("fp4q-session", session_id),), timeout=30)


class SessionTest(Counting):
    def test_keep_alive_goes_over_the_fast_socket(self):
        FAST.qdq(torch.ones(2, 16))  # a session and a connection
        before = self.snapshot(FAST)
        self.assertEqual(FAST.keep_alive(), 600)
        self.assertEqual(FAST.last_header.backend, "cpu")
        self.assertCounts(FAST, before, calls=1)

    def test_the_first_call_opens_a_session_and_a_new_session_says_hello_again(self):
        c = fp4q.Client(SERVER.target, timeout=60, fast_socket=FAST_PATH)
        try:
            self.assertIsNone(c.session_id)
            before = self.snapshot(c)
            c.qdq(torch.ones(2, 16))
            first = c.session_id
            self.assertRegex(first, r"^[0-9a-f]{32}$")
            c.qdq(torch.ones(2, 16))
            self.assertCounts(c, before, calls=2, connects=1)
            before = self.snapshot(c)
            second = c.open_session()
            self.assertNotEqual(second, first)
            self.assertEqual(c.keep_alive(), 600)
            self.assertCounts(c, before, calls=1, connects=1)
            before = self.snapshot(c)
            self.assertEqual(c.close_session(), 0)  # over the fast socket: its own session
            self.assertIsNone(c.session_id)
            self.assertCounts(c, before, calls=1)
            before = self.snapshot(c)
            # No session to keep alive: gRPC answers, exactly as without a fast socket.
            with self.assertRaises(fp4q.Fp4qError) as cm:
                c.keep_alive()
            self.assertEqual(cm.exception.code, grpc.StatusCode.NOT_FOUND)
            self.assertCounts(c, before)
            c.qdq(torch.ones(2, 16))
            self.assertNotIn(c.session_id, (None, first, second))
            self.assertCounts(c, before, calls=1, connects=1)
        finally:
            c.close()

    def test_a_session_that_vanished_is_replaced_and_the_call_sent_once(self):
        c = fp4q.Client(SERVER.target, timeout=60, fast_socket=FAST_PATH)
        try:
            stale = c.open_session()
            close_session_over_grpc(SERVER.target, stale)
            x = randn(8, 32, seed=14)
            before = self.snapshot(c)
            self.assertSameTensor(c.qdq(x), GRPC.qdq(x))  # hello NOT_FOUND, new session
            self.assertNotIn(c.session_id, (None, stale))
            self.assertCounts(c, before, calls=1, connects=1)
        finally:
            c.close()

    def test_keep_alive_of_a_vanished_session_is_not_found(self):
        c = fp4q.Client(SERVER.target, timeout=60, fast_socket=FAST_PATH)
        try:
            stale = c.open_session()
            close_session_over_grpc(SERVER.target, stale)
            with self.assertRaises(fp4q.Fp4qError) as cm:
                c.keep_alive()
            self.assertEqual((cm.exception.code, cm.exception.rpc),
                             (grpc.StatusCode.NOT_FOUND, "KeepAlive"))
            self.assertRegex(cm.exception.message, r"^hello\.session_id: unknown or expired session")
            self.assertIsNone(c.session_id)  # forgotten: the next call opens another
        finally:
            c.close()

    def test_a_missing_socket_is_unavailable(self):
        missing = os.path.join(os.path.dirname(FAST_PATH), "absent.sock")
        c = fp4q.Client(SERVER.target, timeout=60, fast_socket=missing)
        try:
            with self.assertRaises(fp4q.Fp4qError) as cm:
                c.qdq(torch.ones(2, 16))
            self.assertEqual((cm.exception.code, cm.exception.rpc),
                             (grpc.StatusCode.UNAVAILABLE, "Qdq"))
            self.assertIn("fast socket %s: connect: " % missing, cm.exception.message)
        finally:
            c.close()


class AuthTest(Counting):
    @classmethod
    def setUpClass(cls):
        cls.sock = fp4q_testing.socket_path("auth-fast.sock")
        cls.dir = os.path.dirname(cls.sock)
        token_file = os.path.join(cls.dir, "token")
        cls.token = "s3cret-%d" % os.getpid()
        with open(token_file, "w") as f:
            f.write(cls.token + "\n")
        cls.server = fp4q_testing.Server("--fast_socket", cls.sock, "--auth_token_file", token_file)

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def test_the_token_goes_in_metadata_and_hello(self):
        c = fp4q.Client(self.server.target, timeout=60, fast_socket=self.sock,
                        bearer_token=self.token)
        try:
            before = self.snapshot(c)
            x = randn(8, 32, seed=15)
            self.assertSameTensor(c.qdq(x), GRPC.qdq(x))
            self.assertCounts(c, before, calls=1, connects=1)
        finally:
            c.close()
        c = fp4q.Client(self.server.target, timeout=60, fast_socket=self.sock)
        try:
            with self.assertRaises(fp4q.Fp4qError) as cm:
                c.qdq(torch.ones(2, 16))  # OpenSession over gRPC is refused first
            self.assertEqual(cm.exception.code, grpc.StatusCode.UNAUTHENTICATED)
        finally:
            c.close()

    def test_hello_with_a_wrong_token_is_unauthenticated(self):
        c = fp4q.Client(self.server.target, timeout=60, bearer_token=self.token)
        try:
            sid = c.open_session()
            with RawConnection(self.sock) as raw:
                reply = raw.call(pb.FastRequest(call_id=1, hello=pb.FastHello(
                    session_id=sid, auth_token="wrong")))
                self.assertEqual((reply.call_id, reply.code), (1, 16))
                self.assertEqual(reply.message, "hello.auth_token: missing or wrong bearer token")
                reply = raw.call(pb.FastRequest(call_id=2, hello=pb.FastHello(session_id=sid)))
                self.assertEqual((reply.call_id, reply.code), (2, 16))
                reply = raw.call(pb.FastRequest(call_id=3, hello=pb.FastHello(
                    session_id=sid, auth_token=self.token)))
                self.assertEqual((reply.call_id, reply.code, reply.HasField("hello")),
                                 (3, 0, True))
        finally:
            c.close()


class RestartTest(Counting):
    def test_a_restarted_server_is_unavailable_then_reached_again(self):
        fast = fp4q_testing.socket_path("restart-fast.sock")
        folder = os.path.dirname(fast)
        grpc_sock = os.path.join(folder, "grpc.sock")
        args = ("--unix_socket", grpc_sock, "--fast_socket", fast)
        server = fp4q_testing.Server(*args)
        c = fp4q.Client("unix:" + grpc_sock, timeout=30, fast_socket=fast)
        try:
            x = randn(8, 32, seed=16)
            expected = GRPC.qdq(x)
            self.assertSameTensor(c.qdq(x), expected)
            old_session = c.session_id
            server.stop()
            with self.assertRaises(fp4q.Fp4qError) as cm:
                c.qdq(x)
            self.assertEqual((cm.exception.code, cm.exception.rpc),
                             (grpc.StatusCode.UNAVAILABLE, "Qdq"))
            self.assertIn("fast socket %s: " % fast, cm.exception.message)
            server = fp4q_testing.Server(*args)
            # The health check carries no ReplyHeader: the client does not learn of the
            # restart from it.
            fp4q_testing.wait_serving(c)
            before = self.snapshot(c)
            # The old session died with the server: hello NOT_FOUND, a new session, sent once.
            self.assertSameTensor(c.qdq(x), expected)
            self.assertNotIn(c.session_id, (None, old_session))
            self.assertCounts(c, before, calls=1, connects=1)
        finally:
            c.close()
            server.stop()
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    unittest.main()
