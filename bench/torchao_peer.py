#!/usr/bin/env python3
"""The best peer on the H200: torchao's NVFP4 quantizer (nvfp4_quantize, 1x16 blocks, per-tensor
scale given, round-to-nearest) under torch.compile, on the shape of fp4q_bench's first row:
8192x8192 bf16, random N(0, 1) data, three rotating inputs (each larger than the L2 cache).

Timed like fp4q_bench: CUDA events around each call, 5 warm-ups (after compilation), median.
Bytes counted as in fp4q_bench: 2 per input element read + 0.5 + 1/16 written.

    python3 bench/torchao_peer.py --out peer.json [--iters 30]

When torchao (or a GPU) is missing the JSON says why and the exit status is 0, so a device run
carries on with the rest.
"""
import argparse
import json
import statistics
import sys
import traceback


def time_events(torch, fn, iters, warmup=5):
    for i in range(warmup):
        fn(i)
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(iters)]
    for i, (a, b) in enumerate(events):
        a.record()
        fn(warmup + i)
        b.record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) * 1000.0 for a, b in events)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--iters", type=int, default=30)
    args = ap.parse_args()
    result = {"peer": "torchao.prototype.mx_formats.nvfp4_tensor.nvfp4_quantize under torch.compile",
              "shape": "8192x8192 bf16", "command": " ".join(sys.argv)}
    try:
        import torch
        result["torch"] = torch.__version__
        if not torch.cuda.is_available():
            raise RuntimeError("torch sees no CUDA device")
        result["gpu"] = torch.cuda.get_device_name(0)
        import torchao
        result["torchao"] = torchao.__version__
        from torchao.prototype.mx_formats.nvfp4_tensor import (nvfp4_quantize,
                                                                per_tensor_amax_to_scale)

        n = 8192
        gen = torch.Generator(device="cuda").manual_seed(0)
        xs = [torch.randn(n, n, device="cuda", dtype=torch.bfloat16, generator=gen)
              for _ in range(3)]
        scales = [per_tensor_amax_to_scale(x.abs().amax().float()) for x in xs]
        quant = torch.compile(lambda x, s: nvfp4_quantize(x, 16, s))
        out = [None]

        def run(i):
            out[0] = quant(xs[i % 3], scales[i % 3])

        run(0)  # compile
        torch.cuda.synchronize()
        us = time_events(torch, run, args.iters)
        nbytes = n * n * (2 + 0.5 + 1 / 16)
        copy_bufs = [torch.empty_like(x) for x in xs]
        copy_us = time_events(torch, lambda i: copy_bufs[i % 3].copy_(xs[i % 3]), args.iters)
        result.update({
            "us": round(us, 2),
            "bytes": nbytes,
            "gbps": round(nbytes / us / 1e3, 1),
            "torch_copy_gbps": round(2 * n * n * 2 / copy_us / 1e3, 1),
            "scales_dtype": str(out[0][0].dtype),
            "codes_shape": list(out[0][1].shape),
        })
        print(f"torchao nvfp4_quantize (torch.compile): {us:.1f} us, "
              f"{result['gbps']} GB/s (torch copy {result['torch_copy_gbps']} GB/s)")
    except Exception as e:  # reported, not fatal
        result["error"] = f"{type(e).__name__}: {e}"
        result["traceback"] = traceback.format_exc(limit=5)
        print("torchao peer not measured:", result["error"])
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
