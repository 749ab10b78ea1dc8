"""Client logic that needs no server: descriptor, options, conversions, region cache."""

import collections
import ctypes
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
from fp4q import _cuda_driver, _fast_socket, _messages, ipc, options, results, tensors
from fp4q import _fast_frames, _regions, _requests, _session, _transport
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


class FakeTensor:
    def __init__(self, ptr, index=0):
        self._ptr = ptr
        self.device = types.SimpleNamespace(index=index)

    def data_ptr(self):
        return self._ptr


class RegionCacheTest(unittest.TestCase):
    """The cache logic with the driver replaced by a table of fake allocations."""

    def setUp(self):
        # base -> (size, IPC handle, buffer id)
        self.allocs = {0x10000: (0x100000, b"A" * 64, 1), 0x200000: (0x1000, b"B" * 64, 2)}
        self.registered, self.unregistered = [], []
        self.calls = []  # driver calls made, in order
        self.identity_works = True

        def find(ptr):
            for base, (size, handle, buffer_id) in self.allocs.items():
                if base <= ptr < base + size:
                    return base, size, handle, buffer_id
            return None

        def allocation_identity(ptr):
            self.calls.append("cuPointerGetAttributes")
            if not self.identity_works:
                raise _cuda_driver.DriverError("cuPointerGetAttributes(0x%x) failed: "
                                               "CUDA_ERROR_INVALID_CONTEXT" % ptr)
            hit = find(ptr)
            return (hit[0], hit[1], hit[3]) if hit else (0, 0, 0)  # unknown pointer: zeros

        def address_range(ptr):
            self.calls.append("cuMemGetAddressRange")
            hit = find(ptr)
            if hit is None:
                raise _cuda_driver.DriverError("cuMemGetAddressRange(0x%x) failed: "
                                               "CUDA_ERROR_NOT_FOUND" % ptr)
            return hit[0], hit[1]

        def ipc_handle(base):
            self.calls.append("cuIpcGetMemHandle")
            return self.allocs[base][1]

        real_current_device = ipc._current_device

        def current_device(index):
            self.calls.append("device switch")
            return real_current_device(index)

        patches = [mock.patch.object(_cuda_driver, "allocation_identity", allocation_identity),
                   mock.patch.object(_cuda_driver, "address_range", address_range),
                   mock.patch.object(_cuda_driver, "ipc_handle", ipc_handle),
                   mock.patch.object(ipc, "_current_device", current_device)]
        for p in patches:
            p.start()
            self.addCleanup(p.stop)

        def register(handle, size, uuid):
            self.registered.append((handle, size, uuid))
            return "r%d" % len(self.registered)

        self.cache = ipc.RegionCache(register, self.unregistered.append, max_regions=2)

    def test_one_registration_per_allocation(self):
        self.assertEqual(self.cache.slice_for(FakeTensor(0x10000), "GPU-x"), ("r1", 0))
        self.assertEqual(self.cache.slice_for(FakeTensor(0x10000 + 4096), "GPU-x"), ("r1", 4096))
        self.assertEqual(self.registered, [(b"A" * 64, 0x100000, "GPU-x")])
        self.assertEqual(self.cache.slice_for(FakeTensor(0x200010), "GPU-x"), ("r2", 16))
        self.assertEqual(self.cache.registrations, 2)
        self.assertEqual(self.cache.hits, 1)

    def test_a_hit_is_one_driver_call_without_export_or_device_switch(self):
        self.cache.slice_for(FakeTensor(0x10000), "GPU-x")
        self.assertEqual(self.calls, ["cuPointerGetAttributes", "device switch",
                                      "cuMemGetAddressRange", "cuIpcGetMemHandle"])
        del self.calls[:]
        self.assertEqual(self.cache.slice_for(FakeTensor(0x10000 + 256), "GPU-x"), ("r1", 256))
        self.assertEqual(self.calls, ["cuPointerGetAttributes"])
        self.assertEqual((self.cache.registrations, self.cache.hits), (1, 1))
        # The same address on another device is another allocation.
        self.assertEqual(self.cache.slice_for(FakeTensor(0x10000, index=1), "GPU-y"), ("r2", 0))

    def test_reallocated_address_gets_a_new_region_and_drops_the_stale_one(self):
        self.cache.slice_for(FakeTensor(0x10000), "GPU-x")
        self.allocs[0x10000] = (0x100000, b"C" * 64, 3)  # freed and re-made at the same base
        self.assertEqual(self.cache.slice_for(FakeTensor(0x10000), "GPU-x"), ("r2", 0))
        self.assertEqual(self.unregistered, ["r1"])

    def test_a_new_buffer_id_re_exports_even_with_an_equal_handle_and_size(self):
        self.cache.slice_for(FakeTensor(0x10000), "GPU-x")
        self.allocs[0x10000] = (0x100000, b"A" * 64, 7)
        del self.calls[:]
        self.assertEqual(self.cache.slice_for(FakeTensor(0x10040), "GPU-x"), ("r2", 0x40))
        self.assertIn("cuIpcGetMemHandle", self.calls)
        self.assertEqual(self.unregistered, ["r1"])
        self.assertEqual(self.registered[-1], (b"A" * 64, 0x100000, "GPU-x"))
        del self.calls[:]
        self.assertEqual(self.cache.slice_for(FakeTensor(0x10000), "GPU-x"), ("r2", 0))
        self.assertEqual(self.calls, ["cuPointerGetAttributes"])

    def test_without_buffer_ids_the_handle_tells_staleness(self):
        self.identity_works = False
        self.assertEqual(self.cache.slice_for(FakeTensor(0x10000), "GPU-x"), ("r1", 0))
        self.assertEqual(self.cache.slice_for(FakeTensor(0x10010), "GPU-x"), ("r1", 16))
        self.assertEqual((self.cache.registrations, self.cache.hits), (1, 0))
        self.allocs[0x10000] = (0x100000, b"C" * 64, 3)
        self.assertEqual(self.cache.slice_for(FakeTensor(0x10000), "GPU-x"), ("r2", 0))
        self.assertEqual(self.unregistered, ["r1"])
        # Buffer ids readable again: the region is re-registered once, then hit.
        self.identity_works = True
        self.assertEqual(self.cache.slice_for(FakeTensor(0x10000), "GPU-x"), ("r3", 0))
        self.assertEqual(self.cache.slice_for(FakeTensor(0x10000), "GPU-x"), ("r3", 0))
        self.assertEqual((self.unregistered, self.cache.hits), (["r1", "r2"], 1))

    def test_lru_eviction_and_refusals(self):
        self.allocs[0x300000] = (0x1000, b"D" * 64, 4)
        self.cache.slice_for(FakeTensor(0x10000), "GPU-x")
        self.cache.slice_for(FakeTensor(0x200000), "GPU-x")
        self.cache.slice_for(FakeTensor(0x10000), "GPU-x")  # most recent now
        self.cache.slice_for(FakeTensor(0x300000), "GPU-x")
        self.assertEqual(self.unregistered, ["r2"])
        hits = self.cache.hits
        with self.assertRaisesRegex(ipc.NoIpc, r"offset 8 in its allocation is not a multiple"):
            self.cache.slice_for(FakeTensor(0x10008), "GPU-x")  # cached allocation
        self.assertEqual(self.cache.hits, hits)
        with self.assertRaisesRegex(ipc.NoIpc, r"offset 8 in its allocation is not a multiple"):
            self.cache.slice_for(FakeTensor(0x200008), "GPU-x")  # evicted: exported again
        with self.assertRaisesRegex(ipc.NoIpc, r"no IPC handle for this allocation \(.*"
                                    r"CUDA_ERROR_NOT_FOUND\); expandable_segments"):
            self.cache.slice_for(FakeTensor(0x900000), "GPU-x")
        self.identity_works = False
        with self.assertRaisesRegex(ipc.NoIpc, r"CUDA_ERROR_NOT_FOUND"):
            self.cache.slice_for(FakeTensor(0x900000), "GPU-x")

    def test_export_failure_is_no_ipc_and_caches_nothing(self):
        def no_handle(base):
            raise _cuda_driver.DriverError("cuIpcGetMemHandle(0x%x) failed: "
                                           "CUDA_ERROR_INVALID_VALUE" % base)
        with mock.patch.object(_cuda_driver, "ipc_handle", no_handle):
            for _ in range(2):
                with self.assertRaisesRegex(ipc.NoIpc, r"CUDA_ERROR_INVALID_VALUE.*"
                                            r"expandable_segments allocations cannot be shared"):
                    self.cache.slice_for(FakeTensor(0x10000), "GPU-x")
        self.assertEqual((self.registered, self.cache.region_ids()), ([], []))

    def test_uuid_spelling(self):
        raw = bytes(range(16))
        self.assertEqual(ipc.format_uuid(raw), "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f")
        self.assertEqual(ipc.normalize_uuid("GPU-ABCD"), ipc.normalize_uuid("abcd"))


