"""The fp4-train kernel API, served by fp4qd: code written for it ports by changing the import.

All functions quantize to NVFP4 (E2M1 values, E4M3 scale per 16 elements along the last axis,
f32 global scale; shared/NUMERICS.md) on the server and take an optional `client=` (default:
fp4q.default_client(), connected to $FP4Q_SERVER or 127.0.0.1:50051). Inputs are float32 or
bfloat16 tensors whose last axis is a multiple of 16; leading axes are flattened to rows.

- quantize(x, stochastic, residual, seed, step) -> (packed, scale)
- dequantize(packed, scale, M, K) -> float32 [M, K]
- qdq(x, stochastic, residual, seed, step) -> x's dtype and shape
- fp4_matmul(a, b, ...) -> a @ b^T from NVFP4 operands
- fp4_linear(x, weight, stochastic, seed, step) -> x @ weight^T, straight-through gradients
- to_fp4_operands(a, b, ...) -> operands for torch._scaled_mm (float4_e2m1fn_x2 / float8_e4m3fn)
- ErrorFeedback(stochastic=...).qdq(name, W, step): residual kept on the server under `name`

Error feedback with a caller-held `residual` (f32, x's shape, updated in place) follows
NUMERICS 5 exactly: v = RN(x + r) is formed here in f32 (one IEEE add, as on the server), v is
quantized by the server (its amax taken from v), and r <- RN(v - DQ(q)).
"""

import threading
import typing

import grpc
import torch

from fp4q.client import Client
from fp4q.errors import Fp4qError
from fp4q.results import QuantizedTensor
from fp4q.tensors import ClientArgumentError, has_float8

_default = None
_default_lock = threading.Lock()
# Second operand's SR key differs from the first's so the two never share random bits.
_SEED_SPLIT = 0x9E3779B97F4A7C15


def set_default_client(client):
    """Sets the Client the module-level functions use (None: make one from $FP4Q_SERVER)."""
    global _default
    with _default_lock:
        _default = client


def default_client():
    global _default
    with _default_lock:
        if _default is None:
            _default = Client()
        return _default


def _client(client):
    return client if client is not None else default_client()


def _rounding(stochastic):
    return "stochastic" if stochastic else "nearest"


def _rows(x, field):
    if not isinstance(x, torch.Tensor):
        raise ClientArgumentError("%s: expected a torch.Tensor, got %s" %
                                  (field, type(x).__name__))
    if x.dim() < 1:
        raise ClientArgumentError("%s.shape: %s has no last axis" % (field, list(x.shape)))
    return x.reshape(-1, x.shape[-1]) if x.dim() != 2 else x


def _key(seed, salt=0):
    return (int(seed) ^ salt) & (2**64 - 1)


class Fp4Pair(tuple):
    """(packed, scale) with the global scale alongside.

    packed: uint8 [M, K/2]; scale: float8_e4m3fn [M, K/16] (uint8 bytes on torch < 2.1).
    Attributes: .packed, .scale, .global_amax, .s_enc, .quantized (the fp4q.QuantizedTensor).
    The scale tensor also carries fp4q_s_enc / fp4q_global_amax so dequantize(packed, scale,
    M, K) needs nothing else.
    """

    def __new__(cls, quantized):
        scale = quantized.scales_e4m3() if has_float8() else quantized.scales
        scale.fp4q_s_enc = quantized.s_enc
        scale.fp4q_global_amax = quantized.global_amax
        self = super().__new__(cls, (quantized.codes, scale))
        self.quantized = quantized
        return self

    packed = property(lambda self: self[0])
    scale = property(lambda self: self[1])
    global_amax = property(lambda self: self.quantized.global_amax)
    s_enc = property(lambda self: self.quantized.s_enc)


def _quantize_2d(c, x2, stochastic, seed, step, **extra):
    res = c.quantize(x2, rounding=_rounding(stochastic), seed=_key(seed), step=int(step), **extra)
    return res


