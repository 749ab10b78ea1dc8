"""The fp4-train kernel API, served by fp4qd: code written for it ports by changing the import.

All functions quantize to NVFP4 (E2M1 values, E4M3 scale per 16 elements along the last axis,
f32 global scale; docs/NUMERICS.md) on the server and take an optional `client=` (default:
fp4q.default_client(), connected to $FP4Q_SERVER or 127.0.0.1:50051). Inputs are float32 or
bfloat16 tensors whose last axis is a multiple of 16; leading axes are flattened to rows.

- quantize(x, stochastic, residual, seed, step) -> Fp4Tensor; unpacks as (packed, scale)
- dequantize(q) or dequantize(packed, scale, M, K) -> float32 [M, K]
- qdq(x, stochastic, residual, seed, step) -> x's dtype and shape
- fp4_mm(a, b) -> a @ b^T: torch._scaled_mm on FP4 tensor cores where the GPU has them, else
  the server's Matmul (fp4_mm_path says which, last_fp4_mm_path which ran)
- fp4_matmul(a, b, ...) -> a @ b^T from NVFP4 operands, always on the server
- fp4_linear(x, weight, stochastic, seed, step) -> x @ weight^T, straight-through gradients
- to_fp4_operands(a, b, ...) -> operands for torch._scaled_mm (float4_e2m1fn_x2 / float8_e4m3fn)
- ErrorFeedback(stochastic=..., scope=...).qdq(name, W, step): residual kept on the server

Error feedback with a caller-held `residual` (f32, x's shape, updated in place) follows
NUMERICS 5 exactly: v = RN(x + r) is formed here in f32 (one IEEE add, as on the server), v is
quantized by the server (its amax taken from v), and r <- RN(v - DQ(q)).

ErrorFeedback is defined in fp4q._error_feedback, set_default_client / default_client and the
argument helpers in fp4q._functional_common; both are imported here.
"""

import threading
import typing

import grpc
import numpy as np
import torch

from fp4q._error_feedback import ErrorFeedback
from fp4q._functional_common import (_SEED_SPLIT, _client, _key, _rounding, _rows,
                                     default_client, set_default_client)
from fp4q.errors import Fp4qError
from fp4q.results import DenseOperand, QuantizedTensor
from fp4q.tensors import ClientArgumentError, has_float8

__all__ = [
    "ErrorFeedback", "Fp4MmPath", "Fp4Operands", "Fp4Pair", "Fp4Tensor", "default_client",
    "dequantize", "fp4_linear", "fp4_matmul", "fp4_mm", "fp4_mm_path", "last_fp4_mm_path", "qdq",
    "quantize", "set_default_client", "swizzle_scales", "to_fp4_operands",
]