class CudaDriverTest(unittest.TestCase):
    """allocation_identity's ctypes marshalling against a fake libcuda."""

    def test_one_cu_pointer_get_attributes_call_reads_start_size_and_buffer_id(self):
        seen = []

        class FakeLib:
            def cuPointerGetAttributes(self, n, attrs, data, ptr):
                seen.append((n, list(attrs[:n]), ptr))
                values = {11: 0x7f0000000000, 12: 2 << 20, 7: 42}
                if ptr == 0xdead:
                    return 201  # CUDA_ERROR_INVALID_CONTEXT
                for i in range(n):
                    ctypes.c_uint64.from_address(data[i]).value = values[attrs[i]]
                return 0

            def cuGetErrorName(self, result, name):
                return 0

        with mock.patch.object(_cuda_driver, "_lib", FakeLib()):
            self.assertEqual(_cuda_driver.allocation_identity(0x7f0000000100),
                             (0x7f0000000000, 2 << 20, 42))
            with self.assertRaisesRegex(_cuda_driver.DriverError,
                                        r"cuPointerGetAttributes\(0xdead\) failed: CUresult 201"):
                _cuda_driver.allocation_identity(0xdead)
        self.assertEqual(seen[0], (3, [11, 12, 7], 0x7f0000000100))
        self.assertEqual((_cuda_driver.CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                          _cuda_driver.CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                          _cuda_driver.CU_POINTER_ATTRIBUTE_BUFFER_ID), (11, 12, 7))


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


