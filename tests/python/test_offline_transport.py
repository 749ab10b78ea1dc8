"""The fast socket's client side without a server: frames byte for byte, reply bounds against
fp4qd's, and which transport a call takes and what it resends (fp4q._fast_frames,
fp4q._fast_socket, fp4q._transport)."""

import unittest

import grpc

import fp4q
from fp4q import _fast_frames, _fast_socket, _messages, _session, _transport
from fp4q._messages import pb


class FastFrameTest(unittest.TestCase):
    """The generic frames (proto/'s FastRequest / FastReply), byte for byte."""

    def test_frames_are_byte_for_byte_fast_requests(self):
        requests = {
            "Quantize": pb.QuantizeRequest(input=pb.Tensor(
                dtype=pb.DType.DTYPE_F32, shape=[2, 16], inline_data=bytes(range(128)))),
            "Dequantize": pb.DequantizeRequest(input=pb.QuantizedOperand(weight_name="w")),
            "Step": pb.StepRequest(step=2**40, items=[pb.StepItem(name="w")]),
            "UpdateWeight": pb.UpdateWeightRequest(name="w", step=2**40, lr=0.5),
            "KeepAlive": pb.KeepAliveRequest(),  # serializes to no bytes: no `request` field
            "DeleteNamespace": pb.DeleteNamespaceRequest(),
        }
        for rpc, req in requests.items():
            frame = _fast_frames.GENERIC.request(rpc, req.SerializeToString())
            bare = pb.FastRequest(method=rpc, request=req.SerializeToString())
            self.assertEqual(len(frame), bare.ByteSize())
            for call_id, timeout in ((1, 0), (127, 1), (128, 2**63), (2**64 - 1, 86400 * 10**6),
                                     (0, 0)):
                want = pb.FastRequest(call_id=call_id, timeout_micros=timeout, method=rpc,
                                      request=req.SerializeToString())
                with self.subTest(rpc=rpc, call_id=call_id, timeout=timeout):
                    self.assertEqual(frame.data(call_id, timeout), want.SerializeToString())
        self.assertEqual(_fast_frames.GENERIC.request("KeepAlive", b"").data(5, 0).hex(),
                         "0805" + "2209" + "KeepAlive".encode().hex())
        frame = _fast_socket.FastSocket("/nonexistent").frame("Quantize", requests["Quantize"])
        want = pb.FastRequest(call_id=3, method="Quantize",
                              request=requests["Quantize"].SerializeToString())
        self.assertEqual(frame.data(3, 0), want.SerializeToString())
        hello = _fast_frames.GENERIC.hello(pb.FastHello(session_id="s" * 200,
                                                        auth_token="t").SerializeToString())
        want = pb.FastRequest(call_id=9, hello=pb.FastHello(session_id="s" * 200, auth_token="t"))
        self.assertEqual(hello.data(9, 0), want.SerializeToString())

    def test_replies_parse_into_the_method_s_reply(self):
        ok = pb.FastReply(call_id=2**64 - 1, reply=pb.QdqReply(global_amax=3.0).SerializeToString())
        got = _fast_frames.GENERIC.parse(ok.SerializeToString(), "Qdq")
        self.assertEqual((got.call_id, got.code, got.carried), (2**64 - 1, 0, "reply"))
        self.assertEqual(got.payload, pb.QdqReply(global_amax=3.0))
        err = pb.FastReply(call_id=4, code=5, message="name: no weight 'w'")
        got = _fast_frames.GENERIC.parse(err.SerializeToString(), "Step")
        self.assertEqual((got.call_id, got.code, got.message, got.carried, got.payload),
                         (4, 5, "name: no weight 'w'", None, None))
        hello = pb.FastReply(call_id=1, hello=pb.FastHelloReply(lease_seconds=30))
        got = _fast_frames.GENERIC.parse(hello.SerializeToString(), "Step")
        self.assertEqual((got.carried, got.payload.lease_seconds), ("hello", 30))
        empty = _fast_frames.GENERIC.parse(b"", "KeepAlive")  # call_id 0, OK, an empty reply
        self.assertEqual((empty.call_id, empty.code, empty.carried), (0, 0, "reply"))
        self.assertEqual(empty.payload, pb.KeepAliveReply())
        with self.assertRaises(Exception):
            _fast_frames.GENERIC.parse(b"\xff" * 8, "Qdq")
        bad_reply = pb.FastReply(call_id=1, reply=b"\xff" * 8)
        with self.assertRaises(Exception):
            _fast_frames.GENERIC.parse(bad_reply.SerializeToString(), "Qdq")

    def test_every_method_but_open_session_is_served(self):
        fs = _fast_socket.FastSocket("/nonexistent")
        self.assertEqual(sorted(r for r in _messages.METHODS if not fs.serves(r)),
                         ["OpenSession"])
        self.assertEqual(set(_fast_frames.REPLY_BOUNDS), set(_messages.METHODS) - {"OpenSession"})

    def test_too_large_requests_are_refused(self):
        fs = _fast_socket.FastSocket("/nonexistent")
        big = pb.QdqRequest(input=pb.Tensor(dtype=pb.DType.DTYPE_U8, shape=[65536],
                                            inline_data=bytes(65536)))
        with self.assertRaises(_fast_socket.FrameTooLarge):
            fs.frame("Qdq", big)
        # The request fits but a 4-byte f32 output per input byte would not.
        out_big = pb.QdqRequest(input=pb.Tensor(dtype=pb.DType.DTYPE_F32, shape=[16384],
                                                inline_data=bytes(4 * 16384)))
        with self.assertRaises(_fast_socket.FrameTooLarge):
            fs.frame("Qdq", out_big)


