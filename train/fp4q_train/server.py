"""Starting an fp4qd for a run (or pointing at one that runs already)."""

import os
import queue
import re
import shutil
import subprocess
import tempfile
import threading
import time

_LISTEN_RE = re.compile(r"^fp4qd: listening on (\S+)$")


def find_fp4qd(explicit=None):
    repo = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
    for cand in (explicit, os.environ.get("FP4Q_FP4QD"),
                 os.path.join(repo, "build", "bin", "fp4qd"), shutil.which("fp4qd")):
        if cand and os.access(cand, os.X_OK):
            return cand
    raise RuntimeError("no fp4qd: pass --fp4qd PATH, set FP4Q_FP4QD, or build it "
                       "(scripts/build.sh); or give --server ADDR of a running one")


class Fp4qd:
    """fp4qd on 127.0.0.1 port 0, metrics off. backend 'cuda': also --allow_cuda_ipc on a
    private Unix socket (the client's target) and --fast_socket beside it, so CUDA tensors
    travel by IPC. stop() sends SIGTERM and waits."""

    def __init__(self, binary, backend="cpu", extra=(), timeout_s=120):
        self.dir = tempfile.mkdtemp(prefix="fp4q-train-", dir="/tmp")
        args = [binary, "--listen", "127.0.0.1:0", "--metrics_listen=", "--backend", backend,
                "--log_format", "text"]
        self.unix = self.fast = None
        if backend == "cuda":
            self.unix = os.path.join(self.dir, "fp4qd.sock")
            self.fast = os.path.join(self.dir, "fp4qd.fast")
            args += ["--allow_cuda_ipc", "--unix_socket", self.unix, "--fast_socket", self.fast]
        args += list(extra)
        self.args = args
        self.log_path = os.path.join(self.dir, "fp4qd.log")
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self._log, text=True)
        lines = queue.Queue()
        threading.Thread(target=self._pump, args=(lines,), daemon=True).start()
        self.tcp = None
        deadline = time.monotonic() + timeout_s
        while self.tcp is None:
            try:
                line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                line = None
            if line is None:
                self.stop()
                with open(self.log_path) as f:
                    raise RuntimeError("fp4qd did not start (%s): %s" % (" ".join(args),
                                                                        f.read()[-2000:]))
            m = _LISTEN_RE.match(line.strip())
            if m:
                self.tcp = m.group(1)

    def _pump(self, lines):
        for line in self.proc.stdout:
            lines.put(line)
        lines.put(None)

    @property
    def target(self):
        return "unix:" + self.unix if self.unix else self.tcp

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if not self._log.closed:
            self._log.close()
        return self.proc.returncode
