"""The fakes of the step plan and step signal tests (test_step_plans.py, test_step_signals.py):
CUDA tensors that say where they are, a driver that knows three fake allocations, and a server
that answers Step, RegisterCudaRegion and ServerInfo. No GPU, no server."""

import collections
import contextlib
import weakref
from unittest import mock

import grpc
import torch

import fp4q
from fp4q import _cuda_driver, _overlap, _regions, _requests, _streams, ipc
from fp4q._messages import Serialized, pb


class FakeCudaTensor(torch.Tensor):
    """A torch tensor that says it is a contiguous CUDA tensor at `ptr` (its bytes are a CPU
    tensor's: nothing here reads them)."""

    __torch_function__ = torch._C._disabled_torch_function_impl
    is_cuda = True
    at = weakref.WeakValueDictionary()  # ptr -> the latest such tensor, for driver writes

    @staticmethod
    def __new__(cls, ptr, shape=(32, 16), index=0, dtype=torch.bfloat16):
        t = torch.Tensor._make_subclass(cls, torch.zeros(shape, dtype=dtype))
        t.fake_ptr, t.fake_device = ptr, torch.device("cuda", index)
        FakeCudaTensor.at[ptr] = t
        return t

    @property
    def device(self):
        return self.fake_device

    def data_ptr(self):
        return self.fake_ptr


GRADS, PARAMS, SIGNAL = 0x100000, 0x800000, 0xF00000  # the bases of fake allocations

