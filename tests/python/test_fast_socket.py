"""fp4q.Client(fast_socket=...) against a live CPU-backend `fp4qd --fast_socket`: the same results
and errors as over gRPC, the fallback to gRPC, sessions and hellos; the raw protocol (hostile
frames); and the client's checks of the protocol against a scripted stand-in server."""

import os
import shutil
import socket
import threading
import time
import unittest

import grpc
import torch

import fp4q
import fp4q_testing
from fp4q._messages import METHODS, pb

SERVER = None
FAST_PATH = None
GRPC = None  # a client on gRPC only
FAST = None  # a client whose tensor calls take the fast socket
_DIRS = []


def setUpModule():
    global SERVER, FAST_PATH, GRPC, FAST
    FAST_PATH = fp4q_testing.socket_path("fast.sock")
    _DIRS.append(os.path.dirname(FAST_PATH))
    # A long lease: the keep-alive threads (every lease / 3) stay out of the counted calls.
    SERVER = fp4q_testing.Server("--session_lease_s", "600", "--fast_socket", FAST_PATH)
    GRPC = fp4q.Client(SERVER.target, timeout=60)
    FAST = fp4q.Client(SERVER.target, timeout=60, fast_socket=FAST_PATH)
    FAST.qdq(torch.ones(2, 16))  # its session and first connection: tests count from here


def tearDownModule():
    FAST.close()
    GRPC.close()
    SERVER.stop()
    for d in _DIRS:
        shutil.rmtree(d, ignore_errors=True)


def randn(rows, cols, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, cols, generator=g) * scale


def close_session_over_grpc(target, session_id):
    """CloseSession for `session_id`, sent outside any fp4q.Client (the session vanishes under
    the client that opened it, as when its lease runs out)."""
    path, req, rep = METHODS["CloseSession"]
    with grpc.insecure_channel(target) as channel:
        call = channel.unary_unary(path, request_serializer=req.SerializeToString,
                                   response_deserializer=rep.FromString)
        call(req(), metadata=(("fp4q-session", session_id),), timeout=30)


class Counting(unittest.TestCase):
    """assertCounts: what a block did to a client's fast-socket counters."""

    KEYS = ("fast_socket_calls", "fast_socket_fallbacks", "fast_socket_connects")

    def snapshot(self, client):
        return {k: client.stats[k] for k in self.KEYS}

    def assertCounts(self, client, before, calls=0, fallbacks=0, connects=0):
        after = self.snapshot(client)
        self.assertEqual({k: after[k] - before[k] for k in self.KEYS},
                         {"fast_socket_calls": calls, "fast_socket_fallbacks": fallbacks,
                          "fast_socket_connects": connects})

    def assertSameQuantized(self, a, b):
        self.assertEqual((a.rows, a.cols, a.format, a.block, a.scale_layout),
                         (b.rows, b.cols, b.format, b.block, b.scale_layout))
        self.assertEqual((a.global_amax, a.s_enc), (b.global_amax, b.s_enc))
        for name in ("codes", "scales"):
            x, y = getattr(a, name), getattr(b, name)
            self.assertEqual((x.dtype, tuple(x.shape)), (y.dtype, tuple(y.shape)), name)
            self.assertEqual(x.numpy().tobytes(), y.numpy().tobytes(), name)

    def assertSameTensor(self, a, b):
        self.assertEqual((a.dtype, tuple(a.shape)), (b.dtype, tuple(b.shape)))
        self.assertEqual(a.contiguous().view(torch.uint8).numpy().tobytes(),
                         b.contiguous().view(torch.uint8).numpy().tobytes())

    def assertSameError(self, fn, *args, **kwargs):
        """fn(FAST, ...) and fn(GRPC, ...) both fail the same way; returns the fast one's error."""
        errors = []
        for client in (GRPC, FAST):
            with self.assertRaises(fp4q.Fp4qError) as cm:
                fn(client, *args, **kwargs)
            errors.append(cm.exception)
        g, f = errors
        self.assertIs(type(f), type(g))
        self.assertEqual((f.code, f.message, f.rpc, str(f)), (g.code, g.message, g.rpc, str(g)))
        return f


