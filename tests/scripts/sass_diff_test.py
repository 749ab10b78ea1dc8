"""scripts/sass_diff.py on hand-written cuobjdump -sass text (no cuobjdump or GPU needed)."""

import contextlib
import io
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "scripts"))
import sass_diff  # noqa: E402


def module(*functions):
    """cuobjdump -sass text of (name, [instruction]) functions, addresses from 0."""
    out = ["\tcode for sm_90a"]
    for name, body in functions:
        out.append("\t\tFunction : %s" % name)
        for k, ins in enumerate(body):
            out.append("        /*%04x*/                   %s ;   /* 0x000fe20000000f00 */"
                       % (16 * k, ins))
            out.append("                                              /* 0x000fe20000000f00 */")
    return "\n".join(out) + "\n"


A = ["S2R R0, SR_TID.X", "@P0 BRA 0x60", "BSSY B0, 0x70", "LOP3.LUT R1, R0, 0xf, RZ, 0xc0, !PT",
     "HMUL2.BF16_V2 R2, R1, R1", "EXIT"]


class SassDiffTest(unittest.TestCase):
    def test_branch_targets_moved_alone_are_the_same_code(self):
        moved = [i.replace("0x60", "0x80").replace("0x70", "0x90") for i in A]
        old = sass_diff.normalized(module(("_Z1kv", A)))
        new = sass_diff.normalized(module(("_Z1kv", moved)))
        self.assertEqual(old["_Z1kv"][1], "@P0 BRA X")
        self.assertEqual(old["_Z1kv"][2], "BSSY B0, X")
        report = sass_diff.compare(old, new)
        self.assertEqual(report, {"functions": [1, 1], "only_old": [], "only_new": [],
                                  "differing": []})

    def test_an_immediate_changed_is_a_difference(self):
        changed = list(A)
        changed[3] = "LOP3.LUT R1, R0, 0x7, RZ, 0xc0, !PT"
        report = sass_diff.compare(sass_diff.normalized(module(("_Z1kv", A))),
                                   sass_diff.normalized(module(("_Z1kv", changed))))
        self.assertEqual(len(report["differing"]), 1)
        self.assertEqual(report["differing"][0]["instructions"], [6, 6])
        self.assertEqual(report["differing"][0]["opcodes"], {})  # same opcodes, other operand

    def test_opcode_counts_and_functions_on_one_side(self):
        more = A[:-1] + ["HMUL2.BF16_V2 R3, R2, R1", "@!P1 HMUL2.BF16_V2 R3, R3, R1", "EXIT"]
        old = sass_diff.normalized(module(("_Z1kv", A), ("_Z4gonev", ["EXIT"])))
        new = sass_diff.normalized(module(("_Z1kv", more), ("_Z3newv", ["EXIT"])))
        report = sass_diff.compare(old, new)
        self.assertEqual(report["functions"], [2, 2])
        self.assertEqual(report["only_old"], ["_Z4gonev"])
        self.assertEqual(report["only_new"], ["_Z3newv"])
        self.assertEqual(report["differing"], [{"function": "_Z1kv", "instructions": [6, 8],
                                                "opcodes": {"HMUL2.BF16_V2": [1, 3]}}])
        only = sass_diff.compare(old, new, kernel="gone")
        self.assertEqual(only["functions"], [1, 0])
        self.assertEqual(only["only_old"], ["_Z4gonev"])

    def test_usage_errors(self):
        with self.assertRaises(SystemExit) as e:
            sass_diff.main(["/nonexistent/a.so", "/nonexistent/b.so"])
        self.assertEqual(e.exception.code, 2)
        with self.assertRaises(SystemExit) as e:
            sass_diff.main([__file__, __file__, "--kernel", "("])
        self.assertEqual(e.exception.code, 2)
        # A file cuobjdump cannot read (here: a stand-in cuobjdump that fails like it does).
        with tempfile.TemporaryDirectory() as d:
            tool = os.path.join(d, "cuobjdump")
            with open(tool, "w") as f:
                f.write("#!/bin/sh\necho 'cuobjdump fatal   : Could not open input file' >&2\n"
                        "exit 255\n")
            os.chmod(tool, 0o755)
            err = io.StringIO()
            with self.assertRaises(SystemExit) as e, contextlib.redirect_stderr(err):
                sass_diff.main([__file__, __file__, "--cuobjdump", tool])
            self.assertEqual(e.exception.code, 2)
            self.assertIn("sass_diff_test.py: cuobjdump -sass failed (cuobjdump fatal   : "
                          "Could not open input file)", err.getvalue())


if __name__ == "__main__":
    unittest.main()
