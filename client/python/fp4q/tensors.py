"""torch <-> fp4q.v1 tensor conversion for inline transfer.

Inline bytes are little-endian row-major, exactly prod(shape) * element size (fp4q.proto).
Dtypes: float32 <-> DTYPE_F32, bfloat16 <-> DTYPE_BF16, uint8 <-> DTYPE_U8 (packed E2M1 codes),
E4M3 / E8M0 scale bytes travel as DTYPE_F8_E4M3 / DTYPE_F8_E8M0 and are handed to the caller as
uint8 tensors (torch before 2.1 has no float8 dtypes; `as_float8_e4m3` views them when it can).
"""

import math
import sys

import grpc
import numpy as np
import torch

from fp4q._messages import pb
from fp4q.errors import Fp4qError

if sys.byteorder != "little":  # pragma: no cover - every supported host is little-endian
    raise ImportError("fp4q: inline tensors are little-endian; this host is big-endian")

_TORCH_TO_DTYPE = {
    torch.float32: pb.DType.DTYPE_F32,
    torch.bfloat16: pb.DType.DTYPE_BF16,
    torch.uint8: pb.DType.DTYPE_U8,
}
_DTYPE_TO_TORCH = {
    pb.DType.DTYPE_F32: torch.float32,
    pb.DType.DTYPE_BF16: torch.bfloat16,
    pb.DType.DTYPE_U8: torch.uint8,
    pb.DType.DTYPE_F8_E4M3: torch.uint8,
    pb.DType.DTYPE_F8_E8M0: torch.uint8,
}
# The numpy dtype holding each DType's bytes (little-endian; bfloat16's bits as int16).
_NUMPY_DTYPE = {
    pb.DType.DTYPE_F32: np.dtype("<f4"),
    pb.DType.DTYPE_BF16: np.dtype("<i2"),
    pb.DType.DTYPE_U8: np.dtype(np.uint8),
    pb.DType.DTYPE_F8_E4M3: np.dtype(np.uint8),
    pb.DType.DTYPE_F8_E8M0: np.dtype(np.uint8),
}
_ELEMENT_BYTES = {
    pb.DType.DTYPE_F32: 4,
    pb.DType.DTYPE_BF16: 2,
    pb.DType.DTYPE_U8: 1,
    pb.DType.DTYPE_F8_E4M3: 1,
    pb.DType.DTYPE_F8_E8M0: 1,
}


class ClientArgumentError(Fp4qError, ValueError):
    """An argument the client refuses before sending (code INVALID_ARGUMENT)."""

    def __init__(self, message):
        super().__init__(grpc.StatusCode.INVALID_ARGUMENT, message)


def proto_dtype(tensor, field):
    """The DType of a float32 / bfloat16 / uint8 tensor; ClientArgumentError otherwise."""
    dtype = _TORCH_TO_DTYPE.get(tensor.dtype)
    if dtype is None:
        raise ClientArgumentError("%s.dtype: %s is not supported (float32, bfloat16)" %
                                  (field, tensor.dtype))
    return dtype


def torch_dtype(dtype, field="out_dtype"):
    """Maps a torch dtype or None to a DType number for out_dtype fields (0 = server default)."""
    if dtype is None:
        return pb.DType.DTYPE_UNSPECIFIED
    if dtype == torch.float32:
        return pb.DType.DTYPE_F32
    if dtype == torch.bfloat16:
        return pb.DType.DTYPE_BF16
    raise ClientArgumentError("%s: %s is not supported (torch.float32, torch.bfloat16)" %
                              (field, dtype))


def tensor_bytes(tensor):
    """The tensor's elements as little-endian bytes (copied to host when needed)."""
    t = tensor.detach() if tensor.requires_grad else tensor
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    # numpy has these dtypes (bfloat16: its bits as int16); its bytes are C order, little-endian.
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    elif t.dtype not in (torch.float32, torch.uint8):
        t = t.reshape(-1).view(torch.uint8)
    return t.numpy().tobytes()


def fill_inline(msg, tensor, field):
    """Sets msg (a fp4q.v1.Tensor) to tensor's dtype, shape and inline bytes."""
    msg.dtype = proto_dtype(tensor, field)
    del msg.shape[:]
    msg.shape.extend(int(d) for d in tensor.shape)
    msg.inline_data = tensor_bytes(tensor)


def from_bytes(data, dtype, shape, field):
    """A new CPU tensor holding `data` (proto dtype number, shape); INTERNAL on a size mismatch."""
    torch_type = _DTYPE_TO_TORCH.get(dtype)
    if torch_type is None:
        raise Fp4qError(grpc.StatusCode.INTERNAL,
                        "reply %s.dtype: %s is not a dtype this client knows" %
                        (field, pb.DType.Name(dtype)))
    shape = tuple(map(int, shape))
    if shape and min(shape) < 0:
        raise Fp4qError(grpc.StatusCode.INTERNAL, "reply %s.shape: %s" % (field, list(shape)))
    expected = math.prod(shape) * _ELEMENT_BYTES[dtype]
    if len(data) != expected:
        raise Fp4qError(grpc.StatusCode.INTERNAL,
                        "reply %s: %d inline bytes for %s %s (expected %d)" %
                        (field, len(data), pb.DType.Name(dtype), list(shape), expected))
    if expected == 0:
        return torch.empty(shape, dtype=torch_type)
    # numpy's frombuffer/reshape/from_numpy cost less per call than torch's; bfloat16 travels
    # through numpy as int16 (same bits) and is viewed back.
    raw = np.frombuffer(bytearray(data), _NUMPY_DTYPE[dtype]).reshape(shape)
    t = torch.from_numpy(raw)
    return t.view(torch.bfloat16) if torch_type is torch.bfloat16 else t


def element_bytes(dtype):
    return _ELEMENT_BYTES[dtype]


def has_float8():
    return hasattr(torch, "float8_e4m3fn")


def as_float8_e4m3(scales):
    """The E4M3 scale bytes viewed as torch.float8_e4m3fn (torch >= 2.1)."""
    if not has_float8():
        raise Fp4qError(grpc.StatusCode.FAILED_PRECONDITION,
                        "torch %s has no float8_e4m3fn dtype (needs torch >= 2.1)" %
                        torch.__version__)
    return scales.view(torch.float8_e4m3fn)