class ResultParityTest(Counting):
    def test_quantize_is_byte_identical(self):
        cases = [dict(), dict(outputs="both", block="16x16"), dict(scale_layout="swizzled"),
                 dict(rounding="stochastic", seed=7, step=3), dict(amax=10.0),
                 dict(outputs="columnwise", rht="default"), dict(format="mxfp4")]
        x = randn(32, 64, seed=1, scale=2.0)
        for kwargs in cases:
            for dtype in (torch.float32, torch.bfloat16):
                with self.subTest(dtype=dtype, **kwargs):
                    before = self.snapshot(FAST)
                    f = FAST.quantize(x.to(dtype), **kwargs)
                    self.assertCounts(FAST, before, calls=1)
                    g = GRPC.quantize(x.to(dtype), **kwargs)
                    for which in ("rowwise", "columnwise"):
                        self.assertEqual(getattr(f, which) is None, getattr(g, which) is None)
                        if getattr(g, which) is not None:
                            self.assertSameQuantized(getattr(f, which), getattr(g, which))
        self.assertEqual(FAST.last_header.backend, "cpu")
        self.assertEqual(FAST.last_header.server_epoch, GRPC.last_header.server_epoch)

    def test_qdq_dequantize_matmul_are_byte_identical(self):
        x, w = randn(16, 64, seed=2), randn(24, 64, seed=3, scale=0.1)
        before = self.snapshot(FAST)
        for dtype in (torch.float32, torch.bfloat16):
            self.assertSameTensor(FAST.qdq(x.to(dtype)), GRPC.qdq(x.to(dtype)))
            self.assertEqual(FAST.last_qdq_amax, GRPC.last_qdq_amax)
        self.assertSameTensor(FAST.qdq(x, out_dtype=torch.bfloat16),
                              GRPC.qdq(x, out_dtype=torch.bfloat16))
        qx, qw = GRPC.quantize(x).rowwise, GRPC.quantize(w).rowwise
        for dtype in (torch.float32, torch.bfloat16):
            self.assertSameTensor(FAST.dequantize(qx, dtype), GRPC.dequantize(qx, dtype))
            self.assertSameTensor(FAST.matmul(qx, qw, dtype), GRPC.matmul(qx, qw, dtype))
        out = torch.full((16, 64), float("nan"))
        self.assertIs(FAST.dequantize(qx, out=out), out)
        self.assertSameTensor(out, GRPC.dequantize(qx))
        self.assertCounts(FAST, before, calls=8)

    def test_residual_steps_are_shared_by_both_transports(self):
        key = "fast-ef-%d" % os.getpid()
        x = randn(16, 32, seed=4)
        ref_key = key + "-grpc"
        for step, client in ((1, FAST), (2, GRPC), (3, FAST)):
            self.assertSameTensor(client.qdq(x, residual_key=key, step=step),
                                  GRPC.qdq(x, residual_key=ref_key, step=step))
        err = self.assertSameError(lambda c: c.qdq(x, residual_key=key, step=3))
        self.assertEqual(err.code, grpc.StatusCode.ALREADY_EXISTS)
        GRPC.reset_residual(key)
        GRPC.reset_residual(ref_key)

    def test_update_weight_is_byte_identical(self):
        pid = os.getpid()
        names = {"fast": "fast-w-%d" % pid, "grpc": "grpc-w-%d" % pid}
        w0 = randn(32, 64, seed=5)
        for name in names.values():
            GRPC.create_weight(name, w0, block="16x16", error_feedback=True)
        try:
            g = randn(32, 64, seed=6)
            before = self.snapshot(FAST)
            for step in (1, 2):
                f = FAST.update_weight(names["fast"], step, g, lr=0.05, return_dequantized=True)
                r = GRPC.update_weight(names["grpc"], step, g, lr=0.05, return_dequantized=True)
                self.assertEqual((f.applied, f.last_step, f.global_amax),
                                 (r.applied, r.last_step, r.global_amax))
                self.assertTrue(f.applied)
                self.assertSameTensor(f.dequantized, r.dequantized)
            again = FAST.update_weight(names["fast"], 2, g, lr=0.05)
            self.assertEqual((again.applied, again.last_step, again.dequantized), (False, 2, None))
            d = FAST.update_weight(names["fast"], 3, g, kind="delta")
            self.assertEqual((d.applied, d.last_step), (True, 3))
            self.assertCounts(FAST, before, calls=4)
            GRPC.update_weight(names["grpc"], 3, g, kind="delta")
            self.assertSameTensor(GRPC.get_weight(names["fast"]).dequantized,
                                  GRPC.get_weight(names["grpc"]).dequantized)
        finally:
            for name in names.values():
                GRPC.delete_weight(name)

    def test_concurrent_threads_get_their_own_results(self):
        inputs = [randn(16, 32, seed=100 + i) for i in range(24)]
        expected = [GRPC.qdq(x) for x in inputs]
        got = [None] * len(inputs)
        errors = []
        before = self.snapshot(FAST)

        def work(k):
            try:
                for i in range(k, len(inputs), 4):
                    got[i] = FAST.qdq(inputs[i])
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        self.assertEqual(errors, [])
        for g, e in zip(got, expected):
            self.assertSameTensor(g, e)
        after = self.snapshot(FAST)
        self.assertEqual(after["fast_socket_calls"] - before["fast_socket_calls"], len(inputs))
        self.assertLessEqual(after["fast_socket_connects"] - before["fast_socket_connects"], 4)


