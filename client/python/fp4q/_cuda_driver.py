"""The few CUDA driver calls the IPC path needs, through ctypes on libcuda.so.1.

Why the driver and not torch's `_share_cuda_()`: both give the same cudaIpcMemHandle (of the
base of the cudaMalloc allocation holding the tensor) and the same byte offset from that base,
but `_share_cuda_()` also rewraps the storage for torch's own consumer protocol (a reference
count in shared memory and an interprocess event per call) which fp4qd never releases, so every
shared storage would linger after it is freed. The driver calls have no side effect.

Every function raises DriverError (with the driver's error name) on failure; none of them is
used unless a CUDA tensor is about to travel by IPC.
"""

import ctypes
import threading

IPC_HANDLE_BYTES = 64

# CUpointer_attribute values (cuda.h, CUDA 12 and 13; ABI-stable enum).
CU_POINTER_ATTRIBUTE_BUFFER_ID = 7
CU_POINTER_ATTRIBUTE_RANGE_START_ADDR = 11
CU_POINTER_ATTRIBUTE_RANGE_SIZE = 12


class DriverError(RuntimeError):
    pass


class _IpcMemHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * IPC_HANDLE_BYTES)]


class _Uuid(ctypes.Structure):
    _fields_ = [("bytes", ctypes.c_ubyte * 16)]


_lib = None
_lib_lock = threading.Lock()


def _driver():
    global _lib
    lib = _lib
    if lib is not None:  # set once, fully configured
        return lib
    with _lib_lock:
        if _lib is None:
            try:
                lib = ctypes.CDLL("libcuda.so.1")
            except OSError as e:
                raise DriverError("libcuda.so.1 cannot be loaded: %s" % e) from e
            lib.cuMemGetAddressRange_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64),
                                                    ctypes.POINTER(ctypes.c_size_t),
                                                    ctypes.c_uint64]
            lib.cuPointerGetAttributes.argtypes = [ctypes.c_uint, ctypes.POINTER(ctypes.c_int),
                                                   ctypes.POINTER(ctypes.c_void_p),
                                                   ctypes.c_uint64]
            lib.cuPointerGetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int,
                                                  ctypes.c_uint64]
            lib.cuIpcGetMemHandle.argtypes = [ctypes.POINTER(_IpcMemHandle), ctypes.c_uint64]
            lib.cuGetErrorName.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
            lib.cuDeviceGet.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int]
            lib.cuDeviceGetUuid.argtypes = [ctypes.POINTER(_Uuid), ctypes.c_int]
            lib.cuCtxGetCurrent.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
            lib.cuCtxSetCurrent.argtypes = [ctypes.c_void_p]
            lib.cuDevicePrimaryCtxRetain.argtypes = [ctypes.POINTER(ctypes.c_void_p),
                                                     ctypes.c_int]
            lib.cuStreamQuery.argtypes = [ctypes.c_void_p]
            lib.cuStreamSynchronize.argtypes = [ctypes.c_void_p]
            # The stream memory operations (stream, address, value, flags), as lib.fp4q_<op>:
            # the _v2 entry point where this libcuda has it.
            for op, name in (("wait_value32", "cuStreamWaitValue32"),
                             ("write_value32", "cuStreamWriteValue32")):
                f = getattr(lib, name + "_v2", None) or getattr(lib, name, None)
                if f is not None:
                    f.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32,
                                  ctypes.c_uint]
                    setattr(lib, "fp4q_" + op, f)
            _lib = lib
        return _lib


def _check(result, what, *args):
    """Raises DriverError naming `what % args` (formatted only then) unless result is 0."""
    if result != 0:
        name = ctypes.c_char_p()
        _driver().cuGetErrorName(result, ctypes.byref(name))
        label = name.value.decode() if name.value else "CUresult %d" % result
        raise DriverError("%s failed: %s" % (what % args, label))


_primary = {}  # visible ordinal -> its primary context, retained once for the process


def bind_context(ordinal):
    """Makes sure this thread has a current context, binding device `ordinal`'s primary context
    (the one torch uses) when it has none. A thread that made no CUDA runtime call has none, and
    torch does not bind one when the device it selects is already the thread's current device:
    autograd's backward threads are such threads."""
    lib = _driver()
    current = ctypes.c_void_p()
    _check(lib.cuCtxGetCurrent(ctypes.byref(current)), "cuCtxGetCurrent")
    if current.value:
        return
    with _lib_lock:
        ctx = _primary.get(ordinal)
        if ctx is None:
            dev = ctypes.c_int()
            _check(lib.cuDeviceGet(ctypes.byref(dev), ordinal), "cuDeviceGet(%d)", ordinal)
            ctx = ctypes.c_void_p()
            _check(lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev.value),
                   "cuDevicePrimaryCtxRetain(%d)", ordinal)
            _primary[ordinal] = ctx
    _check(lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent(device %d)", ordinal)


def address_range(ptr):
    """(base, size) of the allocation containing device pointer `ptr` (current context)."""
    base = ctypes.c_uint64()
    size = ctypes.c_size_t()
    _check(_driver().cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), ptr),
           "cuMemGetAddressRange(0x%x)", ptr)
    return base.value, size.value


_IDENTITY_ATTRS = (ctypes.c_int * 3)(CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                     CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                                     CU_POINTER_ATTRIBUTE_BUFFER_ID)


