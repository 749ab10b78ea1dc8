"""Client logic that needs no server: descriptor, options, conversions, replies, construction,
and the client's session and request parts (the region cache and IPC transfers:
test_offline_ipc.py; fast-socket frames and the transport choice: test_offline_transport.py)."""

import dataclasses
import os
import threading
import types
import unittest
from unittest import mock

import grpc
import numpy as np
import torch

import fp4q
from fp4q import _messages, _requests, _session, options, results, tensors
from fp4q._messages import pb


class DescriptorTest(unittest.TestCase):
    def test_every_rpc_of_the_service_is_a_client_method(self):
        self.assertEqual(len(_messages.METHODS), 22)
        path, req, rep = _messages.METHODS["Quantize"]
        self.assertEqual(path, "/fp4q.v1.Fp4q/Quantize")
        self.assertEqual(req.DESCRIPTOR.full_name, "fp4q.v1.QuantizeRequest")
        self.assertEqual(rep.DESCRIPTOR.full_name, "fp4q.v1.QuantizeReply")
        snake = {"ServerInfo": "server_info", "RegisterCudaRegion": "register_cuda_region",
                 "UnregisterCudaRegion": "unregister_cuda_region", "Qdq": "qdq"}
        for rpc in _messages.METHODS:
            name = snake.get(rpc) or "".join(
                "_" + ch.lower() if ch.isupper() else ch for ch in rpc).lstrip("_")
            self.assertTrue(callable(getattr(fp4q.Client, name, None)), name)

    def test_a_descriptor_older_than_the_checkouts_protos_is_stale(self):
        import tempfile
        from fp4q import _protogen
        with tempfile.TemporaryDirectory() as root:
            for rel in _protogen.PROTO_FILES:
                os.makedirs(os.path.join(root, os.path.dirname(rel)), exist_ok=True)
                with open(os.path.join(root, rel), "w") as f:
                    f.write("syntax = \"proto3\";\n")
                os.utime(os.path.join(root, rel), (1000, 1000))
            out = os.path.join(root, "out.binpb")
            self.assertFalse(_protogen.stale(out, root))  # none yet: generated, not stale
            with open(out, "wb"):
                pass
            os.utime(out, (2000, 2000))
            self.assertFalse(_protogen.stale(out, root))
            os.utime(os.path.join(root, _protogen.PROTO_FILES[1]), (3000, 3000))
            self.assertTrue(_protogen.stale(out, root))
            # An installed package has no proto sources beside it: never stale.
            self.assertFalse(_protogen.stale(out, os.path.join(root, "absent")))

    def test_messages_round_trip_with_optional_amax(self):
        m = pb.QuantizeRequest()
        m.options.amax = 2.5
        m.options.seed = 2**64 - 1
        back = pb.QuantizeRequest.FromString(m.SerializeToString())
        self.assertTrue(back.options.HasField("amax"))
        self.assertEqual((back.options.amax, back.options.seed), (2.5, 2**64 - 1))
        self.assertFalse(pb.QuantizeRequest().options.HasField("amax"))
        self.assertEqual(_messages.loaded().health_status.by_name["SERVING"], 1)


