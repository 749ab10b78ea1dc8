#!/usr/bin/env python3
"""What the Python client's per-step plan check costs a CUDA allocation, and what it would with
fewer pointer attributes (GPU host; repository root):

    python3 bench/results/h200-step/one-pass/pointer_attrs.py [--tensors 64] [--calls 20000]

fp4q._regions.Regions.plan_valid calls fp4q._cuda_driver.allocation_identity once for every CUDA
allocation a kept step plan names: one cuPointerGetAttributes of three attributes (range start,
range size, buffer id). This times, over --tensors separately allocated 16 MiB CUDA tensors
(each an allocation of its own in torch's caching allocator), best of 5 rounds:
  - allocation_identity as the client calls it;
  - cuPointerGetAttributes of the buffer id alone (unique over the process's life, so it names
    the allocation by itself);
  - cuPointerGetAttribute (one attribute, the singular call);
  - an empty ctypes call of the same shape (cuGetErrorName), the marshalling alone.
"""

import argparse
import ctypes
import os
import sys
import timeit

sys.path.insert(0, os.path.join(os.getcwd(), "client", "python"))

import torch  # noqa: E402

from fp4q import _cuda_driver  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tensors", type=int, default=64)
    ap.add_argument("--calls", type=int, default=20000, help="calls per round (default 20000)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        ap.error("no CUDA device")
    ts = [torch.empty(8 << 20, dtype=torch.bfloat16, device="cuda") for _ in range(args.tensors)]
    ptrs = [t.data_ptr() for t in ts]
    bases = {_cuda_driver.allocation_identity(p)[0] for p in ptrs}
    lib = _cuda_driver._driver()
    one = (ctypes.c_int * 1)(_cuda_driver.CU_POINTER_ATTRIBUTE_BUFFER_ID)
    value = (ctypes.c_uint64 * 1)()
    data = (ctypes.c_void_p * 1)(ctypes.addressof(value))
    lib.cuPointerGetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64]
    name = ctypes.c_char_p()

    def identity():
        for p in ptrs:
            _cuda_driver.allocation_identity(p)

    def buffer_id():
        for p in ptrs:
            lib.cuPointerGetAttributes(1, one, data, p)

    def singular():
        for p in ptrs:
            lib.cuPointerGetAttribute(ctypes.addressof(value), 7, p)

    def empty():
        for _ in ptrs:
            lib.cuGetErrorName(0, ctypes.byref(name))

    n = max(1, args.calls // len(ptrs))
    print("%d tensors in %d allocations; torch %s; %s" % (
        len(ptrs), len(bases), torch.__version__, torch.cuda.get_device_name()))
    for label, fn in (("allocation_identity (3 attributes)", identity),
                      ("cuPointerGetAttributes, buffer id alone", buffer_id),
                      ("cuPointerGetAttribute, buffer id", singular),
                      ("cuGetErrorName (marshalling alone)", empty)):
        best = min(timeit.repeat(fn, number=n, repeat=5)) / (n * len(ptrs)) * 1e6
        print("%-42s %.2f us an allocation" % (label, best))


if __name__ == "__main__":
    main()