class ReplyBoundTest(unittest.TestCase):
    """What a reply may carry, against fp4qd's own bounds (server/op_table.cc) and limits."""

    def test_the_limits_are_the_proto_s_and_then_the_server_s(self):
        self.assertEqual(_fast_frames.DEFAULT_LIMITS, (65536, 4096, 32))
        limits = _fast_frames.DEFAULT_LIMITS
        # fp4qd refuses bound + margin > frame - 32 (its reply limit): exactly at the edge.
        self.assertTrue(limits.reply_fits(65536 - 32 - 4096))
        self.assertFalse(limits.reply_fits(65536 - 32 - 4096 + 1))
        info = pb.ServerInfoReply(limits=pb.Limits(fast_socket_max_frame_bytes=32768,
                                                   fast_socket_reply_margin_bytes=8192))
        self.assertEqual(_fast_frames.Limits.from_server_info(info, limits), (32768, 8192, 32))
        framed = pb.ServerInfoReply(limits=pb.Limits(fast_socket_reply_framing_bytes=64))
        wider = _fast_frames.Limits.from_server_info(framed, limits)
        self.assertEqual(wider, (65536, 4096, 64))
        self.assertTrue(wider.reply_fits(65536 - 64 - 4096))
        self.assertFalse(wider.reply_fits(65536 - 64 - 4096 + 1))
        self.assertEqual(_fast_frames.Limits.from_server_info(pb.ServerInfoReply(), limits),
                         limits)  # a server reporting none: kept
        fs = _fast_socket.FastSocket("/nonexistent")
        step = pb.StepRequest(items=[pb.StepItem(name="w", return_dequantized=True,
                                                 update=pb.Tensor(shape=[48, 128]))])
        fs.frame("Step", step)  # 24576 + 16 + 49 bytes + the margin: fits 65536
        fs.set_limits(info)
        self.assertEqual(fs.limits, (32768, 8192, 32))
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


