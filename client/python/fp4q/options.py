"""Keyword options -> fp4q.v1 enums and QuantOptions.

Each option takes a short string ('nvfp4', '16x16', 'stochastic', ...), None for the server's
default, or a raw enum number (passed through untouched, so the server's own validation of
out-of-range values can be exercised). An unknown string is a ClientArgumentError naming the
option and the accepted values.
"""

import dataclasses
import numbers

from fp4q._messages import pb
from fp4q.tensors import ClientArgumentError

# option name -> (enum, value prefix, {alias: value suffix})
_ENUMS = {
    "format": (pb.Format, "FORMAT_", {}),
    "block": (pb.BlockShape, "BLOCK_SHAPE_", {}),
    "rounding": (pb.Rounding, "ROUNDING_", {"rtn": "NEAREST", "sr": "STOCHASTIC"}),
    "rht": (pb.RhtMode, "RHT_MODE_", {"default": "DEFAULT_SIGNS"}),
    "scale_selection": (pb.ScaleSelection, "SCALE_SELECTION_", {}),
    "scale_layout": (pb.ScaleLayout, "SCALE_LAYOUT_", {}),
    "mx_scale_rule": (pb.MxScaleRule, "MX_SCALE_RULE_", {}),
    "outputs": (pb.Outputs, "OUTPUTS_", {}),
    "kind": (pb.UpdateKind, "UPDATE_KIND_", {}),
    "scaling": (pb.Scaling, "SCALING_", {}),
    "optimizer": (pb.OptimizerKind, "OPTIMIZER_KIND_", {}),
    "state_dtype": (pb.StateDType, "STATE_DTYPE_", {}),
}


# (option, str value) -> enum number, for the strings accepted once (a per-call shortcut).
_BY_STRING = {}
_BY_STRING_MAX = 4096


def enum_value(option, value):
    """The enum number for `value` of `option` (see the module doc)."""
    if value is None:
        return 0
    kind = type(value)
    if kind is int:
        return value
    if kind is str:
        number = _BY_STRING.get((option, value))
        if number is not None:
            return number
    enum, prefix, aliases = _ENUMS[option]
    if isinstance(value, bool):
        raise ClientArgumentError("%s: %r is not a valid value" % (option, value))
    if isinstance(value, numbers.Integral):
        return int(value)
    if not isinstance(value, str):
        raise ClientArgumentError("%s: %r is not a valid value" % (option, value))
    suffix = aliases.get(value.lower(), value.upper())
    number = enum.by_name.get(prefix + suffix)
    if number is None or number == 0:
        accepted = sorted(n[len(prefix):].lower() for n, v in enum.by_name.items() if v)
        raise ClientArgumentError("%s: %r is not one of %s" % (option, value, accepted))
    if kind is str and len(_BY_STRING) < _BY_STRING_MAX:
        _BY_STRING[(option, value)] = number
    return number


def enum_name(option, number):
    """The short lower-case name of an enum number ('nvfp4'), or str(number)."""
    enum, prefix, _ = _ENUMS[option]
    name = enum.by_number.get(number)
    return name[len(prefix):].lower() if name else str(number)


@dataclasses.dataclass
class QuantOptions:
    """How to quantize; every field's default is the server's default (NUMERICS.md, DESIGN.md).

    format: 'nvfp4' | 'mxfp4'. block: '1x16' | '16x16' | '1x32' (None: 1x16 NVFP4, 1x32 MXFP4).
    rounding: 'nearest' | 'stochastic' (seed, step key and count the random bits).
    rht: 'off' | 'default' | 'seeded' (rht_seed). scale_selection: 'map_to_6' |
    'four_over_six_mae' | 'four_over_six_mse' (four_over_six_emax 256 or 448; 0 = 256).
    amax: a caller-given global amax, or None to compute it. scale_layout: 'plain' | 'swizzled'.
    mx_scale_rule: 'rceil' | 'floor'. outputs: 'rowwise' | 'columnwise' | 'both'.
    residual_key: server-held error-feedback residual name ('' = none).
    """

    format: object = None
    block: object = None
    rounding: object = None
    seed: int = 0
    step: int = 0
    rht: object = None
    rht_seed: int = 0
    scale_selection: object = None
    four_over_six_emax: float = 0.0
    amax: object = None
    scale_layout: object = None
    mx_scale_rule: object = None
    outputs: object = None
    residual_key: str = ""

    def fill(self, msg):
        """Writes these options into a fp4q.v1.QuantOptions message."""
        for option in ("format", "block", "rounding", "rht", "scale_selection", "scale_layout",
                       "mx_scale_rule", "outputs"):
            setattr(msg, option, enum_value(option, getattr(self, option)))
        _set_uint(msg, "seed", self.seed)
        _set_uint(msg, "step", self.step)
        _set_uint(msg, "rht_seed", self.rht_seed)
        msg.four_over_six_emax = float(self.four_over_six_emax)
        if self.amax is not None:
            msg.amax = float(self.amax)
        msg.residual_key = self.residual_key or ""
        return msg