class OptionsTest(unittest.TestCase):
    def test_names_aliases_and_numbers(self):
        self.assertEqual(options.enum_value("format", "mxfp4"), pb.Format.FORMAT_MXFP4)
        self.assertEqual(options.enum_value("block", "16x16"), pb.BlockShape.BLOCK_SHAPE_16X16)
        self.assertEqual(options.enum_value("rounding", "sr"), pb.Rounding.ROUNDING_STOCHASTIC)
        self.assertEqual(options.enum_value("rht", "default"), pb.RhtMode.RHT_MODE_DEFAULT_SIGNS)
        self.assertEqual(options.enum_value("outputs", None), 0)
        self.assertEqual(options.enum_value("format", 7), 7)  # passed through for the server
        with self.assertRaisesRegex(fp4q.ClientArgumentError,
                                    r"scale_layout: 'tiled' is not one of \['plain', 'swizzled'\]"):
            options.enum_value("scale_layout", "tiled")

    def test_quant_options_fill(self):
        msg = options.quant_options(rounding="stochastic", seed=9, step=3, amax=4.0,
                                    residual_key="k").fill(pb.QuantOptions())
        self.assertEqual((msg.rounding, msg.seed, msg.step, msg.amax, msg.residual_key),
                         (pb.Rounding.ROUNDING_STOCHASTIC, 9, 3, 4.0, "k"))
        with self.assertRaisesRegex(fp4q.ClientArgumentError, r"unknown quantization option"):
            options.quant_options(sead=1)
        with self.assertRaisesRegex(fp4q.ClientArgumentError, r"seed: -1 is outside"):
            options.quant_options(seed=-1).fill(pb.QuantOptions())


    def test_per_call_shortcuts_check_like_the_full_path(self):
        for _ in range(2):  # the second time through the string shortcut
            self.assertEqual(options.enum_value("format", "mxfp4"), pb.Format.FORMAT_MXFP4)
            self.assertEqual(options.enum_value("rounding", "SR"), pb.Rounding.ROUNDING_STOCHASTIC)
            with self.assertRaisesRegex(fp4q.ClientArgumentError, r"format: 'fp8' is not one"):
                options.enum_value("format", "fp8")
            with self.assertRaisesRegex(fp4q.ClientArgumentError, r"block: True is not a valid"):
                options.enum_value("block", True)
        self.assertEqual(options.enum_value("format", np.int64(2)), 2)
        for bad in (True, 1.0, -1, 2**64):
            with self.assertRaises(fp4q.ClientArgumentError):
                options.quant_options(seed=bad).fill(pb.QuantOptions())
        msg = options.quant_options(seed=np.uint64(2**64 - 1)).fill(pb.QuantOptions())
        self.assertEqual(msg.seed, 2**64 - 1)

    def test_quant_options_are_copies(self):
        a, b = options.quant_options(), options.quant_options()
        self.assertEqual(a, options.QuantOptions())
        self.assertIsNot(a, b)
        base = options.QuantOptions(format="mxfp4", seed=3)
        same = options.quant_options(base)
        self.assertEqual(same, base)
        self.assertIsNot(same, base)
        self.assertEqual(options.quant_options(base, seed=4),
                         options.QuantOptions(format="mxfp4", seed=4))
        self.assertEqual(base.seed, 3)

        @dataclasses.dataclass
        class Mine(options.QuantOptions):
            note: str = ""

        mine = options.quant_options(Mine(seed=5, note="n"), step=2)
        self.assertEqual((type(mine), mine.seed, mine.step, mine.note), (Mine, 5, 2, "n"))


def _reference_bytes(t):
    """tensor_bytes as first written: flat, viewed as bytes, through numpy."""
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


class TensorConversionTest(unittest.TestCase):
    def test_inline_bytes_round_trip_every_dtype_and_shape(self):
        gen = torch.Generator().manual_seed(3)
        cases = [((), torch.float32), ((5,), torch.float32), ((3, 4), torch.bfloat16),
                 ((), torch.bfloat16), ((7,), torch.bfloat16), ((2, 0), torch.float32),
                 ((4, 6), torch.uint8), ((1, 1, 3), torch.float32)]
        dtypes = {torch.float32: pb.DType.DTYPE_F32, torch.bfloat16: pb.DType.DTYPE_BF16,
                  torch.uint8: pb.DType.DTYPE_U8}
        for shape, dtype in cases:
            if dtype == torch.uint8:
                x = torch.randint(0, 256, shape, generator=gen, dtype=torch.uint8)
            else:
                x = torch.randn(shape, generator=gen).to(dtype)
            for t in (x, x.t() if x.dim() == 2 else x, x.clone().requires_grad_(dtype != torch.uint8)):
                with self.subTest(shape=shape, dtype=dtype, contiguous=t.is_contiguous()):
                    data = tensors.tensor_bytes(t)
                    self.assertEqual(data, _reference_bytes(t))
                    back = tensors.from_bytes(data, dtypes[dtype], list(t.shape), "output")
                    self.assertEqual((back.dtype, tuple(back.shape)), (dtype, tuple(t.shape)))
                    self.assertTrue(torch.equal(back, t.detach()))
                    back.zero_()  # a writable tensor of its own
        for f8 in (pb.DType.DTYPE_F8_E4M3, pb.DType.DTYPE_F8_E8M0):
            back = tensors.from_bytes(bytes([1, 2, 3, 4]), f8, [2, 2], "scales")
            self.assertEqual(back.dtype, torch.uint8)
            self.assertEqual(back.tolist(), [[1, 2], [3, 4]])
        with self.assertRaisesRegex(fp4q.Fp4qError, r"reply output.shape: \[2, -1\]"):
            tensors.from_bytes(b"", pb.DType.DTYPE_F32, [2, -1], "output")


    def test_bf16_bytes_round_trip(self):
        x = torch.tensor([[1.0, -2.5, 3.0e38, float("-inf")]], dtype=torch.bfloat16)
        data = tensors.tensor_bytes(x)
        self.assertEqual(data[:4], bytes([0x80, 0x3F, 0x20, 0xC0]))
        back = tensors.from_bytes(data, pb.DType.DTYPE_BF16, [1, 4], "output")
        self.assertTrue(torch.equal(back, x))

    def test_reply_size_mismatch_is_internal(self):
        with self.assertRaises(fp4q.Fp4qError) as cm:
            tensors.from_bytes(b"\0" * 7, pb.DType.DTYPE_F32, [2], "output")
        self.assertEqual(cm.exception.code, grpc.StatusCode.INTERNAL)
        self.assertIn("reply output: 7 inline bytes for DTYPE_F32 [2] (expected 8)",
                      cm.exception.message)

    def test_scale_sizes(self):
        self.assertEqual(results.scale_bytes("nvfp4", None, "plain", 7, 48), 21)
        self.assertEqual(results.scale_bytes("nvfp4", None, "swizzled", 130, 80), 256 * 8)
        self.assertEqual(results.scale_bytes("mxfp4", None, "plain", 4, 64), 8)
        self.assertIsNone(results.scale_bytes("nvfp4", None, "plain", 4, 24))

    def test_error_text(self):
        e = fp4q.Fp4qError(grpc.StatusCode.NOT_FOUND, "name: no weight 'w'", "GetWeight")
        self.assertEqual(str(e), "[GetWeight] NOT_FOUND: name: no weight 'w'")
        self.assertEqual(e.code_name, "NOT_FOUND")