class IpcUuidTest(unittest.TestCase):
    """The server's GPU spelling is looked up once per ServerInfo reply, not per tensor."""

    def test_lookup_follows_the_server_info(self):
        c = fp4q.Client("127.0.0.1:1")
        self.addCleanup(c.close)
        c._ensure_session = lambda: "s"
        dev = types.SimpleNamespace(index=0)
        with mock.patch.object(ipc, "device_uuid", return_value="GPU-00aa") as read_uuid:
            c._info = pb.ServerInfoReply(backend="cuda", supported_modes=["nvfp4", "cuda_ipc"],
                                         gpus=[pb.GpuInfo(uuid="gpu-FF"),
                                               pb.GpuInfo(uuid="00AA")])
            self.assertEqual(c._ipc_uuid(dev), "00AA")
            self.assertEqual(c._ipc_uuid(dev), "00AA")
            c._info = pb.ServerInfoReply(backend="cpu", supported_modes=["nvfp4"])
            with self.assertRaisesRegex(ipc.NoIpc, r"backend cpu\) does not offer cuda_ipc"):
                c._ipc_uuid(dev)
            c._info = pb.ServerInfoReply(backend="cuda", supported_modes=["cuda_ipc"],
                                         gpus=[pb.GpuInfo(uuid="GPU-FF")])
            with self.assertRaisesRegex(ipc.NoIpc, r"cuda:0 \(GPU-00aa\) is not a GPU this "
                                        r"server serves \(\['GPU-FF'\]\)"):
                c._ipc_uuid(dev)
            c._info = pb.ServerInfoReply(backend="cuda", supported_modes=["cuda_ipc"],
                                         gpus=[pb.GpuInfo(uuid="GPU-00AA")])
            self.assertEqual(c._ipc_uuid(dev), "GPU-00AA")
            self.assertEqual(read_uuid.call_count, 1)  # the local UUID is read once
            c._ipc_mode = "never"
            with self.assertRaisesRegex(ipc.NoIpc, r"ipc='never'"):
                c._ipc_uuid(dev)


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



class _FakeCudaTensor:
    """What Transfer reads of a CUDA tensor, without a GPU (no bytes behind it)."""

    is_cuda, requires_grad, dtype = True, False, torch.float32

    def __init__(self, shape=(4, 16), device="cuda:0"):
        self.shape, self.device = torch.Size(shape), torch.device(device)
        self.copied_from = None

    def numel(self):
        return self.shape.numel()

    def element_size(self):
        return 4

    def contiguous(self):
        return self

    def clone(self):
        return _FakeCudaTensor(self.shape, self.device)

    def copy_(self, src):
        self.copied_from = src