class Fp4Tensor:
    """An NVFP4-quantized [M, K] matrix that carries everything needed to decode it.

    Fields (all plain attributes, nothing hidden on the tensors):
      packed       uint8 [M, K/2], E2M1 codes, element 2j in the low nibble of byte j
      scale        [M, K/16] E4M3 block scale bytes, plain row-major, as torch.float8_e4m3fn
                   (uint8 on torch < 2.1, which has no float8 dtype)
      s_enc        float, the f32 global encode scale; decode uses S_dec = RN(1 / s_enc)
      global_amax  float, the amax the global scale was made from
      block        '1x16' or '16x16' (16x16: each tile's scale repeated on its 16 rows)
    Properties: shape (M, K), s_dec, quantized (the fp4q.QuantizedTensor the client sends).

    Behaves as the pair (packed, scale) of fp4-train code: `packed, scale = q`, q[0], q[1],
    len(q) == 2. The scale tensor of a freshly quantized value also carries the attributes
    fp4q_s_enc / fp4q_global_amax, so dequantize(packed, scale, M, K) works on the pair as
    returned; a copied or reloaded loose scale tensor does not carry them (pass s_enc=, or keep
    the Fp4Tensor).

    Copies stay decodable:
      q.clone()        new packed/scale tensors, same global scale
      q[i:j]           rows i..j-1 (step 1); a 16x16 value stays 16x16 when i and j are
                       multiples of 16 (or j is M), else becomes '1x16' (its per-row scales are
                       valid 1x16 block scales)
      q.to(device)     packed and scale moved
      torch.save(q, f) / torch.load(f)   pickled as its fields; on torch >= 2.4 the class is
                       registered with torch.serialization.add_safe_globals, so
                       torch.load(f, weights_only=True) accepts it as well
    fp4q.dequantize(q), fp4_mm, fp4_matmul and fp4_linear accept it as an operand.
    """

    __slots__ = ("packed", "scale", "s_enc", "global_amax", "block")

    def __init__(self, packed, scale, s_enc, global_amax=0.0, block="1x16"):
        if not isinstance(packed, torch.Tensor) or packed.dtype != torch.uint8 or packed.dim() != 2:
            raise ClientArgumentError("packed: expected a 2-D torch.uint8 tensor, got %s" %
                                      _describe(packed))
        if not isinstance(scale, torch.Tensor) or scale.dim() != 2 or scale.element_size() != 1:
            raise ClientArgumentError("scale: expected a 2-D float8_e4m3fn or uint8 tensor, got %s"
                                      % _describe(scale))
        rows, cols = packed.shape[0], packed.shape[1] * 2
        if tuple(scale.shape) != (rows, cols // 16) or cols % 16:
            raise ClientArgumentError("scale.shape: %s, expected [%d, %d] for packed %s" % (
                list(scale.shape), rows, cols // 16, list(packed.shape)))
        if block not in ("1x16", "16x16"):
            raise ClientArgumentError("block: %r is not '1x16' or '16x16'" % (block,))
        self.packed = packed
        self.scale = scale
        self.s_enc = float(s_enc)
        self.global_amax = float(global_amax)
        self.block = block

    @classmethod
    def from_quantized(cls, q):
        """The Fp4Tensor of a plain-layout NVFP4 fp4q.QuantizedTensor (client.quantize's)."""
        if q.format != "nvfp4" or q.scale_layout != "plain":
            raise ClientArgumentError("quantized: %s scales in the %s layout; Fp4Tensor holds "
                                      "NVFP4 with plain scales" % (q.format, q.scale_layout))
        scale = q.scales_e4m3() if has_float8() else q.scales
        scale.fp4q_s_enc = q.s_enc          # for dequantize(packed, scale, M, K) on the pair
        scale.fp4q_global_amax = q.global_amax
        return cls(q.codes, scale, q.s_enc, q.global_amax, q.block)

    # ---- the (packed, scale) pair
    def __iter__(self):
        return iter((self.packed, self.scale))

    def __len__(self):
        return 2

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self._rows(index)
        if index in (0, -2):
            return self.packed
        if index in (1, -1):
            return self.scale
        raise IndexError("Fp4Tensor: index %r (0 = packed, 1 = scale, a slice = rows)" % (index,))

    # ---- decoding
    @property
    def shape(self):
        return (self.packed.shape[0], self.packed.shape[1] * 2)

    @property
    def device(self):
        return self.packed.device

    @property
    def s_dec(self):
        """RN(1 / s_enc) in f32, as the server computes it."""
        return float(np.float32(1.0) / np.float32(self.s_enc))

    @property
    def quantized(self):
        """This value as the fp4q.QuantizedTensor the client sends (plain NVFP4 layout)."""
        rows, cols = self.shape
        scales = self.scale if self.scale.dtype == torch.uint8 else self.scale.view(torch.uint8)
        return QuantizedTensor(codes=self.packed, scales=scales, rows=rows, cols=cols,
                               global_amax=self.global_amax, s_enc=self.s_enc, format="nvfp4",
                               block=self.block, scale_layout="plain")

    # ---- copies
    def clone(self):
        return Fp4Tensor(self.packed.clone(), self.scale.clone(), self.s_enc, self.global_amax,
                         self.block)

    def to(self, device):
        """packed and scale on `device` (a torch.device or its name)."""
        device = torch.device(device)
        return Fp4Tensor(self.packed.to(device), self.scale.to(device), self.s_enc,
                         self.global_amax, self.block)

    def _rows(self, index):
        rows = self.shape[0]
        start, stop, step = index.indices(rows)
        if step != 1:
            raise ClientArgumentError("Fp4Tensor[%s]: only row ranges with step 1 keep whole "
                                      "blocks" % (index,))
        stop = max(start, stop)
        block = self.block
        if block == "16x16" and (start % 16 or (stop % 16 and stop != rows)):
            block = "1x16"
        return Fp4Tensor(self.packed[start:stop], self.scale[start:stop], self.s_enc,
                         self.global_amax, block)

    def __reduce__(self):
        return (Fp4Tensor, (self.packed, self.scale, self.s_enc, self.global_amax, self.block))

    def __repr__(self):
        return "Fp4Tensor(shape=%s, block=%s, s_enc=%r, global_amax=%r, device=%s)" % (
            list(self.shape), self.block, self.s_enc, self.global_amax, self.device)


Fp4Pair = Fp4Tensor  # the earlier name of the same type

if hasattr(torch, "serialization") and hasattr(torch.serialization, "add_safe_globals"):
    torch.serialization.add_safe_globals([Fp4Tensor])


def _describe(t):
    if isinstance(t, torch.Tensor):
        return "%s %s" % (t.dtype, list(t.shape))
    return type(t).__name__


def _quantize_2d(c, x2, stochastic, seed, step, **extra):
    return c.quantize(x2, rounding=_rounding(stochastic), seed=_key(seed), step=int(step), **extra)


def quantize(x, stochastic=False, residual=None, seed=0, step=0, *, block="1x16", client=None):
    """NVFP4-quantizes x along its last axis (leading axes flattened to rows); returns an
    Fp4Tensor, which unpacks as (packed, scale).

    block: '1x16' (default) or '16x16' (weights: rows must be a multiple of 16).
    With `residual` (float32, x's shape): quantizes v = x + residual and sets
    residual <- v - DQ(q) in place (error feedback).
    """
    c = _client(client)
    x2 = _rows(x, "x")
    if residual is None:
        return Fp4Tensor.from_quantized(
            _quantize_2d(c, x2, stochastic, seed, step, block=block).rowwise)
    r2 = _residual_rows(residual, x)
    v = x2.float() + r2
    q = _quantize_2d(c, v, stochastic, seed, step, block=block).rowwise
    r2.copy_(v - c.dequantize(q, torch.float32))
    return Fp4Tensor.from_quantized(q)


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


def dequantize(packed, scale=None, M=None, K=None, *, s_enc=None, out_dtype=torch.float32,
               client=None):
    """DQ of an Fp4Tensor, or of (packed [M, K/2], scale [M, K/16]) -> out_dtype [M, K] on
    packed's device.

    With loose tensors the global scale comes from `s_enc` or from the scale tensor exactly as
    quantize returned it (its fp4q_s_enc attribute).
    """
    if isinstance(packed, Fp4Tensor):
        if scale is not None or M is not None or K is not None or s_enc is not None:
            raise ClientArgumentError("dequantize: an Fp4Tensor carries its scale, shape and "
                                      "global scale; pass it alone")
        return _client(client).dequantize(packed.quantized, out_dtype)
    if scale is None or M is None or K is None:
        raise ClientArgumentError("dequantize: expected an Fp4Tensor, or packed, scale, M, K")
    if s_enc is None:
        s_enc = getattr(scale, "fp4q_s_enc", None)
    if s_enc is None:
        raise ClientArgumentError("s_enc: the scale tensor carries no global scale (it is not "
                                  "the one fp4q.quantize returned: copies, slices and reloaded "
                                  "tensors lose it); pass s_enc=, or keep the Fp4Tensor")
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
    if isinstance(t, Fp4Tensor):
        return t.quantized
    return _quantize_2d(c, _rows(t, field), stochastic, seed, step, **extra).rowwise


def _mm_operand(t, stochastic, seed, step, field):
    """A Matmul operand: a quantized one as it is, a tensor as a DenseOperand the server
    quantizes in the same call (exactly as _as_quantized would)."""
    if isinstance(t, QuantizedTensor):
        return t
    if isinstance(t, Fp4Tensor):
        return t.quantized
    return DenseOperand(_rows(t, field), rounding=_rounding(stochastic), seed=_key(seed),
                        step=int(step))


def fp4_matmul(a, b, stochastic=False, seed=0, step=0, *, out_dtype=None, client=None):
    """a [M, K] @ b [N, K]^T with both operands NVFP4 (RTN or SR), on the server's Matmul;
    tensors, Fp4Tensors or QuantizedTensors. Returns [M, N] in out_dtype (default a's dtype if
    f32/bf16, else f32). Tensors are quantized by the server within the one Matmul call."""
    c = _client(client)
    qa = _mm_operand(a, stochastic, seed, step, "a")
    qb = _mm_operand(b, stochastic, _key(seed, _SEED_SPLIT), step, "b")
    if out_dtype is None:
        out_dtype = _out_dtype(a.dtype) if isinstance(a, torch.Tensor) else torch.float32
    y = c.matmul(qa, qb, out_dtype)
    if isinstance(a, torch.Tensor) and a.dim() != 2:
        y = y.reshape(*a.shape[:-1], y.shape[-1])
    return y


class Fp4MmPath(typing.NamedTuple):
    """Which GEMM fp4_mm runs: kind 'scaled_mm' (torch._scaled_mm on FP4 tensor cores) or
    'server' (fp4qd's Matmul), and why."""

    kind: str
    reason: str


_FP4_MM_PATHS = ("auto", "scaled_mm", "server")
_last_mm = threading.local()


def _operand_device(t):
    if isinstance(t, Fp4Tensor):
        return t.device
    if isinstance(t, QuantizedTensor):
        return t.codes.device
    return t.device if isinstance(t, torch.Tensor) else None


def fp4_mm_path(a, b, *, capability=None):
    """The path fp4_mm(a, b) takes with path='auto' (an Fp4MmPath), decided from torch and the
    operands' device alone: torch._scaled_mm when torch has the float4_e2m1fn_x2 and
    float8_e4m3fn dtypes and _scaled_mm, both operands are on one CUDA device, and that device
    is sm_100 or newer (Blackwell: FP4 tensor cores); the server's Matmul otherwise.
    `capability` replaces torch.cuda.get_device_capability(device) (for tests)."""
    missing = [n for n in ("float4_e2m1fn_x2", "float8_e4m3fn", "_scaled_mm")
               if not hasattr(torch, n)]
    if missing:
        return Fp4MmPath("server", "torch %s has no %s (FP4 _scaled_mm needs torch >= 2.8)" %
                         (torch.__version__, "/".join(missing)))
    da, db = _operand_device(a), _operand_device(b)
    if da is None or db is None:
        return Fp4MmPath("server", "an operand is not a tensor")
    if da.type != "cuda" or db.type != "cuda":
        return Fp4MmPath("server", "operands on %s and %s, not CUDA" % (da, db))
    if da != db and da.index is not None and db.index is not None:
        return Fp4MmPath("server", "operands on two devices, %s and %s" % (da, db))
    cap = capability if capability is not None else torch.cuda.get_device_capability(da)
    if cap[0] < 10:
        return Fp4MmPath("server", "%s is sm_%d%d; FP4 tensor cores need sm_100 or newer" %
                         (da, cap[0], cap[1]))
    return Fp4MmPath("scaled_mm", "%s is sm_%d%d, which has FP4 tensor cores" %
                     (da, cap[0], cap[1]))


def last_fp4_mm_path():
    """The Fp4MmPath of this thread's last fp4_mm call (None before any): the path that
    produced its result, and why (with path='auto', a _scaled_mm refusal is named here)."""
    return getattr(_last_mm, "path", None)


def swizzle_scales(scale):
    """Plain [rows, C] scale bytes -> the 1-D 128x4-tile layout of torch._scaled_mm / cuBLASLt
    (docs/NUMERICS.md 3): rows padded to a multiple of 128, C to a multiple of 4, with zeros.
    Keeps the dtype and device."""
    if scale.dim() != 2:
        raise ClientArgumentError("scale: expected [rows, cols/16], got %s" % list(scale.shape))
    rows, cols = scale.shape
    u8 = scale.view(torch.uint8) if scale.dtype != torch.uint8 else scale
    pr, pc = -rows % 128, -cols % 4
    if pr or pc:
        u8 = torch.nn.functional.pad(u8, (0, pc, 0, pr))
    r, c = u8.shape
    out = u8.reshape(r // 128, 4, 32, c // 4, 4).permute(0, 3, 2, 1, 4).reshape(-1)
    return out.view(scale.dtype) if scale.dtype != torch.uint8 else out


def _scaled_mm(c, a, b, stochastic, seed, step, out_dtype):
    """a @ b^T through torch._scaled_mm; a, b are tensors or Fp4Tensors on one CUDA device."""
    ops = []
    for t, field, key in ((a, "a", _key(seed)), (b, "b", _key(seed, _SEED_SPLIT))):
        if isinstance(t, QuantizedTensor):
            if t.format != "nvfp4":
                raise ClientArgumentError("%s.format: %s; fp4_mm multiplies NVFP4 operands" %
                                          (field, t.format))
            scales = t.scales if t.scale_layout == "swizzled" else swizzle_scales(
                t.scales.reshape(t.rows, -1))
            codes, s_dec = t.codes, t.s_dec
        elif isinstance(t, Fp4Tensor):
            codes, scales, s_dec = t.packed, swizzle_scales(t.scale.view(torch.uint8)), t.s_dec
        else:
            q = c.quantize(_rows(t, field), rounding=_rounding(stochastic), seed=key,
                           step=int(step), scale_layout="swizzled").rowwise
            codes, scales, s_dec = q.codes, q.scales, q.s_dec
        ops.append((codes.view(torch.float4_e2m1fn_x2), scales.view(torch.float8_e4m3fn), s_dec))
    (ca, sa, da), (cb, sb, db) = ops
    y = torch._scaled_mm(ca, cb.t(), sa, sb, out_dtype=torch.float32)
    return (y * (da * db)).to(out_dtype)


def fp4_mm(a, b, stochastic=False, seed=0, step=0, *, out_dtype=None, path="auto",
           client=None):
    """a @ b^T (a [..., K], b [N, K]) with both operands NVFP4: tensors, Fp4Tensors or
    QuantizedTensors. Returns [..., N] in out_dtype (default a's dtype if f32/bf16, else f32).

    path: 'auto' (fp4_mm_path decides: torch._scaled_mm on a Blackwell GPU, else the server),
    'scaled_mm' (FAILED_PRECONDITION with the reason when it is not available, or torch's
    message when _scaled_mm refuses the operands), or 'server'. With 'auto', a _scaled_mm that
    raises falls back to the server. last_fp4_mm_path() names the path that ran and why.

    The two paths agree to within the GEMM's accumulation order: the server's Matmul sums exact
    products in f64 and rounds once (NUMERICS 9); _scaled_mm accumulates in f32 on the tensor
    cores, then the result is scaled by S_dec_a * S_dec_b in f32.
    """
    if path not in _FP4_MM_PATHS:
        raise ClientArgumentError("path: %r is not one of %s" % (path, _FP4_MM_PATHS))
    c = _client(client)
    if out_dtype is None:
        out_dtype = _out_dtype(a.dtype) if isinstance(a, torch.Tensor) else torch.float32
    chosen = Fp4MmPath("server", "path='server'") if path == "server" else fp4_mm_path(a, b)
    if path == "scaled_mm" and chosen.kind != "scaled_mm":
        raise Fp4qError(grpc.StatusCode.FAILED_PRECONDITION,
                        "fp4_mm: path='scaled_mm' is not available: " + chosen.reason)
    y = None
    if chosen.kind == "scaled_mm":
        try:
            y = _scaled_mm(c, a, b, stochastic, seed, step, out_dtype)
        except RuntimeError as e:
            if path == "scaled_mm":
                raise Fp4qError(grpc.StatusCode.FAILED_PRECONDITION,
                                "fp4_mm: torch._scaled_mm refused the operands: %s" % e) from e
            chosen = Fp4MmPath("server", "torch._scaled_mm refused the operands (%s)" %
                               str(e).splitlines()[0][:200])
    if y is None:
        qa = _mm_operand(a, stochastic, seed, step, "a")
        qb = _mm_operand(b, stochastic, _key(seed, _SEED_SPLIT), step, "b")
        y = c.matmul(qa, qb, out_dtype)
    _last_mm.path = chosen
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