class QuantizedReplyTest(unittest.TestCase):
    """Quantize replies: inline bytes become tensors; outputs written by IPC are the planned ones."""

    def setUp(self):
        self.c = fp4q.Client("127.0.0.1:1")
        self.addCleanup(self.c.close)
        self.cpu = torch.device("cpu")

    def reply(self, codes_region=False, scales_region=False,
              layout=pb.ScaleLayout.SCALE_LAYOUT_PLAIN):
        q = pb.QuantizedTensor(shape=[4, 32], format=pb.Format.FORMAT_NVFP4, global_amax=2.0,
                               s_enc=3.0, scale_layout=layout)
        if codes_region:
            q.codes_region.region_id, q.codes_region.offset = "r1", 256
        else:
            q.codes = bytes(range(64))
        sb = results.scale_bytes(q.format, 0, layout, 4, 32)
        if scales_region:
            q.scales_region.region_id = "r1"
        else:
            q.scales = bytes(i % 256 for i in range(sb))
        return q

    def test_inline(self):
        t = self.c._quantized_from_reply(self.reply(), {}, "rowwise", self.cpu)
        self.assertEqual((t.rows, t.cols, t.format, t.scale_layout), (4, 32, "nvfp4", "plain"))
        self.assertEqual(t.codes.shape, (4, 16))
        self.assertEqual(t.codes.flatten().tolist(), list(range(64)))
        self.assertEqual(t.scales.tolist(), [[0, 1], [2, 3], [4, 5], [6, 7]])
        swz = self.c._quantized_from_reply(self.reply(layout=pb.ScaleLayout.SCALE_LAYOUT_SWIZZLED),
                                           {}, "rowwise", self.cpu)
        self.assertEqual((swz.scale_layout, tuple(swz.scales.shape)), ("swizzled", (512,)))

    def test_planned_outputs(self):
        codes, scales = torch.zeros(4, 16, dtype=torch.uint8), torch.zeros(4, 2, dtype=torch.uint8)
        planned = {"rowwise_codes": codes, "rowwise_scales": scales}
        t = self.c._quantized_from_reply(self.reply(True, True), planned, "rowwise", self.cpu)
        self.assertIs(t.codes, codes)
        self.assertIs(t.scales, scales)
        # Planned, but the server sent the bytes inline: those are the result.
        t = self.c._quantized_from_reply(self.reply(True, False), planned, "rowwise", self.cpu)
        self.assertIs(t.codes, codes)
        self.assertIsNot(t.scales, scales)
        self.assertEqual(t.scales.tolist(), [[0, 1], [2, 3], [4, 5], [6, 7]])
        with self.assertRaisesRegex(fp4q.Fp4qError, r"reply columnwise.codes: written to a "
                                    r"region this client did not ask for"):
            self.c._quantized_from_reply(self.reply(True, False), planned, "columnwise", self.cpu)