class TransferTest(unittest.TestCase):
    """fp4q._regions: a CUDA tensor's way into a request (region slice, aligned copy, arena,
    refusal), with the server's answers and the region cache scripted."""

    def setUp(self):
        self.stats, self.reasons, self.slices = collections.Counter(), {}, []
        info = pb.ServerInfoReply(backend="cuda", supported_modes=["cuda_ipc"],
                                  gpus=[pb.GpuInfo(uuid="GPU-00AA")])
        self.regions = _regions.Regions(
            "auto", 4, send=lambda rpc, req: info, ensure_session=lambda: "s",
            count=lambda k, n=1: self.stats.update({k: n}), reasons=self.reasons)
        patch = mock.patch.object(ipc, "device_uuid", return_value="gpu-00aa")
        patch.start()
        self.addCleanup(patch.stop)
        self.regions.cache.slice_for = self.slice_for
        self.misaligned = set()

    def slice_for(self, tensor, uuid):
        self.slices.append((tensor, uuid))
        if id(tensor) in self.misaligned:
            raise ipc.NoIpc("offset 4 in its allocation is not a multiple of 16")
        return "r%d" % len(self.slices), 256

    def test_an_input_travels_as_a_region_slice(self):
        tr, t = self.regions.transfer(), _FakeCudaTensor()
        self.assertEqual(tr.input_region(t), ("r1", 256))
        self.assertEqual(self.slices, [(t, "GPU-00AA")])  # the server's spelling
        self.assertTrue(tr.uses_regions)
        self.assertEqual(self.stats, collections.Counter(ipc_tensors=1))
        with mock.patch.object(torch.cuda, "current_stream") as stream:
            tr.before_send()
        stream.assert_called_once_with(torch.device("cuda:0"))
        tr.release()

    def test_a_misaligned_tensor_is_sent_as_an_aligned_copy(self):
        tr, t = self.regions.transfer(), _FakeCudaTensor()
        self.misaligned.add(id(t))
        self.assertEqual(tr.input_region(t), ("r2", 256))
        copy = self.slices[1][0]
        self.assertIsNot(copy, t)
        self.assertIsNone(copy.copied_from)  # clone() made it; nothing more to copy

    def test_small_tensors_share_the_arena_for_the_whole_request(self):
        arena = mock.Mock(lock=threading.Lock())
        arena.fits.return_value = True
        views = [_FakeCudaTensor(), _FakeCudaTensor()]
        arena.take.side_effect = views
        self.regions.arena_for = lambda device: arena
        tr, a, b = self.regions.transfer(), _FakeCudaTensor(), _FakeCudaTensor()
        self.assertEqual(tr.input_region(a), ("r1", 256))
        self.assertEqual(tr.input_region(b), ("r2", 256))
        self.assertEqual([s[0] for s in self.slices], views)
        self.assertEqual((views[0].copied_from, views[1].copied_from), (a, b))
        self.assertTrue(arena.lock.locked())  # held from the first slot to release()
        tr.release()
        self.assertFalse(arena.lock.locked())
        arena.reset.assert_called_once_with()

    def test_refusals_fall_back_inline_or_raise_under_require(self):
        self.regions.info = pb.ServerInfoReply(backend="cpu", supported_modes=["nvfp4"])
        tr = self.regions.transfer()
        self.assertIsNone(tr.input_region(_FakeCudaTensor()))
        self.assertFalse(tr.uses_regions)
        self.assertIn("does not offer cuda_ipc", self.reasons["cuda:0"])
        self.assertEqual(self.stats, collections.Counter(ipc_fallbacks=1))
        self.regions.mode = "require"
        with self.assertRaisesRegex(fp4q.Fp4qError, r"ipc='require' but cuda:0 cannot travel"):
            tr.input_region(_FakeCudaTensor())
        self.assertIsNone(self.regions.transfer().input_region(torch.ones(2)))  # CPU: inline

    def test_a_server_refusing_registration_disables_ipc(self):
        refusal = fp4q.Fp4qError(grpc.StatusCode.FAILED_PRECONDITION, "start with --allow_cuda_ipc")

        def send(rpc, req):
            if rpc == "RegisterCudaRegion":
                raise refusal
            return pb.ServerInfoReply(backend="cuda", supported_modes=["cuda_ipc"],
                                      gpus=[pb.GpuInfo(uuid="GPU-00AA")])
        self.regions._send = send
        with self.assertRaisesRegex(ipc.NoIpc, r"refused RegisterCudaRegion: start with"):
            self.regions._register_for_cache(b"h" * 64, 4096, "GPU-00AA")
        with self.assertRaisesRegex(ipc.NoIpc, r"refused RegisterCudaRegion"):
            self.regions.uuid_for(torch.device("cuda:0"))


if __name__ == "__main__":
    unittest.main()
