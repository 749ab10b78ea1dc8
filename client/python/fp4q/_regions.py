"""Where each tensor of a request travels: inline bytes, or a slice of a registered CUDA region.

Contract
- `Regions` is the client's CUDA IPC state for its session: the mode ("auto", "never",
  "require"), the server's ServerInfo (cached until a restart: forget_server_info), the UUIDs of
  the GPUs it serves, the region cache (fp4q.ipc.RegionCache: one RegisterCudaRegion per
  allocation) and the arenas (fp4q.ipc.Arena). uuid_for(device) says whether IPC may carry a
  device's tensors (the server's spelling of its UUID, with a session ensured for the
  registrations) or raises ipc.NoIpc with the reason; refused(device, reason) records that
  reason in the client's `ipc_reasons` and "ipc_fallbacks" stat, or raises FAILED_PRECONDITION
  under ipc="require". A server that refuses RegisterCudaRegion with FAILED_PRECONDITION
  disables IPC for this client (its message becomes every later reason). clear(): the session
  that held the regions is gone, so the cache forgets them.
- `Transfer` is one request's use of it, built by fp4q._requests for every attempt: input()
  fills a fp4q.v1.Tensor from a torch tensor (a CUDA tensor by IPC when possible, copied into an
  aligned allocation or an arena slot when needed; otherwise inline), input_region() gives a
  tensor's (region_id, offset) or None, output() plans where an output goes (a tensor allocated
  here that the server writes by IPC, or None for inline). before_send() synchronizes the
  current CUDA stream of every device involved (the ordering contract of fp4q.proto);
  after_reply() copies arena outputs to their tensors; release() frees the arena (always call
  it). `uses_regions`: the request names a region, so it cannot be resent as is in a new session.
- Reuse (fp4q._requests' step plans): a Transfer whose every tensor went as a slice of its own
  allocation (`direct`: nothing inline, copied, arena-held or allocated here) records those
  allocations; plan(...) returns them with what else the request's validity rests on (the
  server's ServerInfo, the cache's generation), plan_valid(plan) checks them again with one
  driver call per allocation (the same buffer id at the same range: the same allocation, so
  the same tensors' slices), and adopt(plan) makes a Transfer stand for the recorded one.
- Ownership: a Transfer keeps the tensors it sent by IPC alive until release(); an arena is held
  (its lock) by one request from its first slot to release(). A plan holds no tensor.
- Thread safety: Regions may be used from any number of threads (the cache and arenas lock);
  a Transfer belongs to one request on one thread.
"""

import threading

import grpc
import torch

from fp4q import _cuda_driver, _streams
from fp4q import ipc
from fp4q import tensors
from fp4q._messages import pb
from fp4q.errors import Fp4qError

IPC_MODES = ("auto", "never", "require")


