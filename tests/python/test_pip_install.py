"""The README's install path, as a new user runs it: a fresh clone, a fresh venv, pip install
./client/python, then import fp4q and call a running fp4qd (CPU backend).

The clone is `git clone` of this repository (its committed HEAD; a tree that is not a git
checkout is copied instead, without build folders). The venv is made with
--system-site-packages because on Debian 12 torch, grpcio, protobuf and numpy are Debian
packages (python3-torch, ...), not wheels. pip runs with:
  --no-build-isolation  build with the setuptools already installed (Debian's 66), instead of
                        downloading setuptools into an isolated build environment;
  --no-index            never contact a package index: CI machines have no network, and the
                        dependencies (grpcio, protobuf, numpy) must be found installed.
Dependencies are not skipped (no --no-deps): pip checks pyproject.toml's requirements against
what the venv sees, so a missing or too old one fails here as it would for a user.

The interpreter inside the venv runs with a clean environment (no PYTHONPATH, no
FP4Q_PROTO_DESCRIPTOR), from a folder outside the clone, so it can only import the installed
package and its installed descriptor.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import numpy as np

import fp4q_reference as R
import fp4q_testing

REPO = fp4q_testing.REPO

# Run by the venv's interpreter: imports the installed package and calls the server.
CHILD = r"""
import json, sys
import torch
import fp4q
from fp4q import _messages
target = sys.argv[1]
x = torch.arange(-64, 64, dtype=torch.float32).reshape(4, 32) / 8
with fp4q.Client(target, timeout=60) as client:
    info = client.server_info()
    q = client.quantize(x).rowwise
    y = client.dequantize(q)
print(json.dumps({
    "module": fp4q.__file__,
    "descriptor": _messages.descriptor_path(),
    "backend": info.backend,
    "codes": q.codes.reshape(-1).tolist(),
    "s_enc": q.s_enc,
    "max_abs_error": float((y - x).abs().max()),
}))
"""


def _run(cmd, cwd, env, timeout=600):
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise AssertionError("%s failed (exit %d)\nstdout:\n%s\nstderr:\n%s" % (
            " ".join(cmd), done.returncode, done.stdout[-4000:], done.stderr[-4000:]))
    return done.stdout


def _clean_env():
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "FP4Q_PROTO_DESCRIPTOR", "PIP_INDEX_URL",
                        "PIP_EXTRA_INDEX_URL", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PIP_NO_CACHE_DIR"] = "1"
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def _fresh_tree(dest):
    """A clone of the repository's HEAD at dest (a copy when REPO is not a git checkout)."""
    if os.path.isdir(os.path.join(REPO, ".git")) and shutil.which("git"):
        _run(["git", "clone", "--quiet", "--no-hardlinks", REPO, dest], cwd=None, env=_clean_env())
        return "git clone"
    shutil.copytree(REPO, dest, symlinks=True, ignore=shutil.ignore_patterns(
        "build*", ".bundle", "__pycache__", "_proto", "*.egg-info", ".git"))
    return "copy"


class PipInstallTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="fp4q-pip-")
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)

    def test_fresh_clone_installs_and_calls_the_server(self):
        clone = os.path.join(self.tmp, "fp4q")
        how = _fresh_tree(clone)
        self.assertFalse(os.path.exists(os.path.join(clone, "client", "python", "fp4q", "_proto")),
                         "%s of the repository already has the generated descriptor" % how)
        venv = os.path.join(self.tmp, "venv")
        env = _clean_env()
        _run([sys.executable, "-m", "venv", "--system-site-packages", venv], cwd=self.tmp, env=env)
        py = os.path.join(venv, "bin", "python")
        out = _run([py, "-m", "pip", "install", "--no-build-isolation", "--no-index",
                    "./client/python"], cwd=clone, env=env)
        self.assertIn("Successfully installed fp4q-0.1.0", out)

        server = fp4q_testing.Server()
        self.addCleanup(server.stop)
        outside = os.path.join(self.tmp, "elsewhere")
        os.mkdir(outside)
        got = json.loads(_run([py, "-c", CHILD, server.target], cwd=outside, env=env,
                              timeout=300).strip().splitlines()[-1])
        site = os.path.realpath(venv)
        self.assertTrue(os.path.realpath(got["module"]).startswith(site), got["module"])
        self.assertTrue(os.path.realpath(got["descriptor"]).startswith(site), got["descriptor"])
        self.assertTrue(got["descriptor"].endswith(os.path.join("fp4q", "_proto", "fp4q_v1.binpb")))
        self.assertEqual(got["backend"], "cpu")
        # The installed client's results are the numpy reference's (docs/NUMERICS.md 1-2).
        x = (np.arange(-64, 64, dtype=np.float32) / 8).reshape(4, 32)
        ref = R.quantize_nvfp4(x)
        self.assertEqual(got["codes"], ref["packed"].reshape(-1).tolist())
        self.assertEqual(got["s_enc"], float(ref["s_enc"]))
        dq = R.dequantize_nvfp4(ref["packed"], ref["scales"], ref["s_enc"])
        self.assertEqual(got["max_abs_error"], float(np.abs(dq - x).max()))


if __name__ == "__main__":
    unittest.main()
