#!/usr/bin/env python3
"""Latency of one big Quantize through fp4qd, against the server's own kernel time.

The goal on the H200: Quantize of an 8192x8192 bf16 tensor by CUDA IPC at
p50 <= kernel time + 100 us. For each call this records the client's wall time and the reply's
header.kernel_micros (and queue_micros, server_micros), and reports p50/p99 of each, of
wall - kernel (the service overhead: RPC, routing, IPC pinning, synchronization) and of
wall - server (this Python client and the transport). `fp4q bench-ipc` measures the same from
C++.

  # on the GPU machine, fp4qd --backend cuda --allow_cuda_ipc --unix_socket /tmp/fp4qd.sock
  python3 bench/ipc_quantize_latency.py --server unix:///tmp/fp4qd.sock --device cuda \
      --shape 8192x8192 --dtype bf16 --iters 200 --json bench/results/h200-ipc-quantize.json

--device cpu sends the tensor inline (a dry run of this script against a CPU fp4qd).
--ipc require (default with --device cuda) fails instead of silently falling back to inline.
--fast-socket PATH sends the Quantize calls over fp4qd's --fast_socket (same host) instead of
gRPC; the report's "rpc_transport" says which transport the timed calls really took (from the
client's stats: "fast_socket", "grpc" or "mixed"), and client_stats has the counters.

  fp4qd --backend cuda --allow_cuda_ipc --unix_socket /tmp/fp4qd.sock --fast_socket /tmp/fp4qd.fast
  python3 bench/ipc_quantize_latency.py --server unix:///tmp/fp4qd.sock \
      --fast-socket /tmp/fp4qd.fast --json bench/results/h200-ipc-quantize-fast.json

--option KEY=VALUE (repeatable) sets a quantization option of every call, as
fp4q.QuantOptions names them (--option block=16x16 --option rounding=stochastic); integers and
floats are converted (seed=3, amax=4.5). The report's "options" lists them.
"""
import argparse
import collections
import json
import os
import platform
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "client", "python"))

import grpc  # noqa: E402
import torch  # noqa: E402

import fp4q  # noqa: E402


def protobuf_version():
    import google.protobuf
    return google.protobuf.__version__


def protobuf_implementation():
    """"upb", "cpp" or "python": the protobuf runtime, which sets much of the client's cost."""
    try:
        from google.protobuf.internal import api_implementation
        return api_implementation.Type()
    except Exception:  # noqa: BLE001 - an internal module; absent in some releases
        return "unknown"


def percentile(values, q):
    """Nearest-rank percentile (the value at rank ceil(q * n))."""
    s = sorted(values)
    rank = max(1, min(len(s), -(-int(q * 1000) * len(s) // 1000)))
    return s[rank - 1]


def summary(values):
    return {"p50": percentile(values, 0.50), "p99": percentile(values, 0.99),
            "min": min(values), "max": max(values), "mean": sum(values) / len(values)}


def parse_option(text):
    """KEY=VALUE of --option: VALUE as an int or float where it reads as one, else a string."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError("expected KEY=VALUE, got %r" % text)
    for convert in (int, float):
        try:
            return key, convert(value)
        except ValueError:
            pass
    return key, value


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--server", default=os.environ.get("FP4Q_SERVER", "127.0.0.1:50051"))
    p.add_argument("--device", default="cuda", help="cuda (IPC) or cpu (inline dry run)")
    p.add_argument("--shape", default="8192x8192")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "f32"])
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--ipc", default=None, choices=["auto", "never", "require"])
    p.add_argument("--fast-socket", metavar="PATH", default=None,
                   help="fp4qd's --fast_socket path: Quantize goes there instead of gRPC")
    p.add_argument("--spin-us", type=int, default=0,
                   help="with --fast-socket: busy-poll each reply this long (microseconds)")
    p.add_argument("--option", action="append", default=[], type=parse_option,
                   metavar="KEY=VALUE", help="a quantization option of every call (repeatable)")
    p.add_argument("--json", help="write the results here")
    a = p.parse_args()
    options = dict(a.option)
    try:
        fp4q.QuantOptions(**options)
    except TypeError as e:
        p.error("--option: %s" % e)
    rows, cols = (int(v) for v in a.shape.split("x"))
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    ipc = a.ipc or ("require" if a.device.startswith("cuda") else "never")
    gen = torch.Generator(device="cpu").manual_seed(8)
    x = torch.randn(rows, cols, generator=gen).to(dtype=dtype).to(a.device)

    with fp4q.Client(a.server, ipc=ipc, client_name="ipc-quantize-latency",
                     fast_socket=a.fast_socket, fast_socket_spin_us=a.spin_us) as client:
        info = client.server_info()
        wall, kernel, queue, server = [], [], [], []
        timed_stats = None
        for i in range(a.warmup + a.iters):
            if i == a.warmup:
                timed_stats = collections.Counter(client.stats)
            if a.device.startswith("cuda"):
                torch.cuda.synchronize()  # the input is ready before the request (proto contract)
            t0 = time.perf_counter()
            client.quantize(x, **options)
            t1 = time.perf_counter()
            if i >= a.warmup:
                wall.append((t1 - t0) * 1e6)
                h = client.last_header
                kernel.append(h.kernel_micros)
                # Older servers lack these fields (0 then).
                queue.append(getattr(h, "queue_micros", 0.0))
                server.append(getattr(h, "server_micros", 0.0))
        # What the timed calls did (the warm-up opened the session, connected, registered).
        timed = collections.Counter(client.stats)
        timed.subtract(timed_stats)
        timed = {k: v for k, v in timed.items() if v}
        fast_calls = timed.get("fast_socket_calls", 0)
        rpc_transport = ("fast_socket" if fast_calls == a.iters else
                         "grpc" if fast_calls == 0 else "mixed")
        overhead = [w - k for w, k in zip(wall, kernel)]
        client_side = [w - s for w, s in zip(wall, server)]
        result = {
            "tool": "bench/ipc_quantize_latency.py",
            "server": a.server, "backend": info.backend, "server_version": info.version,
            "gpus": [g.name for g in info.gpus], "host": platform.node(),
            "device": a.device, "transport": ipc, "shape": [rows, cols], "dtype": a.dtype,
            "iters": a.iters, "warmup": a.warmup, "options": options,
            "wall_us": summary(wall), "kernel_us": summary(kernel),
            "overhead_us": summary(overhead),
            "queue_us": summary(queue), "server_us": summary(server),
            "client_and_transport_us": summary(client_side),
            "goal_p50_wall_le_kernel_plus_100us":
                percentile(wall, 0.5) <= percentile(kernel, 0.5) + 100.0,
            "client_stats": dict(client.stats),
            "ipc_mode": ipc, "rpc_transport": rpc_transport, "fast_socket": a.fast_socket,
            "spin_us": a.spin_us,
            "timed_client_stats": timed,
            "python": {"version": platform.python_version(), "torch": torch.__version__,
                       "grpc": grpc.__version__, "protobuf": protobuf_version(),
                       "protobuf_implementation": protobuf_implementation()},
        }
    text = json.dumps(result, indent=2, sort_keys=True)
    print(text)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text + "\n")
    if a.fast_socket and rpc_transport != "fast_socket":
        print("ipc_quantize_latency: --fast-socket given but %d of %d timed calls went by gRPC "
              "(fast_socket_fallbacks: %d)" % (a.iters - fast_calls, a.iters,
                                               timed.get("fast_socket_fallbacks", 0)),
              file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
