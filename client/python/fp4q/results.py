"""Result types of the client's RPC methods."""

import dataclasses
import math
import typing

import numpy as np
import torch

from fp4q import options as opts
from fp4q._messages import pb
from fp4q.tensors import ClientArgumentError, as_float8_e4m3


@dataclasses.dataclass
class QuantizedTensor:
    """A quantized [rows, cols] matrix (quantized along cols), as fp4q.v1.QuantizedTensor.

    codes: uint8 [rows, cols / 2], element 2j in the low nibble of byte j.
    scales: uint8 scale bytes (E4M3 for NVFP4, E8M0 for MXFP4): [rows, cols / block] in the
      plain layout, 1-D (the padded 128x4 tile order) in the swizzled layout.
    global_amax, s_enc: the f32 global record; S_dec = RN(1 / s_enc).
    format / block / scale_layout: short names ('nvfp4', '1x16', 'plain').
    Tensors live on the device of the tensor that was quantized (CPU or CUDA).
    """

    codes: torch.Tensor
    scales: torch.Tensor
    rows: int
    cols: int
    global_amax: float
    s_enc: float
    format: str = "nvfp4"
    block: str = "1x16"
    scale_layout: str = "plain"

    @property
    def shape(self):
        return (self.rows, self.cols)

    @property
    def s_dec(self):
        """RN(1 / s_enc) in f32, as the server computes it."""
        return float(np.float32(1.0) / np.float32(self.s_enc))

    def scales_e4m3(self):
        """scales viewed as torch.float8_e4m3fn (torch >= 2.1; NVFP4 only)."""
        return as_float8_e4m3(self.scales)

    def fill(self, msg, transfer, field):
        """Writes this tensor into a fp4q.v1.QuantizedTensor (CUDA tensors by IPC)."""
        msg.format = opts.enum_value("format", self.format)
        msg.block = opts.enum_value("block", self.block)
        msg.scale_layout = opts.enum_value("scale_layout", self.scale_layout)
        del msg.shape[:]
        msg.shape.extend([int(self.rows), int(self.cols)])
        msg.global_amax = float(self.global_amax)
        msg.s_enc = float(self.s_enc)
        for name, tensor in (("codes", self.codes), ("scales", self.scales)):
            if not isinstance(tensor, torch.Tensor) or tensor.dtype != torch.uint8:
                raise ClientArgumentError("%s.%s: expected a torch.uint8 tensor, got %s" %
                                          (field, name, getattr(tensor, "dtype", type(tensor))))
            slot = transfer.input_region(tensor.detach())
            if slot is None:
                setattr(msg, name, tensor.detach().cpu().contiguous().numpy().tobytes())
            else:
                region = getattr(msg, name + "_region")
                region.region_id, region.offset = slot


class DenseOperand:
    """A dense tensor as an operand of Client.matmul that fp4qd quantizes itself, with exactly
    Quantize's numerics for `options` (fp4q.QuantOptions and/or its keywords): one call instead
    of a quantize and a matmul, and the codes never leave the server.

    tensor: [rows, cols] float32 / bfloat16 (CUDA tensors by IPC). options.outputs 'rowwise'
    (the default) makes the operand Q(x) [rows, cols]; 'columnwise' Q(x^T) [cols, rows]
    (quantized along x's rows: a weight's transpose, or the token axis of a weight gradient).
    Not 'both', and no residual_key: Matmul changes no state.
    """

    __slots__ = ("tensor", "options")

    def __init__(self, tensor, options=None, **kwargs):
        if not isinstance(tensor, torch.Tensor):
            raise ClientArgumentError("tensor: expected a torch.Tensor, got %s" %
                                      type(tensor).__name__)
        self.tensor = tensor
        self.options = opts.quant_options(options, **kwargs)

    @property
    def columnwise(self):
        return opts.enum_value("outputs", self.options.outputs) == pb.Outputs.OUTPUTS_COLUMNWISE

    @property
    def shape(self):
        """The operand's [rows, cols] (the tensor's, transposed when column-wise), or None when
        the tensor is not 2-D (the server refuses it)."""
        if self.tensor.dim() != 2:
            return None
        r, c = self.tensor.shape
        return (int(c), int(r)) if self.columnwise else (int(r), int(c))

    @property
    def device(self):
        return self.tensor.device

    def fill(self, msg, transfer, field):
        """Writes this operand into a fp4q.v1.DenseOperand (a CUDA tensor by IPC)."""
        transfer.input(msg.tensor, self.tensor, field + ".tensor")
        self.options.fill(msg.options)