def quantize(x, stochastic=False, residual=None, seed=0, step=0, *, client=None):
    """NVFP4-quantizes x along its last axis; returns Fp4Pair(packed, scale).

    With `residual` (float32, x's shape): quantizes v = x + residual and sets
    residual <- v - DQ(q) in place (error feedback).
    """
    c = _client(client)
    x2 = _rows(x, "x")
    if residual is None:
        return Fp4Pair(_quantize_2d(c, x2, stochastic, seed, step).rowwise)
    r2 = _residual_rows(residual, x)
    v = x2.float() + r2
    q = _quantize_2d(c, v, stochastic, seed, step).rowwise
    r2.copy_(v - c.dequantize(q, torch.float32))
    return Fp4Pair(q)


def _residual_rows(residual, x):
    if not isinstance(residual, torch.Tensor) or residual.dtype != torch.float32:
        raise ClientArgumentError("residual: expected a float32 tensor, got %s" %
                                  getattr(residual, "dtype", type(residual).__name__))
    if tuple(residual.shape) != tuple(x.shape) or residual.device != x.device:
        raise ClientArgumentError("residual.shape: %s on %s, expected x's %s on %s" %
                                  (list(residual.shape), residual.device, list(x.shape), x.device))
    if not residual.is_contiguous():
        raise ClientArgumentError("residual: must be contiguous (it is updated in place)")
    return residual.view(-1, x.shape[-1])


def dequantize(packed, scale, M, K, *, s_enc=None, out_dtype=torch.float32, client=None):
    """DQ of (packed [M, K/2], scale [M, K/16]) -> out_dtype [M, K] on packed's device.

    The global scale comes from `s_enc` or from the scale tensor that quantize returned.
    """
    if s_enc is None:
        s_enc = getattr(scale, "fp4q_s_enc", None)
    if s_enc is None:
        raise ClientArgumentError("s_enc: the scale tensor carries no global scale (it was not "
                                  "returned by fp4q.quantize); pass s_enc=")
    M, K = int(M), int(K)
    if not isinstance(packed, torch.Tensor) or packed.dtype != torch.uint8:
        raise ClientArgumentError("packed: expected a torch.uint8 tensor")
    scales = scale.view(torch.uint8) if scale.dtype != torch.uint8 else scale
    q = QuantizedTensor(codes=packed.reshape(M, -1) if packed.numel() else packed,
                        scales=scales, rows=M, cols=K,
                        global_amax=float(getattr(scale, "fp4q_global_amax", 0.0)),
                        s_enc=float(s_enc))
    return _client(client).dequantize(q, out_dtype)


def qdq(x, stochastic=False, residual=None, seed=0, step=0, *, client=None):
    """Quantize-dequantize along the last axis; x's dtype and shape (with error feedback when
    `residual` is given, as in quantize)."""
    c = _client(client)
    x2 = _rows(x, "x")
    if residual is None:
        y = c.qdq(x2, rounding=_rounding(stochastic), seed=_key(seed), step=int(step))
        return y.reshape(x.shape)
    r2 = _residual_rows(residual, x)
    v = x2.float() + r2
    y = c.qdq(v, rounding=_rounding(stochastic), seed=_key(seed), step=int(step))
    r2.copy_(v - y)
    return y.to(x.dtype).reshape(x.shape)


def _out_dtype(dtype):
    return dtype if dtype in (torch.float32, torch.bfloat16) else torch.float32


def _as_quantized(c, t, stochastic, seed, step, field, **extra):
    if isinstance(t, QuantizedTensor):
        return t
    if isinstance(t, Fp4Pair):
        return t.quantized
    return _quantize_2d(c, _rows(t, field), stochastic, seed, step, **extra).rowwise


def fp4_matmul(a, b, stochastic=False, seed=0, step=0, *, out_dtype=None, client=None):
    """a [M, K] @ b [N, K]^T with both operands NVFP4 (1x16, RTN or SR); tensors, Fp4Pairs or
    QuantizedTensors. Returns [M, N] in out_dtype (default a's dtype if f32/bf16, else f32)."""
    c = _client(client)
    qa = _as_quantized(c, a, stochastic, seed, step, "a")
    qb = _as_quantized(c, b, stochastic, _key(seed, _SEED_SPLIT), step, "b")
    if out_dtype is None:
        out_dtype = _out_dtype(a.dtype) if isinstance(a, torch.Tensor) else torch.float32
    y = c.matmul(qa, qb, out_dtype)
    if isinstance(a, torch.Tensor) and a.dim() != 2:
        y = y.reshape(*a.shape[:-1], y.shape[-1])
    return y