class Regions:
    """`send(rpc, request)` is the client's call path; `ensure_session()` opens a session when
    none is open; `count(key, n=1)` adds to the client's stats; `reasons` is its ipc_reasons."""

    def __init__(self, mode, max_regions, *, send, ensure_session, count, reasons):
        if mode not in IPC_MODES:
            raise tensors.ClientArgumentError("ipc: %r is not one of %s" % (mode, IPC_MODES))
        self.mode = mode
        self.info = None  # the server's ServerInfoReply, once asked (None again after a restart)
        self._send = send
        self._ensure_session = ensure_session
        self.count = count
        self._reasons = reasons
        self._lock = threading.Lock()
        self._uuids = {}
        self._served = None  # (ServerInfoReply, {normalized GPU UUID: the server's spelling})
        self._arenas = {}
        self._disabled = None  # the server's refusal message, once seen
        self.cache = ipc.RegionCache(self._register_for_cache, self._unregister_quietly,
                                     max_regions)

    def clear(self):
        self.cache.clear()

    def forget_server_info(self):
        self.info = None

    def transfer(self):
        return Transfer(self)

    # ------------------------------------------------------------------ may IPC carry it

    def _server_info(self):
        with self._lock:
            info = self.info
        if info is None:
            info = self._send("ServerInfo", pb.ServerInfoRequest())
            with self._lock:
                self.info = info
        return info

    def uuid_for(self, device):
        """The server's spelling of `device`'s UUID when IPC may carry it; raises ipc.NoIpc."""
        if self.mode == "never":
            raise ipc.NoIpc("ipc='never'")
        if self._disabled:
            raise ipc.NoIpc(self._disabled)
        info = self._server_info()
        served = self._served
        if served is None or served[0] is not info:
            if "cuda_ipc" not in info.supported_modes:
                raise ipc.NoIpc("the server (backend %s) does not offer cuda_ipc" %
                                info.backend)
            by_uuid = {}
            for gpu in info.gpus:
                by_uuid.setdefault(ipc.normalize_uuid(gpu.uuid), gpu.uuid)
            served = self._served = (info, by_uuid)  # per ServerInfo reply, not per tensor
        index = device.index if device.index is not None else torch.cuda.current_device()
        uuid = self._uuids.get(index)
        if uuid is None:
            try:
                uuid = ipc.device_uuid(index)
            except Exception as e:  # noqa: BLE001 - any driver failure means "no IPC"
                raise ipc.NoIpc("cannot read the UUID of cuda:%d: %s" % (index, e)) from e
            self._uuids[index] = uuid
        spelling = served[1].get(ipc.normalize_uuid(uuid))
        if spelling is not None:
            self._ensure_session()
            return spelling
        raise ipc.NoIpc("cuda:%d (%s) is not a GPU this server serves (%s): another node "
                        "or another GPU" % (index, uuid, [g.uuid for g in info.gpus]))

    def refused(self, device, reason):
        if self.mode == "require":
            raise Fp4qError(grpc.StatusCode.FAILED_PRECONDITION,
                            "ipc='require' but %s cannot travel by CUDA IPC: %s" % (device, reason))
        self._reasons[str(device)] = reason
        self.count("ipc_fallbacks")

    # ------------------------------------------------------------------ registrations

    def register(self, ipc_handle, size, device_uuid=""):
        self._ensure_session()
        reply = self._send("RegisterCudaRegion", pb.RegisterCudaRegionRequest(
            ipc_handle=bytes(ipc_handle), size=int(size), device_uuid=device_uuid))
        self.count("registrations")
        return reply.region_id

    def unregister(self, region_id):
        self._send("UnregisterCudaRegion", pb.UnregisterCudaRegionRequest(region_id=region_id))

    def register_tensor(self, tensor):
        if not isinstance(tensor, torch.Tensor) or tensor.device.type != "cuda":
            raise tensors.ClientArgumentError("tensor: expected a CUDA torch.Tensor")
        try:
            return self.cache.slice_for(tensor, self.uuid_for(tensor.device))
        except ipc.NoIpc as e:
            raise Fp4qError(grpc.StatusCode.FAILED_PRECONDITION, str(e)) from None

    def register_held(self, tensor, kept=None):
        """register_tensor() for a tensor the caller holds as long as it uses the answer (its
        allocation cannot be freed and made again meanwhile), as (slot, kept): `kept` is the
        last call's, and while the server's ServerInfo reply and the region cache's
        generation are the ones it was answered under (no region left the cache, no new
        session, no restarted server) the last slot is the answer again, without the
        registration's checks and driver call."""
        cache = self.cache
        if kept is not None and kept[1] is self.info and kept[2] == cache.generation:
            return kept[0], kept
        generation = cache.generation  # before: a region leaving meanwhile redoes it next time
        slot = self.register_tensor(tensor)
        return slot, (slot, self.info, generation)

    def _register_for_cache(self, handle, size, uuid):
        try:
            return self.register(handle, size, uuid)
        except Fp4qError as e:
            if e.code == grpc.StatusCode.FAILED_PRECONDITION:
                self._disabled = "the server refused RegisterCudaRegion: " + e.message
                raise ipc.NoIpc(self._disabled) from e
            raise

    def _unregister_quietly(self, region_id):
        try:
            self.unregister(region_id)
        except Fp4qError:
            pass

    # ------------------------------------------------------------------ arenas

    def enable_arena(self, device, nbytes, max_tensor_bytes):
        arena = ipc.Arena(device, nbytes, max_tensor_bytes)
        self._arenas[str(arena.device)] = arena
        return arena

    def arena_for(self, device):
        if not self._arenas:
            return None
        return self._arenas.get(str(torch.device(device)))

    # ------------------------------------------------------------------ reuse

    def plan_valid(self, plan):
        """Whether the slices a Transfer recorded (Transfer.plan) still name the same
        allocations, in regions this cache still holds."""
        if self.mode == "never" or self._disabled:
            return False
        with self._lock:
            info = self.info
        if info is None or info is not plan.info or plan.generation != self.cache.generation:
            return False
        self._ensure_session()
        # Each allocation's buffer id alone: ids are unique over the process's life, so an
        # equal id is the same allocation, alive, with the range the plan recorded.
        for _index, _start, _range_size, buffer_id, ptr, _region, _base in plan.allocations:
            try:
                if _cuda_driver.buffer_id(ptr) == buffer_id:
                    continue
                return False
            except _cuda_driver.DriverError:
                pass  # the singular call refused: the plural call decides
            try:
                if _cuda_driver.allocation_identity(ptr)[2] != buffer_id:
                    return False
            except _cuda_driver.DriverError:
                return False
        return True


