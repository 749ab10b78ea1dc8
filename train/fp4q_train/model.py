"""A small decoder-only transformer (GPT-2 style, pre-LayerNorm) with a pluggable Linear.

Every matrix of the transformer blocks is a `linear(in, out)` from the factory passed in
(torch.nn.Linear by default, fp4q.nn.Linear for the NVFP4 GEMM recipe): the fused q/k/v
projection, the attention output, and the MLP's two layers. The token and position embeddings
and the output head (untied) are ordinary torch modules, as in the NVFP4 training recipes that
keep embeddings and the LM head in higher precision.

Initialisation (GPT-2): every weight N(0, 0.02), the two residual-branch output projections
N(0, 0.02 / sqrt(2 * layers)), biases 0, LayerNorm 1 / 0. It draws from torch's global
generator in a fixed order, so torch.manual_seed(seed) gives every variant the same start.
"""

import dataclasses
import math

import torch
import torch.nn.functional as F


@dataclasses.dataclass(frozen=True)
class Config:
    vocab_size: int
    block_size: int
    layers: int = 4
    d_model: int = 384
    heads: int = 6
    mlp_ratio: int = 4

    def block_params(self):
        d = self.d_model
        return self.layers * (4 * d * d + 2 * self.mlp_ratio * d * d)


def _attention(q, k, v):
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    t = q.shape[-2]
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    mask = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
    att = att.masked_fill(~mask, float("-inf")).softmax(-1)
    return att @ v


class Block(torch.nn.Module):
    def __init__(self, cfg, linear):
        super().__init__()
        d = cfg.d_model
        self.heads = cfg.heads
        self.ln1 = torch.nn.LayerNorm(d)
        self.qkv = linear(d, 3 * d)
        self.proj = linear(d, d)
        self.ln2 = torch.nn.LayerNorm(d)
        self.fc = linear(d, cfg.mlp_ratio * d)
        self.fc_out = linear(cfg.mlp_ratio * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        shape = (b, t, self.heads, d // self.heads)
        q, k, v = (z.reshape(shape).transpose(1, 2) for z in (q, k, v))
        y = _attention(q, k, v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.fc_out(F.gelu(self.fc(self.ln2(x))))


class Transformer(torch.nn.Module):
    def __init__(self, cfg, linear=torch.nn.Linear):
        super().__init__()
        if cfg.d_model % cfg.heads:
            raise ValueError("d_model %d is not a multiple of heads %d" % (cfg.d_model, cfg.heads))
        self.cfg = cfg
        self.tok = torch.nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = torch.nn.Embedding(cfg.block_size, cfg.d_model)
        self.blocks = torch.nn.ModuleList(Block(cfg, linear) for _ in range(cfg.layers))
        self.ln_f = torch.nn.LayerNorm(cfg.d_model)
        self.head = torch.nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self._init()

    def _init(self):
        out_std = 0.02 / math.sqrt(2 * self.cfg.layers)
        for name, p in self.named_parameters():
            if name.endswith("proj.weight") or name.endswith("fc_out.weight"):
                torch.nn.init.normal_(p, 0.0, out_std)
            elif p.dim() == 2:
                torch.nn.init.normal_(p, 0.0, 0.02)
            elif "ln" in name and name.endswith("weight"):
                torch.nn.init.ones_(p)
            else:
                torch.nn.init.zeros_(p)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))[None]
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln_f(x))


def block_linear_names(model):
    """Names of the weights of the transformer blocks' linear layers (the 4-bit candidates)."""
    return [n for n, p in model.named_parameters()
            if n.startswith("blocks.") and p.dim() == 2 and n.endswith(".weight")]


def swap_linears(model, factory):
    """Replaces each block Linear by factory(linear) (a copy of its parameters)."""
    for blk in model.blocks:
        for attr in ("qkv", "proj", "fc", "fc_out"):
            setattr(blk, attr, factory(getattr(blk, attr)))
    return model