class _Fp4LinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, stochastic, seed, step, c):
        x2 = _rows(x, "x")
        qx = _as_quantized(c, x2, stochastic, seed, step, "x")
        qw = _as_quantized(c, weight, stochastic, _key(seed, _SEED_SPLIT), step, "weight")
        y = c.matmul(qx, qw, _out_dtype(x.dtype))
        ctx.c, ctx.qx, ctx.qw = c, qx, qw
        ctx.x_shape, ctx.x_dtype, ctx.w_dtype = x.shape, x.dtype, weight.dtype
        return y.reshape(*x.shape[:-1], y.shape[-1])

    @staticmethod
    def backward(ctx, grad):
        # Straight-through: the quantizers pass gradients unchanged, so the gradients are those
        # of y = DQ(Q(x)) @ DQ(Q(W))^T.
        g = grad.reshape(-1, grad.shape[-1]).float()
        gx = gw = None
        if ctx.needs_input_grad[0]:
            gx = (g @ ctx.c.dequantize(ctx.qw)).to(ctx.x_dtype).reshape(ctx.x_shape)
        if ctx.needs_input_grad[1]:
            gw = (g.t() @ ctx.c.dequantize(ctx.qx)).to(ctx.w_dtype)
        return gx, gw, None, None, None, None


def fp4_linear(x, weight, stochastic=False, seed=0, step=0, *, client=None):
    """x [..., K] @ weight [N, K]^T through the NVFP4 GEMM, differentiable with
    straight-through gradients (no bias; add it outside)."""
    return _Fp4LinearFn.apply(x, weight, bool(stochastic), int(seed), int(step), _client(client))


class Fp4Operands(typing.NamedTuple):
    """torch._scaled_mm operands: _scaled_mm(a, b.t(), scale_a, scale_b, out_dtype=...) * alpha
    approximates a @ b^T (alpha = S_dec_a * S_dec_b, the NVFP4 global scales)."""

    a: torch.Tensor        # float4_e2m1fn_x2 [M, K/2]
    scale_a: torch.Tensor  # float8_e4m3fn, swizzled 128x4 (1-D, padded)
    b: torch.Tensor        # float4_e2m1fn_x2 [N, K/2]
    scale_b: torch.Tensor
    alpha: float


def to_fp4_operands(a, b, stochastic=False, seed=0, step=0, *, client=None):
    """NVFP4-quantizes a [M, K] and b [N, K] with swizzled scales for torch._scaled_mm.

    FAILED_PRECONDITION when this torch has no float4_e2m1fn_x2 / float8_e4m3fn dtypes."""
    if not hasattr(torch, "float4_e2m1fn_x2") or not has_float8():
        raise Fp4qError(grpc.StatusCode.FAILED_PRECONDITION,
                        "to_fp4_operands: torch %s has no float4_e2m1fn_x2/float8_e4m3fn dtypes "
                        "(needs torch >= 2.8)" % torch.__version__)
    c = _client(client)
    qa = _as_quantized(c, a, stochastic, seed, step, "a", scale_layout="swizzled")
    qb = _as_quantized(c, b, stochastic, _key(seed, _SEED_SPLIT), step, "b",
                       scale_layout="swizzled")
    return Fp4Operands(a=qa.codes.view(torch.float4_e2m1fn_x2), scale_a=qa.scales_e4m3(),
                       b=qb.codes.view(torch.float4_e2m1fn_x2), scale_b=qb.scales_e4m3(),
                       alpha=qa.s_dec * qb.s_dec)


class ErrorFeedback:
    """QDQ with an error-feedback residual held by the server, one per name.

    qdq(name, W, step): returns DQ(Q(W + r)) in W's dtype and updates r on the server. Steps
    must increase per name (a repeated or older step is refused by the server). reset(name)
    zeroes the residual.
    """

    def __init__(self, stochastic=False, seed=0, *, client=None):
        self.stochastic = bool(stochastic)
        self.seed = int(seed)
        self._client = client

    def qdq(self, name, W, step):
        c = _client(self._client)
        x2 = _rows(W, "W")
        y = c.qdq(x2, rounding=_rounding(self.stochastic), seed=_key(self.seed), step=int(step),
                  residual_key=name)
        return y.reshape(W.shape)

    def reset(self, name):
        _client(self._client).reset_residual(name)