class _IdentityBuffers(threading.local):
    """Per-thread result slots for allocation_identity (no ctypes allocation per call)."""

    def __init__(self):
        self.values = (ctypes.c_uint64 * 3)()
        at = ctypes.addressof(self.values)
        self.data = (ctypes.c_void_p * 3)(at, at + 8, at + 16)
        self.one = ctypes.c_uint64()
        self.one_at = ctypes.addressof(self.one)


_identity_buffers = _IdentityBuffers()


def allocation_identity(ptr):
    """(range start, range size, buffer id) of the allocation containing `ptr`, by one
    cuPointerGetAttributes call (cuda.h states no current-context requirement for these
    attributes, unlike CONTEXT/MEMORY_TYPE/DEVICE_POINTER; gpu_ipc_check.py checks it from a
    thread with no context). The buffer id is
    unique over the process lifetime (an allocation freed and re-made at the same address gets
    a new one). All three are 0 for a pointer the driver does not know."""
    b = _identity_buffers
    result = _driver().cuPointerGetAttributes(3, _IDENTITY_ATTRS, b.data, ptr)
    if result:
        _check(result, "cuPointerGetAttributes(0x%x)", ptr)
    v = b.values
    return v[0], v[1], v[2]


def buffer_id(ptr):
    """The buffer id of the allocation containing `ptr`, by cuPointerGetAttribute: one
    attribute through the singular call, about half the cost of allocation_identity's (0.65
    against 1.26 us on an H100 host, bench/results/h200-step/one-pass/pointer_attrs.py). Ids
    are unique over the process's life, so an equal id means the same allocation, alive, with
    the range it had. Raises DriverError where the call fails: a pointer the driver does not
    know, and possibly a thread with no current context (cuda.h promises the plural call
    works there, not this one)."""
    b = _identity_buffers
    result = _driver().cuPointerGetAttribute(b.one_at, CU_POINTER_ATTRIBUTE_BUFFER_ID, ptr)
    if result:
        _check(result, "cuPointerGetAttribute(BUFFER_ID, 0x%x)", ptr)
    return b.one.value


CUDA_ERROR_NOT_READY = 600  # cuda.h: the queried work is not yet complete
CU_STREAM_WAIT_VALUE_GEQ = 0x0  # (int32_t)(*addr - value) >= 0: cyclic, wraps safely
CU_STREAM_WRITE_VALUE_DEFAULT = 0x0  # a memory fence before the write (stream-scoped)


def _stream_memop(op, name, stream, ptr, value, flags):
    """The stream memory operation lib.fp4q_<op> (cuda.h's `name`) on `stream`, `ptr`, the
    32-bit `value` and `flags`."""
    f = getattr(_driver(), "fp4q_" + op, None)
    if f is None:
        raise DriverError("%s is not in this libcuda" % name)
    _check(f(stream, ptr, value & 0xFFFFFFFF, flags), "%s(0x%x, %d)", name, ptr, value)


def stream_wait_value32(stream, ptr, value):
    """Makes CUDA stream `stream` (a CUstream handle, e.g. torch's Stream.cuda_stream) wait,
    on the device and without blocking the host, until the 32-bit word at device address `ptr`
    reaches `value` (cyclic comparison)."""
    _stream_memop("wait_value32", "cuStreamWaitValue32", stream, ptr, value,
                  CU_STREAM_WAIT_VALUE_GEQ)


def stream_write_value32(stream, ptr, value):
    """Queues on CUDA stream `stream` (a CUstream handle) the write of the 32-bit `value` to
    the word at device address `ptr`, behind the work queued on it before and after a memory
    fence, so that a reader that sees the value also sees every earlier write of the stream
    (cuda.h: the default flags "provide a memory fence before the write"). One driver call: no
    kernel, no tensor. A handle of 0 is the legacy default stream of the thread's current
    context."""
    _stream_memop("write_value32", "cuStreamWriteValue32", stream, ptr, value,
                  CU_STREAM_WRITE_VALUE_DEFAULT)


def stream_query(stream):
    """True when CUDA stream `stream` (a CUstream handle; 0: the legacy default stream of the
    thread's current context) has completed everything queued on it, False while some of it
    is still running or queued (cuStreamQuery's CUDA_ERROR_NOT_READY). Raises DriverError on
    any other answer (an invalid handle, no current context, an earlier kernel's error)."""
    result = _driver().cuStreamQuery(stream)
    if result == CUDA_ERROR_NOT_READY:
        return False
    _check(result, "cuStreamQuery(0x%x)", stream or 0)
    return True


def stream_synchronize(stream):
    """Blocks the calling thread (the GIL released) until CUDA stream `stream` (as
    stream_query's) has completed everything queued on it (cuStreamSynchronize)."""
    _check(_driver().cuStreamSynchronize(stream), "cuStreamSynchronize(0x%x)", stream or 0)


def ipc_handle(base):
    """The 64-byte cudaIpcMemHandle of the allocation whose base is `base`."""
    handle = _IpcMemHandle()
    _check(_driver().cuIpcGetMemHandle(ctypes.byref(handle), base),
           "cuIpcGetMemHandle(0x%x)", base)
    return ctypes.string_at(ctypes.addressof(handle), IPC_HANDLE_BYTES)


def device_uuid_bytes(ordinal):
    """The 16 UUID bytes of the device with this (visible) ordinal."""
    dev = ctypes.c_int()
    _check(_driver().cuDeviceGet(ctypes.byref(dev), ordinal), "cuDeviceGet(%d)", ordinal)
    uuid = _Uuid()
    _check(_driver().cuDeviceGetUuid(ctypes.byref(uuid), dev.value),
           "cuDeviceGetUuid(%d)", ordinal)
    return bytes(uuid.bytes)