class TransferPlan:
    """What a direct Transfer's validity rests on (see the module docstring)."""

    __slots__ = ("info", "generation", "allocations", "devices", "tensors")

    def __init__(self, info, generation, allocations, devices, tensors):
        self.info = info                # the ServerInfoReply the UUID spellings came from
        self.generation = generation    # the region cache's, before the first slice
        # ((index, start, range size, buffer id, a pointer, region id, region base), ...)
        self.allocations = allocations
        self.devices = devices          # the CUDA devices whose streams are synchronized
        self.tensors = tensors          # how many tensors went by IPC

    def locate(self, ptr):
        """(region_id, offset) of address `ptr` in one of the plan's allocations, or None (not
        in one, or not aligned as a region slice must be). Sound while plan_valid holds: every
        allocation recorded is then alive as it was, and allocations do not overlap."""
        if ptr is None:
            return None
        for _index, start, range_size, _buffer_id, _ptr, region_id, base in self.allocations:
            if max(start, base) <= ptr < start + range_size:
                offset = ptr - base
                return None if offset % ipc.REGION_ALIGNMENT else (region_id, offset)
        return None


class Transfer:
    """One request's tensors: see the module docstring."""

    def __init__(self, regions):
        self._regions = regions
        self.uses_regions = False
        self._devices = set()
        self._keep = []          # tensors that must outlive the request
        self._copy_back = []     # (arena view, destination tensor)
        self._arena = None
        self.direct = True       # every tensor so far a slice of its own allocation
        self._generation = regions.cache.generation
        # (index, start) -> (index, start, range size, buffer id, ptr, region id, region base)
        self._allocations = {}

    def _region_for(self, tensor):
        """(tensor holding the bytes, (region_id, offset)) for a CUDA tensor; raises ipc.NoIpc."""
        regions = self._regions
        device = tensor.device
        uuid = regions.uuid_for(device)
        arena = regions.arena_for(device)
        nbytes = tensor.numel() * tensor.element_size()
        if arena is not None and arena.fits(nbytes):
            if self._arena is None:
                arena.lock.acquire()
                self._arena = arena
            if self._arena is arena:
                view = arena.take(nbytes, tensor.dtype, tuple(tensor.shape))
                if view is not None:
                    self.direct = False
                    return view, regions.cache.slice_for(view, uuid)
        identities = []
        slot = regions.cache.slice_for(tensor, uuid, identities)
        if identities:
            index, start, range_size, buffer_id = identities[0]
            ptr = tensor.data_ptr()
            self._allocations.setdefault(
                (index, start),
                (index, start, range_size, buffer_id, ptr, slot[0], ptr - slot[1]))
        else:
            self.direct = False
        return tensor, slot

    def _note_ipc(self, tensor):
        self.uses_regions = True
        self._devices.add(tensor.device)
        self._keep.append(tensor)
        self._regions.count("ipc_tensors")

    # ------------------------------------------------------------------ inputs

    def input(self, msg, tensor, field):
        """Fills `msg` (fp4q.v1.Tensor) from `tensor`; CUDA tensors by IPC when possible."""
        if not isinstance(tensor, torch.Tensor):
            raise tensors.ClientArgumentError("%s: expected a torch.Tensor, got %s" %
                                              (field, type(tensor).__name__))
        t = tensor.detach() if tensor.requires_grad else tensor
        msg.dtype = tensors.proto_dtype(t, field)
        del msg.shape[:]
        msg.shape.extend(t.shape)
        slot = self.input_region(t)
        if slot is None:
            self.direct = False
            msg.inline_data = tensors.tensor_bytes(t)
            self._regions.count("inline_tensors")
        else:
            msg.region.region_id, msg.region.offset = slot

    def input_region(self, t):
        """(region_id, offset) holding `t`'s bytes, or None to send it inline."""
        if not t.is_cuda or t.numel() == 0:
            self.direct = False
            return None
        try:
            src = t.contiguous()
            if src is not t:
                self.direct = False
            try:
                dest, slot = self._region_for(src)
            except ipc.NoIpc as e:
                if "not a multiple" not in str(e):
                    raise
                self.direct = False
                src = src.clone()  # a fresh allocation is aligned
                dest, slot = self._region_for(src)
        except ipc.NoIpc as e:
            self.direct = False
            self._regions.refused(t.device, str(e))
            return None
        if dest is not src:
            dest.copy_(src)
        self._note_ipc(dest)
        return slot

    # ------------------------------------------------------------------ outputs

    def output(self, target, shape, dtype, device):
        """Plans an output of `shape`/`dtype` wanted on `device`.

        Returns a tensor the server will write through IPC (and points `target`, a
        fp4q.v1.OutputTarget, at it), or None for inline.
        """
        self.direct = False  # a tensor allocated for this request
        device = torch.device(device)
        if device.type != "cuda":
            return None
        out = torch.empty(shape, dtype=dtype, device=device)
        if out.numel() == 0:
            return None
        try:
            dest, slot = self._region_for(out)
        except ipc.NoIpc as e:
            self._regions.refused(device, str(e))
            return None
        if dest is not out:
            self._copy_back.append((dest, out))
        self._note_ipc(dest)
        target.region.region_id, target.region.offset = slot
        return out

    # ------------------------------------------------------------------ reuse

    def plan(self):
        """A TransferPlan of this request's slices when it was direct and used regions, else
        None."""
        if not (self.direct and self.uses_regions and self._allocations):
            return None
        with self._regions._lock:
            info = self._regions.info
        return TransferPlan(info, self._generation, tuple(self._allocations.values()),
                            frozenset(self._devices), len(self._keep))

    def adopt(self, plan):
        """Stands for the Transfer `plan` was made from (its slices checked by plan_valid)."""
        self.uses_regions = True
        self._devices = set(plan.devices)
        self._regions.count("ipc_tensors", plan.tensors)

    # ------------------------------------------------------------------ ordering

    def before_send(self, skip=None):
        """Waits for the current stream of each device the request's tensors are on, except
        `skip` (a device whose order the caller keeps otherwise)."""
        for dev in self._devices:
            if dev != skip:
                _streams.synchronize(dev)

    def let_go(self):
        """Drops the references that keep the request's tensors alive until its reply: the
        caller has ordered every later use of their memory after the server's work (a stream
        wait on the step's done signal)."""
        self._keep = []

    def writes_in_place(self):
        """True when no output of this request is copied into its tensor after the reply."""
        return not self._copy_back

    def after_reply(self):
        for view, out in self._copy_back:
            out.copy_(view)
        self._copy_back = []
        self.release()

    def release(self):
        if self._arena is not None:
            self._arena.reset()
            self._arena.lock.release()
            self._arena = None
        self._keep = []
