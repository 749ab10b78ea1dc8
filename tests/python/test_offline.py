"""Client logic that needs no server: descriptor, options, conversions, region cache."""

import ctypes
import dataclasses
import types
import unittest
from unittest import mock

import grpc
import numpy as np
import torch

import fp4q
from fp4q import _cuda_driver, _fast_socket, _messages, ipc, options, results, tensors
from fp4q._messages import pb


class DescriptorTest(unittest.TestCase):
    def test_every_rpc_of_the_service_is_a_client_method(self):
        self.assertEqual(len(_messages.METHODS), 17)
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
    def test_frames_are_byte_for_byte_fast_requests(self):
        requests = {
            "Quantize": pb.QuantizeRequest(input=pb.Tensor(
                dtype=pb.DType.DTYPE_F32, shape=[2, 16], inline_data=bytes(range(128)))),
            "Dequantize": pb.DequantizeRequest(input=pb.QuantizedOperand(weight_name="w")),
            "Qdq": pb.QdqRequest(),
            "Matmul": pb.MatmulRequest(out_dtype=pb.DType.DTYPE_BF16),
            "UpdateWeight": pb.UpdateWeightRequest(name="w", step=2**40, lr=0.5),
            "KeepAlive": pb.KeepAliveRequest(),  # empty: the op is still there
        }
        self.assertEqual(set(requests), set(_fast_socket.OPS))
        for rpc, req in requests.items():
            frame = _fast_socket.Frame(_fast_socket._OP_KEYS[rpc], req.SerializeToString())
            bare = pb.FastRequest()
            getattr(bare, _fast_socket.OPS[rpc]).CopyFrom(req)
            self.assertEqual(len(frame), bare.ByteSize())
            for call_id, timeout in ((1, 0), (127, 1), (128, 2**63), (2**64 - 1, 86400 * 10**6),
                                     (0, 0)):
                want = pb.FastRequest(call_id=call_id, timeout_micros=timeout)
                getattr(want, _fast_socket.OPS[rpc]).CopyFrom(req)
                with self.subTest(rpc=rpc, call_id=call_id, timeout=timeout):
                    self.assertEqual(frame.data(call_id, timeout), want.SerializeToString())
        frame = _fast_socket.FastSocket("/nonexistent").frame("Quantize", requests["Quantize"])
        want = pb.FastRequest(call_id=3, quantize=requests["Quantize"])
        self.assertEqual(frame.data(3, 0), want.SerializeToString())
        hello = _fast_socket.Frame(_fast_socket._HELLO_KEY, pb.FastHello(
            session_id="s" * 200, auth_token="t").SerializeToString())
        want = pb.FastRequest(call_id=9, hello=pb.FastHello(session_id="s" * 200, auth_token="t"))
        self.assertEqual(hello.data(9, 0), want.SerializeToString())

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
    def test_bad_ipc_mode(self):
        with self.assertRaisesRegex(fp4q.ClientArgumentError, r"ipc: 'sometimes'"):
            fp4q.Client("127.0.0.1:1", ipc="sometimes")

    def test_cuda_tensor_with_ipc_require_needs_ipc(self):
        c = fp4q.Client("127.0.0.1:1", ipc="require")
        with self.assertRaisesRegex(fp4q.Fp4qError, r"ipc='require' but cuda:0 cannot"):
            c._ipc_refused(torch.device("cuda:0"), "no GPU here")
        c.close()


if __name__ == "__main__":
    unittest.main()
