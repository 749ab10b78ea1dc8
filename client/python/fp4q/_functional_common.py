"""fp4q.functional's default client and the argument helpers its functions share.

set_default_client / default_client (public, re-exported by fp4q.functional and fp4q), and the
private helpers that fp4q.functional, fp4q._error_feedback and fp4q.nn use to pick a client and
turn arguments into the client's: _client, _rounding, _rows, _key, _SEED_SPLIT.
"""

import threading

import torch

from fp4q.client import Client
from fp4q.tensors import ClientArgumentError

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