class SpinTest(Counting):
    def test_busy_polling_clients_get_the_same_results(self):
        x = randn(32, 64, seed=5)
        with fp4q.Client(SERVER.target, timeout=60, fast_socket=FAST_PATH,
                         fast_socket_spin_us=2000) as spinning:
            for kwargs in (dict(), dict(rounding="stochastic", seed=3)):
                before = self.snapshot(spinning)
                f = spinning.quantize(x, **kwargs)
                self.assertCounts(spinning, before, calls=1, connects=1 if not kwargs else 0)
                self.assertSameQuantized(f.rowwise, GRPC.quantize(x, **kwargs).rowwise)
            # A reply slower than the spin (a 1 us spin) still arrives, by the blocking path.
            spinning._fast._spin = 1e-6
            self.assertSameTensor(spinning.qdq(x), GRPC.qdq(x))

    def test_bad_spin_values_are_refused(self):
        for bad in (-1, 1000001, 1.5, True, "10"):
            with self.subTest(bad=bad), self.assertRaises(fp4q.ClientArgumentError) as cm:
                fp4q.Client(SERVER.target, fast_socket=FAST_PATH, fast_socket_spin_us=bad)
            self.assertIn("fast_socket_spin_us", str(cm.exception))


class ErrorParityTest(Counting):
    def test_server_errors_match_grpc(self):
        qa = GRPC.quantize(randn(8, 32, seed=7)).rowwise
        qb = GRPC.quantize(randn(8, 64, seed=8)).rowwise
        cases = [
            ("bad shape", grpc.StatusCode.INVALID_ARGUMENT,
             lambda c: c.quantize(torch.ones(4, 15))),
            ("rank 3", grpc.StatusCode.INVALID_ARGUMENT,
             lambda c: c.quantize(torch.ones(2, 4, 16))),
            ("unknown format", grpc.StatusCode.INVALID_ARGUMENT,
             lambda c: c.qdq(torch.ones(4, 16), format=9)),
            ("matmul K mismatch", grpc.StatusCode.INVALID_ARGUMENT, lambda c: c.matmul(qa, qb)),
            ("unknown weight", grpc.StatusCode.NOT_FOUND,
             lambda c: c.update_weight("no-such-weight-%d" % os.getpid(), 1, torch.ones(16, 16))),
        ]
        for what, code, fn in cases:
            with self.subTest(what):
                before = self.snapshot(FAST)
                err = self.assertSameError(fn)
                self.assertEqual(err.code, code)
                self.assertCounts(FAST, before, calls=1)

    def test_weight_errors_match_grpc(self):
        name = "fast-err-w-%d" % os.getpid()
        GRPC.create_weight(name, torch.ones(16, 32))
        try:
            FAST.update_weight(name, 5, torch.ones(16, 32), lr=0.1)
            err = self.assertSameError(lambda c: c.update_weight(name, 4, torch.ones(16, 32)))
            self.assertEqual(err.code, grpc.StatusCode.FAILED_PRECONDITION)
            err = self.assertSameError(lambda c: c.update_weight(name, 6, torch.ones(16, 16)))
            self.assertEqual(err.code, grpc.StatusCode.INVALID_ARGUMENT)
        finally:
            GRPC.delete_weight(name)

    def test_client_side_refusals_never_reach_a_transport(self):
        before = self.snapshot(FAST)
        err = self.assertSameError(lambda c: c.quantize(torch.ones(4, 16), rounding="truncate"))
        self.assertIsInstance(err, fp4q.ClientArgumentError)
        self.assertCounts(FAST, before)


