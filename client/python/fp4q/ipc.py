"""CUDA IPC transport: CUDA tensors travel as (region, offset) instead of bytes.

A region is one cudaMalloc allocation (the caching allocator's segment holding the tensor),
registered once with RegisterCudaRegion and cached under (device, base) with the allocation's
buffer id; a tensor is sent as that region plus its byte offset from the allocation's base,
which is exactly what PyTorch's own CUDA tensor sharing sends. Every tensor costs one driver
call (cuPointerGetAttributes: range start, range size, buffer id; no device switch): the buffer
id is unique over the process lifetime, so an allocation freed and re-made at the same address
has a new one and a stale region is never used. Only a miss exports the IPC handle (in the
tensor's device's context) and registers it; a stale region is unregistered when its address
range is seen again with another buffer id (or, where the driver reports no buffer id, another
handle), and the least recently used region goes when more than `max_regions` are held.

IPC is used only when all of these hold; otherwise the tensor goes inline and `reason` says why:
the server offers "cuda_ipc", serves the tensor's GPU (same UUID, hence the same node), the
allocation has a legacy IPC handle (not PYTORCH_CUDA_ALLOC_CONF=expandable_segments), and the
tensor is contiguous with an offset that is a multiple of 16 bytes (else a copy is sent).

`Arena`: an optional pooled buffer, one registration for many small tensors; small inputs are
copied into it and small outputs written there and copied out after the reply.
"""

import collections
import contextlib
import threading

import torch

from fp4q import _cuda_driver

REGION_ALIGNMENT = 16


class NoIpc(Exception):
    """IPC cannot carry this tensor; str() is the reason."""


def format_uuid(raw16):
    """'GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx' from 16 UUID bytes (nvidia-smi spelling)."""
    h = bytes(raw16).hex()
    return "GPU-%s-%s-%s-%s-%s" % (h[0:8], h[8:12], h[12:16], h[16:20], h[20:32])


def normalize_uuid(uuid):
    u = uuid.strip().lower()
    return u[4:] if u.startswith("gpu-") else u


def _current_device(index):
    """Makes cuda:`index` current for a `with` block (nothing to do where CUDA is absent)."""
    return torch.cuda.device(index) if torch.cuda.is_available() else contextlib.nullcontext()


def device_uuid(index):
    """The UUID of torch CUDA device `index` in nvidia-smi spelling."""
    return format_uuid(_cuda_driver.device_uuid_bytes(index))


def _aligned_offset(offset):
    if offset % REGION_ALIGNMENT:
        raise NoIpc("offset %d in its allocation is not a multiple of %d" %
                    (offset, REGION_ALIGNMENT))
    return offset


class _Region:
    __slots__ = ("region_id", "base", "size", "handle", "buffer_id", "range_size")

    def __init__(self, region_id, base, size, handle, buffer_id, range_size):
        self.region_id = region_id
        self.base = base              # cuMemGetAddressRange base: offsets are from here
        self.size = size
        self.handle = handle
        self.buffer_id = buffer_id    # CU_POINTER_ATTRIBUTE_BUFFER_ID; 0 when unknown
        self.range_size = range_size  # CU_POINTER_ATTRIBUTE_RANGE_SIZE at registration


