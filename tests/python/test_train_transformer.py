"""The transformer proof's CI version (train/run.py --preset cpu-ci, docs/TRAINING.md): a
2-layer, d_model-64 decoder trained on byte-level text (this interpreter's standard library)
for 400 steps against a CPU fp4qd, in four variants with the same initial weights and batches:
bf16-adamw (torch), frozen-adamw (the block weights never change: what the parameters kept in
torch learn alone), rtn-adamw and rtn-ef-adamw (the block weights stored in 4 bits by
fp4q.optim.AdamW). It asserts the shape of the result, measured as the share of bf16's gain
over the frozen run that a variant keeps (validation bits per byte and training loss):

- RTN stalls: it keeps under 30% of that gain (its stored weights barely change);
- error feedback learns: it keeps over 80% of it and ends within 1% of bf16;
- the bookkeeping: every CSV has a row per step, and the server's bytes per stored parameter
  differ between the two stored variants by exactly the f32 residual (4 bytes).

About 75 s on two cores (the run itself prints its time)."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

import fp4q_testing

RUN = os.path.join(fp4q_testing.REPO, "train", "run.py")
PLOT = os.path.join(fp4q_testing.REPO, "train", "plot.py")
STEPS = 400
OUT = None
SUMMARY = None
SECONDS = None


def setUpModule():
    global OUT, SUMMARY, SECONDS
    OUT = tempfile.mkdtemp(prefix="fp4q-train-test-")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(fp4q_testing.REPO, "client", "python"), env.get("PYTHONPATH", "")])
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, RUN, "--preset", "cpu-ci", "--steps", str(STEPS),
                           "--fp4qd", fp4q_testing.fp4qd_path(), "--out", OUT],
                          env=env, capture_output=True, text=True, timeout=900)
    SECONDS = time.monotonic() - t0
    if proc.returncode != 0:
        raise RuntimeError("train/run.py exited %d:\n%s\n%s" % (
            proc.returncode, proc.stdout[-3000:], proc.stderr[-3000:]))
    print("train/run.py --preset cpu-ci: %.0f s" % SECONDS, file=sys.stderr)
    with open(os.path.join(OUT, "summary.json")) as f:
        SUMMARY = json.load(f)


def tearDownModule():
    if OUT:
        shutil.rmtree(OUT, ignore_errors=True)


def result(name):
    return SUMMARY["results"]["text"][name]


def gain_kept(name, key):
    """(frozen - variant) / (frozen - bf16) of a loss-like number: 0 learns nothing beyond the
    frozen block weights, 1 learns what bf16 learns."""
    f, b, v = (key(result(n)) for n in ("frozen-adamw", "bf16-adamw", name))
    return (f - v) / (f - b)


BPB = lambda r: r["final"]["val_bpb"]  # noqa: E731
LOSS = lambda r: r["loss_final"]  # noqa: E731


class ShapeOfTheResult(unittest.TestCase):
    def test_every_variant_ran_every_step_with_finite_losses(self):
        self.assertEqual(list(SUMMARY["results"]["text"]),
                         ["bf16-adamw", "frozen-adamw", "rtn-adamw", "rtn-ef-adamw"])
        for name, r in SUMMARY["results"]["text"].items():
            self.assertEqual(r["steps"], STEPS, name)
            self.assertTrue(r["finite"], name)
        self.assertEqual(SUMMARY["environment"]["server"]["backend"], "cpu")

    def test_the_block_weights_matter(self):
        bf16, frozen = result("bf16-adamw"), result("frozen-adamw")
        self.assertLess(bf16["loss_final"], 0.5 * bf16["loss_start"])
        self.assertLess(BPB(bf16), BPB(frozen) - 0.1)

    def test_rtn_stored_weights_stall(self):
        self.assertLess(gain_kept("rtn-adamw", BPB), 0.3)
        self.assertLess(gain_kept("rtn-adamw", LOSS), 0.3)
        self.assertLess(result("rtn-adamw")["codes_moved"], 0.25)

    def test_error_feedback_learns(self):
        self.assertGreater(gain_kept("rtn-ef-adamw", BPB), 0.8)
        self.assertGreater(gain_kept("rtn-ef-adamw", LOSS), 0.8)
        self.assertLess(BPB(result("rtn-ef-adamw")), 1.01 * BPB(result("bf16-adamw")))
        self.assertGreater(result("rtn-ef-adamw")["codes_moved"], 0.6)

    def test_server_memory_per_parameter(self):
        rtn, ef = result("rtn-adamw"), result("rtn-ef-adamw")
        self.assertEqual(rtn["stored_params"], ef["stored_params"])
        self.assertEqual(rtn["stored_params"], 2 * 12 * 64 * 64)  # 2 blocks of 12 d^2
        # The residual: one f32 per parameter, nothing else differs between the two.
        self.assertAlmostEqual(ef["server_bytes_per_stored_param"] -
                               rtn["server_bytes_per_stored_param"], 4.0, places=6)
        # 4-bit codes and E4M3 scales (0.5625 bytes) plus AdamW's two f32 moments.
        self.assertGreaterEqual(rtn["server_bytes_per_stored_param"], 0.5625 + 8)
        self.assertLess(rtn["server_bytes_per_stored_param"], 0.5625 + 8 + 0.1)

    def test_csv_rows_and_timings(self):
        for name in SUMMARY["results"]["text"]:
            with open(os.path.join(OUT, "text", name + ".csv")) as f:
                lines = f.read().splitlines()
            self.assertEqual(lines[0].split(","), [
                "step", "lr", "loss", "val_bpb", "worker_ms", "optimizer_ms", "server_ms",
                "tokens_per_s"])
            self.assertEqual([int(x.split(",")[0]) for x in lines[1:]], list(range(STEPS + 1)))
            r = result(name)
            self.assertGreater(r["worker_ms"], 0)
            self.assertGreater(r["tokens_per_s"], 0)
            if r["stored"]:
                self.assertGreater(r["server_ms"], 0)
                self.assertLessEqual(r["server_ms"], r["optimizer_ms"])


class Plot(unittest.TestCase):
    def test_plot_writes_the_png_and_the_table(self):
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            self.skipTest("no matplotlib for %s (Debian: python3-matplotlib)" % sys.executable)
        doc = os.path.join(OUT, "doc.md")
        with open(doc, "w") as f:
            f.write("before\n<!-- train-results:begin -->\nOLD-BLOCK-TEXT\n<!-- train-results:end -->\nafter\n")
        proc = subprocess.run([sys.executable, PLOT, OUT, "--doc", doc], capture_output=True,
                              text=True, timeout=300)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertTrue(os.path.getsize(os.path.join(OUT, "text.png")) > 10000)
        with open(doc) as f:
            body = f.read()
        self.assertTrue(body.startswith("before\n<!-- train-results:begin -->\nRun: "))
        self.assertTrue(body.endswith("<!-- train-results:end -->\nafter\n"))
        self.assertNotIn("OLD-BLOCK-TEXT", body)
        self.assertIn("| rtn-ef-adamw | %d |" % STEPS, body)
        self.assertIn("- Stall (keep under 30% of the reference's gain over frozen block "
                      "weights): rtn-adamw.", body)


if __name__ == "__main__":
    unittest.main()