class FallbackTest(Counting):
    def test_a_request_over_a_frame_goes_by_grpc(self):
        x = randn(256, 256, seed=9)  # 256 KiB inline
        before = self.snapshot(FAST)
        self.assertSameQuantized(FAST.quantize(x).rowwise, GRPC.quantize(x).rowwise)
        self.assertSameTensor(FAST.qdq(x), GRPC.qdq(x))
        self.assertCounts(FAST, before, fallbacks=2)

    def test_frame_boundary(self):
        # A reply fits when its tensor bytes + the proto's FAST_SOCKET_REPLY_MARGIN_BYTES (4096)
        # fit in the frame less fp4qd's 32 bytes for the FastReply around it: 61408 bytes.
        fits = randn(59, 256, seed=10)    # 60416 input bytes, 60416 output bytes
        reply_over = randn(60, 256, seed=12)  # 61440 output bytes: 32 over
        over = randn(64, 256, seed=11)    # 65536 input bytes: the frame is larger
        before = self.snapshot(FAST)
        self.assertSameTensor(FAST.qdq(fits), GRPC.qdq(fits))
        self.assertCounts(FAST, before, calls=1)
        for x in (reply_over, over):
            before = self.snapshot(FAST)
            self.assertSameTensor(FAST.qdq(x), GRPC.qdq(x))
            self.assertCounts(FAST, before, fallbacks=1)

    def test_a_reply_over_a_frame_goes_by_grpc(self):
        # 9 KiB of codes and scales in, 64 KiB of f32 out: the reply would not fit in a frame.
        q = GRPC.quantize(randn(128, 128, seed=12)).rowwise
        before = self.snapshot(FAST)
        self.assertSameTensor(FAST.dequantize(q), GRPC.dequantize(q))
        self.assertCounts(FAST, before, fallbacks=1)
        before = self.snapshot(FAST)
        self.assertSameTensor(FAST.dequantize(q, torch.bfloat16),
                              GRPC.dequantize(q, torch.bfloat16))
        self.assertCounts(FAST, before, calls=1)

    def test_an_output_of_a_weight_of_unknown_size_is_tried_then_sent_by_grpc(self):
        small, big = "fast-fb-w-%d" % os.getpid(), "fast-fb-big-%d" % os.getpid()
        GRPC.create_weight(small, randn(16, 32, seed=13))
        GRPC.create_weight(big, randn(128, 128, seed=14))  # 64 KiB of f32 DQ(W)
        try:
            before = self.snapshot(FAST)
            self.assertSameTensor(FAST.dequantize(small), GRPC.dequantize(small))
            self.assertSameTensor(FAST.matmul(small, small), GRPC.matmul(small, small))
            self.assertCounts(FAST, before, calls=2)
            # fp4qd refuses the reply before doing the work; the call goes again by gRPC.
            before = self.snapshot(FAST)
            self.assertSameTensor(FAST.dequantize(big), GRPC.dequantize(big))
            st = FAST.get_weight(big, quantized=True, residual=False)
            self.assertSameTensor(st.dequantized, GRPC.dequantize(big))
            self.assertCounts(FAST, before, calls=2, fallbacks=2)
            before = self.snapshot(FAST)
            info = FAST.get_weight(big, dequantized=False).info  # the WeightInfo alone
            self.assertEqual(list(info.shape), [128, 128])
            names = {t.name for t in FAST.list_tensors()}
            self.assertLessEqual({small, big}, names)
            self.assertCounts(FAST, before, calls=2)
        finally:
            GRPC.delete_weight(small)
            GRPC.delete_weight(big)


