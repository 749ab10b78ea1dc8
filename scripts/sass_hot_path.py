#!/usr/bin/env python3
"""Static instruction counts per element of the one-block-a-lane quantize kernels' hot loop.

Reads the SASS of a CUDA module (cuobjdump -sass) and, for every instantiation of a kernel
whose name matches --kernel (default QuantizeBlocksKernel), counts the instructions a lane
executes per element in its main loop on the common path: the loop is the kernel's last
backward branch; left out are the regions that only rare or optional work branches into (a
block holding a NaN, the reciprocal's slow path, the swizzled scale layout, DQ(x) stores), found
by what they contain. Elements per iteration are 16 per codes store (STG.E.64, one per block)
left on the path. Nsight Compute's smsp__inst_executed.sum over the launch is the dynamic
count to compare with (bench/results/h200-quantize/lanes/README.md).

  scripts/sass_hot_path.py [--module build-device/bin/libfp4q_cuda.so] [--kernel REGEX]
                           [--cuobjdump PATH] [--top N] [--json FILE]

cuobjdump: --cuobjdump, else $CUOBJDUMP, else cuobjdump on PATH or in /usr/local/cuda/bin (the
CUDA toolkit's Debian packages here do not ship it; pip's nvidia-cuda-cuobjdump and triton
wheels carry one).
"""

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys

_INS = re.compile(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);")
_BRA = re.compile(r"@(!?)(P\d) BRA (0x[0-9a-f]+)")
# QuantizeBlocksKernel<In, kFmt, kSr, kRht, kCtas> (kFmt: 0 NVFP4 1x16, 2 MXFP4).
# Modules before 09e3e6b had no kFmt (NVFP4 only).
_TEMPLATE = re.compile(r"I(13__nv_bfloat16|f)(?:Li(\d)E)?Lb(\d)ELb(\d)ELi(\d)E")
_FORMATS = {"0": "NVFP4", "1": "NVFP4 16x16", "2": "MXFP4"}


def find_cuobjdump(explicit):
    for c in (explicit, os.environ.get("CUOBJDUMP"), shutil.which("cuobjdump"),
              "/usr/local/cuda/bin/cuobjdump"):
        if c and os.path.exists(c):
            return c
    sys.exit("sass_hot_path: no cuobjdump (give --cuobjdump PATH or set CUOBJDUMP)")


def functions(sass):
    """(mangled name, [(address, instruction)]) of each function in cuobjdump's output."""
    for part in re.split(r"\n\s*Function : ", sass)[1:]:
        name = part.split("\n", 1)[0].strip()
        yield name, [(int(a, 16), i.strip()) for a, i in _INS.findall(part)]


def cold_kind(body):
    """What an optional region does, from its instructions; None when it is common-path work."""
    text = " ".join(body)
    if "LDG" in text or "STG.E.64" in text or "STG.E.U16" in text:
        return None  # the next step's loads, the codes stores
    if ("STG.E.128" in text or "F2FP.BF16" in text) and "FMNMX" not in text:
        return "dq"  # DQ(x) of a block or two: decode and store, no rounding
    if len(body) > 150:
        return None  # a whole skipped step
    if "FSETP.GTU" in text and "+INF" in text:
        return "nan-codes"
    if re.search(r"FMNMX R\d+, RZ, \|", text) and "NAN" not in text:
        return "nan-amax"
    if "CALL.REL" in text:
        return "reciprocal"
    if "STG.E.128" in text or "F2FP.BF16" in text:
        return "dq"
    if "IMAD.WIDE.U32.X" in text or "SHF.R.U64" in text:
        return "swizzle"
    return None


def hot_path(ins):
    """The main loop's common-path instructions and the optional regions left out."""
    back = [(int(m.group(3), 16), a) for a, i in ins
            for m in [_BRA.match(i)] if m and int(m.group(3), 16) < a]
    if not back:
        return None, []
    lo, hi = max(back, key=lambda t: t[1])
    cold = []
    for a, i in ins:
        m = _BRA.match(i)
        if not (lo <= a <= hi and m) or int(m.group(3), 16) <= a:
            continue
        target = int(m.group(3), 16)
        kind = cold_kind([x for b, x in ins if a < b < target])
        if kind:
            cold.append((a + 16, target - 16, kind))
    hot = [(a, i) for a, i in ins
           if lo <= a <= hi and not any(c0 <= a <= c1 for c0, c1, _ in cold)]
    return hot, cold


def opcode(instruction):
    return re.sub(r"^@!?P\d ", "", instruction).split()[0].split(".")[0]


def describe(name):
    m = _TEMPLATE.search(name)
    if not m:
        return name
    x = "bf16" if m.group(1) != "f" else "f32"
    fmt = _FORMATS.get(m.group(2) or "0", "format %s" % m.group(2))
    rounding = "SR" if m.group(3) == "1" else "RTN"
    return "%s %s %s%s, %s CTAs/SM" % (fmt, x, rounding, " + RHT" if m.group(4) == "1" else "",
                                       m.group(5))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--module", default="build-device/bin/libfp4q_cuda.so")
    ap.add_argument("--kernel", default="QuantizeBlocksKernel")
    ap.add_argument("--cuobjdump")
    ap.add_argument("--top", type=int, default=8, help="opcodes listed per kernel")
    ap.add_argument("--json", help="also write the counts here")
    args = ap.parse_args()
    if not os.path.exists(args.module):
        sys.exit("sass_hot_path: no module at %s" % args.module)
    sass = subprocess.run([find_cuobjdump(args.cuobjdump), "-sass", args.module],
                          capture_output=True, text=True, check=True).stdout
    rows = []
    for name, ins in functions(sass):
        if not re.search(args.kernel, name):
            continue
        hot, cold = hot_path(ins)
        if not hot:
            continue
        # A codes store: 8 bytes for a block (STG.E.64), or a tile pair's two scale bytes
        # (STG.E.U16) beside its 16 bytes of codes.
        stores = sum(1 for _, i in hot if re.match(r"(@!?P\d )?STG\.E\.64 ", i))
        pairs = sum(1 for _, i in hot if re.match(r"(@!?P\d )?STG\.E\.U16 ", i))
        elements = 16 * stores + 32 * pairs
        mix = collections.Counter(opcode(i) for _, i in hot)
        rows.append({"kernel": describe(name), "mangled": name, "hot_instructions": len(hot),
                     "elements_per_iteration": elements,
                     "per_element": len(hot) / elements if elements else None,
                     "left_out": dict(collections.Counter(k for *_, k in cold)),
                     "opcodes": dict(mix.most_common())})
    if not rows:
        sys.exit("sass_hot_path: no kernel matching %r in %s" % (args.kernel, args.module))
    print("%-34s %8s %9s  %s" % ("kernel", "elements", "per elem", "opcodes per element"))
    for r in rows:
        e = r["elements_per_iteration"] or 1
        top = ", ".join("%s %.2f" % (k, v / e) for k, v in list(r["opcodes"].items())[:args.top])
        per = "%.2f" % r["per_element"] if r["per_element"] else "-"
        print("%-34s %8d %9s  %s" % (r["kernel"], r["elements_per_iteration"], per, top))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
