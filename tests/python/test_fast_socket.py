"""fp4q.Client(fast_socket=...) against a live CPU-backend `fp4qd --fast_socket`: the same results
and errors as over gRPC, busy polling, the fallback to gRPC, and every method but OpenSession
over the fast socket. Sessions, hellos, tokens and restarts: test_fast_socket_sessions.py; the
raw protocol and the client's checks of it: test_fast_socket_protocol.py."""

import os
import threading
import time
import unittest

import grpc
import torch

import fast_socket_testing
import fp4q
import fp4q.optim
import fp4q_testing
from fast_socket_testing import Counting, randn

# SERVER, FAST_PATH, GRPC (gRPC only) and FAST (the fast socket), set by setUpModule.
setUpModule, tearDownModule = fast_socket_testing.module_fixture(globals())


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
            polled = ("fast_socket_polled", "fast_socket_polled_then_slept")
            for kwargs in (dict(), dict(rounding="stochastic", seed=3)):
                before = self.snapshot(spinning)
                waits = [spinning.stats[k] for k in polled]
                f = spinning.quantize(x, **kwargs)
                self.assertCounts(spinning, before, calls=1, connects=1 if not kwargs else 0)
                self.assertSameQuantized(f.rowwise, GRPC.quantize(x, **kwargs).rowwise)
                # The reply was busy-polled for (within the 2 ms or after them; the hello not).
                self.assertEqual(sum(spinning.stats[k] for k in polled) - sum(waits), 1)
            # A reply slower than the spin (a 1 us spin) still arrives, by the blocking path
            # (counted as slept for, unless the thread lost its core between the send and its
            # first recv and found the reply there).
            spinning._fast._spin = 1e-6
            waits = [spinning.stats[k] for k in polled]
            self.assertSameTensor(spinning.qdq(x), GRPC.qdq(x))
            self.assertEqual(sum(spinning.stats[k] for k in polled) - sum(waits), 1)

    def test_default_spin_polls_only_for_steps_expected_within_its_bound(self):
        from fp4q import _fast_socket as fs
        with fp4q.Client(SERVER.target, timeout=60, fast_socket=FAST_PATH) as c:
            f = c._fast
            self.assertIsNone(f._spin)
            self.assertFalse(f.server_on_cpu)  # until a reply says so
            self.assertEqual((f._spin_for("Quantize"), f._spin_for("Step")), (0.0, 2e-3))
            f._last_round_trip["Step"] = 0.6e-3
            self.assertEqual((f._spin_for("Step"), f._spin_for("UpdateWeight")), (1.2e-3, 2e-3))
            f._last_round_trip["Step"] = 1.5e-3
            self.assertEqual(f._spin_for("Step"), fs.AUTO_SPIN_MAX)
            f._last_round_trip["Step"] = 2.5e-3  # a step too long to poll for: it sleeps
            self.assertEqual(f._spin_for("Step"), 0.0)
            c.quantize(randn(8, 32, seed=9))
            self.assertNotIn("Quantize", f._last_round_trip)  # only the polled rpcs are timed
            self.assertFalse(f.server_on_cpu)  # a Quantize's header does not count
            # This server's backend is the CPU one: its steps need this host's cores, so its
            # replies are slept for (learnt from ServerInfo, or a polled rpc's reply header).
            c.server_info()
            self.assertTrue(f.server_on_cpu)
            self.assertEqual(f._spin_for("Step"), 0.0)
            self.assertEqual((c.stats["fast_socket_polled"],
                              c.stats["fast_socket_polled_then_slept"]), (0, 0))
        with fp4q.Client(SERVER.target, timeout=60, fast_socket=FAST_PATH,
                         fast_socket_spin_us=0) as c:
            self.assertEqual((c._fast._spin_for("Step"), c._fast._spin_for("Quantize")),
                             (0.0, 0.0))
        with fp4q.Client(SERVER.target, timeout=60, fast_socket=FAST_PATH,
                         fast_socket_spin_us=250) as c:
            self.assertEqual((c._fast._spin_for("Step"), c._fast._spin_for("Quantize")),
                             (250e-6, 250e-6))

    def test_bad_spin_values_are_refused(self):
        for bad in (-1, 1000001, 1.5, True, "10"):
            with self.subTest(bad=bad), self.assertRaises(fp4q.ClientArgumentError) as cm:
                fp4q.Client(SERVER.target, fast_socket=FAST_PATH, fast_socket_spin_us=bad)
            self.assertIn("fast_socket_spin_us", str(cm.exception))