class RegionCache:
    """Registered allocations of one session. Thread-safe.

    `register(handle, size, device_uuid) -> region_id` and `unregister(region_id)` are the
    client's RPCs; they are called with the cache lock released.
    """

    def __init__(self, register, unregister, max_regions=256):
        self._register = register
        self._unregister = unregister
        self._max = max_regions
        self._lock = threading.Lock()
        self._regions = collections.OrderedDict()  # (device index, base) -> _Region
        self.registrations = 0  # RegisterCudaRegion calls made
        self.hits = 0  # tensors served by the buffer-id check alone (no IPC handle export)
        # Grows whenever a region leaves the cache (clear, stale, evicted): a slice handed out
        # under an older generation may name a region that is gone.
        self.generation = 0

    def clear(self):
        """Forgets every region (the session that held them is gone)."""
        with self._lock:
            self._regions.clear()
            self.generation += 1

    def region_ids(self):
        with self._lock:
            return [r.region_id for r in self._regions.values()]

    def slice_for(self, tensor, uuid, identities=None):
        """(region_id, offset) for a contiguous, 16-byte aligned CUDA tensor; NoIpc if not.
        With a list `identities`, appends (device index, range start, range size, buffer id)
        of the tensor's allocation when the driver names it by a buffer id (what
        Regions.plan_valid checks again later)."""
        index = tensor.device.index
        if index is None:
            index = 0
        ptr = tensor.data_ptr()
        # Hit path: one driver call that needs no current context names the allocation; the
        # region registered for that very allocation (same buffer id) is reused as is.
        try:
            start, range_size, buffer_id = _cuda_driver.allocation_identity(ptr)
        except _cuda_driver.DriverError:
            start = range_size = buffer_id = 0  # the export path below says what is wrong
        if buffer_id:
            key = (index, start)
            with self._lock:
                region = self._regions.get(key)
                if (region is not None and region.buffer_id == buffer_id
                        and region.range_size == range_size
                        and region.base <= ptr < region.base + region.size):
                    offset = _aligned_offset(ptr - region.base)
                    self._regions.move_to_end(key)
                    self.hits += 1
                    if identities is not None:
                        identities.append((index, start, range_size, buffer_id))
                    return region.region_id, offset
        # Miss: export the allocation's handle. These driver calls act in the current context:
        # make it the tensor's device's (as the C++ client does), whichever device is current,
        # and bind one on a thread that has none.
        try:
            with _current_device(index):
                _cuda_driver.bind_context(index)
                base, size = _cuda_driver.address_range(ptr)
                handle = _cuda_driver.ipc_handle(base)
        except _cuda_driver.DriverError as e:
            raise NoIpc("no IPC handle for this allocation (%s); expandable_segments "
                        "allocations cannot be shared" % e) from e
        offset = _aligned_offset(ptr - base)
        if not buffer_id:
            key = (index, base)  # no buffer id from the driver: the handle tells staleness
        stale = []
        with self._lock:
            region = self._regions.get(key)
            if (region is not None and region.handle == handle and region.size == size
                    and region.base == base and (not buffer_id or region.buffer_id == buffer_id)):
                self._regions.move_to_end(key)  # another thread registered it meanwhile
                if identities is not None and buffer_id:
                    identities.append((index, start, range_size, buffer_id))
                return region.region_id, offset
            if region is not None:
                stale.append(self._regions.pop(key))
                self.generation += 1
        for old in stale:
            self._drop(old)
        region_id = self._register(handle, size, uuid)
        evicted = []
        with self._lock:
            self.registrations += 1
            self._regions[key] = _Region(region_id, base, size, handle, buffer_id, range_size)
            while len(self._regions) > self._max:
                evicted.append(self._regions.popitem(last=False)[1])
                self.generation += 1
        for old in evicted:
            self._drop(old)
        if identities is not None and buffer_id:
            identities.append((index, start, range_size, buffer_id))
        return region_id, offset

    def _drop(self, region):
        try:
            self._unregister(region.region_id)
        except Exception:  # noqa: BLE001 - the region is gone either way (session ended)
            pass


class Arena:
    """A registered CUDA buffer carved into 256-byte aligned slots, reset after each request.

    Holds a lock for the whole request that uses it (one request at a time per arena).
    """

    SLOT_ALIGNMENT = 256

    def __init__(self, device, nbytes, max_tensor_bytes):
        self.device = torch.device(device)
        self.buffer = torch.empty(int(nbytes), dtype=torch.uint8, device=self.device)
        self.max_tensor_bytes = int(max_tensor_bytes)
        self.lock = threading.Lock()
        self._used = 0

    def fits(self, nbytes):
        return nbytes <= self.max_tensor_bytes

    def take(self, nbytes, dtype, shape):
        """A tensor view into the arena, or None when the arena is full for this request."""
        start = -(-self._used // self.SLOT_ALIGNMENT) * self.SLOT_ALIGNMENT
        if start + nbytes > self.buffer.numel():
            return None
        self._used = start + nbytes
        view = self.buffer[start:start + nbytes]
        return view.view(dtype).reshape(shape) if nbytes else torch.empty(
            shape, dtype=dtype, device=self.device)

    def reset(self):
        self._used = 0