_FIELD_ORDER = tuple(f.name for f in dataclasses.fields(QuantOptions))
_FIELD_NAMES = frozenset(_FIELD_ORDER)


def _set_uint(msg, field, value):
    if type(value) is int and 0 <= value < 2**64:
        setattr(msg, field, value)
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ClientArgumentError("%s: %r is not an integer" % (field, value))
    if not 0 <= int(value) < 2**64:
        raise ClientArgumentError("%s: %d is outside [0, 2^64)" % (field, value))
    setattr(msg, field, int(value))


def quant_options(options=None, **kwargs):
    """A QuantOptions from an existing one and/or keyword overrides (unknown keys rejected)."""
    base = options if options is not None else QuantOptions()
    if not isinstance(base, QuantOptions):
        raise ClientArgumentError("options: expected fp4q.QuantOptions, got %s" %
                                  type(base).__name__)
    if kwargs:
        unknown = sorted(set(kwargs) - _FIELD_NAMES)
        if unknown:
            raise ClientArgumentError("unknown quantization option(s) %s; known: %s" %
                                      (unknown, sorted(_FIELD_NAMES)))
    if options is None and not kwargs:
        return QuantOptions()
    if type(base) is not QuantOptions:
        return dataclasses.replace(base, **kwargs)
    # dataclasses.replace(base, **kwargs), without its per-call field introspection.
    values = {name: getattr(base, name) for name in _FIELD_ORDER}
    values.update(kwargs)
    return QuantOptions(**values)


# ---------------------------------------------------------------------- stored weights' optimizers


@dataclasses.dataclass
class OptimizerSpec:
    """The optimizer state a stored weight keeps (fp4q.v1.OptimizerSpec), fixed at CreateWeight
    and replaced (zeroed) by ResetOptimizer.

    kind: 'sgd' | 'adamw'. momentum: SGD keeps a momentum buffer. amsgrad: AdamW keeps max v.
    state_dtype: 'f32' (the server's default) | 'bf16' | 'nvfp4' (1x16 NVFP4 moments; the
    second moment stored as its square root, docs/NUMERICS.md).
    """

    kind: object = "sgd"
    momentum: bool = False
    amsgrad: bool = False
    state_dtype: object = None

    def fill(self, msg):
        msg.kind = enum_value("optimizer", self.kind)
        msg.momentum = bool(self.momentum)
        msg.amsgrad = bool(self.amsgrad)
        msg.state_dtype = enum_value("state_dtype", self.state_dtype)
        return msg

    @classmethod
    def from_proto(cls, msg):
        return cls(kind=enum_name("optimizer", msg.kind or pb.OptimizerKind.OPTIMIZER_KIND_SGD),
                   momentum=bool(msg.momentum), amsgrad=bool(msg.amsgrad),
                   state_dtype=enum_name("state_dtype",
                                         msg.state_dtype or pb.StateDType.STATE_DTYPE_F32))


@dataclasses.dataclass
class SgdHyperparameters:
    """One parameter group's torch.optim.SGD hyperparameters for a Step (fp4q.v1.Hyperparameters
    with `sgd`); the server checks them (lr >= 0, ...) and that the weights keep SGD state."""

    lr: float
    momentum: float = 0.0
    dampening: float = 0.0
    weight_decay: float = 0.0
    nesterov: bool = False

    def fill(self, msg):
        msg.lr = float(self.lr)
        msg.sgd.momentum = float(self.momentum)
        msg.sgd.dampening = float(self.dampening)
        msg.sgd.weight_decay = float(self.weight_decay)
        msg.sgd.nesterov = bool(self.nesterov)
        return msg


@dataclasses.dataclass
class AdamWHyperparameters:
    """One parameter group's torch.optim.AdamW hyperparameters for a Step (`adamw`); bias
    correction uses the weight's own count of applied optimizer steps."""

    lr: float
    betas: tuple = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 1e-2

    def fill(self, msg):
        msg.lr = float(self.lr)
        b1, b2 = self.betas
        msg.adamw.beta1 = float(b1)
        msg.adamw.beta2 = float(b2)
        msg.adamw.eps = float(self.eps)
        msg.adamw.weight_decay = float(self.weight_decay)
        return msg