class StepFixture:
    """setUp's fakes for a unittest.TestCase: self.regions (fp4q._regions.Regions over the fake
    driver and server), self.requests, self.server, self.sent (the Step requests), self.stats,
    self.driver_calls, self.word_writes, self.grads and self.params (three weights' fake CUDA
    tensors)."""

    def setUp(self):
        # base -> (size, IPC handle, buffer id)
        self.allocs = {GRADS: (0x100000, b"G" * 64, 11), PARAMS: (0x100000, b"P" * 64, 12),
                       SIGNAL: (0x200, b"S" * 64, 13)}
        self.driver_calls = collections.Counter()
        self.sent = []
        self.stats = collections.Counter()
        self.info = pb.ServerInfoReply(backend="cuda", supported_modes=["cuda_ipc"],
                                       gpus=[pb.GpuInfo(uuid="GPU-00AA")])

        def find(ptr):
            for base, (size, handle, buffer_id) in self.allocs.items():
                if base <= ptr < base + size:
                    return base, size, handle, buffer_id
            raise _cuda_driver.DriverError("0x%x: CUDA_ERROR_INVALID_VALUE" % ptr)

        def allocation_identity(ptr):
            self.driver_calls["identity"] += 1
            base, size, _, buffer_id = find(ptr)
            return base, size, buffer_id

        def buffer_id(ptr):
            self.driver_calls["buffer id"] += 1
            return find(ptr)[3]

        def address_range(ptr):
            self.driver_calls["range"] += 1
            return find(ptr)[:2]

        def ipc_handle(base):
            self.driver_calls["export"] += 1
            return self.allocs[base][1]

        self.word_writes = []  # (stream, ptr, value) of each cuStreamWriteValue32

        def stream_write_value32(stream, ptr, value):
            """The driver's write, done at once into the fake signal tensor's bytes."""
            self.word_writes.append((stream, ptr, value))
            signal = FakeCudaTensor.at.get(SIGNAL)
            if signal is None or not SIGNAL <= ptr < SIGNAL + 4 * signal.numel():
                raise _cuda_driver.DriverError("0x%x: CUDA_ERROR_INVALID_VALUE" % ptr)
            signal.view(-1)[(ptr - SIGNAL) // 4] = _overlap._as_int32(value)

        self.stream_calls = []  # (driver call, stream handle) of each query and synchronize

        def stream_query(stream):
            self.stream_calls.append(("query", stream))
            return torch.cuda.current_stream.return_value.query()

        def stream_synchronize(stream):
            self.stream_calls.append(("synchronize", stream))
            torch.cuda.current_stream.return_value.synchronize()

        patches = [mock.patch.object(_cuda_driver, "allocation_identity", allocation_identity),
                   mock.patch.object(_cuda_driver, "buffer_id", buffer_id),
                   mock.patch.object(_cuda_driver, "address_range", address_range),
                   mock.patch.object(_cuda_driver, "ipc_handle", ipc_handle),
                   mock.patch.object(_cuda_driver, "stream_write_value32",
                                     stream_write_value32),
                   # torch's current stream is the mock below, on GPU machines too; the
                   # driver's stream calls answer as that stream does
                   mock.patch.object(_streams, "_raw_stream", None),
                   mock.patch.object(_cuda_driver, "stream_query", stream_query),
                   mock.patch.object(_cuda_driver, "stream_synchronize", stream_synchronize),
                   mock.patch.object(_cuda_driver, "bind_context", lambda index: None),
                   mock.patch.object(ipc, "_current_device", lambda i: contextlib.nullcontext()),
                   mock.patch.object(ipc, "device_uuid", return_value="gpu-00aa"),
                   mock.patch.object(torch.cuda, "current_stream")]
        for p in patches:
            p.start()
            self.addCleanup(p.stop)

        registered = []

        def server(rpc, request, resend=False):
            if rpc == "ServerInfo":
                return self.info
            if rpc == "RegisterCudaRegion":
                registered.append(request.ipc_handle)
                return pb.RegisterCudaRegionReply(region_id="region-%d" % len(registered))
            if rpc == "UnregisterCudaRegion":
                return pb.UnregisterCudaRegionReply()
            self.assertEqual(rpc, "Step")
            self.assertIs(type(request), Serialized)  # the head's bytes, then the items'
            request = pb.StepRequest.FromString(request.body)
            self.sent.append(request)
            if request.brief_reply:
                return pb.StepReply(applied_items=len(request.items))
            return pb.StepReply(items=[pb.StepItemResult(name=it.name, applied=True,
                                                         last_step=request.step)
                                       for it in request.items],
                                applied_items=len(request.items))

        self.server = server
        self.regions = _regions.Regions(
            "auto", 8, send=lambda rpc, req: server(rpc, req), ensure_session=lambda: "s",
            count=lambda k, n=1: self.stats.update({k: n}), reasons={})
        self.requests = _requests.Requests(server, lambda: False, self.regions)
        # Three weights: gradients in one allocation, the parameters (DQ outputs) in another.
        self.grads = [FakeCudaTensor(GRADS + 0x1000 * i) for i in range(3)]
        self.params = [FakeCudaTensor(PARAMS + 0x1000 * i) for i in range(3)]

    def plan_keeping_server(self):
        """self.server and self.requests: a fake server that keeps step plans. Returns (plans,
        refuse, bodies): {plan id: its items}, a list whose being non-empty makes the next Step
        naming a plan refused as unknown (NOT_FOUND), and every Step request's bytes."""
        self.info.supported_modes.append("step_plans")
        plans, refuse, bodies = {}, [], []
        plain = self.server

        def server(rpc, request, resend=False):
            if rpc != "Step":
                return plain(rpc, request, resend)
            bodies.append(request.body)
            req = pb.StepRequest.FromString(request.body)
            if req.plan_id and (refuse or req.plan_id not in plans):
                self.sent.append(req)
                refuse.clear()
                raise fp4q.Fp4qError(grpc.StatusCode.NOT_FOUND, "plan_id: this session holds "
                                     "no step plan %d (...)" % req.plan_id, "Step")
            reply = plain(rpc, request, resend)
            if req.keep_plan:
                reply.plan_id = 7 + len(plans)
                plans[reply.plan_id] = list(req.items)
            elif req.plan_id:
                reply.applied_items = len(plans[req.plan_id])
            return reply

        self.server = server
        self.requests = _requests.Requests(server, lambda: False, self.regions)
        return plans, refuse, bodies

    def items(self, grads=None, params=None):
        grads, params = grads or self.grads, params or self.params
        return [fp4q.StepItem(name="w%d" % i, update=g, dequantized_out=p)
                for i, (g, p) in enumerate(zip(grads, params))]

    def step(self, n, lr=0.1, items=None, brief=False):
        return self.requests.step(n, items or self.items(), [fp4q.SgdHyperparameters(lr=lr)],
                                  "gradient", None, False, brief)