class ClientConstructionTest(unittest.TestCase):
    def test_defaults_come_from_the_environment(self):
        env = {"FP4Q_SERVER": "unix:/run/x.sock", "FP4Q_TOKEN": "t0k",
               "FP4Q_FAST_SOCKET": "/run/fast.sock"}
        with mock.patch.dict(os.environ, env):
            c = fp4q.Client()
            self.assertEqual((c.target, c._transport._token, c._fast.path),
                             ("unix:/run/x.sock", "t0k", "/run/fast.sock"))
            c.close()
            c = fp4q.Client("127.0.0.1:1", bearer_token="mine", fast_socket="")
            self.assertEqual((c._transport._token, c._fast), ("mine", None))  # "" turns it off
            c.close()
        with mock.patch.dict(os.environ, {}, clear=True):
            c = fp4q.Client()
            self.assertEqual((c.target, c._transport._token, c._fast, c.namespace),
                             ("127.0.0.1:50051", None, None, ""))
            c.close()
        c = fp4q.Client("127.0.0.1:1", namespace="job-7")
        self.assertEqual(c.namespace, "job-7")
        c.close()
        with self.assertRaisesRegex(fp4q.ClientArgumentError, r": namespace: 7 is not a string$"):
            fp4q.Client("127.0.0.1:1", namespace=7)

    def test_bad_ipc_mode(self):
        with self.assertRaisesRegex(fp4q.ClientArgumentError, r"ipc: 'sometimes'"):
            fp4q.Client("127.0.0.1:1", ipc="sometimes")

    def test_cuda_tensor_with_ipc_require_needs_ipc(self):
        c = fp4q.Client("127.0.0.1:1", ipc="require")
        with self.assertRaisesRegex(fp4q.Fp4qError, r"ipc='require' but cuda:0 cannot"):
            c._ipc_refused(torch.device("cuda:0"), "no GPU here")
        c.close()


# ---------------------------------------------------------------------- the client's parts


def _reply_header(epoch):
    return types.SimpleNamespace(header=pb.ReplyHeader(server_epoch=epoch))


class ResultShapesTest(unittest.TestCase):
    def test_quantize_sides_and_scale_shapes(self):
        o = pb.Outputs
        self.assertEqual(results.quantize_sides(0, 32, 64), [("rowwise", 32, 64)])
        self.assertEqual(results.quantize_sides(o.OUTPUTS_BOTH, 32, 64),
                         [("rowwise", 32, 64), ("columnwise", 64, 32)])
        self.assertEqual(results.quantize_sides(o.OUTPUTS_COLUMNWISE, 32, 64),
                         [("columnwise", 64, 32)])
        self.assertEqual(results.scale_shape("nvfp4", None, "plain", 7, 48), (7, 3))
        self.assertEqual(results.scale_shape("nvfp4", None, "swizzled", 130, 80), (256 * 8,))
        self.assertEqual(results.scale_shape(pb.Format.FORMAT_MXFP4, 0, 0, 4, 64), (4, 2))
        self.assertIsNone(results.scale_shape("nvfp4", None, "plain", 4, 24))


