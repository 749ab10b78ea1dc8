"""Shared by test_fast_socket*.py: the module's `fp4qd --fast_socket` with a gRPC-only client and a
fast-socket client (each test module's setUpModule calls start()), seeded tensors, the
Counting assertions, and a raw SOCK_SEQPACKET connection to a fast socket."""

import os
import shutil
import socket
import unittest

import torch

import fp4q
import fp4q_testing
from fp4q._messages import pb

SERVER = None
FAST_PATH = None
GRPC = None  # a client on gRPC only
FAST = None  # a client whose tensor calls take the fast socket
_DIRS = []


def start():
    """Starts the calling test module's server and clients: (SERVER, FAST_PATH, GRPC, FAST)."""
    global SERVER, FAST_PATH, GRPC, FAST
    FAST_PATH = fp4q_testing.socket_path("fast.sock")
    _DIRS.append(os.path.dirname(FAST_PATH))
    # A long lease: the keep-alive threads (every lease / 3) stay out of the counted calls.
    SERVER = fp4q_testing.Server("--session_lease_s", "600", "--fast_socket", FAST_PATH)
    GRPC = fp4q.Client(SERVER.target, timeout=60)
    FAST = fp4q.Client(SERVER.target, timeout=60, fast_socket=FAST_PATH)
    FAST.qdq(torch.ones(2, 16))  # its session and first connection: tests count from here
    return SERVER, FAST_PATH, GRPC, FAST


def module_fixture(ns):
    """(setUpModule, tearDownModule) for a test module whose globals are `ns`: they start() its
    server and clients into ns's SERVER, FAST_PATH, GRPC (a client on gRPC only) and FAST (a
    client whose tensor calls take the fast socket), and stop() them."""
    names = ("SERVER", "FAST_PATH", "GRPC", "FAST")
    ns.update(dict.fromkeys(names))

    def set_up():
        ns.update(zip(names, start()))

    return set_up, stop


def stop():
    FAST.close()
    GRPC.close()
    SERVER.stop()
    for d in _DIRS:
        shutil.rmtree(d, ignore_errors=True)


def randn(rows, cols, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, cols, generator=g) * scale


class Counting(unittest.TestCase):
    """assertCounts: what a block did to a client's fast-socket counters."""

    KEYS = ("fast_socket_calls", "fast_socket_fallbacks", "fast_socket_connects")

    def snapshot(self, client):
        return {k: client.stats[k] for k in self.KEYS}

    def assertCounts(self, client, before, calls=0, fallbacks=0, connects=0):
        after = self.snapshot(client)
        self.assertEqual({k: after[k] - before[k] for k in self.KEYS},
                         {"fast_socket_calls": calls, "fast_socket_fallbacks": fallbacks,
                          "fast_socket_connects": connects})

    def assertSameQuantized(self, a, b):
        self.assertEqual((a.rows, a.cols, a.format, a.block, a.scale_layout),
                         (b.rows, b.cols, b.format, b.block, b.scale_layout))
        self.assertEqual((a.global_amax, a.s_enc), (b.global_amax, b.s_enc))
        for name in ("codes", "scales"):
            x, y = getattr(a, name), getattr(b, name)
            self.assertEqual((x.dtype, tuple(x.shape)), (y.dtype, tuple(y.shape)), name)
            self.assertEqual(x.numpy().tobytes(), y.numpy().tobytes(), name)

    def assertSameTensor(self, a, b):
        self.assertEqual((a.dtype, tuple(a.shape)), (b.dtype, tuple(b.shape)))
        self.assertEqual(a.contiguous().view(torch.uint8).numpy().tobytes(),
                         b.contiguous().view(torch.uint8).numpy().tobytes())

    def assertSameError(self, fn, *args, **kwargs):
        """fn(FAST, ...) and fn(GRPC, ...) both fail the same way; returns the fast one's error."""
        errors = []
        for client in (GRPC, FAST):
            with self.assertRaises(fp4q.Fp4qError) as cm:
                fn(client, *args, **kwargs)
            errors.append(cm.exception)
        g, f = errors
        self.assertIs(type(f), type(g))
        self.assertEqual((f.code, f.message, f.rpc, str(f)), (g.code, g.message, g.rpc, str(g)))
        return f


class RawConnection:
    """A plain SOCK_SEQPACKET connection to a fast socket, frames in and out."""

    def __init__(self, path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock.settimeout(30)
        self.sock.connect(path)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.sock.close()

    def send_bytes(self, data):
        return self.sock.send(data)

    def reply(self):
        data = self.sock.recv(65537)
        if not data:
            raise AssertionError("the server closed the connection")
        return pb.FastReply.FromString(data)

    def call(self, request):
        self.send_bytes(request.SerializeToString())
        return self.reply()
