"""Client logic that needs no server: descriptor, options, conversions, region cache."""

import types
import unittest
from unittest import mock

import grpc
import torch

import fp4q
from fp4q import _cuda_driver, _messages, ipc, options, results, tensors
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


class TensorConversionTest(unittest.TestCase):
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
        self.allocs = {0x10000: (0x100000, b"A" * 64), 0x200000: (0x1000, b"B" * 64)}
        self.registered, self.unregistered = [], []

        def address_range(ptr):
            for base, (size, _) in self.allocs.items():
                if base <= ptr < base + size:
                    return base, size
            raise _cuda_driver.DriverError("cuMemGetAddressRange(0x%x) failed: "
                                           "CUDA_ERROR_NOT_FOUND" % ptr)

        def ipc_handle(base):
            return self.allocs[base][1]

        patches = [mock.patch.object(_cuda_driver, "address_range", address_range),
                   mock.patch.object(_cuda_driver, "ipc_handle", ipc_handle)]
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

    def test_reallocated_address_gets_a_new_region_and_drops_the_stale_one(self):
        self.cache.slice_for(FakeTensor(0x10000), "GPU-x")
        self.allocs[0x10000] = (0x100000, b"C" * 64)  # freed and re-made at the same base
        self.assertEqual(self.cache.slice_for(FakeTensor(0x10000), "GPU-x"), ("r2", 0))
        self.assertEqual(self.unregistered, ["r1"])

    def test_lru_eviction_and_refusals(self):
        self.allocs[0x300000] = (0x1000, b"D" * 64)
        self.cache.slice_for(FakeTensor(0x10000), "GPU-x")
        self.cache.slice_for(FakeTensor(0x200000), "GPU-x")
        self.cache.slice_for(FakeTensor(0x10000), "GPU-x")  # most recent now
        self.cache.slice_for(FakeTensor(0x300000), "GPU-x")
        self.assertEqual(self.unregistered, ["r2"])
        with self.assertRaisesRegex(ipc.NoIpc, r"offset 8 in its allocation is not a multiple"):
            self.cache.slice_for(FakeTensor(0x10008), "GPU-x")
        with self.assertRaisesRegex(ipc.NoIpc, r"CUDA_ERROR_NOT_FOUND"):
            self.cache.slice_for(FakeTensor(0x900000), "GPU-x")

    def test_uuid_spelling(self):
        raw = bytes(range(16))
        self.assertEqual(ipc.format_uuid(raw), "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f")
        self.assertEqual(ipc.normalize_uuid("GPU-ABCD"), ipc.normalize_uuid("abcd"))


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