class HeadsUpTest(Counting):
    """Heads-ups before steps (fp4q.Client(fast_socket_heads_up=...)): sent after an idle gap
    where fp4qd takes them, and the steps' results those of a gRPC client's."""

    @staticmethod
    def steps(client, prefix, gap_s=0.005, count=4):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(32, 16, bias=False),
                                    torch.nn.Linear(16, 32, bias=False))
        opt = fp4q.optim.SGD(model.parameters(), lr=0.1, client=client, name_prefix=prefix)
        for i in range(count):
            for p in model.parameters():
                p.grad = randn(*p.shape, seed=40 + i)
            time.sleep(gap_s)  # the forward and backward passes of a training loop
            opt.step()
        return [p.detach().clone() for p in model.parameters()]

    def test_steps_after_a_gap_send_heads_ups_where_fp4qd_takes_them(self):
        path = fp4q_testing.socket_path("heads-up.sock")
        # A fixed spin: fp4qd's fast socket threads busy-poll, on the CPU backend too.
        server = fp4q_testing.Server("--fast_socket", path, "--fast_socket_spin_us=20")
        try:
            with fp4q.Client(server.target, timeout=60, fast_socket=path) as fast, \
                    fp4q.Client(server.target, timeout=60) as grpc_only:
                self.assertEqual(fast.server_info().limits.fast_socket_max_heads_up_micros, 2000)
                before = self.snapshot(fast)
                got = self.steps(fast, "fast/")
                self.assertEqual(fast.stats["fast_socket_heads_ups"], 4)  # one per step
                self.assertEqual(fast.stats["fast_socket_connects"] -
                                 before["fast_socket_connects"], 1)
                for a, b in zip(got, self.steps(grpc_only, "grpc/")):
                    self.assertSameTensor(a, b)
                # A connection idle for less than HEADS_UP_AFTER gets none (its fp4qd thread
                # still busy-polls from the call before).
                from fp4q import _fast_socket
                after = _fast_socket.HEADS_UP_AFTER
                _fast_socket.HEADS_UP_AFTER = 60.0
                try:
                    self.steps(fast, "tight/", count=2)
                finally:
                    _fast_socket.HEADS_UP_AFTER = after
                self.assertEqual(fast.stats["fast_socket_heads_ups"], 4)
            with fp4q.Client(server.target, timeout=60, fast_socket=path,
                             fast_socket_heads_up=False) as off:
                self.steps(off, "off/")
                self.assertEqual(off.stats["fast_socket_heads_ups"], 0)
        finally:
            server.stop()

    def test_no_heads_up_where_fp4qd_takes_none(self):
        # This module's fp4qd runs the CPU backend with the automatic spin: its threads never
        # busy-poll, so it takes no heads-ups and the client sends none.
        with fp4q.Client(SERVER.target, timeout=60, fast_socket=FAST_PATH) as c:
            self.assertEqual(c.server_info().limits.fast_socket_max_heads_up_micros, 0)
            self.steps(c, "none/", count=2)
            self.assertEqual(c.stats["fast_socket_heads_ups"], 0)
            self.assertEqual(c._fast.limits.heads_up_micros, 0)


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
            self.assertEqual(c._fast.limits, (65536, 4096, 32, 0))  # as the server reports them

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


if __name__ == "__main__":
    unittest.main()