class SessionPartTest(unittest.TestCase):
    """fp4q._session against a scripted send."""

    def setUp(self):
        self.sent, self.replies, self.events = [], {}, []
        self.session = _session.Session(self.send, "unit", lambda: self.events.append("forget"),
                                        lambda: self.events.append("restart"))

    def send(self, rpc, request):
        self.sent.append(rpc)
        reply = self.replies[rpc]
        if isinstance(reply, Exception):
            raise reply
        return reply() if callable(reply) else reply

    def test_open_ensure_and_reopen(self):
        ids = iter(["a", "b"])
        self.replies["OpenSession"] = lambda: pb.OpenSessionReply(session_id=next(ids))
        self.assertIsNone(self.session.id)
        self.assertEqual(self.session.ensure(), "a")
        self.assertEqual(self.session.ensure(), "a")
        self.assertEqual(self.sent, ["OpenSession"])
        self.assertEqual(self.session.open(), "b")  # the old session is forgotten first
        self.assertEqual((self.session.id, self.events), ("b", ["forget"]))
        self.session.forget_if("a")  # another session's id: kept
        self.assertEqual(self.session.id, "b")
        self.session.forget_if("b")
        self.assertEqual((self.session.id, self.events), (None, ["forget", "forget"]))

    def test_close_forgets_even_when_the_server_refuses(self):
        self.replies["OpenSession"] = pb.OpenSessionReply(session_id="a")
        self.replies["CloseSession"] = fp4q.Fp4qError(grpc.StatusCode.UNAVAILABLE, "down")
        self.session.open()
        with self.assertRaises(fp4q.Fp4qError):
            self.session.close()
        self.assertIsNone(self.session.id)
        self.replies["CloseSession"] = pb.CloseSessionReply(regions_released=3)
        self.assertEqual(self.session.close(), 3)

    def test_a_new_epoch_is_a_restart(self):
        self.replies["OpenSession"] = pb.OpenSessionReply(session_id="a")
        self.session.open()
        self.session.see_header(_reply_header(1))
        self.session.see_header(types.SimpleNamespace())  # a reply without a header
        self.assertEqual((self.session.id, self.events), ("a", []))
        self.assertEqual(self.session.last_header.server_epoch, 1)
        self.session.see_header(_reply_header(2))
        self.assertEqual((self.session.id, self.events), (None, ["forget", "restart"]))
        seen = []
        t = threading.Thread(target=lambda: seen.append(self.session.last_header))
        t.start()
        t.join()
        self.assertEqual(seen, [None])  # per thread

    def test_lost_asks_with_a_keep_alive(self):
        self.assertTrue(self.session.lost())  # no session: nothing to ask
        self.assertEqual(self.sent, [])
        self.replies["OpenSession"] = pb.OpenSessionReply(session_id="a")
        self.session.open()
        self.replies["KeepAlive"] = pb.KeepAliveReply(lease_seconds=30)
        self.assertFalse(self.session.lost())
        self.replies["KeepAlive"] = fp4q.Fp4qError(grpc.StatusCode.UNAVAILABLE, "down")
        with self.assertRaises(fp4q.Fp4qError):
            self.session.lost()
        self.assertEqual(self.session.id, "a")
        self.replies["KeepAlive"] = fp4q.Fp4qError(grpc.StatusCode.NOT_FOUND, "session")
        self.assertTrue(self.session.lost())
        self.assertIsNone(self.session.id)


class _FakeTransfer:
    def __init__(self, log, uses_regions):
        self.log, self.uses_regions = log, uses_regions

    def before_send(self):
        self.log.append("before_send")

    def after_reply(self):
        self.log.append("after_reply")

    def release(self):
        self.log.append("release")


class RequestsCallTest(unittest.TestCase):
    """fp4q._requests.Requests.call: the rebuild-once rule for requests that name regions."""

    def run_call(self, uses_regions, errors, lost=True):
        log = []
        regions = types.SimpleNamespace(transfer=lambda: _FakeTransfer(log, uses_regions))

        def send(rpc, request, resend):
            log.append(("send", request, resend))
            if errors:
                raise errors.pop(0)
            return "reply"

        def session_lost():
            log.append("lost?")
            return lost

        def build(tr):
            log.append("build")
            return len([e for e in log if e == "build"]), "planned"

        rq = _requests.Requests(send, session_lost, regions)
        try:
            return rq.call("Qdq", build), log
        except fp4q.Fp4qError as e:
            return e, log

    def test_a_vanished_session_rebuilds_a_region_request_once(self):
        not_found = fp4q.Fp4qError(grpc.StatusCode.NOT_FOUND, "region")
        result, log = self.run_call(True, [not_found])
        self.assertEqual(result, ("reply", "planned"))
        self.assertEqual(log, ["build", "before_send", ("send", 1, False), "lost?", "release",
                               "build", "before_send", ("send", 2, False), "after_reply",
                               "release"])
        result, log = self.run_call(True, [not_found, not_found])
        self.assertIs(result.code, grpc.StatusCode.NOT_FOUND)
        self.assertEqual(log.count("build"), 2)

    def test_other_errors_and_inline_requests_are_not_rebuilt(self):
        not_found = fp4q.Fp4qError(grpc.StatusCode.NOT_FOUND, "weight")
        result, log = self.run_call(True, [not_found], lost=False)  # the session is fine
        self.assertIs(result, not_found)
        self.assertEqual(log.count("build"), 1)
        result, log = self.run_call(False, [not_found])
        self.assertIs(result, not_found)
        self.assertEqual(log, ["build", "before_send", ("send", 1, True), "release"])
        unavailable = fp4q.Fp4qError(grpc.StatusCode.UNAVAILABLE, "down")
        result, log = self.run_call(True, [unavailable])
        self.assertIs(result, unavailable)
        self.assertNotIn("lost?", log)


if __name__ == "__main__":
    unittest.main()
