"""Shared by test_optim*.py: the module's fp4qd (each test module's setUpModule starts it with
start_server()), a client in a namespace of its own, seeded tensors, bit-level assertions and
the small model the state_dict, replica-group, namespace and restart tests step."""

import os
import unittest

import torch

import fp4q
import fp4q_testing

SERVER = None  # the running test module's fp4qd (start_server)
_NS = iter(range(10**6))


def start_server():
    """fp4qd --session_lease_s 600 for the calling test module; client() connects to it."""
    global SERVER
    SERVER = fp4q_testing.Server("--session_lease_s", "600")
    return SERVER


def stop_server():
    SERVER.stop()


def client(tag="t", **kwargs):
    """A client in a namespace of its own (tests never see one another's weights)."""
    return fp4q.Client(SERVER.target, timeout=120,
                       namespace="%s-%d-%d" % (tag, os.getpid(), next(_NS)), **kwargs)


def randn(*shape, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g) * scale


def bits(t):
    return t.detach().contiguous().view(torch.uint8).numpy().tobytes()


class Assertions(unittest.TestCase):
    def assertSameBits(self, a, b, msg=None):
        a = torch.as_tensor(a)
        b = torch.as_tensor(b)
        self.assertEqual((a.dtype, tuple(a.shape)), (b.dtype, tuple(b.shape)), msg)
        self.assertTrue(bits(a) == bits(b), msg)

    def assertClientRefused(self, pattern, fn, *args, **kwargs):
        """fn raises fp4q.ClientArgumentError (a ValueError) whose message matches pattern."""
        with self.assertRaises(ValueError) as cm:
            fn(*args, **kwargs)
        self.assertIsInstance(cm.exception, fp4q.ClientArgumentError)
        self.assertRegex(cm.exception.message, pattern)
        return cm.exception

    def assertRefused(self, code, pattern, fn, *args, **kwargs):
        with self.assertRaises(fp4q.Fp4qError) as cm:
            fn(*args, **kwargs)
        self.assertEqual(cm.exception.code, code, cm.exception.message)
        self.assertRegex(cm.exception.message, pattern)
        return cm.exception


class Small(torch.nn.Module):
    """A stored [32, 64] weight and a bias kept in torch."""

    def __init__(self, seed):
        super().__init__()
        self.w = torch.nn.Parameter(randn(32, 64, seed=seed, scale=0.2))
        self.b = torch.nn.Parameter(randn(32, seed=seed + 1))


def set_grads(model, k):
    for i, p in enumerate(model.parameters()):
        p.grad = randn(*p.shape, seed=1000 + 10 * k + i, scale=0.5)
