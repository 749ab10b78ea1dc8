"""Training variants: how the GEMMs run and where the weights live.

A variant name is `[nvfp4+]STORAGE-OPTIMIZER` or `GEMM-OPTIMIZER`:

  bf16-adamw, bf16-sgd       torch.nn.Linear, a torch optimizer, f32 master weights (the
                             reference; the forward runs under bf16 autocast when --amp bf16)
  nvfp4-adamw, nvfp4-sgd     fp4q.nn.Linear (every block GEMM in NVFP4 on fp4qd, the recipe of
                             client/python/fp4q/nn.py), a torch optimizer, f32 master weights
  rtn-sgd, sr-sgd, rtn-ef-sgd, sr-ef-sgd, rtn-adamw, sr-adamw, rtn-ef-adamw, sr-ef-adamw
                             torch.nn.Linear; the block weights stored in 4 bits on fp4qd and
                             updated there by fp4q.optim (round-to-nearest or stochastic
                             rounding, with or without error feedback); param.data holds DQ(W)
  frozen-adamw, frozen-sgd   torch.nn.Linear with the block weights frozen at their initial
                             values; only the embeddings, the head, LayerNorms and biases
                             train: what a stored-weight variant gets when its 4-bit weights
                             never change (the floor RTN is compared with)
  nvfp4+rtn-ef-adamw, ...    both: NVFP4 GEMMs on weights that exist only in 4 bits (stored
                             with 16x16 blocks, the recipe's weight block, so the forward's
                             re-quantization of DQ(W) keeps the stored grid)

Aliases: bf16 = bf16-adamw, nvfp4 = nvfp4-adamw. Groups: `all` (every variant the GPU run
makes), `stored` (the eight stored-weight variants), `ci` (the CPU test's three).
"""

import dataclasses

OPTIMIZERS = ("sgd", "adamw")
STORAGES = {"rtn": ("nearest", False), "sr": ("stochastic", False),
            "rtn-ef": ("nearest", True), "sr-ef": ("stochastic", True)}
ALIASES = {"bf16": "bf16-adamw", "nvfp4": "nvfp4-adamw"}


@dataclasses.dataclass(frozen=True)
class Variant:
    name: str
    optimizer: str                 # 'sgd' | 'adamw'
    nvfp4_gemm: bool               # fp4q.nn.Linear for the block linears
    stored: bool                   # block weights stored in 4 bits by fp4q.optim
    rounding: str = ""             # stored: 'nearest' | 'stochastic'
    error_feedback: bool = False   # stored
    frozen: bool = False           # block weights not trained

    @property
    def uses_server(self):
        return self.nvfp4_gemm or self.stored

    @property
    def reference(self):
        """The torch variant with the same optimizer (what this one is compared with)."""
        return "bf16-" + self.optimizer

    @property
    def block(self):
        return "16x16" if self.nvfp4_gemm else "1x16"


def parse(name):
    name = ALIASES.get(name, name)
    gemm, _, rest = name.rpartition("+")
    if gemm not in ("", "nvfp4"):
        raise ValueError("variant %r: only 'nvfp4+' may prefix a stored variant" % name)
    head, _, opt = rest.rpartition("-")
    if opt not in OPTIMIZERS:
        raise ValueError("variant %r: the optimizer must be one of %s" % (name, OPTIMIZERS))
    if head in ("bf16", "nvfp4") and not gemm:
        return Variant(name, opt, nvfp4_gemm=head == "nvfp4", stored=False)
    if head == "frozen" and not gemm:
        return Variant(name, opt, nvfp4_gemm=False, stored=False, frozen=True)
    if head in STORAGES:
        rounding, ef = STORAGES[head]
        return Variant(name, opt, nvfp4_gemm=bool(gemm), stored=True, rounding=rounding,
                       error_feedback=ef)
    raise ValueError("variant %r: unknown (bf16-OPT, nvfp4-OPT, frozen-OPT, [nvfp4+]{%s}-OPT)" %
                     (name, ",".join(STORAGES)))


STORED = ["%s-%s" % (s, o) for o in OPTIMIZERS for s in STORAGES]
GROUPS = {
    "all": ["bf16-adamw", "bf16-sgd", "frozen-adamw", "frozen-sgd", "nvfp4-adamw"] + STORED +
           ["nvfp4+rtn-ef-adamw"],
    "stored": STORED,
    "ci": ["bf16-adamw", "frozen-adamw", "rtn-adamw", "rtn-ef-adamw"],
}


def expand(spec):
    """'all' / 'bf16,rtn-sgd' / 'stored,nvfp4' -> [Variant], duplicates dropped, order kept."""
    names = []
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        for n in GROUPS.get(part, [part]):
            n = ALIASES.get(n, n)
            if n not in names:
                names.append(n)
    if not names:
        raise ValueError("--variants: empty")
    return [parse(n) for n in names]