class SendFrameTest(unittest.TestCase):
    """FastSocket._send_frame's switch of the socket's mode (a system call each way)."""

    class Sock:
        """A socket whose buffer is full (`full`) while it is non-blocking."""

        def __init__(self, timeout, full=False):
            self.timeout, self.full, self.timeouts, self.sent = timeout, full, [], []

        def gettimeout(self):
            return self.timeout

        def settimeout(self, t):
            self.timeouts.append(t)
            self.timeout = t

        def send(self, data):
            if self.full and self.timeout == 0.0:
                raise BlockingIOError(11, "Resource temporarily unavailable")
            self.sent.append(data)
            return len(data)

    def test_a_socket_left_non_blocking_sends_a_frame_it_takes_without_a_switch(self):
        fast = _fast_socket.FastSocket("/nowhere")
        frame = _fast_frames.GENERIC.request("KeepAlive", b"")
        # (the socket's mode after the last reply, its buffer full, deadline) -> the switches
        cases = [((0.0, False, None), []),  # after a busy-polled reply: none
                 ((0.0, True, None), [None]),  # full: blocking, as the call waits
                 ((0.0, True, 1e9), ["deadline"]),
                 ((None, False, None), []),  # blocking already (a sleeping wait, a new one)
                 ((None, False, 1e9), ["deadline"])]
        for (timeout, full, deadline), switches in cases:
            sock = self.Sock(timeout, full)
            conn = _fast_socket._Conn(sock, "s", 0)
            call_id = fast._send_frame(conn, "KeepAlive", frame, deadline, True)
            got = ["deadline" if t not in (None, 0.0) else t for t in sock.timeouts]
            self.assertEqual(got, switches)
            self.assertEqual(len(sock.sent), 1)  # the whole frame, once
            if deadline is None:
                self.assertEqual(sock.sent[0], frame.data(call_id, 0))


