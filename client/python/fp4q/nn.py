"""fp4q.nn.Linear: nn.Linear trained with the NVFP4 recipe, every GEMM on fp4qd.

The three GEMMs of a linear layer y = x W^T (+ b), x [M, K], W [N, K], all NVFP4 with FP4
operands on both sides (Recipe defaults):
  fprop  y  = Q(x) Q(W)^T        x: 1x16 blocks, RTN;  W: 16x16 blocks, RTN
  dgrad  dx = Q(dy) Q(W^T)^T     dy: 1x16, SR;  W^T: the 16x16 quantization of W transposed
                                 (exactly the transpose of the fprop one, NUMERICS 2)
  wgrad  dW = Q(H dy^T) Q(H x^T)^T  both operands quantized along the token axis M (column-
                                 wise outputs) after the 16-point random Hadamard transform H
                                 on that axis, SR; H is orthonormal, so the product is dy^T x.
M is zero-padded to a multiple of 16 for wgrad (zero rows change neither operand's product).
The bias stays in torch precision. K and N must be multiples of 16.

Each quantization uses its own SR key derived from the layer seed, and the layer's step counter
(incremented by every training-mode forward) as the SR step.

Each GEMM is one Matmul call: its operands go to fp4qd as the dense tensors (fp4q.DenseOperand,
by CUDA IPC on the GPU) and the server quantizes them with the options above before the GEMM,
so a layer's training step makes three calls and no codes travel.
"""

import dataclasses
import math

import torch

from fp4q.functional import _client, _key, _out_dtype, _rows
from fp4q.results import DenseOperand
from fp4q.tensors import ClientArgumentError


@dataclasses.dataclass(frozen=True)
class Recipe:
    """Per-GEMM choices. Defaults: the NVFP4 training recipe (docs/NUMERICS.md)."""

    input_block: str = "1x16"
    weight_block: str = "16x16"
    forward_rounding: str = "nearest"
    grad_rounding: str = "stochastic"
    wgrad_rht: str = "default"           # 'off' | 'default' | 'seeded'
    wgrad_input_rounding: str = "stochastic"


_SALT_DGRAD, _SALT_WGRAD_G, _SALT_WGRAD_X = 0x1D6A, 0x2B5C, 0x3E4F


class _Nvfp4LinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, layer):
        c, r = _client(layer.client), layer.recipe
        x2 = _rows(x, "input")
        y = c.matmul(
            DenseOperand(x2, block=r.input_block, rounding=r.forward_rounding,
                         seed=_key(layer.seed), step=layer.step),
            _weight_operand(weight, r, layer.seed, layer.step, "rowwise"), _out_dtype(x.dtype))
        if bias is not None:
            y = y + bias.to(y.dtype)
        ctx.save_for_backward(x2, weight)
        ctx.layer, ctx.step = layer, layer.step
        ctx.x_shape, ctx.w_dtype, ctx.has_bias = x.shape, weight.dtype, bias is not None
        return y.reshape(*x.shape[:-1], y.shape[-1])

    @staticmethod
    def backward(ctx, grad):
        x2, weight = ctx.saved_tensors
        layer, step = ctx.layer, ctx.step
        c, r = _client(layer.client), layer.recipe
        g = grad.reshape(-1, grad.shape[-1])
        if g.dtype not in (torch.float32, torch.bfloat16):
            g = g.float()
        g = g.contiguous()
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:
            qg = DenseOperand(g, rounding=r.grad_rounding, seed=_key(layer.seed, _SALT_DGRAD),
                              step=step)
            # W^T: the column-wise quantization of the forward's W (the same options and
            # seed), the exact transpose of its 16x16 row-wise one (NUMERICS 2).
            qwt = _weight_operand(weight, r, layer.seed, step, "columnwise")
            gx = c.matmul(qg, qwt, _out_dtype(x2.dtype)).to(x2.dtype).reshape(ctx.x_shape)
        if ctx.needs_input_grad[1]:
            m = g.shape[0]
            pad = (-m) % 16
            gp = torch.nn.functional.pad(g, (0, 0, 0, pad)) if pad else g
            xp = torch.nn.functional.pad(x2, (0, 0, 0, pad)) if pad else x2
            qgt = DenseOperand(gp, outputs="columnwise", rht=r.wgrad_rht,
                               rounding=r.grad_rounding, seed=_key(layer.seed, _SALT_WGRAD_G),
                               step=step)
            qxt = DenseOperand(xp.contiguous(), outputs="columnwise", rht=r.wgrad_rht,
                               rounding=r.wgrad_input_rounding,
                               seed=_key(layer.seed, _SALT_WGRAD_X), step=step)
            wdt = ctx.w_dtype if ctx.w_dtype in (torch.float32, torch.bfloat16) else torch.float32
            gw = c.matmul(qgt, qxt, wdt).to(ctx.w_dtype)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            gb = g.float().sum(0)
        return gx, gw, gb, None


def _weight_operand(weight, recipe, seed, step, outputs):
    """The layer's weight as a Matmul operand: Q(W) row-wise (fprop) or Q(W^T) (dgrad)."""
    return DenseOperand(weight.detach(), block=recipe.weight_block,
                        rounding=recipe.forward_rounding, seed=_key(seed), step=step,
                        outputs=outputs)


class Linear(torch.nn.Module):
    """Drop-in torch.nn.Linear whose GEMMs run in NVFP4 on fp4qd (see the module doc).

    Same constructor as torch.nn.Linear plus: recipe (fp4q.nn.Recipe), client (default
    fp4q.default_client()), seed (SR key; default drawn from torch's generator, so
    torch.manual_seed makes runs repeatable). in_features and out_features must be multiples
    of 16 (ValueError otherwise).
    """

    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None, *,
                 recipe=None, client=None, seed=None):
        super().__init__()
        for name, v in (("in_features", in_features), ("out_features", out_features)):
            if v <= 0 or v % 16:
                raise ClientArgumentError("%s: %d is not a positive multiple of 16 (NVFP4 "
                                          "blocks)" % (name, v))
        self.in_features, self.out_features = in_features, out_features
        factory = {"device": device, "dtype": dtype}
        self.weight = torch.nn.Parameter(torch.empty(out_features, in_features, **factory))
        self.bias = torch.nn.Parameter(torch.empty(out_features, **factory)) if bias else None
        self.recipe = recipe or Recipe()
        self.client = client
        self.seed = int(seed) if seed is not None else int(
            torch.randint(0, 2**62, (1,)).item())
        self.step = 0
        self.reset_parameters()

    def reset_parameters(self):
        # torch.nn.Linear's initialisation.
        torch.nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1 / math.sqrt(self.in_features)
            torch.nn.init.uniform_(self.bias, -bound, bound)

    @classmethod
    def from_linear(cls, linear, **kwargs):
        """An fp4q Linear with a copy of a torch.nn.Linear's parameters."""
        m = cls(linear.in_features, linear.out_features, linear.bias is not None,
                device=linear.weight.device, dtype=linear.weight.dtype, **kwargs)
        with torch.no_grad():
            m.weight.copy_(linear.weight)
            if linear.bias is not None:
                m.bias.copy_(linear.bias)
        return m

    def forward(self, x):
        if self.training:
            self.step += 1
        return _Nvfp4LinearFn.apply(x, self.weight, self.bias, self)

    def extra_repr(self):
        return "in_features=%d, out_features=%d, bias=%s, recipe=%s" % (
            self.in_features, self.out_features, self.bias is not None, self.recipe)