class EveryMethodTest(Counting):
    """Every method but OpenSession travels on the fast socket, with gRPC's answers."""

    def test_weights_steps_groups_and_namespaces_go_fast(self):
        pid = os.getpid()
        with fp4q.Client(SERVER.target, timeout=60, fast_socket=FAST_PATH,
                         namespace="fast-ns-%d" % pid) as c, \
                fp4q.Client(SERVER.target, timeout=60, namespace="grpc-ns-%d" % pid) as g:
            w0, grad = randn(16, 64, seed=30), randn(16, 64, seed=31)
            spec = fp4q.OptimizerSpec(kind="sgd", momentum=True)
            for client in (c, g):
                client.open_session()
            before = self.snapshot(c)
            for client in (c, g):
                info = client.create_weight("w", w0, error_feedback=True, optimizer=spec)
                self.assertEqual((list(info.shape), info.options.optimizer.momentum),
                                 ([16, 64], True))
                self.assertEqual(client.join_group("grp", 1, 0), 1)
            hyper = [fp4q.SgdHyperparameters(lr=0.1, momentum=0.9)]
            outs = []
            for step in (1, 2):
                for client in (c, g):
                    r = client.step(step, [fp4q.StepItem("w", grad, return_dequantized=True)],
                                    hyper, replica=("grp", 0))
                    self.assertEqual((r.world_size, r.items[0].applied, r.items[0].last_step),
                                     (1, True, step))
                    outs.append(r.items[0].dequantized)
            self.assertSameTensor(outs[2], outs[3])
            self.assertSameTensor(outs[0], outs[1])
            states = [client.get_weight("w", optimizer_state=True) for client in (c, g)]
            self.assertSameTensor(states[0].optimizer_state.moments["momentum_buffer"],
                                  states[1].optimizer_state.moments["momentum_buffer"])
            self.assertEqual(states[0].optimizer_state.steps, 2)
            for client in (c, g):
                client.reset_optimizer("w", spec)
                client.leave_group("grp")
                self.assertEqual([t.name for t in client.list_tensors()], ["w"])
                self.assertEqual(client.delete_namespace(), 1)
            # create, join, 2 steps, get, reset, leave, list, delete: all on the fast socket,
            # one connection.
            self.assertCounts(c, before, calls=9, connects=1)
            self.assertEqual(c.server_info().limits.fast_socket_max_frame_bytes, 65536)
            self.assertEqual(c._fast.limits, (65536, 4096, 32))  # as the server reports them

    def test_a_step_whose_reply_cannot_fit_goes_by_grpc(self):
        name = "fast-step-big-%d" % os.getpid()
        GRPC.create_weight(name, randn(64, 256, seed=32))
        try:
            grad = randn(64, 256, seed=33) * 0  # 64 KiB in: the request itself does not fit
            small = randn(64, 256, seed=34).to(torch.bfloat16)  # 32 KiB in, 64 KiB f32 out
            before = self.snapshot(FAST)
            FAST.step(1, [fp4q.StepItem(name, grad)], [fp4q.SgdHyperparameters(lr=0.1)])
            r = FAST.step(2, [fp4q.StepItem(name, small, return_dequantized=True)],
                          [fp4q.SgdHyperparameters(lr=0.1)])
            self.assertEqual((r.items[0].applied, tuple(r.items[0].dequantized.shape)),
                             (True, (64, 256)))
            self.assertCounts(FAST, before, fallbacks=2)
            before = self.snapshot(FAST)
            r = FAST.step(3, [fp4q.StepItem(name, small)], [fp4q.SgdHyperparameters(lr=0.1)])
            self.assertCounts(FAST, before, calls=1)  # 32 KiB in, nothing inline out
        finally:
            GRPC.delete_weight(name)


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
            # gRPC's channel fails its first call after the server went away (UNAVAILABLE,
            # "Broken pipe"), fast socket or not: wait until it is up again. The health check
            # carries no ReplyHeader, so the client does not learn of the restart here.
            deadline = time.monotonic() + 30
            while True:
                try:
                    self.assertEqual(c.health(), "SERVING")
                    break
                except fp4q.Fp4qError as e:
                    if e.code != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
            before = self.snapshot(c)
            # The old session died with the server: hello NOT_FOUND, a new session, sent once.
            self.assertSameTensor(c.qdq(x), expected)
            self.assertNotIn(c.session_id, (None, old_session))
            self.assertCounts(c, before, calls=1, connects=1)
        finally:
            c.close()
            server.stop()
            shutil.rmtree(folder, ignore_errors=True)


class RawConnection:
    """A plain SOCK_SEQPACKET connection to a fast socket, frames in and out."""

    def __init__(self, path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock.settimeout(30)
        self.sock.connect(path)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.sock.close()

    def send_bytes(self, data):
        return self.sock.send(data)

    def reply(self):
        data = self.sock.recv(65537)
        if not data:
            raise AssertionError("the server closed the connection")
        return pb.FastReply.FromString(data)

    def call(self, request):
        self.send_bytes(request.SerializeToString())
        return self.reply()


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
        self.script = [lambda n, req: ("close-after", self.keep_alive_reply(req)),
                       lambda n, req: self.keep_alive_reply(req, lease=8)]
        self.assertEqual(self.client.keep_alive(), 7)
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