def scale_bytes(fmt, block, layout, rows, cols):
    """Bytes of the scales of a [rows, cols] quantization, or None if the shape is invalid."""
    per = 32 if opts.enum_value("format", fmt) == pb.Format.FORMAT_MXFP4 else 16
    if rows <= 0 or cols <= 0 or cols % per:
        return None
    c = cols // per
    if opts.enum_value("scale_layout", layout) == pb.ScaleLayout.SCALE_LAYOUT_SWIZZLED:
        return int(math.ceil(rows / 128) * 128 * math.ceil(c / 4) * 4)
    return rows * c


def scale_shape(fmt, block, layout, rows, cols):
    """The shape of the scales of a [rows, cols] quantization: [rows, cols / block] in the plain
    layout, 1-D (the padded tiles) in the swizzled one; None if the shape is invalid."""
    sb = scale_bytes(fmt, block, layout, rows, cols)
    if sb is None:
        return None
    if opts.enum_value("scale_layout", layout) == pb.ScaleLayout.SCALE_LAYOUT_SWIZZLED:
        return (sb,)
    return (rows, sb // rows)


def quantize_sides(outputs, rows, cols):
    """The quantizations a Quantize of [rows, cols] returns for `outputs` (a fp4q.v1.Outputs
    number): ("rowwise", rows, cols) and/or ("columnwise", cols, rows), in that order."""
    sides = []
    if outputs in (0, pb.Outputs.OUTPUTS_ROWWISE, pb.Outputs.OUTPUTS_BOTH):
        sides.append(("rowwise", rows, cols))
    if outputs in (pb.Outputs.OUTPUTS_COLUMNWISE, pb.Outputs.OUTPUTS_BOTH):
        sides.append(("columnwise", cols, rows))
    return sides


@dataclasses.dataclass
class QuantizeResult:
    """Quantize's outputs: rowwise quantizes x along its last axis, columnwise x^T."""

    rowwise: typing.Optional[QuantizedTensor]
    columnwise: typing.Optional[QuantizedTensor]


@dataclasses.dataclass
class UpdateResult:
    applied: bool            # False: the step had been applied already (a safe retry)
    last_step: int
    dequantized: typing.Optional[torch.Tensor]
    global_amax: float


@dataclasses.dataclass
class OptimizerState:
    """A stored weight's optimizer state as GetWeight(optimizer_state=True) returns it.

    spec: fp4q.OptimizerSpec. steps: applied optimizer steps since creation or ResetOptimizer
    (AdamW's bias corrections count them). moments: {torch.optim state name
    ("momentum_buffer", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"): the moment as stored},
    a float32 / bfloat16 tensor, or a QuantizedTensor for NVFP4 storage (exp_avg_sq and
    max_exp_avg_sq then hold square roots, docs/NUMERICS.md).
    """

    spec: object
    steps: int
    moments: typing.Dict[str, object]


@dataclasses.dataclass
class WeightState:
    """GetWeight's answer. info is the fp4q.v1.WeightInfo message."""

    info: object
    dequantized: typing.Optional[torch.Tensor]
    quantized: typing.Optional[QuantizedTensor]
    residual: typing.Optional[torch.Tensor]
    optimizer_state: typing.Optional[OptimizerState] = None


@dataclasses.dataclass
class StepItem:
    """One weight's part of Client.step: its gradient (or delta) of the weight's shape, float32
    or bfloat16 (a CUDA tensor travels by IPC where it can), and optionally where DQ(W) after
    the step goes: `dequantized_out`, a tensor of the weight's shape and dtype (written in place
    by IPC when it is a contiguous CUDA tensor the server can reach, else copied from the
    reply), or `return_dequantized` for a new tensor. `group` indexes Client.step's groups."""

    name: str
    update: torch.Tensor
    dequantized_out: typing.Optional[torch.Tensor] = None
    return_dequantized: bool = False
    group: int = 0


@dataclasses.dataclass
class StepItemResult:
    name: str
    applied: bool            # False: this weight had already applied the step (a safe retry)
    last_step: int
    global_amax: float
    dequantized: typing.Optional[torch.Tensor]


@dataclasses.dataclass
class StepResult:
    """Step's answer: per item in request order (none for a brief reply); world_size is the
    number of ranks whose updates were combined (1 without a replica group); header the reply's
    ReplyHeader; applied_items how many items applied the step (the others had already); one_pass
    whether the server ran it in one pass (Client.step(one_pass=True)), and one_pass_outcome
    why not when it did not: "items", "retry", "devices", "budget" or "memory" (StepReply's
    field; "one_pass" when it did, empty when one pass was not asked)."""

    items: typing.List[StepItemResult]
    world_size: int
    header: object
    applied_items: int = 0
    one_pass: bool = False
    one_pass_outcome: str = ""
