#!/usr/bin/env python3
"""Which kernels of two CUDA modules differ in their SASS, and by which instructions.

    scripts/sass_diff.py OLD.so NEW.so [--cuobjdump PATH] [--kernel REGEX] [--json FILE]

For a change meant to leave the GPU code as it is (a refactor, a header moved): with no GPU at
hand, identical SASS is the proof that nothing changed on the device. For a change meant to
alter it, the per-opcode counts show where (instructions added to a kernel's hot loop, a
different register allocation). Each function of cuobjdump -sass is compared with its addresses
and branch targets left out; reported: the functions only in one module, and for each function
whose instructions differ, its instruction count in each and the opcodes whose counts changed.
Exit status 0 when every function is identical, 1 when any differs, 2 on a usage error.

cuobjdump: as scripts/sass_hot_path.py finds it (--cuobjdump, $CUOBJDUMP, PATH,
/usr/local/cuda/bin); Debian's CUDA packages lack it, pip's nvidia-cuda-cuobjdump wheel has one.
"""

import argparse
import collections
import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sass_hot_path  # noqa: E402

# Instructions whose hex operand is a code address (a branch target moves with any change
# before it); every other hex operand is an immediate and is compared.
_TARGET = re.compile(r"^((?:@!?U?P\w+ )?(?:BRA|BRX|JMP|JMX|CALL|BSSY|SSY|PBK|PCNT|BPT)\S*"
                     r"(?: \S+,)*?) 0x[0-9a-f]+")


def normalized(sass):
    """{mangled name: [instruction, whitespace collapsed, branch targets left out]} of
    cuobjdump -sass output."""
    return {name: [_TARGET.sub(r"\1 X", " ".join(i.split())) for _, i in ins]
            for name, ins in sass_hot_path.functions(sass)}


def opcode(instruction):
    """The opcode of one instruction (its predicate left out): 'LOP3.LUT', 'HMUL2.BF16_V2'."""
    words = instruction.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0] if words else ""


def compare(old, new, kernel=None):
    """The report of two normalized() dicts, functions filtered by the regex `kernel`."""
    keep = (lambda n: True) if kernel is None else (lambda n: re.search(kernel, n))
    old = {n: b for n, b in old.items() if keep(n)}
    new = {n: b for n, b in new.items() if keep(n)}
    differing = []
    for name in sorted(set(old) & set(new)):
        if old[name] == new[name]:
            continue
        a = collections.Counter(opcode(i) for i in old[name])
        b = collections.Counter(opcode(i) for i in new[name])
        differing.append({
            "function": name,
            "instructions": [len(old[name]), len(new[name])],
            "opcodes": {op: [a[op], b[op]] for op in sorted(set(a) | set(b)) if a[op] != b[op]},
        })
    return {"functions": [len(old), len(new)],
            "only_old": sorted(set(old) - set(new)),
            "only_new": sorted(set(new) - set(old)),
            "differing": differing}


def demangle(names):
    try:
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True,
                             text=True, check=True).stdout.split("\n")
        return out[:len(names)]
    except (OSError, subprocess.CalledProcessError):
        return list(names)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old", help="a CUDA module or binary with device code")
    ap.add_argument("new")
    ap.add_argument("--cuobjdump")
    ap.add_argument("--kernel", help="only functions whose mangled name matches this regex")
    ap.add_argument("--json", help="also write the report there")
    args = ap.parse_args(argv)
    for f in (args.old, args.new):
        if not os.path.isfile(f):
            ap.error("%s: no such file" % f)
    if args.kernel is not None:
        try:
            re.compile(args.kernel)
        except re.error as e:
            ap.error("--kernel: %s" % e)
    tool = sass_hot_path.find_cuobjdump(args.cuobjdump)
    sass = []
    for f in (args.old, args.new):
        run = subprocess.run([tool, "-sass", f], capture_output=True, text=True)
        if run.returncode != 0:
            ap.error("%s: cuobjdump -sass failed (%s)" % (
                f, run.stderr.strip() or "exit status %d" % run.returncode))
        sass.append(run.stdout)
    report = compare(normalized(sass[0]), normalized(sass[1]), args.kernel)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    n_old, n_new = report["functions"]
    print("%d functions in %s, %d in %s; %d differ, %d only in the old, %d only in the new" % (
        n_old, args.old, n_new, args.new, len(report["differing"]), len(report["only_old"]),
        len(report["only_new"])))
    for side in ("only_old", "only_new"):
        for name in demangle(report[side]):
            print("  %s: %s" % (side.replace("_", " in "), name))
    names = demangle([d["function"] for d in report["differing"]])
    for d, name in zip(report["differing"], names):
        print("  %d -> %d instructions: %s" % (d["instructions"][0], d["instructions"][1], name))
        print("    " + ", ".join("%s %d -> %d" % (op, a, b) for op, (a, b) in d["opcodes"].items()))
    same = not (report["differing"] or report["only_old"] or report["only_new"])
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