class ReplyBoundTest(unittest.TestCase):
    """What a reply may carry, against fp4qd's own bounds (server/op_table.cc) and limits."""

    def test_the_limits_are_the_proto_s_and_then_the_server_s(self):
        self.assertEqual(_fast_frames.DEFAULT_LIMITS, (65536, 4096, 32, 0))
        limits = _fast_frames.DEFAULT_LIMITS
        # fp4qd refuses bound + margin > frame - 32 (its reply limit): exactly at the edge.
        self.assertTrue(limits.reply_fits(65536 - 32 - 4096))
        self.assertFalse(limits.reply_fits(65536 - 32 - 4096 + 1))
        info = pb.ServerInfoReply(limits=pb.Limits(fast_socket_max_frame_bytes=32768,
                                                   fast_socket_reply_margin_bytes=8192))
        self.assertEqual(_fast_frames.Limits.from_server_info(info, limits),
                         (32768, 8192, 32, 0))
        framed = pb.ServerInfoReply(limits=pb.Limits(fast_socket_reply_framing_bytes=64))
        wider = _fast_frames.Limits.from_server_info(framed, limits)
        self.assertEqual(wider, (65536, 4096, 64, 0))
        self.assertTrue(wider.reply_fits(65536 - 64 - 4096))
        self.assertFalse(wider.reply_fits(65536 - 64 - 4096 + 1))
        self.assertEqual(_fast_frames.Limits.from_server_info(pb.ServerInfoReply(), limits),
                         limits)  # a server reporting none: kept
        # The heads-up limit is taken as reported: 0 (none, or an older fp4qd) means none.
        heads = pb.ServerInfoReply(limits=pb.Limits(fast_socket_max_heads_up_micros=2000))
        taking = _fast_frames.Limits.from_server_info(heads, limits)
        self.assertEqual(taking, (65536, 4096, 32, 2000))
        self.assertEqual(_fast_frames.Limits.from_server_info(pb.ServerInfoReply(), taking),
                         (65536, 4096, 32, 0))
        self.assertEqual(_fast_frames.GENERIC.heads_up(2000),
                         pb.FastRequest(heads_up_micros=2000).SerializeToString())
        fs = _fast_socket.FastSocket("/nonexistent")
        step = pb.StepRequest(items=[pb.StepItem(name="w", return_dequantized=True,
                                                 update=pb.Tensor(shape=[48, 128]))])
        fs.frame("Step", step)  # 24576 + 16 + 49 bytes + the margin: fits 65536
        fs.set_limits(info)
        self.assertEqual(fs.limits, (32768, 8192, 32, 0))
        with self.assertRaises(_fast_socket.FrameTooLarge):
            fs.frame("Step", step)  # not in 32768 - 32 - 8192

    def test_step_bound_is_the_server_s(self):
        req = pb.StepRequest(items=[
            pb.StepItem(name="layer.0", update=pb.Tensor(shape=[64, 64])),
            pb.StepItem(name="w", return_dequantized=True, update=pb.Tensor(shape=[16, 32])),
            pb.StepItem(name="x", return_dequantized=True, update=pb.Tensor(shape=[16, 32]),
                        dequantized_out=pb.OutputTarget(region=pb.RegionSlice(region_id="r")))])
        self.assertEqual(_fast_frames.reply_bound("Step", req),
                         (7 + 48) + (1 + 48 + 16 * 32 * 4 + 16) + (1 + 48))

    def test_state_changing_bounds_are_the_server_s(self):
        q = pb.QuantizeRequest(input=pb.Tensor(shape=[32, 64]))
        self.assertEqual(_fast_frames.reply_bound("Quantize", q), 32 * 32 + 32 * 4)
        q.options.residual_key = "k"  # refused before it runs over fp4qd's own, larger bound
        self.assertEqual(_fast_frames.reply_bound("Quantize", q),
                         32 * 64 // 2 + 1 + (32 + 128) * (64 // 16 + 4))
        u = pb.UpdateWeightRequest(update=pb.Tensor(dtype=pb.DType.DTYPE_BF16, shape=[8, 16]),
                                   return_dequantized=True)
        self.assertEqual(_fast_frames.reply_bound("UpdateWeight", u), 8 * 16 * 4)
        for rpc in ("CreateWeight", "DeleteWeight", "ResetResidual", "ResetOptimizer",
                    "JoinGroup", "LeaveGroup", "DeleteNamespace", "KeepAlive", "CloseSession",
                    "RegisterCudaRegion", "UnregisterCudaRegion", "ServerInfo", "Checkpoint"):
            self.assertEqual(_fast_frames.reply_bound(rpc, _messages.METHODS[rpc][1]()), 0, rpc)

    def test_read_only_replies_of_unknown_size_are_tried(self):
        unknown = [("GetWeight", pb.GetWeightRequest(name="w", quantized=True)),
                   ("GetWeight", pb.GetWeightRequest(name="w", dequantized=True)),
                   ("ListTensors", pb.ListTensorsRequest()),
                   ("Dequantize", pb.DequantizeRequest(input=pb.QuantizedOperand(
                       weight_name="w")))]
        fs = _fast_socket.FastSocket("/nonexistent")
        for rpc, req in unknown:
            self.assertIs(_fast_frames.reply_bound(rpc, req), _fast_frames.UNKNOWN, rpc)
            self.assertIn(rpc, _fast_frames.READ_ONLY)
            fs.frame(rpc, req)  # framed: fp4qd refuses the reply if it does not fit
        self.assertEqual(_fast_frames.reply_bound("GetWeight", pb.GetWeightRequest(
            name="w", dequantized=True, out=pb.OutputTarget(
                region=pb.RegionSlice(region_id="r")))), 0)
        self.assertTrue(_fast_frames.is_reply_limit(fp4q.Fp4qError(
            grpc.StatusCode.RESOURCE_EXHAUSTED, "reply: the inline output (70000 bytes) would "
            "exceed this transport's reply limit of 65504 bytes; nothing was run")))
        self.assertFalse(_fast_frames.is_reply_limit(fp4q.Fp4qError(
            grpc.StatusCode.RESOURCE_EXHAUSTED, "state budget")))


class _FakeFast:
    """Stands in for a FastSocket: `script` holds one outcome per call (a reply or an error)."""

    def __init__(self, script):
        self.script, self.calls, self.limits_seen = script, [], []

    def set_limits(self, info):
        self.limits_seen.append(info.limits.fast_socket_max_frame_bytes)

    def serves(self, rpc):
        return rpc != "OpenSession"

    def frame(self, rpc, request):
        if request.ByteSize() > 100:
            raise _fast_socket.FrameTooLarge()
        return "frame"

    def call(self, rpc, msg, session_id, token, deadline):
        self.calls.append((rpc, session_id, token))
        outcome = self.script.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def reset(self):
        self.calls.append("reset")

    def close(self):
        pass


class TransportChoiceTest(unittest.TestCase):
    """fp4q._transport.Transport: which transport a call takes and what it resends."""

    def setUp(self):
        self.counts = []
        self.ids = ("s%d" % i for i in range(1, 100))
        self.session = _session.Session(None, "unit", lambda: None, lambda: None)
        self.session.ensure = self.ensure
        self.grpc_calls = []
        self.transport = _transport.Transport(
            "127.0.0.1:1", session=self.session, timeout=None, token="tok", channel_options=(),
            fast_socket=None, fast_socket_spin_us=0, count=lambda k, n=1: self.counts.append(k))
        self.addCleanup(self.transport.close)
        for rpc in ("Qdq", "KeepAlive", "ServerInfo"):
            self.transport._stubs[rpc] = self.grpc_stub(rpc)

    def ensure(self):
        self.session._id = self.session._id or next(self.ids)
        return self.session._id

    def grpc_stub(self, rpc):
        def stub(request, metadata, timeout):
            self.grpc_calls.append((rpc, dict(metadata or ())))
            return _messages.METHODS[rpc][2]()
        return stub

    def fast(self, *script):
        self.transport.fast = _FakeFast(list(script))
        return self.transport.fast

    def test_small_calls_go_fast_large_ones_by_grpc(self):
        fast = self.fast(pb.QdqReply(global_amax=1.0),
                         pb.ServerInfoReply(limits=pb.Limits(fast_socket_max_frame_bytes=4096)))
        self.assertEqual(self.transport.send("Qdq", pb.QdqRequest()).global_amax, 1.0)
        self.assertEqual(fast.calls, [("Qdq", "s1", "tok")])  # a session opened for it
        big = pb.QdqRequest(input=pb.Tensor(inline_data=bytes(200)))
        self.transport.send("Qdq", big)
        self.transport.send("ServerInfo", pb.ServerInfoRequest())  # a session is open: fast
        self.assertEqual(fast.calls, [("Qdq", "s1", "tok"), ("ServerInfo", "s1", "tok")])
        self.assertEqual(fast.limits_seen, [4096])  # every ServerInfo reply sets the limits
        self.assertEqual([c[0] for c in self.grpc_calls], ["Qdq"])
        self.assertEqual(self.grpc_calls[0][1], {"fp4q-session": "s1",
                                                 "authorization": "Bearer tok"})
        self.assertEqual(self.counts, ["fast_socket_fallbacks"])

    def test_calls_without_a_session_to_act_on_go_by_grpc(self):
        fast = self.fast()
        for rpc in ("ServerInfo", "KeepAlive", "CloseSession"):
            self.transport._stubs[rpc] = self.grpc_stub(rpc)
            self.transport.send(rpc, _messages.METHODS[rpc][1]())
        self.assertEqual((fast.calls, [c[0] for c in self.grpc_calls]),
                         ([], ["ServerInfo", "KeepAlive", "CloseSession"]))
        self.assertIsNone(self.session.id)  # none was opened for them

    def test_a_read_only_reply_over_the_frame_is_sent_again_by_grpc(self):
        too_big = fp4q.Fp4qError(grpc.StatusCode.RESOURCE_EXHAUSTED, "reply: 70000 bytes exceed "
                                 "this transport's reply limit of 65504 bytes", "GetWeight")
        self.transport._stubs["GetWeight"] = self.grpc_stub("GetWeight")
        self.transport._stubs["Step"] = self.grpc_stub("Step")
        self.fast(too_big)
        self.transport.send("GetWeight", pb.GetWeightRequest(name="w", quantized=True))
        self.assertEqual([c[0] for c in self.grpc_calls], ["GetWeight"])
        self.assertEqual(self.counts, ["fast_socket_fallbacks"])
        self.fast(fp4q.Fp4qError(grpc.StatusCode.RESOURCE_EXHAUSTED, "reply: it could carry "
                                 "up to 90000 bytes, over this transport's reply limit"))
        with self.assertRaises(fp4q.Fp4qError) as cm:  # a state-changing call: never resent
            self.transport.send("Step", pb.StepRequest())
        self.assertEqual(cm.exception.code, grpc.StatusCode.RESOURCE_EXHAUSTED)
        self.assertEqual([c[0] for c in self.grpc_calls], ["GetWeight"])

    def test_a_namespaced_session_is_opened_before_any_call(self):
        self.session.namespace = "job-a"
        self.transport._stubs["ListTensors"] = self.grpc_stub("ListTensors")
        self.transport.send("ListTensors", pb.ListTensorsRequest())
        self.assertEqual(self.grpc_calls, [("ListTensors", {"fp4q-session": "s1",
                                                           "authorization": "Bearer tok"})])

    def test_grpc_resends_only_what_may_be_resent_when_the_session_is_unknown(self):
        gone = grpc.RpcError()
        gone.code = lambda: grpc.StatusCode.NOT_FOUND
        gone.details = lambda: ("metadata fp4q-session: unknown or expired session (its "
                                "namespace is unknown; open a new session)")
        outcomes = [gone, None, gone]

        def stub(request, metadata, timeout):
            self.grpc_calls.append(("Step", dict(metadata or ())))
            outcome = outcomes.pop(0)
            if outcome is not None:
                raise outcome
            return pb.StepReply()
        self.transport._stubs["Step"] = stub
        self.ensure()
        self.transport.send("Step", pb.StepRequest(), resend=True)
        self.assertEqual([c[1]["fp4q-session"] for c in self.grpc_calls], ["s1", "s2"])
        with self.assertRaises(fp4q.Fp4qError) as cm:
            self.transport.send("Step", pb.StepRequest(), resend=False)
        self.assertEqual((cm.exception.code, cm.exception.rpc), (grpc.StatusCode.NOT_FOUND, "Step"))
        self.assertIsNone(self.session.id)  # forgotten; not sent again
        self.assertEqual(len(self.grpc_calls), 3)

    def test_keep_alive_without_a_session_goes_by_grpc(self):
        fast = self.fast()
        self.transport.send("KeepAlive", pb.KeepAliveRequest())
        self.assertEqual((fast.calls, [c[0] for c in self.grpc_calls]), ([], ["KeepAlive"]))
        self.assertIsNone(self.session.id)

    def test_a_hello_refused_not_found_resends_only_what_may_be_resent(self):
        gone = _fast_socket.HelloRefused(grpc.StatusCode.NOT_FOUND, "hello.session_id: gone")
        fast = self.fast(gone, pb.QdqReply())
        self.transport.send("Qdq", pb.QdqRequest(), resend=True)
        self.assertEqual(fast.calls, [("Qdq", "s1", "tok"), ("Qdq", "s2", "tok")])
        fast = self.fast(gone)
        with self.assertRaises(fp4q.Fp4qError) as cm:
            self.transport.send("Qdq", pb.QdqRequest(), resend=False)
        self.assertEqual((cm.exception.code, cm.exception.message, cm.exception.rpc),
                         (grpc.StatusCode.NOT_FOUND, "hello.session_id: gone", "Qdq"))
        self.assertIsNone(self.session.id)  # forgotten: the next call opens another
        fast = self.fast(gone, gone)
        with self.assertRaises(fp4q.Fp4qError):
            self.transport.send("Qdq", pb.QdqRequest(), resend=True)  # once, not twice more
        self.assertEqual(len(fast.calls), 2)
        refused = _fast_socket.HelloRefused(grpc.StatusCode.UNAUTHENTICATED, "hello.auth_token")
        fast = self.fast(refused)
        with self.assertRaises(fp4q.Fp4qError) as cm:
            self.transport.send("Qdq", pb.QdqRequest(), resend=True)
        self.assertEqual(cm.exception.code, grpc.StatusCode.UNAUTHENTICATED)
        self.assertIsNotNone(self.session.id)  # not a session problem: kept


if __name__ == "__main__":
    unittest.main()
