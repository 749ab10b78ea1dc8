"""CUDA IPC logic that needs no server and no GPU: the region cache against fake allocations,
the driver's ctypes marshalling, the server's GPU spelling, and a CUDA tensor's way into a
request (fp4q.ipc, fp4q._cuda_driver, fp4q._regions)."""

import collections
import ctypes
import threading
import types
import unittest
from unittest import mock

import grpc
import torch

import fp4q
from fp4q import _cuda_driver, _regions, _streams, ipc
from fp4q._messages import pb


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

        def bind_context(index):
            self.calls.append("bind context")

        real_current_device = ipc._current_device

        def current_device(index):
            self.calls.append("device switch")
            return real_current_device(index)

        patches = [mock.patch.object(_cuda_driver, "allocation_identity", allocation_identity),
                   mock.patch.object(_cuda_driver, "address_range", address_range),
                   mock.patch.object(_cuda_driver, "ipc_handle", ipc_handle),
                   mock.patch.object(_cuda_driver, "bind_context", bind_context),
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
        self.assertEqual(self.calls, ["cuPointerGetAttributes", "device switch", "bind context",
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

    def test_identities_name_the_allocation_on_a_miss_and_on_a_hit(self):
        seen = []
        self.assertEqual(self.cache.slice_for(FakeTensor(0x10000), "GPU-x", seen), ("r1", 0))
        self.assertEqual(self.cache.slice_for(FakeTensor(0x10100), "GPU-x", seen), ("r1", 0x100))
        self.assertEqual(seen, [(0, 0x10000, 0x100000, 1), (0, 0x10000, 0x100000, 1)])
        self.identity_works = False  # no buffer id: nothing to check again later
        seen = []
        self.cache.slice_for(FakeTensor(0x200000), "GPU-x", seen)
        self.assertEqual(seen, [])

    def test_the_generation_grows_whenever_a_region_leaves(self):
        self.allocs[0x300000] = (0x1000, b"D" * 64, 4)
        self.cache.slice_for(FakeTensor(0x10000), "GPU-x")
        self.cache.slice_for(FakeTensor(0x200000), "GPU-x")
        self.cache.slice_for(FakeTensor(0x10000), "GPU-x")
        self.assertEqual(self.cache.generation, 0)  # registrations and hits remove nothing
        self.cache.slice_for(FakeTensor(0x300000), "GPU-x")  # evicts r2
        self.assertEqual(self.cache.generation, 1)
        self.allocs[0x10000] = (0x100000, b"C" * 64, 9)  # freed and re-made: r1 is stale
        self.cache.slice_for(FakeTensor(0x10000), "GPU-x")
        self.assertEqual(self.cache.generation, 2)  # the stale r1 dropped
        self.cache.clear()
        self.assertEqual(self.cache.generation, 3)

    def test_uuid_spelling(self):
        raw = bytes(range(16))
        self.assertEqual(ipc.format_uuid(raw), "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f")
        self.assertEqual(ipc.normalize_uuid("GPU-ABCD"), ipc.normalize_uuid("abcd"))


class CudaDriverTest(unittest.TestCase):
    """allocation_identity's and bind_context's ctypes marshalling against a fake libcuda."""

    def test_bind_context_binds_the_primary_context_only_where_none_is_current(self):
        seen = []

        class FakeLib:
            current = 0

            def cuCtxGetCurrent(self, out):
                seen.append("get")
                out._obj.value = self.current
                return 0

            def cuDeviceGet(self, dev, ordinal):
                seen.append(("device", ordinal))
                dev._obj.value = 10 + ordinal
                return 0

            def cuDevicePrimaryCtxRetain(self, ctx, dev):
                seen.append(("retain", dev))
                ctx._obj.value = 0x5000 + dev
                return 0

            def cuCtxSetCurrent(self, ctx):
                seen.append(("set", ctx.value))
                self.current = ctx.value
                return 0

            def cuGetErrorName(self, result, name):
                return 0

        lib = FakeLib()
        with mock.patch.object(_cuda_driver, "_lib", lib), \
                mock.patch.object(_cuda_driver, "_primary", {}):
            _cuda_driver.bind_context(1)  # no current context: bind device 1's primary one
            _cuda_driver.bind_context(1)  # now one is current: nothing to do
            lib.current = 0
            _cuda_driver.bind_context(1)  # retained once: set again without a second retain
        self.assertEqual(seen, ["get", ("device", 1), ("retain", 11), ("set", 0x500b), "get",
                                "get", ("set", 0x500b)])

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


    def test_buffer_id_is_one_cu_pointer_get_attribute_call(self):
        seen = []

        class FakeLib:
            def cuPointerGetAttribute(self, data, attribute, ptr):
                seen.append((attribute, ptr))
                if ptr == 0xdead:
                    return 1  # CUDA_ERROR_INVALID_VALUE: a pointer the driver does not know
                ctypes.c_uint64.from_address(data).value = 0x1234567890
                return 0

            def cuGetErrorName(self, result, name):
                return 0

        with mock.patch.object(_cuda_driver, "_lib", FakeLib()):
            self.assertEqual(_cuda_driver.buffer_id(0x7f0000000100), 0x1234567890)
            with self.assertRaisesRegex(_cuda_driver.DriverError, r"cuPointerGetAttribute"
                                        r"\(BUFFER_ID, 0xdead\) failed: CUresult 1"):
                _cuda_driver.buffer_id(0xdead)
        self.assertEqual(seen, [(7, 0x7f0000000100), (7, 0xdead)])

    def test_the_stream_query_and_synchronize_are_one_driver_call_each(self):
        seen = []

        class FakeLib:
            def cuStreamQuery(self, stream):
                seen.append(("query", stream))
                return {0x5000: 0, 0x6000: 600}.get(stream, 400)  # 400: INVALID_HANDLE

            def cuStreamSynchronize(self, stream):
                seen.append(("synchronize", stream))
                return 0 if stream != 0xbad else 700  # 700: an earlier kernel's fault

            def cuGetErrorName(self, result, name):
                return 0

        with mock.patch.object(_cuda_driver, "_lib", FakeLib()):
            self.assertIs(_cuda_driver.stream_query(0x5000), True)  # everything done
            self.assertIs(_cuda_driver.stream_query(0x6000), False)  # CUDA_ERROR_NOT_READY
            with self.assertRaisesRegex(_cuda_driver.DriverError,
                                        r"cuStreamQuery\(0x7000\) failed: CUresult 400"):
                _cuda_driver.stream_query(0x7000)
            self.assertIsNone(_cuda_driver.stream_synchronize(0))
            with self.assertRaisesRegex(_cuda_driver.DriverError,
                                        r"cuStreamSynchronize\(0xbad\) failed: CUresult 700"):
                _cuda_driver.stream_synchronize(0xbad)
        self.assertEqual(seen, [("query", 0x5000), ("query", 0x6000), ("query", 0x7000),
                                ("synchronize", 0), ("synchronize", 0xbad)])
        self.assertEqual(_cuda_driver.CUDA_ERROR_NOT_READY, 600)


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

    def slice_for(self, tensor, uuid, identities=None):
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
        with mock.patch.object(_streams, "synchronize") as synchronize:
            tr.before_send()
        synchronize.assert_called_once_with(torch.device("cuda:0"))
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
